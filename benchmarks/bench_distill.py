"""Distillation training throughput and MFU on this machine (CPU or GPU).

Teacher shaped like bert_base_uncased (random weights), student
tinybert_4l_312d, intermediate-layer distillation (embd + attn + hidn), seq 128,
batch 16 per replica. Prints steps/s, examples/s, achieved FLOP/s and MFU for
each run of `--runs`:
  fp32, fp32+xla    float32 step, graph mode, without / with XLA (`jit` = fp32+xla)
  bf16, bf16+xla    Keras mixed_bfloat16 policy (teacher and student; the TPU default)
  fp16, fp16+xla    Keras mixed_float16 policy, dynamic loss scaling (GPUs)
  bf16-teacher      only the teacher in bfloat16 (student fp32), graph mode

FLOPs per step = B * (teacher forward + 3 x student forward + 3 x projections);
3x = forward + backward (2x). Softmax/LayerNorm/loss ops are not counted. MFU
is against `--peak_tflops` (the device's dense 16-bit peak, e.g. 989 for an
H100/H200 SXM) when given, else against the matmul peak measured in this run.
With `--strategy=mirrored` the step runs on every visible GPU (global batch =
batch x replicas) and the peak is per device times the replicas.

Usage: python benchmarks/bench_distill.py [--steps 3] [--runs fp32,fp32+xla,bf16-teacher]
The default run takes about 3 minutes on 2 idle CPU cores.
benchmarks/accelerator_check.sh runs it on a GPU with every precision.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.config import get_config  # noqa: E402
from tinybert_tf.distill import Distiller, create_optimizer, make_terms  # noqa: E402
from tinybert_tf.models.encoder import BertModel, flops_per_example  # noqa: E402

# --runs key -> (label, Keras policy, XLA, teacher dtype override)
RUNS = {
    "fp32": ("fp32", "float32", False, None),
    "fp32+xla": ("fp32+xla", "float32", True, None),
    "jit": ("fp32+xla", "float32", True, None),
    "bf16": ("bf16", "mixed_bfloat16", False, None),
    "bf16+xla": ("bf16+xla", "mixed_bfloat16", True, None),
    "fp16": ("fp16", "mixed_float16", False, None),
    "fp16+xla": ("fp16+xla", "mixed_float16", True, None),
    "bf16-teacher": ("bf16-teacher", "float32", False, "bfloat16"),
}


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


def run(name: str, t_cfg, s_cfg, x, steps: int, jit: bool, teacher_dtype: str, *,
        policy: str = "float32", strategy=None) -> tuple[float, float]:
    """(seconds to trace/compile, seconds per step) of the distillation step on batch `x`.

    With a `strategy` the models live in its scope and `fit` feeds `x` (the global
    batch) to every replica; otherwise `train_on_batch`.
    """
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(policy)
    try:
        with (strategy.scope() if strategy is not None else _nothing()):
            teacher = BertModel(t_cfg, dtype=teacher_dtype) if teacher_dtype else BertModel(t_cfg)
            student = BertModel(s_cfg)
            d = Distiller(student=student, teacher=teacher, terms=make_terms("embd,attn,hidn"))
            d.compile(create_optimizer(1e-4, 1000), jit_compile=jit)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if strategy is not None:
        data = tf.data.Dataset.from_tensors(x).repeat()
        start = time.perf_counter()
        d.fit(data, steps_per_epoch=2, verbose=0, shuffle=False)  # trace (+ XLA compile)
        warm = time.perf_counter() - start
        start = time.perf_counter()
        logs = d.fit(data, steps_per_epoch=steps, verbose=0, shuffle=False).history
        step = (time.perf_counter() - start) / steps
        assert np.isfinite(logs["loss"][-1]), logs
        return warm, step
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


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--batch", type=int, default=16, help="examples per replica")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--teacher", default="bert_base_uncased")
    parser.add_argument("--student", default="tinybert_4l_312d")
    parser.add_argument("--runs", default="fp32,fp32+xla,bf16-teacher",
                        help=f"comma list of {', '.join(RUNS)}")
    parser.add_argument("--strategy", choices=["default", "mirrored"], default="default",
                        help="mirrored: every visible GPU, global batch = batch x replicas")
    parser.add_argument("--peak_tflops", type=float, default=0.0,
                        help="the device's dense 16-bit peak in TFLOP/s for MFU (0: the "
                             "matmul peak measured here)")
    args = parser.parse_args()
    keys = [r.strip() for r in args.runs.split(",") if r.strip()]
    for key in keys:
        if key not in RUNS:
            parser.error(f"--runs: unknown run {key!r}; use {', '.join(RUNS)}.")

    strategy = tf.distribute.MirroredStrategy() if args.strategy == "mirrored" else None
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    batch = args.batch * replicas
    t_cfg = get_config(args.teacher, hidden_dropout=0.0, attention_dropout=0.0)
    s_cfg = get_config(args.student)
    rng = np.random.default_rng(0)
    x = {"input_word_ids": rng.integers(1000, 30000, (batch, args.seq)).astype(np.int32),
         "input_mask": np.ones((batch, args.seq), np.int32),
         "input_type_ids": np.zeros((batch, args.seq), np.int32)}
    device = (tf.config.experimental.get_device_details(tf.config.list_physical_devices(
        "GPU")[0]).get("device_name", "GPU") if tf.config.list_physical_devices("GPU")
        else f"CPU ({os.cpu_count()} cores)")
    peak32, peak16 = matmul_peak("float32"), matmul_peak("bfloat16")
    f_teacher, f_student = step_flops(t_cfg, s_cfg, args.seq, batch)
    print(f"device: {device} x {replicas}  tf {tf.__version__}  keras {keras.__version__}")
    print(f"matmul peak measured: fp32 {peak32 / 1e12:.2f} TFLOP/s, bf16 "
          f"{peak16 / 1e12:.2f} TFLOP/s (one device)")
    if args.peak_tflops:
        print(f"MFU against the given peak: {args.peak_tflops:g} TFLOP/s x {replicas}")
    print(f"step: teacher {args.teacher}, student {args.student}, seq {args.seq}, "
          f"global batch {batch}: {(f_teacher + f_student) / 1e9:.1f} GFLOP "
          f"(teacher fwd {f_teacher / 1e9:.1f}, student fwd+bwd {f_student / 1e9:.1f})")
    print("(MFU fp32: against the fp32 matmul peak; MFU mixed: against each matmul at its "
          "own dtype's peak; MFU device: against --peak_tflops)")
    print(f"{'run':<14}{'trace s':>9}{'step s':>9}{'steps/s':>9}{'ex/s':>10}"
          f"{'GFLOP/s':>10}{'MFU fp32':>10}{'MFU mixed':>11}"
          + (f"{'MFU device':>12}" if args.peak_tflops else ""))
    for key in keys:
        label, policy, jit, teacher_dtype = RUNS[key]
        warm, step = run(key, t_cfg, s_cfg, x, args.steps, jit, teacher_dtype,
                         policy=policy, strategy=strategy)
        achieved = (f_teacher + f_student) / step
        # Re-measure the peaks and keep the best: one early measurement on a shared
        # machine can be taken at worse contention.
        peak32 = max(peak32, matmul_peak("float32"))
        peak16 = max(peak16, matmul_peak("bfloat16"))
        # Ideal time when every matmul runs at its own dtype's peak.
        t_peak = peak32 if policy == "float32" and not teacher_dtype else peak16
        s_peak = peak32 if policy == "float32" else peak16
        ideal = (f_teacher / t_peak + f_student / s_peak) / replicas
        device_mfu = (f"{achieved / (args.peak_tflops * 1e12 * replicas):>12.1%}"
                      if args.peak_tflops else "")
        print(f"{label:<14}{warm:>9.1f}{step:>9.3f}{1 / step:>9.2f}{batch / step:>10.1f}"
              f"{achieved / 1e9:>10.1f}{achieved / (peak32 * replicas):>10.1%}"
              f"{ideal / step:>11.1%}{device_mfu}", flush=True)
    print(f"final matmul peak: fp32 {peak32 / 1e12:.2f} TFLOP/s, bf16 {peak16 / 1e12:.2f} "
          "TFLOP/s (one device)")


if __name__ == "__main__":
    main()
