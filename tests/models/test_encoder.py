"""Encoder behaviour: parity with keras-hub's BertBackbone, and the attention
scores it exposes (softmax(scores + mask) is the attention the layer used)."""
import keras
import numpy as np
import pytest
from scipy.special import erf

from tinybert_tf.config import BertConfig
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.models.layers import MASK_VALUE

B, L = 2, 10
LENGTHS = (10, 6)  # second example has 4 padded positions


def _inputs(vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab_size, size=(B, L)).astype("int32")
    mask = np.array([[1] * n + [0] * (L - n) for n in LENGTHS], "int32")
    ids = ids * mask
    types = np.zeros((B, L), "int32")
    types[:, 4:] = 1
    types *= mask
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def _randomise(model, seed=1, scale=0.3):
    """Give every variable non-trivial random values (LayerNorm gammas around 1)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        value = rng.normal(0.0, scale, size=v.shape).astype("float32")
        if v.path.endswith("gamma"):
            value += 1.0
        v.assign(value)


def _gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


@pytest.fixture(scope="module")
def tanh_config(tiny_config):
    return tiny_config.replace(hidden_act="gelu_tanh", max_position_embeddings=32)


def test_matches_keras_hub_backbone_with_same_weights(tanh_config):
    import keras_hub

    c = tanh_config
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=c.vocab_size, num_layers=c.num_layers, num_heads=c.num_heads,
        hidden_dim=c.hidden_size, intermediate_dim=c.intermediate_size, dropout=0.0,
        max_sequence_length=c.max_position_embeddings, num_segments=c.type_vocab_size)
    _randomise(backbone)
    model = BertModel(c)
    ours = model.weight_dict()
    theirs = {v.path: v for v in backbone.weights}
    assert set(ours) == set(theirs)
    for path, var in theirs.items():
        assert tuple(ours[path].shape) == tuple(var.shape), path
        ours[path].assign(var.numpy())
    x = _inputs(c.vocab_size)
    ref = backbone({"token_ids": x["input_word_ids"], "segment_ids": x["input_type_ids"],
                    "padding_mask": x["input_mask"]})
    out = model(x)
    np.testing.assert_allclose(out["sequence_output"], ref["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(out["pooled_output"], ref["pooled_output"], atol=1e-5)
    # The check has teeth: the exact-erf GELU gives measurably different outputs.
    exact = BertModel(c.replace(hidden_act="gelu"))
    for path, var in exact.weight_dict().items():
        var.assign(theirs[path].numpy())
    diff = np.abs(exact(x)["sequence_output"] - ref["sequence_output"]).max()
    assert diff > 1e-4


@pytest.fixture(scope="module")
def random_model(tiny_config):
    model = BertModel(tiny_config)
    _randomise(model, seed=3)
    return model


def test_output_contract(random_model, tiny_config):
    x = _inputs(tiny_config.vocab_size)
    out = random_model(x)
    assert len(out["hidden_states"]) == tiny_config.num_layers + 1
    assert len(out["attention_scores"]) == tiny_config.num_layers
    np.testing.assert_array_equal(out["embeddings"], out["hidden_states"][0])
    np.testing.assert_array_equal(out["sequence_output"], out["hidden_states"][-1])
    for s in out["attention_scores"]:
        assert tuple(s.shape) == (B, tiny_config.num_heads, L, L)


def test_scores_softmax_reproduces_the_layer(random_model, tiny_config):
    """softmax(scores + mask) rows sum to 1, padded keys get ~0, and these
    probabilities, with the layer's value/output weights, recompute its output."""
    c = tiny_config
    x = _inputs(c.vocab_size)
    out = random_model(x)
    mask = x["input_mask"].astype("float64")
    w = {k: v.numpy().astype("float64") for k, v in random_model.weight_dict().items()}
    for i in range(c.num_layers):
        scores = np.asarray(out["attention_scores"][i], "float64")
        logits = scores + (1.0 - mask)[:, None, None, :] * MASK_VALUE
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)
        assert probs[1, :, :, LENGTHS[1]:].max() < 1e-6
        # The scores really are Q K^T / sqrt(d_k) of this layer's input.
        h = np.asarray(out["hidden_states"][i], "float64")
        p = f"transformer_layer_{i}/"
        a = p + "self_attention_layer/"
        q = np.einsum("blh,hnd->blnd", h, w[a + "query/kernel"]) + w[a + "query/bias"]
        k = np.einsum("blh,hnd->blnd", h, w[a + "key/kernel"]) + w[a + "key/bias"]
        np.testing.assert_allclose(
            scores, np.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(c.head_size), atol=1e-4)
        v = np.einsum("blh,hnd->blnd", h, w[a + "value/kernel"]) + w[a + "value/bias"]
        ctx = np.einsum("bnqk,bknd->bqnd", probs, v)
        attn = np.einsum("bqnd,ndh->bqh", ctx, w[a + "attention_output/kernel"]) + \
            w[a + "attention_output/bias"]
        y = _layer_norm(h + attn, w[p + "self_attention_layer_norm/gamma"],
                        w[p + "self_attention_layer_norm/beta"], c.layer_norm_epsilon)
        ffn = _gelu(y @ w[p + "feedforward_intermediate_dense/kernel"]
                    + w[p + "feedforward_intermediate_dense/bias"], approximate=False)
        ffn = ffn @ w[p + "feedforward_output_dense/kernel"] + w[p + "feedforward_output_dense/bias"]  # noqa: E501
        y = _layer_norm(y + ffn, w[p + "feedforward_layer_norm/gamma"],
                        w[p + "feedforward_layer_norm/beta"], c.layer_norm_epsilon)
        np.testing.assert_allclose(y, out["hidden_states"][i + 1], atol=1e-4)


