"""TFLite for Android: float32, float16, dynamic-range int8, full-integer int8
(int8_ptq: always calibrated after training) and int16x8 (16-bit activations,
8-bit weights), and text-in float32.

Every ids flavour has the TFLite Task Library `BertNLClassifier` interface:
inputs `input_word_ids`, `input_mask`, `input_type_ids`, int32 [1, L] (in that
order), and the float32 outputs named by the task type (`probabilities` [1, C]
for a classifier, `score` [1, 1] for a regressor). `FLAVOURS` is the table of
flavours and their converter settings. The converter names tensors
`serving_default_input_word_ids:0` and orders them alphabetically; we rename
and reorder them in the flatbuffer so the plain names are the tensor names
(the SignatureDef, which refers to tensors by index, stays valid).

Every flavour carries TFLite metadata (tflite_metadata.py): the kind the task
type names (`TaskType.tflite_metadata_kind`: bert_nl_classifier for an uncased
single-text classifier, which the Task Library's BertNLClassifier loads), or
its descriptive fallback when the model breaks a Task Library condition
(`tflite_metadata.fitting_kind`). `convert(..., metadata=False)` gives the
bare model (benchmarks at batch > 1).

The graph is the model at batch 1 and a fixed length. The converter gets the
traced function with the variables it reads held by a `tf.Module` (`converter`):
its SavedModel route saves them as a checkpoint and freezes them itself. Other
holders fail: with an empty `tf.Module` the converter cannot save the function and
falls back to a route whose model has no SignatureDef (int8 calibration, which
feeds the signature, then fails); the Keras model as holder leaves READ_VARIABLE
ops behind. Freezing the function first (`convert_variables_to_constants_v2`) gives
the same TFLite graph, but the converter then writes every weight into a GraphDef,
saves it and loads it back: 3-4 times slower per conversion (docs/measurements.md).
The text-in flavour's function, whose lookup tables a `tf.Module` of variables does
not hold, is frozen first.

dynamic_int8: TF 2.20 quantises dense weights per output channel, which makes
FULLY_CONNECTED version 12; the Task Library's runtime (tflite-support 0.4.4)
refuses it. Per-tensor dense weights (version 9) load there, and agree as well
(tests/export/test_tflite_metadata.py), so the flavour uses them.

Text-in (`text_float32`): inputs `text` (and `text_b`), string [1]; the
model's own `Tokenizer` (tensorflow-text FastBertTokenizer + core packing
ops) runs in the graph. FastBertTokenizer converts to three TFLite custom ops,
FastBertNormalize, FastWordpieceTokenizeWithOffsets and RaggedTensorToTensor
(`TEXT_CUSTOM_OPS`), which tensorflow-text implements for TFLite
(`tensorflow_text.tflite_registrar`): an app registers them in its op
resolver (docs/deploy.md). Here `TFLiteRunner` does so through
ai-edge-litert's InterpreterWithCustomOps.

Full-integer flavours (int8, int16x8) quantise the integer-friendly trace
(the encoder's `integer_friendly` call argument, the same maths: centred LayerNorm, plain GATHER
embeddings, the 0/1 mask from a GATHER), so no float op is left between the
int32 ids and the output DEQUANTIZE: what an integer-only delegate needs.
Measured on the demo (docs/deploy.md): int8 keeps 80-88% of the dev labels,
int16x8 all of them (its x86 kernels are slow reference code; the Task
Library's runtime lacks int16 GELU/RSQRT, so it carries descriptive metadata).

A fake-quantised model (the quantize stage's student, models/quantization.py)
converts to int8 only, with the ranges its FakeQuant ops carry and no
representative data (`_learnt_int8`); the `int8` format converts it when the
export has one (`Flavour.learnt_ranges`), and `int8_ptq` calibrates the float
model beside it.

Full-integer quantisation and the attention mask: the encoder adds -10000 to the
scores of padded keys (`layers.MASK_VALUE`, right for float training). In int8
the sum "scores + mask" then spans [-10000, max score], one int8 step is ~40,
and every real score rounds to the same value: attention turns uniform and the
labels are noise (we measured 53% agreement on a toy task). For the
full-integer flavours only, we trace the graph with a mask value sized from the calibration
data instead (the encoder's `mask_value` call argument): -(max score range
seen + 20), which still gives padded keys a weight below e^-20 of the best
real key while leaving int8 resolution for the real scores (100% agreement on
the same task). The float flavours keep -10000.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import warnings
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow.lite.tools import flatbuffer_utils
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tinybert_tf import files
from tinybert_tf.export import tflite_metadata as tm
from tinybert_tf.export.common import ExportError, check_seq_len, export_task
from tinybert_tf.files import write_bytes_atomic
from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.models.encoder import INPUT_NAMES, BertModel
from tinybert_tf.models.layers import MASK_VALUE
from tinybert_tf.models.quantization import is_quantized
from tinybert_tf.startup import filtered_stderr
from tinybert_tf.tasks import TaskType

# What TensorFlow Lite's converter, calibrator and interpreter write to file descriptor 2
# from C++ on every successful conversion or interpreter start, which no Python logging
# level reaches: absl's notice that it logs before initialisation, the converter's
# "Ignored output_format / drop_control_dependency" (flags the v2 converter does not
# use), MLIR's pass notice, the calibrator's settings line and XNNPACK's start. Every
# other line (an error, a warning of ours) is written through.
TFLITE_NOISE = re.compile(
    r"(^WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR|tf_tfl_flatbuffer_helpers\.cc:\d+\] Ignored (output_format|"
    r"drop_control_dependency)\.|mlir_graph_optimization_pass\.cc:\d+\] MLIR V1 "
    r"optimization pass is not enabled|^fully_quantize: \d+, inference_type: |"
    r"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.)")


@contextlib.contextmanager
def quiet_tflite():
    """Inside the block, TFLITE_NOISE's lines are dropped from file descriptor 2, and the
    deprecation warning of tf.lite.Interpreter, which int8 calibration inside the
    converter creates (this package runs models with ai-edge-litert), is not shown."""
    with warnings.catch_warnings(), filtered_stderr(TFLITE_NOISE):
        warnings.filterwarnings("ignore", message=r"\s*Warning: tf\.lite\.Interpreter is "
                                "deprecated", category=UserWarning)
        yield


@dataclasses.dataclass(frozen=True)
class Flavour:
    """A TFLite flavour: how the converter is set up, whether it needs
    representative task text to calibrate activation ranges, whether it takes
    raw text (the tokenizer in the graph) instead of token ids, and whether it
    quantises the integer-friendly trace (the encoder's `integer_friendly`)."""

    description: str
    configure: Callable[[Any, Optional[list]], None]
    calibrated: bool = False
    text_input: bool = False
    integer: bool = False
    # Why the Task Library's runtime cannot run this flavour (None: it can); such a
    # flavour gets the descriptive fallback of the task's Task Library kind.
    not_in_task_library: Optional[str] = None
    # Converted from the quantised student (models/quantization.py) with its learnt
    # ranges when the export has one; from the float model, calibrated, otherwise.
    learnt_ranges: bool = False


def _float32(converter, rows) -> None:
    """No optimisation: the float graph as is."""


def _float16(converter, rows) -> None:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]


