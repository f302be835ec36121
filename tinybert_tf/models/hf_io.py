"""Hugging Face BERT directories: read (teachers) and write (exported students).

A directory holds `config.json` (HF `BertConfig`), the tokenizer (`vocab.txt`,
or only `tokenizer.json` as transformers >= 5 saves it) and
`model.safetensors` or sharded `model.safetensors.index.json`. Keys may carry
the `bert.` prefix (`BertFor*` models) or not (`BertModel`, e.g. the embedded
all-MiniLM-L6-v2). Layout differences to our Keras weights:
  * `nn.Linear.weight` is [out, in]; Keras kernels are [in, out] -> transpose;
  * query/key/value kernels become [H, heads, d_k] and biases [heads, d_k];
  * the attention output kernel becomes [heads, d_k, H];
  * LayerNorm weight/bias (or old gamma/beta) -> gamma/beta.
`classifier.*` is a classifier (or regressor, 1 output) head and
`cls.predictions.*` the MLM head (transform.dense, transform.LayerNorm, bias;
the decoder is tied to the word embeddings). PyTorch `.bin` files are not
read: PyTorch is not a dependency.

Readers dispatch on config.json's `model_type` (`_LAYOUTS`): `bert` (this
module) and `distilbert` (keys, heads and shapes in `hf_distilbert`); the
conversion of each tensor is shared. `export_hf` writes BERT.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from tinybert_tf import files
from tinybert_tf.config import BertConfig, ConfigError
from tinybert_tf.files import write_json
from tinybert_tf.models import hf_distilbert
from tinybert_tf.models.model_dir import (
    CONFIG_FILE,
    VOCAB_FILE,
    CheckpointError,
    CheckpointSpec,
    atomic_directory,
    check_float,
    model_vocab,
    read_model_json,
    read_model_vocab,
    read_safetensors,
    safetensors_shapes,
)
from tinybert_tf.tokenizer import SPECIAL_TOKENS, VocabError, check_vocab, write_vocab

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
_UNREADABLE = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
               "flax_model.msgpack")
# Keys that carry no weights of ours: buffers, the NSP head, tied decoder copies, and the
# released General TinyBERTs' student-to-teacher projections (`fit_dense`, v2 `fit_denses.i`:
# one nn.Linear with bias, not our separate W_e / W_h; task distillation starts new ones).
_IGNORED = re.compile(r"^(embeddings\.position_ids|embeddings\.token_type_ids|"
                      r"cls\.seq_relationship\..*|cls\.predictions\.decoder\.(weight|bias)|"
                      r"fit_denses?\..*)$")


class _HFHead:
    """How one of our heads is stored by Hugging Face: the model class written
    to config.json and our weight path -> (HF key, kind, HF shape)."""

    def __init__(self, architecture: str, layer: str, keys):
        self.architecture = architecture
        self.layer = layer  # the HF module of the head ("classifier", "qa_outputs", ...)
        self._keys = keys

    def keys(self, config: BertConfig, n: int) -> dict[str, tuple[str, str, tuple[int, ...]]]:
        return self._keys(config, n)


def _dense_head(ours: str, hf: str):
    def keys(config: BertConfig, n: int):
        H = config.hidden_size
        return {f"{ours}/kernel": (f"{hf}.weight", "dense", (n, H)),
                f"{ours}/bias": (f"{hf}.bias", "copy", (n,))}
    return keys


def _mlm_keys(config: BertConfig, n: int):
    H, p = config.hidden_size, "cls.predictions."
    return {"mlm_head/mlm_dense/kernel": (p + "transform.dense.weight", "dense", (H, H)),
            "mlm_head/mlm_dense/bias": (p + "transform.dense.bias", "copy", (H,)),
            "mlm_head/mlm_layer_norm/gamma": (p + "transform.LayerNorm.weight", "copy", (H,)),
            "mlm_head/mlm_layer_norm/beta": (p + "transform.LayerNorm.bias", "copy", (H,)),
            "mlm_head/output_bias": (p + "bias", "copy", (config.vocab_size,))}


# Our head name -> its Hugging Face layout (BertFor* classes).
_HF_HEADS = {
    "classifier": _HFHead("BertForSequenceClassification", "classifier",
                          _dense_head("classifier_head/classifier", "classifier")),
    "regressor": _HFHead("BertForSequenceClassification", "classifier",
                         _dense_head("classifier_head/classifier", "classifier")),
    "token_classifier": _HFHead("BertForTokenClassification", "classifier",
                                _dense_head("token_classifier_head/classifier", "classifier")),
    "span": _HFHead("BertForQuestionAnswering", "qa_outputs",
                    _dense_head("span_head/qa_outputs", "qa_outputs")),
    "mlm": _HFHead("BertForMaskedLM", "cls.predictions", _mlm_keys),
}
# Our head name -> its layer (weight-path prefix), for keys stored without `bert.`.
_HEAD_LAYERS = {"classifier": "classifier_head", "regressor": "classifier_head",
                "token_classifier": "token_classifier_head", "span": "span_head",
                "mlm": "mlm_head"}
_ARCHITECTURE_HEADS = {"BertForSequenceClassification": "classifier",
                       "BertForTokenClassification": "token_classifier",
                       "BertForQuestionAnswering": "span", "BertForMaskedLM": "mlm",
                       "BertForPreTraining": "mlm"}


def _detect_head(data: dict[str, Any], shapes: dict[str, tuple[int, ...]], config_path: str
                 ) -> tuple[Optional[str], Optional[int]]:
    """(our head, its width) from config.json's `architectures` and the weight keys."""
    archs = data.get("architectures") or []
    named = _ARCHITECTURE_HEADS.get(archs[0]) if archs else None
    if "qa_outputs.weight" in shapes:
        return "span", 2
    if "classifier.weight" in shapes:
        n = int(shapes["classifier.weight"][0])
        if named == "token_classifier":
            return "token_classifier", n
        regression = data.get("problem_type") == "regression" or n == 1
        if regression and n != 1:
            raise CheckpointError(f"{config_path}: problem_type 'regression' but the classifier "
                                  f"has {n} outputs.")
        return ("regressor" if regression else "classifier"), n
    if any(k.startswith("cls.predictions.") for k in shapes):
        return "mlm", None
    return None, None


