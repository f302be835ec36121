"""The frozen teacher's precision in task distillation (`--teacher_precision`).

The teacher's forward pass is most of a distillation step's FLOPs (83% for
bert_base -> tinybert4, docs/distillation.md) and it is never trained, so
running it in bfloat16 halves its cost wherever bfloat16 matmuls are fast, at
the price of rounding its outputs (docs/measurements.md has the measured
change of each loss term).

`auto` picks bfloat16 where the hardware has fast bfloat16 matmuls: a TPU,
NVIDIA GPUs of compute capability 8.0 or later (Ampere, Ada, Hopper, ...),
CPUs with AVX512-BF16 or AMX-BF16. Elsewhere float32: on a CPU without those
instructions bfloat16 matmuls are emulated and slower than float32, on older
GPUs bfloat16 has no tensor cores (float16 does: `--teacher_precision=float16`).

`decide(requested, facts)` is a pure function of the request and the
`HardwareFacts` (`detect` reads them from this host), so tests inject facts.
`with_precision(model, dtype)` returns the same model computing (and keeping its
weights) in that dtype.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Optional

import keras
import tensorflow as tf

from tinybert_tf.models import BertModel

TEACHER_PRECISIONS = ("auto", "float32", "bfloat16", "float16")
# /proc/cpuinfo flags of CPUs with fast bfloat16 matmuls (Cooper Lake, Sapphire Rapids
# and later Xeons; Zen 4 and later EPYCs).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# NVIDIA compute capability from which GPUs have bfloat16 tensor cores (Ampere).
BF16_GPU_CAPABILITY = (8, 0)
# ONEDNN_MAX_CPU_ISA values (oneDNN's names) below AVX512_CORE_BF16: with one of these
# set, oneDNN leaves the CPU's bfloat16 instructions unused, and TensorFlow 2.20
# segfaults on a bfloat16 matmul where the CPU has them (seen on a Zen 4 EPYC with
# ONEDNN_MAX_CPU_ISA=AVX2; `make test-isa` sets it).
ONEDNN_ISAS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2",
                                      "AVX512_CORE", "AVX512_CORE_VNNI"})


@dataclasses.dataclass(frozen=True)
class HardwareFacts:
    """What the precision decision reads about the machine that trains."""

    tpu: bool = False
    # (name, (major, minor) compute capability or None when unknown) per visible GPU.
    gpus: tuple[tuple[str, Optional[tuple[int, int]]], ...] = ()
    cpu_model: str = ""
    # CPU feature flags (as /proc/cpuinfo names them); None when they cannot be read.
    cpu_flags: Optional[frozenset[str]] = None
    # TensorFlow's oneDNN kernels on (TF_ENABLE_ONEDNN_OPTS unset or not 0), and the
    # ISA they are limited to (ONEDNN_MAX_CPU_ISA, upper-cased; "" when unset).
    onednn: bool = True
    onednn_max_isa: str = ""


def _bf16_cpu_flags(facts: HardwareFacts) -> list[str]:
    """The CPU's flags of fast bfloat16 matmuls (`BF16_CPU_FLAGS`) it has."""
    return [f for f in BF16_CPU_FLAGS if f in (facts.cpu_flags or ())]


def bfloat16_crash(facts: HardwareFacts) -> Optional[str]:
    """Why a bfloat16 matmul would crash TensorFlow on this CPU (oneDNN limited below
    the CPU's bfloat16 instructions), or None. Only CPU-only hosts are affected."""
    if facts.tpu or facts.gpus or not facts.onednn:
        return None
    fast = _bf16_cpu_flags(facts)
    if fast and facts.onednn_max_isa in ONEDNN_ISAS_WITHOUT_BF16:
        return (f"ONEDNN_MAX_CPU_ISA={facts.onednn_max_isa} keeps oneDNN from this CPU's "
                f"{', '.join(fast)}, and TensorFlow 2.20 then crashes (segfault) on a "
                "bfloat16 matmul")
    return None


def refuse_bfloat16_where_it_crashes(facts: HardwareFacts, flag: str, instead: str) -> None:
    """One ValueError naming `flag` (the bfloat16 setting asked for), the cause and the
    ways out (`instead`: the flag setting without bfloat16) where `bfloat16_crash`."""
    crash = bfloat16_crash(facts)
    if crash:
        raise ValueError(f"{flag}: {crash}. Unset ONEDNN_MAX_CPU_ISA (or set it to "
                         "AVX512_CORE_BF16 or ALL), set TF_ENABLE_ONEDNN_OPTS=0, or use "
                         f"{instead}.")


@dataclasses.dataclass(frozen=True)
class Decision:
    """The teacher's dtype and the reason, for the plan."""

    dtype: str
    reason: str

    def describe(self) -> dict[str, str]:
        return {"dtype": self.dtype, "reason": self.reason}