def _dynamic_int8(converter, rows) -> None:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    # Per-tensor dense weights: FULLY_CONNECTED v9, which the Task Library loads
    # (per-channel makes v12, which it refuses; see the module docstring).
    converter._experimental_disable_per_channel_quantization_for_dense_layers = True


def _int8(converter, rows) -> None:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(rows)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    # The ids stay int32 and the probabilities float32: the Task Library
    # feeds int32 ids and reads float scores.


def _learnt_int8(converter, rows) -> None:
    """A fake-quantised model (models/quantization.py): the converter quantises every
    tensor with the ranges its FakeQuant ops carry; no calibration data.

    Not `supported_ops=[TFLITE_BUILTINS_INT8]`: TF 2.20 checks for a representative
    data set before it looks for FakeQuant ops (`_save_conversion_params_metric`
    builds its QuantizationMode without the graph) and refuses. Every tensor has a
    range, so nothing stays float (tests/models/test_quantization.py checks each op).
    """
    converter.optimizations = [tf.lite.Optimize.DEFAULT]


def _int16x8(converter, rows) -> None:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(rows)
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]


def _text(converter, rows) -> None:
    # The tokenizer's tensorflow-text ops stay custom ops (TEXT_CUSTOM_OPS).
    converter.allow_custom_ops = True


