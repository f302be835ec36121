"""--mixed_precision defaults to `auto`: mixed_bfloat16 under --strategy=tpu (the TPU
default), none elsewhere; the resolved policy is what run_config.json records, and
an explicit policy is kept."""
from __future__ import annotations

import pytest

from tinybert_tf.pipeline.main import parse_argv

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
