"""Teacher logits computed once per training example and reused by every epoch.

In the prediction-layer phase the frozen teacher sees the same inputs every
epoch; its forward pass is most of a step's cost (a 6-layer teacher against a
1- to 4-layer student). With `--teacher_cache` (the default) the phase first
runs the teacher over its training rows in example order and stores the
logits (float32 [rows, *logits shape]) as .npy parts in the phase folder
(`teacher_cache/logits-00000.npy`, ...). Each part is written whole or not at
all, so a run killed while caching resumes at the first missing part.
`cache.json` records what the logits belong to (examples, sequence length,
the teacher files' content); anything else found there is discarded and recomputed.

Each epoch's batches then carry `teacher_logits` gathered in that epoch's
order (the rows `task_input.epoch_rows` gives the dataset, padded or
length-bucketed), and the Distiller skips the teacher: its terms declare they
read only the logits (`LossTerm.teacher_outputs`). The loss is the same as
recomputing (up to float rounding of batch-size-dependent kernels). With
length buckets the caching pass runs the rows sorted by length in
bucket-padded batches and stores the logits back in example order.

An earlier phase that runs the teacher live over the same rows (the intermediate
phase) can record the logits on the way (`Distiller.capture_teacher_logits`, its
batches carrying `row_id`, see `with_row_ids`); `teacher_logits(known=...)` then
computes only the rows it did not see.

Only tasks with one dataset row per example qualify (`TaskType.dataset_rows`
not overridden); span QA, whose examples become a varying number of windows,
recomputes the teacher.
"""
from __future__ import annotations

import hashlib
import io
import posixpath
import time
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data import buckets
from tinybert_tf.distill.distiller import ROW_KEY, TEACHER_KEY_PREFIX, teacher_batch_keys
from tinybert_tf.models.tracing import any_shape_function
from tinybert_tf.tasks.base import TaskType, inference_batches

CACHE_FOLDER = "teacher_cache"
META_FILE = "cache.json"
PART_ROWS = 4096  # rows per .npy part (the unit of resumption)
_VERSION = 1
LOGITS_KEY = TEACHER_KEY_PREFIX + "logits"


# The order of a padded epoch (one definition, in the data layer).
epoch_permutation = buckets.epoch_permutation


def one_row_per_example(task_type: TaskType) -> bool:
    """Whether the task's dataset yields one row per example (`dataset_rows` not
    overridden; span QA's questions become several windows)."""
    return type(task_type).dataset_rows is TaskType.dataset_rows


def applies(task_type: TaskType, distiller: Any) -> bool:
    """Whether cached logits can stand in for the teacher: one row per example, and the
    Distiller's terms read the teacher's logits only."""
    return (one_row_per_example(task_type)
            and getattr(distiller, "teacher_reads", None) == ("logits",))


def plan(task_type: TaskType, terms: Sequence[Any], enabled: bool) -> dict[str, Any]:
    """The prediction phase's decision, for the plan (the stage decides by `applies`)."""
    if not enabled:
        return {"use": False, "why": "--noteacher_cache"}
    if not one_row_per_example(task_type):
        return {"use": False, "why": f"{task_type.kind}: examples become several rows"}
    if teacher_batch_keys(terms) != (LOGITS_KEY,):
        return {"use": False, "why": "the loss terms read more than the teacher's logits"}
    return {"use": True, "why": "the teacher's float32 logits, computed once per row"}


def examples_digest(examples: Sequence[Any]) -> str:
    """A hash of the examples' texts and labels, in order."""
    h = hashlib.sha1()
    for ex in examples:
        h.update(repr((getattr(ex, "text_a", None), getattr(ex, "text_b", None),
                       getattr(ex, "label", None), getattr(ex, "words", None))).encode())
    return h.hexdigest()


def model_identity(model_dir: str, **extra: Any) -> dict[str, Any]:
    """What a cache of a model's outputs belongs to: the content of every file of its
    folder (config and weights in whichever format: ours, Hugging Face's, keras-hub's),
    hashed whole, and `extra` (labels, dtype, ...). Not the folder's path or the files'
    mtimes: a run folder copied to another machine (a preempted run resumed there) keeps
    its caches, and a teacher trained again does not."""
    return {"teacher_files": files.whole_content_fingerprint(model_dir), **extra}


def _to_npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _from_npy(path: str, mmap: bool = False) -> Optional[np.ndarray]:
    """A stored part, or None when it is missing or damaged (then it is recomputed).
    `mmap`: a local file is memory-mapped instead of read."""
    try:
        if mmap and not files.is_remote(path):
            return np.load(path, mmap_mode="r", allow_pickle=False)
        return np.load(io.BytesIO(files.read_bytes(path)), allow_pickle=False)
    except (ValueError, OSError, EOFError):
        return None


def forward(fn, strategy: tf.distribute.Strategy):
    """`fn` (inputs -> a nest of tensors, one batch) traced; on TPU through strategy.run
    (the weights live on the TPU, which compiles one program per shape), elsewhere a
    plain call on the default device, traced once for every shape."""
    if not isinstance(strategy, tf.distribute.TPUStrategy):
        return any_shape_function(fn)

    @tf.function(reduce_retracing=True)
    def on_tpu(x):
        return strategy.experimental_local_results(strategy.run(fn, args=(x,)))[0]

    return on_tpu


def _forward(teacher, strategy: tf.distribute.Strategy):
    """inputs -> float32 logits of one batch."""
    return forward(lambda x: tf.cast(teacher(x, training=False)["logits"], tf.float32), strategy)


