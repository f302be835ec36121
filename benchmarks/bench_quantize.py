"""The quantize stage's int8 student against post-training int8: agreement, metric, latency.

Runs `bin/distill` with the flags after `--` (every stage, the quantize stage
included: --export_formats must hold int8) into OUTPUT/run, then measures, for
each ids TFLite flavour the export wrote (float32, int8 = the quantised
student with its learnt ranges, int8_ptq = the float student calibrated after
training, ...):

  - label agreement with the float Keras student and the task metric on the dev
    set (from parity.json), and agreement on --heldout sentences of the
    Wikipedia sample shipped in gensim (pairs of consecutive sentences for a
    pair task): text no stage trained or calibrated on;
  - batch-1 latency, median of --latency_runs calls, the flavours interleaved
    call by call so machine load hits them alike, at 1 and at all threads;
  - for a single-text classifier, the real TFLite Task Library (BertNLClassifier,
    tests/tasklib.py's isolated venv) on the int8 files: its labels against the
    interpreter's and the float student's;
  - with --seeds, the quantize stage again per extra seed (its own folder, the
    same task student and data), for the spread of the int8 agreement;
  - with --variant NAME="FLAGS" (repeatable), the quantize stage again with those
    flags added (e.g. "--quantize_steps=900" or
    "--quantize_loss_terms=pred,attn,hidn"), in its own folder, from the same float
    student: which setting moves the int8 agreement, on one float student.

Writes OUTPUT/bench_quantize.json and prints the tables.

Usage (the demo; about 20 minutes on 2 idle cores, 3 seeds):
  python benchmarks/bench_quantize.py --output_dir=runs/bench_quantize --seeds=1,2 \\
      -- --flagfile=configs/demo.cfg
The 4-layer 312-wide preset on the polarity sentences (about 30 minutes):
  python benchmarks/bench_quantize.py --output_dir=runs/bench_quantize_4l --seeds=1,2 \\
      -- --flagfile=configs/demo.cfg --student_config=tinybert_4l_312d --noinit_from_teacher
The preset on a task built from real text (benchmarks/wiki_kinds.py; about 66 minutes):
  python benchmarks/wiki_kinds.py runs/wiki_kinds
  python benchmarks/bench_quantize.py --output_dir=runs/bench_quantize_kinds --seeds=1,2 \\
      -- --flagfile=configs/demo.cfg --task=text_classification \\
      --train_file=runs/wiki_kinds/train.csv --validation_file=runs/wiki_kinds/dev.csv \\
      --student_config=tinybert_4l_312d --noinit_from_teacher --max_seq_len=64 \\
      --num_aug=1 --teacher_epochs=1 --teacher_batch_size=32
Another task: add its flags after `--` (e.g. --task=wiki_pairs, or --task=sst-2
--data_dir=...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, NamedTuple, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.data.corpus import iter_documents  # noqa: E402
from tinybert_tf.export import TFLiteRunner, convert_tflite  # noqa: E402
from tinybert_tf.export.common import keras_outputs  # noqa: E402
from tinybert_tf.export.tflite import FLAVOURS  # noqa: E402
from tinybert_tf.files import read_json, write_json_atomic  # noqa: E402
from tinybert_tf.models.checkpoint import load_model, load_tokenizer  # noqa: E402
from tinybert_tf.pipeline.main import parse_argv, run_argv  # noqa: E402
from tinybert_tf.pipeline.run.context import Context  # noqa: E402
from tinybert_tf.pipeline.run.state import RunState  # noqa: E402
from tinybert_tf.pipeline.stages import stage_names  # noqa: E402
from tinybert_tf.pipeline.stages.quantize import quantize  # noqa: E402
from tinybert_tf.tasks.catalog import resolve_task  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import tasklib  # noqa: E402  (the Task Library's isolated venv; tests/tasklib.py)


def heldout_texts(n: int, pair: bool) -> list:
    """`n` sentences (pairs of consecutive ones) of the Wikipedia sample in gensim."""
    out: list = []
    for doc in iter_documents(None):
        sentences = [s for s in doc if len(s.split()) >= 4]
        if pair:
            out += list(zip(sentences[:-1:2], sentences[1::2]))
        else:
            out += sentences
        if len(out) >= n:
            break
    return out[:n]


def agreement(task, reference: np.ndarray, outputs: np.ndarray) -> Optional[float]:
    return task.agreement(reference, outputs, None)


# Gaps between the float student's two highest class probabilities, in int8 output steps
# (an int8 softmax output moves in steps of 1/256).
GAP_STEPS = (2, 4, 8, 16)


def near_tie_bands(reference: np.ndarray, outputs: np.ndarray) -> dict[str, dict[str, Any]]:
    """For classifier probabilities [N, C]: per band "<k" (float top-1 minus top-2 under
    k/256), its share of the rows and the label disagreements inside it, beside all
    disagreements. Says whether an int8 flavour's misses are near-ties of the float
    student, which one int8 output step can already turn."""
    top = np.sort(reference, axis=1)
    gap = (top[:, -1] - top[:, -2]) * 256.0
    differs = reference.argmax(1) != outputs.argmax(1)
    return {f"<{k}": {"share": float(np.mean(gap < k)),
                      "disagreements": int(np.sum(differs & (gap < k))),
                      "of": int(np.sum(differs))} for k in GAP_STEPS}


def interleaved_latency(runners: dict[str, TFLiteRunner], one: dict[str, np.ndarray],
                        runs: int) -> dict[str, float]:
    """Median batch-1 ms per runner, the runners called in turn each round."""
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in runners.values():
        for _ in range(5):
            r(one)
    for _ in range(runs):
        for name, r in runners.items():
            t = time.perf_counter()
            r(one)
            times[name].append((time.perf_counter() - t) * 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


def task_library(paths: dict[str, str], texts: list[str], labels: list[str],
                 interpreter: dict[str, np.ndarray], float_labels: np.ndarray
                 ) -> dict[str, Any]:
    """BertNLClassifier on each file: agreement with the interpreter and the float
    student (labels), max |Δ| of probabilities against the interpreter."""
    reason = tasklib.unavailable_reason()
    if reason:
        return {"skipped": reason}
    out = {}
    for name, path in paths.items():
        got = np.array([[s[label] for label in labels] for s in tasklib.classify(path, texts)])
        out[name] = {"agrees_with_interpreter": float(np.mean(
                         got.argmax(1) == interpreter[name].argmax(1))),
                     "agrees_with_float_student": float(np.mean(got.argmax(1) == float_labels)),
                     "max_abs_diff_vs_interpreter": float(np.max(np.abs(
                         got - interpreter[name])))}
    return out


def quantize_again(flags: list[str], run_dir: str, seed: int, out: str) -> str:
    """The quantize stage with `seed` and `flags` in the folder `out` (task and augment
    outputs linked from `run_dir`); returns the quantised model's path."""
    os.makedirs(out, exist_ok=True)
    for stage in ("task", "augment"):
        link = os.path.join(out, stage)
        if os.path.isdir(os.path.join(run_dir, stage)) and not os.path.lexists(link):
            os.symlink(os.path.join(run_dir, stage), link)
    config = parse_argv(["bin/distill", *flags, f"--output_dir={out}", f"--seed={seed}"])
    state = RunState(out)
    if not state.is_done("quantize"):
        ctx = Context(config, resolve_task(config.task), state, tf.distribute.get_strategy())
        keras.utils.set_random_seed(seed + stage_names().index("quantize"))
        info = quantize(ctx)
        state.mark_done("quantize", info, config.stage_settings("quantize"), {})
    return state.path("quantize", "model")


