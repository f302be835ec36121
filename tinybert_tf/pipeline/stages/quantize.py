"""The quantize stage: quantisation-aware distillation to a full-integer student.

After the task stage, the float task student (OUTPUT/task/model) teaches its own
int8 fake-quantised copy (`BertModel.quantized`, models/quantization.py) on the
task stage's training data:

  1. calibration: every activation range is set to the extremes the float trace
     reaches on --quantize_calibration_examples training rows (the first of the
     first epoch's seeded order), and the
     padded keys' mask value to -(widest real score spread + margin);
  2. distillation (phase "qat", resumable like every phase): --quantize_steps
     steps of --quantize_loss_terms (default the prediction-layer soft
     cross-entropy, Eq. 10; the layer terms with identity projections, the
     teacher having the student's own shape), while the ranges follow each
     batch's by a moving average and gradients pass the fake quantisation
     straight through. With --quantize_lr=0 the weights stay the float
     student's and only the ranges move (forward passes, no gradients): on the
     demo's weak students this kept more of the float student's answers on text
     the stage never saw than training the weights did (docs/deploy.md);
  3. selection (--quantize_eval_every N > 0): every N steps the int8 copy's
     dev answers are compared with the float student's (`TaskType.agreement`,
     the measure of parity.json) and the checkpoint that keeps the most is the
     result, as the task stage keeps its best dev checkpoint. The aim of this
     stage is to keep the float student's answers, so that is what it selects
     by; regression, which has no answers to keep, keeps the last weights.

The result, OUTPUT/quantize/model, is the model the int8 TFLite flavour is
converted from with its learnt ranges (no calibration data at export);
evaluate reports its dev metrics next to the float student's.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from tinybert_tf import files
from tinybert_tf.distill.distiller import Distiller
from tinybert_tf.distill.terms import LossTerm, make_terms, resolve_names
from tinybert_tf.export.common import keras_outputs, output_function
from tinybert_tf.export.formats import FORMATS, ExportContext
from tinybert_tf.models.checkpoint import load_model, save_model
from tinybert_tf.models.heads import HEADS
from tinybert_tf.models.quantization import calibrate
from tinybert_tf.pipeline.run.context import Context, rows
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages.augment import rows_per_example
from tinybert_tf.pipeline.stages.base import (
    AUGMENTED_ROWS,
    TASK_DATA,
    TASK_LENGTH,
    TASK_ROWS,
    TEACHER_VOCAB,
    Findings,
    PlanInputs,
    Stage,
    makes_output,
    sized_on_task_rows,
)
from tinybert_tf.pipeline.stages.common import evaluator, make_distiller, run_training, task_data
from tinybert_tf.pipeline.training import task_input
from tinybert_tf.pipeline.training.loop import Phase, TrainingStateError
from tinybert_tf.pipeline.training.phases import PhaseSpec, plan_phase, reads_augmented

NAME = "quantize"

# Terms the quantize stage may use: its teacher is the float copy of the student.
QUANTIZE_TERMS = ("pred", "embd", "attn", "hidn")


def quantize_terms(ctx: Context) -> list[LossTerm]:
    """--quantize_loss_terms: pred at --temperature, and the layer terms with the
    identity layer map (student and teacher have the same layers)."""
    q, loss = ctx.config.quantize, ctx.config.loss
    names = resolve_names(q.loss_terms, "--quantize_loss_terms", allowed=QUANTIZE_TERMS)
    return make_terms(names, "--quantize_loss_terms", task=ctx.task.type,
                      temperature=loss.temperature, mask_padding=loss.mask_padding)


def quantize_phase(ctx: Context, train_size: int) -> PhaseSpec:
    """--quantize_steps steps over the task stage's training data (the augmented set
    when a task phase reads it), in as many epochs as they take."""
    q = ctx.config.quantize
    per_epoch = train_size // q.batch_size if q.batch_size > 0 else 0
    epochs = math.ceil(q.steps / per_epoch) if per_epoch else 0
    data = "augmented train split" if reads_augmented(ctx.config) else "task train split"
    spec = plan_phase(ctx, NAME, "qat", data, train_size, q.batch_size,
                      "--quantize_batch_size", epochs, q.steps, q.lr, "linear",
                      ctx.config.optim.warmup_proportion, quantize_terms(ctx))
    spec.frozen_weights = ranges_only(ctx)
    spec.note = (f"teacher: the float task student ({ctx.student_path()}); int8 ranges "
                 f"calibrated on {min(q.calibration_examples, train_size)} training rows "
                 "(the first of epoch 1's order); "
                 + ("weights kept: the float student's (--quantize_lr=0), only the ranges "
                    "follow the data; " if spec.frozen_weights else "")
                 + (f"keeps the checkpoint whose dev answers agree most with the float "
                    f"student's (every {q.eval_every} steps)" if selects(ctx)
                    else "keeps the last weights"))
    if selects(ctx):
        spec.set_evaluation(q.eval_every, rows(ctx, ctx.examples(ctx.task.dev_splits[0])))
    return spec



def planned_phase(ctx: Context, n_train: int, per_example: int,
                  n_augmented: Optional[int] = None) -> PhaseSpec:
    """The phase the plan shows: on the `n_augmented` augmented rows when they are
    written (else sized, as the task phases, on their bound: `per_example` rows per
    original row, noted)."""
    if not reads_augmented(ctx.config):
        return quantize_phase(ctx, n_train)
    if n_augmented is not None:
        return quantize_phase(ctx, n_augmented)
    bound = n_train * per_example
    spec = quantize_phase(ctx, bound)
    spec.note += (f"; the augmented set is not written yet: epochs assume at most {bound} "
                  f"rows (the {n_train} original rows with up to {per_example - 1} "
                  "variants each)")
    return spec


def ranges_only(ctx: Context) -> bool:
    """--quantize_lr=0: the int8 copy keeps the float student's weights; its steps only
    move the activation ranges (module docstring, 2.). The one place that reads the
    setting so: the phase carries it as `PhaseSpec.frozen_weights`."""
    return ctx.config.quantize.lr == 0


def selects(ctx: Context) -> bool:
    """Whether the stage keeps its best-agreeing checkpoint (module docstring, 3.)."""
    return ctx.config.quantize.eval_every > 0 and ctx.task.type.has_answers


def quantize(ctx: Context) -> dict[str, Any]:
    """Calibrate, then distil (module docstring); the result is published as
    OUTPUT/quantize/model."""
    q = ctx.config.quantize
    train = ctx.examples("train_aug" if reads_augmented(ctx.config) else "train")
    dev = ctx.examples(ctx.task.dev_splits[0])
    spec = quantize_phase(ctx, rows(ctx, train))
    spec.check()
    with ctx.strategy.scope():
        teacher = load_model(ctx.student_path())
        student = teacher.quantized()
    # The first rows of the first epoch's order: a seeded sample of the data (an
    # augmented file lists each sentence's variants together). Overwritten by the
    # phase's checkpoint when it resumes.
    sample = [train[i] for i in task_input.epoch_rows(
        len(train), 1, ctx.config.numerics.seed, 0)[:q.calibration_examples]]
    calibration = calibrate(student, calibration_batches(ctx, sample))
    print(f"[quantize] {calibration['points']} int8 activation ranges calibrated on "
          f"{len(sample)} rows; padded keys masked with {calibration['mask_value']:.2f}",
          flush=True)
    if spec.frozen_weights:
        # No trainable variable, so no gradient is computed: the steps run the student
        # forward in training mode, where each range moves towards the batch's.
        student.trainable = False
    with ctx.strategy.scope():
        distiller = make_distiller(ctx, student, teacher, spec, ctx.task.type.label_metrics(),
                               prepare=identity_projections)
    evaluate = evaluator(ctx, student, dev)

    def save(metrics: dict[str, float]) -> None:
        if ctx.chief:
            # Written aside; published as quantize/model with the stage's done marker.
            save_model(student, ctx.state.work_path("quantize", "model"),
                       metadata={"stage": "quantize", "float_student": ctx.student_path(),
                                 "dev": metrics, **ctx.task.type.model_metadata(metrics)})

    selection: dict[str, Any] = {}
    if selects(ctx):
        agreement = agreement_meter(ctx, teacher, student, dev)
        selection = dict(select_metric="agreement", on_best=save,
                         eval_every=q.eval_every,
                         evaluate=lambda: {**evaluate(), "agreement": agreement()})
    phase = Phase("qat", spec.directory, distiller, distiller.checkpoint_items(),
                  task_input.phase_input(ctx, train, spec), spec.steps_per_epoch,
                  spec.epochs, max_steps=spec.max_steps,
                  **(selection or dict(evaluate=evaluate)))
    result = run_training(ctx, phase, spec)
    last = {k: v for k, v in (result["evals"][-1] if result["evals"] else {}).items()
            if k != "step"}
    kept = result["best"] if selection and result.get("best") else None
    chosen = {k: v for k, v in (kept or last).items() if k != "step"}
    if kept is None or kept["step"] == result["steps"]:
        save(chosen)  # the weights in memory are the ones to publish
    elif ctx.chief and not files.isdir(ctx.state.work_path("quantize", "model")):
        raise TrainingStateError(
            f"{spec.directory}/phase_state.json keeps step {kept['step']} as the int8 "
            f"student that agrees most with the float one, but its saved model "
            f"({ctx.state.work_path('quantize', 'model')}) is gone; delete {spec.directory} "
            "to run the quantize phase again.")
    if kept is not None:
        print(f"[quantize] kept step {kept['step']}: it agrees with the float student on "
              f"{kept['agreement']:.2%} of dev", flush=True)
    return {"steps": result["steps"], "dev": chosen,
            "kept_step": kept["step"] if kept else result["steps"],
            "mask_value": float(student.quant_ranges.mask_value.numpy()[0])}


def agreement_meter(ctx: Context, teacher, student, examples) -> Callable[[], float]:
    """A function giving the share of `examples` on which `student` answers as
    `teacher` (the float student) does, as parity.json measures it
    (`TaskType.agreement` on the export-space outputs); the teacher's outputs are
    computed once."""
    task = ctx.task.type
    dev_a = [ex.text_a for ex in examples]
    dev_b = [ex.text_b for ex in examples] if ctx.task.is_pair else None
    inputs = task.export_inputs(ctx.tokenizer, dev_a, dev_b, ctx.max_seq_len)
    where = ExportContext(teacher, task, ctx.max_seq_len, bool(ctx.task.is_pair), dev_a,
                          dev_b, inputs)
    batch = ctx.config.run.eval_batch_size
    reference = keras_outputs(teacher, task, inputs, batch)
    run = output_function(student, task)  # traced once, called at every evaluation

    def measure() -> float:
        got = task.agreement(reference, keras_outputs(student, task, inputs, batch, run=run),
                             where)
        return float("nan") if got is None else float(got)
    return measure


def calibration_batches(ctx: Context, examples) -> list[dict[str, np.ndarray]]:
    """Model inputs of `examples` (QA: their windows), in --eval_batch_size batches."""
    ds = ctx.task.type.dataset(examples, ctx.tokenizer, ctx.max_seq_len,
                               ctx.config.run.eval_batch_size)
    return [{k: v.numpy() for k, v in inputs.items()} for inputs, _ in ds]


def identity_projections(distiller: Distiller) -> None:
    """The teacher is the float copy of the student: W_e and W_h are the identity and
    stay so (not trained)."""
    if distiller.projections is None:
        return
    p = distiller.projections
    for layer in [p.embedding_projection, *p.hidden_projections]:
        layer.kernel.assign(np.eye(*layer.kernel.shape, dtype=np.float32))
        layer.trainable = False


def has_quantize_stage(config: PipelineConfig) -> bool:
    """Whether the run makes a quantised student: --quantize, and an export format that
    converts one (int8) among --export_formats. Evaluate and export then read it."""
    return config.quantize.enabled and any(
        FORMATS[f].learnt_ranges for f in config.export.formats if f in FORMATS)


def refusal(config: PipelineConfig) -> Optional[str]:
    """Why --stages may not name the stage: no int8 student is wanted."""
    if has_quantize_stage(config):
        return None
    return ("the quantize stage makes the int8 export's student, and this run has "
            + ("--noquantize" if not config.quantize.enabled else
               f"no int8 in --export_formats={','.join(config.export.formats)}")
            + "; drop quantize from --stages, or give --quantize with int8 in "
            "--export_formats.")


def upstream(config: PipelineConfig) -> list[str]:
    """The float student, and the augmented rows when a task phase reads them."""
    return ["task"] + (["augment"] if makes_output("augment", config) else [])


def checks(ctx: Context, found: Findings) -> None:
    """--quantize_loss_terms, and a student head with an int8 form."""
    c = ctx.config
    found.run(lambda: resolve_names(c.quantize.loss_terms, "--quantize_loss_terms",
                                    allowed=QUANTIZE_TERMS))
    head = found.run(lambda: ctx.student_task_type.head)
    if head in HEADS and not HEADS[head].quantizable:
        found.errors.append(
            f"--classifier_head={c.models.classifier_head}: the student's {head} head "
            "has no int8 form, so the quantize stage (run when --export_formats has "
            "int8) cannot train its int8 copy; add --noquantize (int8 is then "
            "calibrated after training) or use --classifier_head=pooler.")


def phases(ctx: Context, found: Findings, inputs: PlanInputs) -> list[PhaseSpec]:
    return sized_on_task_rows(found, inputs, lambda n_train: planned_phase(
        ctx, n_train, rows_per_example(ctx, inputs.table), inputs.n_augmented))


STAGE = Stage(
    NAME, quantize, reads=lambda ctx: {"data": task_data(ctx)}, phases=phases,
    needs=frozenset({TEACHER_VOCAB, TASK_DATA, TASK_LENGTH, TASK_ROWS, AUGMENTED_ROWS}),
    outputs=lambda ctx: {ctx.quantized_path(): "content"},
    upstream=upstream, skipped=lambda config: not has_quantize_stage(config),
    refusal=refusal, lr_flag="quantize_lr", replaced_by="--noquantize", checks=checks,
    artefacts=lambda ctx: [("int8 student (quantize stage, fake-quantised model directory)",
                            ctx.quantized_path())])