FLAVOURS: dict[str, Flavour] = {
    "float32": Flavour("TFLite float32", _float32),
    "float16": Flavour("TFLite with float16 weights", _float16),
    "dynamic_int8": Flavour("TFLite with int8 weights, float activations", _dynamic_int8),
    "int8": Flavour("TFLite full-integer int8: the quantised student's learnt ranges, or "
                    "calibrated without one", _int8, calibrated=True, integer=True,
                    learnt_ranges=True),
    "int8_ptq": Flavour("TFLite full-integer int8 of the float model, calibrated after "
                        "training (post-training quantisation)", _int8, calibrated=True,
                        integer=True),
    "int16x8": Flavour("TFLite full-integer, int16 activations and int8 weights (calibrated)",
                       _int16x8, calibrated=True, integer=True,
                       not_in_task_library="the Task Library's TFLite runtime (tflite-support "
                       "0.4.4) has no int16 GELU and RSQRT kernels (measured: it cannot "
                       "allocate or invoke a 16x8 model)"),
    "text_float32": Flavour("TFLite float32 taking raw text (WordPiece in the graph, "
                            "tensorflow-text custom ops)", _text, text_input=True),
}

# What the text-in flavour's graph needs beyond TFLite's builtin ops, all
# registered by tensorflow_text.tflite_registrar (C++: tensorflow_text/core/kernels/
# *_tflite.cc, e.g. AddFastBertNormalize).
TEXT_CUSTOM_OPS = ("FastBertNormalize", "FastWordpieceTokenizeWithOffsets",
                   "RaggedTensorToTensor")
TEXT_INPUT_NAMES = ("text", "text_b")


def tflite_file(flavour: str) -> str:
    return f"model_{flavour}.tflite"


MASK_MARGIN = 20.0  # padded keys get weight < e^-20 of the best real key


def calibrated_mask_value(model: BertModel, rows: Sequence[dict[str, np.ndarray]],
                          batch_size: int = 64) -> float:
    """-(largest spread of real-key attention scores in `rows` + MASK_MARGIN).

    Spread = max - min of QK^T/sqrt(d_k) over real query/key positions of one
    example and head, maximised over examples, heads and layers.
    """
    spread = 0.0
    keys = INPUT_NAMES
    data = {k: np.concatenate([r[k] for r in rows], 0) for k in keys}
    for s in range(0, len(data[keys[0]]), batch_size):
        batch = {k: tf.constant(v[s:s + batch_size]) for k, v in data.items()}
        out = model(batch, training=False)
        real = tf.cast(batch["input_mask"], tf.bool)[:, None, None, :]
        for scores in out["attention_scores"]:
            scores = tf.cast(scores, tf.float32)
            hi = tf.reduce_max(tf.where(real, scores, -np.inf), axis=-1)
            lo = tf.reduce_min(tf.where(real, scores, np.inf), axis=-1)
            spread = max(spread, float(tf.reduce_max(hi - lo)))
    return -(spread + MASK_MARGIN)


def model_function(model: BertModel, max_seq_len: int, batch_size: int = 1,
                   mask_value: Optional[float] = None, task: Optional[TaskType] = None,
                   integer: bool = False):
    """A concrete function: 3 x int32 [batch, L] -> the task's TFLite outputs; convert it
    with `converter`, which hands the converter the variables it reads.

    mask_value: the additive attention mask to trace with (None: the encoder's).
    integer: trace the integer-friendly graph (`BertModel(integer_friendly=True)`; the same
    maths) that the full-integer flavours quantise.
    """
    task = export_task(model, task)
    value = MASK_VALUE if mask_value is None else float(mask_value)
    spec = [tf.TensorSpec([batch_size, max_seq_len], tf.int32, name=n) for n in INPUT_NAMES]

    @tf.function(input_signature=spec, autograph=False)
    def predict(input_word_ids, input_mask, input_type_ids):
        if integer and not is_quantized(model):  # a quantised model gathers its own mask
            # A float 0/1 mask from a two-entry table: GATHER has integer kernels,
            # the encoder's int32 -> float32 CAST has none (it would stay float).
            input_mask = tf.gather(tf.constant([0.0, 1.0]), input_mask)
        inputs = {"input_word_ids": input_word_ids, "input_mask": input_mask,
                  "input_type_ids": input_type_ids}
        logits = model(inputs, training=False, mask_value=value, integer_friendly=integer)
        return task.tflite_outputs(tf.cast(logits["logits"], tf.float32))

    ranges = getattr(model, "quant_ranges", None)
    with ranges.converter_trace() if ranges is not None else contextlib.nullcontext():
        return predict.get_concrete_function()


