"""--mixed_precision defaults to `auto`: mixed_bfloat16 under --strategy=tpu (the TPU
default), none elsewhere; the resolved policy is what run_config.json records, and
an explicit policy is kept."""
from __future__ import annotations

import pytest

from tinybert_tf.pipeline.main import parse_argv
from tinybert_tf.pipeline.settings import precision

from pipeline_helpers import argv, flag_values


@pytest.mark.parametrize("strategy, given, expected", [
    ("tpu", "auto", "mixed_bfloat16"),
    ("default", "auto", "none"),
    ("mirrored", "auto", "none"),
    ("tpu", "none", "none"),
    ("tpu", "mixed_float16", "mixed_float16"),
])
def test_mixed_precision_default_is_bfloat16_on_tpu_only(tmp_path, strategy, given, expected):
    ns = flag_values(output_dir=str(tmp_path), strategy=strategy, mixed_precision=given)
    config = parse_argv(["bin/distill", *argv(ns)])
    assert config.numerics.mixed_precision == expected
    assert config.results()["mixed_precision"] == expected


def test_mixed_bfloat16_where_tensorflow_would_crash_is_refused_with_the_fix(tmp_path,
                                                                            monkeypatch):
    """A CPU with AVX512-BF16 under ONEDNN_MAX_CPU_ISA=AVX2: TensorFlow 2.20 segfaults on
    a bfloat16 matmul there, so the student's mixed_bfloat16 is refused up front."""
    zen4 = precision.HardwareFacts(cpu_model="EPYC", cpu_flags=frozenset(
        {"avx2", "avx512f", "avx512_bf16"}), onednn_max_isa="AVX2")
    monkeypatch.setattr(precision, "detect", lambda tpu=False: zen4)
    ns = flag_values(output_dir=str(tmp_path), mixed_precision="mixed_bfloat16",
                     teacher_precision="float32")
    with pytest.raises(ValueError) as info:
        parse_argv(["bin/distill", *argv(ns)])
    message = str(info.value)
    assert message.startswith("--mixed_precision=mixed_bfloat16: ONEDNN_MAX_CPU_ISA=AVX2")
    assert "TF_ENABLE_ONEDNN_OPTS=0" in message and "--mixed_precision=none" in message
    ns.mixed_precision = "mixed_float16"
    assert parse_argv(["bin/distill", *argv(ns)]).numerics.mixed_precision == "mixed_float16"
