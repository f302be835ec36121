"""The intermediate phase's teacher cache: the mapped layers' outputs of every row, in bfloat16.

The intermediate phase (embd + attn + hidn, 20 epochs in the paper) runs the
frozen teacher on the same rows every epoch. Its terms read only a few of the
teacher's outputs (`Distiller.teacher_keys`): the embeddings, the hidden
states of the mapped layers g(1..M) and their attention scores. This cache
runs the teacher once over the phase's rows, keeps those outputs in the phase
folder, and every epoch's batches carry them (`teacher_embeddings`,
`teacher_hidden_states/<g>`, `teacher_attention_scores/<g-1>`), so the
Distiller skips the teacher's forward pass.

What is stored: each value rounded to bfloat16 (round to nearest even, as
`tf.cast` does) and kept as its uint16 bit pattern. When every term masks
padding (`--mask_padding`) a row is stored at its real length n ([n, d] per
hidden state, [h, n, n] per attention map; padded positions are zero in a
batch, and no masked loss reads them); otherwise at max_seq_len, since the
reference's losses read the teacher's values at padded positions too.

When (`plan`): with `--teacher_cache`, for a phase of more than one epoch (the
pass costs the teacher's share of one epoch, so a one-epoch phase gains
nothing), when the estimated size fits `--teacher_cache_budget_gb`. The plan
of `--dry_run` shows the estimate and the decision.

Equality: a cached batch holds bf16(teacher output) of its rows, so training
from the cache is training against the teacher's outputs rounded to bfloat16:
the same losses and updates, to float rounding (1e-6), as recomputing the
teacher every step and rounding its outputs (tests/pipeline/test_layer_cache.py).
Against the unrounded float32 teacher each target moves by at most 2^-9 of
its magnitude (half a bfloat16 step); docs/measurements.md gives the
measured change of the losses.

Files, under the phase folder's `layer_cache/`: `cache.json` (what the values
belong to: rows, the teacher files' content and dtype, mapped outputs, row storage), and
per part of `PART_ROWS` rows one `part-NNNNN.<output>.npy` per output (the
rows' values concatenated) and `part-NNNNN.lengths.npy`, written last: a part
counts only when its lengths file is there and every array has the expected
size, so a run killed while caching resumes at the first incomplete part. Local
parts are memory-mapped while training; on a remote --output_dir (gs://) they
are read into memory.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import posixpath
import time
import types
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data import buckets
from tinybert_tf.distill.distiller import TEACHER_KEY_PREFIX, teacher_batch_keys
from tinybert_tf.distill.terms import LossTerm
from tinybert_tf.pipeline.training import teacher_cache as cache_lib
from tinybert_tf.tasks.base import TaskType, inference_batches

CACHE_FOLDER = "layer_cache"
META_FILE = "cache.json"
# A part (the unit of resumption) holds at most this many rows and about this many bytes.
PART_ROWS = 4096
PART_BYTES = 256 * 2**20
_VERSION = 1
# The encoder outputs a cache can hold, by the shape of one row: [n, d] or [h, n, n].
OUTPUT_KINDS = {"embeddings": "hidden", "hidden_states": "hidden",
                "attention_scores": "attention"}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which outputs a cache holds and how rows are stored."""

    keys: tuple[str, ...]          # batch keys, e.g. teacher_hidden_states/6
    hidden_size: int               # the teacher's d
    num_heads: int                 # the teacher's h
    real_length: bool              # rows at their real length (masked terms) or max_seq_len
    max_seq_len: int

    def kind(self, key: str) -> str:
        return OUTPUT_KINDS[key[len(TEACHER_KEY_PREFIX):].partition("/")[0]]

    def row_values(self, key: str, n: np.ndarray) -> np.ndarray:
        """Values of `key` per row stored at length n (array)."""
        n = np.asarray(n, np.int64)
        if self.kind(key) == "hidden":
            return n * self.hidden_size
        return self.num_heads * n * n

    def stored_lengths(self, lengths: np.ndarray) -> np.ndarray:
        return (np.asarray(lengths, np.int64) if self.real_length
                else np.full(len(lengths), self.max_seq_len, np.int64))

    def bytes(self, lengths: np.ndarray) -> int:
        """Bytes (2 per value) of rows with real `lengths`."""
        n = self.stored_lengths(lengths)
        return int(sum(self.row_values(k, n).sum() for k in self.keys) * 2)

    @property
    def part_rows(self) -> int:
        """Rows per part: PART_ROWS, fewer when full-length rows would pass PART_BYTES."""
        full = self.bytes(np.array([self.max_seq_len]))
        return int(max(1, min(PART_ROWS, PART_BYTES // max(1, full))))

    def describe(self) -> dict[str, Any]:
        return {"outputs": list(self.keys), "rows_stored_at": (
            "real length" if self.real_length else f"max_seq_len ({self.max_seq_len})")}


def layout(terms: Sequence[LossTerm], student_config, teacher_config,
           max_seq_len: int) -> Optional[Layout]:
    """The cache layout for a phase's (unbuilt) terms and its models' configs; None
    when the terms read a teacher output the cache cannot hold (logits, a whole list,
    an undeclared read)."""
    built = []
    shim = (types.SimpleNamespace(bert_config=student_config, head_type=None, num_labels=None),
            types.SimpleNamespace(bert_config=teacher_config, head_type=None, num_labels=None))
    for term in terms:
        if not term.needs_teacher:
            continue
        term = copy.copy(term)
        try:
            term.build(*shim)
        except (ValueError, AttributeError, TypeError):
            return None
        built.append(term)
    keys = teacher_batch_keys(built)
    if not keys:
        return None
    for key in keys:
        name, _, index = key[len(TEACHER_KEY_PREFIX):].partition("/")
        if name not in OUTPUT_KINDS or (name != "embeddings" and not index):
            return None
    return Layout(tuple(keys), int(teacher_config.hidden_size), int(teacher_config.num_heads),
                  all(t.padding_invariant for t in built), int(max_seq_len))


@dataclasses.dataclass
class Plan:
    """Whether the intermediate phase uses the cache, and why."""

    use: bool
    reason: str
    layout: Optional[Layout] = None
    bytes: int = 0
    estimate: bool = False

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"use": self.use, "why": self.reason}
        if self.layout is not None:
            out.update(self.layout.describe())
            out["gib"] = round(self.bytes / 2**30, 3)
            if self.estimate:
                out["gib_is"] = "an estimate: the augmented set is not written yet"
        return out


def plan(layout_: Optional[Layout], lengths: Optional[np.ndarray], epochs: float,
         enabled: bool, budget_gb: float, scale: float = 1.0) -> Plan:
    """The decision for a phase of `epochs` over rows of real `lengths` (`scale`: rows
    per known row when the rows are not known yet, e.g. N_a + 1 before augmentation)."""
    if not enabled:
        return Plan(False, "--noteacher_cache")
    if layout_ is None:
        return Plan(False, "the loss terms read teacher outputs the cache does not hold")
    if lengths is None:
        return Plan(False, "the task's rows are not known before the stage runs", layout_)
    size = int(layout_.bytes(lengths) * scale)
    estimate = scale != 1.0
    if epochs <= 1:
        return Plan(False, "one epoch: the teacher would run once either way", layout_, size,
                    estimate)
    budget = float(budget_gb) * 2**30
    if size > budget:
        return Plan(False, f"{size / 2**30:.2f} GiB exceeds --teacher_cache_budget_gb="
                    f"{budget_gb:g}", layout_, size, estimate)
    return Plan(True, f"{size / 2**30:.2f} GiB fits --teacher_cache_budget_gb={budget_gb:g}: "
                "the teacher runs once, every epoch reads its bfloat16 outputs", layout_, size,
                estimate)


# --- writing ---------------------------------------------------------------------------

def _bits(tensor: tf.Tensor) -> tf.Tensor:
    """float -> bfloat16 (round to nearest even) -> its uint16 bit pattern."""
    return tf.bitcast(tf.cast(tensor, tf.bfloat16), tf.uint16)


def _output_fn(teacher, keys: Sequence[str]):
    def outputs(x):
        out = teacher(x, training=False)
        values = {"input_mask": tf.cast(x["input_mask"], tf.int32)}
        for key in keys:
            name, _, index = key[len(TEACHER_KEY_PREFIX):].partition("/")
            values[key] = _bits(out[name][int(index)] if index else out[name])
        return values
    return outputs


def _file(directory: str, part: int, what: str) -> str:
    return posixpath.join(directory, f"part-{part:05d}.{what.replace('/', '-')}.npy")


def _compute_part(run, layout_: Layout, task_type: TaskType, chunk, tokenizer,
                  batch_size: int, boundaries: Sequence[int]
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(stored lengths [rows], {key: uint16 values of the rows, concatenated})."""
    L = layout_.max_seq_len
    ds, order = inference_batches(task_type, chunk, tokenizer, L, batch_size,
                                  boundaries if layout_.real_length else ())
    rows: list[Optional[dict[str, np.ndarray]]] = [None] * len(chunk)
    lengths = np.zeros(len(chunk), np.int64)
    position = 0
    for batch in ds:
        x = batch[0] if isinstance(batch, tuple) else batch
        out = {k: v.numpy() for k, v in run(x).items()}
        for j, n in enumerate(out["input_mask"].sum(axis=1)):
            i = int(order[position]) if order is not None else position
            n = int(n) if layout_.real_length else L
            lengths[i] = n
            rows[i] = {k: (out[k][j, :n] if layout_.kind(k) == "hidden"
                           else out[k][j, :, :n, :n]).reshape(-1) for k in layout_.keys}
            position += 1
    values = {k: np.concatenate([r[k] for r in rows]) if rows else np.zeros(0, np.uint16)
              for k in layout_.keys}
    return lengths, values


@dataclasses.dataclass
class Cache:
    """A complete cache: per part, the stored lengths and each output's values."""

    layout: Layout
    lengths: np.ndarray                         # [rows] stored length of each row
    parts: list[dict[str, np.ndarray]]          # per part: key -> uint16 [values]
    offsets: list[dict[str, np.ndarray]]        # per part: key -> [rows in part + 1]

    def row(self, key: str, i: int) -> np.ndarray:
        """Row i of output `key`: uint16 [n, d] or [h, n, n]."""
        p, r = divmod(int(i), self.layout.part_rows)
        off = self.offsets[p][key]
        n = int(self.lengths[i])
        flat = self.parts[p][key][off[r]:off[r + 1]]
        if self.layout.kind(key) == "hidden":
            return flat.reshape(n, self.layout.hidden_size)
        return flat.reshape(self.layout.num_heads, n, n)

    def batch(self, rows: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """uint16 arrays of `rows` padded with zeros to `length`: [B, length, d] or
        [B, h, length, length]."""
        out = {}
        for key in self.layout.keys:
            if self.layout.kind(key) == "hidden":
                buf = np.zeros((len(rows), length, self.layout.hidden_size), np.uint16)
                for j, i in enumerate(rows):
                    value = self.row(key, i)
                    buf[j, :value.shape[0]] = value
            else:
                h = self.layout.num_heads
                buf = np.zeros((len(rows), h, length, length), np.uint16)
                for j, i in enumerate(rows):
                    value = self.row(key, i)
                    buf[j, :, :value.shape[1], :value.shape[2]] = value
            out[key] = buf
        return out


def _offsets(layout_: Layout, lengths: np.ndarray) -> dict[str, np.ndarray]:
    return {k: np.concatenate([[0], np.cumsum(layout_.row_values(k, lengths))])
            for k in layout_.keys}


def _read_part(directory: str, part: int, layout_: Layout, rows: int
               ) -> Optional[tuple[np.ndarray, dict[str, np.ndarray]]]:
    lengths_path = _file(directory, part, "lengths")
    if not files.isfile(lengths_path):
        return None
    lengths = cache_lib._from_npy(lengths_path)
    if lengths is None or len(lengths) != rows:
        return None
    values = {}
    for key, off in _offsets(layout_, lengths).items():
        path = _file(directory, part, key)
        array = cache_lib._from_npy(path, mmap=True) if files.isfile(path) else None
        if array is None or array.dtype != np.uint16 or array.shape != (int(off[-1]),):
            return None
        values[key] = array
    return lengths.astype(np.int64), values


def build(teacher, layout_: Layout, examples: Sequence[Any], task_type: TaskType, tokenizer,
          batch_size: int, directory: str, strategy: tf.distribute.Strategy,
          identity: dict[str, Any], boundaries: Sequence[int] = (),
          name: str = "intermediate") -> Cache:
    """The cache of `examples` (one row each) in `directory`: read where complete,
    computed and stored part by part where not."""
    files.makedirs(directory)
    meta_path = posixpath.join(directory, META_FILE)
    # As JSON reads it back (tuples become lists), to compare with the stored one.
    meta = json.loads(json.dumps({"version": _VERSION, "rows": len(examples),
                                  "examples": cache_lib.examples_digest(examples),
                                  "layout": dataclasses.asdict(layout_), **identity}))
    if files.read_json(meta_path, default=None, error=ValueError) != meta:
        for old in files.glob(posixpath.join(directory, "part-*.npy")):
            files.remove(old)
        files.write_json_atomic(meta_path, meta)
    run = cache_lib.forward(_output_fn(teacher, layout_.keys), strategy)
    all_lengths, parts, offsets = [], [], []
    computed, start_time = 0, time.time()
    step = layout_.part_rows
    for p, start in enumerate(range(0, len(examples), step)):
        chunk = examples[start:start + step]
        found = _read_part(directory, p, layout_, len(chunk))
        if found is None:
            lengths, values = _compute_part(run, layout_, task_type, chunk, tokenizer,
                                            batch_size, boundaries)
            for key, array in values.items():
                files.write_bytes_atomic(_file(directory, p, key), cache_lib._to_npy(array))
            # Last: the part counts from here on.
            files.write_bytes_atomic(_file(directory, p, "lengths"),
                                     cache_lib._to_npy(lengths.astype(np.int32)))
            found = _read_part(directory, p, layout_, len(chunk)) or (lengths, values)
            computed += len(chunk)
        lengths, values = found
        all_lengths.append(lengths)
        parts.append(values)
        offsets.append(_offsets(layout_, lengths))
    if computed:
        print(f"[{name}] teacher layers of {computed} rows cached in "
              f"{time.time() - start_time:.1f}s ({directory})", flush=True)
    lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int64)
    return Cache(layout_, lengths, parts, offsets)


# --- reading ---------------------------------------------------------------------------

def with_teacher_layers(dataset: tf.data.Dataset, cache: Cache, order: np.ndarray,
                        batch_size: int, boundaries: Sequence[int]) -> tf.data.Dataset:
    """`dataset` (batches of `batch_size` rows taken in `order`, drop_remainder; cut to
    their bucket when `boundaries`) with each batch's cached teacher outputs added to
    its inputs as float32 tensors under the layout's keys."""
    layout_ = cache.layout
    batches = len(order) // batch_size
    h, d = layout_.num_heads, layout_.hidden_size
    spec = {k: tf.TensorSpec([batch_size, None, d] if layout_.kind(k) == "hidden"
                             else [batch_size, h, None, None], tf.uint16)
            for k in layout_.keys}

    def rows():
        for b in range(batches):
            idx = order[b * batch_size:(b + 1) * batch_size]
            stored = cache.lengths[idx]
            length = (buckets.batch_length(stored, boundaries, layout_.max_seq_len)
                      if layout_.real_length else layout_.max_seq_len)
            yield cache.batch(idx, length)

    # A known length: of a dataset of unknown length Keras 3 fit counts one step past
    # the end (optimizer.iterations, the epoch's mean loss).
    cached = tf.data.Dataset.from_generator(rows, output_signature=spec).apply(
        tf.data.experimental.assert_cardinality(batches))

    def merge(batch, values):
        return cache_lib.add_inputs(batch, {k: tf.cast(tf.bitcast(v, tf.bfloat16), tf.float32)
                                            for k, v in values.items()})

    return tf.data.Dataset.zip((dataset, cached)).map(
        merge, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
