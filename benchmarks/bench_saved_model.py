"""SavedModel export time: the serving functions traced inside `tf.saved_model.save`
(what `tinybert_tf.export.saved_model.export_saved_model` does) against traced before it
and handed over as concrete functions.

`tf.saved_model.save` traces every tf.function its object tracks inside its own save
context, and a trace made outside that context is not reused there: handing it
concrete functions traced before the call traces each serving function twice.
For a run's task student (the demo's by default; a pair task's too, whose texts come
in pairs) this exports the SavedModel both ways, interleaved, `--rounds` times, and
prints the median seconds of each, their ratio and the traces each way took.
The traces made before the save are timed on their own: that is the time saved, where
the whole export's time also holds writing the weights, which varies with the disk.
It also checks that both SavedModels have the same signatures and give the same outputs
on a few texts: a faster export that changed the servable would not count.

Usage: .venv/bin/python benchmarks/bench_saved_model.py [--model_dir runs/demo/task/model]
       [--max_seq_len N] [--rounds 5]   (the demo's student: about 20 seconds)
--max_seq_len defaults to the length the model was trained at (its record), else 128.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.data.examples import DataError  # noqa: E402
from tinybert_tf.export import saved_model  # noqa: E402
from tinybert_tf.export.common import ExportError, export_task  # noqa: E402
from tinybert_tf.models.checkpoint import CheckpointError, inspect_model, load_model  # noqa: E402
from tinybert_tf.tasks import TaskConfig, resolve_task  # noqa: E402

TEXTS = ["a gripping, funny and humane film.", "the plot goes nowhere and takes its time.",
         "", "not bad at all"]
SECOND_TEXTS = ["the film is humane.", "the plot moves fast.", "a film", ""]  # pair tasks


def recorded_task(model_dir: str) -> tuple[bool, int]:
    """(whether the model's task takes text pairs, the length it was trained at) from the
    model's record (bin/distill's task models keep it); (False, 128) without one."""
    metadata = inspect_model(model_dir).metadata
    task = metadata.get("task")
    is_pair = bool(task) and resolve_task(TaskConfig.from_record(task)).is_pair
    return is_pair, int(metadata.get("max_seq_len") or 128)


def export(model, path: str, max_seq_len: int, is_pair: bool, trace_first: bool
           ) -> tuple[int, int, float]:
    """The SavedModel of `model` at `path`: with `trace_first`, its serving functions
    traced before the save and handed over as concrete functions; without, the
    tf.functions handed to the save, as `export_saved_model` does. Returns (traces of
    serve_ids, of serve_text, seconds of the traces made before the save)."""
    with tempfile.TemporaryDirectory() as assets:
        module = saved_model.ServingModule(model, max_seq_len, is_pair, assets)
        signatures, start = module.signatures(), time.perf_counter()
        if trace_first:
            signatures = {k: f.get_concrete_function() for k, f in signatures.items()}
        tracing = time.perf_counter() - start
        tf.saved_model.save(module, path, signatures=signatures)
    return (module.serve_ids.experimental_get_tracing_count(),
            module.serve_text.experimental_get_tracing_count(), tracing)


WAYS = {"traced before the save": True, "traced in the save": False}  # -> trace_first


def outputs(path: str, is_pair: bool) -> tuple[list[str], dict[str, np.ndarray]]:
    """(signature names, serving_default's outputs on TEXTS, paired with SECOND_TEXTS for
    a pair task) of a SavedModel."""
    loaded = tf.saved_model.load(path)
    texts = {"text": tf.constant(TEXTS)}
    if is_pair:
        texts["text_b"] = tf.constant(SECOND_TEXTS)
    fn = loaded.signatures["serving_default"]
    return sorted(loaded.signatures), {k: v.numpy() for k, v in fn(**texts).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", default="runs/demo/task/model")
    parser.add_argument("--max_seq_len", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not os.path.isdir(args.model_dir):
        sys.exit(f"bench_saved_model: {args.model_dir} is not a model folder: run `make "
                 "demo` first, or give --model_dir=<a task model>.")
    try:
        model = load_model(args.model_dir)
        export_task(model)  # a task head, or ExportError before any timing
        is_pair, trained = recorded_task(args.model_dir)
    except (CheckpointError, ExportError, DataError) as e:
        sys.exit(f"bench_saved_model: --model_dir={args.model_dir}: {e}")
    max_seq_len = args.max_seq_len or trained
    seconds = {name: [] for name in WAYS}
    traces, tracing = {}, []
    with tempfile.TemporaryDirectory() as root:
        for r in range(args.rounds + 1):  # round 0 warms both up and is not counted
            for i, (name, trace_first) in enumerate(WAYS.items()):
                path = os.path.join(root, f"round{r}-way{i}")
                start = time.perf_counter()
                *traces[name], traced = export(model, path, max_seq_len, is_pair,
                                               trace_first)
                if r:
                    seconds[name].append(time.perf_counter() - start)
                    if trace_first:
                        tracing.append(traced)
        (names_a, out_a), (names_b, out_b) = (
            outputs(os.path.join(root, f"round0-way{i}"), is_pair) for i in range(len(WAYS)))
    assert names_a == names_b, (names_a, names_b)
    assert out_a.keys() == out_b.keys()
    for key in out_a:
        np.testing.assert_array_equal(out_a[key], out_b[key], err_msg=key)
    print(f"{args.model_dir}, max_seq_len {max_seq_len}, {args.rounds} rounds "
          f"interleaved; both SavedModels: signatures {names_a}, the same outputs on "
          f"{len(TEXTS)} {'text pairs' if is_pair else 'texts'}")
    for name in WAYS:
        print(f"  {name:24s} median {statistics.median(seconds[name]):6.2f} s  "
              f"(serve_ids traced {traces[name][0]}x, serve_text {traces[name][1]}x)")
    ratio = (statistics.median(seconds["traced in the save"])
             / statistics.median(seconds["traced before the save"]))
    print(f"  traced in the save / traced before: {ratio:.2f}; the traces made before the "
          f"save took {statistics.median(tracing):.2f} s (median), the time saved")


if __name__ == "__main__":
    main()
