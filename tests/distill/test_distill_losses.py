"""Losses vs independent NumPy formulas (with padding), and the layer mapping."""
import numpy as np
import pytest

from tinybert_tf.distill import losses
from tinybert_tf.distill.mapping import layer_map

RNG = np.random.default_rng(0)


def _mask(b=3, l=6):
    mask = np.ones((b, l), np.int32)
    mask[0, 4:] = 0
    mask[1, 2:] = 0
    return mask


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _log_softmax(z):
    return np.log(_softmax(z))


# --- attention -------------------------------------------------------------------
def np_attention(s, t, mask, mask_queries=False):
    if s.shape[1] != t.shape[1]:
        s, t = s.mean(1, keepdims=True), t.mean(1, keepdims=True)
    b, h, l, _ = s.shape
    total, count = 0.0, 0
    for i in range(b):
        for k in range(h):
            for q in range(l):
                if mask_queries and not mask[i, q]:
                    continue
                for j in range(l):
                    if mask_queries and not mask[i, j]:
                        continue
                    a, c = s[i, k, q, j], t[i, k, q, j]
                    if not mask[i, j]:
                        a = c = 0.0
                    total += (a - c) ** 2
                    count += 1
    return total / count


@pytest.mark.parametrize("heads", [(4, 4), (2, 4)])
@pytest.mark.parametrize("mask_queries", [False, True])
def test_attention_loss_matches_numpy(heads, mask_queries):
    mask = _mask()
    s = RNG.normal(size=(3, heads[0], 6, 6)).astype(np.float32)
    t = RNG.normal(size=(3, heads[1], 6, 6)).astype(np.float32)
    got = float(losses.attention_loss(s, t, mask, mask_queries=mask_queries))
    np.testing.assert_allclose(got, np_attention(s, t, mask, mask_queries), rtol=1e-5)
    # sum / count == mean, with the count the Distiller uses.
    h = losses.attention_heads(heads[0], heads[1])
    ratio = (float(losses.attention_loss(s, t, mask, "sum", mask_queries))
             / float(losses.attention_count(mask, h, mask_queries)))
    np.testing.assert_allclose(ratio, got, rtol=1e-5)


def test_attention_loss_ignores_padded_keys_only():
    mask = _mask()
    s = RNG.normal(size=(3, 2, 6, 6)).astype(np.float32)
    t = s.copy()
    t[0, :, :, 5] += 100.0          # padded key of example 0: no effect
    assert float(losses.attention_loss(s, t, mask)) == 0.0
    t[0, :, 5, 0] += 1.0            # padded QUERY row, real key: counts (reference)
    assert float(losses.attention_loss(s, t, mask)) > 0.0
    assert float(losses.attention_loss(s, t, mask, mask_queries=True)) == 0.0


# --- hidden ----------------------------------------------------------------------
@pytest.mark.parametrize("use_mask", [False, True])
def test_hidden_loss_matches_numpy(use_mask):
    mask = _mask()
    s = RNG.normal(size=(3, 6, 5)).astype(np.float32)
    t = RNG.normal(size=(3, 6, 5)).astype(np.float32)
    if use_mask:
        rows = mask.astype(bool)
        want = np.mean((s[rows] - t[rows]) ** 2)
        got = losses.hidden_loss(s, t, mask)
        count = losses.hidden_count(mask, 5, real_tokens_only=True)
    else:
        want = np.mean((s - t) ** 2)
        got = losses.hidden_loss(s, t)
        count = losses.hidden_count(mask, 5)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    summed = losses.hidden_loss(s, t, mask if use_mask else None, reduction="sum")
    np.testing.assert_allclose(float(summed) / float(count), want, rtol=1e-5)


