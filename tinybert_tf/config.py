"""Model configuration: `BertConfig`, named presets, and Hugging Face import.

A config fully describes an encoder's shapes and numerics; heads add only the
number of outputs. It round-trips through JSON (our model directory's
`config.json`) and can be read from a Hugging Face BERT `config.json`.
"""
from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Any

from tinybert_tf import files

# Activation names understood by the encoder.
#   "gelu"      exact erf GELU, as in Google's and Hugging Face's BERT checkpoints.
#   "gelu_tanh" tanh approximation, as in keras-hub's BertBackbone.
#   "relu"      as in some distilled students.
ACTIVATIONS = ("gelu", "gelu_tanh", "relu")

_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}


class ConfigError(ValueError):
    """A config file or value is invalid; the message names the file/key and the fix."""


@dataclasses.dataclass
class BertConfig:
    """Shapes and numerics of a post-LayerNorm BERT encoder.

    `type_vocab_size=0` means no token-type (segment) embeddings (DistilBERT).
    `use_pooler=False` drops the [CLS] pooler (DistilBERT); classifiers then
    read the [CLS] hidden state directly.
    `lower_case` is the tokenizer's lower-casing + accent stripping.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_epsilon: float = 1e-12
    initializer_range: float = 0.02
    use_pooler: bool = True
    lower_case: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, source: str = "BertConfig") -> None:
        """Raise ConfigError naming `source` and the bad field."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{source}: `{name}` must be a positive integer, got {value!r}.")
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ConfigError(f"{source}: `type_vocab_size` must be >= 0 (0 = no token types), "
                              f"got {self.type_vocab_size!r}.")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"{source}: hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}; pick a head count that divides the width.")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"{source}: unknown `hidden_act` {self.hidden_act!r}; "
                              f"use one of {', '.join(ACTIVATIONS)}.")
        for name in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise ConfigError(f"{source}: `{name}` must be in [0, 1), got {value!r}.")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    def replace(self, **changes: Any) -> "BertConfig":
        return dataclasses.replace(self, **changes)

    # --- JSON ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "BertConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown config keys {unknown}; known keys are "
                              f"{sorted(known)}.")
        try:
            config = cls.__new__(cls)
            for f in dataclasses.fields(cls):
                default = f.default
                setattr(config, f.name, data.get(f.name, default))
            config.validate(source)
        except ConfigError:
            raise
        except Exception as e:  # pragma: no cover - defensive
            raise ConfigError(f"{source}: {e}") from e
        return config

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json_file(cls, path: str) -> "BertConfig":
        data = read_json(path)
        if "bert_config" in data:  # our model directory nests the encoder config
            data = data["bert_config"]
        return cls.from_dict(data, source=path)

    # --- Hugging Face ---------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], source: str = "config.json") -> "BertConfig":
        """Read a Hugging Face `BertConfig` / `DistilBertConfig` dict."""
        model_type = data.get("model_type", "bert")
        try:
            if model_type == "distilbert":
                act = data.get("activation", "gelu")
                values = dict(
                    vocab_size=data["vocab_size"], hidden_size=data["dim"],
                    num_layers=data["n_layers"], num_heads=data["n_heads"],
                    intermediate_size=data["hidden_dim"],
                    max_position_embeddings=data.get("max_position_embeddings", 512),
                    type_vocab_size=0, use_pooler=False,
                    hidden_dropout=data.get("dropout", 0.1),
                    attention_dropout=data.get("attention_dropout", 0.1),
                    layer_norm_epsilon=1e-12,
                )
            else:
                act = data.get("hidden_act", "gelu")
                values = dict(
                    vocab_size=data["vocab_size"], hidden_size=data["hidden_size"],
                    num_layers=data["num_hidden_layers"], num_heads=data["num_attention_heads"],
                    intermediate_size=data["intermediate_size"],
                    max_position_embeddings=data.get("max_position_embeddings", 512),
                    type_vocab_size=data.get("type_vocab_size", 2),
                    hidden_dropout=data.get("hidden_dropout_prob", 0.1),
                    attention_dropout=data.get("attention_probs_dropout_prob", 0.1),
                    layer_norm_epsilon=data.get("layer_norm_eps", 1e-12),
                    initializer_range=data.get("initializer_range", 0.02),
                )
        except KeyError as e:
            raise ConfigError(f"{source}: Hugging Face config lacks required key "
                              f"{e.args[0]!r}.") from e
        if act not in _HF_ACTIVATIONS:
            raise ConfigError(f"{source}: activation {act!r} is not supported; "
                              f"supported: {sorted(_HF_ACTIVATIONS)}.")
        values["hidden_act"] = _HF_ACTIVATIONS[act]
        config = cls.__new__(cls)
        for f in dataclasses.fields(cls):
            setattr(config, f.name, values.get(f.name, f.default))
        config.validate(source)
        return config

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face `BertConfig` dict (`BertModel` loads it)."""
        act = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}[self.hidden_act]
        return {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": act,
            "max_position_embeddings": self.max_position_embeddings,
            # HF BERT always has token types; 1 row of zeros-equivalent when we have none.
            "type_vocab_size": max(self.type_vocab_size, 1),
            "hidden_dropout_prob": self.hidden_dropout,
            "attention_probs_dropout_prob": self.attention_dropout,
            "layer_norm_eps": self.layer_norm_epsilon,
            "initializer_range": self.initializer_range,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
        }


def read_json(path: str, fix: str = "fix the file") -> dict[str, Any]:
    """Read a JSON object, raising ConfigError that names the file, the line and `fix`."""
    return files.read_json(path, error=ConfigError, expect=dict, fix=fix)


# all-MiniLM-L6-v2's width: its presets differ only in depth.
_MINILM_WIDTH = dict(hidden_size=384, num_heads=12, intermediate_size=1536)

PRESETS: dict[str, BertConfig] = {
    "bert_base_uncased": BertConfig(),
    "bert_large_uncased": BertConfig(hidden_size=1024, num_layers=24, num_heads=16,
                                     intermediate_size=4096),
    "tinybert_4l_312d": BertConfig(hidden_size=312, num_layers=4, num_heads=12,
                                   intermediate_size=1200),
    "tinybert_6l_768d": BertConfig(hidden_size=768, num_layers=6, num_heads=12,
                                   intermediate_size=3072),
    "distilbert_6l": BertConfig(hidden_size=768, num_layers=6, num_heads=12,
                                intermediate_size=3072, type_vocab_size=0, use_pooler=False),
    # The paper's 4-layer baselines (Table 1): BERT4-PKD and DistilBERT4 keep BERT-base's
    # width; BERT-Small (Turc et al.) is 4 x 512 with 8 heads.
    "bert_4l_768d": BertConfig(num_layers=4),
    "distilbert_4l": BertConfig(num_layers=4, type_vocab_size=0, use_pooler=False),
    "bert_small_4l_512d": BertConfig(hidden_size=512, num_layers=4, num_heads=8,
                                     intermediate_size=2048),
    # The embedded teacher's shape (all-MiniLM-L6-v2).
    "minilm_l6_384d": BertConfig(num_layers=6, **_MINILM_WIDTH),
    # Small students for 2-core CPUs.
    "tiny_4l_192d": BertConfig(hidden_size=192, num_layers=4, num_heads=12,
                               intermediate_size=768),
    # Students of the MiniLM teacher's width, which --init_from_teacher can start
    # from its layers. One layer is the demo student (3.8x faster than the teacher
    # at batch 1); two layers stop near 2.7x.
    "minilm_2l_384d": BertConfig(num_layers=2, **_MINILM_WIDTH),
    # Three layers (--init_from_teacher copies the teacher's layers 2, 4 and 6): about
    # 2x faster than the teacher at batch 1 in TFLite (docs/measurements.md, MRPC).
    "minilm_3l_384d": BertConfig(num_layers=3, **_MINILM_WIDTH),
    # Three layers with half the feed-forward block: about as fast as two full layers
    # (2.7x the teacher), and as good as three full ones on MRPC (docs/measurements.md).
    # --init_from_teacher keeps each copied layer's 768 FFN units of largest weight norm.
    "minilm_3l_384d_ffn768": BertConfig(num_layers=3, hidden_size=384, num_heads=12,
                                        intermediate_size=768),
    "minilm_1l_384d": BertConfig(num_layers=1, **_MINILM_WIDTH),
    # 2 layers, 256 wide, 8 heads of 32 (the MiniLM teacher's head size).
    "tiny_2l_256d": BertConfig(hidden_size=256, num_layers=2, num_heads=8,
                               intermediate_size=1024),
}


def get_config(name_or_path: str, **overrides: Any) -> BertConfig:
    """A preset by name, a JSON file (ours or Hugging Face's), or a model directory
    (its config.json)."""
    if name_or_path in PRESETS:
        config = PRESETS[name_or_path]
    elif files.isdir(name_or_path) and files.isfile(posixpath.join(name_or_path,
                                                                   "config.json")):
        return get_config(posixpath.join(name_or_path, "config.json"), **overrides)
    elif name_or_path.endswith(".json") or files.isfile(name_or_path):
        data = read_json(name_or_path)
        if "bert_config" in data:
            data = data["bert_config"]
        if "model_type" in data or "num_hidden_layers" in data or "n_layers" in data:
            config = BertConfig.from_hf_dict(data, source=name_or_path)
        else:
            config = BertConfig.from_dict(data, source=name_or_path)
    else:
        raise ConfigError(f"unknown model config {name_or_path!r}: use a preset "
                          f"({', '.join(sorted(PRESETS))}), a path to a config JSON file, "
                          "or a model directory.")
    return config.replace(**overrides) if overrides else config
