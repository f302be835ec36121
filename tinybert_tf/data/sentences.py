"""Sentence and sentence-pair examples -> tf.data of packed BERT inputs and labels.

Tokenisation runs in graph (tensorflow-text), so the host keeps only the raw
strings; every sentence-level task type (classification, regression) feeds
its training and evaluation through `make_dataset`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tinybert_tf.data import buckets
from tinybert_tf.data.examples import DataError, Example

# Texts tokenised per eager call when measuring row lengths.
_LENGTH_CHUNK = 4096


def make_dataset(examples: Sequence[Example], tokenizer, max_seq_len: int, batch_size: int,
                 shuffle: bool = False, seed: int = 0, repeat: bool = False,
                 drop_remainder: bool = False, input_context=None,
                 is_regression: Optional[bool] = None,
                 length_buckets: Sequence[int] = ()):
    """Examples -> tf.data of (inputs, labels), tokenised in graph.

    inputs: dict of int32 [B, max_seq_len] input_word_ids / input_mask /
    input_type_ids; labels: int32 [B] class ids (float32 for regression), -1
    for unlabelled examples. `batch_size` is global: with a
    `tf.distribute.InputContext` each input pipeline takes its shard of the
    examples (by index) and yields per-replica batches.
    `is_regression` defaults to "some label is a float".
    `length_buckets`: boundaries (`buckets.bucket_boundaries`); each batch is cut
    to the smallest one that holds its longest row ([B, bucket] inputs).
    """
    import tensorflow as tf

    if not len(examples):
        raise DataError("make_dataset: no examples.")
    has_b = [e.text_b is not None for e in examples]
    if any(has_b) and not all(has_b):
        raise DataError("make_dataset: some examples have text_b and some do not; a task is "
                        "either single-sentence or pair.")
    if is_regression is None:
        is_regression = any(isinstance(e.label, float) for e in examples)
    if is_regression:
        labels = np.array([-1.0 if e.label is None else float(e.label) for e in examples],
                          np.float32)
    else:
        labels = np.array([-1 if e.label is None else int(e.label) for e in examples], np.int32)
    columns = {"text_a": np.array([e.text_a for e in examples], dtype=object)}
    if has_b[0]:
        columns["text_b"] = np.array([e.text_b for e in examples], dtype=object)
    ds = tf.data.Dataset.from_tensor_slices((columns, labels))
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    if shuffle:
        ds = ds.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)

    static_batch = batch_size if drop_remainder else None

    # Plain graph code: autograph converting the tokenizer (tensorflow-text's Python
    # included) took 2 s in every process's first dataset, and it has no tensor `if`.
    # The tokenizer's own traced function: traced once, not once per dataset.
    tokenize = tokenizer.encoder(max_seq_len, pair=has_b[0])

    @tf.autograph.experimental.do_not_convert
    def encode(cols, y):
        inputs = tokenize(*[cols[k] for k in ("text_a", "text_b") if k in cols])
        for v in inputs.values():  # static shapes for XLA / TPU
            v.set_shape([static_batch, max_seq_len])
        return buckets.trim((inputs, y), length_buckets, max_seq_len)

    return ds.map(encode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def packed_lengths(examples: Sequence[Example], tokenizer, max_seq_len: int) -> np.ndarray:
    """int64 [N]: the real tokens (input_mask sum) `make_dataset` packs for each example,
    packed by the same tokenizer call, a chunk of examples at a time."""
    import tensorflow as tf

    out = np.zeros(len(examples), np.int64)
    for start in range(0, len(examples), _LENGTH_CHUNK):
        chunk = examples[start:start + _LENGTH_CHUNK]
        b = [e.text_b for e in chunk] if chunk[0].text_b is not None else None
        inputs = tokenizer(tf.constant([e.text_a for e in chunk], tf.string),
                           None if b is None else tf.constant(b, tf.string),
                           max_seq_len=max_seq_len)
        out[start:start + len(chunk)] = tf.reduce_sum(inputs["input_mask"], axis=1).numpy()
    return out
