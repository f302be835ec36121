"""MiniLM's self-attention terms: width-free, one student layer, no projections.

  minilm_att   MiniLM v1 (Wang et al. 2020, Sec. 3, "Self-Attention Distribution
               Transfer"): KL of the attention distributions of the teacher's last
               layer and the student's last layer, per head and real query position.
  minilm_val   MiniLM v1 ("Self-Attention Value-Relation Transfer"): KL of the value
               relations softmax(V V^T / sqrt(d_k)) of the same two layers (each
               model's own d_k).
  minilm_rel   MiniLMv2 (Wang et al. 2021, Sec. 3): the Q-Q, K-K and V-V
               relations with `relation_heads` relation heads (each model's heads
               concatenated and re-split, so the two head counts may differ), from
               teacher layer `teacher_layer` (0 = last; the paper takes an upper-middle
               layer of large teachers) to the student's last layer; the three KLs
               summed.

Every relation is L x L, so student and teacher widths may differ. v1's terms
compare heads one to one and need equal head counts (the paper's students keep
the teacher's 12 heads); v2 lifts that. Each term is averaged over heads x real
tokens of the global batch (`losses.relation_kl`).
"""
from __future__ import annotations

from typing import Any

from tinybert_tf.distill import losses
from tinybert_tf.distill.terms import LossTerm, register_term


class _LastLayerTerm(LossTerm):
    """Shared checks of the v1 terms: the last layers, equal head counts."""

    compares_teacher_heads = True

    def __init__(self, weight: float = 1.0):
        super().__init__(weight)
        self.heads = 0

    def plan(self, student_config, teacher_config) -> None:
        if student_config.num_heads != teacher_config.num_heads:
            raise ValueError(
                f"--loss_terms={self.name} (MiniLM v1) compares attention heads one to one: "
                f"the student has {student_config.num_heads} heads, the teacher "
                f"{teacher_config.num_heads}. Use a student with the teacher's head count, "
                "or --recipe=minilm_v2 (minilm_rel), which has no such restriction.")
        self.heads = student_config.num_heads

    def count(self, inputs):
        return losses.relation_count(inputs["input_mask"], self.heads)


@register_term
class MiniLMAttentionTerm(_LastLayerTerm):
    """MiniLM v1's attention transfer: KL(A_T,L || A_S,M) of the last layers' attention
    distributions, A = softmax(Q K^T / sqrt(d_k))."""

    name = "minilm_att"
    teacher_outputs = ("attention_scores",)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        return self.weight * losses.relation_kl(
            student_outputs["attention_scores"][-1], teacher_outputs["attention_scores"][-1],
            inputs["input_mask"], reduction="sum")


@register_term
class MiniLMValueTerm(_LastLayerTerm):
    """MiniLM v1's value-relation transfer: KL(VR_T,L || VR_S,M), VR = softmax(V V^T /
    sqrt(d_k)) per head."""

    name = "minilm_val"
    teacher_outputs = ("attention_values",)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        return self.weight * losses.relation_kl(
            losses.relation_logits(student_outputs["attention_values"][-1], self.heads),
            losses.relation_logits(teacher_outputs["attention_values"][-1], self.heads),
            inputs["input_mask"], reduction="sum")


@register_term
class MiniLMRelationTerm(LossTerm):
    """MiniLMv2: sum over Q, K, V of KL(R_T || R_S) with `relation_heads` relation heads,
    teacher layer `teacher_layer` (1-based, 0 = last) -> the student's last layer."""

    name = "minilm_rel"
    teacher_outputs = ("attention_queries", "attention_keys", "attention_values")
    KINDS = ("attention_queries", "attention_keys", "attention_values")

    def __init__(self, relation_heads: int = 48, teacher_layer: int = 0, weight: float = 1.0):
        super().__init__(weight)
        self.relation_heads = int(relation_heads)
        self.teacher_layer_spec = int(teacher_layer)
        self.teacher_layer = self.teacher_layer_spec
        if self.relation_heads < 1:
            raise ValueError(f"--minilm_relation_heads must be >= 1, got {relation_heads}.")

    def plan(self, student_config, teacher_config) -> None:
        n = teacher_config.num_layers
        layer = self.teacher_layer_spec or n
        if not 1 <= layer <= n:
            raise ValueError(f"--minilm_teacher_layer={self.teacher_layer_spec}: the teacher "
                             f"has layers 1..{n} (0 = its last layer).")
        self.teacher_layer = layer
        for role, c in (("student", student_config), ("teacher", teacher_config)):
            width = c.num_heads * c.head_size
            if width % self.relation_heads:
                raise ValueError(
                    f"--minilm_relation_heads={self.relation_heads} must divide the "
                    f"{role}'s attention width {width} (heads x head size) into equal "
                    "relation heads; choose a common divisor of both widths.")

    def count(self, inputs):
        return losses.relation_count(inputs["input_mask"], self.relation_heads)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        r, mask = self.relation_heads, inputs["input_mask"]
        total = 0.0
        for kind in self.KINDS:
            s = losses.relation_logits(student_outputs[kind][-1], r)
            t = losses.relation_logits(teacher_outputs[kind][self.teacher_layer - 1], r)
            total += losses.relation_kl(s, t, mask, reduction="sum")
        return self.weight * total

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "relation_heads": self.relation_heads,
                "teacher_layer": self.teacher_layer}
