"""Loss terms: one object per term of the paper's objective, and their registry.

A `LossTerm` is one weighted term of a distillation objective. The `Distiller`
asks each term for two things per batch:

  count(inputs)   this replica's number of elements the term averages over,
                  for the WHOLE replica batch (before any accumulation split);
                  the Distiller sums counts over replicas (the global count);
  sum(inputs, student_outputs, teacher_outputs, projections)
                  the weighted numerator (a sum of per-element terms) of one
                  (micro-)batch.

The term's loss is sum / global count, so 1 replica, N replicas and k
accumulation steps give the same update (see losses.py for each equation's
numerator/denominator pair). `inputs` is the batch dict (model inputs plus
`labels` when the data carries them); outputs are `BertModel` output dicts.

TinyBERT (paper Eq. 7-10): `embd`, `attn`, `hidn`, `pred`. DistilBERT: `ce`,
`mlm`, `cos`. Supervised: `hard` (ground-truth labels; teacher fine-tuning,
and optionally mixed into the prediction phase).

Terms register by name (`@register_term`); `make_terms(names, **settings)`
builds them for `--loss_terms`, passing each class only the settings its
constructor takes, so a term class written outside this package works with
the Distiller and the flag without editing the package (docs/extending.md).

The prediction-layer and hard-label terms are task-agnostic: they call the
task type's `soft_count/soft_sum/hard_count/hard_sum` (see tinybert_tf.tasks),
which knows whether logits are classes, a score, per-token tags or spans.
"""
from __future__ import annotations

import inspect
from typing import Any, ClassVar, Optional, Protocol, Sequence, Union

import tensorflow as tf

from tinybert_tf import plugins
from tinybert_tf.distill import losses
from tinybert_tf.distill.mapping import layer_map


class PredictionTask(Protocol):
    """What the `pred` and `hard` terms need from a task type (tinybert_tf.tasks)."""

    head: str

    def accepts(self, head: Optional[str]) -> bool: ...

    def soft_count(self, inputs: dict, num_outputs: int) -> tf.Tensor: ...

    def soft_sum(self, inputs: dict, student_logits, teacher_logits,
                 temperature: float) -> tf.Tensor: ...

    def hard_count(self, inputs: dict) -> tf.Tensor: ...

    def hard_sum(self, inputs: dict, logits) -> tf.Tensor: ...


class LossTerm:
    """Base class of a weighted loss term (see the module docstring).

    Subclasses set `name`, and override `count` and `sum`; `build` may check
    the two models and precompute what `sum` needs. `needs_teacher=False`
    terms (e.g. the MLM and hard-label losses) let the Distiller run without a
    teacher. `needs_projections` is read after `build`.

    `teacher_outputs` names the teacher output keys `sum` reads (None: unknown,
    any). When every teacher-reading term names its keys and the batch carries
    each as `teacher_<key>` (e.g. cached `teacher_logits`), the Distiller skips
    the teacher's forward pass and hands the terms those tensors instead.

    `compares_teacher_heads=True` says the term compares the student's attention
    heads one to one with the teacher's, so it wants a student with the teacher's
    head count (`attn` falls back to head-averaged maps, MiniLM v1 refuses other
    counts); `--student_config=auto` then sizes only students with that count.
    """

    name: ClassVar[str] = ""
    needs_teacher: ClassVar[bool] = True
    teacher_outputs: ClassVar[Optional[tuple[str, ...]]] = None
    compares_teacher_heads: ClassVar[bool] = False
    # Whether `sum` and `count` read real positions only, so a batch padded to any
    # length gives the same value: then a phase may batch by length (data/buckets.py).
    # A term that does not say is assumed to depend on the padding.
    padding_invariant: bool = False

    def __init__(self, weight: float = 1.0):
        self.weight = float(weight)
        self.needs_projections = False
        # Batch keys the models must NOT receive (e.g. masked_lm_positions, for MLM
        # logits at every position), and keys this term needs the models to receive.
        self.drops_model_inputs: tuple[str, ...] = ()
        self.needs_model_inputs: tuple[str, ...] = ()

    def plan(self, student_config, teacher_config) -> None:
        """Resolve what depends on the two models' `BertConfig`s alone (layer maps,
        lambdas, whether projections are needed), so a plan can show it before any
        model is built; `build` calls it. `teacher_config` may be None."""

    def build(self, student, teacher) -> None:
        """Check the models and precompute per-model facts (layer maps, heads); the
        base calls `plan` with the models' configs."""
        self.plan(student.bert_config, getattr(teacher, "bert_config", None))

    def teacher_indices(self) -> dict[str, tuple[int, ...]]:
        """For each list-valued teacher output `sum` reads (hidden_states,
        attention_scores), the list indices it reads (known after `build`); a cache
        of teacher outputs keeps only those. {}: none, or all of them."""
        return {}

    def count(self, inputs: dict) -> tf.Tensor:
        raise NotImplementedError(f"{type(self).__name__}.count")

    def sum(self, inputs: dict, student_outputs: dict, teacher_outputs: Optional[dict],
            projections) -> tf.Tensor:
        raise NotImplementedError(f"{type(self).__name__}.sum")

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight}

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "name")
        return f"{type(self).__name__}({settings})"