def _label_names(data: dict[str, Any], head: Optional[str], n: Optional[int]
                 ) -> Optional[list[str]]:
    """id2label names in id order, or None when absent or generic (LABEL_0, ...)."""
    id2label = data.get("id2label")
    named = ("classifier", "token_classifier", "pre_classifier")
    if head not in named or not isinstance(id2label, dict) or len(id2label) != n:
        return None
    names = [str(id2label.get(str(i), id2label.get(i, ""))) for i in range(n)]
    if names == [f"LABEL_{i}" for i in range(n)] or not all(names):
        return None
    return names


def _name_map(config: BertConfig, head: Optional[str], num_labels: Optional[int]
              ) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """our weight path -> (HF key without `bert.`, kind, HF shape)."""
    H, inter = config.hidden_size, config.intermediate_size
    m: dict[str, tuple[str, str, tuple[int, ...]]] = {
        "token_embedding/embeddings": ("embeddings.word_embeddings.weight", "copy",
                                       (config.vocab_size, H)),
        "position_embedding/embeddings": ("embeddings.position_embeddings.weight", "copy",
                                          (config.max_position_embeddings, H)),
        "embeddings_layer_norm/gamma": ("embeddings.LayerNorm.weight", "copy", (H,)),
        "embeddings_layer_norm/beta": ("embeddings.LayerNorm.bias", "copy", (H,)),
    }
    if config.type_vocab_size > 0:
        m["segment_embedding/embeddings"] = ("embeddings.token_type_embeddings.weight", "copy",
                                             (config.type_vocab_size, H))
    for i in range(config.num_layers):
        ours, hf = f"transformer_layer_{i}/", f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            m[f"{ours}self_attention_layer/{name}/kernel"] = (
                f"{hf}attention.self.{name}.weight", "qkv", (H, H))
            m[f"{ours}self_attention_layer/{name}/bias"] = (
                f"{hf}attention.self.{name}.bias", "qkv_bias", (H,))
        m[f"{ours}self_attention_layer/attention_output/kernel"] = (
            f"{hf}attention.output.dense.weight", "attn_out", (H, H))
        m[f"{ours}self_attention_layer/attention_output/bias"] = (
            f"{hf}attention.output.dense.bias", "copy", (H,))
        m[f"{ours}self_attention_layer_norm/gamma"] = (
            f"{hf}attention.output.LayerNorm.weight", "copy", (H,))
        m[f"{ours}self_attention_layer_norm/beta"] = (
            f"{hf}attention.output.LayerNorm.bias", "copy", (H,))
        m[f"{ours}feedforward_intermediate_dense/kernel"] = (
            f"{hf}intermediate.dense.weight", "dense", (inter, H))
        m[f"{ours}feedforward_intermediate_dense/bias"] = (
            f"{hf}intermediate.dense.bias", "copy", (inter,))
        m[f"{ours}feedforward_output_dense/kernel"] = (f"{hf}output.dense.weight", "dense",
                                                       (H, inter))
        m[f"{ours}feedforward_output_dense/bias"] = (f"{hf}output.dense.bias", "copy", (H,))
        m[f"{ours}feedforward_layer_norm/gamma"] = (f"{hf}output.LayerNorm.weight", "copy", (H,))
        m[f"{ours}feedforward_layer_norm/beta"] = (f"{hf}output.LayerNorm.bias", "copy", (H,))
    if config.use_pooler:
        m["pooled_dense/kernel"] = ("pooler.dense.weight", "dense", (H, H))
        m["pooled_dense/bias"] = ("pooler.dense.bias", "copy", (H,))
    if head is not None:
        m.update(_HF_HEADS[head].keys(config, int(num_labels or 1)))
    return m


