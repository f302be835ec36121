"""`Distiller`: a `keras.Model` whose `train_step` distils a teacher into a student.

Like `keras.distillation.Distiller` it holds a frozen `teacher` and a trained
`student`, takes a list of loss objects, is `compile`d with an optimizer and
trained with `fit`; the trained model is `distiller.student`. Unlike it, the
terms (`tinybert_tf.distill.terms`) read every hidden state and attention map,
it owns the learned projections W_e/W_h (and trains the variables a term owns,
such as the NSP classifier), and it owns `train_step` because each
term is averaged over the GLOBAL batch: sum of elements / element count summed
over all replicas and all accumulation micro-batches, so 1 replica, N replicas
and k accumulation steps make the same update. It also clips the global norm
of the full-batch gradient (Keras would clip each replica's part) and applies
loss scaling for float16.

    distiller = Distiller(student=student, teacher=teacher,
                          terms=make_terms("embd,attn,hidn"))
    distiller.compile(optimizer=create_optimizer(5e-5, 1000))
    distiller.fit(dataset)

Data: a dataset of input dicts (`input_word_ids`, `input_mask`,
`input_type_ids`; DistilBERT adds `masked_lm_positions`, `masked_lm_ids`,
`masked_lm_weights`) or of (inputs, labels) tuples; labels reach the terms as
`inputs["labels"]` and update `label_metrics` (e.g. accuracy).

A term that needs no teacher (`hard`, `mlm`) lets `teacher=None`: teacher
fine-tuning is a Distiller with the `hard` term alone.

Teacher outputs in the batch: when every teacher-reading term declares the
outputs it reads (`LossTerm.teacher_outputs`, e.g. the prediction term's
("logits",)) and the batch carries each as `teacher_<name>` (e.g.
`teacher_logits`, float32 [B, labels], computed once per example by the
pipeline's teacher cache), the teacher's forward pass is skipped. A list-valued
output whose terms name the indices they read (`LossTerm.teacher_indices`, e.g.
the mapped layers of `hidden_states`) comes as one key per index,
`teacher_<name>/<i>`, and reaches the terms as {i: tensor}. The choice is made
when the step is traced, from the batch's keys (`teacher_keys`).

Preemption: `watch_stop_requests(request, agreed)` makes every train step
all-reduce the per-worker `request` flag together with the loss counts (no
extra collective) and store the sum in `agreed`, so all workers see a SIGTERM
received by any of them at the same step (see pipeline/training/loop.py).

Static shapes: with fixed-length, drop_remainder batches the train step is
traced once per phase (`train_traces` counts traces), so `jit_compile=True`
compiles it once under XLA. Length-bucketed batches ([B, None] inputs, see
tinybert_tf.data.buckets) trace once too; XLA compiles once per bucket length.

Variables that receive no gradient in a phase (the pooler and classifier in
the intermediate phase) are left out of the optimizer update, so AdamW does
not decay them (as BERT's and the reference's optimizers skip them).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import keras
import tensorflow as tf

from tinybert_tf.distill.keras_compat import MultiWorkerBuildMixin
from tinybert_tf.distill.projections import Projections
from tinybert_tf.distill.terms import LossTerm

# Keys of the batch dict the encoder reads; everything else is for the terms.
MODEL_INPUT_KEYS = ("input_word_ids", "input_mask", "input_type_ids", "masked_lm_positions")
# A batch key `teacher_<output>` holds that teacher output, computed ahead (a cache).
TEACHER_KEY_PREFIX = "teacher_"
_STOP_KEY = "__stop_requests__"
# A batch key: the rows' indices into the phase's examples (int32 [B]), read only
# by the logit capture (`capture_teacher_logits`).
ROW_KEY = "row_id"


def trackable(variables) -> dict[str, Any]:
    """Variables keyed by position, for `tf.train.Checkpoint`.

    The one checkpoint convention of the package. A Keras 3 model's Python
    list of layers is not followed by TF's object graph (only direct layer
    attributes are), so checkpointing the model object silently skips the
    transformer layers (it only seems to work when an optimizer that tracks
    every variable is checkpointed alongside). Listing the variables (weights
    and dropout seed states, in their fixed creation order) saves everything
    and restores by position, whatever Keras names them.
    """
    return {f"v{i:05d}": v for i, v in enumerate(variables)}


def teacher_batch_keys(terms: Sequence[LossTerm]) -> Optional[tuple[str, ...]]:
    """The batch keys that stand in for the teacher's forward pass for built `terms`
    (see the module docstring): `teacher_<output>`, or `teacher_<output>/<i>` for
    each index of a list-valued output when every term that reads it names its
    indices. None when a term does not declare what it reads."""
    terms = [t for t in terms if t.needs_teacher]
    if any(t.teacher_outputs is None for t in terms):
        return None
    reads = sorted({k for t in terms for k in t.teacher_outputs})
    keys: list[str] = []
    for name in reads:
        readers = [t for t in terms if name in (t.teacher_outputs or ())]
        indices = [t.teacher_indices().get(name) for t in readers]
        if readers and all(i is not None for i in indices):
            keys.extend(f"{TEACHER_KEY_PREFIX}{name}/{i}"
                        for i in sorted({i for ix in indices for i in ix}))
        else:
            keys.append(TEACHER_KEY_PREFIX + name)
    return tuple(keys)


def _slice_batch(structure, start, size):
    return tf.nest.map_structure(lambda t: t[start:start + size], structure)


class Distiller(MultiWorkerBuildMixin, keras.Model):
    """Distils `teacher` into `student` (both `tinybert_tf.models.BertModel`) with `terms`.

    Args:
      student: the model to train.
      teacher: frozen, run with training=False outside the gradient tape; may be
        None when no term needs it.
      terms: `LossTerm` instances (see `tinybert_tf.distill.terms.make_terms`).
      clip_norm: global-norm clipping of the full-batch gradient (0/None = off).
      grad_accum_steps: split every replica's batch into this many micro-batches
        and apply one update per batch (the dataset yields the effective batch).
      share_hidden_projection: one W_h for every layer (reference code) or one per layer.
      projection_use_bias: add a bias to W_e/W_h (the reference code does).
      label_metrics: keras metrics updated with (labels, student logits) when
        the data carries labels (e.g. the task type's accuracy).
    """

    def __init__(self, *, student: keras.Model, teacher: Optional[keras.Model] = None,
                 terms: Sequence[LossTerm], clip_norm: Optional[float] = 1.0,
                 grad_accum_steps: int = 1, share_hidden_projection: bool = True,
                 projection_use_bias: bool = False,
                 label_metrics: Sequence[keras.metrics.Metric] = (),
                 name: str = "distiller", **kwargs):
        super().__init__(name=name, **kwargs)
        terms = list(terms)
        if not terms:
            raise ValueError("--loss_terms: the Distiller needs at least one loss term.")
        for term in terms:
            if not isinstance(term, LossTerm):
                raise TypeError(f"terms must be LossTerm instances, got {type(term).__name__} "
                                "(build them with tinybert_tf.distill.make_terms).")
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"--loss_terms: a term appears twice in {names}.")
        for role, model in (("student", student), ("teacher", teacher)):
            if model is not None and not hasattr(model, "bert_config"):
                raise TypeError(f"{role} must be a tinybert_tf.models.BertModel, got "
                                f"{type(model).__name__}.")
        if teacher is None and any(t.needs_teacher for t in terms):
            need = [t.name for t in terms if t.needs_teacher]
            raise ValueError(f"the loss terms {need} compare with a teacher; pass teacher=.")
        self.student = student
        self.teacher = teacher
        if teacher is not None:
            teacher.trainable = False
        for term in terms:
            term.build(student, teacher)
        self.terms = terms
        dropped = {k for t in terms for k in t.drops_model_inputs}
        clash = sorted({k for t in terms for k in t.needs_model_inputs} & dropped)
        if clash:
            raise ValueError(f"the loss terms disagree on model inputs {clash}: one needs them, "
                             "another drops them (build the DistilBERT terms with one "
                             "--restrict_ce_to_mask setting).")
        self.model_input_keys = tuple(k for k in MODEL_INPUT_KEYS if k not in dropped)
        self.clip_norm = float(clip_norm) if clip_norm else 0.0
        if self.clip_norm < 0:
            raise ValueError(f"--clip_norm must be >= 0, got {clip_norm}.")
        if int(grad_accum_steps) < 1:
            raise ValueError(f"--grad_accum_steps must be >= 1, got {grad_accum_steps}.")
        self.grad_accum_steps = int(grad_accum_steps)
        if any(t.needs_projections for t in terms):
            s_cfg, t_cfg = student.bert_config, teacher.bert_config
            self.projections = Projections(
                s_cfg.hidden_size, t_cfg.hidden_size, s_cfg.num_layers,
                share_hidden=share_hidden_projection, use_bias=projection_use_bias,
                dtype=student.dtype_policy)
        else:
            self.projections = None
        # One Mean tracker per term (its weighted contribution) plus the total.
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.term_trackers = {t.name: keras.metrics.Mean(name=f"{t.name}_loss") for t in terms}
        self.label_metrics = list(label_metrics)
        self._no_gradient: Optional[tuple[int, ...]] = None
        # The teacher outputs the terms read (None: unknown, so the teacher always runs).
        reads = [t.teacher_outputs for t in terms if t.needs_teacher]
        self.teacher_reads: Optional[tuple[str, ...]] = (
            None if any(r is None for r in reads)
            else tuple(sorted({k for r in reads for k in r})))
        self.teacher_keys = teacher_batch_keys(terms)
        self._stop_flags: list = []  # [request, agreed] variables, see watch_stop_requests
        self._logit_sink: list = []  # [logits, seen] variables, see capture_teacher_logits
        self.train_traces = 0
        self.built = True

    # --- public helpers ---------------------------------------------------------
    @property
    def loss_terms(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.terms)

    @property
    def projection_variables(self) -> list:
        """W_e / W_h variables (trained, never exported with the student)."""
        return list(self.projections.weights) if self.projections is not None else []

    @property
    def term_variables(self) -> list:
        """Variables the terms own (e.g. the NSP classifier): trained with the student,
        never part of it."""
        return [v for t in self.terms for v in getattr(t, "trainable_weights", ())]

    @property
    def trainable_variables(self) -> list:
        return list(self.student.trainable_variables) + [
            v for v in self.projection_variables if v.trainable] + self.term_variables

    @property
    def trainable_weights(self) -> list:
        return self.trainable_variables

    def checkpoint_items(self, model_key: str = "student") -> dict[str, Any]:
        """What a `tf.train.Checkpoint` must hold to resume (`trackable` variable
        lists; the teacher never changes): the trained model (under `model_key`),
        projections, optimizer."""
        items: dict[str, Any] = {model_key: trackable(self.student.variables)}
        if self.projections is not None:
            items["projections"] = trackable(self.projection_variables)
        if self.term_variables:
            items["terms"] = trackable(self.term_variables)
        if getattr(self, "optimizer", None) is not None:
            items["optimizer"] = self.optimizer
        return items

    def watch_stop_requests(self, request: tf.Variable, agreed: tf.Variable) -> None:
        """Every train step from now on all-reduces `request` (this worker's stop flag,
        float32 scalar, replica-local) with the loss counts and writes the global sum
        to `agreed` (replica-local): > 0 on every worker after the same step."""
        self._stop_flags = [request, agreed]
        self.train_function = None  # retrace with the flags

    def capture_teacher_logits(self, logits: tf.Variable, seen: tf.Variable) -> None:
        """Every train step from now on whose batch carries `row_id` (int32 [B]) and runs
        the teacher stores the teacher's float32 logits of those rows in `logits`
        ([rows, C]) and marks them in `seen` (bool [rows]): a later phase over the same
        rows takes them instead of running the teacher again
        (pipeline/training/teacher_cache.py). Per-position logits are not captured."""
        self._logit_sink = [logits, seen]
        self.train_function = None  # retrace with the capture

    def _capture(self, x, t_out) -> None:
        if not self._logit_sink or ROW_KEY not in x or not isinstance(t_out, dict):
            return
        logits = t_out.get("logits")
        if logits is None or logits.shape.rank != 2:
            return
        rows = tf.cast(x[ROW_KEY], tf.int32)[:, None]
        self._logit_sink[0].scatter_nd_update(rows, tf.cast(logits, tf.float32))
        self._logit_sink[1].scatter_nd_update(rows, tf.ones([tf.shape(rows)[0]], tf.bool))

    def teacher_outputs_in(self, batch_keys) -> bool:
        """Whether a batch with these keys carries every teacher output the terms read."""
        return self.teacher_keys is not None and all(k in batch_keys for k in self.teacher_keys)

    @property
    def metrics(self) -> list:
        return [self.loss_tracker] + list(self.term_trackers.values()) + self.label_metrics

    def call(self, inputs, training=None):
        """Forward pass of the student."""
        return self.student(inputs, training=training)

    def compile(self, optimizer="adamw", jit_compile=False, steps_per_execution: int = 1,
                **kwargs) -> None:
        """Compile with `optimizer`; with a float16 student it is wrapped in a
        `LossScaleOptimizer`. Builds the optimizer now, so a checkpoint can be
        restored before the first step."""
        optimizer = keras.optimizers.get(optimizer)
        if (self.student.dtype_policy.compute_dtype == "float16"
                and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        super().compile(optimizer=optimizer, loss=None, jit_compile=jit_compile,
                        steps_per_execution=steps_per_execution, **kwargs)
        self.optimizer.build(self.trainable_variables)

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "terms": [t.get_config() for t in self.terms],
                "clip_norm": self.clip_norm, "grad_accum_steps": self.grad_accum_steps}

    # --- one batch ------------------------------------------------------------------
    @staticmethod
    def _batch(data) -> dict[str, Any]:
        """The batch as one dict: model inputs, extra keys, and `labels` when given."""
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        if not isinstance(x, dict) or "input_word_ids" not in x:
            raise ValueError("Distiller expects input dicts with `input_word_ids`, "
                             "`input_mask`, `input_type_ids` (optionally as (inputs, labels)).")
        x = dict(x)
        if isinstance(y, dict):
            for key, value in y.items():
                x.setdefault(key, value)
        elif y is not None:
            x["labels"] = y
        if "input_mask" not in x:
            x["input_mask"] = tf.ones_like(x["input_word_ids"])
        return x

    def _model_inputs(self, x):
        return {k: x[k] for k in self.model_input_keys if k in x}

    def _teacher_outputs(self, x):
        if self.teacher is None:
            return None
        if self.teacher_outputs_in(x):
            out: dict[str, Any] = {}
            for key in self.teacher_keys:
                name, _, index = key[len(TEACHER_KEY_PREFIX):].partition("/")
                value = tf.stop_gradient(x[key])
                if index:
                    out.setdefault(name, {})[int(index)] = value
                else:
                    out[name] = value
            return out
        out = self.teacher(self._model_inputs(x), training=False)
        return tf.nest.map_structure(tf.stop_gradient, out)

    def _global_counts(self, x, extra: Optional[dict] = None) -> dict[str, tf.Tensor]:
        """Each term's element count summed over replicas (plus `extra` scalars, summed
        in the same all-reduce)."""
        counts = {t.name: tf.cast(t.count(x), tf.float32) for t in self.terms}
        counts.update(extra or {})
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            counts = ctx.all_reduce(tf.distribute.ReduceOp.SUM, counts)
        return counts

    def _terms(self, x, s_out, t_out, counts) -> dict[str, tf.Tensor]:
        """Each term's share of its global mean from this (micro-)batch."""
        return {t.name: tf.math.divide_no_nan(
            tf.cast(t.sum(x, s_out, t_out, self.projections), tf.float32), counts[t.name])
            for t in self.terms}

    def compute_losses(self, data, training: bool = False) -> dict[str, tf.Tensor]:
        """Every term (weighted) and "loss", their sum, for one batch, without
        touching metrics or weights."""
        x = self._batch(data)
        counts = self._global_counts(x)
        t_out = self._teacher_outputs(x)
        s_out = self.student(self._model_inputs(x), training=training)
        out = self._terms(x, s_out, t_out, counts)
        out["loss"] = tf.add_n(list(out.values()))
        return out

    # --- training -------------------------------------------------------------------
    def _loss_scale(self):
        opt = self.optimizer
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            return tf.cast(opt.dynamic_scale, tf.float32)
        factor = getattr(opt, "loss_scale_factor", None)
        return tf.constant(float(factor) if factor else 1.0)

    def _micro_step(self, x, counts, variables, scale):
        """Gradients (of the scaled loss) and term losses of one micro-batch.

        Records, at trace time, which variables get no gradient from these
        terms; they are left out of the update (see the module docstring).
        """
        t_out = self._teacher_outputs(x)
        self._capture(x, t_out)
        with tf.GradientTape() as tape:
            s_out = self.student(self._model_inputs(x), training=True)
            terms = self._terms(x, s_out, t_out, counts)
            scaled = tf.add_n(list(terms.values())) * scale
        grads = tape.gradient(scaled, variables)
        self._no_gradient = tuple(i for i, g in enumerate(grads) if g is None)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, variables)]
        return grads, terms, s_out

    def _accumulate(self, x, counts, variables, scale):
        """k micro-batches of this replica's batch; returns summed gradients and terms."""
        k = self.grad_accum_steps
        batch = tf.shape(x["input_word_ids"])[0]
        static_batch = x["input_word_ids"].shape[0]
        if static_batch is not None and static_batch % k == 0:
            # Static split (XLA-friendly): [B, ...] -> [k, B/k, ...], index i. Unknown
            # dims (a length-bucketed batch's length) are read at run time.
            def split_rows(t):
                dims = [d if d is not None else tf.shape(t)[j + 1]
                        for j, d in enumerate(t.shape.as_list()[1:])]
                return tf.reshape(t, [k, static_batch // k] + dims)
            split = tf.nest.map_structure(split_rows, x)
            take = lambda i: tf.nest.map_structure(lambda t: t[i], split)  # noqa: E731
        else:
            size = (batch + k - 1) // k
            take = lambda i: _slice_batch(x, i * size, size)  # noqa: E731
        zeros_g = [tf.zeros(v.shape, tf.float32) for v in variables]
        zeros_t = {t.name: tf.constant(0.0) for t in self.terms}

        def body(i, acc_g, acc_t):
            grads, terms, _ = self._micro_step(take(i), counts, variables, scale)
            acc_g = [a + tf.cast(g, tf.float32) for a, g in zip(acc_g, grads)]
            acc_t = {t: acc_t[t] + terms[t] for t in acc_t}
            return i + 1, acc_g, acc_t

        _, grads, terms = tf.while_loop(lambda i, *_: i < k, body,
                                        (tf.constant(0), zeros_g, zeros_t))
        return grads, terms

    def _apply(self, grads, variables, scale):
        """All-reduce (when clipping across replicas), clip the full-batch
        gradient by global norm, apply to the variables that have a gradient."""
        if not variables:  # a frozen student (the quantize stage's ranges-only steps)
            return
        ctx = tf.distribute.get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        reduced = False
        if self.clip_norm > 0 and replicas > 1:
            # Clip the norm of the SUM over replicas, not of each replica's part.
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            reduced = True
        if self.clip_norm > 0:
            unscaled = [g / tf.cast(scale, g.dtype) for g in grads]
            clipped, _ = tf.clip_by_global_norm(unscaled, self.clip_norm)
            grads = [g * tf.cast(scale, g.dtype) for g in clipped]
        if reduced:
            # The optimizer sums over replicas again; every replica holds the full sum.
            grads = [g / float(replicas) for g in grads]
        skip = set(self._no_gradient or ())
        pairs = [(g, v) for i, (g, v) in enumerate(zip(grads, variables)) if i not in skip]
        if pairs:
            self.optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])

    def _update_metrics(self, terms, x, s_logits):
        ctx = tf.distribute.get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        # Metrics average over replicas; each replica's term is its share of the
        # global mean, so scale by the replica count (keras' unscale_loss_for_distribution).
        total = tf.add_n(list(terms.values()))
        self.loss_tracker.update_state(total * float(replicas))
        for name, tracker in self.term_trackers.items():
            tracker.update_state(terms[name] * float(replicas))
        if self.label_metrics and "labels" in x and s_logits is not None:
            for metric in self.label_metrics:
                metric.update_state(x["labels"], tf.cast(s_logits, tf.float32))
        return {m.name: m.result() for m in self.metrics}

    def train_step(self, data):
        self.train_traces += 1  # Python: runs when the step is traced, not per step
        x = self._batch(data)
        variables = self.trainable_variables
        extra = {}
        if self._stop_flags:
            extra[_STOP_KEY] = tf.cast(self._stop_flags[0].read_value(), tf.float32)
        counts = self._global_counts(x, extra)
        if self._stop_flags:
            self._stop_flags[1].assign(counts.pop(_STOP_KEY))
        scale = self._loss_scale()
        if self.grad_accum_steps == 1:
            grads, terms, s_out = self._micro_step(x, counts, variables, scale)
            s_logits = s_out.get("logits")
        else:
            grads, terms = self._accumulate(x, counts, variables, scale)
            s_logits = None
            if self.label_metrics and "labels" in x:
                s_logits = self.student(self._model_inputs(x), training=False).get("logits")
        self._apply(grads, variables, scale)
        return self._multi_worker_logs(self._update_metrics(terms, x, s_logits))

    def test_step(self, data):
        x = self._batch(data)
        counts = self._global_counts(x)
        t_out = self._teacher_outputs(x)
        s_out = self.student(self._model_inputs(x), training=False)
        terms = self._terms(x, s_out, t_out, counts)
        return self._multi_worker_logs(self._update_metrics(terms, x, s_out.get("logits")))
