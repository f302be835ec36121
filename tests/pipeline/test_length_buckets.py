"""Length buckets: a bucketed epoch holds a padded epoch's rows once each, from (seed,
epoch) alone; batches take at most one shape per bucket; with padding masked a
bucketed batch gives the losses and the update of the same batch padded to
max_seq_len (one replica, gradient accumulation, two mirrored replicas); the
reference's unmasked intermediate losses do change, so that phase stays padded;
bucketed evaluation gives the padded predictions in example order."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.data import buckets
from tinybert_tf.data.examples import Example
from tinybert_tf.distill import Distiller, create_optimizer, make_terms
from tinybert_tf.distill.terms import HardLabelTerm, PredictionTerm
from tinybert_tf.models import BertModel
from tinybert_tf.pipeline.main import run_argv
from tinybert_tf.pipeline.preflight import PreflightError
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.training import task_input
from tinybert_tf.tasks import Classification, SpanQA, task_type
from tinybert_tf.tasks import token as token_module
from tinybert_tf.tasks.token import TokenClassification
from tinybert_tf.tokenizer import Tokenizer

from pipeline_helpers import argv, flag_values, tiny_flags

L = 16
BOUNDARIES = buckets.bucket_boundaries(L, 4)  # 4, 8, 12, 16


def test_boundaries_are_evenly_spaced_and_end_at_the_sequence_length():
    assert buckets.bucket_boundaries(64, 8) == (8, 16, 24, 32, 40, 48, 56, 64)
    assert buckets.bucket_boundaries(128, 8) == (16, 32, 48, 64, 80, 96, 112, 128)
    assert buckets.bucket_boundaries(48, 8) == (6, 12, 18, 24, 30, 36, 42, 48)
    assert buckets.bucket_boundaries(20, 3) == (7, 14, 20)
    assert buckets.bucket_boundaries(64, 0) == ()
    np.testing.assert_array_equal(buckets.padded_lengths([1, 8, 9, 64], (8, 16, 64)),
                                  [8, 8, 16, 64])


def test_a_bucketed_epoch_holds_the_padded_epochs_rows_once_from_seed_and_epoch():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 65, 1000)
    batch = 16
    grouped = task_input.epoch_rows(1000, batch, 7, 2, lengths)
    padded = task_input.epoch_rows(1000, batch, 7, 2)
    assert len(grouped) == len(padded) == 1000 - 1000 % batch
    assert len(set(grouped.tolist())) == len(grouped)  # each row once
    assert set(grouped.tolist()) == set(padded.tolist())  # the rows a padded epoch keeps
    np.testing.assert_array_equal(grouped, task_input.epoch_rows(1000, batch, 7, 2, lengths))
    assert not np.array_equal(grouped, task_input.epoch_rows(1000, batch, 7, 3, lengths))
    assert not np.array_equal(grouped, task_input.epoch_rows(1000, batch, 8, 2, lengths))
    # Rows of a batch have nearly equal lengths; a padded epoch's batches do not.
    spread = lambda order: np.ptp(lengths[order].reshape(-1, batch), axis=1).mean()  # noqa: E731
    assert spread(grouped) < 0.25 * spread(padded)
    # Padded tokens: the buckets' against max_seq_len.
    b = buckets.bucket_boundaries(64, 8)
    per_batch = [buckets.batch_length(lengths[r], b, 64) for r in grouped.reshape(-1, batch)]
    assert np.mean(per_batch) < 0.7 * 64


@pytest.fixture(scope="module")
def tok(tiny_vocab):
    return Tokenizer(tiny_vocab, lower_case=True, max_seq_len=L)


SENTENCES = ["the movie was good", "bad", "a very very very long and boring story of a cat",
             "fun", "the plot is not great but the actor is", "dog sat on the mat", "ran",
             "hello world"]


@pytest.mark.parametrize("pair", [False, True])
def test_row_lengths_are_the_packed_rows_and_batches_are_cut_to_their_bucket(tok, pair):
    task = task_type("sst-2")
    examples = [Example(str(i), s, SENTENCES[-1 - i] if pair else None, i % 2)
                for i, s in enumerate(SENTENCES)]
    lengths = task.row_lengths(examples, tok, L)
    padded = list(task.dataset(examples, tok, L, 3))
    np.testing.assert_array_equal(
        lengths, np.concatenate([x["input_mask"].numpy().sum(1) for x, _ in padded]))
    for (x, y), (px, py) in zip(task.dataset(examples, tok, L, 3, length_buckets=BOUNDARIES),
                                padded):
        n = x["input_word_ids"].shape[1]
        assert n == buckets.batch_length(px["input_mask"].numpy().sum(1), BOUNDARIES, L)
        for key in x:  # the same rows, cut where only padding was
            np.testing.assert_array_equal(x[key], px[key][:, :n])
            assert not px[key].numpy()[:, n:].any()
        np.testing.assert_array_equal(y, py)


def test_token_rows_and_their_tags_are_cut_together(tok):
    task = TokenClassification(["O", "B-X", "I-X"])
    examples = [Example(str(i), s, None, [i % 3] * len(s.split()))
                for i, s in enumerate(SENTENCES)]
    lengths = task.row_lengths(examples, tok, L)
    batches = list(task.dataset(examples, tok, L, 4, length_buckets=BOUNDARIES))
    for b, (x, y) in enumerate(batches):
        n = buckets.batch_length(lengths[b * 4:(b + 1) * 4], BOUNDARIES, L)
        assert x["input_word_ids"].shape[1] == y.shape[1] == n


# --- losses and updates -----------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tiny_config):
    s_cfg = tiny_config.replace(hidden_size=16, num_heads=2, intermediate_size=32,
                                hidden_dropout=0.0, attention_dropout=0.0)
    t_cfg = tiny_config.replace(hidden_dropout=0.0, attention_dropout=0.0)
    keras.utils.set_random_seed(4)
    student = BertModel(s_cfg, head="classifier", num_labels=2)
    teacher = BertModel(t_cfg, head="classifier", num_labels=2)
    return student, teacher, student.get_weights()


def _batch(n: int = 8, seed: int = 0):
    """Rows of length 3..9 padded to L, labels."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None, :] < rng.integers(3, 10, (n, 1))).astype(np.int32)
    ids = rng.integers(5, 60, (n, L)).astype(np.int32) * mask
    return {"input_word_ids": ids, "input_mask": mask,
            "input_type_ids": np.zeros_like(ids)}, rng.integers(0, 2, n).astype(np.int32)