def _to_ours(kind: str, w: np.ndarray, config: BertConfig) -> np.ndarray:
    H, h, d = config.hidden_size, config.num_heads, config.head_size
    if kind == "dense":
        return w.T
    if kind == "qkv":  # [h*d, H] -> [H, h, d]
        return w.T.reshape(H, h, d)
    if kind == "qkv_bias":
        return w.reshape(h, d)
    if kind == "attn_out":  # [H_out, h*d] -> [h, d, H_out]
        return w.T.reshape(h, d, H)
    return w


def _to_hf(kind: str, w: np.ndarray) -> np.ndarray:
    if kind == "dense":
        return w.T
    if kind == "qkv":  # [H, h, d] -> [h*d, H]
        return w.reshape(w.shape[0], -1).T
    if kind == "qkv_bias":
        return w.reshape(-1)
    if kind == "attn_out":  # [h, d, H] -> [H, h*d]
        return w.reshape(-1, w.shape[-1]).T
    return w


def _normalise_key(key: str) -> str:
    if key.startswith("bert."):
        key = key[len("bert."):]
    if key.endswith(".gamma"):
        key = key[: -len(".gamma")] + ".weight"
    elif key.endswith(".beta"):
        key = key[: -len(".beta")] + ".bias"
    return key


def read_lower_case(path: str) -> bool:
    """Lower-casing of an HF tokenizer: tokenizer.json's normalizer (what the
    tokenizer runs), else tokenizer_config.json's do_lower_case, else whether the
    model name says "cased" (default: uncased, like BERT)."""
    tok_json = os.path.join(path, TOKENIZER_JSON)
    if files.isfile(tok_json):
        return _normalizer_lower_case(read_model_json(tok_json).get("normalizer"), tok_json)
    tok_cfg = os.path.join(path, "tokenizer_config.json")
    if files.isfile(tok_cfg):
        data = read_model_json(tok_cfg)
        if "do_lower_case" in data:
            return bool(data["do_lower_case"])
    name = str(read_model_json(os.path.join(path, CONFIG_FILE)).get("_name_or_path", "")).lower()
    return not ("cased" in name and "uncased" not in name)


