"""The training phases' plan: the task's data and the models' shapes read once
(`PlanInputs`), then each stage's own phases (`Stage.phases`), each checked."""
from __future__ import annotations

from typing import Any, Optional

from tinybert_tf.distill.projections import expected_shapes
from tinybert_tf.models.checkpoint import CheckpointError
from tinybert_tf.pipeline.preflight.collect import Checks
from tinybert_tf.pipeline.run.context import Context, rows
from tinybert_tf.pipeline.stages import (
    AUGMENTED_ROWS,
    STUDENT_CONFIG,
    TASK_DATA,
    TASK_ROWS,
    PlanInputs,
    augment,
    get_stage,
)
from tinybert_tf.pipeline.stages import general as G
from tinybert_tf.pipeline.training import phases as P
from tinybert_tf.pipeline.training.recipes import RECIPES


def plan_phases(found: Checks, ctx: Context, count_corpus: bool) -> list[dict[str, Any]]:
    """Each training phase's plan, in run order. Sizes need the tokenizers: none is
    built from a model that failed its checks (the task tokenizer is --task_teacher's
    or --teacher's)."""
    m, models = ctx.config.models, found.models
    inputs = PlanInputs(count_corpus=count_corpus)
    if found.needed(TASK_DATA):
        inputs.train = found.run(lambda: ctx.examples("train"), "")
        # A folder or flag at fault shows in the train split already: say it once.
        if inputs.train is not None:
            inputs.dev = found.run(lambda: ctx.examples(ctx.task.dev_splits[0]), "")
        tokenizer_ok = (models.task_teacher if m.teacher_given else models.teacher) \
            is not None
        # Sizing needs the task tokenizer; only the stages that train on it need sizes.
        if inputs.train is not None and tokenizer_ok and found.needed(TASK_ROWS):
            inputs.n_train = found.run(lambda: rows(ctx, inputs.train))
            if inputs.n_train is not None:
                found.run(lambda: note_cut_examples(found, ctx, inputs))
        # The augmented rows, read once for the run's stages that train on them.
        if inputs.n_train is not None and found.needed(AUGMENTED_ROWS) \
                and P.reads_augmented(ctx.config) and augment.written(ctx):
            inputs.augmented = found.run(lambda: ctx.examples("train_aug"))
            if inputs.augmented is not None:
                inputs.n_augmented = found.run(lambda: rows(ctx, inputs.augmented))
    if models.task_student is not None and models.vocab_model is not None:
        inputs.task_models = (models.task_student, models.vocab_model.config)
    inputs.saved_projections = _saved_projections(found, ctx)
    specs = []
    for name in found.stages:
        specs.extend(get_stage(name).phases(ctx, found, inputs) or [])
    return [d for d in (_checked(found, spec) for spec in specs) if d]


# The train examples measured for the share cut at --max_seq_len: the first ones (a
# large task's count would cost seconds; the share is what the plan reports).
CUT_SAMPLE = 20_000
# The share past which the plan warns: a length meant for another task, or a typo
# (RTE's pairs at the paper's 128 pieces: 13% cut, a deliberate choice).
CUT_WARNING = 0.2


def note_cut_examples(found: Checks, ctx: Context, inputs: PlanInputs) -> None:
    """The plan's `cut_at_max_seq_len` ({split: {"cut", "of"}}: examples longer than
    --max_seq_len pieces, whose ends no model sees), and a warning past CUT_WARNING."""
    cut = {}
    for split, examples in (("train", inputs.train), (ctx.task.dev_splits[0], inputs.dev)):
        if examples is None:
            continue
        sample = examples[:CUT_SAMPLE]
        n = ctx.task.type.cut_examples(sample, ctx.tokenizer, ctx.max_seq_len)
        if n is None:
            return
        cut[split] = {"cut": n, "of": len(sample)}
    found.plan["cut_at_max_seq_len"] = cut
    worst = max(cut, key=lambda s: cut[s]["cut"] / max(cut[s]["of"], 1), default=None)
    if worst is None or cut[worst]["cut"] <= CUT_WARNING * cut[worst]["of"]:
        return
    limit = found.models.vocab_model.config.max_position_embeddings \
        if found.models.vocab_model is not None else None
    found.warnings.append(
        f"{cut[worst]['cut']} of {cut[worst]['of']} {worst} examples "
        f"({cut[worst]['cut'] / cut[worst]['of']:.0%}) are longer than "
        f"--max_seq_len={ctx.max_seq_len} word pieces and are cut (a text keeps its start; "
        f"a pair loses pieces from the longer text): no model sees their ends. Raise "
        f"--max_seq_len{f' (the teacher takes up to {limit})' if limit else ''} unless "
        "that is meant.")


def _saved_projections(found: Checks, ctx: Context) -> Optional[dict]:
    """The projection shapes the task stage's general model has (or will have, when the
    general stage runs first in this run)."""
    m, models = ctx.config.models, found.models
    if m.random_student:
        return None
    if not m.general_given and found.needed(STUDENT_CONFIG):
        student, teacher = models.student_cfg, models.teacher
        recipe = RECIPES.get(ctx.config.general.recipe)
        if student is None or teacher is None or recipe is None or \
                not G.recipe_saves_projections(recipe, ctx.config, student, teacher.config):
            return None
        return expected_shapes(student.hidden_size, teacher.config.hidden_size,
                               student.num_layers, ctx.config.loss.share_hidden_projection)
    try:
        return P.saved_projection_shapes(ctx.general_path())
    except (CheckpointError, OSError):
        return None  # the model's own check reports it


def _checked(found: Checks, spec: P.PhaseSpec) -> Optional[dict[str, Any]]:
    """The plan of `spec` after its checks; None when its batch flags are out of range
    (reported once, by the range check)."""
    if {spec.batch_flag, "--grad_accum_steps"} & found.bad_flags:
        return None
    found.run(spec.check)
    if 0 < spec.micro_batch < 1:
        found.errors.append(
            f"{spec.batch_flag}={spec.global_batch} over {spec.replicas} replica(s) x "
            f"--grad_accum_steps={spec.accumulation} leaves micro-batches below 1 row; "
            "raise the batch or lower --grad_accum_steps.")
    return spec.describe()
