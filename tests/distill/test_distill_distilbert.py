"""DistilBERT student initialisation from every other teacher layer."""
import numpy as np
import pytest

from tinybert_tf.distill.distilbert import (
    describe_init,
    init_student_from_teacher,
    teacher_layers_for,
)
from tinybert_tf.models.encoder import BertModel


def test_every_other_layer_and_embeddings_are_copied(tiny_config):
    t_cfg = tiny_config.replace(num_layers=4)
    teacher = BertModel(t_cfg, head="mlm")
    student = BertModel(tiny_config.replace(num_layers=2, max_position_embeddings=32),
                        head="mlm")
    copied = init_student_from_teacher(student, teacher)
    assert copied[:4] == ["token_embedding", "position_embedding", "segment_embedding",
                          "embeddings_layer_norm"]
    assert "transformer_layer_0" in copied and "transformer_layer_1" in copied
    assert "mlm_head" in copied and "pooled_dense" in copied
    s, t = student.weight_dict(), teacher.weight_dict()
    for path, var in s.items():
        if path.startswith("transformer_layer_1/"):
            src = "transformer_layer_2/" + path.split("/", 1)[1]
        elif path.startswith("transformer_layer_0/"):
            src = path
        elif path.startswith("position_embedding/"):
            np.testing.assert_array_equal(var.numpy(), t[path].numpy()[:32])
            continue
        else:
            src = path
        np.testing.assert_array_equal(var.numpy(), t[src].numpy(), err_msg=path)
    # Layer 1 of the teacher was skipped: its weights differ from student layer 1.
    q = "self_attention_layer/query/kernel"
    assert not np.allclose(s[f"transformer_layer_1/{q}"].numpy(),
                           t[f"transformer_layer_1/{q}"].numpy())


def test_width_mismatch_is_a_clear_error(tiny_config):
    teacher = BertModel(tiny_config.replace(num_layers=4, hidden_size=48, intermediate_size=96))
    student = BertModel(tiny_config)
    before = student.weight_dict()["token_embedding/embeddings"].numpy().copy()
    with pytest.raises(ValueError, match="hidden_size differs"):
        init_student_from_teacher(student, teacher)
    np.testing.assert_array_equal(before, student.weight_dict()["token_embedding/embeddings"])


def test_layer_choice():
    assert teacher_layers_for("every_other", 6, 12) == [0, 2, 4, 6, 8, 10]
    assert teacher_layers_for([0, 2, 4, 7, 9, 11], 6, 12) == [0, 2, 4, 7, 9, 11]
    with pytest.raises(ValueError, match="explicit list"):
        teacher_layers_for("every_other", 4, 6)
    with pytest.raises(ValueError):
        teacher_layers_for([0, 12], 2, 12)


def test_the_copy_is_described_by_transformer_layers_not_by_weight_groups(tiny_config):
    """A 1-layer student from a 4-layer teacher: "1 transformer layer", not "6 layers"
    (token, position, segment embeddings, LayerNorm, the layer, the pooler)."""
    teacher = BertModel(tiny_config.replace(num_layers=4))
    student = BertModel(tiny_config.replace(num_layers=1))
    copied = init_student_from_teacher(student, teacher, layers=[3])
    assert describe_init(copied, [3]) == (
        "the embeddings, 1 transformer layer (teacher -> student: 4 -> 1) and the pooler")
    student = BertModel(tiny_config.replace(num_layers=2), head="mlm")
    teacher = BertModel(tiny_config.replace(num_layers=4), head="mlm")
    copied = init_student_from_teacher(student, teacher)
    assert "2 transformer layers (teacher -> student: 1 -> 1, 3 -> 2)" in describe_init(
        copied, teacher_layers_for("every_other", 2, 4))


def test_a_narrower_ffn_keeps_the_teacher_units_of_largest_weight_norm(tiny_config):
    """Student intermediate_size 24 of the teacher's 64: each copied layer gets the 24
    units j with the largest ||W_in[:, j]|| * ||W_out[j, :]||, the same j for the
    intermediate kernel's columns, its bias and the output kernel's rows; the rest of
    the layer is copied whole. Checked against a ranking written out here."""
    teacher = BertModel(tiny_config.replace(num_layers=4, intermediate_size=64))
    student = BertModel(tiny_config.replace(num_layers=2, intermediate_size=24))
    t = teacher.weight_dict()
    rng = np.random.default_rng(0)
    for path, var in t.items():  # distinct biases, so a wrong column choice shows
        if path.endswith("feedforward_intermediate_dense/bias"):
            var.assign(rng.normal(size=var.shape).astype("float32"))
    copied = init_student_from_teacher(student, teacher)  # teacher layers 0 and 2
    s = student.weight_dict()
    assert "transformer_layer_1" in copied
    for m, j in ((0, 0), (1, 2)):
        w_in = t[f"transformer_layer_{j}/feedforward_intermediate_dense/kernel"].numpy()
        w_out = t[f"transformer_layer_{j}/feedforward_output_dense/kernel"].numpy()
        scores = [(np.sqrt((w_in[:, u] ** 2).sum()) * np.sqrt((w_out[u] ** 2).sum()), u)
                  for u in range(64)]
        kept = sorted(u for _, u in sorted(scores, reverse=True)[:24])
        dropped = set(range(64)) - set(kept)
        assert min(sc for sc, u in scores if u in kept) >= max(
            sc for sc, u in scores if u in dropped)
        sp, tp = f"transformer_layer_{m}/", f"transformer_layer_{j}/"
        np.testing.assert_array_equal(s[sp + "feedforward_intermediate_dense/kernel"],
                                      w_in[:, kept])
        np.testing.assert_array_equal(
            s[sp + "feedforward_intermediate_dense/bias"],
            t[tp + "feedforward_intermediate_dense/bias"].numpy()[kept])
        np.testing.assert_array_equal(s[sp + "feedforward_output_dense/kernel"],
                                      w_out[kept])
        for rest in ("feedforward_output_dense/bias", "feedforward_layer_norm/gamma",
                     "self_attention_layer/query/kernel"):
            np.testing.assert_array_equal(s[sp + rest], t[tp + rest].numpy(), err_msg=rest)


def test_a_wider_ffn_than_the_teacher_is_refused_before_copying(tiny_config):
    teacher = BertModel(tiny_config.replace(num_layers=2, intermediate_size=32))
    student = BertModel(tiny_config.replace(num_layers=1, intermediate_size=64))
    before = student.weight_dict()["token_embedding/embeddings"].numpy().copy()
    with pytest.raises(ValueError, match="intermediate_size differs.*student 64, teacher 32"):
        init_student_from_teacher(student, teacher)
    np.testing.assert_array_equal(before, student.weight_dict()["token_embedding/embeddings"])
