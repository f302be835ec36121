"""Pre-tokenised corpus shards: TFRecord files of packed sequences, and their reader.

Layout written by `bin/pretokenize --output=PREFIX --num_shards=N`:
  PREFIX-00000-of-0000N.tfrecord ...   one tf.train.Example per packed sequence,
                                       int64 lists `input_word_ids` and
                                       `input_type_ids` of the real tokens (no padding)
  PREFIX.json                          metadata: max_seq_len, pack, vocab_size,
                                       vocab_sha1, num_sequences, and per shard its
                                       file name, sequences and bytes
Every shard is written under a temporary name and renamed when complete, and
PREFIX.json is written last, so a set without it is an interrupted run.

Reading checks the set before the first step: a glob or prefix must find every
shard its names (`-of-N`) and PREFIX.json promise, with the sizes PREFIX.json
records, so a missing or truncated shard (an interrupted copy) is an error
naming the file, not silently less data. A shard damaged in a way sizes cannot
show fails in tf.data with TensorFlow's `DataLossError`, which names no file;
`damaged_record_error` finds the file (see `corpus.translate_data_errors`).

The reader is vectorised: serialized records are batched first and parsed with
one `tf.io.parse_example` per batch (ragged features padded to max_seq_len),
so no Python and no per-example op runs per sequence.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import re
from typing import Iterable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data.examples import DataError

logger = logging.getLogger(__name__)

SUFFIX = ".tfrecord"
SHARD_NAME = re.compile(r"^(?P<prefix>.*)-(?P<index>\d{5})-of-(?P<total>\d{5})"
                        + re.escape(SUFFIX) + "$")
FEATURES = ("input_word_ids", "input_type_ids")


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


def encode_batch(batch: dict) -> tf.Tensor:
    """Packed sequences (dict of int [B, L] with input_mask) -> serialized tf.train.Examples
    tf.string [B] of their real tokens, in graph (`tf.io.encode_proto`, one op per
    message level): the messages `serialize` builds, with no Python per sequence."""
    lengths = tf.reduce_sum(tf.cast(batch["input_mask"], tf.int32), axis=1)[:, None]
    B = tf.shape(lengths)[0]
    ones = tf.ones([B, 1], tf.int32)

    def entry(key: str) -> tf.Tensor:
        values = tf.io.encode_proto(lengths, [tf.cast(batch[key], tf.int64)], ["value"],
                                    "tensorflow.Int64List")
        feature = tf.io.encode_proto(ones, [values[:, None]], ["int64_list"],
                                     "tensorflow.Feature")
        return tf.io.encode_proto(tf.fill([B, 2], 1), [tf.fill([B, 1], key), feature[:, None]],
                                  ["key", "value"], "tensorflow.Features.FeatureEntry")

    entries = tf.stack([entry(k) for k in FEATURES], axis=1)
    features = tf.io.encode_proto(tf.fill([B, 1], len(FEATURES)), [entries], ["feature"],
                                  "tensorflow.Features")
    return tf.io.encode_proto(ones, [features[:, None]], ["features"], "tensorflow.Example")


def write_shard(path: str, batches: Iterable[Sequence[bytes]], progress=None) -> int:
    """Write batches of serialized records (`encode_batch` output) to `path` atomically.

    progress: optional callable(n_sequences_just_written). Returns sequences written.
    """
    n = 0
    with files.atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as w:
        for records in batches:
            for record in records:
                w.write(record)
            n += len(records)
            if progress is not None:
                progress(len(records))
    return n


def write_meta(prefix: str, meta: dict) -> None:
    files.write_json_atomic(meta_path(prefix), meta)


def set_files(prefix: str) -> list[str]:
    """Every shard file of `prefix`, whatever its shard count (for cleaning a set)."""
    return [f for f in files.glob(f"{prefix}-*-of-*{SUFFIX}")
            if SHARD_NAME.match(os.path.basename(f))]


# --- finding and checking a set ----------------------------------------------------

@dataclasses.dataclass
class ShardSet:
    """The shard files of a source, the PREFIX.json of each prefix among them (None where
    there is none) and whether the source named the files one by one (a subset is
    then allowed)."""
    files: list[str]
    metas: dict[str, Optional[dict]]
    explicit: bool

    def sequences_per_file(self) -> Optional[dict[str, int]]:
        """{shard file: packed sequences} from the metadata; None where any is unknown."""
        out = {}
        for f in self.files:
            meta = self.metas.get(_prefix_of(f) or "")
            counts = {e["file"]: e.get("num_sequences") for e in (meta or {}).get("shards", [])}
            if counts.get(os.path.basename(f)) is None:
                return None
            out[f] = int(counts[os.path.basename(f)])
        return out


def _list(source: str) -> tuple[list[str], bool]:
    parts = [p for p in str(source).split(",") if p]
    found: list[str] = []
    explicit = True
    for p in parts:
        if files.isfile(p):
            found.append(p)
            continue
        explicit = False
        hits = [h for h in files.glob(p) if not h.endswith((".json", "/"))
                and (files.is_remote(h) or not files.isdir(h))]
        found.extend(hits or files.glob(p + "-*-of-*" + SUFFIX))
    if not found:
        raise DataError(f"{source}: no TFRecord shards found (expected PREFIX-00000-of-0000N"
                        f"{SUFFIX} files written by bin/pretokenize, a glob, or file names).")
    return list(dict.fromkeys(found)), explicit


def _prefix_of(path: str) -> Optional[str]:
    m = SHARD_NAME.match(os.path.basename(path))
    return os.path.join(os.path.dirname(path), m.group("prefix")) if m else None


def _named(listed: list[str], more: int) -> str:
    return ", ".join(listed) + (f" and {more} more" if more > 0 else "")


_FIX = "copy the whole set (every shard and PREFIX.json), or re-run bin/pretokenize"


def _check_names(source: str, found: list[str]) -> None:
    """A glob or prefix must find every shard its -of-N names promise, of one N."""
    totals: dict[str, set[int]] = collections.defaultdict(set)
    for f in found:
        m = SHARD_NAME.match(os.path.basename(f))
        if m:
            totals[_prefix_of(f)].add(int(m.group("total")))
    for prefix, counts in totals.items():
        if len(counts) > 1:
            raise DataError(f"{source}: mixes shard sets of {prefix} with {sorted(counts)} "
                            f"shards (an older bin/pretokenize run?); remove the set that "
                            f"{meta_path(prefix)} does not list.")
        total = counts.pop()
        missing = sorted({shard_path(prefix, i, total) for i in range(total)} - set(found))
        if missing:
            raise DataError(f"{source}: {len(missing)} of {total} shards missing: "
                            f"{_named(missing[:3], len(missing) - 3)}; {_FIX}.")


def _check_meta_files(source: str, prefix: str, meta: dict, found: list[str],
                      explicit: bool) -> None:
    """The files of `prefix` found must be those PREFIX.json lists, at the sizes it records."""
    listed = {e["file"]: e for e in meta.get("shards", [])}
    mine = [f for f in found if _prefix_of(f) == prefix]
    names = {os.path.basename(f) for f in mine}
    if not explicit:
        missing = [os.path.join(os.path.dirname(prefix), n) for n in sorted(set(listed) - names)]
        if missing:
            raise DataError(f"{source}: {len(missing)} of {len(listed)} shards listed in "
                            f"{meta_path(prefix)} are missing: "
                            f"{_named(missing[:3], len(missing) - 3)}; {_FIX}.")
        extra = sorted(names - set(listed))
        if extra:
            raise DataError(f"{source}: {_named(extra[:3], len(extra) - 3)} not listed in "
                            f"{meta_path(prefix)} (left by another bin/pretokenize run?); "
                            "remove them or re-run bin/pretokenize.")
    for f in mine:
        entry = listed.get(os.path.basename(f), {})
        if "bytes" in entry and files.stat(f).size != int(entry["bytes"]):
            raise DataError(f"{f}: {files.stat(f).size} bytes, but {meta_path(prefix)} "
                            f"records {entry['bytes']}: the shard is truncated or was replaced "
                            f"(an interrupted copy?); {_FIX}.")


def shard_set(source: str) -> ShardSet:
    """The checked shard set of a prefix, a glob, a comma list, or single files.

    Missing, foreign or truncated shards -> DataError naming them and the fix
    (a source naming files one by one may be a subset).
    """
    found, explicit = _list(source)
    metas: dict[str, Optional[dict]] = {}
    for prefix in dict.fromkeys(_prefix_of(f) for f in found):
        if prefix is not None:
            metas[prefix] = files.read_json(meta_path(prefix), default=None, error=DataError,
                                            expect=dict)
            if metas[prefix] is not None:
                _check_meta_files(source, prefix, metas[prefix], found, explicit)
            elif not explicit:
                logger.warning("%s: no %s: vocab, sequence length and shard sizes cannot be "
                               "checked (bin/pretokenize writes it last; a set without it may "
                               "be from an interrupted run).", source, meta_path(prefix))
    if not explicit:  # sets without PREFIX.json: their -of-N names still tell
        _check_names(source, [f for f in found if metas.get(_prefix_of(f)) is None])
    return ShardSet(found, metas, explicit)


def read_meta(source: str) -> Optional[dict]:
    """PREFIX.json of the source's first shard, if any."""
    found, _ = _list(source)
    prefix = _prefix_of(found[0])
    if prefix is None:
        return None
    return files.read_json(meta_path(prefix), default=None, error=DataError, expect=dict)


