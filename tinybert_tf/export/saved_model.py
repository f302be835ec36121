"""SavedModel for TF Serving: raw text in, logits/probabilities out.

Signatures (all outputs float32 unless noted):
  serving_default  text: string [B] (+ text_b: string [B] for pair tasks),
                   tokenised in graph by the model's own `Tokenizer`
                   (tensorflow-text FastBertTokenizer + packing ops).
  serve_ids        input_word_ids, input_mask, input_type_ids: int32 [B, L].
Outputs: the task type's `serving_outputs` (tinybert_tf.tasks), e.g.
         classifier  logits [B, C], probabilities [B, C], label: string [B]
                     (the arg-max class name);
         regressor   logits [B, 1], score [B].
Assets: vocab.txt (the WordPiece vocab) and labels.txt (label names, one a line).

Every signature checks its request in graph before the model runs, so no request
can crash the server: TF Serving feeds tensors of any shape (a REST columnar
`{"inputs": "some text"}` or `make_tensor_proto("some text")` is a scalar), and the
tokenizer's kernels read a scalar out of bounds. A string input must be a 1-D
batch [B] (B may be 0), the inputs of one request must share B; ids inputs must be
int32 [B, L] of one shape with 1 <= L <= max_position_embeddings, word ids in
[0, vocab_size), type ids in [0, type_vocab_size) and a 0/1 mask. Anything else
fails with InvalidArgument naming the input and what it must be (`check_texts`,
`check_ids`). Texts of any length and bytes (invalid UTF-8 included) are answered:
the tokenizer cuts them to max_seq_len.

The custom ops the text signature needs are listed by `custom_ops(path)`; all
come from tensorflow-text's ops library, which TF Serving links into
`tensorflow_model_server` (see docs/deploy.md for the minimum version). A
SavedModel is loaded whole, every function of its graph, so those ops are
needed to load it even by a client that calls only `serve_ids`.
`export_saved_model(..., text=False)` writes the servable for servers without
them: no tokenizer in the graph, the ids function as both `serving_default` and
`serve_ids`, core TensorFlow ops only.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.export.common import ExportError, check_seq_len, export_task
from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.models.encoder import INPUT_NAMES, BertModel
from tinybert_tf.models.model_dir import atomic_directory
from tinybert_tf.tasks import TaskType
from tinybert_tf.tokenizer import write_vocab

VOCAB_ASSET = "vocab.txt"
LABELS_ASSET = "labels.txt"
TEXT_SIGNATURE = "serving_default"
IDS_SIGNATURE = "serve_ids"


class _Untracked:
    """Holds an object out of tf.Module's tracking."""

    def __init__(self, obj):
        self.obj = obj