# --- prediction --------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_soft_cross_entropy_matches_numpy(temperature):
    s = RNG.normal(size=(4, 3)).astype(np.float32)
    t = RNG.normal(size=(4, 3)).astype(np.float32)
    want = np.mean(-np.sum(_softmax(t / temperature) * _log_softmax(s / temperature), -1))
    got = float(losses.soft_cross_entropy(s, t, temperature))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_soft_cross_entropy_rejects_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        losses.soft_cross_entropy(np.zeros((1, 2)), np.zeros((1, 2)), 0.0)


def test_prediction_mse_matches_numpy():
    s = RNG.normal(size=(5, 1)).astype(np.float32)
    t = RNG.normal(size=(5, 1)).astype(np.float32)
    np.testing.assert_allclose(float(losses.prediction_mse(s, t)), np.mean((s - t) ** 2),
                               rtol=1e-5)


# --- DistilBERT ----------------------------------------------------------------------
def test_distilbert_losses_match_numpy():
    b, p, v, l, d = 2, 3, 7, 6, 4
    s = RNG.normal(size=(b, p, v)).astype(np.float32)
    t = RNG.normal(size=(b, p, v)).astype(np.float32)
    ids = RNG.integers(0, v, (b, p))
    w = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    temp = 2.0
    ce = -np.sum(_softmax(t / temp) * _log_softmax(s / temp), -1)
    np.testing.assert_allclose(float(losses.distilbert_ce(s, t, w, temp)),
                               temp ** 2 * np.sum(ce * w) / w.sum(), rtol=1e-5)
    nll = -np.take_along_axis(_log_softmax(s), ids[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(losses.mlm_loss(s, ids, w)), np.sum(nll * w) / w.sum(),
                               rtol=1e-5)
    mask = _mask(b, l)
    hs = RNG.normal(size=(b, l, d)).astype(np.float32)
    ht = RNG.normal(size=(b, l, d)).astype(np.float32)
    cos = np.sum(hs * ht, -1) / np.linalg.norm(hs, axis=-1) / np.linalg.norm(ht, axis=-1)
    want = np.sum((1 - cos) * mask) / mask.sum()
    np.testing.assert_allclose(float(losses.cosine_loss(hs, ht, mask)), want, rtol=1e-5)


def test_losses_are_float32_for_half_inputs():
    s = RNG.normal(size=(2, 3, 4)).astype(np.float16)
    out = losses.hidden_loss(s, s.astype(np.float32) + 1)
    assert out.dtype.name == "float32"
    np.testing.assert_allclose(float(out), 1.0, rtol=1e-3)


# --- mapping ---------------------------------------------------------------------------
def test_layer_map_strategies():
    assert layer_map("uniform", 4, 12) == [0, 3, 6, 9, 12]
    assert layer_map("top", 4, 12) == [0, 9, 10, 11, 12]
    assert layer_map("bottom", 4, 12) == [0, 1, 2, 3, 4]
    assert layer_map("2,4,6,8", 4, 12) == [0, 2, 4, 6, 8]
    assert layer_map([12, 1], 2, 12) == [0, 12, 1]
    # N not divisible by M: nearest layer, halves up; increasing and ends at N.
    assert layer_map("uniform", 4, 6) == [0, 2, 3, 5, 6]
    assert layer_map("uniform", 3, 4) == [0, 1, 3, 4]
    assert layer_map("UNIFORM", 2, 2) == [0, 1, 2]


@pytest.mark.parametrize("strategy,m,n,match", [
    ("sideways", 4, 12, "--layer_mapping"),
    ("1,2,3", 4, 12, "expected 4 teacher layers"),
    ("0,1,2,3", 4, 12, "out of range"),
    ([1, 2, 13], 3, 12, "out of range"),
    ("uniform", 6, 4, "more layers"),
    ([1.5, 2], 2, 4, "integers"),
])
def test_layer_map_errors(strategy, m, n, match):
    with pytest.raises(ValueError, match=match) as err:
        layer_map(strategy, m, n)
    assert "--layer_mapping" in str(err.value)
