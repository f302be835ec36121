"""Loss terms of the baselines the TinyBERT paper compares with (its Table 1 and Table 7).

  nsp  BERT's next-sentence prediction (Devlin et al. 2019): cross-entropy of a
       2-way classifier on the student's pooled [CLS] output against
       `next_sentence_labels` (0 = B follows A, 1 = B is from another document).
       With `mlm` it is the pre-training objective of BERT-Tiny / BERT-Small
       (Turc et al. 2019, "Well-Read Students Learn Better").
  pkd  Patient KD's patient loss (Sun et al. 2019, Eq. 4): the [CLS] states of
       student layers 1..M-1 and of their teacher layers g(m), each scaled to unit
       L2 norm, compared by squared distance.

Both follow the `LossTerm` contract of `tinybert_tf.distill.terms`: a global
`count` and a weighted `sum`. The NSP classifier is a variable of the term (like
W_e/W_h it is trained with the student and not part of it: BERT discards the
NSP head after pre-training); the Distiller trains and checkpoints every term's
`trainable_weights`.

PKD's whole objective, L = (1 - alpha) L_CE + alpha L_DS + beta L_PT, is
`pkd_phase_terms`: `hard` (1 - alpha), `pred` (the soft targets) and `pkd`
(beta). Normalisation follows the PKD code, whose alpha/beta/T the paper's
grid was searched with (docs/distillation.md): L_PT is the MSE over examples x
(M-1) layers x d, and L_DS is PyTorch's `KLDivLoss(reduction="mean")` (a mean
over examples x classes) times T^2. Our `pred` term is the soft cross-entropy
summed over classes (same gradient as KL: they differ by the teacher's entropy),
so it is weighted alpha * T^2 / C to give the PKD code's update.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import keras
import tensorflow as tf

from tinybert_tf.distill import losses
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.terms import HardLabelTerm, LossTerm, PredictionTerm, register_term

# F.normalize's floor on the norm (PyTorch default eps).
_NORM_EPS = 1e-12
NSP_LABELS = "next_sentence_labels"


@register_term
class NextSentenceTerm(LossTerm):
    """BERT's next-sentence loss: mean over examples of the cross-entropy of
    softmax(pooled_output W + b) [B, 2] against `next_sentence_labels` [B].

    W [H, 2] and b [2] belong to the term (`trainable_weights`), initialised as
    BERT initialises its heads (truncated normal, stddev initializer_range)."""

    name = "nsp"
    needs_teacher = False

    def __init__(self, weight: float = 1.0):
        super().__init__(weight)
        self.classifier: Optional[keras.layers.Dense] = None

    def build(self, student, teacher) -> None:
        config = student.bert_config
        if not config.use_pooler:
            raise ValueError("the 'nsp' loss reads the pooled [CLS] output, and this student "
                             "has no pooler (use_pooler=false); use a student config with a "
                             "pooler or drop 'nsp'.")
        self.classifier = keras.layers.Dense(
            2, kernel_initializer=keras.initializers.TruncatedNormal(
                stddev=config.initializer_range),
            dtype=student.dtype_policy, name="nsp_classifier")
        self.classifier.build((None, config.hidden_size))

    @property
    def trainable_weights(self) -> list:
        return list(self.classifier.trainable_weights) if self.classifier is not None else []

    def count(self, inputs):
        if NSP_LABELS not in inputs:
            raise ValueError(f"the 'nsp' loss needs `{NSP_LABELS}` in the batch (the mlm "
                             "recipe's sentence pairs: general_dataset(next_sentence=True)).")
        return tf.cast(tf.size(inputs[NSP_LABELS]), tf.float32)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        logits = self.classifier(student_outputs["pooled_output"])
        return self.weight * losses.label_cross_entropy(logits, inputs[NSP_LABELS],
                                                        reduction="sum")


@register_term
class PatientTerm(LossTerm):
    """PKD's patient loss: beta * mean over examples x (M-1) layers x d of
    (s/|s| - t/|t|)^2, s = [CLS] of student layer m (through W_h when the widths
    differ), t = [CLS] of teacher layer g(m), m = 1..M-1 (the last layer is taught
    by the soft targets). g is `--layer_mapping`: uniform is PKD-Skip, top PKD-Last."""

    name = "pkd"
    teacher_outputs = ("hidden_states",)

    def __init__(self, layer_mapping: Union[str, Sequence[int]] = "uniform",
                 weight: float = 500.0):
        super().__init__(weight)
        self.layer_mapping_spec = layer_mapping
        self.mapping: list[int] = []
        self.teacher_width = 0

    def plan(self, student_config, teacher_config) -> None:
        """The layer map and projection need, from the two configs alone."""
        m = student_config.num_layers
        if m < 2:
            raise ValueError("the 'pkd' loss compares student layers 1..M-1; a 1-layer "
                             "student has none (use 2 or more layers).")
        self.mapping = layer_map(self.layer_mapping_spec, m, teacher_config.num_layers)
        self.teacher_width = teacher_config.hidden_size
        self.needs_projections = student_config.hidden_size != teacher_config.hidden_size

    def build(self, student, teacher) -> None:
        self.plan(student.bert_config, teacher.bert_config)

    def count(self, inputs):
        rows = tf.cast(tf.shape(inputs["input_word_ids"])[0], tf.float32)
        return rows * float((len(self.mapping) - 2) * self.teacher_width)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        total = []
        for m in range(1, len(self.mapping) - 1):
            s = student_outputs["hidden_states"][m]
            if self.needs_projections:
                s = projections.hidden(m, s)
            s = unit_rows(s[:, 0, :])
            t = unit_rows(teacher_outputs["hidden_states"][self.mapping[m]][:, 0, :])
            total.append(tf.reduce_sum(tf.square(s - t)))
        return self.weight * tf.add_n(total)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(),
                "layer_mapping": self.mapping[1:-1] or self.layer_mapping_spec}


def unit_rows(x) -> tf.Tensor:
    """[B, d] -> rows scaled to unit L2 norm (norm floored at 1e-12, as F.normalize)."""
    x = tf.cast(x, tf.float32)
    norm = tf.sqrt(tf.reduce_sum(tf.square(x), axis=-1, keepdims=True))
    return x / tf.maximum(norm, _NORM_EPS)


def pkd_phase_terms(task, alpha: float, beta: float, temperature: float,
                    layer_mapping: Union[str, Sequence[int]] = "uniform") -> list[LossTerm]:
    """PKD's objective as terms: hard (1 - alpha), pred (alpha, as the PKD code
    scales it: T^2 / C for C classes; alpha alone for a score, which has no
    temperature) and pkd (beta). `task` is the task type (its `num_outputs`)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"--pkd_alpha={alpha}: must be in [0, 1] (the weight of the soft "
                         "targets; 1 - alpha weighs the ground truth).")
    outputs = int(getattr(task, "num_outputs", 1) or 1)
    classes = getattr(task, "kind", "") != "regression" and outputs > 1
    soft_weight = alpha * temperature ** 2 / outputs if classes else alpha
    terms: list[LossTerm] = [
        PredictionTerm(task=task, temperature=temperature if classes else 1.0,
                       weight=soft_weight),
        PatientTerm(layer_mapping=layer_mapping, weight=beta)]
    if alpha < 1.0:
        terms.insert(0, HardLabelTerm(task=task, weight=1.0 - alpha))
    return terms