TERMS: dict[str, type[LossTerm]] = {}
# Shorthands accepted by --loss_terms.
ALIASES: dict[str, tuple[str, ...]] = {"trm": ("attn", "hidn")}
# The default terms of each named phase.
PHASES: dict[str, tuple[str, ...]] = {
    "intermediate": ("embd", "attn", "hidn"),
    "prediction": ("pred",),
    "distilbert": ("ce", "mlm", "cos"),
    "finetune": ("hard",),
}


def register_term(cls: Optional[type[LossTerm]] = None, *, replace: bool = False):
    """Class decorator: make `cls` available to `make_terms` / `--loss_terms` by its name.
    A name already registered (or an alias such as `trm`) is refused unless
    `@register_term(replace=True)`."""
    def add(c: type[LossTerm]) -> type[LossTerm]:
        if not c.name:
            raise ValueError(f"{c.__name__}: a registered LossTerm needs a `name`.")
        if c.name in ALIASES and not replace:
            raise plugins.PluginError(f"loss term {c.name!r} is the alias of "
                                      f"{','.join(ALIASES[c.name])}; choose another name.")
        return plugins.register(TERMS, c.name, c, what="loss term", replace=replace)
    return add(cls) if cls is not None else add


def resolve_names(names: Union[str, Sequence[str]], flag: str = "--loss_terms",
                  allowed: Optional[Sequence[str]] = None) -> tuple[str, ...]:
    """Term names, aliases expanded ("trm" -> attn, hidn), duplicates dropped, checked
    against the registry (and `allowed`, when given)."""
    if isinstance(names, str):
        names = names.split(",")
    out: list[str] = []
    for raw in names:
        key = str(raw).strip().lower()
        if not key:
            continue
        for name in ALIASES.get(key, (key,)):
            ok = name in TERMS and (allowed is None or name in allowed)
            if not ok:
                choices = list(allowed) if allowed is not None else sorted(TERMS)
                aliases = ["%s = %s" % (a, ",".join(v)) for a, v in ALIASES.items()
                           if set(v) <= set(choices)]
                hint = f" ({'; '.join(aliases)})" if aliases else ""
                raise ValueError(f"{flag}: unknown term {raw!r}; use any of "
                                 f"{', '.join(choices)}{hint}.")
            if name not in out:
                out.append(name)
    if not out:
        raise ValueError(f"{flag}: no loss term given; use any of {', '.join(sorted(TERMS))}.")
    return tuple(out)


def make_term(name: str, **settings: Any) -> LossTerm:
    """The registered term `name`, given the settings its constructor accepts."""
    (name,) = resolve_names([name]) if name not in TERMS else (name,)
    cls = TERMS[name]
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return cls(**settings)
    return cls(**{k: v for k, v in settings.items() if k in params})


def make_terms(names: Union[str, Sequence[str]], flag: str = "--loss_terms",
               **settings: Any) -> list[LossTerm]:
    """Terms for `names` (aliases allowed), each built with the settings it takes.

    Typical settings: layer_mapping, layer_weights, mask_padding, temperature,
    task, and per-term `weights={"ce": 5.0, ...}`.
    """
    weights = dict(settings.pop("weights", None) or {})
    out = []
    for name in resolve_names(names, flag):
        kwargs = dict(settings)
        if name in weights:
            kwargs["weight"] = weights[name]
        out.append(make_term(name, **kwargs))
    return out


# ---------------------------------------------------------------------------
# TinyBERT's layer-wise terms.

