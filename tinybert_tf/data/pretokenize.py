"""`bin/pretokenize`: a general corpus -> packed TFRecord shards, on every core.

Each worker process tokenises and packs its shard of the documents
(`corpus.packed_dataset`) and writes one shard file (`tfrecords.write_shard`,
atomically); PREFIX.json records the vocab, sequence length, packing and the
sequences per shard, which readers check.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from typing import Optional, Sequence, Union

from tqdm import tqdm

from tinybert_tf.data import corpus
from tinybert_tf.data.examples import DataError
from tinybert_tf.data.tfrecords import shard_path, vocab_sha1, write_meta, write_shard
from tinybert_tf.tokenizer import Tokenizer, read_vocab

_progress_queue = None


def _init_worker(queue) -> None:
    global _progress_queue
    _progress_queue = queue
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _write_one_shard(job: dict) -> tuple[int, int]:
    """Worker: tokenise and pack shard `index` of the corpus into its TFRecord file."""
    tok = Tokenizer(job["vocab"], lower_case=job["lower_case"], max_seq_len=job["max_seq_len"])
    ds = corpus.packed_dataset(job["corpus"], tok, job["max_seq_len"], job["pack"], seed=0,
                               fmt=job["fmt"], tfds_data_dir=job["tfds_data_dir"],
                               num_shards=job["num_shards"], index=job["index"])
    batches = (b for b in ds.batch(256).prefetch(2).as_numpy_iterator())
    queue = _progress_queue
    n = write_shard(job["path"], batches,
                    progress=(lambda k: queue.put(k)) if queue is not None else None)
    return job["index"], n


def pretokenize(corpus_source: Optional[str], vocab: Union[str, Sequence[str]], output: str,
                num_shards: int = 8, max_seq_len: int = 128, pack: str = "pair",
                fmt: str = "auto", num_workers: int = 0, lower_case: bool = True,
                tfds_data_dir: Optional[str] = None, progress: bool = True) -> dict:
    """Write a corpus as `num_shards` TFRecord shards of packed sequences plus PREFIX.json.

    Shards are tokenised in parallel by `num_workers` processes (0 = all
    cores; 1 = in this process), each file written atomically; a tqdm bar
    counts sequences. Returns the metadata written to PREFIX.json.
    """
    if not output:
        raise DataError("--output is required: the shard prefix, e.g. --output=data/wiki.")
    if num_shards < 1:
        raise DataError(f"--num_shards={num_shards}: need at least 1.")
    if isinstance(vocab, str) and os.path.isdir(vocab):
        vocab = os.path.join(vocab, "vocab.txt")
    tokens = read_vocab(vocab) if isinstance(vocab, str) else list(vocab)
    Tokenizer(tokens, lower_case=lower_case, max_seq_len=max_seq_len)  # validates the vocab
    corpus_source = corpus_source or corpus.default_corpus_path()
    fmt = corpus.detect_format(corpus_source) if fmt == "auto" else fmt
    if fmt == "tfrecord":
        raise DataError(f"{corpus_source}: already TFRecord shards.")
    if fmt != "tfds":
        corpus.resolve_files(corpus_source)  # fail now on a bad path
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    workers = min(num_workers or os.cpu_count() or 1, num_shards)
    jobs = [dict(corpus=corpus_source, vocab=tokens, lower_case=lower_case,
                 max_seq_len=max_seq_len, pack=pack, fmt=fmt, tfds_data_dir=tfds_data_dir,
                 num_shards=num_shards, index=i, path=shard_path(output, i, num_shards))
            for i in range(num_shards)]
    counts = [0] * num_shards
    bar = tqdm(total=None, unit="seq", desc=f"pretokenize {num_shards} shards",
               disable=not progress)
    if workers == 1:
        _init_worker(None)
        for job in jobs:
            i, n = _write_one_shard(dict(job))
            counts[i] = n
            bar.update(n)
    else:
        ctx = mp.get_context("spawn")  # TensorFlow is not fork-safe
        with ctx.Manager() as manager:
            queue = manager.Queue()
            with ctx.Pool(workers, initializer=_init_worker, initargs=(queue,)) as pool:
                pending = pool.imap_unordered(_write_one_shard, jobs)
                done = 0
                while done < num_shards:
                    while not queue.empty():
                        bar.update(queue.get())
                    try:
                        i, n = pending.next(timeout=0.5)
                    except mp.TimeoutError:
                        continue
                    counts[i] = n
                    done += 1
                while not queue.empty():
                    bar.update(queue.get())
    bar.close()
    meta = {"corpus": corpus_source, "format": fmt, "max_seq_len": int(max_seq_len),
            "pack": pack, "lower_case": bool(lower_case), "vocab_size": len(tokens),
            "vocab_sha1": vocab_sha1(tokens), "num_sequences": int(sum(counts)),
            "shards": [{"file": os.path.basename(j["path"]), "num_sequences": c}
                       for j, c in zip(jobs, counts)]}
    write_meta(output, meta)
    return meta