def _normalizer_lower_case(normalizer: Any, where: str) -> bool:
    """Whether a tokenizer.json normalizer lower-cases (and strips accents, which our
    WordPiece tokenizer does together with lower-casing, as BERT's uncased models do).

    BertNormalizer {"lowercase", "strip_accents": null = same as lowercase} (what
    transformers' BertTokenizer writes), a Sequence of Lowercase / NFD / StripAccents,
    or none (cased).
    """
    parts = normalizer.get("normalizers", []) if isinstance(normalizer, dict) and \
        normalizer.get("type") == "Sequence" else [normalizer]
    lower = strip = False
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "BertNormalizer":
            lower = lower or bool(part.get("lowercase"))
            accents = part.get("strip_accents")
            strip = strip or bool(part.get("lowercase") if accents is None else accents)
        elif kind == "Lowercase":
            lower = True
        elif kind == "StripAccents":
            strip = True
    if lower != strip:
        what = ("lower-cases without stripping accents" if lower
                else "strips accents without lower-casing")
        raise CheckpointError(
            f"{where}: the normalizer {what}; "
            "our WordPiece tokenizer (tensorflow-text FastBertTokenizer) does both or "
            "neither, as BERT's uncased and cased models do. Use a BERT-style tokenizer.")
    return lower


def read_hf_vocab(path: str) -> list[str]:
    """The WordPiece vocabulary of an HF directory, in id order: vocab.txt
    (transformers < 5, and what export_hf writes), else tokenizer.json's
    model.vocab plus its added tokens (transformers >= 5 saves only tokenizer.json)."""
    vocab_txt, tok_json = os.path.join(path, VOCAB_FILE), os.path.join(path, TOKENIZER_JSON)
    if files.isfile(vocab_txt) or not files.isfile(tok_json):
        if not files.isfile(vocab_txt):
            raise CheckpointError(f"{path}: no tokenizer; expected {VOCAB_FILE} or "
                                  f"{TOKENIZER_JSON} (as transformers' save_pretrained writes).")
        return read_model_vocab(vocab_txt)
    data = read_model_json(tok_json)
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    if model.get("type", "WordPiece") != "WordPiece" or "vocab" not in model:
        raise CheckpointError(f"{tok_json}: model type {model.get('type')!r}; a BERT teacher "
                              "needs a WordPiece tokenizer (model.type 'WordPiece', model.vocab).")
    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise CheckpointError(f"{tok_json}: continuing_subword_prefix {prefix!r}; our WordPiece "
                              "tokenizer uses BERT's '##'.")
    raw = model["vocab"]
    ids = (dict(raw) if isinstance(raw, dict)
           else {(t[0] if isinstance(t, list) else t): i for i, t in enumerate(raw)})
    for added in data.get("added_tokens") or []:
        if isinstance(added, dict) and added.get("content") not in ids:
            ids[str(added["content"])] = int(added["id"])
    by_id: dict[int, str] = {}
    for token, i in ids.items():
        if not isinstance(i, int) or i in by_id:
            raise CheckpointError(f"{tok_json}: token {token!r} has id {i!r}, "
                                  + (f"also the id of {by_id[i]!r}" if i in by_id else
                                     "not an integer") + "; the vocab must map one token per id.")
        by_id[i] = str(token)
    if sorted(by_id) != list(range(len(by_id))):
        missing = sorted(set(range(max(by_id) + 1)) - set(by_id))[:5] if by_id else [0]
        raise CheckpointError(f"{tok_json}: the vocab's ids are not 0..{len(by_id) - 1} "
                              f"(no token for ids {missing}); it does not fit an embedding table.")
    tokens = [by_id[i] for i in range(len(by_id))]
    try:
        check_vocab(tokens, tok_json)
    except VocabError as e:
        raise CheckpointError(str(e)) from e
    return tokens


def _read_weights(path: str) -> tuple[dict[str, np.ndarray], str, dict[str, str]]:
    """Raw tensors of an HF directory, the file to name in errors, and key -> file."""
    single = os.path.join(path, SAFETENSORS)
    index = os.path.join(path, SAFETENSORS_INDEX)
    if files.isfile(single):
        arrays = read_safetensors(single)
        return arrays, single, {k: single for k in arrays}
    if files.isfile(index):
        data = read_model_json(index)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: key 'weight_map' is missing or empty.")
        arrays, key_files = {}, {}
        by_file: dict[str, list[str]] = {}
        for key, fname in weight_map.items():
            by_file.setdefault(os.path.join(path, str(fname)), []).append(key)
        for fname, keys in sorted(by_file.items()):
            try:
                part = read_safetensors(fname, keys)
            except CheckpointError as e:
                raise CheckpointError(f"{e} (shard listed in {index})") from e
            arrays.update(part)
            key_files.update({k: fname for k in keys})
        return arrays, index, key_files
    present = [f for f in _UNREADABLE if files.isfile(os.path.join(path, f))]
    if present:
        raise CheckpointError(
            f"{os.path.join(path, present[0])}: only safetensors weights are read (PyTorch and "
            "TF-h5 are not dependencies). Convert once, on a machine with transformers: "
            "`AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`.")
    raise CheckpointError(f"{path}: no weights found; expected {SAFETENSORS} or "
                          f"{SAFETENSORS_INDEX}.")


