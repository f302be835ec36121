"""The general stage's input, built per worker (`distribute_datasets_from_function`):
one replica reads exactly the batches it read as a plain dataset; under "exact"
sharding each input pipeline keeps its contiguous slice of every global batch,
under "file" sharding each worker reads only its own TFRecord shards and the epoch
is sized on the smallest worker's share."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.data import corpus, pretokenize
from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.pipeline.main import parse_argv
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import RunState
from tinybert_tf.pipeline.stages import general
from tinybert_tf.tasks.catalog import resolve_task

from pipeline_helpers import argv, tiny_flags, write_corpus

L, B = 32, 4


def _context(ns) -> Context:
    config = parse_argv(["bin/distill", *argv(ns)])
    return Context(config, resolve_task(config.task), RunState(ns.output_dir),
                          tf.distribute.get_strategy())


def _ids(batches) -> list[np.ndarray]:
    return [b["input_word_ids"].numpy() for b in batches]


def test_one_replica_reads_the_batches_of_the_plain_dataset(tmp_path, tiny_vocab):
    ns = tiny_flags(tmp_path, tiny_vocab, general_batch_size=B, general_max_seq_len=L,
                    corpus=write_corpus(str(tmp_path / "c.txt"), docs=40))
    ctx = _context(ns)
    tok = load_tokenizer(ns.teacher, L)
    plain = corpus.general_dataset(ns.corpus, tok, max_seq_len=L, batch_size=B,
                                   seed=ns.seed + 1, pack="pair")
    expect = _ids(plain.skip(2).take(3))
    got = _ids(general.general_input(ctx, tok, epoch=1, offset=2, steps=3))
    assert len(got) == 3
    for a, b in zip(expect, got):
        np.testing.assert_array_equal(a, b)


def test_exact_sharding_gives_each_pipeline_its_slice_of_every_global_batch():
    rows = tf.data.Dataset.range(24).map(lambda i: {"x": tf.fill([3], i)}).batch(8)
    parts = []
    for index in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index,
                                             num_replicas_in_sync=4)
        ds = general._pipeline_slice(rows, context, global_batch=8, per_replica=2)
        parts.append([b["x"][:, 0].numpy().tolist() for b in ds])
    # Global batch g = rows 8g..8g+7: pipeline 0 holds the first half as two
    # per-replica batches, pipeline 1 the second half.
    assert parts[0][:2] == [[0, 1], [2, 3]] and parts[1][:2] == [[4, 5], [6, 7]]
    assert sorted(sum(parts[0] + parts[1], [])) == list(range(24))


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_vocab_file):
    tmp = tmp_path_factory.mktemp("general_shards")
    text = write_corpus(str(tmp / "corpus.txt"), docs=60)
    prefix = str(tmp / "shards" / "c")
    pretokenize.pretokenize(text, tiny_vocab_file, prefix, num_shards=3, max_seq_len=L,
                            num_workers=1, progress=False)
    return prefix + "-*.tfrecord"


def test_file_sharding_sizes_the_epoch_on_the_smallest_worker_share(tmp_path, tiny_vocab,
                                                                   shards, monkeypatch):
    ns = tiny_flags(tmp_path, tiny_vocab, corpus=shards, general_batch_size=B,
                    general_max_seq_len=L)
    ctx = _context(ns)
    counts = corpus.pipeline_sequence_counts(shards, 2)
    monkeypatch.setattr(general, "num_workers", lambda strategy: 2)
    assert general.general_sharding(ctx) == "file"
    spec = general.general_phase(ctx, count=sum(counts))
    assert spec.examples == 2 * min(counts) and "file sharding over 2 workers" in spec.note
    assert spec.steps_per_epoch == min(counts) // (B // 2)
    ns.input_sharding = "exact"
    assert general.general_sharding(_context(ns)) == "exact"


class _TwoWorkers:
    """Stands in for a two-worker strategy: builds both workers' input pipelines."""

    num_replicas_in_sync = 2

    def distribute_datasets_from_function(self, dataset_fn):
        return [dataset_fn(tf.distribute.InputContext(2, i, 2)) for i in range(2)]


def test_file_sharded_workers_read_disjoint_shards_for_the_same_steps(tmp_path, tiny_vocab,
                                                                     shards, monkeypatch):
    ns = tiny_flags(tmp_path, tiny_vocab, corpus=shards, general_batch_size=B,
                    general_max_seq_len=L)
    ctx = _context(ns)
    monkeypatch.setattr(general, "num_workers", lambda strategy: 2)
    ctx.strategy = _TwoWorkers()
    tok = load_tokenizer(ns.teacher, L)
    steps = general.general_phase(ctx, count=1).steps_per_epoch
    per_worker = [[tuple(row) for b in ds for row in b["input_word_ids"].numpy()]
                  for ds in general.general_input(ctx, tok, epoch=0, offset=0, steps=steps)]
    assert [len(rows) for rows in per_worker] == [steps * B // 2] * 2
    assert not set(per_worker[0]) & set(per_worker[1])  # each reads only its own files


def test_a_step_cap_within_the_first_epoch_counts_the_corpus_only_that_far(tmp_path,
                                                                           tiny_vocab):
    source = write_corpus(str(tmp_path / "c.txt"), docs=40)
    tok = load_tokenizer(tiny_flags(tmp_path, tiny_vocab).teacher, L)
    whole = corpus.count_sequences(source, tok, L)
    assert whole > 3 * B
    assert corpus.count_sequences(source, tok, L, limit=3 * B) == 3 * B
    assert corpus.count_sequences(source, tok, L, limit=whole + 5) == whole

    capped = _context(tiny_flags(tmp_path, tiny_vocab, general_batch_size=B,
                                 general_max_seq_len=L, general_max_steps=3, corpus=source))
    spec = general.general_phase(capped)
    # The phase is the one the whole count gives: 3 steps, all in epoch 1.
    full = general.general_phase(capped, count=whole)
    assert (spec.total_steps, spec.warmup_steps) == (full.total_steps, full.warmup_steps) == \
        (3, full.warmup_steps)
    assert spec.examples == 3 * B and spec.extra["sequences_at_least"] == 3 * B
    assert "--general_max_steps=3" in spec.note
    record = general.read_json(capped.state.path("general", general.CORPUS_COUNT))
    assert (record["sequences"], record["complete"]) == (3 * B, False)

    # Without the cap the lower bound is not reused: the corpus is counted to its end.
    uncapped = _context(tiny_flags(tmp_path, tiny_vocab, general_batch_size=B,
                                   general_max_seq_len=L, corpus=source))
    assert general.general_phase(uncapped).examples == whole
    assert general.read_json(uncapped.state.path("general", general.CORPUS_COUNT))[
        "complete"] is True
