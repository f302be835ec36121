"""Hugging Face DistilBERT directories (`model_type: distilbert`): the key layout.

`hf_io` reads a directory by its `model_type`; this module holds what differs
for DistilBERT (transformers' `modeling_distilbert.py`), so that reader keeps one
code path. A leaf: it names keys, shapes and conversion kinds ("copy", "dense",
"qkv", "qkv_bias", "attn_out", converted by `hf_io`), and imports no reader.

DistilBERT against our encoder:
  * config.json: dim, n_layers, n_heads, hidden_dim, activation, dropout,
    attention_dropout, max_position_embeddings, sinusoidal_pos_embds
    (`BertConfig.from_hf_dict`); no token types and no pooler
    (type_vocab_size=0, use_pooler=False); every LayerNorm has eps 1e-12 (fixed
    in the modelling code, not in the config).
  * keys, with or without the `distilbert.` prefix:
      embeddings.{word,position}_embeddings, embeddings.LayerNorm
      transformer.layer.N.attention.{q,k,v,out}_lin   (nn.Linear [out, in])
      transformer.layer.N.sa_layer_norm, .ffn.lin1, .ffn.lin2, .output_layer_norm
  * heads: `pre_classifier` + `classifier` (DistilBertForSequenceClassification:
    [CLS] -> dense, ReLU, dropout, dense; our pre_classifier / pre_regressor
    head), `classifier` alone on the sequence (...ForTokenClassification),
    `qa_outputs` (...ForQuestionAnswering), `vocab_transform` +
    `vocab_layer_norm` + `vocab_projector` (...ForMaskedLM; the projector's
    weight is tied to the word embeddings, only its bias is a weight of ours).
  * sinusoidal_pos_embds=true: the table is stored in the checkpoint and loads as
    is; DistilBERT never trains it, we do when the model is a student
    (docs/models.md).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from tinybert_tf.config import BertConfig

MODEL_TYPE = "distilbert"
PREFIX = "distilbert."
# Buffers and tied copies: no weights of ours.
IGNORED = re.compile(r"^(embeddings\.position_ids|vocab_projector\.weight)$")
TIED_DECODER = "vocab_projector.weight"

ARCHITECTURE_HEADS = {"DistilBertForSequenceClassification": "pre_classifier",
                      "DistilBertForTokenClassification": "token_classifier",
                      "DistilBertForQuestionAnswering": "span",
                      "DistilBertForMaskedLM": "mlm"}


def normalise_key(key: str) -> str:
    return key[len(PREFIX):] if key.startswith(PREFIX) else key


def detect_head(data: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                config_path: str = "") -> tuple[Optional[str], Optional[int]]:
    """(our head, its width) from the weight keys (and problem_type for a score)."""
    if "qa_outputs.weight" in shapes:
        return "span", 2
    if "pre_classifier.weight" in shapes and "classifier.weight" in shapes:
        n = int(shapes["classifier.weight"][0])
        regression = data.get("problem_type") == "regression" or n == 1
        return ("pre_regressor" if regression else "pre_classifier"), n
    if "classifier.weight" in shapes:
        return "token_classifier", int(shapes["classifier.weight"][0])
    if any(k.startswith(("vocab_transform.", "vocab_layer_norm.", "vocab_projector."))
           for k in shapes):
        return "mlm", None
    return None, None


def _linear(ours: str, hf: str, out: int, inp: int) -> dict[str, tuple[str, str, tuple]]:
    return {f"{ours}/kernel": (f"{hf}.weight", "dense", (out, inp)),
            f"{ours}/bias": (f"{hf}.bias", "copy", (out,))}


def _norm(ours: str, hf: str, width: int) -> dict[str, tuple[str, str, tuple]]:
    return {f"{ours}/gamma": (f"{hf}.weight", "copy", (width,)),
            f"{ours}/beta": (f"{hf}.bias", "copy", (width,))}


def name_map(config: BertConfig, head: Optional[str], num_labels: Optional[int]
             ) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """our weight path -> (DistilBERT key without `distilbert.`, kind, HF shape)."""
    H, inter, V = config.hidden_size, config.intermediate_size, config.vocab_size
    m: dict[str, tuple[str, str, tuple[int, ...]]] = {
        "token_embedding/embeddings": ("embeddings.word_embeddings.weight", "copy", (V, H)),
        "position_embedding/embeddings": ("embeddings.position_embeddings.weight", "copy",
                                          (config.max_position_embeddings, H)),
        **_norm("embeddings_layer_norm", "embeddings.LayerNorm", H),
    }
    for i in range(config.num_layers):
        ours, hf = f"transformer_layer_{i}/", f"transformer.layer.{i}."
        for name, lin in (("query", "q_lin"), ("key", "k_lin"), ("value", "v_lin")):
            m[f"{ours}self_attention_layer/{name}/kernel"] = (
                f"{hf}attention.{lin}.weight", "qkv", (H, H))
            m[f"{ours}self_attention_layer/{name}/bias"] = (
                f"{hf}attention.{lin}.bias", "qkv_bias", (H,))
        m[f"{ours}self_attention_layer/attention_output/kernel"] = (
            f"{hf}attention.out_lin.weight", "attn_out", (H, H))
        m[f"{ours}self_attention_layer/attention_output/bias"] = (
            f"{hf}attention.out_lin.bias", "copy", (H,))
        m.update(_norm(f"{ours}self_attention_layer_norm", f"{hf}sa_layer_norm", H))
        m.update(_linear(f"{ours}feedforward_intermediate_dense", f"{hf}ffn.lin1", inter, H))
        m.update(_linear(f"{ours}feedforward_output_dense", f"{hf}ffn.lin2", H, inter))
        m.update(_norm(f"{ours}feedforward_layer_norm", f"{hf}output_layer_norm", H))
    n = int(num_labels or 1)
    if head in ("pre_classifier", "pre_regressor"):
        m.update(_linear("pre_classifier_head/pre_classifier", "pre_classifier", H, H))
        m.update(_linear("pre_classifier_head/classifier", "classifier", n, H))
    elif head == "token_classifier":
        m.update(_linear("token_classifier_head/classifier", "classifier", n, H))
    elif head == "span":
        m.update(_linear("span_head/qa_outputs", "qa_outputs", 2, H))
    elif head == "mlm":
        m.update(_linear("mlm_head/mlm_dense", "vocab_transform", H, H))
        m.update(_norm("mlm_head/mlm_layer_norm", "vocab_layer_norm", H))
        m["mlm_head/output_bias"] = ("vocab_projector.bias", "copy", (V,))
    return m
