"""DistilBERT's student initialisation: copy the teacher's embeddings and every
other transformer layer (Sanh et al. 2019, Sec. 3) when the widths match.

A student with a narrower feed-forward block (intermediate_size below the
teacher's) keeps, in each copied layer, the teacher's FFN units of largest
weight norm (`ffn_units`); Sanh et al. copy whole layers only, so this is our
extension, made for students that need fewer FLOPs per layer.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import keras
import numpy as np

_EMBEDDING_PREFIXES = ("token_embedding/", "position_embedding/", "segment_embedding/",
                       "embeddings_layer_norm/")


# What must match to copy teacher layers into a student (vocab_size is
# checked on the built models: the pipeline gives the student the teacher's vocab).
# intermediate_size may be smaller than the teacher's (see `ffn_units`), not larger.
INIT_FIELDS = ("hidden_size", "num_heads")

_FFN_IN = "feedforward_intermediate_dense/"
_FFN_OUT_KERNEL = "feedforward_output_dense/kernel"


def init_mismatch(student_config, teacher_config,
                  fields: Sequence[str] = INIT_FIELDS) -> Optional[tuple[str, int, int]]:
    """(field, student value, teacher value) of the first of `fields` that differs
    between two BertConfigs, or of intermediate_size when the student's is larger;
    None when the student can start from the teacher."""
    for field in fields:
        s, t = getattr(student_config, field), getattr(teacher_config, field)
        if s != t:
            return field, s, t
    s, t = student_config.intermediate_size, teacher_config.intermediate_size
    if s > t:
        return "intermediate_size", s, t
    return None


def ffn_units(w_in: np.ndarray, w_out: np.ndarray, keep: int) -> np.ndarray:
    """Indices (ascending) of the `keep` FFN units with the largest ||w_in[:, j]|| *
    ||w_out[j, :]||, a data-free magnitude score of unit j's contribution.

    w_in: [hidden, intermediate] (the intermediate dense kernel);
    w_out: [intermediate, hidden] (the output dense kernel). Ties go to the lower index.
    """
    score = np.linalg.norm(w_in, axis=0) * np.linalg.norm(w_out, axis=1)
    order = np.argsort(-score, kind="stable")
    return np.sort(order[:keep])


def slice_ffn(path: str, value: np.ndarray, units: np.ndarray) -> np.ndarray:
    """`value` of the layer weight at `path` cut to the FFN `units` when it is one of
    the FFN's unit-indexed weights (the intermediate kernel [hidden, intermediate] and
    bias [intermediate], the output kernel [intermediate, hidden]); else `value`."""
    if _FFN_IN in path:
        return value[..., units]
    if path.endswith(_FFN_OUT_KERNEL):
        return value[units]
    return value


def teacher_layers_for(layers: Union[str, Sequence[int]], num_student_layers: int,
                       num_teacher_layers: int) -> list[int]:
    """0-based teacher layer copied into each student layer.

    "every_other": teacher layers 0, 2, 4, ... (needs N >= 2M - 1); or an
    explicit list of M 0-based teacher layers.
    """
    m, n = num_student_layers, num_teacher_layers
    if isinstance(layers, str):
        if layers != "every_other":
            raise ValueError(f"layers must be 'every_other' or a list of {m} 0-based teacher "
                             f"layers, got {layers!r}.")
        if 2 * (m - 1) > n - 1:
            raise ValueError(f"'every_other' needs a teacher with >= {2 * m - 1} layers for "
                             f"a {m}-layer student; the teacher has {n}. Pass an explicit list.")
        return [2 * i for i in range(m)]
    chosen = [int(i) for i in layers]
    if len(chosen) != m or any(not 0 <= i < n for i in chosen):
        raise ValueError(f"layers={chosen}: need {m} 0-based teacher layers in 0..{n - 1}.")
    return chosen


def init_student_from_teacher(student: keras.Model, teacher: keras.Model,
                              layers: Union[str, Sequence[int]] = "every_other") -> list[str]:
    """Copy embeddings, the chosen teacher layers, and (when both have them) the
    pooler and MLM head into `student`. Returns the copied student layer names.

    A student FFN narrower than the teacher's gets the `ffn_units` of each copied
    teacher layer (the same units for its kernel, bias and output kernel).

    Raises ValueError (before copying anything) when the shapes differ, e.g.
    different widths, head counts or vocabularies, or a wider FFN than the teacher's.
    """
    s_cfg, t_cfg = student.bert_config, teacher.bert_config
    mismatch = init_mismatch(s_cfg, t_cfg, INIT_FIELDS + ("vocab_size",))
    if mismatch:
        field, s, t = mismatch
        raise ValueError(
            f"cannot initialise the student from the teacher: {field} differs (student "
            f"{s}, teacher {t}). DistilBERT's initialisation needs equal widths; use "
            "--general_model=none (random init) or a student config with the teacher's "
            "width.")
    chosen = teacher_layers_for(layers, s_cfg.num_layers, t_cfg.num_layers)
    rename = {f"transformer_layer_{i}/": f"transformer_layer_{j}/"
              for i, j in enumerate(chosen)}
    s_weights, t_weights = student.weight_dict(), teacher.weight_dict()
    units = {}  # teacher layer prefix -> the FFN units kept
    if s_cfg.intermediate_size < t_cfg.intermediate_size:
        for j in set(chosen):
            prefix = f"transformer_layer_{j}/"
            units[prefix] = ffn_units(t_weights[prefix + _FFN_IN + "kernel"].numpy(),
                                      t_weights[prefix + _FFN_OUT_KERNEL].numpy(),
                                      s_cfg.intermediate_size)
    pairs, copied = [], []
    for path, var in s_weights.items():
        source = None
        if path.startswith(_EMBEDDING_PREFIXES):
            if path.startswith("position_embedding/"):
                source = path  # slice below if the student's table is shorter
            elif path in t_weights:
                source = path
        elif path.startswith("transformer_layer_"):
            prefix = path.split("/", 1)[0] + "/"
            source = rename[prefix] + path[len(prefix):]
        elif path.startswith(("pooled_dense/", "mlm_head/")) and path in t_weights:
            source = path
        if source is None or source not in t_weights:
            continue
        value = t_weights[source].numpy()
        if source.startswith("position_embedding/") and value.shape[0] > var.shape[0]:
            value = value[: var.shape[0]]
        keep = units.get(source.split("/", 1)[0] + "/")
        if keep is not None:
            value = slice_ffn(source, value, keep)
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"cannot copy teacher {source} {value.shape} into student "
                             f"{path} {tuple(var.shape)}.")
        pairs.append((var, value))
        layer = path.split("/", 1)[0]
        if layer not in copied:
            copied.append(layer)
    for var, value in pairs:
        var.assign(value)
    return copied


def describe_init(copied: Sequence[str], teacher_layers: Sequence[int]) -> str:
    """What `init_student_from_teacher` copied, in words: "the embeddings, 1 transformer
    layer (teacher layer 6 -> student layer 1) and the pooler".

    copied: its returned names; teacher_layers: the 0-based teacher layer of each
    student layer (`teacher_layers_for`). Layers are counted 1-based, as in the docs.
    """
    parts = []
    if any(name.endswith("embedding") or name == "embeddings_layer_norm" for name in copied):
        parts.append("the embeddings")
    student = sorted(int(name.rsplit("_", 1)[1]) for name in copied
                     if name.startswith("transformer_layer_"))
    if student:
        pairs = ", ".join(f"{teacher_layers[i] + 1} -> {i + 1}" for i in student)
        noun = "layer" if len(student) == 1 else "layers"
        parts.append(f"{len(student)} transformer {noun} (teacher -> student: {pairs})")
    parts += [what for name, what in (("pooled_dense", "the pooler"), ("mlm_head", "the MLM head"))
              if name in copied]
    if not parts:
        return "nothing"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