def _cut(batch):
    x, y = batch
    cut = buckets.trim(({k: tf.constant(v) for k, v in x.items()}, tf.constant(y)),
                       BOUNDARIES, L)
    assert cut[0]["input_word_ids"].shape[1] < L
    return cut


def _terms(mask_padding: bool):
    task = Classification(["0", "1"])
    return make_terms("embd,attn,hidn", mask_padding=mask_padding) + [
        PredictionTerm(task=task), HardLabelTerm(task=task, weight=0.5)]


def _step(models, batch, strategy=None, mask_padding=True, **options):
    """Losses of `batch` and the weights after one update from the same start."""
    student, teacher, start = models
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        s = BertModel(student.bert_config, head="classifier", num_labels=2)
        t = BertModel(teacher.bert_config, head="classifier", num_labels=2)
        s.set_weights(start)
        t.set_weights(teacher.get_weights())
        keras.utils.set_random_seed(1)  # the projections' initial values
        d = Distiller(student=s, teacher=t, terms=_terms(mask_padding), **options)
        d.compile(create_optimizer(1e-2, 10, weight_decay=0.01), run_eagerly=True)
    losses = {k: float(v) for k, v in d.compute_losses(batch).items()}
    d.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    return losses, [v.numpy() for v in s.weights] + [v.numpy() for v in d.projection_variables]


def _assert_same_step(a, b):
    (la, wa), (lb, wb) = a, b
    assert la.keys() == lb.keys()
    for key in la:
        np.testing.assert_allclose(la[key], lb[key], rtol=1e-6, atol=1e-7, err_msg=key)
    for x, y in zip(wa, wb):
        np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.fixture(scope="module")
def padded(models):
    """Losses and update of `_batch()` padded to L, padding masked."""
    return _step(models, _batch())


