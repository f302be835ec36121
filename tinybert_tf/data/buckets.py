"""Length buckets: batches padded to one of a few lengths instead of `--max_seq_len`.

GLUE sentences are far shorter than their task's sequence length (SST-2's
training phrases average about 13 word pieces at length 64), so a batch padded
to the full length spends most of its matmuls on padding. A bucketed batch is
padded only to the smallest bucket boundary that holds its longest row.

  boundaries      `bucket_boundaries(max_seq_len, count)`: `count` evenly spaced
                  lengths ending at max_seq_len (multiples of 8 when the step
                  allows), so a traced or XLA-compiled step sees at most `count`
                  shapes.
  training order  `grouped_order(lengths, batch_size, seed, epoch)`: the epoch's
                  permutation (`epoch_permutation`, the order of a padded epoch)
                  without the rows a padded epoch drops too, sorted by length
                  within windows of `GROUP_WINDOW` batches, cut into batches, and
                  the batches shuffled. Every kept row appears once; the order is
                  a function of (lengths, batch size, seed, epoch) alone, so a
                  resume rebuilds it and skips the batches already trained on.
  inference order `length_order(lengths)`: rows sorted by length (stable); the
                  caller puts the outputs back with `unsort`.
  in graph        `trim(batch, boundaries, max_seq_len)`: cuts a batch of
                  [B, max_seq_len] tensors to [B, bucket].

The model's outputs at real positions do not depend on the padding length (the
attention mask gives padded keys exactly zero weight), so anything computed
from real positions only (classification logits, losses with padding masked)
is the same, to float rounding, for a bucketed and a padded batch. Losses that
count padded positions (the reference's attention and hidden losses) are not:
see docs/distillation.md.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

# Batches per window sorted by length in `grouped_order`: large enough that a
# batch's rows have nearly equal lengths, small enough that a batch still mixes
# rows from the whole epoch (Hugging Face's group_by_length uses 50 too).
GROUP_WINDOW = 50


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of `n` rows in `epoch`: a NumPy permutation seeded by (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def bucket_boundaries(max_seq_len: int, count: int) -> tuple[int, ...]:
    """`count` padded lengths, evenly spaced, the last = max_seq_len; () when count <= 0.

    The step is a multiple of 8 when max_seq_len >= 8 * count (8-aligned shapes suit
    the matmul kernels), e.g. (8, 16, ..., 64) for 64 and 8 buckets, (16, 32, ..., 128)
    for 128.
    """
    length, count = int(max_seq_len), int(count)
    if count <= 0:
        return ()
    step = max(1, math.ceil(length / count))
    if length >= 8 * count:
        step = math.ceil(step / 8) * 8
    return tuple(sorted({min(length, step * i) for i in range(1, count + 1)} | {length}))


def padded_lengths(lengths: np.ndarray, boundaries: Sequence[int]) -> np.ndarray:
    """The bucket boundary each length is padded to (lengths beyond the last: the last)."""
    b = np.asarray(boundaries, np.int64)
    idx = np.minimum(np.searchsorted(b, np.asarray(lengths), side="left"), len(b) - 1)
    return b[idx]


def batch_length(lengths: np.ndarray, boundaries: Sequence[int], max_seq_len: int) -> int:
    """The padded length of a batch whose rows have `lengths`: its bucket, or
    max_seq_len without buckets."""
    if not len(boundaries):
        return int(max_seq_len)
    return int(padded_lengths(np.asarray([np.max(lengths)]), boundaries)[0])


def grouped_order(lengths: np.ndarray, batch_size: int, seed: int, epoch: int,
                  window: int = GROUP_WINDOW) -> np.ndarray:
    """Row indices of `epoch`, batch after batch: n - n % batch_size of them.

    The epoch permutation's first n - n % batch_size rows (those a padded epoch with
    drop_remainder keeps), sorted by length (stable) within consecutive windows of
    `window` batches, cut into batches, the batches then shuffled with (seed, epoch).
    """
    lengths = np.asarray(lengths)
    n, size = len(lengths), int(batch_size)
    keep = n - n % size
    perm = epoch_permutation(n, seed, epoch)[:keep]
    batches = []
    for start in range(0, keep, window * size):
        chunk = perm[start:start + window * size]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk.reshape(-1, size))
    if not batches:
        return np.zeros(0, np.int64)
    shuffle = np.random.default_rng([seed, epoch, 1]).permutation(len(batches))
    return np.concatenate([batches[i] for i in shuffle])


def length_order(lengths: np.ndarray) -> np.ndarray:
    """Rows sorted by length (ties in row order): inference batches of similar length."""
    return np.argsort(np.asarray(lengths), kind="stable")


def unsort(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Outputs computed in `order` ([N, ...]) back in row order."""
    out = np.empty_like(values)
    out[order] = values
    return out


def pad_positions(values: np.ndarray, max_seq_len: Optional[int]) -> np.ndarray:
    """Per-position outputs of a bucket-padded batch ([b, bucket, ...]) padded back to
    [b, max_seq_len, ...] with zeros; other outputs (and max_seq_len=None) unchanged."""
    if max_seq_len is None or values.ndim < 3 or values.shape[1] == max_seq_len:
        return values
    pad = [(0, 0), (0, max_seq_len - values.shape[1])] + [(0, 0)] * (values.ndim - 2)
    return np.pad(values, pad)


def trim(structure: Any, boundaries: Sequence[int], max_seq_len: int,
         mask_key: str = "input_mask") -> Any:
    """A batch (nest of tensors) with every [B, max_seq_len, ...] tensor cut to
    [B, bucket, ...]: the smallest boundary >= the longest row (input_mask sums).

    The first dict in the nest holding `mask_key` gives the lengths; tensors whose
    second axis is not max_seq_len (labels [B], spans [B, 2]) pass unchanged.
    """
    import tensorflow as tf

    if not len(boundaries):
        return structure
    mask = _find(structure, mask_key)
    longest = tf.reduce_max(tf.reduce_sum(tf.cast(mask, tf.int32), axis=1))
    table = tf.constant(list(boundaries), tf.int32)
    index = tf.minimum(tf.searchsorted(table, tf.reshape(longest, [1]), side="left")[0],
                       len(boundaries) - 1)
    length = table[index]
    L = int(max_seq_len)

    def cut(t):
        rank = t.shape.rank
        if rank is not None and rank >= 2 and t.shape[1] == L:
            # tf.slice, not t[:, :length]: two ops where the slicing syntax traces ~15.
            return tf.slice(t, [0] * rank, tf.stack([-1, length] + [-1] * (rank - 2)))
        return t
    return tf.nest.map_structure(cut, structure)


def _find(structure: Any, key: str):
    if isinstance(structure, dict):
        if key in structure:
            return structure[key]
        items = structure.values()
    elif isinstance(structure, (list, tuple)):
        items = structure
    else:
        items = ()
    for item in items:
        found = _find(item, key)
        if found is not None:
            return found
    return None
