"""The prediction phase's teacher cache: logits computed once per example, kept in the
phase folder and resumable; the Distiller skips the teacher when every teacher-reading
term declares it reads only the logits and they come with the batch; training with
the cache ends with the weights of recomputing the teacher every step."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.data import glue
from tinybert_tf.data.examples import Example
from tinybert_tf.distill import Distiller, LossTerm, make_terms
from tinybert_tf.distill.terms import PredictionTerm
from tinybert_tf.models.checkpoint import load_model, load_tokenizer, save_model
from tinybert_tf.pipeline.training import teacher_cache as cache_lib
from tinybert_tf.tasks import task_type

from pipeline_helpers import load_weights, run, tiny_flags, write_teacher


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_vocab):
    tmp = tmp_path_factory.mktemp("cache_models")
    teacher = load_model(write_teacher(str(tmp / "t"), tiny_vocab, head="classifier",
                                       dropout=0.0))
    student = load_model(write_teacher(str(tmp / "s"), tiny_vocab, hidden=16, head="classifier",
                                       dropout=0.0, seed=5))
    return teacher, student


def _batch(teacher):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, len(teacher.vocab), (4, 10)).astype(np.int32)
    return {"input_word_ids": ids, "input_mask": np.ones_like(ids),
            "input_type_ids": np.zeros_like(ids)}


class _Unknown(LossTerm):
    """A teacher-reading term that does not declare what it reads."""

    name = "unknown"

    def count(self, inputs):
        return tf.constant(1.0)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        return tf.reduce_sum(teacher_outputs["logits"]) * 0.0 + tf.reduce_sum(
            tf.cast(student_outputs["logits"], tf.float32))


def test_teacher_logits_in_the_batch_replace_the_teacher_forward(models):
    teacher, student = models
    pred = PredictionTerm(task=task_type("sst-2"))
    distiller = Distiller(student=student, teacher=teacher, terms=[pred])
    assert distiller.teacher_reads == ("logits",)
    x = _batch(teacher)
    recomputed = distiller.compute_losses(x)["loss"]
    cached = dict(x, teacher_logits=teacher(x, training=False)["logits"])
    np.testing.assert_allclose(distiller.compute_losses(cached)["loss"], recomputed, rtol=1e-6)
    # Other logits in the batch are what the loss sees: the teacher did not run.
    wrong = dict(x, teacher_logits=np.tile(np.float32([[8.0, -8.0]]), (4, 1)))
    assert abs(float(distiller.compute_losses(wrong)["loss"]) - float(recomputed)) > 1e-4
    # Intermediate terms read other outputs; an undeclared term makes the teacher run.
    assert Distiller(student=student, teacher=teacher,
                     terms=make_terms("embd,hidn")).teacher_reads == ("embeddings",
                                                                      "hidden_states")
    undeclared = Distiller(student=student, teacher=teacher, terms=[pred, _Unknown()])
    assert undeclared.teacher_reads is None and not undeclared.teacher_outputs_in(wrong)


def test_cache_is_written_once_per_part_and_a_damaged_part_is_recomputed(models, tmp_path,
                                                                         monkeypatch, capsys):
    teacher, _ = models
    monkeypatch.setattr(cache_lib, "PART_ROWS", 4)
    examples = [Example(f"e{i}", f"the movie was {w}", None, i % 2)
                for i, w in enumerate(["good", "bad", "fun", "dull", "great", "awful"] * 2)]
    tok = load_tokenizer(teacher, 16)
    task = task_type("sst-2")
    folder = str(tmp_path / "cache")

    def logits():
        return cache_lib.teacher_logits(teacher, examples, task, tok, 16, 5, folder,
                                        tf.distribute.get_strategy(), {"teacher": "t"})

    first = logits()
    assert first.shape == (12, 2) and "cached" in capsys.readouterr().out
    assert sorted(os.listdir(folder)) == ["cache.json", "logits-00000.npy",
                                          "logits-00001.npy", "logits-00002.npy"]
    expect = np.concatenate([teacher(x, training=False)["logits"].numpy()
                             for x, _ in task.dataset(examples, tok, 16, 12)])
    np.testing.assert_allclose(first, expect, atol=1e-6)
    np.testing.assert_array_equal(logits(), first)
    assert "cached" not in capsys.readouterr().out  # nothing recomputed
    with open(os.path.join(folder, "logits-00001.npy"), "r+b") as f:
        f.truncate(20)  # cut by a kill mid-write of a non-atomic copy
    np.testing.assert_allclose(logits(), first, atol=1e-6)
    assert "teacher logits of 4 rows cached" in capsys.readouterr().out


def test_epoch_batches_carry_the_logits_of_their_own_rows():
    logits = np.arange(10, dtype=np.float32).reshape(10, 1)
    order = cache_lib.epoch_permutation(10, 3, 1)
    rows = tf.data.Dataset.from_tensor_slices(
        ({"input_word_ids": order.reshape(10, 1).astype(np.int32)}, order)).batch(
        4, drop_remainder=True)
    batches = list(cache_lib.with_teacher_logits(rows, logits, order, 4))
    assert len(batches) == 2
    for x, y in batches:
        np.testing.assert_array_equal(x["teacher_logits"][:, 0], y.numpy().astype(np.float32))


def _spread_logits(folder: str, data_dir: str) -> None:
    """Make a random tiny teacher's soft targets differ from sentence to sentence (a
    fresh one gives all nearly the same), so a cache row given to the wrong example
    changes the result: larger kernels, logits centred on the training set."""
    model = load_model(folder)
    weights = model.weight_dict()
    for path, var in weights.items():
        if path.endswith("kernel"):
            var.assign(var * (20.0 if path.startswith("classifier") else 8.0))
    task, tok = task_type("sst-2"), load_tokenizer(model, 24)
    examples = glue.load_examples("sst-2", data_dir, "train")
    logits = np.concatenate([model(x, training=False)["logits"].numpy()
                             for x, _ in task.dataset(examples, tok, 24, 8)])
    bias = weights["classifier_head/classifier/bias"]
    bias.assign(bias - logits.mean(0))
    save_model(model, folder)


def test_training_with_the_cache_ends_with_the_weights_of_recomputing(tmp_path, tiny_vocab):
    teacher = write_teacher(str(tmp_path / "task_teacher"), tiny_vocab, head="classifier",
                            dropout=0.0)
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], general_model="none",
                    task_teacher=teacher, use_augmented=False, task_phases=["prediction"],
                    pred_epochs=2, checkpoint_every=100)
    _spread_logits(teacher, ns.data_dir)
    weights = {}
    for cache in (True, False):
        out = tmp_path / f"cache_{cache}"
        run(type(ns)(**{**vars(ns), "output_dir": str(out), "teacher_cache": cache}))
        assert os.path.isdir(out / "task" / "prediction" / "teacher_cache") == cache
        weights[cache] = load_weights(str(out / "task" / "model"))
    assert weights[True].keys() == weights[False].keys()
    for key in weights[True]:
        np.testing.assert_allclose(weights[True][key], weights[False][key], atol=1e-6,
                                   err_msg=key)


def test_a_live_teacher_step_captures_the_logits_of_its_rows(models):
    teacher, student = models
    distiller = Distiller(student=student, teacher=teacher, terms=make_terms("hidn"))
    distiller.compile(optimizer="sgd")
    logits = tf.Variable(tf.zeros([9, 2]), trainable=False)
    seen = tf.Variable(tf.zeros([9], tf.bool), trainable=False)
    distiller.capture_teacher_logits(logits, seen)
    x = _batch(teacher)
    rows = np.int32([7, 2, 5, 0])
    distiller.train_on_batch(dict(x, row_id=rows))
    np.testing.assert_array_equal(seen.numpy(), np.isin(np.arange(9), rows))
    np.testing.assert_allclose(logits.numpy()[rows], teacher(x, training=False)["logits"],
                               atol=1e-6)
    assert not np.any(logits.numpy()[~seen.numpy()])  # the other rows are untouched


def test_known_logits_are_taken_and_only_the_unseen_rows_computed(models, tmp_path, capsys):
    teacher, _ = models
    examples = [Example(f"e{i}", f"the movie was {w}", None, i % 2)
                for i, w in enumerate(["good", "bad", "fun", "dull", "great", "awful"])]
    tok = load_tokenizer(teacher, 16)
    task = task_type("sst-2")
    full = cache_lib.teacher_logits(teacher, examples, task, tok, 16, 4, str(tmp_path / "a"),
                                    tf.distribute.get_strategy(), {"teacher": "t"})
    seen = np.array([True, False, True, True, False, True])
    known = np.where(seen[:, None], full, 0.0).astype(np.float32)
    known[0] = [5.0, -5.0]  # what the earlier pass recorded is what the cache keeps
    capsys.readouterr()
    got = cache_lib.teacher_logits(teacher, examples, task, tok, 16, 4, str(tmp_path / "b"),
                                   tf.distribute.get_strategy(), {"teacher": "t"},
                                   known=(known, seen))
    np.testing.assert_allclose(got[1:], full[1:], atol=1e-6)
    np.testing.assert_array_equal(got[0], [5.0, -5.0])
    assert "teacher logits of 2 rows cached" in capsys.readouterr().out


def test_epoch_batches_carry_their_row_indices():
    order = cache_lib.epoch_permutation(10, 3, 1)
    rows = tf.data.Dataset.from_tensor_slices(
        ({"input_word_ids": order.reshape(10, 1).astype(np.int32)}, order)).batch(
        4, drop_remainder=True)
    batches = list(cache_lib.with_row_ids(rows, order, 4))
    assert len(batches) == 2
    for x, y in batches:
        np.testing.assert_array_equal(x["row_id"], y.numpy())


def test_the_prediction_cache_takes_the_intermediate_phases_logits(tmp_path, tiny_vocab,
                                                                   monkeypatch, capsys):
    """The intermediate phase runs the teacher over every row but the last partial
    batch; the prediction phase's cache computes only those, and training ends where
    computing every row again ends."""
    from tinybert_tf.pipeline.training import task_input
    teacher = write_teacher(str(tmp_path / "task_teacher"), tiny_vocab, head="classifier",
                            dropout=0.0)
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], general_model="none",
                    task_teacher=teacher, use_augmented=False,
                    task_phases=["intermediate", "prediction"], pred_epochs=1,
                    intermediate_epochs=1, checkpoint_every=100)
    _spread_logits(teacher, ns.data_dir)
    weights, printed = {}, {}
    for capture in (True, False):
        if not capture:
            monkeypatch.setattr(task_input, "logit_sink", lambda *a, **k: None)
        out = tmp_path / f"capture_{capture}"
        capsys.readouterr()
        run(type(ns)(**{**vars(ns), "output_dir": str(out)}))
        printed[capture] = capsys.readouterr().out
        weights[capture] = load_weights(str(out / "task" / "model"))
    assert "taken from the earlier phase's pass" in printed[True]
    assert "taken from the earlier phase's pass" not in printed[False]
    for key in weights[True]:
        np.testing.assert_allclose(weights[True][key], weights[False][key], atol=1e-5,
                                   err_msg=key)


def test_a_cache_names_its_teacher_by_content_not_by_folder_or_mtimes(tmp_path):
    """A run folder copied to another machine (new path, new mtimes) keeps its caches; a
    teacher whose weights changed does not."""
    import shutil

    teacher = tmp_path / "run" / "finetune_teacher" / "model"
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text('{"hidden_size": 8}')
    (teacher / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    identity = cache_lib.model_identity(str(teacher), dtype="float32")
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "run", moved, copy_function=shutil.copyfile)
    copy = moved / "finetune_teacher" / "model"
    os.utime(copy / "model.safetensors", ns=(10**18, 10**18))
    assert cache_lib.model_identity(str(copy), dtype="float32") == identity
    assert cache_lib.model_identity(str(copy), dtype="bfloat16") != identity
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[1000] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert cache_lib.model_identity(str(copy), dtype="float32") != identity
    # Weights in another format (a keras-hub preset's) count as well.
    (copy / "model.safetensors").unlink()
    (copy / "model.weights.h5").write_bytes(b"one teacher")
    keras_hub = cache_lib.model_identity(str(copy))
    (copy / "model.weights.h5").write_bytes(b"another one")
    assert cache_lib.model_identity(str(copy)) != keras_hub