def resolve_files(source: str) -> list[str]:
    """Shard files of a prefix, a glob, a comma list, or one file; sorted per pattern and
    checked for missing or truncated shards (see `shard_set`)."""
    return shard_set(source).files


# --- reading -------------------------------------------------------------------------

# Shard files read in this process, newest last: TensorFlow's DataLossError names
# no file, so `damaged_record_error` looks for the damaged one among these.
_RECENT: "collections.OrderedDict[str, tuple[str, ...]]" = collections.OrderedDict()


def remember_files(source: str, shard_files: Sequence[str]) -> None:
    """Note the shards of a dataset being built, for `damaged_record_error`."""
    _RECENT[source] = tuple(shard_files)
    _RECENT.move_to_end(source)
    while len(_RECENT) > 16:
        _RECENT.popitem(last=False)


def check_meta(source: str, meta: Optional[dict], max_seq_len: int, tokenizer=None) -> None:
    """A PREFIX.json must agree with max_seq_len and the tokenizer's vocab."""
    if meta is None:
        return
    if int(meta["max_seq_len"]) > int(max_seq_len):
        raise DataError(f"{source}: shards were packed to max_seq_len="
                        f"{meta['max_seq_len']} > the requested {max_seq_len}; re-run "
                        f"bin/pretokenize with --max_seq_len={max_seq_len}.")
    if tokenizer is not None and meta.get("vocab_sha1") not in (None,
                                                               vocab_sha1(tokenizer.vocab)):
        raise DataError(f"{source}: shards were tokenised with a different vocab "
                        f"({meta.get('vocab_size')} tokens) than the model's "
                        f"({tokenizer.vocab_size}); re-run bin/pretokenize with its vocab.")


