"""The models a run reads, inspected without their weights once for every stage that
reads them (`Stage.needs`): --teacher, --task_teacher, --student_config and the
general model the task stage starts from, their task heads and position tables."""
from __future__ import annotations

import posixpath
from typing import Any, Optional, Sequence

from tinybert_tf.config import get_config
from tinybert_tf.models.checkpoint import ModelInfo, inspect_model
from tinybert_tf.models.labels import label_order, output_names
from tinybert_tf.pipeline.autosize import AUTO
from tinybert_tf.pipeline.preflight.collect import Checks
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.stages import (
    STUDENT_CONFIG,
    TASK_LENGTH,
    TASK_STUDENT,
    TASK_TEACHER,
    TEACHER,
    TEACHER_VOCAB,
)
from tinybert_tf.pipeline.stages import general as G
from tinybert_tf.pipeline.stages.inspect import inspect_flag
from tinybert_tf.tasks.catalog import Task


def task_head_errors(info: ModelInfo, task: Task, flag: str) -> list[str]:
    """Problems of a model with a task head `info` used for `task` (head kind, output
    count); label names are matched separately (`label_order`)."""
    want = task.type
    if not want.accepts(info.head):
        return [f"{flag}={info.path} has head={info.head!r} but task {task.name} needs a "
                f"{want.head} head; give a model fine-tuned on {task.name}."]
    if info.num_labels != want.num_outputs:
        return [f"{flag}={info.path} has {info.num_labels} outputs but task {task.name} has "
                f"{want.num_outputs} labels; give a model fine-tuned on {task.name} (or the "
                f"--task it was trained on)."]
    return []


def check_teachers(found: Checks, ctx: Context, unreadable: set) -> None:
    """--teacher and --task_teacher, read without weights, when a stage reads them
    (`unreadable`: stages that cannot read their inputs, so tokenise nothing)."""
    m, models = ctx.config.models, found.models
    if found.needed(TEACHER) or (m.random_student and found.needed(TASK_STUDENT)
                                 and not m.teacher_given):
        models.teacher = inspect_flag(found, m.teacher, "--teacher")
    elif not m.teacher_given and set(found.needed(TEACHER_VOCAB)) - unreadable:
        # These stages tokenise with --teacher's vocab (the fine-tuned teacher keeps it).
        models.teacher = inspect_flag(found, m.teacher, "--teacher")
    if m.teacher_given and found.needed(TASK_TEACHER):
        models.task_teacher = inspect_flag(found, m.task_teacher, "--task_teacher")
        if models.task_teacher is not None:
            _check_task_head(found, models.task_teacher, ctx, "--task_teacher")
    if models.teacher is not None and models.task_teacher is not None \
            and models.teacher.vocab != models.task_teacher.vocab:
        found.errors.append("--task_teacher and --teacher use different vocabularies; the "
                            "student can follow only one. Use teachers of one vocab.")
    if m.teacher_label_order and not m.teacher_given:
        found.errors.append("--teacher_label_order describes the outputs of --task_teacher, "
                            "which is not given (the finetune_teacher stage names its "
                            "labels itself); drop the flag or give --task_teacher.")


def reads_student_config(config, stages: Sequence[str]) -> bool:
    """Whether a stage of `stages` builds a student from --student_config (config: a
    `PipelineConfig`): the general stage, or task distillation from random weights."""
    checks = Checks(stages=tuple(stages))
    return bool(checks.needed(STUDENT_CONFIG)) or (
        config.models.random_student and bool(checks.needed(TASK_STUDENT)))


def auto_student_error(config, stages: Sequence[str]) -> Optional[str]:
    """The error when --student_config=auto would size a student no stage of `stages`
    builds (the task stage then starts from a general model's shape), else None."""
    m = config.models
    if m.student_config != AUTO or reads_student_config(config, stages):
        return None
    source = (f"--general_model={m.general_model}" if m.general_model else
              f"the general stage's model "
              f"({posixpath.join(config.run.output_dir, G.NAME, 'model')})")
    return (f"--student_config=auto sizes the student the general stage builds, but this "
            f"run's stages ({', '.join(stages)}) build none: its student is {source}, "
            "whose shape stays. Drop --student_config=auto and the --latency_* flags, "
            "or add general to --stages" + (" without --general_model" if m.general_model
                                            else "") + ".")