class Measured(NamedTuple):
    """What every int8 measurement compares against: the float student's outputs on
    the dev set and (when the task has them) on the held-out sentences."""

    task: Any
    length: int
    is_pair: bool
    dev_inputs: dict[str, np.ndarray]
    ref_dev: np.ndarray
    labels: list
    held: Optional[dict[str, np.ndarray]]
    reference: Optional[np.ndarray]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's own flags, and bin/distill's (those after `--`)."""
    distill_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seeds", default="", help="extra quantize-stage seeds, e.g. 1,2")
    parser.add_argument("--variant", action="append", default=[],
                        help='NAME="--flag=value ...": the quantize stage again with these '
                             "flags added (repeatable)")
    parser.add_argument("--heldout", type=int, default=1000)
    parser.add_argument("--latency_runs", type=int, default=200)
    return parser.parse_args(own), distill_flags


def flavour_table(rows: dict[str, Any], runners: dict[str, TFLiteRunner],
                  m: Measured) -> dict[str, dict[str, Any]]:
    """Per TFLite flavour: its parity.json figures and its held-out agreement."""
    table: dict[str, dict[str, Any]] = {}
    for name in runners:
        r = rows[name]
        table[name] = {"dev_agreement": r["label_agreement"], "dev_metric": r.get("metric"),
                       "max_abs_diff": r["max_abs_diff"], "size_mb": r["size_bytes"] / 1e6,
                       "ranges": r.get("ranges")}
        if m.held is not None:
            outs = m.task.type.from_tflite(runners[name].predict(m.held))
            table[name]["heldout_agreement"] = agreement(m.task.type, m.reference, outs)
            if m.task.type.kind == "classification":
                table[name]["heldout_near_ties"] = near_tie_bands(m.reference, outs)
    return table


def add_latencies(table: dict[str, dict[str, Any]], runners: dict[str, TFLiteRunner],
                  files: dict[str, str], one: dict[str, np.ndarray], runs: int) -> None:
    """Batch-1 latency of the timed flavours at 1 thread and at all cores, into `table`."""
    timed = [n for n in ("float32", "dynamic_int8", "int8_ptq", "int8") if n in runners]
    latency = {"1": interleaved_latency({n: runners[n] for n in timed}, one, runs)}
    all_threads = {n: TFLiteRunner(files[n]) for n in timed}
    latency[str(next(iter(all_threads.values())).num_threads)] = interleaved_latency(
        all_threads, one, runs)
    for threads, values in latency.items():
        for name, ms in values.items():
            table[name][f"ms_b1_{threads}t"] = ms


def measure(path: str, m: Measured) -> dict[str, Any]:
    """The int8 file of a quantised model: agreement and metric on dev, agreement
    (and its near-tie bands) on the held-out sentences."""
    started = time.time()
    flat = convert_tflite(load_model(path), "int8", m.length, task=m.task.type,
                          is_pair=m.is_pair, metadata=False)
    runner = TFLiteRunner(flat)
    outs = m.task.type.from_tflite(runner.predict(m.dev_inputs))
    got = {"dev_agreement": agreement(m.task.type, m.ref_dev, outs),
           "dev_metric": m.task.type.score_labels(outs, m.labels)[m.task.type.primary_metric]}
    if m.held is not None:
        held_outs = m.task.type.from_tflite(runner.predict(m.held))
        got["heldout_agreement"] = agreement(m.task.type, m.reference, held_outs)
        if m.task.type.kind == "classification":
            got["heldout_near_ties"] = near_tie_bands(m.reference, held_outs)
    got["measure_seconds"] = time.time() - started
    return got


def requantized(args: argparse.Namespace, distill_flags: list[str], run_dir: str, root: str,
                m: Measured) -> tuple[dict[int, Any], dict[str, Any]]:
    """The quantize stage again with other seeds (--seeds) and flags (--variant)."""
    seeds = {}
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        seeds[seed] = measure(quantize_again(distill_flags, run_dir, seed,
                                             os.path.join(root, f"seed_{seed}")), m)
    variants = {}
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        if not name or not extra.strip():
            raise SystemExit(f'--variant={spec!r}: give NAME="--flag=value ...", e.g. '
                             'steps900="--quantize_steps=900"')
        started = time.time()
        flags = [*distill_flags, *extra.split()]  # a --seed among them is the variant's
        seed = int(parse_argv(["bin/distill", *flags, f"--output_dir={run_dir}"]).numerics.seed)
        path = quantize_again(flags, run_dir, seed, os.path.join(root, f"variant_{name}"))
        variants[name] = {"flags": extra.split(), "quantize_seconds": time.time() - started,
                          **measure(path, m)}
    return seeds, variants


def main() -> None:
    args, distill_flags = parse_args(sys.argv[1:])
    root = os.path.abspath(args.output_dir)
    run_dir = os.path.join(root, "run")
    started = time.time()
    run_argv(["bin/distill", *distill_flags, f"--output_dir={run_dir}"])
    pipeline_s = time.time() - started
    parity = read_json(os.path.join(run_dir, "export", "parity.json"))
    report = read_json(os.path.join(run_dir, "report.json"))
    done = {s: read_json(os.path.join(run_dir, s, "stage_done.json"), default={})
            for s in stage_names()}
    rows = parity["formats"]
    if "int8" not in rows or "int8_ptq" not in rows:
        raise SystemExit("the run exported no quantised int8 (int8 and int8_ptq rows in "
                         "parity.json): keep int8 in --export_formats and --quantize.")

    config = parse_argv(["bin/distill", *distill_flags, f"--output_dir={run_dir}"])
    task = resolve_task(config.task)
    student = load_model(os.path.join(run_dir, "task", "model"))
    length = parity["max_seq_len"]
    tokenizer = load_tokenizer(student, length)
    is_pair = bool(parity["is_pair"])
    texts = heldout_texts(args.heldout, is_pair) if task.type.kind in (
        "classification", "regression") else []
    held = reference = None
    if texts:
        a = [t[0] for t in texts] if is_pair else texts
        b = [t[1] for t in texts] if is_pair else None
        held = task.type.export_inputs(tokenizer, a, b, length)
        reference = keras_outputs(student, task.type, held)
    dev = task.examples(task.dev_splits[0])
    dev_a = [ex.text_a for ex in dev]
    dev_b = [ex.text_b for ex in dev] if is_pair else None
    dev_inputs = task.type.export_inputs(tokenizer, dev_a, dev_b, length)
    m = Measured(task, length, is_pair, dev_inputs,
                 keras_outputs(student, task.type, dev_inputs), [ex.label for ex in dev],
                 held, reference)

    export_dir = os.path.join(run_dir, "export")
    files = {name: os.path.join(export_dir, r["path"]) for name, r in rows.items()
             if name in FLAVOURS and not FLAVOURS[name].text_input}
    runners = {name: TFLiteRunner(path, num_threads=1) for name, path in files.items()}
    table = flavour_table(rows, runners, m)
    add_latencies(table, runners, files, {k: v[:1] for k, v in dev_inputs.items()},
                  args.latency_runs)
    library = None
    if task.type.kind == "classification" and not is_pair and student.bert_config.lower_case:
        interp = {n: runners[n].predict(dev_inputs) for n in ("int8", "int8_ptq")}
        library = task_library({n: files[n] for n in interp}, dev_a,
                               list(task.type.label_names), interp, m.ref_dev.argmax(1))
    seeds, variants = requantized(args, distill_flags, run_dir, root, m)
    seeds[int(config.numerics.seed)] = {k: table["int8"].get(k) for k in
                                        ("dev_agreement", "dev_metric", "heldout_agreement")}

    result = {"flags": distill_flags, "task": parity["task"], "max_seq_len": length,
              "dev_examples": parity["num_examples"], "heldout_examples": len(texts),
              "metric": parity["metric_name"], "keras": rows["keras"],
              "keras_quantized": rows.get("keras_quantized"), "flavours": table,
              "task_library": library, "seeds": seeds, "variants": variants,
              "student_config": student.bert_config.to_dict(),
              "report": {k: report.get(k) for k in ("student", "quantized_student", "ratios")},
              "stage_seconds": {s: d.get("seconds") for s, d in done.items() if d},
              "pipeline_seconds": pipeline_s, "cpu_count": os.cpu_count()}
    write_json_atomic(os.path.join(root, "bench_quantize.json"), result)
    print(format_result(result), flush=True)


def format_result(result: dict[str, Any]) -> str:
    metric = result["metric"] or "metric"
    threads = sorted({k for r in result["flavours"].values() for k in r if k.startswith("ms_")})
    head = (f"{'flavour':<14}{'ranges':>11}{'dev agree':>11}{'dev ' + metric[:8]:>14}"
            f"{'held-out':>10}" + "".join(f"{t[6:]:>10}" for t in threads) + f"{'MB':>8}")
    lines = [f"task {result['task']}, seq {result['max_seq_len']}, {result['dev_examples']} dev "
             f"examples, {result['heldout_examples']} held-out sentences; ms @ batch 1 "
             f"(threads), {result['cpu_count']} CPUs", head, "-" * len(head)]
    keras_metric = result["keras"].get("metric")
    lines.append(f"{'keras float':<14}{'':>11}{'100.0%':>11}"
                 f"{'-' if keras_metric is None else f'{keras_metric:.4f}':>14}")
    for name, r in result["flavours"].items():
        def pct(v):
            return "-" if v is None else f"{v:.1%}"
        m = r.get("dev_metric")
        lines.append(f"{name:<14}{r.get('ranges') or '':>11}{pct(r['dev_agreement']):>11}"
                     f"{'-' if m is None else f'{m:.4f}':>14}"
                     f"{pct(r.get('heldout_agreement')):>10}"
                     + "".join(f"{r.get(t, float('nan')):>10.2f}" for t in threads)
                     + f"{r['size_mb']:>8.2f}")
    for name, r in result["flavours"].items():
        if r.get("heldout_near_ties"):
            lines.append(f"{name} held-out disagreements by the float top-2 gap (int8 steps "
                         "of 1/256): " + ", ".join(
                             f"gap {k}: {v['share']:.1%} of rows, {v['disagreements']}/{v['of']}"
                             for k, v in r["heldout_near_ties"].items()))
    seeds = result["seeds"]
    if seeds:
        dev = [v["dev_agreement"] for v in seeds.values() if v.get("dev_agreement") is not None]
        held = [v["heldout_agreement"] for v in seeds.values()
                if v.get("heldout_agreement") is not None]
        lines.append(f"int8 over quantize-stage seeds {sorted(seeds)}: dev agreement "
                     f"{np.mean(dev):.1%} (min {np.min(dev):.1%})"
                     + (f", held-out {np.mean(held):.2%} (min {np.min(held):.2%})"
                        if held else ""))
    for name, v in result.get("variants", {}).items():
        lines.append(f"variant {name} ({' '.join(v['flags'])}): int8 dev agreement "
                     f"{v['dev_agreement']:.1%}"
                     + (f", held-out {v['heldout_agreement']:.2%}"
                        if v.get("heldout_agreement") is not None else "")
                     + f" ({v['quantize_seconds']:.0f} s)")
        if v.get("heldout_near_ties"):
            lines.append("  held-out disagreements by gap: " + ", ".join(
                f"{k}: {b['disagreements']}/{b['of']}" for k, b in v["heldout_near_ties"].items()))
    if result["task_library"]:
        lines.append(f"Task Library BertNLClassifier: {json.dumps(result['task_library'])}")
    lines.append(f"stage seconds: {json.dumps(result['stage_seconds'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
