"""--teacher_precision: `auto` picks bfloat16 only where the hardware has fast bfloat16
matmuls (TPU, Ampere-or-later GPUs, AVX512-BF16 / AMX CPUs), float32 elsewhere, and
says why; run_config.json records the resolved dtype; a bfloat16 teacher is the same
model computing in bfloat16."""
from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.distill import Distiller, make_terms
from tinybert_tf.models import BertModel
from tinybert_tf.pipeline.main import run_argv
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.settings.precision import (
    HardwareFacts,
    _cpu_info,
    bfloat16_crash,
    decide,
    detect,
    with_precision,
)
from tinybert_tf.pipeline.training.strategy import can_create_variables

from numerics import needs_bfloat16_matmuls
from pipeline_helpers import argv, flag_values, tiny_flags, write_teacher

AVX2_FLAGS = frozenset("sse4_2 avx avx2 fma f16c".split())
AVX512_FLAGS = AVX2_FLAGS | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}


@pytest.mark.parametrize("facts, dtype, why", [
    (HardwareFacts(cpu_model="AMD EPYC", cpu_flags=AVX2_FLAGS), "float32",
     "AMD EPYC has no AVX512-BF16 or AMX"),
    (HardwareFacts(cpu_model="Xeon (Ice Lake)", cpu_flags=AVX512_FLAGS), "float32",
     "no AVX512-BF16 or AMX"),
    (HardwareFacts(cpu_model="Xeon (Cooper Lake)", cpu_flags=AVX512_FLAGS | {"avx512_bf16"}),
     "bfloat16", "avx512_bf16"),
    (HardwareFacts(cpu_model="Xeon (Sapphire Rapids)",
                   cpu_flags=AVX512_FLAGS | {"avx512_bf16", "amx_bf16", "amx_tile"}),
     "bfloat16", "avx512_bf16, amx_bf16"),
    (HardwareFacts(cpu_model="", cpu_flags=None), "float32", "unknown"),
    (HardwareFacts(gpus=(("NVIDIA A100-SXM4-40GB", (8, 0)),), cpu_flags=AVX2_FLAGS),
     "bfloat16", "bfloat16 tensor cores"),
    (HardwareFacts(gpus=(("NVIDIA H200", (9, 0)),) * 2), "bfloat16", "NVIDIA H200"),
    (HardwareFacts(gpus=(("Tesla V100-SXM2-16GB", (7, 0)),),
                   cpu_flags=AVX512_FLAGS | {"avx512_bf16"}),
     "float32", "--teacher_precision=float16"),
    (HardwareFacts(gpus=(("NVIDIA A100", (8, 0)), ("Tesla T4", (7, 5)))), "float32",
     "lack bfloat16"),
    (HardwareFacts(gpus=(("unknown GPU", None),)), "float32", "lack bfloat16"),
    (HardwareFacts(tpu=True, cpu_flags=AVX2_FLAGS), "bfloat16", "TPU"),
    # oneDNN off: TensorFlow's own bfloat16 matmuls are no faster than float32.
    (HardwareFacts(cpu_model="EPYC (Zen 4)", cpu_flags=AVX512_FLAGS | {"avx512_bf16"},
                   onednn=False), "float32", "oneDNN is off (TF_ENABLE_ONEDNN_OPTS=0)"),
    # oneDNN limited below the CPU's bfloat16 instructions: TensorFlow 2.20 crashes there.
    (HardwareFacts(cpu_model="EPYC (Zen 4)", cpu_flags=AVX512_FLAGS | {"avx512_bf16"},
                   onednn_max_isa="AVX2"), "float32", "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN"),
    (HardwareFacts(cpu_model="EPYC (Zen 4)", cpu_flags=AVX512_FLAGS | {"avx512_bf16"},
                   onednn_max_isa="AVX512_CORE_VNNI"), "float32", "segfault"),
    (HardwareFacts(cpu_model="EPYC (Zen 4)", cpu_flags=AVX512_FLAGS | {"avx512_bf16"},
                   onednn_max_isa="ALL"), "bfloat16", "avx512_bf16"),
    (HardwareFacts(cpu_model="EPYC (Zen 4)", cpu_flags=AVX512_FLAGS | {"avx512_bf16"},
                   onednn_max_isa="AVX512_CORE_BF16"), "bfloat16", "avx512_bf16"),
])
def test_auto_picks_bfloat16_only_where_it_is_fast(facts, dtype, why):
    decision = decide("auto", facts)
    assert decision.dtype == dtype
    assert why in decision.reason and decision.reason.startswith("auto: ")


@pytest.mark.parametrize("requested", ["float32", "bfloat16", "float16"])
def test_an_explicit_precision_is_kept_on_any_hardware(requested):
    for facts in (HardwareFacts(cpu_flags=AVX2_FLAGS), HardwareFacts(tpu=True)):
        assert decide(requested, facts).dtype == requested
    with pytest.raises(ValueError, match="--teacher_precision=int8"):
        decide("int8", HardwareFacts())


def test_bfloat16_where_tensorflow_would_crash_is_refused_with_the_fix():
    """An explicit bfloat16 on a CPU with AVX512-BF16 whose oneDNN is limited below it
    (ONEDNN_MAX_CPU_ISA=AVX2) is one error naming the variable and the ways out; on
    an AVX2-only CPU, with oneDNN off, or on a GPU host bfloat16 runs."""
    zen4 = dict(cpu_model="EPYC", cpu_flags=AVX512_FLAGS | {"avx512_bf16"})
    with pytest.raises(ValueError) as info:
        decide("bfloat16", HardwareFacts(**zen4, onednn_max_isa="AVX2"))
    message = str(info.value)
    assert message.startswith("--teacher_precision=bfloat16: ONEDNN_MAX_CPU_ISA=AVX2")
    for fix in ("Unset ONEDNN_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS=0",
                "--teacher_precision=float32"):
        assert fix in message
    for facts in (HardwareFacts(cpu_flags=AVX2_FLAGS, onednn_max_isa="AVX2"),
                  HardwareFacts(**zen4, onednn=False, onednn_max_isa="AVX2"),
                  HardwareFacts(**zen4, onednn_max_isa="ALL"),
                  HardwareFacts(**zen4, gpus=(("NVIDIA A100", (8, 0)),),
                                onednn_max_isa="AVX2")):
        assert decide("bfloat16", facts).dtype == "bfloat16"
        assert bfloat16_crash(facts) is None