class _Layout(NamedTuple):
    """How one Hugging Face `model_type` stores our weights."""

    normalise: Callable[[str], str]          # file key -> key of the name map
    ignored: "re.Pattern[str]"               # normalised keys that hold no weight of ours
    detect_head: Callable[..., tuple]        # (json, {key: shape}, config path) -> (head, n)
    name_map: Callable[..., dict]            # (config, head, n) -> {ours: (key, kind, shape)}
    tied_decoder: str                        # normalised key of an MLM decoder tied to embeddings
    mlm_prefixes: tuple[str, ...]            # keys of an MLM head a task checkpoint may carry


_LAYOUTS = {
    "bert": _Layout(_normalise_key, _IGNORED, _detect_head, _name_map,
                    "cls.predictions.decoder.weight", ("cls.predictions.",)),
    hf_distilbert.MODEL_TYPE: _Layout(hf_distilbert.normalise_key, hf_distilbert.IGNORED,
                                      hf_distilbert.detect_head, hf_distilbert.name_map,
                                      hf_distilbert.TIED_DECODER, ()),
}


def _read_hf_config(config_path: str) -> tuple[dict, BertConfig, _Layout]:
    """A Hugging Face config.json: its JSON, our `BertConfig` and its key layout."""
    data = read_model_json(config_path)
    model_type = data.get("model_type", "bert")
    if model_type not in _LAYOUTS:
        raise CheckpointError(f"{config_path}: model_type {model_type!r} is not supported; "
                              f"load_model reads {' and '.join(map(repr, _LAYOUTS))} "
                              "checkpoints.")
    try:
        return data, BertConfig.from_hf_dict(data, source=config_path), _LAYOUTS[model_type]
    except ConfigError as e:
        raise CheckpointError(str(e)) from e


def read_hf(path: str) -> CheckpointSpec:
    """Read a Hugging Face BERT directory into a `CheckpointSpec` (our layout)."""
    config_path = os.path.join(path, CONFIG_FILE)
    data, config, layout = _read_hf_config(config_path)
    raw, weights_file, key_files = _read_weights(path)
    tensors: dict[str, np.ndarray] = {}
    original: dict[str, str] = {}
    decoder = None
    for key, value in raw.items():
        norm = layout.normalise(key)
        if norm == layout.tied_decoder:
            decoder = (key, value)
        if layout.ignored.match(norm):
            continue
        if norm in tensors:
            raise CheckpointError(f"{key_files[key]}: key {key!r} duplicates {original[norm]!r}.")
        tensors[norm], original[norm] = value, key

    emb = tensors.get("embeddings.word_embeddings.weight")
    if decoder is not None and emb is not None and not (
            decoder[1].shape == emb.shape and np.array_equal(decoder[1], emb)):
        raise CheckpointError(
            f"{key_files[decoder[0]]}: key {decoder[0]!r} differs from the word embeddings; "
            "our MLM head ties its decoder to the token embeddings, so an untied decoder "
            "cannot load.")
    config.use_pooler = "pooler.dense.weight" in tensors
    config.lower_case = read_lower_case(path)
    head, num_labels = layout.detect_head(data, {k: v.shape for k, v in tensors.items()},
                                          config_path)
    if head != "mlm" and layout.mlm_prefixes:
        # A task checkpoint may still ship MLM weights; they are not ours to keep.
        tensors = {k: v for k, v in tensors.items() if not k.startswith(layout.mlm_prefixes)}
    label_names = _label_names(data, head, num_labels)

    name_map = layout.name_map(config, head, num_labels)
    by_hf = {hf: (ours, kind, shape) for ours, (hf, kind, shape) in name_map.items()}
    weights: dict[str, np.ndarray] = {}
    source_keys: dict[str, str] = {}
    for norm, value in tensors.items():
        key = original[norm]
        if norm not in by_hf:
            raise CheckpointError(
                f"{key_files[key]}: unknown weight key {key!r}; it is not part of a BERT encoder "
                f"with {config.num_layers} layers (config {config_path}) or its heads.")
        ours, kind, shape = by_hf[norm]
        if tuple(value.shape) != shape:
            raise CheckpointError(
                f"{key_files[key]}: key {key!r} has shape {tuple(value.shape)}, expected {shape} "
                f"from {config_path}; config and weights do not match.")
        if not np.issubdtype(value.dtype, np.floating):
            raise CheckpointError(f"{key_files[key]}: key {key!r} has dtype {value.dtype}; "
                                  "expected floating-point weights.")
        weights[ours] = np.asarray(_to_ours(kind, value.astype(np.float32), config))
        source_keys[ours] = key
    for ours, (hf, _, _) in name_map.items():
        source_keys.setdefault(ours, hf)
    vocab = read_hf_vocab(path)
    return CheckpointSpec(config, vocab, weights, weights_file, head=head,
                          num_labels=num_labels, label_names=label_names,
                          metadata={"source": files.absolute(path), "source_format": "hf"},
                          source_keys=source_keys)


