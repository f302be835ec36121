"""Export everything, then check each artefact gives the Keras model's answers.

`export_all(ExportRequest(...))` writes, under one export directory, the artefact
of every format asked for (the table in formats.py: serving/<N>/ +
serving/models.config, model_<flavour>.tflite, hf/, keras_hub/), then
`parity.json`, written last: its
presence marks a complete export. It returns (and prints as a table) the
parity dict: per format, on the dev set, max |probability - Keras probability|
(score for regression), label agreement with Keras, the task metric, the
artefact's size, latency at batch 1, and what the format describes of its
artefact (the SavedModel's served version, a TFLite file's metadata).

With a quantised student (`ExportRequest.quantized`, the quantize stage's), the
int8 flavour is converted from it with its learnt ranges, `int8_ptq` (the float model's
post-training int8) is exported beside it, and a `keras_quantized` row gives
the quantised student's own Keras answers; every row is compared with the
float model's.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.export import formats as fmts
from tinybert_tf.export.common import (
    ExportError,
    Text,
    check_seq_len,
    export_task,
    keras_outputs,
    label_permutation,
    path_size,
    split_texts,
)
from tinybert_tf.export.serving import check_model_name, check_version
from tinybert_tf.files import write_json_atomic
from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.models.quantization import is_quantized
from tinybert_tf.tasks import TaskType, task_type
from tinybert_tf.timing import median_ms

PARITY_FILE = "parity.json"
DEFAULT_FORMATS = ("saved_model", "float32", "float16", "dynamic_int8", "int8", "int16x8")
# Exported beside a learnt-range flavour made from a quantised student: the float
# model's calibrated int8, what the quantised one is measured against.
POST_TRAINING_INT8 = "int8_ptq"
# Not by default: text_float32 (raw text in, needs tensorflow-text ops in the app),
# hf, keras_hub.


@dataclasses.dataclass(frozen=True)
class ExportRequest:
    """What `export_all` exports, where, and on which data it checks parity.

    Attributes:
      model: a task `BertModel` (a task head, with vocab).
      output_dir: the export folder, e.g. OUTPUT/export.
      max_seq_len: the task's sequence length (fixed in TFLite).
      dev_texts: ["text", ...] or [("text a", "text b"), ...] for pair tasks.
      formats: names in the format table (saved_model, float32, ..., hf, keras_hub).
      dev_labels: gold labels for the task metric (optional).
      representative_texts: calibration text for int8 (default: dev_texts).
      is_pair: the texts are (a, b) pairs.
      task: the task type (or a GLUE-table task name) whose outputs and metric to
        use; default: the model's head and label names.
      task_name: the task's name for parity.json (default: `task` when it is a name).
      latency_runs: timed batch-1 calls per format.
      num_threads: TFLite interpreter threads (None = all cores).
      max_examples: cap on dev examples checked (None = all).
      serving_name: the model name in serving/models.config, used as given (TF
        Serving's names are case-sensitive); default: the task name lower-cased with
        other characters made '_', else "tinybert".
      serving_version: publish the SavedModel as this version (default: the next
        free one); an existing version is an ExportError, never rewritten.
      options: per-format settings (`formats.FORMAT_OPTIONS`), e.g.
        {"keras_hub_approximate_gelu": True}.
      quantized: the fake-quantised copy of `model` (the quantize stage's student):
        int8 is converted from it with its learnt ranges, and int8_ptq is added.
    """

    model: BertModel
    output_dir: str
    max_seq_len: int
    dev_texts: Sequence[Text]
    formats: Sequence[str] = DEFAULT_FORMATS
    dev_labels: Optional[Sequence] = None
    representative_texts: Optional[Sequence[Text]] = None
    is_pair: bool = False
    task: Union[None, str, TaskType] = None
    task_name: Optional[str] = None
    latency_runs: int = 30
    num_threads: Optional[int] = None
    max_examples: Optional[int] = None
    serving_name: Optional[str] = None
    serving_version: Optional[int] = None
    options: Optional[Mapping[str, Any]] = None
    quantized: Optional[BertModel] = None


@dataclasses.dataclass(frozen=True)
class _Checked:
    """A request checked and resolved: what the parity run works from."""

    ctx: fmts.ExportContext
    formats: tuple[str, ...]
    metric_task: TaskType  # the task's label order (dev labels, metrics)
    order: Optional[list[int]]  # the model's label order -> the task's
    dev_labels: Optional[list]
    task_name: Optional[str]


def export_all(request: ExportRequest) -> dict[str, Any]:
    """Export `request.model` in `request.formats` (rows of `formats.FORMATS`) under
    `request.output_dir` and check parity on the dev set.

    Returns the parity dict also written to output_dir/parity.json. A format that
    cannot export this model (`ExportFormat.check`) is an ExportError before
    anything is written.
    """
    checked = _check(request)
    ctx = checked.ctx
    reference = keras_outputs(ctx.model, ctx.task, ctx.dev_inputs)
    if not np.all(np.isfinite(reference)):
        raise ExportError("the model's outputs on the dev set are not finite (NaN or "
                          "infinite): its weights are damaged or its training diverged; "
                          "nothing was exported. Export a model that trained to finite "
                          "weights.")
    output_dir = files.absolute(request.output_dir)
    files.makedirs(output_dir)
    parity_path = os.path.join(output_dir, PARITY_FILE)
    if files.exists(parity_path):  # the completion marker goes first, comes back last
        files.remove(parity_path)
    rows, outputs = _keras_rows(ctx, reference, request.latency_runs)
    for name in checked.formats:
        rows[name], outputs[name] = _format_row(ctx, name, reference, output_dir,
                                                request.latency_runs)
    metric_name = None
    if checked.dev_labels is not None:
        for name, outs in outputs.items():
            rows[name]["metric"] = task_metric(checked.metric_task,
                                               _reorder(outs, checked.order),
                                               checked.dev_labels)[1]
        metric_name, rows["keras"]["metric"] = task_metric(
            checked.metric_task, _reorder(reference, checked.order), checked.dev_labels)
    removed = remove_stale(output_dir, checked.formats)
    parity = {"task": checked.task_name, "task_type": ctx.task.kind,
              "labels": list(ctx.task.label_names), "max_seq_len": ctx.max_seq_len,
              "num_examples": len(ctx.dev_a), "is_pair": ctx.is_pair,
              "metric_name": metric_name, "output": ctx.task.output_name,
              "num_threads": ctx.num_threads, "formats": rows}
    write_json_atomic(parity_path, parity)
    print(format_table(parity), flush=True)
    if removed:
        print(f"removed the earlier export's {', '.join(removed)} from {output_dir}: formats "
              "not asked for this time (parity.json describes this export; published "
              "serving versions stay)", flush=True)
    return parity


def _check(request: ExportRequest) -> _Checked:
    """Every check of `request` before anything is written, and the resolved context."""
    model, quantized = request.model, request.quantized
    formats = fmts.check_formats(request.formats, "formats")
    check_quantized(model, quantized)
    formats = _with_post_training_int8(formats, quantized)
    unknown = sorted(set(request.options or {}) - set(fmts.FORMAT_OPTIONS))
    if unknown:
        raise ExportError(f"options: unknown export option(s) {', '.join(unknown)}; known: "
                          f"{sorted(fmts.FORMAT_OPTIONS)}.")
    options = {**fmts.FORMAT_OPTIONS, **(request.options or {})}
    problems = fmts.format_problems(formats, model.bert_config, model.head_type, options)
    if problems:
        raise ExportError(" ".join(problems))
    serving_version = request.serving_version
    if serving_version is not None:
        serving_version = check_version(serving_version, "serving_version")
    task, task_name = request.task, request.task_name
    if isinstance(task, str):
        task_name = task_name or task
        task = task_type(task)
    # The exports serve the model's label order; dev labels and metrics are the task's.
    metric_task = task or export_task(model)
    task = export_task(model, task)
    max_seq_len = check_seq_len(model, request.max_seq_len, "max_seq_len")
    dev_a, dev_b, dev_labels = _dev_set(request)
    tokenizer = load_tokenizer(model, max_seq_len)
    dev_inputs = task.export_inputs(tokenizer, dev_a, dev_b, max_seq_len)
    rep_inputs = None
    if any(fmts.FORMATS[f].calibrated for f in formats):
        rep_a, rep_b = split_texts(request.dev_texts if request.representative_texts is None
                                   else request.representative_texts, request.is_pair,
                                   "representative_texts")
        rep_inputs = (task.export_inputs(tokenizer, rep_a, rep_b, max_seq_len)
                      if rep_a else None)
    # A name given is used as given (or refused); the task's name is made into one.
    serving_name = (check_model_name(request.serving_name, "serving_name")
                    if request.serving_name else fmts.serving_model_name(task_name))
    ctx = fmts.ExportContext(model, task, max_seq_len, bool(request.is_pair), dev_a, dev_b,
                             dev_inputs, rep_inputs, request.num_threads,
                             serving_name,
                             serving_version, options, quantized)
    return _Checked(ctx, tuple(formats), metric_task, label_permutation(task, metric_task),
                    dev_labels, task_name)


def _with_post_training_int8(formats: Sequence[str],
                             quantized: Optional[BertModel]) -> Sequence[str]:
    """With a quantised student, int8_ptq follows the first learnt-range flavour."""
    if quantized is None or POST_TRAINING_INT8 in formats or not any(
            fmts.FORMATS[f].learnt_ranges for f in formats):
        return formats
    at = next(i for i, f in enumerate(formats) if fmts.FORMATS[f].learnt_ranges) + 1
    return (*formats[:at], POST_TRAINING_INT8, *formats[at:])


def _dev_set(request: ExportRequest) -> tuple[list[str], Optional[list[str]], Optional[list]]:
    """The dev texts (a, b) and labels, capped at max_examples; labels None when absent
    or partial (unlabelled dev data: no task metric)."""
    dev_texts, dev_labels = request.dev_texts, request.dev_labels
    if request.max_examples:
        dev_texts = list(dev_texts)[:request.max_examples]
        dev_labels = None if dev_labels is None else list(dev_labels)[:request.max_examples]
    dev_a, dev_b = split_texts(dev_texts, request.is_pair, "dev_texts")
    if not dev_a:
        raise ExportError("dev_texts is empty: parity needs dev examples (the task's dev split).")
    if dev_labels is not None and len(dev_labels) != len(dev_a):
        raise ExportError(f"dev_labels has {len(dev_labels)} entries for {len(dev_a)} dev texts.")
    if dev_labels is not None and any(v is None for v in dev_labels):
        dev_labels = None
    return dev_a, dev_b, None if dev_labels is None else list(dev_labels)


def _keras_rows(ctx: fmts.ExportContext, reference: np.ndarray, latency_runs: int
                ) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """The rows of the Keras model (and of the quantised student, if any), and the
    quantised student's dev outputs."""
    one = {k: tf.constant(v[:1]) for k, v in ctx.dev_inputs.items()}
    keras_fn = tf.function(lambda x: ctx.model(x, training=False)["logits"], autograph=False)
    rows: dict[str, dict[str, Any]] = {}
    rows["keras"] = {**compare(ctx.task, reference, reference, ctx),
                     "size_bytes": int(sum(v.numpy().nbytes for v in ctx.model.weights)),
                     "latency_ms_b1": median_ms(lambda: keras_fn(one).numpy(), latency_runs),
                     "path": None}
    outputs = {}
    quantized = ctx.quantized
    if quantized is not None:
        quantized_fn = tf.function(lambda x: quantized(x, training=False)["logits"],
                                   autograph=False)
        outputs["keras_quantized"] = keras_outputs(quantized, ctx.task, ctx.dev_inputs)
        rows["keras_quantized"] = {
            **compare(ctx.task, reference, outputs["keras_quantized"], ctx),
            "size_bytes": int(sum(v.numpy().nbytes for v in quantized.weights)),
            "latency_ms_b1": median_ms(lambda: quantized_fn(one).numpy(), latency_runs),
            "path": None, "ranges": "learnt"}
    return rows, outputs


def _format_row(ctx: fmts.ExportContext, name: str, reference: np.ndarray, output_dir: str,
                latency_runs: int) -> tuple[dict[str, Any], np.ndarray]:
    """Write format `name`'s artefact, load it back: its parity row and dev outputs."""
    fmt = fmts.FORMATS[name]
    path = fmt.write(ctx, os.path.join(output_dir, fmt.artefact))
    loaded = fmt.load(ctx, path)
    outs = loaded.predict()
    row = {**compare(ctx.task, reference, outs, ctx), "size_bytes": path_size(path),
           "latency_ms_b1": median_ms(loaded.one, latency_runs),
           "path": _relative(path, output_dir),
           **(fmt.describe(path) if fmt.describe else {})}
    if fmt.calibrated:
        row["ranges"] = ("learnt" if fmt.learnt_ranges and ctx.quantized is not None
                         else "calibrated")
    return row, outs


def check_quantized(model: BertModel, quantized: Optional[BertModel],
                    model_name: str = "the model to export",
                    quantized_name: str = "quantized=") -> None:
    """`model` is a float task model and `quantized` (if any) its fake-quantised copy
    (same head, labels and vocab); ExportError otherwise. `model_name` and
    `quantized_name` say how the caller's user gave them (bin/export: its flags)."""
    if is_quantized(model):
        raise ExportError(f"{model_name} is fake-quantised (a quantize stage output): pass "
                          f"the float task student as {model_name.split('=')[0]} and this one "
                          f"as {quantized_name.split('=')[0]}"
                          + (" (bin/export: --quantized_model_dir)."
                             if quantized_name == "quantized=" else "."))
    if quantized is None:
        return
    if not is_quantized(quantized):
        raise ExportError(f"{quantized_name} is a float model (no learnt int8 ranges), but "
                          "it must be the quantize stage's fake-quantised copy of the student "
                          "(OUTPUT/quantize/model); give that, or drop it to export the float "
                          "model alone (int8 is then calibrated after training).")
    mine = (model.head_type, model.num_labels, model.label_names, model.vocab,
            model.bert_config.to_dict())
    theirs = (quantized.head_type, quantized.num_labels, quantized.label_names,
              quantized.vocab, quantized.bert_config.to_dict())
    if mine != theirs:
        raise ExportError(f"{quantized_name} is not a quantised copy of {model_name} (head, "
                          "labels, vocab or config differ); give the quantize stage's student "
                          "of the same run (OUTPUT/quantize/model), made from this float "
                          "student.")


def _reorder(outputs: np.ndarray, order: Optional[list[int]]) -> np.ndarray:
    """Outputs [..., C] in the model's label order -> the task's order."""
    return outputs if order is None else np.asarray(outputs)[..., order]


def remove_stale(output_dir: str, formats: Sequence[str]) -> list[str]:
    """Artefacts of table formats not exported this time would be stale: remove them
    (not published ones: TF Serving may be serving their versions). Returns their
    names."""
    removed = []
    for name, fmt in fmts.FORMATS.items():
        stale = os.path.join(output_dir, fmt.artefact)
        if name in formats or fmt.published or not files.exists(stale):
            continue
        if files.isdir(stale):
            files.rmtree(stale)
        else:
            files.remove(stale)
        removed.append(fmt.artefact)
    return removed


def _relative(path: str, root: str) -> str:
    """`path` relative to `root` (local paths or URLs)."""
    if files.is_remote(root):
        return path[len(root.rstrip("/")) + 1:] if path.startswith(root) else path
    return os.path.relpath(path, root)


def task_metric(task: TaskType, outputs: np.ndarray, labels: Sequence) -> tuple[str, float]:
    """(name, value) of the task's primary metric for export outputs against gold labels."""
    metrics = task.score_labels(outputs, labels)
    name = task.primary_metric if task.primary_metric in metrics else next(iter(metrics))
    return name, float(metrics[name])


def compare(task: TaskType, reference: np.ndarray, outputs: np.ndarray,
            ctx: Optional[fmts.ExportContext] = None) -> dict[str, Any]:
    """max |Δ| and the task's agreement (None where it has no labels) vs Keras."""
    diff = (float(np.max(np.abs(outputs.astype(np.float64) - reference)))
            if len(reference) else 0.0)
    return {"max_abs_diff": diff, "label_agreement": task.agreement(reference, outputs, ctx)}


def format_table(parity: dict[str, Any]) -> str:
    """A fixed-width text table of a parity dict."""
    metric = parity.get("metric_name") or "metric"
    head = (f"{'format':<16}{'max|Δ|':>11}{'agree':>8}{metric[:10]:>11}"
            f"{'size MB':>10}{'ms @b1':>9}")
    lines = [f"export parity on {parity['num_examples']} dev examples, "
             f"seq {parity['max_seq_len']} (Δ of {parity['output']} vs Keras)", head,
             "-" * len(head)]
    for name, r in parity["formats"].items():
        agree = "-" if r.get("label_agreement") is None else f"{r['label_agreement']:.1%}"
        m = "-" if r.get("metric") is None else f"{r['metric']:.4f}"
        lines.append(f"{name:<16}{r['max_abs_diff']:>11.2e}{agree:>8}{m:>11}"
                     f"{r['size_bytes'] / 1e6:>10.2f}{r['latency_ms_b1']:>9.2f}")
    return "\n".join(lines)
