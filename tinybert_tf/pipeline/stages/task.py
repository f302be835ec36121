"""The task stage (TD): the phases of --task_phases (training/phases.py; by default the
intermediate layers on the (augmented) task data, then the prediction layer), the last
one once per --pred_grid cell; the best dev checkpoint is the task model.

Each phase is first described by a `PhaseSpec` (sizes, batches, steps, schedule,
loss terms) from the configs and the data sizes alone; the dry run prints the same
specs the stage trains with. Task phases give Keras one dataset of global batches
(rows in `task_input.epoch_rows` order, padded or length-bucketed as the phase's
`padding` says), which tf.distribute splits.
"""
from __future__ import annotations

import logging
import posixpath
from typing import Any, Optional

from tinybert_tf import files
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_model, save_model
from tinybert_tf.pipeline.run.context import Context, rows
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.settings.precision import with_precision
from tinybert_tf.pipeline.stages.augment import rows_per_example
from tinybert_tf.pipeline.stages.base import (
    AUGMENTED_ROWS,
    TASK_DATA,
    TASK_LENGTH,
    TASK_ROWS,
    TASK_STUDENT,
    TASK_TEACHER,
    TEACHER_VOCAB,
    Findings,
    PlanInputs,
    Stage,
    makes_output,
)
from tinybert_tf.pipeline.stages.common import (
    evaluator,
    load_task_teacher,
    make_distiller,
    model_path,
    run_training,
    student_config,
    task_data,
)
from tinybert_tf.pipeline.stages.inspect import check_distilled_pair
from tinybert_tf.pipeline.training import (
    baseline_phases,  # noqa: F401  (registers --task_phases=pkd)
    task_input,
)
from tinybert_tf.pipeline.training.loop import Phase
from tinybert_tf.pipeline.training.phases import (
    PhaseSpec,
    general_projections,
    parse_grid,
    phase_kinds,
    projection_start,
    reads_augmented,
    task_phase_specs,
)
from tinybert_tf.pipeline.training.strategy import can_create_variables

log = logging.getLogger("tinybert_tf")

NAME = "task"


def _student_for_task(ctx: Context, teacher: BertModel) -> BertModel:
    head = ctx.student_task_type.head_kwargs()
    if ctx.config.models.random_student:
        config = student_config(ctx, teacher.bert_config, len(teacher.vocab))
        return BertModel(config, vocab=teacher.vocab, **head)
    return load_model(ctx.general_path(), **head)


def task(ctx: Context) -> dict[str, Any]:
    """Task distillation: the phases of --task_phases in order; the last one (once per
    --pred_grid cell) selects the task model on dev."""
    augmented = reads_augmented(ctx.config)
    sets = {False: ctx.examples("train")}
    if augmented:
        sets[True] = ctx.examples("train_aug")
    dev = ctx.examples(ctx.task.dev_splits[0])
    with ctx.strategy.scope():
        # Frozen from here on: computes in --teacher_precision (the plan says why).
        dtype = ctx.config.distill.teacher_precision
        stored = can_create_variables(ctx.strategy, dtype)
        teacher = with_precision(load_task_teacher(ctx), dtype, float32_weights=not stored)
        student = _student_for_task(ctx, teacher)
    kept = "" if stored else (f"; weights kept in float32, cast at each use: this strategy's "
                              f"collectives cannot broadcast {dtype} variables")
    print(f"[task] teacher in {dtype} ({ctx.config.teacher_precision.reason}{kept})",
          flush=True)
    carried, start, warning = general_projections(ctx, student.bert_config,
                                                  teacher.bert_config)
    specs = task_phase_specs(ctx, {k: rows(ctx, v) for k, v in sets.items()}, len(dev),
                             (student.bert_config, teacher.bert_config), start)
    if warning and any(s.projections == "new" for s in specs):
        log.warning(warning)
        print(f"warning: {warning}", flush=True)
    for spec in specs:
        spec.check()
    before = [s for s in specs if s.evaluation is None]
    selecting = [s for s in specs if s.evaluation is not None]
    out: dict[str, Any] = {"train_examples": len(sets[augmented]), "phases": {}}
    captured: dict[bool, tuple] = {}  # the teacher's logits a phase captured, per row set
    for spec in before:
        result, carried = _task_phase(ctx, spec, student, teacher, sets, carried,
                                      captured=captured)
        out["phases"][spec.name] = result["steps"]
    if len(selecting) == 1:
        # The best model so far, written aside; published as task/model with the marker.
        spec = selecting[0]
        result, _ = _task_phase(ctx, spec, student, teacher, sets, carried, dev,
                                ctx.state.work_path("task", "model"), captured=captured)
        out["phases"][spec.name] = result["steps"]
        out["best"] = result["best"]
        return out
    # --pred_grid: every cell from the same student (the phases before, run once).
    start_weights = [v.numpy() for v in student.variables]
    cells = []
    for spec in selecting:
        for variable, value in zip(student.variables, start_weights):
            variable.assign(value)
        result, _ = _task_phase(ctx, spec, student, teacher, sets, carried, dev,
                                posixpath.join(spec.directory, "model"),
                                cache=ctx.state.path("task", f"{spec.kind}_teacher_cache"),
                                captured=captured)
        cells.append({**spec.cell, "phase": spec.name, "steps": result["steps"],
                      "best": result["best"]})
    metric = ctx.task.type.primary_metric
    scored = [c for c in cells if c["best"] is not None]
    if not scored:
        raise RuntimeError("--pred_grid: no cell was evaluated on dev.")
    best = max(scored, key=lambda c: c["best"][metric])  # the first of equals
    for cell in cells:
        cell["selected"] = cell is best
    print(f"[task] --pred_grid: cell batch {best['batch']} lr {best['lr']:g} is best on dev "
          f"({metric} {best['best'][metric]:.4f})", flush=True)
    if ctx.chief:
        chosen = load_model(ctx.state.path("task", best["phase"], "model"))
        save_model(chosen, ctx.state.work_path("task", "model"))
    out.update(best=best["best"], grid=cells)
    return out


