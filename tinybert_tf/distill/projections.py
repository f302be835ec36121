"""Learned projections W_e, W_h (student width d' -> teacher width d), paper Eq. 8-9.

They belong to the distiller, are trained with the student, and are never
exported with it.
"""
from __future__ import annotations

import keras


class Projections(keras.layers.Layer):
    """W_e for the embeddings and W_h for the hidden states of layers 1..M.

    Args:
      student_width: d'.
      teacher_width: d.
      num_student_layers: M.
      share_hidden: one W_h for every layer (the reference code) or one per layer.
      use_bias: the paper's projections are linear maps (no bias); the
        reference code's `fit_dense` is an nn.Linear with a bias.

    `embedding(x)`: [B, L, d'] -> [B, L, d]; `hidden(m, x)` for layer m in 1..M.
    """

    def __init__(self, student_width: int, teacher_width: int, num_student_layers: int,
                 share_hidden: bool = True, use_bias: bool = False, **kwargs):
        kwargs.setdefault("name", "projections")
        super().__init__(**kwargs)
        self.student_width = int(student_width)
        self.teacher_width = int(teacher_width)
        self.num_student_layers = int(num_student_layers)
        self.share_hidden = bool(share_hidden)
        self.use_bias = bool(use_bias)
        dense = dict(units=self.teacher_width, use_bias=self.use_bias, dtype=self.dtype_policy)
        self.embedding_projection = keras.layers.Dense(name="W_e", **dense)
        count = 1 if self.share_hidden else self.num_student_layers
        self.hidden_projections = [
            keras.layers.Dense(name="W_h" if self.share_hidden else f"W_h_{m + 1}", **dense)
            for m in range(count)]
        shape = (None, None, self.student_width)
        self.embedding_projection.build(shape)
        for layer in self.hidden_projections:
            layer.build(shape)
        self.built = True

    def embedding(self, x):
        """x: [B, L, d'] student embeddings -> [B, L, d]."""
        return self.embedding_projection(x)

    def hidden(self, layer: int, x):
        """x: [B, L, d'] output of student layer `layer` (1..M) -> [B, L, d]."""
        index = 0 if self.share_hidden else layer - 1
        return self.hidden_projections[index](x)

    def call(self, x):
        return self.embedding(x)

    def get_config(self):
        return {**super().get_config(), "student_width": self.student_width,
                "teacher_width": self.teacher_width,
                "num_student_layers": self.num_student_layers,
                "share_hidden": self.share_hidden, "use_bias": self.use_bias}