def decide(requested: str, facts: HardwareFacts) -> Decision:
    """The teacher dtype for `--teacher_precision=requested` on hardware `facts`."""
    if requested not in TEACHER_PRECISIONS:
        raise ValueError(f"--teacher_precision={requested}: use one of "
                         f"{', '.join(TEACHER_PRECISIONS)}.")
    if requested == "bfloat16":
        refuse_bfloat16_where_it_crashes(facts, "--teacher_precision=bfloat16",
                                         "--teacher_precision=float32")
    if requested != "auto":
        return Decision(requested, f"--teacher_precision={requested}")
    if facts.tpu:
        return Decision("bfloat16", "auto: TPUs compute bfloat16 natively")
    if facts.gpus:
        caps = [cap for _, cap in facts.gpus]
        names = ", ".join(sorted({name for name, _ in facts.gpus}))
        if all(cap is not None and tuple(cap) >= BF16_GPU_CAPABILITY for cap in caps):
            return Decision("bfloat16", f"auto: GPU(s) {names} have bfloat16 tensor cores "
                            "(compute capability >= 8.0)")
        return Decision("float32", f"auto: GPU(s) {names} lack bfloat16 tensor cores "
                        "(compute capability < 8.0 or unknown); --teacher_precision=float16 "
                        "uses their float16 ones")
    cpu = facts.cpu_model or "this CPU"
    if facts.cpu_flags is None:
        return Decision("float32", f"auto: the features of {cpu} are unknown (no "
                        "/proc/cpuinfo); bfloat16 only where the CPU has AVX512-BF16 or AMX")
    fast = _bf16_cpu_flags(facts)
    crash = bfloat16_crash(facts)
    if fast and not facts.onednn:
        # Measured on a Zen 4 EPYC: oneDNN's bfloat16 matmul 2.3x float32's, TensorFlow's
        # own (Eigen) 1.1x.
        return Decision("float32", f"auto: {cpu} has {', '.join(fast)}, but oneDNN is off "
                        "(TF_ENABLE_ONEDNN_OPTS=0) and TensorFlow's own bfloat16 matmuls "
                        "are about as slow as float32")
    if crash:
        return Decision("float32", f"auto: {crash}")
    if fast:
        return Decision("bfloat16", f"auto: {cpu} has {', '.join(fast)} (fast bfloat16 "
                        "matmuls)")
    return Decision("float32", f"auto: {cpu} has no AVX512-BF16 or AMX, so bfloat16 matmuls "
                    "are emulated and slower than float32 here")


def _cpu_info() -> tuple[str, Optional[frozenset[str]]]:
    """(model name, flags) from /proc/cpuinfo; ("", None) where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "", None
    model, flags = "", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = frozenset(value.split())
    return model, flags


@functools.lru_cache(maxsize=4)
def detect(tpu: bool = False) -> HardwareFacts:
    """This host's facts; `tpu` when the run uses --strategy=tpu."""
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        try:
            details = tf.config.experimental.get_device_details(device)
        except (ValueError, RuntimeError):
            details = {}
        cap = details.get("compute_capability")
        gpus.append((str(details.get("device_name", device.name)),
                     tuple(int(c) for c in cap) if cap else None))
    model, flags = _cpu_info() if os.name == "posix" else ("", None)
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").strip().lower() not in (
        "0", "false")
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
           or "").strip().upper()
    return HardwareFacts(tpu=tpu, gpus=tuple(gpus), cpu_model=model, cpu_flags=flags,
                         onednn=onednn, onednn_max_isa=isa)


def with_precision(model: BertModel, dtype: str, float32_weights: bool = False) -> BertModel:
    """`model` computing in `dtype` (float32, bfloat16, float16): the same model when
    it already does, else a copy whose weights are cast to `dtype` once (a frozen
    teacher needs no float32 master weights). LayerNorm and the attention softmax
    still compute in float32 (models/layers.py).

    `float32_weights`: keep the weights in float32 and cast them at each use (keras'
    mixed policy), for strategies that cannot create variables in `dtype`
    (`strategy.can_create_variables`: multi-worker collectives broadcast no bfloat16).
    The matmuls see the same rounded weights; LayerNorm's scale and offset stay
    unrounded."""
    policy = keras.DTypePolicy(f"mixed_{dtype}" if float32_weights and dtype != "float32"
                               else dtype)
    if (model.dtype_policy.compute_dtype == policy.compute_dtype
            and model.dtype_policy.variable_dtype == policy.variable_dtype):
        return model
    copy = BertModel(model.bert_config, head=model.head_type, num_labels=model.num_labels,
                     label_names=model.label_names, vocab=model.vocab,
                     dtype=policy, name=model.name)
    source = model.weight_dict()
    for path, variable in copy.weight_dict().items():
        variable.assign(tf.cast(source[path], variable.dtype))
    copy.metadata = dict(getattr(model, "metadata", None) or {})
    copy.trainable = model.trainable
    return copy
