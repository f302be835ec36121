"""Task phases' input: each epoch's batches, padded or by length, with the teacher caches.

Padding (`padding_for`). A phase batches by length (tinybert_tf.data.buckets)
when `--length_buckets` > 0, the task type supports it, the strategy allows
dynamic shapes (not TPU), and every loss term of the phase reads real
positions only (`LossTerm.padding_invariant`): then a bucketed batch gives the
phase's loss and update of the same batch padded to max_seq_len (to float
rounding). That holds for teacher fine-tuning and the prediction phase, and
for the intermediate phase only with `--mask_padding`: the reference's
attention and hidden losses count padded positions, so bucketing would change
them, and the phase stays padded. Evaluation and the teachers' caching passes
(`inference_buckets`) bucket whenever `--length_buckets` > 0.

Order (`epoch_rows`). A padded epoch is the permutation seeded by (seed, epoch)
without its last n % batch rows; a bucketed epoch keeps the same rows, grouped
by length (`buckets.grouped_order`). Either is a function of (seed, epoch) and
the rows' lengths alone, so a resume rebuilds the epoch and skips the batches
already trained on. The order is made here in NumPy, not by `Dataset.shuffle`:
tf.distribute rewrites the input graph, and a seeded tf.data shuffle then yields
another order than on one device. Keras splits each global batch over the
replicas, so every replica of a step gets the same bucket length, and the
teacher caches gather their rows in the same order.

Row lengths are computed once per list of examples (`RowLengths`).
"""
from __future__ import annotations

import dataclasses
import posixpath
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data import buckets
from tinybert_tf.distill.terms import LossTerm
from tinybert_tf.pipeline.training import layer_cache
from tinybert_tf.pipeline.training import teacher_cache as cache_lib
from tinybert_tf.pipeline.training.strategy import worker_dir
from tinybert_tf.tasks.base import TaskType


@dataclasses.dataclass(frozen=True)
class Padding:
    """How a phase pads its batches: to `boundaries` (length buckets) or, when empty,
    to max_seq_len; `reason` says why (for the plan)."""

    boundaries: tuple[int, ...]
    reason: str

    def describe(self) -> dict[str, Any]:
        return {"batches": "length buckets" if self.boundaries else "padded to max_seq_len",
                "length_buckets": list(self.boundaries), "why": self.reason}


def _bucket_blocker(config, task_type: TaskType) -> Optional[str]:
    """Why no batch of this run can be bucketed, or None."""
    if config.numerics.length_buckets <= 0:
        return f"--length_buckets={config.numerics.length_buckets}"
    if config.run.strategy == "tpu":
        return "--strategy=tpu: TPUs need one static shape"
    if not task_type.supports_length_buckets:
        return f"the {task_type.kind} task type does not batch by length"
    return None


def padding_for(config, task_type: TaskType, terms: Sequence[LossTerm],
                max_seq_len: int) -> Padding:
    """The padding of a training phase with `terms` (see the module docstring)."""
    blocker = _bucket_blocker(config, task_type)
    if blocker:
        return Padding((), blocker)
    counting = [t.name for t in terms if not t.padding_invariant]
    if counting:
        return Padding((), f"{'/'.join(counting)}: the loss counts padded positions (the "
                       "reference's convention), so bucketing would change it; --mask_padding "
                       "restricts it to real tokens and lets the phase batch by length")
    return Padding(buckets.bucket_boundaries(max_seq_len, config.numerics.length_buckets),
                   "every loss term reads real positions only: a bucketed batch gives the "
                   "loss and update of the padded one")


def inference_buckets(config, task_type: TaskType, max_seq_len: int) -> tuple[int, ...]:
    """Boundaries for evaluation and caching passes (no loss there: outputs at real
    positions do not depend on the padding); () when none."""
    if _bucket_blocker(config, task_type):
        return ()
    return buckets.bucket_boundaries(max_seq_len, config.numerics.length_buckets)


class RowLengths:
    """Real tokens of each row of a list of examples, computed once per list."""

    def __init__(self, task_type: TaskType, tokenizer, max_seq_len: int):
        self.task_type, self.tokenizer, self.max_seq_len = task_type, tokenizer, max_seq_len
        self._known: list[tuple[Sequence[Any], np.ndarray]] = []

    def __call__(self, examples: Sequence[Any]) -> np.ndarray:
        for seen, lengths in self._known:
            if seen is examples:
                return lengths
        lengths = self.task_type.row_lengths(examples, self.tokenizer, self.max_seq_len)
        self._known.append((examples, lengths))
        return lengths


