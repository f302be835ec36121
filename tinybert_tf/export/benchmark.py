"""The paper's Table 1 efficiency columns on this machine.

For a teacher and a student config with random weights at one sequence
length: parameters, FLOPs, and latency / throughput at each batch size for
Keras (a tf.function-compiled call with fixed shapes), the SavedModel's
`serve_ids` signature and each TFLite flavour; then the teacher/student
ratios next to the paper's (7.5x smaller, 9.4x faster, measured on GPU).

Each runtime's label agreement with Keras on the timed inputs is recorded too
(`agreement`): with random weights and random ids it checks the numerics of a
flavour (int8 above all), not task accuracy, which `parity.json` reports on
the dev set of a trained model. The weights are seeded (the same on every run
and host), and `label_margin`, the smallest gap between Keras's two logits on
those inputs, says how far the closest input is from a tie: a runtime whose
logits move by less than half of it must agree on every input.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import time
from typing import Any, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.config import BertConfig
from tinybert_tf.export.common import ExportError
from tinybert_tf.export.formats import FORMATS
from tinybert_tf.files import write_bytes_atomic
from tinybert_tf.models.encoder import INPUT_NAMES, BertModel, count_params, flops_per_example
from tinybert_tf.timing import median_ms
from tinybert_tf.tokenizer import SPECIAL_TOKENS

PAPER = {"smaller": 7.5, "faster": 9.4}


def synthetic_vocab(size: int) -> list[str]:
    """A vocab of `size` tokens with BERT's specials (only the ids matter here)."""
    return list(SPECIAL_TOKENS) + [f"w{i}" for i in range(size - len(SPECIAL_TOKENS))]


def random_inputs(config: BertConfig, batch: int, seq_len: int, seed: int = 0
                  ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_word_ids": rng.integers(len(SPECIAL_TOKENS), config.vocab_size,
                                           (batch, seq_len)).astype(np.int32),
            "input_mask": np.ones((batch, seq_len), np.int32),
            "input_type_ids": np.zeros((batch, seq_len), np.int32)}


def benchmark_model(name: str, config: BertConfig, seq_len: int, batch_sizes: Sequence[int],
                    runtimes: Sequence[str], runs: int, budget_s: float,
                    num_threads: Optional[int], work_dir: str) -> dict[str, Any]:
    """Params, FLOPs and {runtime: {batch: latency ms, throughput ex/s}} of one config.

    Runtimes: "keras" (a tf.function-compiled call with fixed shapes) and every
    format of the export table that can be timed (`ExportFormat.timer`).
    """
    unknown = [r for r in runtimes if r not in runtime_names()]
    if unknown:
        raise ExportError(f"--benchmark_formats: unknown runtime(s) {', '.join(unknown)}; "
                          f"use any of {', '.join(runtime_names())}.")
    keras.utils.set_random_seed(0)  # the same random weights on every run and host
    model = BertModel(config, head="classifier", num_labels=2,
                      vocab=synthetic_vocab(config.vocab_size), name="bert")
    inputs = {b: random_inputs(config, b, seq_len, seed=b) for b in batch_sizes}
    logits = {b: _keras_timer(model, seq_len, b)(inputs[b]).numpy() for b in batch_sizes}
    reference = {b: predicted_labels(z) for b, z in logits.items()}
    top2 = np.sort(np.concatenate(list(logits.values())), axis=-1)[:, -2:]
    result: dict[str, Any] = {"name": name, "params": count_params(model),
                              "flops": flops_per_example(config, seq_len, num_labels=2),
                              "config": config.to_dict(), "runtimes": {},
                              "label_margin": float(np.min(top2[:, 1] - top2[:, 0]))}
    for runtime in runtimes:
        t0 = time.perf_counter()
        per_batch: dict[int, float] = {}
        same = total = 0
        for b in batch_sizes:
            fn = (_keras_timer(model, seq_len, b) if runtime == "keras"
                  else FORMATS[runtime].timer(model, work_dir, seq_len, b))
            per_batch[b] = median_ms(lambda: _block(fn(inputs[b])), runs, warmup=1,
                                     budget_s=budget_s)
            same += int(np.sum(predicted_labels(fn(inputs[b])) == reference[b]))
            total += b
        result["runtimes"][runtime] = {
            "latency_ms": {str(b): ms for b, ms in per_batch.items()},
            "throughput": {str(b): b * 1e3 / ms for b, ms in per_batch.items()},
            "agreement": same / total,
            "seconds": time.perf_counter() - t0}
        print(f"  {name:<18} {runtime:<13} " + "  ".join(
            f"b{b}: {ms:8.2f} ms" for b, ms in per_batch.items())
            + f"  agree {same / total:.1%}", flush=True)
    return result


def predicted_labels(out: Any) -> np.ndarray:
    """Arg-max class per row of a runtime's output (logits, probabilities, or a
    signature's dict of them)."""
    if isinstance(out, dict):
        out = next((out[k] for k in ("probabilities", "logits") if k in out),
                   next(iter(out.values())))
    return np.asarray(out.numpy() if hasattr(out, "numpy") else out).argmax(-1)


def runtime_names() -> tuple[str, ...]:
    """What bin/benchmark can time: Keras, then every timed format of the table."""
    return ("keras",) + tuple(n for n, f in FORMATS.items() if f.timer is not None)


