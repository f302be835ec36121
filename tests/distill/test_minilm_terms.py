"""MiniLM's terms against NumPy transcripts of the papers' equations, with padding:
v1 (Wang et al. 2020, Sec. 3: attention distributions and value
relations), v2 (Wang et al. 2021, Sec. 3: Q-Q, K-K, V-V relations with relation
heads re-split from the concatenated heads), and the encoder's Q, K, V outputs."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.config import BertConfig
from tinybert_tf.distill import Distiller, make_terms
from tinybert_tf.models import BertModel


def _model(vocab, hidden, layers, heads, seed):
    keras.utils.set_random_seed(seed)
    # A wide initialisation, so attention and relations are far from uniform.
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_layers=layers,
                        num_heads=heads, intermediate_size=32, max_position_embeddings=16,
                        hidden_dropout=0.0, attention_dropout=0.0, initializer_range=0.3)
    return BertModel(config, vocab=vocab)


@pytest.fixture(scope="module")
def models(tiny_vocab):
    """Student 16 wide, 2 layers, 2 heads; teachers 24 wide, 3 layers, 2 or 3 heads."""
    return {"student": _model(tiny_vocab, 16, 2, 2, 1),
            "teacher": _model(tiny_vocab, 24, 3, 2, 2),
            "teacher3": _model(tiny_vocab, 24, 3, 3, 3)}


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(10, 40, size=(3, 7)).astype(np.int32)
    mask = np.ones((3, 7), np.int32)
    mask[1, 4:] = 0
    mask[2, 6:] = 0
    ids[mask == 0] = 0
    return {"input_word_ids": tf.constant(ids), "input_mask": tf.constant(mask),
            "input_type_ids": tf.zeros([3, 7], tf.int32)}


def _log_softmax_real(logits, mask):
    """Row log-softmax over the real keys only; [B, h, L, L] with mask [B, L]."""
    x = np.where(mask[:, None, None, :] > 0, logits, -np.inf)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _kl_mean(s_logits, t_logits, mask):
    """(1 / (heads x real tokens)) sum over heads and real queries of KL(T || S)."""
    log_s, log_t = _log_softmax_real(s_logits, mask), _log_softmax_real(t_logits, mask)
    p_t = np.exp(log_t)
    total = 0.0
    B, h, L, _ = t_logits.shape
    for b in range(B):
        for a in range(h):
            for q in range(L):
                if not mask[b, q]:
                    continue
                keys = mask[b] > 0
                total += np.sum(p_t[b, a, q, keys] * (log_t[b, a, q, keys] - log_s[b, a, q, keys]))
    return total / (h * mask.sum())


def _relation(x, heads):
    """x [B, L, h, d] -> concatenated [B, L, h*d] split into `heads` relation heads,
    X_a X_a^T / sqrt(d_r): [B, heads, L, L]."""
    B, L = x.shape[:2]
    x = x.reshape(B, L, -1)
    d_r = x.shape[-1] // heads
    x = x.reshape(B, L, heads, d_r).transpose(0, 2, 1, 3)
    return x @ x.transpose(0, 1, 3, 2) / np.sqrt(d_r)


def _np(out, key, layer):
    return np.asarray(out[key][layer], np.float64)


def _loss(student, teacher, names, batch, **settings):
    distiller = Distiller(student=student, teacher=teacher, terms=make_terms(names, **settings))
    return {k: float(v) for k, v in distiller.compute_losses(batch).items()}


def test_encoder_returns_each_layers_q_k_v_behind_its_scores(models, batch):
    model = models["teacher3"]
    out = model(batch, training=False)
    attn = model.transformer_layers[0].self_attention_layer
    x = np.asarray(out["hidden_states"][0], np.float64)
    v = np.einsum("blc,chd->blhd", x, attn.value.kernel.numpy()) + attn.value.bias.numpy()
    np.testing.assert_allclose(_np(out, "attention_values", 0), v, atol=1e-5)
    for layer in range(3):
        q, k = _np(out, "attention_queries", layer), _np(out, "attention_keys", layer)
        assert q.shape == (3, 7, 3, 8)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
        np.testing.assert_allclose(_np(out, "attention_scores", layer), scores, atol=1e-5)


def test_minilm_att_is_the_kl_of_last_layer_attention_distributions(models, batch):
    s, t = models["student"], models["teacher"]
    loss = _loss(s, t, "minilm_att", batch)["minilm_att"]
    mask = batch["input_mask"].numpy()
    # Teacher's last layer (3) -> student's last layer (2); padded keys get no weight.
    expect = _kl_mean(_np(s(batch), "attention_scores", -1),
                      _np(t(batch), "attention_scores", -1), mask)
    assert expect > 1e-2 and loss == pytest.approx(expect, rel=1e-4)


def test_minilm_val_is_the_kl_of_value_relations_per_head(models, batch):
    s, t = models["student"], models["teacher"]
    loss = _loss(s, t, "minilm_val", batch)["minilm_val"]
    mask = batch["input_mask"].numpy()
    s_v, t_v = _np(s(batch), "attention_values", -1), _np(t(batch), "attention_values", -1)
    # Per head: softmax(V_a V_a^T / sqrt(d_k)), each model's own d_k (8 and 12).
    s_rel = np.einsum("bqhd,bkhd->bhqk", s_v, s_v) / np.sqrt(8)
    t_rel = np.einsum("bqhd,bkhd->bhqk", t_v, t_v) / np.sqrt(12)
    expect = _kl_mean(s_rel, t_rel, mask)
    assert expect > 1e-2 and loss == pytest.approx(expect, rel=1e-4)


def test_minilm_rel_sums_qq_kk_vv_relations_of_the_chosen_teacher_layer(models, batch):
    s, t = models["student"], models["teacher3"]  # 2 heads vs 3: v2 allows it
    loss = _loss(s, t, "minilm_rel", batch, relation_heads=4, teacher_layer=2)["minilm_rel"]
    mask = batch["input_mask"].numpy()
    s_out, t_out = s(batch), t(batch)
    expect = sum(_kl_mean(_relation(_np(s_out, key, -1), 4),
                          _relation(_np(t_out, key, 1), 4), mask)     # teacher layer 2
                 for key in ("attention_queries", "attention_keys", "attention_values"))
    assert expect > 1e-2 and loss == pytest.approx(expect, rel=1e-4)
    last = _loss(s, t, "minilm_rel", batch, relation_heads=4, teacher_layer=0)["minilm_rel"]
    assert last != pytest.approx(loss, rel=1e-3)  # 0 = the last layer, another target


def test_padding_changes_nothing_for_the_real_tokens(models, batch):
    """Row 1 padded to 7 tokens gives the row's loss at its real length 4."""
    s, t = models["student"], models["teacher"]
    row = {k: v[1:2] for k, v in batch.items()}
    short = {k: v[:, :4] for k, v in row.items()}
    for names in ("minilm_att", "minilm_val"):
        padded, cut = _loss(s, t, names, row)["loss"], _loss(s, t, names, short)["loss"]
        assert padded == pytest.approx(cut, rel=1e-5)


def test_minilm_terms_vanish_for_a_student_equal_to_its_teacher(models, batch):
    t = models["teacher"]
    losses = _loss(t, t, "minilm_att,minilm_val,minilm_rel", batch, relation_heads=4)
    assert max(abs(v) for v in losses.values()) < 1e-6


def test_shapes_the_terms_cannot_compare_are_refused_naming_the_flag(models, batch):
    s, t3 = models["student"], models["teacher3"]
    with pytest.raises(ValueError, match="minilm_v2"):
        _loss(s, t3, "minilm_att", batch)
    with pytest.raises(ValueError, match="--minilm_relation_heads=5"):
        _loss(s, t3, "minilm_rel", batch, relation_heads=5)
    with pytest.raises(ValueError, match="--minilm_teacher_layer=4"):
        _loss(s, t3, "minilm_rel", batch, teacher_layer=4)
