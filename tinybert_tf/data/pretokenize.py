"""`bin/pretokenize`: a general corpus -> packed TFRecord shards, on every core.

Each worker process tokenises and packs its shard of the documents
(`corpus.packed_dataset`) and writes one shard file (`tfrecords.write_shard`,
atomically); PREFIX.json, written last, records the vocab, sequence length,
packing and each shard's sequences and bytes, which readers check. So:
  - a set an earlier run made from the same corpus files with the same settings,
    every shard its recorded size, is kept as it is (a TFDS corpus is read again);
  - a run that fails or is killed leaves no PREFIX.json (an old one is removed
    first), and a set without it is recognisably incomplete;
  - a failing run removes the shards it wrote, and a corpus that yields no
    sequence is an error with nothing written;
  - shards of the same prefix left by an earlier run with another
    --num_shards are removed before PREFIX.json is written; shard files of the
    prefix no run of ours wrote (no PREFIX.json, no `owner_path` record) are
    refused before anything is written.
Paths go through `tf.io.gfile` (gs://, ram://, ...). `ram://` lives in this
process's memory, so a corpus or output there is written in-process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import multiprocessing as mp
import os
import re
from typing import Optional, Sequence, Union

from tinybert_tf import files
from tinybert_tf.data import corpus
from tinybert_tf.data.examples import DataError
from tinybert_tf.data.tfrecords import (
    SUFFIX,
    encode_batch,
    meta_path,
    set_files,
    shard_path,
    vocab_sha1,
    write_meta,
    write_shard,
)
from tinybert_tf.models.checkpoint import CheckpointError, vocab_tokens
from tinybert_tf.progress import progress_bar
from tinybert_tf.startup import start_spawned_worker
from tinybert_tf.tokenizer import Tokenizer


def _write_one_shard(job: dict, queue=None) -> tuple[int, int, int]:
    """Worker: tokenise and pack shard `index` of the corpus into its TFRecord file,
    putting each batch's sequence count on `queue` (a worker process's progress).
    Returns (index, sequences, bytes); data errors arrive as one-line DataErrors."""
    tok = Tokenizer(job["vocab"], lower_case=job["lower_case"], max_seq_len=job["max_seq_len"])
    ds = corpus.packed_dataset(job["corpus"], tok, job["max_seq_len"], job["pack"], seed=0,
                               fmt=job["fmt"], tfds_data_dir=job["tfds_data_dir"],
                               num_shards=job["num_shards"], index=job["index"])
    records = ds.batch(256).map(encode_batch, num_parallel_calls=2).prefetch(2)
    with corpus.translate_data_errors():
        batches = records.as_numpy_iterator()
        n = write_shard(job["path"], batches,
                        progress=(lambda k: queue.put(k)) if queue is not None else None)
    return job["index"], n, files.stat(job["path"]).size


def _run_jobs(jobs: list[dict], workers: int, bar) -> list[tuple[int, int, int]]:
    if workers == 1:
        out = []
        for job in jobs:
            out.append(_write_one_shard(dict(job)))
            bar.update(out[-1][1])
        return out
    out = []
    ctx = mp.get_context("spawn")  # TensorFlow is not fork-safe
    with ctx.Manager() as manager:
        queue = manager.Queue()
        # The initializer lives in a module without TensorFlow: a spawned worker starts
        # TensorFlow as the tools do before it imports this module for its first job.
        with ctx.Pool(workers, initializer=start_spawned_worker) as pool:
            pending = pool.imap_unordered(functools.partial(_write_one_shard, queue=queue),
                                          jobs)
            while len(out) < len(jobs):
                while not queue.empty():
                    bar.update(queue.get())
                try:
                    out.append(pending.next(timeout=0.5))
                except mp.TimeoutError:
                    continue
            while not queue.empty():
                bar.update(queue.get())
    return out


def _remove(paths: Sequence[str], temporaries: bool = False) -> None:
    """Best-effort removal of `paths` (and, with `temporaries`, of the hidden temporary
    siblings a killed worker leaves: `.NAME.tmp-PID`)."""
    for p in paths:
        found = [p]
        if temporaries:
            directory, name = os.path.split(p)
            found += files.glob(os.path.join(directory, f".{name}.tmp-*"))
        for f in found:
            with contextlib.suppress(files.FileAccessError):
                if files.exists(f):
                    files.remove(f)


def _tokens_of(vocab: Union[str, Sequence[str]]) -> list[str]:
    """--vocab's tokens (`checkpoint.vocab_tokens`), or the tokens themselves."""
    if not isinstance(vocab, str):
        return list(vocab)
    try:
        return vocab_tokens(vocab)
    except CheckpointError as e:
        raise DataError(f"--vocab={vocab}: {e}") from e