def converter(fn) -> tf.lite.TFLiteConverter:
    """A TFLite converter for `fn` (a concrete function, frozen or not) that takes the
    SavedModel route with the variables `fn` reads (see the module docstring)."""
    holder = tf.Module()
    holder.read_variables = list(fn.variables)
    return tf.lite.TFLiteConverter.from_concrete_functions([fn], holder)


def text_model_function(model: BertModel, max_seq_len: int, is_pair: bool,
                        task: Optional[TaskType] = None):
    """A frozen concrete function: `text` (and `text_b`), string [1] -> the task's
    TFLite outputs, tokenised in graph by the model's `Tokenizer`."""
    task = export_task(model, task)
    tokenizer = load_tokenizer(model, max_seq_len)
    names = TEXT_INPUT_NAMES[:2 if is_pair else 1]
    spec = [tf.TensorSpec([1], tf.string, name=n) for n in names]

    @tf.function(input_signature=spec, autograph=False)
    def predict(*texts):
        inputs = tokenizer(*texts, max_seq_len=max_seq_len)
        logits = tf.cast(model(inputs, training=False)["logits"], tf.float32)
        return task.tflite_outputs(logits)

    return convert_variables_to_constants_v2(predict.get_concrete_function())


def convert(model: BertModel, fmt: str, max_seq_len: int,
            representative: Optional[Iterable[dict[str, np.ndarray]]] = None,
            batch_size: int = 1, task: Optional[TaskType] = None, *, is_pair: bool = False,
            metadata: bool = True) -> bytes:
    """Convert `model` to one TFLite flavour; returns the flatbuffer bytes.

    Args:
      fmt: a key of FLAVOURS (float32 | float16 | dynamic_int8 | int8 | text_float32).
      max_seq_len: the fixed sequence length L of the inputs.
      representative: for int8, packed inputs (dicts of int32 [N, L]) of real
        task text used to calibrate activation ranges.
      batch_size: the fixed batch of the inputs (1 for Android / the Task
        Library; larger only for throughput benchmarks: TFLite graphs cannot be
        resized afterwards, their reshapes are fixed at conversion).
      is_pair: the task reads text pairs (metadata; the text-in inputs).
      metadata: attach TFLite metadata (`attach_metadata`).
    """
    if fmt not in FLAVOURS:
        raise ExportError(f"unknown TFLite format {fmt!r}; use one of {', '.join(FLAVOURS)}.")
    flavour = FLAVOURS[fmt]
    task = export_task(model, task)
    max_seq_len = check_seq_len(model, max_seq_len)
    rows = None
    configure = flavour.configure
    learnt = is_quantized(model)
    if learnt and not flavour.learnt_ranges:
        raise ExportError(f"{fmt}: the model is fake-quantised for int8 (the quantize "
                          "stage's student); it converts to int8 only. Export the float task "
                          "student (OUTPUT/task/model) for the other flavours.")
    if learnt:
        configure = _learnt_int8
        fn = model_function(model, max_seq_len, batch_size, task=task, integer=True)
        in_names = INPUT_NAMES
    elif flavour.text_input:
        kind = text_metadata_kind(model, task, is_pair, fmt)
        if batch_size != 1:
            raise ExportError(f"{fmt}: the text-in flavour takes one text per call; "
                              f"batch_size={batch_size} is for the ids flavours.")
        fn = text_model_function(model, max_seq_len, is_pair, task)
        in_names = TEXT_INPUT_NAMES[:2 if is_pair else 1]
    else:
        mask_value = None
        if flavour.calibrated:
            rows = _representative_rows(representative, max_seq_len, batch_size)
            mask_value = calibrated_mask_value(model, rows)
        fn = model_function(model, max_seq_len, batch_size, mask_value=mask_value, task=task,
                            integer=flavour.integer)
        in_names = INPUT_NAMES
    conv = converter(fn)
    configure(conv, rows)
    with quiet_tflite():
        flat = conv.convert()
    flat = name_io(flat, list(task.tflite_outputs_names()), in_names)
    if not metadata:
        return flat
    if flavour.text_input:
        return tm.add_metadata(flat, kind=kind, vocab=None, labels=_labels(task, kind),
                               lower_case=model.bert_config.lower_case, pair=is_pair)
    return attach_metadata(flat, model, task, is_pair, max_seq_len, batch_size,
                           runtime_note=flavour.not_in_task_library)


