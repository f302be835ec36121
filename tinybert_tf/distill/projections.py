"""Learned projections W_e, W_h (student width d' -> teacher width d) of the
embedding and hidden-state losses.

They belong to the distiller and are trained with the student. They are never
exported with a task model, but the general stage keeps them with the General
TinyBERT (`arrays`, saved beside its weights), and task distillation starts
from them (`assign`), as the reference carries its `fit_dense` from general into
task distillation. `mismatch` says why saved ones cannot be used (another
teacher width, another W_h sharing): the phase then starts with new ones.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import keras
import numpy as np


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

    def _dense_layers(self) -> list[keras.layers.Dense]:
        return [self.embedding_projection, *self.hidden_projections]

    def arrays(self) -> dict[str, np.ndarray]:
        """Every weight as float32 NumPy, keyed "W_e/kernel", "W_h/kernel", ... ."""
        out = {}
        for layer in self._dense_layers():
            for weight in layer.weights:
                name = weight.path.rsplit("/", 1)[-1]
                out[f"{layer.name}/{name}"] = np.asarray(weight.numpy(), np.float32)
        return out

    def assign(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Load `arrays` (as `arrays()` returns them); ValueError on any mismatch,
        before anything is assigned."""
        problem = mismatch({k: np.shape(v) for k, v in arrays.items()}, self.shapes())
        if problem:
            raise ValueError(f"cannot load the projections: {problem}.")
        for layer in self._dense_layers():
            for weight in layer.weights:
                name = weight.path.rsplit("/", 1)[-1]
                weight.assign(np.asarray(arrays[f"{layer.name}/{name}"], np.float32))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return expected_shapes(self.student_width, self.teacher_width, self.num_student_layers,
                               self.share_hidden, self.use_bias)

    def get_config(self):
        return {**super().get_config(), "student_width": self.student_width,
                "teacher_width": self.teacher_width,
                "num_student_layers": self.num_student_layers,
                "share_hidden": self.share_hidden, "use_bias": self.use_bias}


def expected_shapes(student_width: int, teacher_width: int, num_student_layers: int,
                    share_hidden: bool = True, use_bias: bool = False
                    ) -> dict[str, tuple[int, ...]]:
    """The weights `Projections(...)` has with these settings, by name -> shape."""
    names = ["W_e"] + (["W_h"] if share_hidden else
                       [f"W_h_{m + 1}" for m in range(num_student_layers)])
    out: dict[str, tuple[int, ...]] = {}
    for name in names:
        out[f"{name}/kernel"] = (int(student_width), int(teacher_width))
        if use_bias:
            out[f"{name}/bias"] = (int(teacher_width),)
    return out


def mismatch(saved: Optional[Mapping[str, Sequence[int]]],
             wanted: Mapping[str, Sequence[int]]) -> Optional[str]:
    """Why projections of shapes `saved` cannot stand in for `wanted` (None: they can)."""
    if not saved:
        return "none were saved"
    saved = {k: tuple(int(d) for d in v) for k, v in saved.items()}
    wanted = {k: tuple(int(d) for d in v) for k, v in wanted.items()}
    if set(saved) != set(wanted):
        return (f"saved weights {sorted(saved)}, this phase has {sorted(wanted)} (another "
                "--share_hidden_projection setting)")
    for key in sorted(wanted):
        if saved[key] != wanted[key]:
            return (f"{key} is {saved[key]} (student x teacher width), this phase needs "
                    f"{wanted[key]}: the general model was distilled from a teacher "
                    "of another width")
    return None
