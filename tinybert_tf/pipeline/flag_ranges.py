"""Checks of single flag values the preflight runs first: numeric ranges (each
setting's `check`), --layer_weights, and stages that would publish an untrained model."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from tinybert_tf import fields
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.training import phases as P
from tinybert_tf.pipeline.training.recipes import GeneralRecipe


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


def trains_nothing(c: PipelineConfig, needs: set,
                    recipe: Optional[GeneralRecipe] = None) -> list[str]:
    """Stages that would publish an untrained model as their output (a recipe that
    trains nothing, such as first_layers, is meant to)."""
    out = []
    g, f, d = c.general, c.finetune, c.distill
    if "general" in needs and g.epochs == 0 and (recipe is None or recipe.trains):
        out.append("--general_epochs=0: the general stage would train nothing and save a "
                   "random student as OUTPUT/general/model; give epochs > 0, or skip the stage "
                   "with --general_model=DIR (or --general_model=none for a random start).")
    if "finetune_teacher" in needs and f.epochs == 0:
        out.append("--teacher_epochs=0: the finetune_teacher stage would train nothing and "
                   "save --teacher with an untrained task head as the task teacher; give "
                   "epochs > 0, or a fine-tuned teacher with --task_teacher=DIR.")
    if "task" in needs:
        try:
            kinds = P.phase_kinds(d.task_phases)
        except ValueError:
            kinds = []  # reported by the phase check
        for kind in kinds:
            if kind.epochs(c) == 0:
                out.append(f"{kind.epochs_flag or kind.name}=0: the {kind.name} phase of "
                           f"--task_phases={','.join(d.task_phases)} would train nothing"
                           + (" and leave the task head untrained" if kind is kinds[-1]
                              else "") + f"; give epochs > 0, or drop {kind.name} from "
                           "--task_phases.")
    return out
