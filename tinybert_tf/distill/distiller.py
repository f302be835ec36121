"""`Distiller`: a `keras.Model` whose `train_step` distils a teacher into a student.

Like `keras.distillation.Distiller` it holds a frozen `teacher` and a trained
`student`, is `compile`d with an optimizer and trained with `fit`; the trained
model is `distiller.student`. Unlike it, the losses are TinyBERT's layer-wise
losses (or DistilBERT's), which need every hidden state and attention map, and
it adds learned projections, global-batch loss averaging under any
`tf.distribute` strategy, global-norm clipping of the full-batch gradient,
in-step gradient accumulation and loss scaling.

Phases:
  "intermediate" (alias "general"): embd + attn + hidn (paper's GD and the first
                 step of task distillation).
  "prediction":  pred only (soft cross-entropy, or MSE for regression).
  "distilbert":  alpha_ce * L_ce + alpha_mlm * L_mlm + alpha_cos * L_cos.
`loss_terms` overrides a phase's default terms (the paper's ablations).

Data: `fit` takes a dataset of input dicts (`input_word_ids`, `input_mask`,
`input_type_ids`; DistilBERT adds `masked_lm_positions`, `masked_lm_ids`,
`masked_lm_weights`) or of (inputs, labels) tuples. Labels never enter the
distillation loss; in the prediction phase they feed an `accuracy` metric.

Normalisation: each term is sum-of-elements / element-count where the count is
taken over the GLOBAL batch (all replicas and all accumulation micro-batches),
so 1 replica, N replicas and k accumulation steps make the same update.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import keras
import tensorflow as tf

from tinybert_tf.distill import losses
from tinybert_tf.distill.keras_compat import MultiWorkerBuildMixin
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.projections import Projections

PHASES = ("intermediate", "general", "prediction", "distilbert")
TINYBERT_TERMS = ("embd", "attn", "hidn", "pred")
DISTILBERT_TERMS = ("ce", "mlm", "cos")
_DEFAULT_TERMS = {"intermediate": ("embd", "attn", "hidn"), "general": ("embd", "attn", "hidn"),
                  "prediction": ("pred",), "distilbert": DISTILBERT_TERMS}
MLM_KEYS = ("masked_lm_ids", "masked_lm_weights")


def parse_loss_terms(terms: Union[str, Sequence[str], None], phase: str) -> tuple[str, ...]:
    """Normalise `--loss_terms` ("trm" = attn + hidn) and validate it for `phase`."""
    if terms is None or (not isinstance(terms, str) and len(terms) == 0):
        return _DEFAULT_TERMS[phase]
    if isinstance(terms, str):
        terms = [t for t in terms.split(",")]
    allowed = DISTILBERT_TERMS if phase == "distilbert" else TINYBERT_TERMS
    out: list[str] = []
    for raw in terms:
        term = raw.strip().lower()
        expanded = ("attn", "hidn") if term == "trm" else (term,)
        for t in expanded:
            if t not in allowed:
                raise ValueError(
                    f"--loss_terms: unknown term {raw!r} for phase {phase!r}; use any of "
                    f"{', '.join(allowed)}" + (" ('trm' = attn,hidn)." if phase != "distilbert"
                                               else "."))
            if t not in out:
                out.append(t)
    return tuple(out)


def _slice_batch(structure, start, size):
    return tf.nest.map_structure(lambda t: t[start:start + size], structure)


class Distiller(MultiWorkerBuildMixin, keras.Model):
    """Distils `teacher` into `student` (both `tinybert_tf.models.BertModel`).

    Args:
      student: the model to train (a classifier/regressor head for the
        prediction phase, an MLM head for DistilBERT's L_ce/L_mlm).
      teacher: frozen; run with training=False outside the gradient tape.
      phase: "intermediate" | "general" | "prediction" | "distilbert".
      loss_terms: terms to use (default: the phase's); "trm" = attn + hidn.
      layer_mapping: see `tinybert_tf.distill.mapping.layer_map`.
      layer_weights: lambda_m for m = 0 (embd), 1..M (attn, hidn), M+1 (pred);
        M + 2 numbers, default all 1.
      share_hidden_projection: one W_h for all layers (reference) or one per layer.
      mask_padding: restrict intermediate losses to real tokens (deviation from
        the reference; see docs/distillation.md).
      temperature: softmax temperature of the prediction loss / DistilBERT's L_ce.
      is_regression: MSE prediction loss; default: student head is "regressor".
      clip_norm: global-norm clipping of the full-batch gradient (0/None = off).
      grad_accum_steps: split every replica's batch into this many micro-batches
        and apply one update per batch (the dataset yields the effective batch).
      alpha_ce, alpha_mlm, alpha_cos: DistilBERT's loss weights.
      projection_use_bias: add a bias to W_e/W_h (the reference code does).
    """

    def __init__(self, student: keras.Model, teacher: keras.Model,
                 phase: str = "intermediate",
                 loss_terms: Union[str, Sequence[str], None] = None,
                 layer_mapping: Union[str, Sequence[int]] = "uniform",
                 layer_weights: Optional[Sequence[float]] = None,
                 share_hidden_projection: bool = True, mask_padding: bool = False,
                 temperature: float = 1.0, is_regression: Optional[bool] = None,
                 clip_norm: Optional[float] = 1.0, grad_accum_steps: int = 1,
                 alpha_ce: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0,
                 projection_use_bias: bool = False, name: str = "distiller", **kwargs):
        super().__init__(name=name, **kwargs)
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}.")
        for role, model in (("student", student), ("teacher", teacher)):
            if not hasattr(model, "bert_config"):
                raise TypeError(f"{role} must be a tinybert_tf.models.BertModel, got "
                                f"{type(model).__name__}.")
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.phase = "intermediate" if phase == "general" else phase
        self.loss_terms = parse_loss_terms(loss_terms, phase)
        s_cfg, t_cfg = student.bert_config, teacher.bert_config
        self.num_student_layers, self.num_teacher_layers = s_cfg.num_layers, t_cfg.num_layers
        self.mask_padding = bool(mask_padding)
        self.temperature = float(temperature)
        if self.temperature <= 0:
            raise ValueError(f"--temperature must be > 0, got {temperature}.")
        self.is_regression = (student.head_type == "regressor" if is_regression is None
                              else bool(is_regression))
        self.clip_norm = float(clip_norm) if clip_norm else 0.0
        if self.clip_norm < 0:
            raise ValueError(f"--clip_norm must be >= 0, got {clip_norm}.")
        if int(grad_accum_steps) < 1:
            raise ValueError(f"--grad_accum_steps must be >= 1, got {grad_accum_steps}.")
        self.grad_accum_steps = int(grad_accum_steps)
        self.alphas = {"ce": float(alpha_ce), "mlm": float(alpha_mlm), "cos": float(alpha_cos)}
        self.layer_mapping = layer_map(layer_mapping, s_cfg.num_layers, t_cfg.num_layers)
        m = s_cfg.num_layers
        if layer_weights is None or len(layer_weights) == 0:
            self.layer_weights = [1.0] * (m + 2)
        else:
            if len(layer_weights) != m + 2:
                raise ValueError(
                    f"--layer_weights: expected {m + 2} numbers (lambda_0 for embeddings, "
                    f"lambda_1..lambda_{m} for the student layers, lambda_{m + 1} for the "
                    f"prediction layer), got {len(layer_weights)}.")
            self.layer_weights = [float(w) for w in layer_weights]
        self.attention_heads = losses.attention_heads(s_cfg.num_heads, t_cfg.num_heads)
        self._validate_heads()
        # W_e / W_h (TinyBERT) or the cosine-loss projection (DistilBERT, widths differ).
        needs_proj = (self.phase != "distilbert"
                      and any(t in self.loss_terms for t in ("embd", "hidn")))
        needs_cos_proj = (self.phase == "distilbert" and "cos" in self.loss_terms
                          and s_cfg.hidden_size != t_cfg.hidden_size)
        if needs_proj or needs_cos_proj:
            self.projections = Projections(
                s_cfg.hidden_size, t_cfg.hidden_size, m, share_hidden=share_hidden_projection,
                use_bias=projection_use_bias, dtype=student.dtype_policy)
        else:
            self.projections = None
        # One Mean tracker per term (its weighted contribution) plus the total.
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.term_trackers = {t: keras.metrics.Mean(name=f"{t}_loss") for t in self.loss_terms}
        self.accuracy_tracker = (keras.metrics.SparseCategoricalAccuracy(name="accuracy")
                                 if self.phase == "prediction" and not self.is_regression
                                 else None)
        self.built = True

    # --- validation -------------------------------------------------------------
    def _validate_heads(self) -> None:
        s, t = self.student, self.teacher
        if self.phase == "distilbert":
            if ("ce" in self.loss_terms or "mlm" in self.loss_terms) and s.head_type != "mlm":
                raise ValueError("the DistilBERT recipe's L_ce/L_mlm need a student with an MLM "
                                 "head (BertModel(config, head='mlm')).")
            if "ce" in self.loss_terms and t.head_type != "mlm":
                raise ValueError(
                    "the DistilBERT recipe's L_ce needs a teacher with an MLM head, and this "
                    "teacher has none (e.g. the embedded all-MiniLM-L6-v2); load a teacher "
                    "with `cls.predictions.*` weights or set --alpha_ce=0.")
            if "ce" in self.loss_terms and (s.bert_config.vocab_size
                                            != t.bert_config.vocab_size):
                raise ValueError(f"L_ce needs one vocabulary: student vocab_size="
                                 f"{s.bert_config.vocab_size}, teacher "
                                 f"{t.bert_config.vocab_size}.")
            return
        if "pred" in self.loss_terms:
            for role, model in (("student", s), ("teacher", t)):
                if model.head_type not in ("classifier", "regressor"):
                    raise ValueError(f"the prediction loss needs a {role} with a classifier or "
                                     f"regressor head (got head={model.head_type!r}).")
            if s.num_labels != t.num_labels:
                raise ValueError(f"student has {s.num_labels} outputs, teacher "
                                 f"{t.num_labels}; they must predict the same labels.")

    # --- public helpers ---------------------------------------------------------
    @property
    def projection_variables(self) -> list:
        """W_e / W_h variables (trained, never exported with the student)."""
        return list(self.projections.weights) if self.projections is not None else []

    @property
    def trainable_variables(self) -> list:
        return list(self.student.trainable_variables) + [
            v for v in self.projection_variables if v.trainable]

    @property
    def trainable_weights(self) -> list:
        return self.trainable_variables

    def checkpoint_items(self) -> dict[str, Any]:
        """What a `tf.train.Checkpoint` must hold to resume (the teacher is not
        included: it never changes): student, projections, optimizer."""
        items: dict[str, Any] = {"student": self.student}
        if self.projections is not None:
            items["projections"] = self.projections
        if getattr(self, "optimizer", None) is not None:
            items["optimizer"] = self.optimizer
        return items

    @property
    def metrics(self) -> list:
        out = [self.loss_tracker] + list(self.term_trackers.values())
        if self.accuracy_tracker is not None:
            out.append(self.accuracy_tracker)
        return out

    def call(self, inputs, training=None):
        """Forward pass of the student."""
        return self.student(inputs, training=training)

    def compile(self, optimizer="adamw", jit_compile: Union[bool, str] = False,
                steps_per_execution: int = 1, **kwargs) -> None:
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

    # --- losses -------------------------------------------------------------------
    def _labels_and_inputs(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        if not isinstance(x, dict) or "input_word_ids" not in x:
            raise ValueError("Distiller expects input dicts with `input_word_ids`, "
                             "`input_mask`, `input_type_ids` (optionally as (inputs, labels)).")
        if self.phase == "distilbert":
            x = dict(x)
            for key in MLM_KEYS:
                if key not in x and isinstance(y, dict) and key in y:
                    x[key] = y[key]
            if "mlm" in self.loss_terms and "masked_lm_ids" not in x:
                raise ValueError("the DistilBERT recipe needs `masked_lm_positions` and "
                                 "`masked_lm_ids` (and `masked_lm_weights`) in the inputs.")
            y = None
        if "input_mask" not in x:
            x = dict(x)
            x["input_mask"] = tf.ones_like(x["input_word_ids"])
        return x, y

    @staticmethod
    def _model_inputs(x):
        keys = ("input_word_ids", "input_mask", "input_type_ids", "masked_lm_positions")
        return {k: x[k] for k in keys if k in x}

    def _local_counts(self, x) -> dict[str, tf.Tensor]:
        """Per-term element counts of this replica's whole batch (see losses)."""
        mask = x["input_mask"]
        t_width = self.teacher.bert_config.hidden_size
        counts = {}
        for term in self.loss_terms:
            if term in ("embd", "hidn"):
                counts[term] = losses.hidden_count(mask, t_width, self.mask_padding)
            elif term == "attn":
                counts[term] = losses.attention_count(mask, self.attention_heads,
                                                      self.mask_padding)
            elif term == "pred":
                rows = tf.cast(tf.shape(mask)[0], tf.float32)
                counts[term] = rows * float(self.student.num_labels) if self.is_regression \
                    else rows
            elif term in ("ce", "mlm"):
                w = x.get("masked_lm_weights")
                if w is None:
                    w = tf.ones(tf.shape(x["masked_lm_positions"]), tf.float32)
                counts[term] = tf.reduce_sum(tf.cast(w, tf.float32))
            elif term == "cos":
                counts[term] = tf.reduce_sum(tf.cast(mask, tf.float32))
        return counts

    def _term_sums(self, x, s_out, t_out) -> dict[str, tf.Tensor]:
        """Weighted per-term numerators (reduction="sum") for one (micro-)batch."""
        mask = x["input_mask"]
        lam, g = self.layer_weights, self.layer_mapping
        hid_mask = mask if self.mask_padding else None
        sums = {}
        if "embd" in self.loss_terms:
            sums["embd"] = lam[0] * losses.hidden_loss(
                self.projections.embedding(s_out["embeddings"]), t_out["embeddings"],
                hid_mask, reduction="sum")
        if "attn" in self.loss_terms:
            sums["attn"] = tf.add_n([
                lam[m] * losses.attention_loss(
                    s_out["attention_scores"][m - 1], t_out["attention_scores"][g[m] - 1],
                    mask, reduction="sum", mask_queries=self.mask_padding)
                for m in range(1, self.num_student_layers + 1)])
        if "hidn" in self.loss_terms:
            sums["hidn"] = tf.add_n([
                lam[m] * losses.hidden_loss(
                    self.projections.hidden(m, s_out["hidden_states"][m]),
                    t_out["hidden_states"][g[m]], hid_mask, reduction="sum")
                for m in range(1, self.num_student_layers + 1)])
        if "pred" in self.loss_terms:
            fn = (losses.prediction_mse(s_out["logits"], t_out["logits"], reduction="sum")
                  if self.is_regression else
                  losses.soft_cross_entropy(s_out["logits"], t_out["logits"],
                                            self.temperature, reduction="sum"))
            sums["pred"] = lam[-1] * fn
        weights = x.get("masked_lm_weights")
        if "ce" in self.loss_terms:
            sums["ce"] = self.alphas["ce"] * losses.distilbert_ce(
                s_out["logits"], t_out["logits"], weights, self.temperature, reduction="sum")
        if "mlm" in self.loss_terms:
            sums["mlm"] = self.alphas["mlm"] * losses.mlm_loss(
                s_out["logits"], x["masked_lm_ids"], weights, reduction="sum")
        if "cos" in self.loss_terms:
            s_last = s_out["sequence_output"]
            if self.projections is not None:
                s_last = self.projections.hidden(self.num_student_layers, s_last)
            sums["cos"] = self.alphas["cos"] * losses.cosine_loss(
                s_last, t_out["sequence_output"], mask, reduction="sum")
        return sums

    def _teacher_outputs(self, x):
        out = self.teacher(self._model_inputs(x), training=False)
        return tf.nest.map_structure(tf.stop_gradient, out)

    def _global_counts(self, x):
        counts = self._local_counts(x)
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            counts = ctx.all_reduce(tf.distribute.ReduceOp.SUM, counts)
        return counts

    def compute_losses(self, data, training: bool = False) -> dict[str, tf.Tensor]:
        """Every term of the phase (weighted; disabled TinyBERT terms are 0) and
        "loss", their sum, for one batch, without touching metrics or weights."""
        x, _ = self._labels_and_inputs(data)
        counts = self._global_counts(x)
        t_out = self._teacher_outputs(x)
        s_out = self.student(self._model_inputs(x), training=training)
        sums = self._term_sums(x, s_out, t_out)
        terms = {t: tf.math.divide_no_nan(sums[t], counts[t]) for t in sums}
        all_terms = DISTILBERT_TERMS if self.phase == "distilbert" else TINYBERT_TERMS
        out = {t: terms.get(t, tf.constant(0.0)) for t in all_terms}
        out["loss"] = tf.add_n(list(terms.values()))
        return out

    # --- training -------------------------------------------------------------------
    def _loss_scale(self):
        opt = self.optimizer
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            return tf.cast(opt.dynamic_scale, tf.float32)
        factor = getattr(opt, "loss_scale_factor", None)
        return tf.constant(float(factor) if factor else 1.0)

    def _micro_step(self, x, counts, variables, scale):
        """Gradients (of the scaled loss) and term losses of one micro-batch."""
        t_out = self._teacher_outputs(x)
        with tf.GradientTape() as tape:
            s_out = self.student(self._model_inputs(x), training=True)
            sums = self._term_sums(x, s_out, t_out)
            terms = {t: tf.math.divide_no_nan(sums[t], counts[t]) for t in sums}
            loss = tf.add_n(list(terms.values()))
            scaled = loss * scale
        grads = tape.gradient(scaled, variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, variables)]
        return grads, terms, s_out

    def _accumulate(self, x, counts, variables, scale):
        """k micro-batches of this replica's batch; returns summed gradients and terms."""
        k = self.grad_accum_steps
        batch = tf.shape(x["input_word_ids"])[0]
        static_batch = x["input_word_ids"].shape[0]
        if static_batch is not None and static_batch % k == 0:
            # Static split (XLA-friendly): [B, ...] -> [k, B/k, ...], index i.
            split = tf.nest.map_structure(
                lambda t: tf.reshape(t, [k, static_batch // k] + t.shape.as_list()[1:]), x)
            take = lambda i: tf.nest.map_structure(lambda t: t[i], split)  # noqa: E731
        else:
            size = (batch + k - 1) // k
            take = lambda i: _slice_batch(x, i * size, size)  # noqa: E731
        zeros_g = [tf.zeros(v.shape, tf.float32) for v in variables]
        zeros_t = {t: tf.constant(0.0) for t in self.loss_terms}

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
        gradient by global norm, apply."""
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
        self.optimizer.apply(grads, variables)

    def _update_metrics(self, terms, y, s_logits):
        ctx = tf.distribute.get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        # Metrics average over replicas; each replica's term is its share of the
        # global mean, so scale by the replica count (keras' unscale_loss_for_distribution).
        total = tf.add_n(list(terms.values()))
        self.loss_tracker.update_state(total * float(replicas))
        for t, tracker in self.term_trackers.items():
            tracker.update_state(terms[t] * float(replicas))
        if self.accuracy_tracker is not None and y is not None and s_logits is not None:
            labels = tf.reshape(tf.cast(y, tf.int32), [-1])
            self.accuracy_tracker.update_state(labels, tf.cast(s_logits, tf.float32))
        return {m.name: m.result() for m in self.metrics}

    def train_step(self, data):
        x, y = self._labels_and_inputs(data)
        variables = self.trainable_variables
        counts = self._global_counts(x)
        scale = self._loss_scale()
        if self.grad_accum_steps == 1:
            grads, terms, s_out = self._micro_step(x, counts, variables, scale)
            s_logits = s_out.get("logits")
        else:
            grads, terms = self._accumulate(x, counts, variables, scale)
            s_logits = None
            if self.accuracy_tracker is not None and y is not None:
                s_logits = self.student(self._model_inputs(x), training=False)["logits"]
        self._apply(grads, variables, scale)
        return self._multi_worker_logs(self._update_metrics(terms, y, s_logits))

    def test_step(self, data):
        x, y = self._labels_and_inputs(data)
        counts = self._global_counts(x)
        t_out = self._teacher_outputs(x)
        s_out = self.student(self._model_inputs(x), training=False)
        sums = self._term_sums(x, s_out, t_out)
        terms = {t: tf.math.divide_no_nan(sums[t], counts[t]) for t in sums}
        return self._multi_worker_logs(self._update_metrics(terms, y, s_out.get("logits")))

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase, "loss_terms": list(self.loss_terms),
                "layer_mapping": self.layer_mapping[1:], "layer_weights": self.layer_weights,
                "mask_padding": self.mask_padding, "temperature": self.temperature,
                "is_regression": self.is_regression, "clip_norm": self.clip_norm,
                "grad_accum_steps": self.grad_accum_steps, **{
                    f"alpha_{k}": v for k, v in self.alphas.items()}}