def _labels(task: TaskType, kind: str) -> Optional[list[str]]:
    """The task's label names when the kind's outputs are labelled, else None."""
    return list(task.label_names) if any(o.labels for o in tm.KINDS[kind].outputs) else None


def metadata_kind(model: BertModel, task: TaskType, is_pair: bool, max_seq_len: int,
                  batch_size: int = 1, runtime_note: Optional[str] = None
                  ) -> tuple[str, Optional[str]]:
    """(kind, fallback note): the task type's kind, or its descriptive fallback
    when this model cannot run in the Task Library (tflite_metadata.fitting_kind;
    runtime_note: why the flavour cannot run there, if so)."""
    kind = task.tflite_metadata_kind(bool(is_pair), bool(model.bert_config.lower_case))
    if kind not in tm.KINDS:
        raise ExportError(f"{type(task).__name__}.tflite_metadata_kind returned {kind!r}; "
                          f"use one of {', '.join(tm.KINDS)}.")
    return tm.fitting_kind(kind, batch_size=batch_size, seq_len=max_seq_len,
                           lower_case=bool(model.bert_config.lower_case), pair=bool(is_pair),
                           runtime_note=runtime_note)


def text_metadata_kind(model: BertModel, task: TaskType, is_pair: bool, fmt: str) -> str:
    """The text-in kind of the task's ids kind; ExportError when it has none (the
    task's text inputs are not one text or a pair: token tags, questions)."""
    kind = task.tflite_metadata_kind(bool(is_pair), bool(model.bert_config.lower_case))
    text_kind = tm.KINDS[kind].text_kind if kind in tm.KINDS else None
    if text_kind is None:
        raise ExportError(f"{fmt}: a {task.kind} task has no text-in TFLite model (its "
                          f"metadata kind {kind!r} has no text-in twin; text-in covers "
                          "sentence classification and regression). Drop it from "
                          "--export_formats and tokenise in the app with an ids flavour "
                          "and its vocab.txt.")
    return text_kind


def attach_metadata(flat: bytes, model: BertModel, task: TaskType, is_pair: bool,
                    max_seq_len: int, batch_size: int = 1,
                    runtime_note: Optional[str] = None) -> bytes:
    """Add the task's TFLite metadata (vocab.txt, labels.txt) to an ids model.

    A Task Library kind the model (or its flavour: `runtime_note`) cannot
    satisfy falls back to its descriptive kind; the reason is in the metadata's
    description, and a warning says it too unless the flavour decided it.
    """
    kind, note = metadata_kind(model, task, is_pair, max_seq_len, batch_size, runtime_note)
    if note and not runtime_note:
        warnings.warn(f"TFLite metadata: {note}", stacklevel=2)
    labels = _labels(task, kind)
    if labels is not None and not getattr(model, "label_names", None):
        warnings.warn(f"TFLite metadata: the model has no label names; labels.txt names the "
                      f"classes {labels} (set label_names when saving the model).", stacklevel=2)
    return tm.add_metadata(flat, kind=kind, vocab=model.vocab, labels=labels,
                           lower_case=bool(model.bert_config.lower_case), pair=bool(is_pair),
                           note=note)


def _representative_rows(representative, max_seq_len: int, batch_size: int = 1
                         ) -> list[dict[str, np.ndarray]]:
    """Split packed inputs into [batch_size, L] rows for calibration (cycling
    examples to fill the last one); empty -> ExportError."""
    flat = []
    for batch in representative or ():
        n = len(batch["input_word_ids"])
        for i in range(n):
            row = {k: np.asarray(batch[k][i:i + 1], np.int32) for k in INPUT_NAMES}
            if row["input_word_ids"].shape != (1, max_seq_len):
                raise ExportError(f"representative inputs have shape "
                                  f"{row['input_word_ids'].shape}, expected (1, {max_seq_len}).")
            flat.append(row)
    rows = []
    for s in range(0, len(flat), batch_size):
        chunk = [flat[(s + j) % len(flat)] for j in range(batch_size)]
        rows.append({k: np.concatenate([r[k] for r in chunk], 0) for k in INPUT_NAMES})
    if not rows:
        raise ExportError("full-integer export (int8, int16x8) needs a representative data "
                          "set of task text to calibrate activations, and got none: pass "
                          "representative_texts (bin/export: --data_dir with train/dev text, "
                          "--representative_examples > 0), or drop int8 and int16x8 from "
                          "--export_formats.")
    return rows