def epoch_rows(n: int, batch_size: int, seed: int, epoch: int,
               lengths: Optional[np.ndarray] = None) -> np.ndarray:
    """The rows of `epoch` in training order, batch after batch (n - n % batch_size of
    them): the epoch permutation, or with `lengths` the same rows grouped by length."""
    if lengths is None:
        return buckets.epoch_permutation(n, seed, epoch)[:n - n % batch_size]
    return buckets.grouped_order(lengths, batch_size, seed, epoch)


def epoch_input(task_type: TaskType, examples: Sequence[Any], tokenizer, max_seq_len: int,
                batch_size: int, seed: int, padding: Padding,
                lengths: Optional[np.ndarray] = None,
                teacher_logits: Optional[np.ndarray] = None,
                teacher_layers: Optional[layer_cache.Cache] = None,
                row_ids: bool = False) -> Callable[[int], tf.data.Dataset]:
    """Epoch -> the epoch's global batches (drop_remainder): padded to max_seq_len, or
    to their length bucket with `padding.boundaries` (then `lengths` are the rows'
    real lengths); with the cached `teacher_logits` / `teacher_layers` rows added,
    and with `row_ids` each row's index into `examples` (`row_id`)."""
    if padding.boundaries and lengths is None:
        raise ValueError("length-bucketed epochs need the rows' lengths")

    # Examples are rows (cut to whole batches here) unless one example gives several
    # rows (QA windows): then the dataset drops the last partial batch of rows itself.
    per_batch = batch_size if cache_lib.one_row_per_example(task_type) else 1

    def make(epoch: int) -> tf.data.Dataset:
        order = epoch_rows(len(examples), per_batch, seed, epoch,
                           lengths if padding.boundaries else None)
        bucketed = {"length_buckets": padding.boundaries} if padding.boundaries else {}
        ds = task_type.dataset([examples[i] for i in order], tokenizer, max_seq_len,
                               batch_size, drop_remainder=True, **bucketed)
        if teacher_logits is not None:
            ds = cache_lib.with_teacher_logits(ds, teacher_logits, order, batch_size)
        if teacher_layers is not None:
            ds = layer_cache.with_teacher_layers(ds, teacher_layers, order, batch_size,
                                                 padding.boundaries)
        if row_ids:
            ds = cache_lib.with_row_ids(ds, order, batch_size)
        return ds
    return make


# --- a task stage's phases (ctx: stages.Context, spec: stages.PhaseSpec) ---------------

def phase_input(ctx: Any, examples: Sequence[Any], spec: Any,
                teacher_logits: Optional[np.ndarray] = None,
                teacher_layers: Optional[layer_cache.Cache] = None,
                row_ids: bool = False) -> Callable[[int], tf.data.Dataset]:
    """`epoch_input` of a phase's spec: its global batch, seed and padding."""
    padding = spec.padding or Padding((), "")
    lengths = ctx.row_lengths(examples) if padding.boundaries else None
    return epoch_input(ctx.task.type, examples, ctx.tokenizer, ctx.max_seq_len,
                       spec.global_batch, ctx.config.numerics.seed, padding, lengths,
                       teacher_logits, teacher_layers, row_ids)


def _phase_done(spec: Any) -> bool:
    return files.isfile(posixpath.join(spec.directory, "phase_done.json"))


