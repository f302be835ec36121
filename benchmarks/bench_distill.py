"""Distillation training throughput and MFU on this machine.

Teacher shaped like bert_base_uncased (random weights), student
tinybert_4l_312d, intermediate-layer distillation (embd + attn + hidn), seq 128,
batch 16. Prints steps/s, examples/s, achieved FLOP/s and MFU against the
matmul peak measured in the same run, for:
  fp32          eager-free tf.function step (keras' default graph mode)
  fp32+jit      the same step XLA-compiled (jit_compile=True)
  bf16-teacher  the teacher runs in bfloat16 (student fp32), graph mode

FLOPs per step = B * (teacher forward + 3 x student forward + 3 x projections);
3x = forward + backward (2x). Softmax/LayerNorm/loss ops are not counted.

Usage: python benchmarks/bench_distill.py [--steps 3] [--runs fp32,jit,bf16]
The default run takes about 3 minutes on 2 idle CPU cores.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.config import get_config  # noqa: E402
from tinybert_tf.distill import Distiller, create_optimizer, make_terms  # noqa: E402
from tinybert_tf.models.encoder import BertModel, flops_per_example  # noqa: E402


def matmul_peak(dtype: str, n: int = 2048, repeats: int = 8) -> float:
    """Best-of FLOP/s of an n x n x n matmul chain in `dtype` (graph mode)."""
    a = tf.random.normal((n, n), dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.random.normal((n, n)), dtype)

    @tf.function
    def chain(x, y):
        out = x
        for _ in range(4):
            out = tf.matmul(out, y) * tf.cast(1e-2, dtype)
        return tf.reduce_sum(tf.cast(out, tf.float32))

    chain(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        chain(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 4 * 2 * n ** 3 / best


def step_flops(t_cfg, s_cfg, seq: int, batch: int) -> tuple[float, float]:
    """(teacher FLOPs, student+projection FLOPs) of one training step."""
    teacher = flops_per_example(t_cfg, seq)
    student = 3 * flops_per_example(s_cfg, seq)
    proj = 3 * (s_cfg.num_layers + 1) * 2 * seq * s_cfg.hidden_size * t_cfg.hidden_size
    return batch * teacher, batch * (student + proj)


def run(name: str, t_cfg, s_cfg, x, steps: int, jit: bool, teacher_dtype: str):
    keras.utils.set_random_seed(0)
    teacher = BertModel(t_cfg, dtype=teacher_dtype)
    student = BertModel(s_cfg)
    d = Distiller(student=student, teacher=teacher, terms=make_terms("embd,attn,hidn"))
    d.compile(create_optimizer(1e-4, 1000), jit_compile=jit)
    start = time.perf_counter()
    d.train_on_batch(x)  # trace (+ XLA compile)
    warm = time.perf_counter() - start
    d.train_on_batch(x)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logs = d.train_on_batch(x, return_dict=True)
        times.append(time.perf_counter() - start)
    assert np.isfinite(logs["loss"]), logs
    return warm, float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (median)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--teacher", default="bert_base_uncased")
    parser.add_argument("--student", default="tinybert_4l_312d")
    parser.add_argument("--runs", default="fp32,jit,bf16", help="comma list of fp32, jit, bf16")
    args = parser.parse_args()

    t_cfg = get_config(args.teacher, hidden_dropout=0.0, attention_dropout=0.0)
    s_cfg = get_config(args.student)
    rng = np.random.default_rng(0)
    x = {"input_word_ids": rng.integers(1000, 30000, (args.batch, args.seq)).astype(np.int32),
         "input_mask": np.ones((args.batch, args.seq), np.int32),
         "input_type_ids": np.zeros((args.batch, args.seq), np.int32)}
    peak32 = matmul_peak("float32")
    peak16 = matmul_peak("bfloat16")
    f_teacher, f_student = step_flops(t_cfg, s_cfg, args.seq, args.batch)
    print(f"cpu cores: {os.cpu_count()}  tf {tf.__version__}  keras {keras.__version__}")
    print(f"matmul peak: fp32 {peak32 / 1e9:.1f} GFLOP/s, bf16 {peak16 / 1e9:.1f} GFLOP/s")
    print(f"step: teacher {args.teacher}, student {args.student}, seq {args.seq}, "
          f"batch {args.batch}: {(f_teacher + f_student) / 1e9:.1f} GFLOP "
          f"(teacher fwd {f_teacher / 1e9:.1f}, student fwd+bwd {f_student / 1e9:.1f})")
    print("(MFU uses the best peak measured so far; final peaks are printed at the end)")
    print(f"{'run':<14}{'trace s':>9}{'step s':>9}{'steps/s':>9}{'ex/s':>8}"
          f"{'GFLOP/s':>9}{'MFU fp32':>10}{'MFU mixed':>11}")
    specs = {"fp32": (False, "float32"), "jit": (True, "float32"), "bf16": (False, "bfloat16")}
    labels = {"fp32": "fp32", "jit": "fp32+jit", "bf16": "bf16-teacher"}
    for key in [r.strip() for r in args.runs.split(",") if r.strip()]:
        if key not in specs:
            parser.error(f"--runs: unknown run {key!r}; use fp32, jit, bf16.")
        jit, dtype = specs[key]
        warm, step = run(key, t_cfg, s_cfg, x, args.steps, jit, dtype)
        # Re-measure the peaks after each run and keep the best: on a shared
        # machine a single early measurement can be taken at worse contention.
        peak32, peak16 = max(peak32, matmul_peak("float32")), max(peak16, matmul_peak("bfloat16"))
        achieved = (f_teacher + f_student) / step
        # Ideal time when every matmul runs at its own dtype's peak.
        ideal = f_teacher / (peak16 if dtype == "bfloat16" else peak32) + f_student / peak32
        print(f"{labels[key]:<14}{warm:>9.1f}{step:>9.2f}{1 / step:>9.3f}"
              f"{args.batch / step:>8.2f}{achieved / 1e9:>9.1f}{achieved / peak32:>10.1%}"
              f"{ideal / step:>11.1%}", flush=True)
    print(f"final matmul peak: fp32 {peak32 / 1e9:.1f} GFLOP/s, bf16 {peak16 / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
