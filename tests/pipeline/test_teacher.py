"""The embedded all-MiniLM-L6-v2 teacher on its real weights.

An independent NumPy BERT (written here from the Hugging Face layout, erf
GELU) reads the weights straight from the safetensors file; our encoder must
agree with it on every hidden state and every pre-softmax score map. The same
NumPy BERT then reads a student exported with `export_hf`, which checks that
the export is laid out as Hugging Face's BertModel expects.
"""
import os

import numpy as np
import pytest
from safetensors.numpy import load_file
from scipy.special import erf

from tinybert_tf.models.checkpoint import load_model, load_tokenizer
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.models.hf_io import export_hf

# Our encoder is compared with a float64 NumPy BERT (make test-isa).
pytestmark = pytest.mark.numerics


def numpy_bert(w, ids, mask, types, num_layers, num_heads, eps=1e-12, prefix=""):
    """Hugging Face BERT in float64 NumPy. w: HF key -> array ([out, in] Linear
    weights). Returns (hidden states: num_layers + 1 of [B, L, H], scores:
    num_layers of [B, heads, L, L] = QK^T/sqrt(d) before the mask)."""
    w = {k[len(prefix):]: np.asarray(v, np.float64) for k, v in w.items() if k.startswith(prefix)}

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def layer_norm(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    b, n = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][np.arange(n)][None]
         + w["embeddings.token_type_embeddings.weight"][types])
    x = layer_norm(x, "embeddings.LayerNorm")
    hidden, scores = [x], []
    additive = (1.0 - mask[:, None, None, :]) * -1e9
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        hsz = x.shape[-1]
        d = hsz // num_heads

        def heads(t):
            return t.reshape(b, n, num_heads, d).transpose(0, 2, 1, 3)

        q, k, v = (heads(linear(x, p + f"attention.self.{m}")) for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
        scores.append(s)
        e = np.exp(s + additive - (s + additive).max(-1, keepdims=True))
        probs = e / e.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, hsz)
        x = layer_norm(x + linear(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")  # noqa: E501
        inter = linear(x, p + "intermediate.dense")
        inter = 0.5 * inter * (1.0 + erf(inter / np.sqrt(2.0)))
        x = layer_norm(x + linear(inter, p + "output.dense"), p + "output.LayerNorm")
        hidden.append(x)
    return hidden, scores


@pytest.fixture(scope="module")
def teacher():
    return load_model("minilm-l6")


@pytest.fixture(scope="module")
def tokenizer(teacher):
    return load_tokenizer(teacher, max_seq_len=16)


def test_teacher_loads_with_its_config(teacher):
    c = teacher.bert_config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.intermediate_size) == (6, 384, 12, 1536)
    assert c.hidden_act == "gelu" and c.lower_case and c.use_pooler
    assert teacher.head_type is None and len(teacher.vocab) == 30522
    assert teacher.vocab[101] == "[CLS]" and teacher.vocab[102] == "[SEP]"


def test_teacher_matches_numpy_bert_on_real_weights(teacher, tokenizer, minilm_dir):
    batch = tokenizer(["The quick brown fox jumps over the lazy dog.", "A short one."],
                      ["Is it?", "Yes."], max_seq_len=12)
    ids, mask, types = (batch[k].numpy() for k in ("input_word_ids", "input_mask",
                                                   "input_type_ids"))
    assert mask[0].sum() == 12 and mask[1].sum() == 9  # a truncated pair and a padded one
    weights = load_file(os.path.join(minilm_dir, "model.safetensors"))
    ref_hidden, ref_scores = numpy_bert(weights, ids, mask, types, 6, 12)
    out = teacher(batch)
    assert len(out["hidden_states"]) == 7 and len(out["attention_scores"]) == 6
    real = mask.astype(bool)
    for ours, ref in zip(out["hidden_states"], ref_hidden):
        np.testing.assert_allclose(np.asarray(ours)[real], ref[real], atol=1e-4)
    for ours, ref in zip(out["attention_scores"], ref_scores):
        np.testing.assert_allclose(ours, ref, atol=1e-4)  # raw scores: every entry


def _mean_pooled(model, tok, a):
    batch = tok(a)
    out = model(batch)["sequence_output"].numpy()
    m = batch["input_mask"].numpy()[..., None].astype("float32")
    emb = (out * m).sum(1) / m.sum(1)
    return emb / np.linalg.norm(emb, axis=-1, keepdims=True)


def test_teacher_ranks_a_paraphrase_above_an_unrelated_sentence(teacher, tokenizer):
    e = _mean_pooled(teacher, tokenizer, [
        "A man is playing a guitar.",
        "Someone plays an acoustic guitar.",
        "The stock market fell sharply today.",
        "How do I bake bread at home?",
        "What is a simple recipe for homemade bread?",
    ])
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2
    assert e[3] @ e[4] > e[3] @ e[2] + 0.2
    assert e[3] @ e[4] > e[3] @ e[0]


def test_exported_student_runs_in_numpy_bert(tiny_config, tiny_vocab, tmp_path):
    """export_hf writes keys/layouts a Hugging Face BertModel reads: the
    NumPy BERT (HF layout, `bert.` prefix) reproduces our outputs."""
    rng = np.random.default_rng(0)
    model = BertModel(tiny_config, head="classifier", num_labels=2, vocab=tiny_vocab)
    for v in model.weights:
        v.assign(rng.normal(0, 0.2, v.shape).astype("float32")
                 + (1.0 if v.path.endswith("gamma") else 0.0))
    out_dir = export_hf(model, str(tmp_path / "hf"))
    weights = load_file(os.path.join(out_dir, "model.safetensors"))
    assert "classifier.weight" in weights and "bert.pooler.dense.weight" in weights
    ids = rng.integers(5, tiny_config.vocab_size, (2, 9)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    types = np.zeros_like(ids)
    hidden, scores = numpy_bert(weights, ids, mask, types, tiny_config.num_layers,
                                tiny_config.num_heads, prefix="bert.")
    out = model({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types})
    for ours, ref in zip(out["hidden_states"], hidden):
        np.testing.assert_allclose(np.asarray(ours)[mask == 1], ref[mask == 1], atol=1e-4)
    for ours, ref in zip(out["attention_scores"], scores):
        np.testing.assert_allclose(ours, ref, atol=1e-4)
    # The HF classifier: pooler tanh(W [CLS] + b), then classifier.
    pooled = np.tanh(hidden[-1][:, 0] @ weights["bert.pooler.dense.weight"].T
                     + weights["bert.pooler.dense.bias"])
    logits = pooled @ weights["classifier.weight"].T + weights["classifier.bias"]
    np.testing.assert_allclose(out["logits"], logits, atol=1e-4)


def test_readme_three_lines_encode_a_sentence():
    """The README's example: load the embedded teacher, tokenise, encode."""
    import tinybert_tf
    teacher = tinybert_tf.load_model("minilm-l6")
    tok = tinybert_tf.load_tokenizer(teacher, max_seq_len=32)
    out = teacher(tok(["TinyBERT distils BERT."]))
    assert out["sequence_output"].shape == (1, 32, 384)
    assert len(out["hidden_states"]) == 7 and len(out["attention_scores"]) == 6
