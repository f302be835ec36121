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
     straight through.

The result, OUTPUT/quantize/model, is the model the int8 TFLite flavour is
converted from with its learnt ranges (no calibration data at export);
evaluate reports its dev metrics next to the float student's.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinybert_tf.distill.distiller import Distiller
from tinybert_tf.distill.terms import LossTerm, make_terms, resolve_names
from tinybert_tf.models.checkpoint import load_model, save_model
from tinybert_tf.models.quantization import calibrate
from tinybert_tf.pipeline.phases import PhaseSpec, reads_augmented
from tinybert_tf.pipeline.stages import (
    Context,
    _distiller,
    _evaluator,
    _phase,
    _run,
    _task_dataset,
    epoch_order,
    rows,
)
from tinybert_tf.pipeline.training import Phase

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
    spec = _phase(ctx, "quantize", "qat", data, train_size, q.batch_size,
                  "--quantize_batch_size", epochs, q.steps, q.lr, "linear",
                  ctx.config.optim.warmup_proportion, quantize_terms(ctx))
    spec.note = (f"teacher: the float task student ({ctx.student_path()}); int8 ranges "
                 f"calibrated on {min(q.calibration_examples, train_size)} training rows "
                 "(the first of epoch 1's order)")
    return spec


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
    sample = epoch_order(train, ctx.config.numerics.seed, 0)[:q.calibration_examples]
    calibration = calibrate(student, calibration_batches(ctx, sample))
    print(f"[quantize] {calibration['points']} int8 activation ranges calibrated on "
          f"{len(sample)} rows; padded keys masked with {calibration['mask_value']:.2f}",
          flush=True)
    with ctx.strategy.scope():
        distiller = _distiller(ctx, student, teacher, spec, ctx.task.type.label_metrics(),
                               prepare=identity_projections)
    phase = Phase("qat", spec.directory, distiller, distiller.checkpoint_items(),
                  _task_dataset(ctx, train, spec.global_batch), spec.steps_per_epoch,
                  spec.epochs, max_steps=spec.max_steps,
                  evaluate=_evaluator(ctx, student, dev))
    result = _run(ctx, phase)
    last = {k: v for k, v in (result["evals"][-1] if result["evals"] else {}).items()
            if k != "step"}
    if ctx.chief:
        # Written aside; published as quantize/model with the stage's done marker.
        save_model(student, ctx.state.work_path("quantize", "model"),
                   metadata={"stage": "quantize", "float_student": ctx.student_path(),
                             "dev": last, **ctx.task.type.model_metadata(last)})
    return {"steps": result["steps"], "dev": last,
            "mask_value": float(student.quant_ranges.mask_value.numpy()[0])}


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