def inspect_hf(path: str) -> CheckpointSpec:
    """Config, vocab, head and label names of a Hugging Face directory, reading
    only the weight files' headers (key names and shapes), not the weights.
    The returned spec has no weights."""
    config_path = os.path.join(path, CONFIG_FILE)
    data, config, layout = _read_hf_config(config_path)
    single, index = os.path.join(path, SAFETENSORS), os.path.join(path, SAFETENSORS_INDEX)
    if files.isfile(single):
        weight_files = [single]
    elif files.isfile(index):
        weight_map = read_model_json(index).get("weight_map") or {}
        weight_files = sorted({os.path.join(path, str(f)) for f in weight_map.values()})
    else:
        _read_weights(path)  # raises the reader's error for missing/unreadable weights
        weight_files = []
    shapes: dict[str, tuple[int, ...]] = {}
    for fname in weight_files:
        for key, shape in safetensors_shapes(fname).items():
            shapes[layout.normalise(key)] = shape
    config.use_pooler = "pooler.dense.weight" in shapes
    config.lower_case = read_lower_case(path)
    head, n = layout.detect_head(data, shapes, config_path)
    return CheckpointSpec(config, read_hf_vocab(path), {},
                          single if weight_files == [single] else index, head=head, num_labels=n,
                          label_names=_label_names(data, head, n))