class ServingModule(tf.Module):
    """Holds the model, its tokenizer and assets; builds both serving functions.

    Args:
      model: a `BertModel` with a task head and a vocab.
      max_seq_len: the packed length of the text signature.
      is_pair: whether the text signature takes `text_b` as well.
      asset_dir: an existing directory where vocab.txt/labels.txt are written
        (tf.saved_model.save copies them into the SavedModel's assets/).
      task: the task type (default: the model's own head and label names).
      text: build the text signature (and track the tokenizer); False for the
        token-ids servable without tensorflow-text ops.
    """

    def __init__(self, model: BertModel, max_seq_len: int, is_pair: bool, asset_dir: str,
                 task: Optional[TaskType] = None, text: bool = True):
        super().__init__(name="tinybert_serving")
        self.task = export_task(model, task)
        self._held = _Untracked(model)
        self.max_seq_len = check_seq_len(model, max_seq_len)
        self.is_pair = bool(is_pair)
        self.text = bool(text)
        # Without the text signature no tokenizer is tracked: its ops stay out of the graph.
        self.tokenizer = load_tokenizer(model, self.max_seq_len) if self.text else None
        names = list(self.task.label_names)
        vocab_path = os.path.join(asset_dir, VOCAB_ASSET)
        labels_path = os.path.join(asset_dir, LABELS_ASSET)
        write_vocab(model.vocab, vocab_path)
        files.write_text_atomic(labels_path, "".join(n + "\n" for n in names))
        self.vocab_file = tf.saved_model.Asset(vocab_path)
        self.labels_file = tf.saved_model.Asset(labels_path)
        self.label_names = tf.constant(names)
        # The tf.Variables behind the Keras 3 weights, tracked here (and the Keras model
        # not: it would save a second copy) so that the saved graph's functions read the
        # variables its restore op fills, as keras' ExportArchive does. Without this,
        # tf.saved_model.load still works (it maps objects), but a graph-mode loader (TF
        # Serving's C++ SavedModelBundle, a tf.compat.v1 Session) finds them missing.
        self.model_variables = [getattr(v, "value", v) for v in model.weights]

        ids_spec = [tf.TensorSpec([None, None], tf.int32, name=n) for n in INPUT_NAMES]
        self.serve_ids = tf.function(self._serve_ids, input_signature=ids_spec, autograph=False)
        # The task type decides what the text signature takes and returns.
        if self.text:
            text_specs = self.task.text_input_specs(self.is_pair)
            self._text_names = [spec.name for spec in text_specs]
            self.serve_text = tf.function(self._serve_text, input_signature=text_specs,
                                          autograph=False)
        else:
            self.serve_text = None

    @property
    def model(self) -> BertModel:
        return self._held.obj

    def logits(self, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
        """Packed inputs [B, L] -> the head's float32 logits."""
        return tf.cast(self.model(inputs, training=False)["logits"], tf.float32)

    def outputs(self, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Packed inputs [B, L] -> the named serving outputs."""
        return self.task.serving_outputs(self.logits(inputs), self.label_names)

    def _serve_text(self, *texts):
        return self.task.serve_text(self, *check_texts(texts, self._text_names))

    def _serve_ids(self, input_word_ids, input_mask, input_type_ids):
        c = self.model.bert_config
        inputs = check_ids({"input_word_ids": input_word_ids, "input_mask": input_mask,
                            "input_type_ids": input_type_ids}, c.vocab_size,
                           max(1, c.type_vocab_size), c.max_position_embeddings)
        return self.outputs(inputs)

    def signatures(self) -> dict:
        """The serving functions by signature name. tf.functions, not concrete ones:
        tf.saved_model.save traces them inside its save context, where it traces every
        tracked function anyway (a trace made outside it is not reused)."""
        if not self.text:  # token ids are the default too: a client needs no signature name
            return {TEXT_SIGNATURE: self.serve_ids, IDS_SIGNATURE: self.serve_ids}
        return {TEXT_SIGNATURE: self.serve_text, IDS_SIGNATURE: self.serve_ids}


def check_texts(texts, names) -> list[tf.Tensor]:
    """String inputs, checked in graph: each a 1-D batch [B], all of one B. Returns
    them so that every op reading them runs only after the checks (InvalidArgument).

    The rank is checked by EnsureShape, which reads the tensor's shape at run time:
    an assert on tf.rank would be folded by Grappler to the rank the signature
    declares, which the server does not enforce.
    """
    texts = [tf.ensure_shape(t, [None], name=f"check_{n}") for t, n in zip(texts, names)]
    if len(texts) > 1:
        same = [tf.debugging.assert_equal(
            tf.shape(t, out_type=tf.int64)[0], tf.shape(texts[0], out_type=tf.int64)[0],
            message=f"inputs {names[0]} and {name} must hold the same number of texts")
            for t, name in zip(texts[1:], names[1:])]
        with tf.control_dependencies(same):
            texts = [tf.identity(t) for t in texts]
    return texts


def check_ids(inputs: dict[str, tf.Tensor], vocab_size: int, type_vocab_size: int,
              max_len: int) -> dict[str, tf.Tensor]:
    """Token-id inputs, checked in graph (module docstring); returns them gated on the
    checks."""
    names = list(inputs)
    inputs = {n: tf.ensure_shape(t, [None, None], name=f"check_{n}") for n, t in inputs.items()}
    shape = tf.shape(inputs[names[0]])
    checks = [tf.debugging.assert_equal(
        tf.shape(inputs[n]), shape,
        message=f"inputs {names[0]} and {n} must have the same shape [batch, seq_len]")
        for n in names[1:]]
    checks.append(tf.debugging.assert_less_equal(
        shape[1], max_len, message=f"seq_len must be at most {max_len} (the model's "
                                   "max_position_embeddings)"))
    checks.append(tf.debugging.assert_greater_equal(
        shape[1], 1, message="seq_len must be at least 1"))
    for n, high in (("input_word_ids", vocab_size), ("input_type_ids", type_vocab_size),
                    ("input_mask", 2)):
        values = tf.reshape(inputs[n], [-1])
        checks.append(tf.debugging.assert_non_negative(
            values, message=f"input {n} must hold values in [0, {high})"))
        checks.append(tf.debugging.assert_less(
            values, tf.constant(high, values.dtype),
            message=f"input {n} must hold values in [0, {high})"))
    with tf.control_dependencies(checks):
        return {n: tf.identity(t) for n, t in inputs.items()}


def export_saved_model(model: BertModel, directory: str, max_seq_len: int,
                       is_pair: bool = False, task: Optional[TaskType] = None,
                       text: bool = True) -> str:
    """Write the TF Serving SavedModel to `directory` (atomically); returns its path.

    text=False: the token-ids servable (no tokenizer, no tensorflow-text op;
    `serving_default` and `serve_ids` both take the ids).

    The directory is built under a temporary sibling and renamed into place
    only when complete; an existing export there is replaced at that moment
    (a remote directory, gs:// or ram://, is written locally and uploaded with
    saved_model.pb last). For TF Serving, put it under a numeric version folder
    (MODEL_BASE/1/).
    """
    task = export_task(model, task)
    with tempfile.TemporaryDirectory(prefix="tinybert-assets-") as asset_dir:
        module = ServingModule(model, max_seq_len, is_pair, asset_dir, task, text=text)
        with atomic_directory(directory) as tmp:
            # atomic_directory gives the folder the umask's usual (readable) mode.
            tf.saved_model.save(module, tmp, signatures=module.signatures())
    return files.absolute(directory)


def custom_ops(directory: str) -> list[str]:
    """Op types in the SavedModel that TensorFlow core does not define (tensorflow-text's)."""
    from tensorflow.core.protobuf import saved_model_pb2

    path = os.path.join(directory, "saved_model.pb")
    if not files.isfile(path):
        raise ExportError(f"{directory}: no saved_model.pb; not a SavedModel directory.")
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString(files.read_bytes(path))
    ops = set()
    for mg in sm.meta_graphs:
        for node in mg.graph_def.node:
            ops.add(node.op)
        for fn in mg.graph_def.library.function:
            ops.update(n.op for n in fn.node_def)
    fn_names = {fn.signature.name for mg in sm.meta_graphs for fn in mg.graph_def.library.function}
    # TensorFlow core exposes every op it registers under tf.raw_ops; the rest
    # come from libraries such as tensorflow-text.
    return sorted(op for op in ops - fn_names if not hasattr(tf.raw_ops, op))
