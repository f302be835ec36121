"""Export everything, then check each artefact gives the Keras model's answers.

`export_all` writes, under one export directory:
  saved_model/              TF Serving SavedModel (raw text in; see saved_model.py)
  model_float32.tflite      TFLite flavours (see tflite.py)
  model_float16.tflite
  model_dynamic_int8.tflite
  model_int8.tflite
  parity.json               written last: its presence marks a complete export
and returns (and prints as a table) the parity dict: per format, on the dev set,
max |probability - Keras probability| (score for regression), label agreement
with Keras, the task metric, the artefact's size, and latency at batch 1.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf.export import tflite as tfl
from tinybert_tf.export.common import (FORMATS, TFLITE_FORMATS, ExportError, Text, check_formats,
                                       check_seq_len, check_task_model, make_tokenizer,
                                       path_size, split_texts, tokenize)
from tinybert_tf.export.saved_model import TEXT_SIGNATURE, export_saved_model
from tinybert_tf.files import write_bytes_atomic
from tinybert_tf.models.encoder import INPUT_NAMES, BertModel

PARITY_FILE = "parity.json"
SAVED_MODEL_DIR = "saved_model"


def tflite_file(fmt: str) -> str:
    return f"model_{fmt}.tflite"


def keras_outputs(model: BertModel, inputs: dict[str, np.ndarray], batch_size: int = 64
                  ) -> np.ndarray:
    """Probabilities [N, C] (regressor: scores [N, 1]) of the Keras model."""
    regression = model.head_type == "regressor"

    @tf.function(reduce_retracing=True)
    def run(batch):
        logits = tf.cast(model(batch, training=False)["logits"], tf.float32)
        return logits if regression else tf.nn.softmax(logits, axis=-1)

    n = len(inputs[INPUT_NAMES[0]])
    outs = [run({k: tf.constant(v[s:s + batch_size]) for k, v in inputs.items()}).numpy()
            for s in range(0, n, batch_size)]
    return np.concatenate(outs, 0) if outs else np.zeros((0, 1), np.float32)


def saved_model_outputs(directory_or_loaded: Any, texts_a: Sequence[str],
                        texts_b: Optional[Sequence[str]], batch_size: int = 64) -> np.ndarray:
    """Run the raw-text signature: probabilities [N, C] or scores [N, 1]."""
    loaded = (tf.saved_model.load(directory_or_loaded)
              if isinstance(directory_or_loaded, str) else directory_or_loaded)
    fn = loaded.signatures[TEXT_SIGNATURE]
    outs = []
    for s in range(0, len(texts_a), batch_size):
        kwargs = {"text": tf.constant(list(texts_a[s:s + batch_size]))}
        if texts_b is not None:
            kwargs["text_b"] = tf.constant(list(texts_b[s:s + batch_size]))
        out = fn(**kwargs)
        outs.append(out["probabilities"].numpy() if "probabilities" in out
                    else out["score"].numpy()[:, None])
    return np.concatenate(outs, 0)


def median_ms(fn: Callable[[], Any], runs: int, warmup: int = 3) -> float:
    """Median wall time of `fn()` in milliseconds over `runs` calls after `warmup`."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, runs)):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def task_metric(predictions: np.ndarray, labels: Sequence, is_regression: bool,
                task: Optional[str] = None) -> tuple[str, float]:
    """(name, value) of the task's primary metric, or accuracy (Pearson r for
    regression) when no task is given or the task module is unavailable."""
    labels = np.asarray(labels)
    preds = predictions[:, 0] if is_regression else predictions.argmax(-1)
    if task:
        try:
            from tinybert_tf.data import glue
            spec = glue.get_task(task)
            metrics = glue.compute_metrics(spec, preds, labels)
            name = spec.primary_metric if spec.primary_metric in metrics else next(iter(metrics))
            return name, float(metrics[name])
        except ImportError:
            pass
    if is_regression:
        return "pearson", float(np.corrcoef(preds.astype(np.float64),
                                            labels.astype(np.float64))[0, 1])
    return "accuracy", float(np.mean(preds == labels.astype(np.int64)))


def compare(reference: np.ndarray, outputs: np.ndarray, is_regression: bool) -> dict[str, Any]:
    """max |Δ| and label agreement (None for regression) of `outputs` vs `reference`."""
    diff = float(np.max(np.abs(outputs.astype(np.float64) - reference))) if len(reference) else 0.0
    agree = None if is_regression else float(np.mean(outputs.argmax(-1) == reference.argmax(-1)))
    return {"max_abs_diff": diff, "label_agreement": agree}


