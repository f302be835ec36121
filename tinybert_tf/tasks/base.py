"""`TaskType`: what a kind of task owns, and the registry of kinds.

A task type is one object per kind of task (classification, regression,
token classification, span question answering). An instance carries the
task's label names and metric choice, and owns everything that differs
between kinds, so no other module compares head names:

  head           the registered head of `tinybert_tf.models.heads` it trains
                 (`head_styles`: others it can train instead, `--classifier_head`),
  labels         `label_names`, stored in every model directory and export,
  data           `dataset(...)`: examples -> tf.data of (inputs, labels), and for
                 kinds with `supports_length_buckets` `row_lengths(...)` and
                 batches padded to length buckets (tinybert_tf.data.buckets),
  losses         `soft_*` (the prediction-layer term, Eq. 10) and `hard_*`
                 (ground truth: fine-tuning, --hard_label_weight),
  metrics        `evaluate(...)` -> dev metrics, `primary_metric`,
  serving        `serving_outputs(...)` (SavedModel), `tflite_output(...)`
                 and `agreement(...)` (export parity).

A new kind is a subclass registered with `@register_task_type`
(docs/extending.md).
"""
from __future__ import annotations

import copy
from typing import Any, ClassVar, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tinybert_tf import plugins
from tinybert_tf.data import buckets
from tinybert_tf.models.tracing import any_shape_function
from tinybert_tf.tokenizer import pack_texts

TASK_TYPES: dict[str, type["TaskType"]] = {}


def register_task_type(cls: Optional[type["TaskType"]] = None, *, replace: bool = False):
    """Class decorator (`@register_task_type`, or `@register_task_type(replace=True)` to
    replace a registered kind): make a task type available by its `kind`."""
    def add(c: type["TaskType"]) -> type["TaskType"]:
        if not c.kind:
            raise ValueError(f"{c.__name__}: a registered TaskType needs a `kind`.")
        return plugins.register(TASK_TYPES, c.kind, c, what="task type", replace=replace)
    return add(cls) if cls is not None else add


def get_task_type(kind: str) -> type["TaskType"]:
    if kind not in TASK_TYPES:
        raise ValueError(f"unknown task type {kind!r}; known: {', '.join(sorted(TASK_TYPES))}.")
    return TASK_TYPES[kind]


def task_type_for_head(head: Optional[str]) -> type["TaskType"]:
    """The task type that trains a model with head `head` (e.g. a loaded model)."""
    for cls in TASK_TYPES.values():
        if head in cls.heads():
            return cls
    raise ValueError(f"no task type uses head={head!r}; task models have one of "
                     f"{sorted(h for c in TASK_TYPES.values() for h in c.heads())}.")


def task_type_of(model) -> "TaskType":
    """The task type (with the model's label names and head) of a model with a task head."""
    head = getattr(model, "head_type", None)
    return task_type_for_head(head).for_model(model).with_head(head)


