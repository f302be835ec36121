"""Checks of single flag values the preflight runs first: numeric ranges (each
setting's `check`) and --layer_weights."""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from tinybert_tf import fields
from tinybert_tf.pipeline.settings.configs import PipelineConfig


def ranges(c: PipelineConfig) -> list[tuple[str, Any, Callable[[Any], bool], str]]:
    """(--flag, value, ok, what is allowed) for every setting declared with a range
    (`fields.setting(check=...)`)."""
    return [row for part in c.parts() for row in fields.range_checks(part)]


def layer_weight_errors(values: Sequence[str]) -> list[str]:
    """--layer_weights must be finite numbers >= 0 (their count is checked against the
    student's layers by `layer_weights`)."""
    bad = []
    for i, v in enumerate(values):
        try:
            ok = math.isfinite(float(v)) and float(v) >= 0
        except ValueError:
            ok = False
        if not ok:
            bad.append(f"item {i + 1} ({v!r})")
    if not bad:
        return []
    return [f"--layer_weights={','.join(values)}: {', '.join(bad)} must be a number >= 0 "
            "(lambda_0 for embeddings, lambda_1..M for the student layers, lambda_M+1 for "
            "the prediction layer)."]