def test_masked_losses_and_update_of_a_bucketed_batch_are_the_padded_ones(models, padded):
    batch = _batch()
    bucketed = _step(models, _cut(batch))
    moved = max(np.abs(w - s).max() for w, s in zip(padded[1], models[2]))
    assert moved > 1e-3  # the step changed the weights
    _assert_same_step(padded, bucketed)
    # Split into 2 accumulation micro-batches: the same update again.
    _assert_same_step(padded, _step(models, _cut(batch), grad_accum_steps=2))


def test_two_mirrored_replicas_on_bucketed_batches_make_the_padded_update(models, padded):
    assert len(tf.config.list_logical_devices("CPU")) >= 2, "conftest sets 2 CPU devices"
    # Reduction on one device, as the pipeline does on CPUs: collective instance keys
    # collide between strategies made in one process (pipeline/training/strategy.py).
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    # The global-count normaliser: counts (real tokens, pairs, examples) are all-reduced.
    _assert_same_step(padded, _step(models, _cut(_batch()), strategy=mirrored))


def test_the_references_unmasked_losses_change_with_the_padding(models):
    batch = _batch()
    padded = _step(models, batch, mask_padding=False)[0]
    bucketed = _step(models, _cut(batch), mask_padding=False)[0]
    for key in ("embd", "attn", "hidn"):  # counted over B x L (x L): L changed
        assert abs(bucketed[key] - padded[key]) > 1e-3 * abs(padded[key]), key
    np.testing.assert_allclose(bucketed["pred"], padded["pred"], rtol=1e-6)


# --- which phases bucket ------------------------------------------------------------------

def _padding(terms, task=None, **flags):
    config = PipelineConfig.from_flags(flag_values(output_dir="o", **flags))
    return task_input.padding_for(config, task or task_type("sst-2"), terms, 64)


def test_only_phases_whose_losses_ignore_padding_batch_by_length():
    task = Classification(["0", "1"])
    prediction, finetune = [PredictionTerm(task=task)], [HardLabelTerm(task=task)]
    assert _padding(prediction).boundaries == buckets.bucket_boundaries(64, 8)
    assert _padding(finetune).boundaries == buckets.bucket_boundaries(64, 8)
    reference = _padding(make_terms("embd,attn,hidn"))
    assert reference.boundaries == () and "--mask_padding" in reference.reason
    masked = _padding(make_terms("embd,attn,hidn", mask_padding=True), length_buckets=4)
    assert masked.boundaries == (16, 32, 48, 64)
    assert _padding(prediction, length_buckets=0).boundaries == ()
    assert "TPU" in _padding(prediction, strategy="tpu").reason
    squad = SpanQA()
    assert "does not batch by length" in _padding(prediction, squad).reason


# --- evaluation ---------------------------------------------------------------------------

def test_bucketed_evaluation_gives_the_padded_predictions_in_example_order(models, tok,
                                                                           monkeypatch):
    student = models[0]
    task = Classification(["0", "1"])
    examples = [Example(str(i), s, None, i % 2) for i, s in enumerate(SENTENCES * 2)]
    padded = task.logits(student, examples, tok, L, 3)
    bucketed = task.logits(student, examples, tok, L, 3, length_buckets=BOUNDARIES)
    np.testing.assert_allclose(bucketed, padded, atol=1e-5)
    # Tags: a tagger whose tag is the piece id mod 3 (exact), so each sentence's tags
    # show whether its rows came back to their own example.
    monkeypatch.setattr(token_module, "forward_fn", lambda model: lambda x: tf.one_hot(
        x["input_word_ids"] % 3, 3))
    tags = TokenClassification(["O", "B-X", "I-X"])
    tagged = [Example(str(i), s, None, [0] * len(s.split())) for i, s in enumerate(SENTENCES)]
    want = tags.predict(student, tagged, tok, L, 3)
    got = tags.predict(student, tagged, tok, L, 3, length_buckets=BOUNDARIES)
    assert len({tuple(w) for w in want}) > 3  # sentences differ
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_negative_bucket_counts_and_cache_budgets_are_refused_by_name(tmp_path, tiny_vocab):
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["finetune_teacher"], dry_run=True,
                    length_buckets=-1, teacher_cache_budget_gb=-2.0)
    with pytest.raises(PreflightError) as error:
        run_argv(["bin/distill", *argv(ns)])
    assert "--length_buckets=-1: must be >= 0" in str(error.value)
    assert "--teacher_cache_budget_gb=-2.0: must be >= 0" in str(error.value)
