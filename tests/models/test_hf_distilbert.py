"""Hugging Face DistilBERT directories (model_type distilbert) load as teachers and
students: a directory written the way transformers writes one (config.json keys,
`distilbert.`-prefixed safetensors keys, a tied MLM projector) gives the outputs of
an independent NumPy forward pass of DistilBERT (transformers' modeling_distilbert.py)."""
import json
import math
import os

import numpy as np
import pytest
from safetensors.numpy import save_file
from scipy.special import erf

from tinybert_tf.models.checkpoint import CheckpointError, inspect_model, load_model

H, LAYERS, HEADS, FFN, POS = 16, 2, 4, 32, 32


def _params(vocab_size, rng, head):
    """transformers' DistilBERT state dict (nn.Linear weights [out, in])."""
    p = {"embeddings.word_embeddings.weight": rng.normal(0, 0.5, (vocab_size, H)),
         "embeddings.position_embeddings.weight": rng.normal(0, 0.5, (POS, H)),
         "embeddings.LayerNorm.weight": 1 + rng.normal(0, 0.1, H),
         "embeddings.LayerNorm.bias": rng.normal(0, 0.1, H)}
    for i in range(LAYERS):
        pre = f"transformer.layer.{i}."
        for lin, (o, n) in {"attention.q_lin": (H, H), "attention.k_lin": (H, H),
                            "attention.v_lin": (H, H), "attention.out_lin": (H, H),
                            "ffn.lin1": (FFN, H), "ffn.lin2": (H, FFN)}.items():
            p[pre + lin + ".weight"] = rng.normal(0, 0.3, (o, n))
            p[pre + lin + ".bias"] = rng.normal(0, 0.1, o)
        for norm in ("sa_layer_norm", "output_layer_norm"):
            p[pre + norm + ".weight"] = 1 + rng.normal(0, 0.1, H)
            p[pre + norm + ".bias"] = rng.normal(0, 0.1, H)
    out = {"distilbert." + k if head else k: v for k, v in p.items()}
    if head == "classifier":
        out.update({"pre_classifier.weight": rng.normal(0, 0.3, (H, H)),
                    "pre_classifier.bias": rng.normal(0, 0.1, H),
                    "classifier.weight": rng.normal(0, 0.3, (3, H)),
                    "classifier.bias": rng.normal(0, 0.1, 3)})
    if head == "mlm":
        out.update({"vocab_transform.weight": rng.normal(0, 0.3, (H, H)),
                    "vocab_transform.bias": rng.normal(0, 0.1, H),
                    "vocab_layer_norm.weight": 1 + rng.normal(0, 0.1, H),
                    "vocab_layer_norm.bias": rng.normal(0, 0.1, H),
                    "vocab_projector.bias": rng.normal(0, 0.1, vocab_size)})
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def write_distilbert(directory, vocab, head=None, seed=0, sinusoidal=False, tie=True):
    """A directory as `DistilBert*.save_pretrained(dir, safe_serialization=True)` writes it."""
    os.makedirs(directory, exist_ok=True)
    params = _params(len(vocab), np.random.default_rng(seed), head)
    if sinusoidal:  # transformers fills the table with sines and saves it
        pos = np.arange(POS)[:, None] / np.power(10000, 2 * (np.arange(H) // 2) / H)[None, :]
        table = np.where(np.arange(H) % 2 == 0, np.sin(pos), np.cos(pos)).astype(np.float32)
        key = ("distilbert." if head else "") + "embeddings.position_embeddings.weight"
        params[key] = table
    if head == "mlm" and tie:
        params["vocab_projector.weight"] = params["distilbert.embeddings.word_embeddings.weight"]
    arch = {None: "DistilBertModel", "mlm": "DistilBertForMaskedLM",
            "classifier": "DistilBertForSequenceClassification"}[head]
    config = {"_name_or_path": "distilbert-base-uncased", "activation": "gelu",
              "architectures": [arch], "attention_dropout": 0.1, "dim": H, "dropout": 0.1,
              "hidden_dim": FFN, "initializer_range": 0.02, "max_position_embeddings": POS,
              "model_type": "distilbert", "n_heads": HEADS, "n_layers": LAYERS,
              "pad_token_id": 0, "qa_dropout": 0.1, "seq_classif_dropout": 0.2,
              "sinusoidal_pos_embds": sinusoidal, "tie_weights_": True,
              "torch_dtype": "float32", "transformers_version": "4.44.0",
              "vocab_size": len(vocab)}
    if head == "classifier":
        config["id2label"] = {"0": "contradiction", "1": "entailment", "2": "neutral"}
        config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    # Tied tensors share storage in PyTorch; save_pretrained writes the first name only.
    save_file({k: v for k, v in params.items()
               if not (k == "vocab_projector.weight" and not tie)},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "DistilBertTokenizer"}, f)
    return {k.removeprefix("distilbert."): v.astype(np.float64) for k, v in params.items()}


def _layer_norm(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def numpy_distilbert(p, ids, mask):
    """DistilBertModel.forward in NumPy (eval mode): [B, L] -> hidden states per layer."""
    lin = lambda x, name: x @ p[name + ".weight"].T + p[name + ".bias"]  # noqa: E731
    x = p["embeddings.word_embeddings.weight"][ids] + \
        p["embeddings.position_embeddings.weight"][np.arange(ids.shape[1])][None]
    x = _layer_norm(x, p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"])
    states = [x]
    B, L = ids.shape
    d = H // HEADS
    for i in range(LAYERS):
        pre = f"transformer.layer.{i}."
        split = lambda t: t.reshape(B, L, HEADS, d).transpose(0, 2, 1, 3)  # noqa: E731
        q = split(lin(x, pre + "attention.q_lin")) / math.sqrt(d)
        k, v = split(lin(x, pre + "attention.k_lin")), split(lin(x, pre + "attention.v_lin"))
        scores = q @ k.transpose(0, 1, 3, 2)
        scores = np.where(mask[:, None, None, :] == 0, np.finfo(np.float64).min, scores)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        ctx = (w @ v).transpose(0, 2, 1, 3).reshape(B, L, H)
        sa = _layer_norm(lin(ctx, pre + "attention.out_lin") + x,
                         p[pre + "sa_layer_norm.weight"], p[pre + "sa_layer_norm.bias"])
        ffn = lin(_gelu(lin(sa, pre + "ffn.lin1")), pre + "ffn.lin2")
        x = _layer_norm(ffn + sa, p[pre + "output_layer_norm.weight"],
                        p[pre + "output_layer_norm.bias"])
        states.append(x)
    return states


def _inputs(tiny_vocab, B=3, L=9, seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(20, len(tiny_vocab), size=(B, L)).astype(np.int32)
    mask = np.ones((B, L), np.int32)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("sinusoidal", [False, True])
def test_distilbert_encoder_matches_a_numpy_forward_pass(tiny_vocab, tmp_path, sinusoidal):
    d = str(tmp_path / "distilbert")
    params = write_distilbert(d, tiny_vocab, sinusoidal=sinusoidal)
    model = load_model(d)
    c = model.bert_config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size) == (H, LAYERS,
                                                                               HEADS, FFN)
    assert c.type_vocab_size == 0 and not c.use_pooler and c.layer_norm_epsilon == 1e-12
    assert model.head_type is None and model.vocab == tiny_vocab and c.lower_case
    ids, mask = _inputs(tiny_vocab)
    out = model({"input_word_ids": ids, "input_mask": mask,
                 "input_type_ids": np.zeros_like(ids)}, training=False)
    expect = numpy_distilbert(params, ids.astype(np.int64), mask)
    for ours, theirs in zip(out["hidden_states"], expect):
        real = mask.astype(bool)  # padded rows differ only in how the mask is written
        np.testing.assert_allclose(np.asarray(ours)[real], theirs[real], atol=2e-5, rtol=1e-4)
    info = inspect_model(d)
    assert info.format == "hf" and info.head is None and info.config.num_layers == LAYERS


def test_distilbert_mlm_head_with_its_tied_projector(tiny_vocab, tmp_path):
    d = str(tmp_path / "distilbert_mlm")
    params = write_distilbert(d, tiny_vocab, head="mlm")
    model = load_model(d)
    assert model.head_type == "mlm" and inspect_model(d).head == "mlm"
    ids, mask = _inputs(tiny_vocab)
    logits = np.asarray(model({"input_word_ids": ids, "input_mask": mask,
                               "input_type_ids": np.zeros_like(ids)})["logits"])
    last = numpy_distilbert(params, ids.astype(np.int64), mask)[-1]
    t = _gelu(last @ params["vocab_transform.weight"].T + params["vocab_transform.bias"])
    t = _layer_norm(t, params["vocab_layer_norm.weight"], params["vocab_layer_norm.bias"])
    expect = t @ params["embeddings.word_embeddings.weight"].T + params["vocab_projector.bias"]
    real = mask.astype(bool)
    np.testing.assert_allclose(logits[real], expect[real], atol=1e-4, rtol=1e-4)


def test_distilbert_sequence_classifier_loads_with_its_pre_classifier_head(tiny_vocab,
                                                                          tmp_path):
    d = str(tmp_path / "distilbert_mnli")
    params = write_distilbert(d, tiny_vocab, head="classifier")
    model = load_model(d)
    assert model.head_type == "pre_classifier"
    assert model.label_names == ["contradiction", "entailment", "neutral"]
    info = inspect_model(d)
    assert (info.head, info.num_labels) == ("pre_classifier", 3)
    ids, mask = _inputs(tiny_vocab)
    logits = np.asarray(model({"input_word_ids": ids, "input_mask": mask,
                               "input_type_ids": np.zeros_like(ids)}, training=False)["logits"])
    cls = numpy_distilbert(params, ids.astype(np.int64), mask)[-1][:, 0]
    pre = np.maximum(cls @ params["pre_classifier.weight"].T + params["pre_classifier.bias"], 0)
    expect = pre @ params["classifier.weight"].T + params["classifier.bias"]
    np.testing.assert_allclose(logits, expect, atol=1e-4, rtol=1e-4)
    # As a student for a fresh task: the encoder loads, the stored head is dropped.
    fresh = load_model(d, head="pre_classifier", num_labels=3)
    assert fresh.head_type == "pre_classifier"


def test_an_untied_distilbert_projector_is_refused(tiny_vocab, tmp_path):
    d = str(tmp_path / "untied")
    write_distilbert(d, tiny_vocab, head="mlm")
    from safetensors.numpy import load_file
    weights = load_file(os.path.join(d, "model.safetensors"))
    weights["vocab_projector.weight"] = weights["vocab_projector.weight"] + 1.0
    save_file(weights, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="vocab_projector.weight"):
        load_model(d)


def test_other_model_types_are_refused_naming_what_loads(tiny_vocab, tmp_path):
    d = str(tmp_path / "roberta")
    write_distilbert(d, tiny_vocab)
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    config["model_type"] = "roberta"
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(CheckpointError, match="'bert' and 'distilbert'"):
        load_model(d)