def export_hf(model: Any, directory: str) -> str:
    """Write `model` as a Hugging Face BERT directory; returns its path.

    Keys carry the `bert.` prefix (what `BertForSequenceClassification`,
    `BertForMaskedLM` and `BertModel.from_pretrained` accept); the architecture
    in config.json follows the head. A model without token types gets one
    all-zero token-type row (HF BERT always adds one). A classifier without a
    pooler cannot be expressed (HF classifies the pooled output): refused.
    Written atomically (temporary sibling, then rename).
    """
    from safetensors.numpy import save_file

    config: BertConfig = model.bert_config
    head = model.head_type
    check_float(model, f"export_hf({directory})")
    vocab = model_vocab(model, "export_hf")
    if head is not None and head not in _HF_HEADS:
        raise CheckpointError(
            f"export_hf({directory}): a {head} head has no Hugging Face BERT class; export "
            "the model without it (load_model(dir, head='none')) or use another format.")
    if head in ("classifier", "regressor") and not config.use_pooler:  # pooled-output heads
        raise CheckpointError(
            f"export_hf({directory}): Hugging Face BertForSequenceClassification classifies the "
            "pooled output, but this model has no pooler (use_pooler=false); export it without "
            "the head or train it with a pooler.")
    name_map = _name_map(config, head, model.num_labels)
    arrays: dict[str, np.ndarray] = {}
    for path, var in model.weight_dict().items():
        hf_key, kind, shape = name_map[path]
        value = np.ascontiguousarray(_to_hf(kind, np.asarray(var.numpy(), np.float32)))
        assert value.shape == shape, (path, value.shape, shape)
        is_head = head is not None and path.startswith(_HEAD_LAYERS[head] + "/")
        arrays[hf_key if is_head else "bert." + hf_key] = value
    if config.type_vocab_size == 0:
        arrays["bert.embeddings.token_type_embeddings.weight"] = np.zeros(
            (1, config.hidden_size), np.float32)
    hf_config = config.to_hf_dict()
    if head is not None:
        hf_config["architectures"] = [_HF_HEADS[head].architecture]
    if model.num_labels and head != "span":
        n = model.num_labels
        names = model.label_names or [f"LABEL_{i}" for i in range(n)]
        hf_config["num_labels"] = n
        hf_config["id2label"] = {str(i): str(names[i]) for i in range(n)}
        hf_config["label2id"] = {str(names[i]): i for i in range(n)}
    if head == "regressor":
        hf_config["problem_type"] = "regression"
    with atomic_directory(directory) as tmp:
        save_file(arrays, os.path.join(tmp, SAFETENSORS), metadata={"format": "pt"})
        write_json(os.path.join(tmp, CONFIG_FILE), hf_config)
        write_vocab(vocab, os.path.join(tmp, VOCAB_FILE))
        write_json(os.path.join(tmp, TOKENIZER_JSON), hf_tokenizer(vocab, config.lower_case))
        # PreTrainedTokenizerFast: AutoTokenizer then runs tokenizer.json as written
        # (transformers 5's BertTokenizer rebuilds BERT's normaliser from the vocab).
        write_json(os.path.join(tmp, "tokenizer_config.json"),
                   {"tokenizer_class": "PreTrainedTokenizerFast",
                    "do_lower_case": config.lower_case,
                    "model_max_length": config.max_position_embeddings,
                    **{f"{t.strip('[]').lower()}_token": t for t in SPECIAL_TOKENS}})
    return files.absolute(directory)


def hf_tokenizer(vocab: list[str], lower_case: bool) -> dict[str, Any]:
    """A Hugging Face `tokenizers` definition (tokenizer.json) that splits text as our
    `Tokenizer` does: BERT's pre-tokenizer, WordPiece over `vocab`, `[CLS] A [SEP] B
    [SEP]` with segment ids 0 then 1.

    Written out by hand (the format is plain JSON) rather than with the `tokenizers`
    package, which the package does not otherwise need at run time. The normaliser
    follows tensorflow-text's FastBertNormalizer, not BERT's: for an uncased vocab it
    case-folds with NFKC ("…" -> "...", "™" -> "tm", full-width -> ASCII), so it runs
    NFKC, lower-casing and the two folds those miss (ß, final sigma) before BERT's
    normaliser strips accents; C1 control characters become spaces, as ours makes them.
    docs/models.md says what still differs (characters of newer Unicode versions).
    """
    ids = {token: i for i, token in enumerate(vocab)}
    steps: list[dict[str, Any]] = []
    if lower_case:
        steps += [{"type": "NFKC"}, {"type": "Lowercase"},
                  {"type": "Replace", "pattern": {"String": "\u00df"}, "content": "ss"},
                  {"type": "Replace", "pattern": {"String": "\u03c2"}, "content": "\u03c3"}]
    steps += [{"type": "Replace", "pattern": {"Regex": "[\\x{7f}-\\x{9f}]"}, "content": " "},
              {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
               "strip_accents": bool(lower_case), "lowercase": False}]

    def special(token: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def sequence(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": ids[t], "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for t in SPECIAL_TOKENS],
        "normalizer": {"type": "Sequence", "normalizers": steps},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0)],
            "pair": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0),
                     sequence("B", 1), special("[SEP]", 1)],
            "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]}
                               for t in ("[CLS]", "[SEP]")}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        # tensorflow-text caps a word at 100 bytes, Hugging Face at 100 characters: the
        # same for ASCII.
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids},
    }
