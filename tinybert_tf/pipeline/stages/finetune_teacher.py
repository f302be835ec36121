"""The finetune_teacher stage: --teacher fine-tuned on the task (skipped when
--task_teacher gives a fine-tuned teacher)."""
from __future__ import annotations

import posixpath
from typing import Any

from tinybert_tf.distill.terms import HardLabelTerm
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import inspect_model, load_model, save_model
from tinybert_tf.models.labels import put_in_order, same_labels
from tinybert_tf.pipeline.run.context import Context, rows
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages.base import (
    TASK_DATA,
    TASK_LENGTH,
    TASK_ROWS,
    TEACHER,
    Findings,
    PlanInputs,
    Stage,
    sized_on_task_rows,
)
from tinybert_tf.pipeline.stages.common import (
    evaluator,
    make_distiller,
    model_path,
    run_training,
    task_data,
    with_padding,
)
from tinybert_tf.pipeline.training import task_input
from tinybert_tf.pipeline.training.loop import Phase
from tinybert_tf.pipeline.training.phases import PhaseSpec, plan_phase

NAME = "finetune_teacher"


def finetune_phase(ctx: Context, train_size: int) -> PhaseSpec:
    c = ctx.config.finetune
    spec = plan_phase(ctx, NAME, "train", "task train split", train_size, c.batch_size,
                      "--teacher_batch_size", c.epochs, c.max_steps, c.lr, "linear",
                      ctx.config.optim.warmup_proportion, [HardLabelTerm(task=ctx.task.type)])
    return with_padding(ctx, spec)


def teacher_with_task_head(ctx: Context) -> BertModel:
    """--teacher with the task's head. A stored head of the same kind is kept when it is
    for the task's labels (its outputs put in the task's order by name) and replaced by a
    fresh one, with a line saying so, when it is for other labels: a teacher fine-tuned
    on another task first (RTE teachers usually start from an MNLI model)."""
    path, kwargs = ctx.config.models.teacher, ctx.task.type.head_kwargs()
    info = inspect_model(path)
    names = [str(n) for n in kwargs.get("label_names") or []]
    stored = [str(n) for n in info.label_names or []]
    same_outputs = info.num_labels in (None, kwargs["num_labels"])
    if info.head != kwargs["head"] or (same_outputs and not (stored and names)):
        return load_model(path, **kwargs)  # no stored head of this kind, or nothing to match
    if same_outputs and same_labels(stored, names):
        teacher = load_model(path, kwargs["head"], kwargs["num_labels"])
        put_in_order(teacher, names, what=f"--teacher={path}")
        return teacher
    print(f"[{NAME}] --teacher={path} has a {info.head} head for "
          f"{stored or info.num_labels} ({info.num_labels} outputs), not the task's labels "
          f"{names or kwargs['num_labels']}: its encoder is fine-tuned with a fresh head.",
          flush=True)
    return load_model(path, **kwargs, fresh_head=True)


def finetune_teacher(ctx: Context) -> dict[str, Any]:
    train, dev = ctx.examples("train"), ctx.examples(ctx.task.dev_splits[0])
    spec = finetune_phase(ctx, rows(ctx, train))
    spec.check()
    with ctx.strategy.scope():
        teacher = teacher_with_task_head(ctx)
        distiller = make_distiller(ctx, teacher, None, spec, ctx.task.type.label_metrics())

    # The teacher after its last epoch, as BERT fine-tuning does: on a small dev
    # set the "best" epoch is noise, and an early teacher's soft targets are
    # near uniform, which leaves the prediction-layer phase nothing to teach.
    phase = Phase("finetune_teacher", spec.directory, distiller,
                  distiller.checkpoint_items(model_key="teacher"),
                  task_input.phase_input(ctx, train, spec), spec.steps_per_epoch,
                  spec.epochs, max_steps=spec.max_steps, evaluate=evaluator(ctx, teacher, dev))
    result = run_training(ctx, phase, spec)
    last = result["evals"][-1] if result["evals"] else {}
    if ctx.chief:
        save_model(teacher, ctx.state.work_path("finetune_teacher", "model"),
                   metadata={"stage": "finetune_teacher", "dev": last, **ctx.trained_on(),
                             **ctx.task.type.model_metadata(last)})
    return {"dev": last}


def skipped(config: PipelineConfig) -> bool:
    """--task_teacher is the fine-tuned teacher: the stage has nothing to make."""
    return config.models.teacher_given


def checks(ctx: Context, found: Findings) -> None:
    """It trains something, and no --task_teacher stands in for its output."""
    c = ctx.config
    if c.finetune.epochs == 0:
        found.errors.append(
            "--teacher_epochs=0: the finetune_teacher stage would train nothing and save "
            "--teacher with an untrained task head as the task teacher; give epochs > 0, "
            "or a fine-tuned teacher with --task_teacher=DIR.")
    if c.models.teacher_given:
        found.errors.append(
            f"--stages={','.join(found.stages)} with --task_teacher={c.models.task_teacher}: "
            "the finetune_teacher stage fine-tunes --teacher, but the later stages read "
            "--task_teacher and would ignore it; drop --task_teacher, or finetune_teacher "
            "from --stages.")


def phases(ctx: Context, found: Findings, inputs: PlanInputs) -> list[PhaseSpec]:
    return sized_on_task_rows(found, inputs, lambda n_train: finetune_phase(ctx, n_train))


STAGE = Stage(
    NAME, finetune_teacher, checks=checks, phases=phases,
    needs=frozenset({TEACHER, TASK_DATA, TASK_LENGTH, TASK_ROWS}),
    reads=lambda ctx: {"teacher": model_path(ctx.config.models.teacher),
                       "data": task_data(ctx)},
    outputs=lambda ctx: {ctx.state.path(NAME, "model"): "content"},
    skipped=skipped, lr_flag="teacher_lr",
    artefacts=lambda ctx: [("fine-tuned teacher", ctx.state.path(NAME, "model"))],
    handover_flag="task_teacher",
    handover=lambda output_dir, config: posixpath.join(output_dir, NAME, "model"),
    handover_name=lambda config: "teacher")