def serialized_dataset(shard_files: Sequence[str], num_pipelines: int = 1, index: int = 0,
                       by_record: bool = False, deterministic: bool = True,
                       cycle_length: int = 4) -> tf.data.Dataset:
    """Serialized records (tf.string scalars) of `shard_files`, read in parallel.

    by_record: keep every num_pipelines-th record (DATA sharding; every pipeline
    reads every file). Without it the caller has already given this pipeline its
    own files. deterministic=False lets the interleave hand out whichever record
    is ready first; use it only where order does not matter.
    """
    fds = tf.data.Dataset.from_tensor_slices(list(shard_files))
    cycle = max(1, min(cycle_length, len(shard_files)))
    ds = fds.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20),
                        cycle_length=cycle, num_parallel_calls=cycle,
                        deterministic=deterministic)
    if by_record and num_pipelines > 1:
        ds = ds.shard(num_pipelines, index)
    return ds


def parse_batch(serialized: tf.Tensor, max_seq_len: int, pad_id: int = 0) -> dict:
    """Serialized records [B] -> dict of int32 [B, max_seq_len] input_word_ids,
    input_mask, input_type_ids (one vectorised parse, ragged rows padded)."""
    L = int(max_seq_len)
    spec = {k: tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int32) for k in FEATURES}
    ex = tf.io.parse_example(serialized, spec)
    ids, typ = ex["input_word_ids"], ex["input_type_ids"]
    lengths = ids.row_lengths()
    tf.debugging.assert_less_equal(tf.reduce_max(tf.concat([lengths, [0]], 0)), L,
                                   message=f"a TFRecord sequence is longer than "
                                   f"max_seq_len={L}; re-run bin/pretokenize")
    shape = [serialized.shape[0], L]  # B static with drop_remainder, for XLA
    out = {"input_word_ids": tf.cast(ids.to_tensor(default_value=pad_id, shape=shape), tf.int32),
           "input_mask": tf.sequence_mask(lengths, L, dtype=tf.int32),
           "input_type_ids": tf.cast(typ.to_tensor(default_value=0, shape=shape), tf.int32)}
    return {k: tf.ensure_shape(v, shape) for k, v in out.items()}


