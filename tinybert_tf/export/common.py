"""What every exporter shares: format names, input checks, text handling.

Exports serve task models only: a `BertModel` with a classifier head (outputs
class probabilities) or a regressor head (outputs one score).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import numpy as np

from tinybert_tf.models.encoder import INPUT_NAMES, BertModel
from tinybert_tf.tokenizer import Tokenizer

FORMATS = ("saved_model", "float32", "float16", "dynamic_int8", "int8")
TFLITE_FORMATS = FORMATS[1:]

Text = Union[str, tuple]  # "text" or ("text a", "text b" | None)


class ExportError(ValueError):
    """Bad export input; the message names the model/flag/file at fault and the fix."""


def check_formats(formats: Sequence[str], flag: str = "--export_formats") -> tuple[str, ...]:
    """Validate format names; returns them de-duplicated, in the given order."""
    if isinstance(formats, str):
        formats = [f for f in formats.split(",") if f.strip()]
    out = []
    for f in formats:
        f = f.strip()
        if f not in FORMATS:
            raise ExportError(f"{flag}: unknown export format {f!r}; use any of "
                              f"{', '.join(FORMATS)}.")
        if f not in out:
            out.append(f)
    if not out:
        raise ExportError(f"{flag}: no export format given; use any of {', '.join(FORMATS)}.")
    return tuple(out)


def check_task_model(model: BertModel, is_regression: Optional[bool] = None,
                     source: str = "model") -> bool:
    """Raise unless `model` has a classifier/regressor head and a vocab.

    Returns True for a regressor. `is_regression`, when given (from the task
    spec), must agree with the head.
    """
    head = getattr(model, "head_type", None)
    if head not in ("classifier", "regressor"):
        raise ExportError(
            f"{source}: has head={head!r}; export needs a task model with a classifier or "
            "regressor head (a model directory written by the task stage, or "
            "load_model(dir, head='classifier', num_labels=N) after fine-tuning).")
    regression = head == "regressor"
    if is_regression is not None and bool(is_regression) != regression:
        kind = "a regression" if is_regression else "a classification"
        raise ExportError(f"{source}: the task is {kind} task but the model has a {head} "
                          "head; export the model distilled for this task.")
    if not getattr(model, "vocab", None):
        raise ExportError(f"{source}: the model carries no WordPiece vocab; load it from a "
                          "model directory that has vocab.txt (load_model(dir)).")
    return regression


def label_names(model: BertModel) -> list[str]:
    """Class names for a classifier (stored ones or "0".."C-1"); ["score"] for a regressor."""
    if model.head_type == "regressor":
        return ["score"]
    if model.label_names:
        return [str(n) for n in model.label_names]
    return [str(i) for i in range(model.num_labels)]


def make_tokenizer(model: BertModel, max_seq_len: int) -> Tokenizer:
    """The model's own WordPiece tokenizer (its vocab, its casing)."""
    return Tokenizer(model.vocab, lower_case=model.bert_config.lower_case,
                     max_seq_len=max_seq_len)


def check_seq_len(model: BertModel, max_seq_len: int, flag: str = "--max_seq_len") -> int:
    limit = model.bert_config.max_position_embeddings
    if not isinstance(max_seq_len, (int, np.integer)) or not 3 <= int(max_seq_len) <= limit:
        raise ExportError(f"{flag}={max_seq_len!r}: must be an integer in [3, {limit}] "
                          f"(the model's max_position_embeddings).")
    return int(max_seq_len)


def split_texts(texts: Sequence[Text], is_pair: bool, what: str = "dev_texts"
                ) -> tuple[list[str], Optional[list[str]]]:
    """["a", ...] or [("a", "b"|None), ...] -> (text_a list, text_b list or None)."""
    a, b = [], []
    for i, t in enumerate(texts):
        if isinstance(t, (tuple, list)):
            if len(t) != 2:
                raise ExportError(f"{what}[{i}]: expected (text_a, text_b), got {len(t)} items.")
            a.append(str(t[0]))
            b.append(None if t[1] is None else str(t[1]))
        else:
            a.append(str(t))
            b.append(None)
    if is_pair:
        missing = [i for i, x in enumerate(b) if x is None]
        if missing:
            raise ExportError(f"{what}[{missing[0]}]: a pair task needs (text_a, text_b) "
                              f"for every example; {len(missing)} have no text_b.")
        return a, b
    if any(x is not None for x in b):
        raise ExportError(f"{what}: text_b given for a single-sentence task; pass "
                          "is_pair=True for pair tasks.")
    return a, None


def tokenize(tokenizer: Tokenizer, texts_a: Sequence[str], texts_b: Optional[Sequence[str]],
             max_seq_len: int, batch_size: int = 256) -> dict[str, np.ndarray]:
    """Texts -> dict of int32 numpy [N, max_seq_len] model inputs."""
    parts = {k: [] for k in INPUT_NAMES}
    for s in range(0, len(texts_a), batch_size):
        b = None if texts_b is None else list(texts_b[s:s + batch_size])
        out = tokenizer(list(texts_a[s:s + batch_size]), b, max_seq_len=max_seq_len)
        for k in INPUT_NAMES:
            parts[k].append(out[k].numpy())
    if not texts_a:
        return {k: np.zeros((0, max_seq_len), np.int32) for k in INPUT_NAMES}
    return {k: np.concatenate(v, 0) for k, v in parts.items()}


def path_size(path: str) -> int:
    """Bytes of a file, or of every file under a directory."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total