def _check_not_anothers(meta: str) -> None:
    """PREFIX.json is replaced by each run: refuse a file of that name that is not a
    shard set's metadata (a user's wiki.json, say) before anything is written."""
    if not files.isfile(meta):
        return
    # Ours lists its shards (some 100 bytes each): a file over json_object's limit is
    # someone's data, and is not read whole to find that out.
    found = files.json_object(meta)
    if found is None or not {"shards", "vocab_sha1"} <= set(found):
        raise DataError(f"--output={meta[:-len('.json')]}: {meta} exists and is not the "
                        "metadata of pre-tokenised shards, which this run writes there; "
                        "choose another --output prefix, or move the file.")


def owner_path(prefix: str) -> str:
    """The record, beside the shards, that a run of ours is writing `prefix` (`write`): a
    killed run's shards are ours to replace, someone else's of those names are not."""
    return os.path.join(os.path.dirname(prefix), f".{os.path.basename(prefix)}.pretokenize")


def _check_shards_are_ours(prefix: str) -> None:
    """Refuse shard files of `prefix` (PREFIX-00000-of-0000N.tfrecord, Beam's and others'
    naming too) that no run of ours wrote: this run replaces or removes every one."""
    shards = sorted(set_files(prefix))
    if not shards or files.isfile(meta_path(prefix)) or files.exists(owner_path(prefix)):
        return
    more = f" and {len(shards) - 1} more" if len(shards) > 1 else ""
    raise DataError(f"--output={prefix}: {shards[0]}{more} are TFRecord files no "
                    f"bin/pretokenize run wrote (no {os.path.basename(meta_path(prefix))} or "
                    f"{os.path.basename(owner_path(prefix))} beside them), and this run "
                    "would replace or remove them; choose another --output prefix, or move "
                    "them.")


def check_prefix(output: str) -> str:
    """--output as an absolute shard prefix; DataError for none, or for a folder (the
    shards, PREFIX-*.tfrecord, would go beside it)."""
    if not output:
        raise DataError("--output is required: the shard prefix, e.g. --output=data/wiki.")
    if output.endswith("/") or files.isdir(output):
        raise DataError(f"--output={output}: a folder; --output is the shards' prefix: e.g. "
                        f"--output={os.path.join(output, 'wiki')} writes wiki-00000-of-"
                        "0000N.tfrecord ... and wiki.json in it.")
    return files.absolute(output)


def written_by(prefix: str) -> re.Pattern:
    """The names of the temporaries a run writing `prefix` makes (`files.atomic_path`:
    each shard's, whatever the shard count, and PREFIX.json's)."""
    name = re.escape(os.path.basename(prefix))
    return re.compile(rf"^\.{name}(?:-\d{{5}}-of-\d{{5}}{re.escape(SUFFIX)}|\.json)"
                      r"\.tmp-\d+$")


@dataclasses.dataclass(frozen=True)
class Request:
    """A checked `pretokenize` call (`check_request`): the absolute shard prefix, the
    vocab's tokens, PREFIX.json's record of the corpus and settings (`made_from`), and
    how to run."""
    output: str
    tokens: list[str]
    made_from: dict
    num_workers: int
    tfds_data_dir: Optional[str]
    progress: bool


def pretokenize(corpus_source: Optional[str], vocab: Union[str, Sequence[str]], output: str,
                num_shards: int = 8, max_seq_len: int = 128, pack: str = "pair",
                fmt: str = "auto", num_workers: int = 0, lower_case: bool = True,
                tfds_data_dir: Optional[str] = None, progress: bool = True) -> dict:
    """Write a corpus as `num_shards` TFRecord shards of packed sequences plus PREFIX.json.

    Shards are tokenised in parallel by `num_workers` processes (0 = all
    cores; 1 = in this process), each file written atomically; a tqdm bar
    counts sequences. Returns the metadata written to PREFIX.json, with `reused`:
    a set an earlier call made from the same corpus (its files' content) with the
    same settings, every shard still its recorded size, is kept as it is. A bad
    argument, a bad corpus file or an empty corpus raises DataError, leaving no
    shard and no PREFIX.json of this run behind.
    """
    return write(check_request(corpus_source, vocab, output, num_shards, max_seq_len, pack,
                               fmt, num_workers, lower_case, tfds_data_dir, progress))