def export_all(model: BertModel, output_dir: str, *, max_seq_len: int,
               formats: Sequence[str] = FORMATS,
               dev_texts: Sequence[Text],
               dev_labels: Optional[Sequence] = None,
               representative_texts: Optional[Sequence[Text]] = None,
               is_pair: bool = False, is_regression: Optional[bool] = None,
               task: Optional[str] = None, latency_runs: int = 30,
               num_threads: Optional[int] = None,
               max_examples: Optional[int] = None) -> dict[str, Any]:
    """Export `model` in `formats` under `output_dir` (the export folder, e.g.
    OUTPUT/export) and check parity on the dev set.

    Args:
      model: a task `BertModel` (classifier or regressor head, with vocab).
      max_seq_len: the task's sequence length (fixed in TFLite).
      formats: any of saved_model, float32, float16, dynamic_int8, int8.
      dev_texts: ["text", ...] or [("text a", "text b"), ...] for pair tasks.
      dev_labels: gold labels for the task metric (optional).
      representative_texts: calibration text for int8 (default: dev_texts).
      task: task name for its metric (via tinybert_tf.data.glue); else accuracy.
      latency_runs: timed batch-1 calls per format.
      num_threads: TFLite interpreter threads (None = its default).
      max_examples: cap on dev examples checked (None = all).
    Returns the parity dict also written to output_dir/parity.json.
    """
    formats = check_formats(formats, "formats")
    regression = check_task_model(model, is_regression)
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
    tokenizer = make_tokenizer(model, max_seq_len)
    dev_inputs = tokenize(tokenizer, dev_a, dev_b, max_seq_len)
    rep_inputs = None
    if "int8" in formats:
        rep_a, rep_b = split_texts(dev_texts if representative_texts is None
                                   else representative_texts, is_pair, "representative_texts")
        rep_inputs = tokenize(tokenizer, rep_a, rep_b, max_seq_len) if rep_a else None

    output_dir = os.path.abspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    parity_path = os.path.join(output_dir, PARITY_FILE)
    if os.path.exists(parity_path):  # the completion marker goes first, comes back last
        os.remove(parity_path)

    reference = keras_outputs(model, dev_inputs)
    one = {k: v[:1] for k, v in dev_inputs.items()}
    keras_fn = tf.function(lambda x: model(x, training=False)["logits"])
    one_t = {k: tf.constant(v) for k, v in one.items()}
    rows: dict[str, dict[str, Any]] = {}
    rows["keras"] = {**compare(reference, reference, regression),
                     "size_bytes": int(sum(v.numpy().nbytes for v in model.weights)),
                     "latency_ms_b1": median_ms(lambda: keras_fn(one_t), latency_runs),
                     "path": None}

    for fmt in formats:
        if fmt == "saved_model":
            path = export_saved_model(model, os.path.join(output_dir, SAVED_MODEL_DIR),
                                      max_seq_len, is_pair)
            loaded = tf.saved_model.load(path)
            outs = saved_model_outputs(loaded, dev_a, dev_b)
            fn = loaded.signatures[TEXT_SIGNATURE]
            kw = {"text": tf.constant(dev_a[:1])}
            if dev_b is not None:
                kw["text_b"] = tf.constant(dev_b[:1])
            latency = median_ms(lambda: fn(**kw), latency_runs)
        else:
            flat = tfl.convert(model, fmt, max_seq_len,
                               [rep_inputs] if rep_inputs is not None else None)
            path = tfl.write_tflite(flat, os.path.join(output_dir, tflite_file(fmt)))
            runner = tfl.TFLiteRunner(path, num_threads=num_threads)
            outs = runner.predict(dev_inputs)
            latency = median_ms(lambda: runner(one), latency_runs)
        rows[fmt] = {**compare(reference, outs, regression), "size_bytes": path_size(path),
                     "latency_ms_b1": latency, "path": os.path.relpath(path, output_dir)}
        if dev_labels is not None:
            rows[fmt]["metric"] = task_metric(outs, dev_labels, regression, task)[1]

    metric_name = None
    if dev_labels is not None:
        metric_name, rows["keras"]["metric"] = task_metric(reference, dev_labels, regression, task)
    # Artefacts of formats not exported this time would be stale: remove them.
    for fmt in TFLITE_FORMATS:
        stale = os.path.join(output_dir, tflite_file(fmt))
        if fmt not in formats and os.path.exists(stale):
            os.remove(stale)
    stale_sm = os.path.join(output_dir, SAVED_MODEL_DIR)
    if "saved_model" not in formats and os.path.isdir(stale_sm):
        shutil.rmtree(stale_sm)
    parity = {"task": task, "max_seq_len": max_seq_len, "num_examples": len(dev_a),
              "is_pair": bool(is_pair), "is_regression": regression,
              "metric_name": metric_name, "output": "score" if regression else "probabilities",
              "num_threads": num_threads, "formats": rows}
    write_bytes_atomic(parity_path, (json.dumps(parity, indent=2) + "\n").encode())
    print(format_table(parity), flush=True)
    return parity


def format_table(parity: dict[str, Any]) -> str:
    """A fixed-width text table of a parity dict."""
    metric = parity.get("metric_name") or "metric"
    head = (f"{'format':<14}{'max|Δ|':>11}{'agree':>8}{metric[:10]:>11}"
            f"{'size MB':>10}{'ms @b1':>9}")
    lines = [f"export parity on {parity['num_examples']} dev examples, "
             f"seq {parity['max_seq_len']} (Δ of {parity['output']} vs Keras)", head,
             "-" * len(head)]
    for name, r in parity["formats"].items():
        agree = "-" if r.get("label_agreement") is None else f"{r['label_agreement']:.1%}"
        m = "-" if r.get("metric") is None else f"{r['metric']:.4f}"
        lines.append(f"{name:<14}{r['max_abs_diff']:>11.2e}{agree:>8}{m:>11}"
                     f"{r['size_bytes'] / 1e6:>10.2f}{r['latency_ms_b1']:>9.2f}")
    return "\n".join(lines)