def teacher_logits(ctx: Any, teacher, distiller, examples: Sequence[Any], spec: Any,
                   folder: Optional[str] = None,
                   known: Optional[tuple[np.ndarray, np.ndarray]] = None
                   ) -> Optional[np.ndarray]:
    """The teacher's logits of a phase's rows, computed once and kept in `folder`
    (default: the phase's teacher_cache/; --pred_grid cells share one; see
    pipeline/training/teacher_cache.py); None when the cache is off, does not apply to the
    task or the phase's terms, or the phase is finished."""
    if (not ctx.config.run.teacher_cache or spec.total_steps < 1
            or not cache_lib.applies(ctx.task.type, distiller) or _phase_done(spec)):
        return None
    # The teacher's dtype policy: "mixed_bfloat16" where its weights stay float32
    # (multi-worker), whose LayerNorm outputs differ from "bfloat16"'s.
    identity = cache_lib.model_identity(ctx.teacher_path(),
                                        labels=list(ctx.task.type.label_names),
                                        dtype=teacher.dtype_policy.name)
    directory = worker_dir(folder or posixpath.join(spec.directory, cache_lib.CACHE_FOLDER),
                           ctx.strategy)
    return cache_lib.teacher_logits(teacher, examples, ctx.task.type, ctx.tokenizer,
                                    ctx.max_seq_len, ctx.config.run.eval_batch_size,
                                    directory, ctx.strategy, identity,
                                    length_buckets=ctx.inference_buckets, known=known)


def logit_sink(ctx: Any, distiller, examples: Sequence[Any], spec: Any
               ) -> Optional[tuple[tf.Variable, tf.Variable]]:
    """(logits, seen) variables for a phase that runs the teacher live over `examples`
    to capture its logits in (`Distiller.capture_teacher_logits`), so that a later
    phase's teacher cache over the same rows need not run it again; None where that
    cannot apply: the cache is off, examples become several rows, the phase is
    finished, or more than one replica or micro-batch would split the rows."""
    c, task_type = ctx.config, ctx.task.type
    if (not c.run.teacher_cache or not cache_lib.one_row_per_example(task_type)
            or _phase_done(spec) or ctx.strategy.num_replicas_in_sync != 1  # all workers'
            or c.optim.grad_accum_steps != 1
            or not getattr(distiller.teacher, "num_labels", None)):
        return None
    shape = [len(examples), int(distiller.teacher.num_labels)]
    sink = (tf.Variable(tf.zeros(shape), trainable=False, name="teacher_logits"),
            tf.Variable(tf.zeros(shape[:1], tf.bool), trainable=False, name="seen"))
    distiller.capture_teacher_logits(*sink)
    return sink


def layer_cache_plan(ctx: Any, spec: Any, examples: Optional[Sequence[Any]], student_config,
                     teacher_config, scale: float = 1.0) -> layer_cache.Plan:
    """Whether a phase (the intermediate one) keeps the teacher's mapped layers on disk
    (pipeline/training/layer_cache.py): the same decision in the plan and in the stage.
    `scale`: rows per example of `examples` when they stand for rows not written yet."""
    c, task_type = ctx.config, ctx.task.type
    layout = layer_cache.layout(spec.terms, student_config, teacher_config, ctx.max_seq_len)
    lengths = None
    if examples is not None and layout is not None and cache_lib.one_row_per_example(
            task_type):
        lengths = (ctx.row_lengths(examples)
                   if layout.real_length and task_type.supports_length_buckets
                   else np.full(len(examples), ctx.max_seq_len))
    return layer_cache.plan(layout, lengths, spec.epochs, c.run.teacher_cache,
                            c.run.teacher_cache_budget_gb, scale)


def teacher_layers(ctx: Any, teacher, student, examples: Sequence[Any], spec: Any
                   ) -> Optional[layer_cache.Cache]:
    """The teacher's mapped-layer outputs of a phase's rows (the intermediate phase's:
    terms reading only teacher layers), computed once and kept in the phase folder
    when `layer_cache_plan` says so; else None."""
    if _phase_done(spec):
        return None
    plan = layer_cache_plan(ctx, spec, examples, student.bert_config, teacher.bert_config)
    if plan.layout is not None:
        print(f"[{spec.name}] teacher cache: {'used' if plan.use else 'not used'} "
              f"({plan.reason})", flush=True)
    if not plan.use:
        return None
    identity = cache_lib.model_identity(ctx.teacher_path(), dtype=teacher.dtype_policy.name)
    directory = worker_dir(posixpath.join(spec.directory, layer_cache.CACHE_FOLDER),
                           ctx.strategy)
    return layer_cache.build(teacher, plan.layout, examples, ctx.task.type, ctx.tokenizer,
                             ctx.config.run.eval_batch_size, directory, ctx.strategy,
                             identity, boundaries=ctx.inference_buckets)