def check_request(corpus_source: Optional[str], vocab: Union[str, Sequence[str]],
                  output: str, num_shards: int = 8, max_seq_len: int = 128,
                  pack: str = "pair", fmt: str = "auto", num_workers: int = 0,
                  lower_case: bool = True, tfds_data_dir: Optional[str] = None,
                  progress: bool = True) -> Request:
    """`pretokenize`'s arguments checked, writing nothing: DataError names the bad one."""
    output = check_prefix(output)
    if num_shards < 1:
        raise DataError(f"--num_shards={num_shards}: need at least 1.")
    if num_workers < 0:
        raise DataError(f"--num_workers={num_workers}: must be >= 0 (0 = all CPU cores).")
    shortest = 4 if pack == "pair" else 3  # [CLS] A [SEP] (B [SEP]): one piece of text
    if max_seq_len < shortest:
        raise DataError(f"--max_seq_len={max_seq_len}: must be >= {shortest} with "
                        f"--pack={pack} (the special tokens and a word piece of text).")
    tokens = _tokens_of(vocab)
    Tokenizer(tokens, lower_case=lower_case, max_seq_len=max_seq_len)  # validates the vocab
    corpus_source = corpus_source or corpus.default_corpus_path()
    fmt = corpus.detect_format(corpus_source) if fmt == "auto" else fmt
    if fmt == "tfrecord":
        raise DataError(f"{corpus_source}: already TFRecord shards.")
    # The corpus files, in reading order (now: a bad path fails before anything is
    # written); None for TFDS.
    inputs = None if fmt == "tfds" else corpus.resolve_files(corpus_source)
    _check_not_anothers(meta_path(output))
    _check_shards_are_ours(output)
    made_from = {"corpus": corpus_source, "format": fmt, "max_seq_len": int(max_seq_len),
                 "pack": pack, "lower_case": bool(lower_case),
                 "vocab_sha1": vocab_sha1(tokens), "num_shards": num_shards,
                 "inputs": _inputs_fingerprint(inputs)}
    return Request(output, tokens, made_from, num_workers, tfds_data_dir, progress)


def write(request: Request) -> dict:
    """Write the shards and PREFIX.json of a checked call (`pretokenize`'s Returns).

    Until PREFIX.json is written, `owner_path` says the prefix's shards are ours (a
    killed run's); it goes when PREFIX.json is there, or when a failed run leaves no
    shard of the prefix."""
    output = request.output
    earlier = _finished_earlier(output, request.made_from)
    if earlier is not None:
        return earlier
    files.makedirs(os.path.dirname(output))
    files.write_json_atomic(owner_path(output), {"written_by": "bin/pretokenize"})
    # From here on PREFIX.json describes nothing until this run writes it.
    _remove([meta_path(output)])
    try:
        meta = _write_set(request)
    except BaseException:
        if not set_files(output):
            _remove([owner_path(output)])
        raise
    _remove([owner_path(output)])
    return {**meta, "reused": False}


def _write_set(request: Request) -> dict:
    """The shards, then PREFIX.json (returned); an error removes this run's shards."""
    output, made_from = request.output, request.made_from
    source, num_shards = made_from["corpus"], made_from["num_shards"]
    in_memory = any(str(p).startswith("ram://") for p in (source, output))
    workers = 1 if in_memory else min(request.num_workers or os.cpu_count() or 1, num_shards)
    jobs = [dict(corpus=source, vocab=request.tokens, lower_case=made_from["lower_case"],
                 max_seq_len=made_from["max_seq_len"], pack=made_from["pack"],
                 fmt=made_from["format"], tfds_data_dir=request.tfds_data_dir,
                 num_shards=num_shards, index=i, path=shard_path(output, i, num_shards))
            for i in range(num_shards)]
    paths = [j["path"] for j in jobs]
    bar = progress_bar(total=None, unit="seq", desc=f"pretokenize {num_shards} shards",
                       disable=not request.progress)
    try:
        results = sorted(_run_jobs(jobs, workers, bar))
    except BaseException:
        _remove(paths, temporaries=True)  # the pool is terminated: no worker still writes
        raise
    finally:
        bar.close()
    total = sum(n for _, n, _ in results)
    if total == 0:
        _remove(paths)
        raise DataError(f"{source}: no sequences: the corpus holds no text (empty "
                        "files, only blank lines, or a dump of redirects); nothing written.")
    _remove([f for f in set_files(output) if f not in paths])  # an older set's shards
    meta = {**made_from, "vocab_size": len(request.tokens), "num_sequences": int(total),
            "shards": [{"file": os.path.basename(p), "num_sequences": n, "bytes": size}
                       for p, (_, n, size) in zip(paths, results)]}
    write_meta(output, meta)
    return meta


def _inputs_fingerprint(paths: Optional[Sequence[str]]) -> Optional[str]:
    """What the corpus files `paths` hold, in reading order: each file's
    `content_fingerprint`, hashed together. None for a TFDS corpus (`paths` None): without
    a version in its name, TFDS reads whichever it finds prepared, so a set made from one
    is never taken as made from the same."""
    if paths is None:
        return None
    digest = hashlib.sha1()
    for path in paths:
        digest.update(files.content_fingerprint(path).encode() + b"\n")
    return digest.hexdigest()


def _finished_earlier(output: str, made_from: dict) -> Optional[dict]:
    """PREFIX.json's metadata when an earlier run made the set from the same corpus with
    the same settings and every shard still has its recorded size (`reused` set); None
    otherwise (the set is written again)."""
    meta = files.json_object(meta_path(output)) if files.isfile(meta_path(output)) else None
    if (meta is None or made_from["inputs"] is None
            or any(meta.get(k) != v for k, v in made_from.items())):
        return None
    folder = os.path.dirname(output)
    for shard in meta.get("shards", []):
        path = os.path.join(folder, str(shard.get("file")))
        if not files.isfile(path) or files.stat(path).size != shard.get("bytes"):
            return None
    return {**meta, "reused": True}