class TaskType:
    """Base class; see the module docstring. Subclasses set `kind`, `head` and
    implement the data, loss, metric and serving methods."""

    kind: ClassVar[str] = ""
    head: ClassVar[str] = ""
    # The name of the SavedModel / TFLite output that clients read.
    output_name: ClassVar[str] = "logits"
    # Its outputs are named labels: a teacher's outputs are matched to them by name.
    named_outputs: ClassVar[bool] = True
    # Its outputs are answers (labels, tags, spans) that another model or an export keeps
    # or changes: `agreement` measures that share, and the quantize stage selects by it.
    has_answers: ClassVar[bool] = True
    # The prediction-layer phase trains on the original training set even when
    # the intermediate phase used augmented data (the paper does so for STS-B).
    predict_on_original_data: ClassVar[bool] = False
    # `row_lengths` is implemented and `dataset` / `predict` take `length_buckets`:
    # batches padded to a bucket, not max_seq_len. Off for kinds that do not (span
    # QA's windows, task types written before buckets existed).
    supports_length_buckets: ClassVar[bool] = False
    # TaskConfig fields (flags) that only tasks of this kind read, e.g. SQuAD's
    # --doc_stride: `resolve_task` refuses them, set, for a task of another kind.
    own_flags: ClassVar[tuple[str, ...]] = ()
    # --classifier_head style -> the head trained in its place ("pooler", BERT's
    # head on the pooled output, is `head`); e.g. {"pre_classifier": ...}, DistilBERT's.
    head_styles: ClassVar[dict[str, str]] = {}

    def __init__(self, label_names: Sequence[str] = (), metric_names: Sequence[str] = (),
                 primary_metric: Optional[str] = None):
        self.label_names = tuple(str(n) for n in label_names)
        self.metric_names = tuple(metric_names) or self.default_metrics()
        self.primary_metric = primary_metric or self.metric_names[0]
        if self.primary_metric not in self.metric_names:
            raise ValueError(f"primary metric {self.primary_metric!r} is not among "
                             f"{self.metric_names}.")

    # --- identity -------------------------------------------------------------
    def default_metrics(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def num_outputs(self) -> int:
        """Width of the head's last axis (classes, tags, 1 for a score)."""
        return len(self.label_names)

    @classmethod
    def heads(cls) -> tuple[str, ...]:
        """Every head a model of this task type may carry: `head` first."""
        return tuple(dict.fromkeys((cls.head, *cls.head_styles.values())))

    def accepts(self, head: Optional[str]) -> bool:
        """Whether a model with `head` predicts what this task type predicts (e.g. a
        teacher with BERT's pooler head for a student with DistilBERT's)."""
        return head in type(self).heads()

    def with_head(self, head: Optional[str]) -> "TaskType":
        """This task type training `head` (one of `heads()`) instead of its default."""
        if head == self.head:
            return self
        if not self.accepts(head):
            raise ValueError(f"a {self.kind} task trains one of the heads "
                             f"{list(type(self).heads())}, not {head!r}.")
        out = copy.copy(self)
        out.head = head
        return out

    def with_head_style(self, style: str, flag: str = "--classifier_head") -> "TaskType":
        """This task type with the head `style` names ("pooler": the default)."""
        if style == "pooler":
            return self
        if style not in self.head_styles:
            styles = ["pooler", *self.head_styles]
            raise ValueError(f"{flag}={style}: a {self.kind} task trains {' or '.join(styles)} "
                             "heads only; use --classifier_head=pooler.")
        return self.with_head(self.head_styles[style])

    def head_kwargs(self) -> dict[str, Any]:
        """Arguments of `BertModel` / `load_model` for this task's head."""
        return {"head": self.head, "num_labels": self.num_outputs,
                "label_names": list(self.label_names) or None}

    @classmethod
    def for_model(cls, model) -> "TaskType":
        """This task type for a loaded task model (its stored label names, or
        "0".."C-1" when it has none)."""
        n = int(model.num_labels or 0)
        return cls(label_names=model.label_names or [str(i) for i in range(n)])

    def with_label_order(self, names: Sequence[str]) -> "TaskType":
        """This task type with the same label names in another order (a model's)."""
        if sorted(names) != sorted(self.label_names):
            raise ValueError(f"labels {list(names)} are not a reordering of "
                             f"{list(self.label_names)}.")
        other = copy.copy(self)
        other.label_names = tuple(str(n) for n in names)
        return other

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "head": self.head, "labels": list(self.label_names),
                "metrics": list(self.metric_names), "primary_metric": self.primary_metric}

    def __eq__(self, other) -> bool:
        return isinstance(other, TaskType) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash((self.kind, self.label_names, self.metric_names))

    # --- data -------------------------------------------------------------------
    def dataset(self, examples: Sequence[Any], tokenizer, max_seq_len: int, batch_size: int,
                *, drop_remainder: bool = False, input_context=None,
                length_buckets: Sequence[int] = ()) -> tf.data.Dataset:
        """Examples -> tf.data of (inputs, labels): inputs int32 [B, max_seq_len] dicts,
        or [B, bucket] with `length_buckets` (boundaries, `buckets.bucket_boundaries`;
        only where `supports_length_buckets`)."""
        raise NotImplementedError

    def row_lengths(self, examples: Sequence[Any], tokenizer, max_seq_len: int) -> np.ndarray:
        """int [rows]: real tokens (input_mask sum) of each row `dataset` yields, in
        order; what length buckets group by. Only where `supports_length_buckets`."""
        raise NotImplementedError(f"{type(self).__name__} does not batch by length.")

    def cut_examples(self, examples: Sequence[Any], tokenizer, max_seq_len: int
                     ) -> Optional[int]:
        """How many of `examples` are longer than `max_seq_len` pieces and lose their
        ends; None where a longer example loses nothing silently (QA windows cover the
        context; token tasks count and warn about the words cut off)."""
        return None

    def dataset_rows(self, examples: Sequence[Any], tokenizer, max_seq_len: int) -> int:
        """Rows `dataset` yields for `examples` (what an epoch's steps are sized on):
        one per example, unless an example becomes several (QA windows)."""
        return len(examples)

    # --- losses (see tinybert_tf.distill.terms) --------------------------------
    def soft_count(self, inputs: dict, num_outputs: int) -> tf.Tensor:
        """Elements the prediction-layer loss averages over (this replica's batch)."""
        raise NotImplementedError

    def soft_sum(self, inputs: dict, student_logits, teacher_logits,
                 temperature: float) -> tf.Tensor:
        """Numerator of the prediction-layer loss (student vs teacher)."""
        raise NotImplementedError

    def hard_count(self, inputs: dict) -> tf.Tensor:
        """Elements the ground-truth loss averages over (labels in inputs["labels"])."""
        raise NotImplementedError

    def hard_sum(self, inputs: dict, logits) -> tf.Tensor:
        """Numerator of the ground-truth loss."""
        raise NotImplementedError

    def label_metrics(self) -> list[keras.metrics.Metric]:
        """Keras metrics the Distiller updates with (labels, logits) while training."""
        return []

    # --- evaluation -------------------------------------------------------------
    def predict(self, model, examples: Sequence[Any], tokenizer, max_seq_len: int,
                batch_size: int, **kwargs) -> Any:
        """The model's predictions for `examples`, in the form `score` takes. Kinds with
        `supports_length_buckets` take `length_buckets=` (run rows sorted by length in
        bucket-padded batches, predictions back in example order)."""
        raise NotImplementedError

    def score(self, predictions: Any, examples: Sequence[Any]) -> dict[str, float]:
        """Metrics of `predictions` against the examples' gold labels."""
        raise NotImplementedError

    def evaluate(self, model, examples: Sequence[Any], tokenizer, max_seq_len: int,
                 batch_size: int, out_dir: Optional[str] = None,
                 length_buckets: Sequence[int] = ()) -> dict[str, float]:
        """Dev metrics of `model` on labelled `examples`; with `out_dir`, also its
        prediction files there (`write_predictions`). Overrides accept `out_dir`;
        `length_buckets` reaches `predict` where `supports_length_buckets`."""
        extra = {"length_buckets": tuple(length_buckets)} if (
            length_buckets and self.supports_length_buckets) else {}
        predictions = self.predict(model, examples, tokenizer, max_seq_len, batch_size, **extra)
        if out_dir:
            self.write_predictions(out_dir, predictions, examples)
        return self.score(predictions, examples)

    def write_predictions(self, directory: str, predictions: Any,
                          examples: Sequence[Any]) -> list[str]:
        """Write `predict`'s output for `examples` in the task's own file format under
        `directory` (e.g. SQuAD's predictions.json); returns the paths. Default: none."""
        return []

    def model_metadata(self, metrics: dict[str, float]) -> dict[str, Any]:
        """Entries for a saved model's config.json metadata, given its dev `metrics`
        (e.g. a decision threshold chosen on dev that serving applies). Default: none."""
        return {}

    # --- serving ------------------------------------------------------------------
    def serving_outputs(self, logits: tf.Tensor, label_names: tf.Tensor) -> dict[str, tf.Tensor]:
        """SavedModel outputs from the head's float32 logits."""
        raise NotImplementedError

    def tflite_output(self, logits: tf.Tensor) -> tf.Tensor:
        """The export's output in the space parity compares (probabilities, a score,
        ...) from float32 logits; the Keras reference of every format."""
        raise NotImplementedError

    def tflite_outputs(self, logits: tf.Tensor) -> dict[str, tf.Tensor]:
        """The TFLite model's named outputs (one by default: `output_name`)."""
        return {self.output_name: self.tflite_output(logits)}

    def tflite_outputs_names(self) -> tuple[str, ...]:
        """Names of `tflite_outputs`, in output order."""
        return (self.output_name,)

    def from_tflite(self, outputs: Any) -> np.ndarray:
        """A TFLite run's outputs (an array, or {name: array}) in the space of
        `tflite_output`, for parity."""
        return outputs[self.output_name] if isinstance(outputs, dict) else outputs

    # The text signature of the SavedModel: its inputs, and the outputs for them.
    # Sentence tasks take `text` (+ `text_b`); others override both (e.g. one tag
    # per word, or question + context).
    def text_input_specs(self, is_pair: bool) -> list[tf.TensorSpec]:
        specs = [tf.TensorSpec([None], tf.string, name="text")]
        if is_pair:
            specs.append(tf.TensorSpec([None], tf.string, name="text_b"))
        return specs

    def serve_text(self, module, *texts: tf.Tensor) -> dict[str, tf.Tensor]:
        """Raw strings [B] -> outputs, in graph. `module` (export.saved_model's
        ServingModule) offers `tokenizer`, `max_seq_len`, `logits(inputs)` and
        `label_names` (a string tensor)."""
        inputs = module.tokenizer(*texts, max_seq_len=module.max_seq_len)
        return self.serving_outputs(module.logits(inputs), module.label_names)

    # Parity of the SavedModel checks the text signature (in-graph tokenisation
    # end to end) when the task's text outputs are comparable with the Keras
    # reference; otherwise the ids signature's `output_name`.
    parity_through_text: ClassVar[bool] = True

    def agreement(self, reference: np.ndarray, outputs: np.ndarray,
                  ctx: Any = None) -> Optional[float]:
        """Share of predictions an export makes as the Keras model does (None: not
        a label task). `ctx`: the export's `ExportContext` (dev texts and inputs)."""
        return None

    def export_inputs(self, tokenizer, texts_a: Sequence[str],
                      texts_b: Optional[Sequence[str]], max_seq_len: int
                      ) -> dict[str, np.ndarray]:
        """Dev / calibration texts -> packed int32 inputs [N, L] for export checks
        (extra keys are allowed: runtimes read only the model inputs)."""
        return pack_texts(tokenizer, texts_a, texts_b, max_seq_len)

    def tflite_metadata_kind(self, is_pair: bool, lower_case: bool) -> str:
        """The TFLite metadata kind (`export.tflite_metadata.KINDS`) of this task's
        TFLite models. Default "generic": the tokenizer and inputs described, each
        output by its tensor name (no Task Library API fits)."""
        return "generic"