def _keras_timer(model, seq_len: int, batch: int):
    spec = {k: tf.TensorSpec([batch, seq_len], tf.int32) for k in INPUT_NAMES}
    fn = tf.function(lambda x: model(x, training=False)["logits"], input_signature=[spec],
                     autograph=False)
    return lambda x: fn({k: tf.constant(v) for k, v in x.items()})


def _block(out: Any) -> Any:
    """Wait for a result: TF tensors (and dicts of them) compute asynchronously."""
    for v in (out.values() if isinstance(out, dict) else [out]):
        if hasattr(v, "numpy"):
            v.numpy()
    return out


def ratios(teacher: dict[str, Any], student: dict[str, Any]) -> dict[str, Any]:
    """teacher/student: params, FLOPs and latency per runtime and batch size."""
    out = {"params": teacher["params"] / student["params"],
           "flops": teacher["flops"] / student["flops"], "latency": {}}
    for rt, t in teacher["runtimes"].items():
        s = student["runtimes"].get(rt)
        if s:
            out["latency"][rt] = {b: t["latency_ms"][b] / s["latency_ms"][b]
                                  for b in t["latency_ms"] if b in s["latency_ms"]}
    return out


def format_report(report: dict[str, Any]) -> str:
    teacher, student = report["models"]
    r = report["ratios"]
    batches = list(next(iter(teacher["runtimes"].values()))["latency_ms"])
    lines = [f"seq {report['seq_len']}, {report['threads']} threads, random weights", ""]
    w = max(18, len(teacher["name"]) + 2, len(student["name"]) + 2)  # names whole
    head = f"{'model':<{w}}{'runtime':<14}" + "".join(
        f"{'ms b' + b:>11}{'ex/s b' + b:>11}" for b in batches) + f"{'agree':>8}"
    lines += [head, "-" * len(head)]
    for m in (teacher, student):
        for rt, v in m["runtimes"].items():
            lines.append(f"{m['name']:<{w}}{rt:<14}" + "".join(
                f"{v['latency_ms'][b]:>11.2f}{v['throughput'][b]:>11.1f}" for b in batches)
                + f"{v.get('agreement', float('nan')):>8.1%}")
    lines += ["(agree: labels as Keras's on the timed random inputs; random weights, so a "
              "numerics check, not task accuracy)"]
    lines += ["", f"{'':<{w}}{'params':>14}{'FLOPs/example':>16}"]
    for m in (teacher, student):
        lines.append(f"{m['name']:<{w}}{m['params'] / 1e6:>13.1f}M{m['flops'] / 1e9:>15.2f}G")
    lines += ["", f"teacher/student: {r['params']:.1f}x fewer parameters (paper: "
              f"{PAPER['smaller']}x smaller), {r['flops']:.1f}x fewer FLOPs"]
    for rt, by_b in r["latency"].items():
        lines.append(f"  {rt:<13} speed-up " + ", ".join(
            f"b{b}: {x:.1f}x" for b, x in by_b.items()) + f"   (paper: {PAPER['faster']}x)")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> None:
    """Bar chart: batch-1 and batch-B latency per runtime, teacher vs student (log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    teacher, student = report["models"]
    runtimes = [rt for rt in teacher["runtimes"] if rt in student["runtimes"]]
    batches = list(teacher["runtimes"][runtimes[0]]["latency_ms"])
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4), squeeze=False)
    x = np.arange(len(runtimes))
    for ax, b in zip(axes[0], batches):
        for i, m in enumerate((teacher, student)):
            ax.bar(x + (i - 0.5) * 0.4, [m["runtimes"][rt]["latency_ms"][b] for rt in runtimes],
                   0.4, label=m["name"])
        ax.set_xticks(x, runtimes, rotation=30)
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms, log)")
        ax.set_title(f"batch {b}, seq {report['seq_len']}")
        ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    plt.close(fig)
    write_bytes_atomic(path, png.getvalue())


def run_benchmark(configs: Sequence[tuple[str, BertConfig]], seq_len: int,
                  batch_sizes: Sequence[int], runtimes: Sequence[str], runs: int,
                  output_dir: str, num_threads: Optional[int] = None,
                  budget_s: float = 20.0) -> dict[str, Any]:
    """Benchmark (teacher, student); write benchmark.json and benchmark.png."""
    if len(configs) != 2:
        raise ExportError(f"--benchmark_models: give two configs (teacher, student), got "
                          f"{len(configs)}.")
    for name, c in configs:
        if seq_len > c.max_position_embeddings:
            raise ExportError(f"--benchmark_seq_len={seq_len} exceeds {name}'s "
                              f"max_position_embeddings={c.max_position_embeddings}.")
    files.makedirs(output_dir)
    models = []
    with tempfile.TemporaryDirectory(prefix="tinybert-bench-") as work:
        for name, config in configs:
            models.append(benchmark_model(name, config, seq_len, batch_sizes, runtimes, runs,
                                          budget_s, num_threads, work))
    report = {"seq_len": seq_len, "batch_sizes": list(batch_sizes),
              "threads": num_threads or os.cpu_count(), "cpu_count": os.cpu_count(),
              "tensorflow": tf.__version__, "models": models,
              "ratios": ratios(models[0], models[1]), "paper": PAPER}
    write_bytes_atomic(os.path.join(output_dir, "benchmark.json"),
                       (json.dumps(report, indent=2) + "\n").encode())
    plot(report, os.path.join(output_dir, "benchmark.png"))
    print(format_report(report), flush=True)
    return report