def name_io(flat: bytes, out_names: Union[str, Sequence[str]],
            in_names: Sequence[str] = INPUT_NAMES) -> bytes:
    """Rename the inputs to `in_names` (in that order) and the outputs to `out_names`
    (the keys the traced function returned, in that order)."""
    out_names = [out_names] if isinstance(out_names, str) else list(out_names)
    in_names = list(in_names)

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    if len(model.subgraphs) != 1:
        raise ExportError(f"expected one TFLite subgraph, got {len(model.subgraphs)}.")
    sg = model.subgraphs[0]
    by_name = {}
    for idx in sg.inputs:
        name = sg.tensors[idx].name.decode()
        match = [n for n in in_names if name == n or name.endswith("_" + n + ":0")
                 or name.startswith(n + ":")]
        if len(match) != 1:
            raise ExportError(f"unexpected TFLite input tensor {name!r}.")
        by_name[match[0]] = idx
    if sorted(by_name) != sorted(in_names) or len(sg.outputs) != len(out_names):
        raise ExportError(f"TFLite model has inputs {sorted(by_name)} and "
                          f"{len(sg.outputs)} outputs; expected {in_names} and "
                          f"{len(out_names)}.")
    for n, idx in by_name.items():
        sg.tensors[idx].name = n.encode()
    sg.inputs = np.array([by_name[n] for n in in_names], dtype=np.int32)
    # The SignatureDef maps the function's output keys to tensors.
    by_key = {}
    for sig in model.signatureDefs or []:
        for out in sig.outputs:
            by_key[out.name.decode() if isinstance(out.name, bytes) else out.name] = \
                out.tensorIndex
    generic = [f"output_{i}" for i in range(len(sg.outputs))]
    if sorted(by_key) == sorted(generic) or not by_key:
        # A frozen function's outputs lose their keys: they come in tf.nest's flat
        # order, i.e. sorted by key.
        flat = [by_key[g] for g in generic] if by_key else list(sg.outputs)
        by_key = dict(zip(sorted(out_names), flat))
    missing = [n for n in out_names if n not in by_key]
    if missing:
        raise ExportError(f"TFLite signature lacks outputs {missing}; has {sorted(by_key)}.")
    for n in out_names:
        sg.tensors[by_key[n]].name = n.encode()
    sg.outputs = np.array([by_key[n] for n in out_names], dtype=np.int32)
    # The signature's output keys too: a frozen function's are output_0, output_1, ...,
    # and `get_signature_runner()` should answer with the SavedModel's names.
    index_to_name = {by_key[n]: n for n in out_names}
    for sig in model.signatureDefs or []:
        for out in sig.outputs:
            if out.tensorIndex in index_to_name:
                out.name = index_to_name[out.tensorIndex].encode()
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