def _task_phase(ctx: Context, spec: PhaseSpec, student: BertModel, teacher: BertModel,
                sets: dict[bool, Any], projections: Optional[dict], dev=None,
                model_dir: Optional[str] = None, cache: Optional[str] = None,
                captured: Optional[dict[bool, tuple]] = None
                ) -> tuple[dict[str, Any], Optional[dict]]:
    """Train one task phase; with `dev`, evaluate (every --eval_every steps or epoch)
    and save the best student to `model_dir`. `projections`: W_e/W_h arrays to start
    from; returns the phase's result and the projections the next phase starts from.
    `captured`: {row set: (logits, seen)} of the teacher's logits that phases running
    the teacher live recorded; a later phase's teacher cache takes them."""
    examples = sets[spec.augmented]
    heads = ctx.task.type.label_metrics() if dev is not None else ()
    with ctx.strategy.scope():
        distiller = make_distiller(ctx, student, teacher, spec, heads)
    if distiller.projections is not None and projections is not None:
        distiller.projections.assign(projections)
    if spec.projections:
        print(f"[{spec.name}] projections W_e/W_h: {spec.projections}", flush=True)
    captured = {} if captured is None else captured
    logits = task_input.teacher_logits(ctx, teacher, distiller, examples, spec, cache,
                                       known=captured.get(spec.augmented))
    layers = (task_input.teacher_layers(ctx, teacher, student, examples, spec)
              if logits is None else None)
    # A phase running the teacher live over these rows records its logits on the way.
    sink = (task_input.logit_sink(ctx, distiller, examples, spec)
            if logits is None and layers is None else None)
    selection: dict[str, Any] = {}
    if dev is not None:
        def on_best(metrics):
            if ctx.chief:
                save_model(student, model_dir, metadata={
                    "stage": "task", "dev": metrics, **ctx.trained_on(),
                    **ctx.task.type.model_metadata(metrics)})

        selection = dict(evaluate=evaluator(ctx, student, dev), on_best=on_best,
                         select_metric=ctx.task.type.primary_metric,
                         eval_every=ctx.config.distill.eval_every)
    phase = Phase(spec.name, spec.directory, distiller, distiller.checkpoint_items(),
                  task_input.phase_input(ctx, examples, spec, teacher_logits=logits,
                                         teacher_layers=layers, row_ids=sink is not None),
                  spec.steps_per_epoch, spec.epochs, max_steps=spec.max_steps, **selection)
    result = run_training(ctx, phase, spec)
    if sink is not None:
        seen = sink[1].numpy()
        if seen.any():
            captured[spec.augmented] = (sink[0].numpy(), seen)
    if distiller.projections is not None:
        projections = distiller.projections.arrays()
    return result, projections



def reads(ctx: Context) -> dict[str, Any]:
    m = ctx.config.models
    return {"data": task_data(ctx), "task_teacher": model_path(m.task_teacher),
            "general_model": model_path(m.general_model)}


