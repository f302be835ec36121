"""Per-worker input sharding: two local worker processes (TF_CONFIG on 127.0.0.1,
MultiWorkerMirroredStrategy) build the general dataset with
`distribute_datasets_from_function`; each reads only its own TFRecord shards,
their examples are disjoint and together one epoch.

Run as a script, this file is one worker: it writes what it read to a JSON file.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tinybert_tf.startup import import_tensorflow

tf = import_tensorflow()  # run as a worker process too (__main__): as a bin/ tool loads it

from tinybert_tf.data import corpus, pretokenize  # noqa: E402
from tinybert_tf.tokenizer import Tokenizer  # noqa: E402

L = 24
WORDS = ["the", "cat", "dog", "sat", "on", "mat", "movie", "film", "good", "bad", "plot"]


def _worker(source: str, vocab: str, out: str) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tok = Tokenizer(vocab, max_seq_len=L)
    plan = {}

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        plan["files"] = list(corpus.input_shard(source, ctx.num_input_pipelines,
                                                ctx.input_pipeline_id).files)
        plan["pipeline"] = [ctx.input_pipeline_id, ctx.num_input_pipelines]
        return corpus.general_dataset(source, tok, L, batch_size=4, shuffle_buffer=0,
                                      input_context=ctx)

    seqs = []
    for batch in strategy.distribute_datasets_from_function(dataset_fn):
        for local in strategy.experimental_local_results(batch):
            seqs.extend(local["input_word_ids"].numpy().tolist())
    with open(out, "w") as f:
        json.dump({**plan, "seqs": seqs}, f)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_vocab):
    tmp = tmp_path_factory.mktemp("sharding")
    rng = np.random.default_rng(11)
    docs = ["\n".join(" ".join(rng.choice(WORDS, size=int(rng.integers(2, 10)))) + " ."
                      for _ in range(int(rng.integers(1, 6)))) for _ in range(40)]
    text = tmp / "corpus.txt"
    text.write_text("\n\n".join(docs) + "\n")
    prefix = str(tmp / "shards" / "c")
    pretokenize.pretokenize(str(text), tiny_vocab, prefix, num_shards=4, max_seq_len=L,
                            num_workers=1, progress=False)
    tok = Tokenizer(tiny_vocab, max_seq_len=L)
    per_file = {}
    for i in range(4):
        path = f"{prefix}-{i:05d}-of-00004.tfrecord"
        per_file[path] = [list(map(int, s["input_word_ids"])) for s in
                          corpus.packed_dataset(path, tok, L).as_numpy_iterator()]
    return tmp, prefix + "-*.tfrecord", per_file


def test_two_workers_read_only_their_shards_disjoint_and_together_one_epoch(
        shards, tiny_vocab_file):
    tmp, source, per_file = shards
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs, outs = [], []
    for index in range(2):
        out = str(tmp / f"worker{index}.json")
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="3")
        procs.append(subprocess.Popen([sys.executable, __file__, source, tiny_vocab_file, out],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
        outs.append(out)
    logs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    read = [json.load(open(o)) for o in outs]
    assert [r["pipeline"] for r in read] == [[0, 2], [1, 2]]
    # FILE sharding: shard i to worker i mod 2, each file on exactly one worker.
    assert read[0]["files"] == sorted(per_file)[0::2] and read[1]["files"] == sorted(per_file)[1::2]
    for r in read:
        mine = sorted(s for f in r["files"] for s in per_file[f])
        assert sorted(r["seqs"]) == mine and mine  # only its own files, each record once
    every = sorted(s for seqs in per_file.values() for s in seqs)
    together = sorted(read[0]["seqs"] + read[1]["seqs"])
    assert together == every  # one epoch, no example twice or lost
    assert not {tuple(s) for s in read[0]["seqs"]} & {tuple(s) for s in read[1]["seqs"]}


def test_fewer_files_than_workers_falls_back_to_data_sharding(shards, tiny_vocab):
    _, source, per_file = shards
    tok = Tokenizer(tiny_vocab, max_seq_len=L)
    two = ",".join(sorted(per_file)[:2])
    plans = [corpus.input_shard(two, 3, i) for i in range(3)]
    assert [p.mode for p in plans] == ["data"] * 3
    assert all(list(p.files) == sorted(per_file)[:2] for p in plans)  # everyone reads all
    parts = []
    for i in range(3):
        ctx = tf.distribute.InputContext(3, i, 3)
        ds = corpus.general_dataset(two, tok, L, 3, shuffle_buffer=0, input_context=ctx)
        parts.append([tuple(r) for b in ds for r in b["input_word_ids"].numpy().tolist()])
    whole = sorted(tuple(s) for f in sorted(per_file)[:2] for s in per_file[f])
    assert sorted(parts[0] + parts[1] + parts[2]) == whole
    with pytest.raises(ValueError, match="at least as many files as input pipelines"):
        corpus.input_shard(two, 3, 0, policy="file")
    counts = corpus.pipeline_sequence_counts(source, 2)
    assert counts == [len(per_file[f]) + len(per_file[g]) for f, g in
                      (sorted(per_file)[0::2], sorted(per_file)[1::2])]


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _worker(*sys.argv[1:4])