class TFLiteRunner:
    """Runs a converted model with ai-edge-litert's Interpreter.

    Args:
      model: a .tflite path or its bytes.
      batch_size: rows per call; must equal the batch the model was converted
        at (TFLite cannot resize our graphs: their reshapes are fixed).
      num_threads: CPU threads for the interpreter (XNNPACK); None = all cores.

    A text-in model (inputs `text` [, `text_b`]) runs with tensorflow-text's
    TFLite ops registered; call it with {"text": [str], ...}.
    """

    def __init__(self, model: Union[str, bytes], batch_size: int = 1,
                 num_threads: Optional[int] = None):
        from ai_edge_litert.interpreter import InterpreterWithCustomOps

        if isinstance(model, str) and files.is_remote(model):
            model = files.read_bytes(model)  # the interpreter opens local paths only
        kwargs = {"model_path": model} if isinstance(model, str) else {"model_content": model}
        # The interpreter's own default is one thread; a 2-core box runs the
        # student ~1.9x faster with both (measured: 20.4 -> 11.1 ms, seq 128).
        self.num_threads = int(num_threads or os.cpu_count() or 1)
        with quiet_tflite():  # XNNPACK announces itself when the tensors are allocated
            self.interpreter = InterpreterWithCustomOps(
                custom_op_registerers=list(tf_text.tflite_registrar.SELECT_TFTEXT_OPS),
                num_threads=self.num_threads, **kwargs)
            self.interpreter.allocate_tensors()
        details = {d["name"]: d for d in self.interpreter.get_input_details()}
        self.text_input = TEXT_INPUT_NAMES[0] in details
        names = [n for n in TEXT_INPUT_NAMES if n in details] if self.text_input else INPUT_NAMES
        missing = [n for n in names if n not in details]
        if missing:
            raise ExportError(f"TFLite model lacks input tensors {missing}; got {sorted(details)}.")
        self.input_names = tuple(names)
        self.input_index = {n: details[n]["index"] for n in names}
        first = details[names[0]]["shape"]
        self.seq_len = None if self.text_input else int(first[1])
        self.batch_size = int(first[0])
        if batch_size != self.batch_size:
            raise ExportError(f"this TFLite model was converted for batch {self.batch_size}, "
                              f"not {batch_size}; convert(..., batch_size={batch_size}).")
        outputs = self.interpreter.get_output_details()
        self.output_index = {d["name"]: d["index"] for d in outputs}
        self.output_names = [d["name"] for d in outputs]

    def __call__(self, inputs: dict[str, np.ndarray]) -> Union[np.ndarray, dict]:
        """One batch of exactly batch_size rows: int32 [B, L] each -> the output
        ([B, C] for a classifier), or {name: output} when the model has several."""
        for n, idx in self.input_index.items():
            value = (np.asarray(inputs[n], object) if self.text_input
                     else np.asarray(inputs[n], np.int32))
            self.interpreter.set_tensor(idx, value)
        self.interpreter.invoke()
        outs = {n: np.array(self.interpreter.get_tensor(i)) for n, i in self.output_index.items()}
        return outs[self.output_names[0]] if len(outs) == 1 else outs

    def predict(self, inputs: dict[str, np.ndarray]) -> Union[np.ndarray, dict]:
        """Any number of rows [N, L] -> [N, ...] (or {name: [N, ...]}), run batch_size
        rows at a time (the last batch padded with copies of its first row)."""
        n = len(inputs[self.input_names[0]])
        outs = []
        for s in range(0, n, self.batch_size):
            chunk = {k: np.asarray(inputs[k][s:s + self.batch_size]) for k in self.input_names}
            m = len(chunk[self.input_names[0]])
            if m < self.batch_size:
                chunk = {k: np.concatenate([v, np.repeat(v[:1], self.batch_size - m, 0)])
                         for k, v in chunk.items()}
            out = self(chunk)
            outs.append({k: v[:m] for k, v in out.items()} if isinstance(out, dict)
                        else out[:m])
        if not outs:
            return np.zeros((0, 0), np.float32)
        if isinstance(outs[0], dict):
            return {k: np.concatenate([o[k] for o in outs], 0) for k in outs[0]}
        return np.concatenate(outs, 0)


def tensor_types(flat: Union[str, bytes]) -> dict[str, int]:
    """How many tensors of each type the model holds (e.g. to see int8 coverage)."""

    if isinstance(flat, str):
        flat = files.read_bytes(flat)
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    counts: dict[str, int] = {}
    for t in model.subgraphs[0].tensors:
        name = flatbuffer_utils.type_to_name(t.type)
        counts[name] = counts.get(name, 0) + 1
    return counts


def operators(flat: Union[str, bytes]) -> list[str]:
    """Sorted builtin/custom operator names used by the model."""

    if isinstance(flat, str):
        flat = files.read_bytes(flat)
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    return sorted({flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
                   for op in model.subgraphs[0].operators})


def custom_operators(flat: Union[str, bytes]) -> list[str]:
    """Sorted custom op codes the model needs (what an app's op resolver must add)."""

    if isinstance(flat, str):
        flat = files.read_bytes(flat)
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    used = {op.opcodeIndex for sg in model.subgraphs for op in sg.operators}
    return sorted(model.operatorCodes[i].customCode.decode() for i in used
                  if model.operatorCodes[i].customCode)


def write_tflite(flat: bytes, path: str) -> str:
    """The model's bytes to `path` (any tf.io.gfile path), whole or not at all."""
    write_bytes_atomic(path, flat)
    return files.absolute(path)


__all__: Sequence[str] = ["convert", "converter", "TFLiteRunner", "name_io", "model_function",
                          "text_model_function", "attach_metadata", "metadata_kind",
                          "tensor_types", "operators", "custom_operators", "write_tflite",
                          "TEXT_CUSTOM_OPS"]