# --- helpers shared by task types ----------------------------------------------------

def forward_fn(model):
    """One traced inference function per model (float32 logits), reused by every
    evaluation of that model: one trace for every batch size and bucket length."""
    fn = getattr(model, "_tinybert_logits_fn", None)
    if fn is None:
        fn = any_shape_function(
            lambda inputs: tf.cast(model(inputs, training=False)["logits"], tf.float32))
        model._tinybert_logits_fn = fn
    return fn


def predict_logits(model, dataset: tf.data.Dataset, max_seq_len: Optional[int] = None
                   ) -> np.ndarray:
    """Logits [N, ...] over a dataset of (inputs, labels) batches. Per-position logits
    of bucket-padded batches ([b, bucket, C]) are padded back to `max_seq_len` with
    zeros when it is given."""
    forward = forward_fn(model)
    chunks = [buckets.pad_positions(forward(inputs).numpy(), max_seq_len)
              for inputs, _ in dataset]
    if not chunks:
        return np.zeros((0, model.num_labels or 1), np.float32)
    return np.concatenate(chunks, axis=0)


def inference_batches(task: TaskType, examples: Sequence[Any], tokenizer, max_seq_len: int,
                      batch_size: int, length_buckets: Sequence[int] = ()
                      ) -> tuple[tf.data.Dataset, Optional[np.ndarray]]:
    """(dataset, order) for a forward pass over every row of `examples`.

    With `length_buckets` (and a task type that supports them) the rows run
    sorted by length in bucket-padded batches and `order` is that order (put the
    outputs back with `buckets.unsort`); otherwise example order and None.
    """
    if not length_buckets or not task.supports_length_buckets:
        return task.dataset(examples, tokenizer, max_seq_len, batch_size), None
    order = buckets.length_order(task.row_lengths(examples, tokenizer, max_seq_len))
    ds = task.dataset([examples[i] for i in order], tokenizer, max_seq_len, batch_size,
                      length_buckets=length_buckets)
    return ds, order


def predict_rows(model, task: TaskType, examples: Sequence[Any], tokenizer, max_seq_len: int,
                 batch_size: int, length_buckets: Sequence[int] = ()) -> np.ndarray:
    """Float32 logits of every row of `examples` in row order ([N, C], or [N,
    max_seq_len, C] per position), bucketed when `length_buckets` is given."""
    ds, order = inference_batches(task, examples, tokenizer, max_seq_len, batch_size,
                                  length_buckets)
    logits = predict_logits(model, ds, max_seq_len)
    return logits if order is None else buckets.unsort(logits, order)
