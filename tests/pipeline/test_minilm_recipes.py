"""MiniLM as the general stage: the shipped configs carry the papers' settings, and a
MiniLM-distilled student learns on the embedded default (all-MiniLM-L6-v2 teacher,
the Wikipedia sample) at toy size: its loss falls."""
from __future__ import annotations

import itertools

import keras
import pytest
import tensorflow as tf

from tinybert_tf.config import BertConfig
from tinybert_tf.data import corpus
from tinybert_tf.distill import Distiller, create_optimizer
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_model, load_tokenizer
from tinybert_tf.pipeline.main import main, parse_argv
from tinybert_tf.pipeline.training.recipes import get_recipe

from pipeline_helpers import argv, parse, tiny_flags


def test_minilm_configs_carry_the_papers_settings(monkeypatch):
    v1 = parse("general_minilm_v1.cfg", monkeypatch)
    assert v1.recipe == "minilm_v1" and v1.student_config == "minilm_l6_384d"
    assert (v1.general_max_seq_len, v1.general_batch_size, v1.general_max_steps) == \
        (512, 256, 400000)
    assert v1.general_lr == pytest.approx(3e-4) and v1.general_warmup == pytest.approx(0.01)
    v2 = parse("general_minilm_v2.cfg", monkeypatch)
    assert v2.recipe == "minilm_v2" and v2.minilm_relation_heads == 48
    assert v2.minilm_teacher_layer == 0 and v2.general_batch_size == 1024
    assert v2.general_lr == pytest.approx(6e-4) and v2.general_max_steps == 400000


def test_recipes_resolve_to_the_minilm_terms_with_their_flags(tmp_path):
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path}", "--recipe=minilm_v2",
                         "--minilm_relation_heads=12", "--minilm_teacher_layer=5"])
    (rel,) = get_recipe("minilm_v2").terms(config)
    assert (rel.name, rel.relation_heads, rel.teacher_layer_spec) == ("minilm_rel", 12, 5)
    v1 = get_recipe("minilm_v1").terms(config)
    assert [t.name for t in v1] == ["minilm_att", "minilm_val"]
    assert not any(t.needs_projections for t in v1 + [rel])


@pytest.fixture(scope="module")
def embedded(minilm_dir):
    """The embedded teacher (real weights) and one batch of 8 sentences of the embedded
    Wikipedia sample, 32 tokens."""
    teacher = load_model(minilm_dir)
    sentences = list(itertools.islice(
        (s for doc in corpus.iter_documents() for s in doc), 8))
    batch = load_tokenizer(teacher, 32)(sentences, max_seq_len=32)
    return teacher, {k: tf.constant(v) for k, v in batch.items()}


@pytest.mark.parametrize("recipe,flags", [("minilm_v1", []),
                                          ("minilm_v2", ["--minilm_relation_heads=12"])])
def test_minilm_student_learns_on_the_embedded_default(recipe, flags, embedded, tmp_path):
    """The tiniest student of the teacher's vocabulary (1 layer, 24 wide, the teacher's 12
    heads, which v1 needs) trained by the recipe's terms: its loss on the batch falls."""
    teacher, batch = embedded
    keras.utils.set_random_seed(5)
    student = BertModel(BertConfig(hidden_size=24, num_layers=1, num_heads=12,
                                   intermediate_size=48, max_position_embeddings=64),
                        vocab=teacher.vocab)
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path}", f"--recipe={recipe}",
                         *flags])
    distiller = Distiller(student=student, teacher=teacher,
                          terms=get_recipe(recipe).terms(config))
    distiller.compile(create_optimizer(3e-3, num_train_steps=20, schedule="constant"))
    before = float(distiller.compute_losses(batch)["loss"])
    distiller.fit(tf.data.Dataset.from_tensors(batch).repeat(20), epochs=1, verbose=0)
    after = float(distiller.compute_losses(batch)["loss"])
    assert after < 0.9 * before, (before, after)


@pytest.mark.parametrize("recipe,flags,message", [
    ("minilm_v2", {}, "--recipe=minilm_v2: --minilm_relation_heads=48 must divide"),
    ("minilm_v2", {"minilm_relation_heads": 4, "minilm_teacher_layer": 3},
     "--minilm_teacher_layer=3: the teacher has layers 1..2"),
])
def test_preflight_refuses_shapes_the_terms_cannot_compare(recipe, flags, message, tmp_path,
                                                           tiny_vocab, capsys):
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["general"], dry_run=True, recipe=recipe,
                    **flags)  # student 16 wide, teacher 32 wide with 2 layers
    assert main(["bin/distill", *argv(ns)]) == 2
    assert message in capsys.readouterr().err