def upstream(config: PipelineConfig) -> list[str]:
    """The general model, the fine-tuned teacher and the augmented rows, each when
    this run's pipeline makes it (no flag gives it instead)."""
    return [s for s in ("general", "finetune_teacher", "augment") if makes_output(s, config)]


def checks(ctx: Context, found: Findings) -> None:
    """--classifier_head for this task, --pred_grid, --task_phases; a --general_model
    that --student_init=random leaves unread."""
    c = ctx.config
    m, d, models = c.models, c.distill, found.models
    found.run(lambda: ctx.student_task_type)
    found.run(lambda: parse_grid(d.pred_grid))
    kinds = found.run(lambda: phase_kinds(d.task_phases)) or []
    for kind in kinds:
        if kind.epochs(c) == 0:
            found.errors.append(
                f"{kind.epochs_flag or kind.name}=0: the {kind.name} phase of --task_phases="
                f"{','.join(d.task_phases)} would train nothing"
                + (" and leave the task head untrained" if kind is kinds[-1] else "")
                + f"; give epochs > 0, or drop {kind.name} from --task_phases.")
    if m.student_init == "random" and m.general_model:
        found.warnings.append(f"--student_init=random: --general_model={m.general_model} "
                              "is not read (the student starts from random weights).")
    if d.augmented_file and d.use_augmented and not found.runs("augment") \
            and not files.isfile(d.augmented_file):
        found.errors.append(f"--augmented_file={d.augmented_file}: no such file; give the "
                            "augmented file (bin/augment --output, or a run's "
                            "OUTPUT/augment/<file>).")
    if models.task_student is not None and models.task_student is models.student_cfg \
            and ctx.max_seq_len > models.task_student.max_position_embeddings:
        found.errors.append(f"--max_seq_len={ctx.max_seq_len} exceeds --student_config's "
                            "max_position_embeddings="
                            f"{models.task_student.max_position_embeddings} (the task "
                            "stage's student); lower --max_seq_len.")
    teacher = models.vocab_model
    check_distilled_pair(ctx, found, models.task_student,
                         teacher.config if teacher is not None else None)


def phases(ctx: Context, found: Findings, inputs: PlanInputs) -> list[PhaseSpec]:
    """Its phases, sized on the augmented rows when written, else on their bound
    (noted), with the teacher-layer cache's decision where a phase can use one."""
    if inputs.n_train is None:
        return []
    n_train, size, aug = inputs.n_train, inputs.n_train, None
    augmented = reads_augmented(ctx.config)
    if augmented:
        aug, size = inputs.augmented, inputs.n_augmented
    # Not augmented yet: at most `per_example` rows per example. Sizes (and the batch
    # checks) use that bound, not the count before augmentation.
    per_example = rows_per_example(ctx, inputs.table)
    bound = n_train * per_example
    note = ("" if size is not None else "the augmented set is not written yet: sizes "
            f"and steps assume at most {bound} rows (the {n_train} original rows "
            f"with up to {per_example - 1} variants each: --num_aug="
            f"{ctx.config.augment.num_aug} per text field augmented, one field at a "
            "time); the stage sizes itself on the rows written")
    size = bound if size is None and augmented else size
    models, start, warning = inputs.task_models, "new", None
    if models is not None:
        start, warning = projection_start(ctx, *models, inputs.saved_projections)
    specs = found.run(lambda: task_phase_specs(
        ctx, {True: size or n_train, False: n_train},
        len(inputs.dev) if inputs.dev is not None else 0, models, start)) or []
    for spec in specs:
        if note and spec.augmented:
            spec.note = note
        if models is not None:
            # The teacher-layer cache's decision; rows not augmented yet count
            # `per_example` rows per example.
            known = aug if spec.augmented else inputs.train
            scale = float(per_example) if spec.augmented and aug is None else 1.0
            cache = found.run(lambda: task_input.layer_cache_plan(
                ctx, spec, known if known is not None else inputs.train, *models,
                scale=scale))
            if cache is not None and cache.layout is not None:
                spec.extra["teacher_cache"] = cache.describe()
    if warning and any(spec.projections == "new" for spec in specs):
        found.warnings.append(warning)
    return specs


STAGE = Stage(
    NAME, task, reads=reads,
    outputs=lambda ctx: {ctx.student_path(): "content"},
    upstream=upstream, replaced_by="a finished task stage", checks=checks, phases=phases,
    needs=frozenset({TASK_TEACHER, TEACHER_VOCAB, TASK_DATA, TASK_LENGTH, TASK_ROWS,
                     AUGMENTED_ROWS, TASK_STUDENT}),
    artefacts=lambda ctx: [("student (task model directory)", ctx.student_path())])
