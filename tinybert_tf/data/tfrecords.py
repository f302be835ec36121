"""Pre-tokenised corpus shards: TFRecord files of packed sequences, and their reader.

Layout written by `bin/pretokenize --output=PREFIX --num_shards=N`:
  PREFIX-00000-of-0000N.tfrecord ...   one tf.train.Example per packed sequence,
                                       int64 lists `input_word_ids` and
                                       `input_type_ids` of the real tokens (no padding)
  PREFIX.json                          metadata: max_seq_len, pack, vocab_size,
                                       vocab_sha1, num_sequences (per shard and total)
Every file is written under a temporary name and renamed when complete, so a
shard that exists is whole. The reader pads to max_seq_len and rebuilds
input_mask; masking, if asked, is applied afterwards (dynamic, per epoch).
"""
from __future__ import annotations

import glob
import hashlib
import os
from typing import Iterable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf.data.examples import DataError
from tinybert_tf.files import atomic_path, read_json, write_json_atomic

SUFFIX = ".tfrecord"


def shard_path(prefix: str, index: int, num_shards: int) -> str:
    return f"{prefix}-{index:05d}-of-{num_shards:05d}{SUFFIX}"


def meta_path(prefix: str) -> str:
    return prefix + ".json"


def vocab_sha1(vocab: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(vocab).encode("utf-8")).hexdigest()


def serialize(word_ids: np.ndarray, type_ids: np.ndarray) -> bytes:
    """One packed sequence (real tokens only, int [n]) -> serialized tf.train.Example."""
    feat = {"input_word_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=word_ids)),
            "input_type_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=type_ids))}
    return tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString()


def write_shard(path: str, batches: Iterable[dict], progress=None) -> int:
    """Write packed batches (dicts of [B, L] arrays with input_mask) to `path` atomically.

    progress: optional callable(n_sequences_just_written). Returns sequences written.
    """
    n = 0
    with atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as w:
        for b in batches:
            ids, typ, mask = (np.asarray(b[k]) for k in
                              ("input_word_ids", "input_type_ids", "input_mask"))
            lens = mask.sum(axis=1)
            for i in range(ids.shape[0]):
                w.write(serialize(ids[i, :lens[i]], typ[i, :lens[i]]))
            n += ids.shape[0]
            if progress is not None:
                progress(ids.shape[0])
    return n


def write_meta(prefix: str, meta: dict) -> None:
    write_json_atomic(meta_path(prefix), meta)


def resolve_files(source: str) -> list[str]:
    """Shard files of a prefix, a glob, a comma list, or one file; sorted."""
    parts = [p for p in str(source).split(",") if p]
    files: list[str] = []
    for p in parts:
        if os.path.isfile(p):
            files.append(p)
            continue
        hits = sorted(glob.glob(p)) or sorted(glob.glob(p + "-*-of-*" + SUFFIX))
        files.extend(hits)
    if not files:
        raise DataError(f"{source}: no TFRecord shards found (expected PREFIX-00000-of-0000N"
                        f"{SUFFIX} files written by bin/pretokenize, a glob, or file names).")
    return files


def read_meta(source: str) -> Optional[dict]:
    """PREFIX.json next to the shards, if any."""
    files = resolve_files(source)
    base = files[0]
    if "-of-" in base:
        prefix = base[: base.rfind("-", 0, base.rfind("-of-"))]
        return read_json(meta_path(prefix), default=None, error=DataError, expect=dict)
    return None


def record_dataset(source: str, max_seq_len: int, input_context=None, shuffle: bool = False,
                   seed: int = 0, tokenizer=None) -> tf.data.Dataset:
    """Shards -> dataset of packed sequences, dict of int32 [max_seq_len].

    With an InputContext each pipeline reads every n-th shard when there are at
    least as many shards as pipelines, else every n-th record. The metadata
    (when present) must agree with max_seq_len and the tokenizer's vocab.
    """
    files = resolve_files(source)
    meta = read_meta(source)
    if meta is not None:
        if int(meta["max_seq_len"]) > int(max_seq_len):
            raise DataError(f"{source}: shards were packed to max_seq_len="
                            f"{meta['max_seq_len']} > the requested {max_seq_len}; re-run "
                            f"bin/pretokenize with --max_seq_len={max_seq_len}.")
        if tokenizer is not None and meta.get("vocab_sha1") not in (None,
                                                                   vocab_sha1(tokenizer.vocab)):
            raise DataError(f"{source}: shards were tokenised with a different vocab "
                            f"({meta.get('vocab_size')} tokens) than the model's "
                            f"({tokenizer.vocab_size}); re-run bin/pretokenize with its vocab.")
    fds = tf.data.Dataset.from_tensor_slices(files)
    record_shard = False
    if input_context is not None and input_context.num_input_pipelines > 1:
        if len(files) >= input_context.num_input_pipelines:
            fds = fds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        else:
            record_shard = True
    if shuffle:
        fds = fds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = fds.interleave(tf.data.TFRecordDataset, cycle_length=min(4, len(files)),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if record_shard:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    spec = {"input_word_ids": tf.io.VarLenFeature(tf.int64),
            "input_type_ids": tf.io.VarLenFeature(tf.int64)}
    L = int(max_seq_len)

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        ids = tf.sparse.to_dense(ex["input_word_ids"])
        typ = tf.sparse.to_dense(ex["input_type_ids"])
        n = tf.size(ids)
        tf.debugging.assert_less_equal(n, L, message=f"a TFRecord sequence is longer than "
                                       f"max_seq_len={L}; re-run bin/pretokenize")
        pad = [[0, L - n]]
        return {"input_word_ids": tf.ensure_shape(tf.cast(tf.pad(ids, pad), tf.int32), [L]),
                "input_mask": tf.ensure_shape(tf.pad(tf.ones([n], tf.int32), pad), [L]),
                "input_type_ids": tf.ensure_shape(tf.cast(tf.pad(typ, pad), tf.int32), [L])}

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