def test_this_host_is_judged_by_its_own_cpu_flags():
    facts = detect()
    model, flags = _cpu_info()
    assert facts.cpu_model == model and facts.cpu_flags == flags
    assert facts.onednn_max_isa == os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    assert facts.onednn == (os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") not in ("0", "false"))
    if not facts.gpus and flags is not None:
        fast = bool({"avx512_bf16", "amx_bf16"} & flags) and facts.onednn
        assert decide("auto", facts).dtype == (
            "bfloat16" if fast and not bfloat16_crash(facts) else "float32")


def test_run_config_records_the_resolved_precision_and_the_plan_says_why(tmp_path, tiny_vocab):
    config = PipelineConfig.from_flags(flag_values(output_dir="o"))
    auto = decide("auto", detect())
    assert config.results()["teacher_precision"] == auto.dtype
    assert config.teacher_precision == auto
    assert PipelineConfig.from_flags(flag_values(
        output_dir="o", teacher_precision="float16")).results()["teacher_precision"] == "float16"
    teacher = write_teacher(str(tmp_path / "tt"), tiny_vocab, head="classifier")
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], general_model="none",
                    task_teacher=teacher, use_augmented=False, dry_run=True,
                    teacher_precision="auto")
    plan = run_argv(["bin/distill", *argv(ns)])
    for phase in plan["phases"]:
        assert phase["teacher_precision"] == {"dtype": auto.dtype, "reason": auto.reason}


@needs_bfloat16_matmuls
def test_a_bfloat16_teacher_is_the_same_model_computing_in_bfloat16(tiny_config):
    keras.utils.set_random_seed(0)
    teacher = BertModel(tiny_config, head="classifier", num_labels=2)
    student = BertModel(tiny_config.replace(hidden_size=16, num_heads=2, intermediate_size=32),
                        head="classifier", num_labels=2)
    half = with_precision(teacher, "bfloat16")
    assert with_precision(teacher, "float32") is teacher
    assert half.dtype_policy.compute_dtype == "bfloat16"
    assert all(v.dtype == "bfloat16" for v in half.weights)
    for path, v in half.weight_dict().items():
        np.testing.assert_array_equal(
            v.numpy(), tf.cast(teacher.weight_dict()[path], tf.bfloat16).numpy(), err_msg=path)
    rng = np.random.default_rng(0)
    mask = (np.arange(12)[None, :] < rng.integers(4, 13, (4, 1))).astype(np.int32)
    x = {"input_word_ids": rng.integers(5, 60, (4, 12)).astype(np.int32) * mask,
         "input_mask": mask, "input_type_ids": 0 * mask}
    full, low = teacher(x), half(x)
    for key in ("logits", "sequence_output"):
        a, b = full[key].numpy(), tf.cast(low[key], tf.float32).numpy()
        assert np.abs(a - b).max() <= 0.05 * np.abs(a).max() + 1e-3, key
    # The Distiller's losses stay float32 and finite with the bfloat16 teacher.
    losses = Distiller(student=student, teacher=half,
                       terms=make_terms("embd,attn,hidn")).compute_losses(x)
    assert all(v.dtype == tf.float32 and np.isfinite(v.numpy()) for v in losses.values())


@needs_bfloat16_matmuls
def test_a_teacher_kept_in_float32_computes_as_the_bfloat16_one(tiny_config):
    """Where the strategy cannot create bfloat16 variables (multi-worker), the teacher
    keeps float32 weights and casts them at each use: the same bfloat16 matmuls."""
    keras.utils.set_random_seed(1)
    teacher = BertModel(tiny_config, head="classifier", num_labels=2)
    half = with_precision(teacher, "bfloat16")
    kept = with_precision(teacher, "bfloat16", float32_weights=True)
    assert with_precision(teacher, "float32", float32_weights=True) is teacher
    assert kept.dtype_policy.compute_dtype == "bfloat16"
    assert all(v.dtype == "float32" for v in kept.weights)
    # The teacher caches key on the policy's name, so the two never share a cache.
    assert (half.dtype_policy.name, kept.dtype_policy.name) == ("bfloat16", "mixed_bfloat16")
    for path, v in kept.weight_dict().items():
        np.testing.assert_array_equal(v.numpy(), teacher.weight_dict()[path].numpy(),
                                      err_msg=path)
    rng = np.random.default_rng(1)
    x = {"input_word_ids": rng.integers(5, 60, (3, 10)).astype(np.int32),
         "input_mask": np.ones((3, 10), np.int32), "input_type_ids": np.zeros((3, 10), np.int32)}
    a, b, full = half(x)["logits"], kept(x)["logits"], teacher(x)["logits"].numpy()
    assert a.dtype == b.dtype == tf.bfloat16
    # Only LayerNorm's scale and offset differ (rounded in `half`): within bfloat16's
    # rounding of the outputs.
    scale = np.abs(full).max()
    np.testing.assert_allclose(tf.cast(a, tf.float32), tf.cast(b, tf.float32),
                               atol=0.02 * scale + 1e-3)
    assert can_create_variables(tf.distribute.get_strategy(), "bfloat16")