class _LayerTerm(LossTerm):
    """Shared settings of the layer-wise terms: layer map g(m), lambda_m, padding."""

    def __init__(self, layer_mapping: Union[str, Sequence[int]] = "uniform",
                 layer_weights: Optional[Sequence[float]] = None, mask_padding: bool = False,
                 weight: float = 1.0):
        super().__init__(weight)
        self.layer_mapping_spec = layer_mapping
        self.layer_weights_spec = None if not layer_weights else [float(w) for w in layer_weights]
        self.mask_padding = bool(mask_padding)
        self.mapping: list[int] = []
        self.lambdas: list[float] = []
        self.teacher_width = 0

    @property
    def padding_invariant(self) -> bool:
        """Only with mask_padding: the reference's losses count padded positions."""
        return self.mask_padding

    def plan(self, student_config, teacher_config) -> None:
        m = student_config.num_layers
        self.mapping = layer_map(self.layer_mapping_spec, m, teacher_config.num_layers)
        self.lambdas = layer_weights(self.layer_weights_spec, m)
        self.teacher_width = teacher_config.hidden_size

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "layer_mapping": self.mapping[1:] or
                self.layer_mapping_spec, "layer_weights": self.lambdas or
                self.layer_weights_spec, "mask_padding": self.mask_padding}


def layer_weights(values: Optional[Sequence[float]], num_student_layers: int) -> list[float]:
    """lambda_0 (embeddings), lambda_1..M (layers), lambda_{M+1} (prediction): M + 2
    numbers, all 1 by default."""
    m = num_student_layers
    if not values:
        return [1.0] * (m + 2)
    if len(values) != m + 2:
        raise ValueError(
            f"--layer_weights: expected {m + 2} numbers (lambda_0 for embeddings, "
            f"lambda_1..lambda_{m} for the student layers, lambda_{m + 1} for the "
            f"prediction layer), got {len(values)}.")
    return [float(w) for w in values]


@register_term
class EmbeddingTerm(_LayerTerm):
    """Eq. 9: lambda_0 * MSE(E_s W_e, E_t)."""

    name = "embd"
    teacher_outputs = ("embeddings",)

    def plan(self, student_config, teacher_config) -> None:
        super().plan(student_config, teacher_config)
        self.needs_projections = True

    def count(self, inputs):
        return losses.hidden_count(inputs["input_mask"], self.teacher_width, self.mask_padding)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        mask = inputs["input_mask"] if self.mask_padding else None
        return self.weight * self.lambdas[0] * losses.hidden_loss(
            projections.embedding(student_outputs["embeddings"]),
            teacher_outputs["embeddings"], mask, reduction="sum")


@register_term
class AttentionTerm(_LayerTerm):
    """Eq. 7: sum_m lambda_m (1/h) sum_i MSE(A_s,i^m, A_t,i^g(m)) on pre-softmax scores."""

    name = "attn"
    teacher_outputs = ("attention_scores",)
    compares_teacher_heads = True  # head i to head i; other counts: head-averaged maps

    def plan(self, student_config, teacher_config) -> None:
        super().plan(student_config, teacher_config)
        self.heads = losses.attention_heads(student_config.num_heads, teacher_config.num_heads)

    def teacher_indices(self):
        return {"attention_scores": tuple(sorted({g - 1 for g in self.mapping[1:]}))}

    def count(self, inputs):
        return losses.attention_count(inputs["input_mask"], self.heads, self.mask_padding)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        g, lam = self.mapping, self.lambdas
        return self.weight * tf.add_n([
            lam[m] * losses.attention_loss(
                student_outputs["attention_scores"][m - 1],
                teacher_outputs["attention_scores"][g[m] - 1], inputs["input_mask"],
                reduction="sum", mask_queries=self.mask_padding)
            for m in range(1, len(g))])


@register_term
class HiddenTerm(_LayerTerm):
    """Eq. 8: sum_m lambda_m MSE(H_s^m W_h, H_t^g(m))."""

    name = "hidn"
    teacher_outputs = ("hidden_states",)

    def plan(self, student_config, teacher_config) -> None:
        super().plan(student_config, teacher_config)
        self.needs_projections = True

    def teacher_indices(self):
        return {"hidden_states": tuple(sorted(set(self.mapping[1:])))}

    def count(self, inputs):
        return losses.hidden_count(inputs["input_mask"], self.teacher_width, self.mask_padding)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        g, lam = self.mapping, self.lambdas
        mask = inputs["input_mask"] if self.mask_padding else None
        return self.weight * tf.add_n([
            lam[m] * losses.hidden_loss(
                projections.hidden(m, student_outputs["hidden_states"][m]),
                teacher_outputs["hidden_states"][g[m]], mask, reduction="sum")
            for m in range(1, len(g))])