def split_files(shard_files: Sequence[str], num_pipelines: int, index: int,
                policy: str = "auto") -> tuple[list[str], bool]:
    """(files pipeline `index` reads, whether it must also keep only every n-th record).

    policy "auto": its own files (file i to pipeline i mod n, in sorted order, so
    every worker computes the same split alone) when there are at least as many
    files as pipelines, else every file and every n-th record (DATA sharding).
    "file" requires enough files; "data" always shards by record.
    """
    if policy not in ("auto", "file", "data"):
        raise ValueError(f"input sharding policy must be auto, file or data, not {policy!r}.")
    if not 0 <= index < max(1, num_pipelines):
        raise ValueError(f"input pipeline {index} not in [0, {num_pipelines}).")
    shard_files = list(shard_files)
    if num_pipelines <= 1:
        return shard_files, False
    if policy == "file" and len(shard_files) < num_pipelines:
        raise DataError(f"file sharding needs at least as many files as input pipelines: "
                        f"{len(shard_files)} files for {num_pipelines} pipelines; write more "
                        f"shards (bin/pretokenize --num_shards) or use DATA sharding.")
    if policy == "data" or len(shard_files) < num_pipelines:
        return shard_files, True
    return shard_files[index::num_pipelines], False


# --- locating a damaged shard ------------------------------------------------------

_DAMAGE = re.compile(r"(truncated|corrupted) record at (\d+)")


def find_damaged(candidates: Sequence[str], kind: str, offset: int,
                 max_files: int = 64) -> list[str]:
    """Shards among `candidates` that fail with TensorFlow's "`kind` record at `offset`".

    TensorFlow's message names no file; files no longer than the offset cannot
    be it, and of the rest the smallest (a truncated copy is short) are read
    until one fails the same way. At most `max_files` are read.
    """
    sized = []
    for f in dict.fromkeys(candidates):
        try:
            size = files.stat(f).size
        except files.FileAccessError:
            continue
        if size >= offset:
            sized.append((size, f))
    hits = []
    for _, f in sorted(sized)[:max_files]:
        try:
            for _ in tf.data.TFRecordDataset(f).batch(4096):
                pass
        except tf.errors.DataLossError as e:
            m = _DAMAGE.search(e.message or "")
            if m and m.group(1) == kind and int(m.group(2)) == offset:
                hits.append(f)
                break
    return hits


def damaged_record_error(message: str, candidates: Optional[Sequence[str]] = None
                         ) -> Optional[DataError]:
    """A DataError naming the shard of a TFRecord DataLossError `message` (None when the
    message is not one); candidates: the shards to search (default: those read here)."""
    m = _DAMAGE.search(message or "")
    if m is None:
        return None
    kind, offset = m.group(1), int(m.group(2))
    if candidates is None:
        candidates = [f for shard_files in reversed(_RECENT.values()) for f in shard_files]
    hits = find_damaged(candidates, kind, offset)
    what = "ends inside a record" if kind == "truncated" else "fails its checksum"
    fix = ("the shard is incomplete or damaged (an interrupted copy?): copy it again, or "
           "re-run bin/pretokenize")
    if hits:
        return DataError(f"{hits[0]}: {kind} TFRecord: the record at byte {offset} {what}; "
                         f"{fix}.")
    return DataError(f"a TFRecord shard is {kind} at byte {offset} (TensorFlow does not say "
                     f"which file, and none of the {len(candidates)} shards read here failed "
                     f"again); {fix}.")
