"""The intermediate phase's teacher cache: each stored row is the teacher's output rounded
to bfloat16 (round to nearest even); training from the cache is training against the
teacher's outputs rounded to bfloat16 (same losses and weights to 1e-6), without
running the teacher; parts resume and damaged parts are recomputed; the plan uses the
cache only for several epochs within the budget, and the pipeline trains from it."""
from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.data import buckets
from tinybert_tf.data.examples import Example
from tinybert_tf.distill import Distiller, create_optimizer, make_terms
from tinybert_tf.distill.terms import PredictionTerm
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_model, load_tokenizer
from tinybert_tf.pipeline.main import run_argv
from tinybert_tf.pipeline.training import layer_cache, task_input
from tinybert_tf.tasks import task_type

from pipeline_helpers import argv, run, tiny_flags, write_teacher

L, BATCH = 16, 4
BOUNDARIES = buckets.bucket_boundaries(L, 4)
WORDS = ["the", "movie", "was", "good", "bad", "very", "plot", "actor", "fun", "boring", "cat"]


def _examples(n: int = 14) -> list[Example]:
    rng = np.random.default_rng(3)
    return [Example(str(i), " ".join(rng.choice(WORDS, rng.integers(1, 13))), None, i % 2)
            for i in range(n)]


def rne(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (written out here)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_vocab):
    tmp = tmp_path_factory.mktemp("layer_cache")
    teacher = load_model(write_teacher(str(tmp / "t"), tiny_vocab, head="classifier",
                                       dropout=0.0))
    student = load_model(write_teacher(str(tmp / "s"), tiny_vocab, hidden=16, head="classifier",
                                       dropout=0.0, seed=5))
    return teacher, student, load_tokenizer(teacher, L), task_type("sst-2")


def _layout(setup, masked: bool) -> layer_cache.Layout:
    teacher, student, _, _ = setup
    return layer_cache.layout(make_terms("embd,attn,hidn", mask_padding=masked),
                              student.bert_config, teacher.bert_config, L)


def _build(setup, masked: bool, directory: str, identity=None, examples=None):
    teacher, _, tok, task = setup
    return layer_cache.build(teacher, _layout(setup, masked), examples or _examples(), task, tok,
                             5, directory, tf.distribute.get_strategy(),
                             identity or {"teacher": "t"},
                             boundaries=BOUNDARIES if masked else ())


def test_rounding_is_to_nearest_even():
    x = np.float32([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8 + 2**-20), 3.14159, 1e-30])
    got = layer_cache._bits(tf.constant(x)).numpy()
    np.testing.assert_array_equal(got, rne(x))
    np.testing.assert_array_equal(from_bits(got)[:2], [1.0, 1.0 + 2**-6])  # ties to even


@pytest.mark.parametrize("masked", [True, False])
def test_cached_rows_are_the_teachers_outputs_in_bfloat16(setup, tmp_path, masked):
    teacher, _, tok, task = setup
    layout = _layout(setup, masked)
    assert layout.real_length == masked
    # 2 student layers, 2 teacher layers: g = 0, 1, 2.
    assert layout.keys == ("teacher_attention_scores/0", "teacher_attention_scores/1",
                           "teacher_embeddings", "teacher_hidden_states/1",
                           "teacher_hidden_states/2")
    examples = _examples()
    cache = _build(setup, masked, str(tmp_path / "c"))
    x, _ = next(iter(task.dataset(examples, tok, L, len(examples))))
    out = teacher(x, training=False)
    lengths = x["input_mask"].numpy().sum(1)
    np.testing.assert_array_equal(cache.lengths, lengths if masked else L)
    expect = {"teacher_embeddings": out["embeddings"].numpy(),
              **{f"teacher_hidden_states/{g}": out["hidden_states"][g].numpy() for g in (1, 2)},
              **{f"teacher_attention_scores/{g}": out["attention_scores"][g].numpy()
                 for g in (0, 1)}}
    exact = total = 0
    for key, values in expect.items():
        for i, n in enumerate(cache.lengths):
            want = values[i, :n] if layout.kind(key) == "hidden" else values[i, :, :n, :n]
            got = cache.row(key, i)
            assert got.shape == want.shape
            # Another batch composition can move a value across a rounding boundary:
            # one bfloat16 step at most, rarely.
            diff = np.abs(got.astype(np.int64) - rne(want).astype(np.int64))
            assert diff.max() <= 1, key
            exact += int((diff == 0).sum())
            total += diff.size
    assert exact >= 0.999 * total
    # Size on disk: 2 bytes a value, [n, d] per hidden state, [h, n, n] per map.
    d, h = teacher.bert_config.hidden_size, teacher.bert_config.num_heads
    n = cache.lengths
    assert layout.bytes(lengths) == 2 * int((3 * n * d + 2 * h * n * n).sum())


class _RoundedTeacher(BertModel):
    """The teacher with every output rounded to bfloat16 (what the cache promises)."""

    def call(self, inputs, training=None):
        out = super().call(inputs, training=training)
        return tf.nest.map_structure(
            lambda t: tf.cast(tf.cast(t, tf.bfloat16), tf.float32), out)