def _padding_invariance(model, vocab_size, atol):
    """Changing the ids at padded positions must not move real positions."""
    x = _inputs(vocab_size)
    y = dict(x)
    ids = x["input_word_ids"].copy()
    ids[1, LENGTHS[1]:] = np.arange(vocab_size - (L - LENGTHS[1]), vocab_size)
    y["input_word_ids"] = ids
    a, b = model(x), model(y)
    n = LENGTHS[1]
    for ha, hb in zip(a["hidden_states"][1:], b["hidden_states"][1:]):
        ha, hb = np.asarray(ha, "float32"), np.asarray(hb, "float32")
        assert np.isfinite(ha).all()
        np.testing.assert_allclose(ha[1, :n], hb[1, :n], atol=atol)
        assert np.abs(ha[1, n:] - hb[1, n:]).max() > 10 * atol  # padded rows did change
    return a


def test_padded_keys_ignored_float32(random_model, tiny_config):
    _padding_invariance(random_model, tiny_config.vocab_size, atol=1e-5)


def test_padded_keys_ignored_mixed_float16(tiny_config):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = BertModel(tiny_config)
        assert model.compute_dtype == "float16"
        _randomise(model, seed=5)
        out = _padding_invariance(model, tiny_config.vocab_size, atol=2e-2)
        x = _inputs(tiny_config.vocab_size)
        mask = x["input_mask"].astype("float32")
        for s in out["attention_scores"]:
            assert s.dtype == "float16"
            logits = np.asarray(s, "float32") + (1.0 - mask)[:, None, None, :] * np.float16(MASK_VALUE)  # noqa: E501
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            assert np.isfinite(probs).all()
            assert probs[1, :, :, LENGTHS[1]:].max() < 1e-4
        assert np.isfinite(np.float16(MASK_VALUE))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert keras.mixed_precision.global_policy().name == previous.name


def test_config_variants_build(tiny_config):
    """No token types and no pooler (DistilBERT-style) still satisfy the contract."""
    c = tiny_config.replace(type_vocab_size=0, use_pooler=False)
    model = BertModel(c, head="classifier", num_labels=3)
    assert not any(p.startswith(("segment_embedding", "pooled_dense")) for p in model.weight_dict())
    out = model(_inputs(c.vocab_size))
    np.testing.assert_array_equal(out["pooled_output"], out["sequence_output"][:, 0])
    assert tuple(out["logits"].shape) == (B, 3)
    with pytest.raises(ValueError, match="num_labels"):
        BertModel(c, head="classifier")
    assert isinstance(BertConfig.from_dict(c.to_dict()), BertConfig)


def test_query_key_value_start_with_different_kernels(tiny_config):
    """A shared unseeded initializer would give Q, K and V identical kernels."""
    from tinybert_tf.models import BertModel
    w = BertModel(tiny_config).weight_dict()
    q = w["transformer_layer_0/self_attention_layer/query/kernel"].numpy()
    k = w["transformer_layer_0/self_attention_layer/key/kernel"].numpy()
    v = w["transformer_layer_0/self_attention_layer/value/kernel"].numpy()
    assert not np.array_equal(q, k) and not np.array_equal(k, v)


@pytest.mark.parametrize("head", [None, "classifier", "regressor", "pre_classifier", "mlm",
                                  "token_classifier", "span"])
def test_construction_creates_every_variable_a_call_uses(head):
    """`BertModel.build` makes the variables from the config (no call at construction):
    a first call adds none, so weights load right after construction."""
    config = BertConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    model = BertModel(config, head=head,
                      num_labels=None if head in (None, "mlm", "span", "regressor") else 3)
    before = [v.path for v in model.weights]
    inputs = _inputs(40)
    if head == "mlm":
        inputs["masked_lm_positions"] = np.array([[1, 2], [0, 3]], "int32")
    model(inputs)
    assert [v.path for v in model.weights] == before