def _check_task_heads(term: str, student, teacher, task) -> None:
    if task is None:
        raise ValueError(f"the {term!r} loss term needs the task type (e.g. "
                         "tinybert_tf.tasks.Classification(label_names)): pass task=...")
    for role, model in (("student", student), ("teacher", teacher)):
        if model is None:
            continue
        if not task.accepts(getattr(model, "head_type", None)):
            raise ValueError(f"the {term!r} loss needs a {role} with the task's "
                             f"{task.head} head (got head={model.head_type!r}).")
    if teacher is not None and student.num_labels != teacher.num_labels:
        raise ValueError(f"student has {student.num_labels} outputs, teacher "
                         f"{teacher.num_labels}; they must predict the same labels.")


@register_term
class PredictionTerm(LossTerm):
    """Eq. 10: lambda_{M+1} * the task's soft-target loss at temperature t
    (soft cross-entropy for classes, MSE to the teacher for a score)."""

    name = "pred"
    padding_invariant = True
    teacher_outputs = ("logits",)

    def __init__(self, task: Optional[PredictionTask] = None, temperature: float = 1.0,
                 layer_weights: Optional[Sequence[float]] = None, weight: float = 1.0):
        super().__init__(weight)
        self.task = task
        self.temperature = float(temperature)
        if self.temperature <= 0:
            raise ValueError(f"--temperature must be > 0, got {temperature}.")
        self.layer_weights_spec = None if not layer_weights else [float(w) for w in layer_weights]
        # lambda_{M+1}: the last of the M + 2 layer weights, whatever M is (checked in plan).
        self.lam = self.layer_weights_spec[-1] if self.layer_weights_spec else 1.0
        self.num_outputs = 1

    def plan(self, student_config, teacher_config) -> None:
        self.lam = layer_weights(self.layer_weights_spec, student_config.num_layers)[-1]

    def build(self, student, teacher) -> None:
        super().build(student, teacher)
        _check_task_heads(self.name, student, teacher, self.task)
        self.num_outputs = int(student.num_labels or 1)

    def count(self, inputs):
        return self.task.soft_count(inputs, self.num_outputs)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        return self.weight * self.lam * self.task.soft_sum(
            inputs, student_outputs["logits"], teacher_outputs["logits"], self.temperature)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "temperature": self.temperature,
                "task": getattr(self.task, "kind", None), "lambda": self.lam}


@register_term
class HardLabelTerm(LossTerm):
    """The ground-truth loss of the task (cross-entropy, or MSE for a score) on
    `inputs["labels"]`: teacher fine-tuning, and `--hard_label_weight` in the
    prediction phase (not in the paper, whose weight is 0)."""

    name = "hard"
    padding_invariant = True
    needs_teacher = False

    def __init__(self, task: Optional[PredictionTask] = None, weight: float = 1.0):
        super().__init__(weight)
        self.task = task

    def build(self, student, teacher) -> None:
        _check_task_heads(self.name, student, None, self.task)

    def count(self, inputs):
        if "labels" not in inputs:
            raise ValueError("the 'hard' loss term needs labelled data: (inputs, labels) "
                             "batches.")
        return self.task.hard_count(inputs)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        return self.weight * self.task.hard_sum(inputs, student_outputs["logits"])

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "task": getattr(self.task, "kind", None)}


# ---------------------------------------------------------------------------
# DistilBERT's terms (Sanh et al. 2019): weights are alpha_ce, alpha_mlm, alpha_cos.

def _mlm_weights(inputs) -> tf.Tensor:
    w = inputs.get("masked_lm_weights")
    if w is None:
        w = tf.ones(tf.shape(inputs["masked_lm_positions"]), tf.float32)
    return tf.cast(w, tf.float32)


def _require_mlm(term: str, inputs) -> None:
    if "masked_lm_positions" not in inputs or "masked_lm_ids" not in inputs:
        raise ValueError(f"the DistilBERT {term!r} loss needs `masked_lm_positions` and "
                         "`masked_lm_ids` (and `masked_lm_weights`) in the inputs.")


