"""What every exporter shares: input checks, text handling, the Keras reference outputs.

Exports serve task models: a `BertModel` with a task head. Its task type
(`tinybert_tf.tasks`) decides the outputs (class probabilities, a score, ...).
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.config import BertConfig
from tinybert_tf.models.encoder import INPUT_NAMES, BertModel
from tinybert_tf.models.tracing import any_shape_function
from tinybert_tf.tasks import TaskType, task_type_of

Text = Union[str, tuple]  # "text" or ("text a", "text b" | None)


class ExportError(ValueError):
    """Bad export input; the message names the model/flag/file at fault and the fix."""


def export_task(model: BertModel, task: Optional[TaskType] = None,
                source: str = "model") -> TaskType:
    """The task type an export of `model` serves; raises unless `model` has a
    task head and a vocab, and (when `task` is given) the task's head.

    Labels come from the model: its outputs are in its own order, so every export
    (labels.txt, the `label` output, TFLite metadata) names them in that order.
    A `task` whose label names differ from the model's is refused; one with the
    same names in another order is served in the model's order
    (`TaskType.with_label_order`). Without `task`, the model's own head and label
    names decide.
    """
    head = getattr(model, "head_type", None)
    try:
        own = task_type_of(model)
    except ValueError:
        raise ExportError(
            f"{source}: has head={head!r}; export needs a task model with a task head (a "
            "model directory written by the task stage, or load_model(dir, "
            "head='classifier', num_labels=N) after fine-tuning).") from None
    if task is not None and not task.accepts(head):
        raise ExportError(f"{source}: the task is a {task.kind} task but the model has a "
                          f"{head} head; export the model distilled for this task.")
    if not getattr(model, "vocab", None):
        raise ExportError(f"{source}: the model carries no WordPiece vocab; load it from a "
                          "model directory that has vocab.txt (load_model(dir)).")
    if task is None:
        return own
    task = task.with_head(head)  # the student's head style (--classifier_head)
    names = list(getattr(model, "label_names", None) or [])
    if task.named_outputs and names and list(task.label_names) != names:
        if sorted(names) != sorted(task.label_names):
            raise ExportError(
                f"{source}: its outputs are the labels {names} but the task's are "
                f"{list(task.label_names)}; export it for the task it was trained on.")
        return task.with_label_order(names)
    return task


def label_permutation(served: TaskType, task: TaskType) -> Optional[list[int]]:
    """Indices that put outputs in `served`'s label order into `task`'s order (for the
    task's metrics), or None when the orders agree."""
    a, b = list(served.label_names), list(task.label_names)
    if not task.named_outputs or a == b or sorted(a) != sorted(b):
        return None
    return [a.index(n) for n in b]


def output_function(model: BertModel, task: TaskType) -> Callable[[dict], tf.Tensor]:
    """A traced function: a batch of packed inputs -> the model's outputs in the task's
    export space (`task.tflite_output`: probabilities, score, ...). Keep it to call again
    (as `keras_outputs(..., run=)`) without tracing again; one trace for every batch
    size and length."""

    def run(batch):
        logits = tf.cast(model(batch, training=False)["logits"], tf.float32)
        return task.tflite_output(logits)
    return any_shape_function(run)


def keras_outputs(model: BertModel, task: TaskType, inputs: dict[str, np.ndarray],
                  batch_size: int = 64, run: Optional[Callable[[dict], tf.Tensor]] = None
                  ) -> np.ndarray:
    """The Keras model's outputs in the task's export space, [N, ...], over packed
    inputs; `run`: the model's `output_function`, when the caller keeps one."""
    run = run or output_function(model, task)
    n = len(inputs[INPUT_NAMES[0]])
    outs = [run({k: tf.constant(v[s:s + batch_size]) for k, v in inputs.items()}).numpy()
            for s in range(0, n, batch_size)]
    return np.concatenate(outs, 0) if outs else np.zeros((0, task.num_outputs), np.float32)


def check_seq_len(model: BertModel, max_seq_len: int, flag: str = "--max_seq_len") -> int:
    """`max_seq_len` as an int, when the model's position table holds it."""
    return seq_len_within(model.bert_config, max_seq_len, flag)


def seq_len_within(config: BertConfig, max_seq_len: int, flag: str = "--max_seq_len") -> int:
    """`max_seq_len` as an int, when a model of `config` can take it: in [3,
    max_position_embeddings] ([CLS], a piece, [SEP])."""
    limit = config.max_position_embeddings
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


def path_size(path: str) -> int:
    """Bytes of a file, or of every file under a directory (any tf.io.gfile path)."""
    if files.isfile(path):
        return files.stat(path).size
    total = 0
    with files.translate_errors(path, "list"):
        for root, _, names in tf.io.gfile.walk(path):
            total += sum(files.stat(os.path.join(root, f)).size for f in names)
    return total
