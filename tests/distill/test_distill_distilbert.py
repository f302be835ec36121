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