@register_term
class DistilSoftTargetTerm(LossTerm):
    """alpha_ce * L_ce: soft cross-entropy over the MLM vocabulary at temperature
    T, scaled by T^2. Over every real token (the DistilBERT code's default,
    `restrict_ce_to_mask=False`: the models then return MLM logits at every
    position), or only at the masked positions (`restrict_ce_to_mask=True`)."""

    name = "ce"
    padding_invariant = True
    teacher_outputs = ("logits",)

    def __init__(self, temperature: float = 2.0, weight: float = 5.0,
                 restrict_ce_to_mask: bool = False):
        super().__init__(weight)
        self.temperature = float(temperature)
        if self.temperature <= 0:
            raise ValueError(f"--distil_temperature must be > 0, got {temperature}.")
        self.restrict = bool(restrict_ce_to_mask)
        if self.restrict:
            self.needs_model_inputs = ("masked_lm_positions",)
        else:
            self.drops_model_inputs = ("masked_lm_positions",)

    def build(self, student, teacher) -> None:
        if student.head_type != "mlm":
            raise ValueError("the DistilBERT recipe's L_ce needs a student with an MLM head "
                             "(BertModel(config, head='mlm')).")
        if teacher.head_type != "mlm":
            raise ValueError(
                "the DistilBERT recipe's L_ce needs a teacher with an MLM head, and this "
                "teacher has none (e.g. the embedded all-MiniLM-L6-v2); load a teacher "
                "with `cls.predictions.*` weights or set --alpha_ce=0.")
        if student.bert_config.vocab_size != teacher.bert_config.vocab_size:
            raise ValueError(f"L_ce needs one vocabulary: student vocab_size="
                             f"{student.bert_config.vocab_size}, teacher "
                             f"{teacher.bert_config.vocab_size}.")

    def _weights(self, inputs):
        if self.restrict:
            _require_mlm(self.name, inputs)
            return _mlm_weights(inputs)
        return tf.cast(inputs["input_mask"], tf.float32)  # every real token [B, L]

    def count(self, inputs):
        return tf.reduce_sum(self._weights(inputs))

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        return self.weight * losses.distilbert_ce(
            student_outputs["logits"], teacher_outputs["logits"], self._weights(inputs),
            self.temperature, reduction="sum")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "temperature": self.temperature,
                "restrict_ce_to_mask": self.restrict}


@register_term
class MaskedLMTerm(LossTerm):
    """alpha_mlm * L_mlm: cross-entropy of the original tokens at masked positions.

    With `restrict_ce_to_mask=False` the student's MLM logits come for every
    position (as L_ce needs them) and this term gathers the masked ones.
    """

    name = "mlm"
    padding_invariant = True
    needs_teacher = False

    def __init__(self, weight: float = 2.0, restrict_ce_to_mask: bool = False):
        super().__init__(weight)
        self.full_sequence = not restrict_ce_to_mask
        if self.full_sequence:
            self.drops_model_inputs = ("masked_lm_positions",)
        else:
            self.needs_model_inputs = ("masked_lm_positions",)

    def build(self, student, teacher) -> None:
        if student.head_type != "mlm":
            raise ValueError("the DistilBERT recipe's L_mlm needs a student with an MLM head "
                             "(BertModel(config, head='mlm')).")

    def count(self, inputs):
        _require_mlm(self.name, inputs)
        return tf.reduce_sum(_mlm_weights(inputs))

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        logits = student_outputs["logits"]
        if self.full_sequence:  # [B, L, V] -> [B, P, V] at the masked positions
            logits = tf.gather(logits, tf.cast(inputs["masked_lm_positions"], tf.int32),
                               batch_dims=1)
        return self.weight * losses.mlm_loss(logits, inputs["masked_lm_ids"],
                                             inputs.get("masked_lm_weights"), reduction="sum")


@register_term
class CosineTerm(LossTerm):
    """alpha_cos * L_cos: 1 - cos(h_s, h_t) of the last hidden states, over real
    tokens (through W_h when the widths differ)."""

    name = "cos"
    padding_invariant = True
    teacher_outputs = ("sequence_output",)

    def __init__(self, weight: float = 1.0):
        super().__init__(weight)
        self.num_student_layers = 0

    def plan(self, student_config, teacher_config) -> None:
        self.needs_projections = student_config.hidden_size != teacher_config.hidden_size
        self.num_student_layers = student_config.num_layers

    def count(self, inputs):
        return tf.reduce_sum(tf.cast(inputs["input_mask"], tf.float32))

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        s_last = student_outputs["sequence_output"]
        if self.needs_projections:
            s_last = projections.hidden(self.num_student_layers, s_last)
        return self.weight * losses.cosine_loss(s_last, teacher_outputs["sequence_output"],
                                                inputs["input_mask"], reduction="sum")