def check_students(found: Checks, ctx: Context) -> None:
    """--student_config and the general model the task stage starts from (given, or a
    finished general stage's)."""
    m, models = ctx.config.models, found.models
    builds = bool(found.needed(STUDENT_CONFIG))  # the general stage runs first
    distils = bool(found.needed(TASK_STUDENT))
    if reads_student_config(ctx.config, found.stages):
        models.student_cfg = found.run(lambda: get_config(m.student_config),
                                       "--student_config: ")
        # As the stage builds it: with the vocab size and casing of the teacher it
        # tokenises as (the plan showed a config's own vocab_size, which no run uses).
        source = models.teacher if builds else models.vocab_model
        if models.student_cfg is not None and source is not None and source.vocab:
            models.student_cfg = models.student_cfg.replace(
                vocab_size=len(source.vocab), lower_case=source.config.lower_case)
    if m.general_model and not m.random_student and distils:
        models.general_model = inspect_flag(found, m.general_model, "--general_model")
        vocab_model = models.vocab_model
        if models.general_model is not None and vocab_model is not None \
                and models.general_model.vocab != vocab_model.vocab:
            found.errors.append(f"--general_model={m.general_model} and the teacher use "
                                "different vocabularies (or special-token ids); distil from a "
                                "teacher with the student's vocab.txt.")
    elif not m.general_given and distils and not builds and ctx.state.is_done(G.NAME):
        models.general_model = found.run(lambda: inspect_model(ctx.general_path()),
                                         f"{ctx.general_path()}: ")
    models.task_student = models.student_cfg if (
        m.random_student or (not m.general_given and builds)) else (
        models.general_model.config if models.general_model is not None else None)


def check_lengths(found: Checks, ctx: Context) -> None:
    """--max_seq_len against the position tables of the models that run at it."""
    if not found.needed(TASK_LENGTH):
        return
    models = found.models
    for info, flag in ((models.teacher, "--teacher"), (models.task_teacher, "--task_teacher"),
                       (models.general_model, "--general_model")):
        if info is None:
            continue
        limit = info.config.max_position_embeddings
        if ctx.max_seq_len > limit:
            found.errors.append(f"--max_seq_len={ctx.max_seq_len} exceeds {flag}'s "
                                f"max_position_embeddings={limit}; lower --max_seq_len.")


def describe(found: Checks) -> dict[str, Any]:
    """The plan's "models": each inspected model's shape and labels."""
    models = found.models
    out = {name: _describe(info) for name, info in
           (("teacher", models.teacher), ("task_teacher", models.task_teacher),
            ("general_model", models.general_model)) if info is not None}
    if models.student_cfg is not None:
        out["student_config"] = models.student_cfg.to_dict()
    return out


def _describe(info: ModelInfo) -> dict[str, Any]:
    c = info.config
    return {"path": info.path, "format": info.format, "head": info.head,
            "labels": info.label_names, "layers": c.num_layers, "hidden_size": c.hidden_size,
            "heads": c.num_heads, "vocab_size": c.vocab_size, "lower_case": c.lower_case}


def _check_task_head(found: Checks, info: ModelInfo, ctx: Context, flag: str) -> None:
    errors = task_head_errors(info, ctx.task, flag)
    found.errors.extend(errors)
    if not errors and ctx.task.type.named_outputs:
        order = found.run(lambda: label_order(
            output_names(info.label_names, ctx.config.models.teacher_label_order,
                         f"{flag}={info.path}"),
            ctx.task.type.label_names, f"{flag}={info.path}"))
        if order is not None:
            found.plan["teacher_label_mapping"] = {
                n: i for n, i in zip(ctx.task.type.label_names, order)}
