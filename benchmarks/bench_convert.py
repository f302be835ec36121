"""TFLite conversion time: the traced function handed over with the variables it reads
(what `tinybert_tf.export.tflite.convert` does) against freezing it to constants first.

For each flavour the export stage writes (float32 from the task student, int8_ptq
calibrated from it, int8 from the quantize stage's student), converts a run's models
both ways, interleaved, `--rounds` times, and prints the median seconds of each and
their ratio. It also checks that both ways give the same TFLite graph (the same ops,
the same tensors' types, shapes and quantisation) and the same outputs on
`--rows` rows of random ids: a faster conversion that changed the model would not count.

Usage: .venv/bin/python benchmarks/bench_convert.py [--run_dir runs/demo] [--rounds 2]
       (needs a run with task/ and quantize/ stages, e.g. `make demo`; about 2 minutes)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.framework.convert_to_constants import (  # noqa: E402
    convert_variables_to_constants_v2,
)

from tinybert_tf.export import tflite  # noqa: E402
from tinybert_tf.models import INPUT_NAMES  # noqa: E402
from tinybert_tf.models.checkpoint import load_model  # noqa: E402

WAYS = {
    "variables held": tflite.converter,
    "frozen first": lambda fn: tf.lite.TFLiteConverter.from_concrete_functions(
        [convert_variables_to_constants_v2(fn)], tf.Module()),
}


def random_rows(n: int, seq: int, vocab: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """n packed rows of int32 [1, seq]: random ids, full mask, segment 0."""
    rng = np.random.default_rng(seed)
    return [{"input_word_ids": rng.integers(1000, vocab, (1, seq)).astype(np.int32),
             "input_mask": np.ones((1, seq), np.int32),
             "input_type_ids": np.zeros((1, seq), np.int32)} for _ in range(n)]


def describe(flat: bytes, rows: list[dict[str, np.ndarray]]) -> tuple[list, list, np.ndarray]:
    """(ops in order, sorted tensor descriptions, outputs [n, ...]) of a TFLite model."""
    it = tf.lite.Interpreter(model_content=flat)
    it.allocate_tensors()
    ops = [op["op_name"] for op in it._get_ops_details()]
    tensors = sorted((str(t["dtype"]), tuple(t["shape"]),
                      tuple(np.round(t["quantization_parameters"]["scales"], 9)),
                      tuple(t["quantization_parameters"]["zero_points"]))
                     for t in it.get_tensor_details())
    runner = it.get_signature_runner("serving_default")
    outs = np.stack([next(iter(runner(**{k: r[k] for k in INPUT_NAMES}).values()))
                     for r in rows])
    return ops, tensors, outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run_dir", default="runs/demo")
    parser.add_argument("--seq", type=int, default=48, help="the demo's --max_seq_len")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16)
    args = parser.parse_args()
    paths = {"task": os.path.join(args.run_dir, "task", "model"),
             "quantize": os.path.join(args.run_dir, "quantize", "model")}
    missing = [p for p in paths.values() if not os.path.isdir(p)]
    if missing:
        sys.exit(f"bench_convert.py: {', '.join(missing)} not found; run `make demo` first "
                 "(or pass --run_dir of a run with the task and quantize stages).")
    student, quantized = load_model(paths["task"]), load_model(paths["quantize"])
    rows = random_rows(args.rows, args.seq, student.bert_config.vocab_size)
    cases = [("float32", student, "float32"), ("int8_ptq", student, "int8"),
             ("int8", quantized, "int8")]
    print(f"host: {os.cpu_count()} cores; run {args.run_dir}; seq {args.seq}; "
          f"{args.rounds} rounds, interleaved")
    print(f"{'flavour':10} {'variables held':>15} {'frozen first':>13} {'ratio':>6}  "
          "same graph, outputs")
    for name, model, fmt in cases:
        seconds = {way: [] for way in WAYS}
        flats = {}
        for _ in range(args.rounds):
            for way, make in WAYS.items():
                tflite.converter = make  # convert() looks the helper up at call time
                start = time.perf_counter()
                flats[way] = tflite.convert(model, fmt, args.seq, representative=rows)
                seconds[way].append(time.perf_counter() - start)
        tflite.converter = WAYS["variables held"]
        (ops_a, ten_a, out_a), (ops_b, ten_b, out_b) = (describe(flats[w], rows) for w in WAYS)
        held, frozen = (statistics.median(seconds[w]) for w in WAYS)
        same = ops_a == ops_b and ten_a == ten_b
        print(f"{name:10} {held:14.1f}s {frozen:12.1f}s {frozen / held:5.1f}x  "
              f"{'yes' if same else 'NO'}, max|diff| {float(np.max(np.abs(out_a - out_b))):.1e}")


if __name__ == "__main__":
    main()