def teacher_logits(teacher, examples: Sequence[Any], task_type: TaskType, tokenizer,
                   max_seq_len: int, batch_size: int, directory: str,
                   strategy: tf.distribute.Strategy, identity: dict[str, Any],
                   name: str = "prediction", length_buckets: Sequence[int] = (),
                   known: Optional[tuple[np.ndarray, np.ndarray]] = None) -> np.ndarray:
    """The teacher's float32 logits of every example (one row each, example order),
    read from `directory` or computed and stored there part by part; computed in
    length-sorted, bucket-padded batches with `length_buckets`. `known`: (logits
    [rows, C], seen bool [rows]) an earlier phase captured while it ran the teacher
    over these rows (`Distiller.capture_teacher_logits`); only the unseen rows are
    computed."""
    files.makedirs(directory)
    meta_path = posixpath.join(directory, META_FILE)
    meta = {"version": _VERSION, "rows": len(examples), "max_seq_len": int(max_seq_len),
            "examples": examples_digest(examples), **identity}
    if files.read_json(meta_path, default=None, error=ValueError) != meta:
        for old in files.glob(posixpath.join(directory, "logits-*.npy")):
            files.remove(old)
        files.write_json_atomic(meta_path, meta)
    run = _forward(teacher, strategy)
    parts, computed, taken, start_time = [], 0, 0, time.time()
    for p, start in enumerate(range(0, len(examples), PART_ROWS)):
        chunk = examples[start:start + PART_ROWS]
        path = posixpath.join(directory, f"logits-{p:05d}.npy")
        array = _from_npy(path) if files.isfile(path) else None
        if array is None or len(array) != len(chunk):
            need = np.arange(len(chunk))
            if known is not None:
                array = np.array(known[0][start:start + len(chunk)], np.float32)
                need = np.flatnonzero(~known[1][start:start + len(chunk)])
                taken += len(chunk) - len(need)
            if len(need):
                fresh = _compute([chunk[i] for i in need], run, task_type, tokenizer,
                                 max_seq_len, batch_size, length_buckets)
                if len(need) == len(chunk):
                    array = fresh
                else:  # `array` is this chunk's copy of the captured logits
                    array[need] = fresh
            files.write_bytes_atomic(path, _to_npy(array))
            computed += len(need)
        parts.append(array)
    logits = np.concatenate(parts, 0)
    if computed or taken:
        kept = f"; {taken} more taken from the earlier phase's pass" if taken else ""
        print(f"[{name}] teacher logits of {computed} rows cached in "
              f"{time.time() - start_time:.1f}s{kept} ({directory})", flush=True)
    return logits


def _compute(examples: Sequence[Any], run, task_type: TaskType, tokenizer, max_seq_len: int,
             batch_size: int, length_buckets: Sequence[int]) -> np.ndarray:
    """The teacher's float32 logits of `examples`, in their order."""
    ds, order = inference_batches(task_type, examples, tokenizer, max_seq_len, batch_size,
                                  length_buckets)
    outs = []
    for batch in ds:
        x = batch[0] if isinstance(batch, tuple) else batch
        outs.append(buckets.pad_positions(run(x).numpy(), max_seq_len))
    array = np.concatenate(outs, 0).astype(np.float32)
    return buckets.unsort(array, order) if order is not None else array


def with_row_ids(dataset: tf.data.Dataset, order: np.ndarray, batch_size: int
                 ) -> tf.data.Dataset:
    """`dataset` (batches of `batch_size` rows taken in `order`, drop_remainder) with each
    batch's row indices added to its inputs as `row_id` (int32 [batch_size]), for
    `Distiller.capture_teacher_logits`."""
    batches = len(order) // batch_size
    ids = tf.data.Dataset.from_tensor_slices(
        np.asarray(order[:batches * batch_size], np.int32).reshape(batches, batch_size))
    return tf.data.Dataset.zip((dataset, ids)).map(
        lambda batch, rows: add_inputs(batch, {ROW_KEY: rows}))


def with_teacher_logits(dataset: tf.data.Dataset, logits: np.ndarray, order: np.ndarray,
                        batch_size: int) -> tf.data.Dataset:
    """`dataset` (batches of `batch_size` rows taken in `order`, drop_remainder) with each
    batch's cached logits added to its inputs as `teacher_logits`. Per-position logits
    ([rows, max_seq_len, C]) are cut to the batch's length (length buckets)."""
    batches = len(order) // batch_size
    spec = tf.TensorSpec([batch_size, *logits.shape[1:]], tf.float32)

    def rows():
        for b in range(batches):
            yield logits[order[b * batch_size:(b + 1) * batch_size]]

    # A known length: of a dataset of unknown length Keras 3 fit counts one step past
    # the end (optimizer.iterations, the epoch's mean loss).
    cached = tf.data.Dataset.from_generator(rows, output_signature=spec).apply(
        tf.data.experimental.assert_cardinality(batches))

    def merge(batch, z):
        inputs = batch[0] if isinstance(batch, tuple) else batch
        if logits.ndim >= 3:  # per position: as long as the batch's (bucketed) inputs
            z = z[:, :tf.shape(inputs["input_word_ids"])[1]]
        return add_inputs(batch, {LOGITS_KEY: z})

    return tf.data.Dataset.zip((dataset, cached)).map(merge).prefetch(tf.data.AUTOTUNE)


def add_inputs(batch, extra: dict[str, tf.Tensor]):
    """A dataset element (inputs dict, or (inputs, labels, ...)) with `extra` in its inputs."""
    if isinstance(batch, tuple):
        return ({**batch[0], **extra}, *batch[1:])
    return {**batch, **extra}

