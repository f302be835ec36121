"""Export everything, then check each artefact gives the Keras model's answers.

`export_all` writes, under one export directory, the artefact of every format
asked for (the table in formats.py: serving/<N>/ + serving/models.config,
model_<flavour>.tflite, hf/, keras_hub/), then `parity.json`, written last: its
presence marks a complete export. It returns (and prints as a table) the
parity dict: per format, on the dev set, max |probability - Keras probability|
(score for regression), label agreement with Keras, the task metric, the
artefact's size, latency at batch 1, and what the format describes of its
artefact (the SavedModel's served version, a TFLite file's metadata).

With a quantised student (`quantized=`, the quantize stage's), the int8 flavour
is converted from it with its learnt ranges, `int8_ptq` (the float model's
post-training int8) is exported beside it, and a `keras_quantized` row gives
the quantised student's own Keras answers; every row is compared with the
float model's.
"""
from __future__ import annotations

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
from tinybert_tf.export.serving import check_version
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


def export_all(model: BertModel, output_dir: str, *, max_seq_len: int,
               formats: Sequence[str] = DEFAULT_FORMATS,
               dev_texts: Sequence[Text],
               dev_labels: Optional[Sequence] = None,
               representative_texts: Optional[Sequence[Text]] = None,
               is_pair: bool = False, task: Union[None, str, TaskType] = None,
               task_name: Optional[str] = None, latency_runs: int = 30,
               num_threads: Optional[int] = None,
               max_examples: Optional[int] = None,
               serving_name: Optional[str] = None,
               serving_version: Optional[int] = None,
               options: Optional[Mapping[str, Any]] = None,
               quantized: Optional[BertModel] = None) -> dict[str, Any]:
    """Export `model` in `formats` (rows of `formats.FORMATS`) under `output_dir`
    (the export folder, e.g. OUTPUT/export) and check parity on the dev set.

    Args:
      model: a task `BertModel` (a task head, with vocab).
      max_seq_len: the task's sequence length (fixed in TFLite).
      formats: names in the format table (saved_model, float32, ..., hf, keras_hub).
      dev_texts: ["text", ...] or [("text a", "text b"), ...] for pair tasks.
      dev_labels: gold labels for the task metric (optional).
      representative_texts: calibration text for int8 (default: dev_texts).
      task: the task type (or a GLUE-table task name) whose outputs and metric to
        use; default: the model's head and label names.
      task_name: the task's name for parity.json (default: `task` when it is a name).
      latency_runs: timed batch-1 calls per format.
      num_threads: TFLite interpreter threads (None = all cores).
      max_examples: cap on dev examples checked (None = all).
      serving_name: the model name in serving/models.config (default: the task
        name, else "tinybert").
      serving_version: publish the SavedModel as this version (default: the next
        free one); an existing version is an ExportError, never rewritten.
      options: per-format settings (`formats.FORMAT_OPTIONS`), e.g.
        {"keras_hub_approximate_gelu": True}.
      quantized: the fake-quantised copy of `model` (the quantize stage's student):
        int8 is converted from it with its learnt ranges, and int8_ptq is added.
    Returns the parity dict also written to output_dir/parity.json. A format that
    cannot export this model (`ExportFormat.check`) is an ExportError before
    anything is written.
    """
    formats = fmts.check_formats(formats, "formats")
    check_quantized(model, quantized)
    if quantized is not None and POST_TRAINING_INT8 not in formats and any(
            fmts.FORMATS[f].learnt_ranges for f in formats):
        at = next(i for i, f in enumerate(formats) if fmts.FORMATS[f].learnt_ranges) + 1
        formats = (*formats[:at], POST_TRAINING_INT8, *formats[at:])
    unknown = sorted(set(options or {}) - set(fmts.FORMAT_OPTIONS))
    if unknown:
        raise ExportError(f"options: unknown export option(s) {unknown}; known: "
                          f"{sorted(fmts.FORMAT_OPTIONS)}.")
    options = {**fmts.FORMAT_OPTIONS, **(options or {})}
    problems = fmts.format_problems(formats, model.bert_config, model.head_type, options)
    if problems:
        raise ExportError(" ".join(problems))
    if serving_version is not None:
        serving_version = check_version(serving_version, "serving_version")
    if isinstance(task, str):
        task_name = task_name or task
        task = task_type(task)
    # The exports serve the model's label order; dev labels and metrics are the task's.
    metric_task = task or export_task(model)
    task = export_task(model, task)
    order = label_permutation(task, metric_task)
    max_seq_len = check_seq_len(model, max_seq_len, "max_seq_len")
    if max_examples:
        dev_texts = list(dev_texts)[:max_examples]
        dev_labels = None if dev_labels is None else list(dev_labels)[:max_examples]
    dev_a, dev_b = split_texts(dev_texts, is_pair, "dev_texts")
    if not dev_a:
        raise ExportError("dev_texts is empty: parity needs dev examples (the task's dev split).")
    if dev_labels is not None and len(dev_labels) != len(dev_a):
        raise ExportError(f"dev_labels has {len(dev_labels)} entries for {len(dev_a)} dev texts.")
    if dev_labels is not None and any(v is None for v in dev_labels):
        dev_labels = None  # unlabelled dev data: no task metric
    tokenizer = load_tokenizer(model, max_seq_len)
    dev_inputs = task.export_inputs(tokenizer, dev_a, dev_b, max_seq_len)
    rep_inputs = None
    if any(fmts.FORMATS[f].calibrated for f in formats):
        rep_a, rep_b = split_texts(dev_texts if representative_texts is None
                                   else representative_texts, is_pair, "representative_texts")
        rep_inputs = (task.export_inputs(tokenizer, rep_a, rep_b, max_seq_len)
                      if rep_a else None)
    ctx = fmts.ExportContext(model, task, max_seq_len, bool(is_pair), dev_a, dev_b, dev_inputs,
                             rep_inputs, num_threads,
                             fmts.serving_model_name(serving_name or task_name),
                             serving_version, options, quantized)

    reference = keras_outputs(model, task, dev_inputs)
    if not np.all(np.isfinite(reference)):
        raise ExportError("the model's outputs on the dev set are not finite (NaN or "
                          "infinite): its weights are damaged or its training diverged; "
                          "nothing was exported. Export a model that trained to finite "
                          "weights.")
    output_dir = files.absolute(output_dir)
    files.makedirs(output_dir)
    parity_path = os.path.join(output_dir, PARITY_FILE)
    if files.exists(parity_path):  # the completion marker goes first, comes back last
        files.remove(parity_path)

    one = {k: tf.constant(v[:1]) for k, v in dev_inputs.items()}
    keras_fn = tf.function(lambda x: model(x, training=False)["logits"], autograph=False)
    rows: dict[str, dict[str, Any]] = {}
    rows["keras"] = {**compare(task, reference, reference, ctx),
                     "size_bytes": int(sum(v.numpy().nbytes for v in model.weights)),
                     "latency_ms_b1": median_ms(lambda: keras_fn(one).numpy(), latency_runs),
                     "path": None}
    outputs = {}
    if quantized is not None:
        quantized_fn = tf.function(lambda x: quantized(x, training=False)["logits"],
                                   autograph=False)
        outputs["keras_quantized"] = keras_outputs(quantized, task, dev_inputs)
        rows["keras_quantized"] = {
            **compare(task, reference, outputs["keras_quantized"], ctx),
            "size_bytes": int(sum(v.numpy().nbytes for v in quantized.weights)),
            "latency_ms_b1": median_ms(lambda: quantized_fn(one).numpy(), latency_runs),
            "path": None, "ranges": "learnt"}
    for name in formats:
        fmt = fmts.FORMATS[name]
        path = fmt.write(ctx, os.path.join(output_dir, fmt.artefact))
        loaded = fmt.load(ctx, path)
        outs = outputs[name] = loaded.predict()
        rows[name] = {**compare(task, reference, outs, ctx), "size_bytes": path_size(path),
                      "latency_ms_b1": median_ms(loaded.one, latency_runs),
                      "path": _relative(path, output_dir),
                      **(fmt.describe(path) if fmt.describe else {})}
        if fmt.calibrated:
            rows[name]["ranges"] = ("learnt" if fmt.learnt_ranges and quantized is not None
                                    else "calibrated")
    if dev_labels is not None:
        for name, outs in outputs.items():
            rows[name]["metric"] = task_metric(metric_task, _reorder(outs, order),
                                               dev_labels)[1]

    metric_name = None
    if dev_labels is not None:
        metric_name, rows["keras"]["metric"] = task_metric(
            metric_task, _reorder(reference, order), dev_labels)
    remove_stale(output_dir, formats)
    parity = {"task": task_name, "task_type": task.kind, "labels": list(task.label_names),
              "max_seq_len": max_seq_len,
              "num_examples": len(dev_a), "is_pair": bool(is_pair),
              "metric_name": metric_name, "output": task.output_name,
              "num_threads": num_threads, "formats": rows}
    write_json_atomic(parity_path, parity)
    print(format_table(parity), flush=True)
    return parity


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


def remove_stale(output_dir: str, formats: Sequence[str]) -> None:
    """Artefacts of table formats not exported this time would be stale: remove them
    (not published ones: TF Serving may be serving their versions)."""
    for name, fmt in fmts.FORMATS.items():
        stale = os.path.join(output_dir, fmt.artefact)
        if name in formats or fmt.published or not files.exists(stale):
            continue
        if files.isdir(stale):
            files.rmtree(stale)
        else:
            files.remove(stale)


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