def _train(setup, teacher, masked: bool, cache=None, epochs: int = 2):
    """Weights and loss history after `epochs` of the intermediate phase's batches."""
    _, student, tok, task = setup
    examples = _examples()
    terms = make_terms("embd,attn,hidn", mask_padding=masked)
    s = BertModel(student.bert_config, head="classifier", num_labels=2)
    s.set_weights(student.get_weights())
    keras.utils.set_random_seed(2)
    d = Distiller(student=s, teacher=teacher, terms=terms)
    # Eager: tracing costs more than these tiny steps.
    d.compile(create_optimizer(1e-2, 10, weight_decay=0.01, schedule="constant"),
              run_eagerly=True)
    padding = task_input.Padding(BOUNDARIES if masked else (), "")
    lengths = task.row_lengths(examples, tok, L) if masked else None
    make = task_input.epoch_input(task, examples, tok, L, BATCH, 11, padding, lengths,
                                  teacher_layers=cache)
    history = []
    for epoch in range(epochs):
        history += d.fit(make(epoch), epochs=1, verbose=0).history["loss"]
        if cache is not None:
            assert d.teacher_outputs_in(next(iter(make(epoch)))[0])
    return [v.numpy() for v in d.trainable_variables], history


@pytest.mark.parametrize("masked", [True, False])
def test_training_from_the_cache_is_training_against_the_rounded_teacher(setup, tmp_path,
                                                                         masked):
    teacher = setup[0]
    rounded = _RoundedTeacher(teacher.bert_config, head="classifier", num_labels=2)
    rounded.set_weights(teacher.get_weights())
    epochs = 2 if masked else 1  # two bucketed epochs: the cache read in two orders
    want_w, want_h = _train(setup, rounded, masked, epochs=epochs)
    # The cached run's teacher has other (random) weights: had it run, all would differ.
    stranger = BertModel(teacher.bert_config, head="classifier", num_labels=2)
    got_w, got_h = _train(setup, stranger, masked, _build(setup, masked, str(tmp_path / "c")),
                          epochs=epochs)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-6)
    for a, b in zip(got_w, want_w):
        np.testing.assert_allclose(a, b, atol=1e-6)
    if masked:  # against the float32 teacher the targets moved by the rounding: so did the loss
        plain_h = _train(setup, teacher, masked, epochs=1)[1]
        assert 0 < abs(plain_h[0] - want_h[0]) < 1e-2 * abs(want_h[0])


def test_parts_resume_and_damaged_or_stale_parts_are_recomputed(setup, tmp_path, monkeypatch,
                                                                capsys):
    monkeypatch.setattr(layer_cache, "PART_ROWS", 5)
    folder = str(tmp_path / "c")
    first = _build(setup, True, folder)
    assert "teacher layers of 14 rows cached" in capsys.readouterr().out
    names = sorted(os.listdir(folder))
    assert names[0] == "cache.json" and len(names) == 1 + 3 * 6  # 3 parts x (5 outputs + lengths)

    # Copies: the parts are memory-mapped, and the test damages the files in place.
    rows = {(key, i): np.array(first.row(key, i))
            for key in first.layout.keys for i in range(len(first.lengths))}

    def same(cache):
        np.testing.assert_array_equal(cache.lengths, first.lengths)
        for (key, i), row in rows.items():
            np.testing.assert_array_equal(cache.row(key, i), row)

    same(_build(setup, True, folder))
    assert "cached" not in capsys.readouterr().out  # every part read back
    with open(os.path.join(folder, "part-00001.teacher_embeddings.npy"), "r+b") as f:
        f.truncate(60)  # a copy cut short
    os.remove(os.path.join(folder, "part-00002.lengths.npy"))  # killed before its last file
    same(_build(setup, True, folder))
    assert "teacher layers of 9 rows cached" in capsys.readouterr().out
    _build(setup, True, folder, identity={"teacher": "another"})
    assert "teacher layers of 14 rows cached" in capsys.readouterr().out


def test_the_plan_caches_only_several_epochs_within_the_budget(setup):
    layout = _layout(setup, True)
    lengths = np.array([5, 9, 16])
    size = layout.bytes(lengths)
    budget = size / 2**30
    assert layer_cache.plan(layout, lengths, 20, True, budget * 1.01).use
    too_big = layer_cache.plan(layout, lengths, 20, True, budget * 0.99)
    assert not too_big.use and "exceeds --teacher_cache_budget_gb" in too_big.reason
    assert not layer_cache.plan(layout, lengths, 1, True, 100).use
    assert not layer_cache.plan(layout, lengths, 20, False, 100).use
    estimate = layer_cache.plan(layout, lengths, 20, True, 100, scale=21.0)
    assert estimate.bytes == int(21 * size) and "estimate" in str(estimate.describe())
    teacher, student, _, task = setup
    assert layer_cache.layout([PredictionTerm(task=task)], student.bert_config,
                              teacher.bert_config, L) is None  # logits: not this cache


def test_the_intermediate_phase_trains_from_the_cache_the_plan_announces(tmp_path, tiny_vocab,
                                                                        capsys):
    teacher = write_teacher(str(tmp_path / "task_teacher"), tiny_vocab, head="classifier",
                            dropout=0.0)
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], general_model="none",
                    task_teacher=teacher, use_augmented=False, intermediate_epochs=2,
                    pred_epochs=1, mask_padding=True, checkpoint_every=100)
    plan = run_argv_plan(ns)
    intermediate = next(p for p in plan["phases"] if p["phase"] == "intermediate")
    assert intermediate["teacher_cache"]["use"] is True
    assert intermediate["padding"]["batches"] == "length buckets"
    capsys.readouterr()
    run(ns)
    assert "[intermediate] teacher cache: used" in capsys.readouterr().out
    folder = tmp_path / "out" / "task" / "intermediate" / layer_cache.CACHE_FOLDER
    assert (folder / "part-00000.lengths.npy").is_file()


def run_argv_plan(ns) -> dict:
    return run_argv(["bin/distill", *argv(type(ns)(**{**vars(ns), "dry_run": True}))])
