"""`BertModel`: the encoder that exposes every distillation signal, plus an optional head.

Inputs (DESIGN.md contract): a dict of int32 [B, L] tensors `input_word_ids`,
`input_mask` (1 = real token, 0 = padding) and `input_type_ids`; for an MLM head
optionally `masked_lm_positions` [B, P] to score only those positions.

Outputs, a dict:
  embeddings        [B, L, H]  embedding-layer output (= hidden_states[0])
  hidden_states     list of num_layers + 1 tensors [B, L, H]
  attention_scores  list of num_layers tensors [B, heads, L, L]: QK^T/sqrt(d_k),
                    no mask added (losses apply their own masking convention)
  attention_queries, attention_keys, attention_values
                    lists of num_layers tensors [B, L, heads, d_k]: each layer's
                    per-head Q, K, V (MiniLM's relations; unused outputs cost nothing
                    in a traced graph)
  sequence_output   [B, L, H]  last hidden state
  pooled_output     [B, H]     tanh(dense([CLS])) or the [CLS] state without pooler
  logits            the head's output (see models/heads.py): [B, C] classes, [B, 1] score,
                    [B, P or L, V] MLM, [B, L, C] tags, [B, L, 2] span start/end
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import keras
from keras import ops

from tinybert_tf.config import BertConfig
from tinybert_tf.models.heads import get_head
from tinybert_tf.models.layers import (
    MASK_VALUE,
    PositionEmbedding,
    TransformerLayer,
    embed,
    initializer,
    normalize,
)
from tinybert_tf.models.quantization import (
    ActivationRanges,
    Quant,
    QuantizationConfig,
    QuantizationError,
    dense,
    tensor_weights,
)

INPUT_NAMES = ("input_word_ids", "input_mask", "input_type_ids")
VOCAB_ASSET = "vocab.txt"  # the vocab's file in a .keras archive's assets


@keras.saving.register_keras_serializable(package="tinybert_tf")
class BertModel(keras.Model):
    """Post-LayerNorm BERT encoder with an optional `head`.

    Args:
      config: the encoder's `BertConfig`.
      head: None or a registered head (`tinybert_tf.models.heads`): "classifier",
        "regressor", "mlm", "token_classifier", "span".
      num_labels: outputs of a labelled head (classes, tags; 1 for a regressor).
      label_names: optional class names, saved with the model.
      vocab: optional WordPiece vocabulary (list of tokens), saved with the model.
      quantization: a `QuantizationConfig` for the int8 fake-quantised encoder of
        quantisation-aware distillation (models/quantization.py): every call then
        computes what TFLite's full-integer kernels will, and `quant_ranges` holds
        its activation ranges (saved with the weights).

    Example:
      >>> model = BertModel(get_config("tiny_4l_192d"), head="classifier", num_labels=2)
      >>> out = model(dummy_inputs(2, 16))
      >>> out["logits"].shape, len(out["hidden_states"])
      (TensorShape([2, 2]), 5)
    """

    def __init__(self, config: BertConfig, head: Optional[str] = None,
                 num_labels: Optional[int] = None,
                 label_names: Optional[Sequence[str]] = None,
                 vocab: Optional[Sequence[str]] = None,
                 quantization: Optional[QuantizationConfig] = None, **kwargs):
        kwargs.setdefault("name", "bert")
        super().__init__(**kwargs)
        head_cls = get_head(head) if head is not None else None
        if quantization is not None and head_cls is not None and not head_cls.quantizable:
            raise QuantizationError(f"a {head} head has no int8 form; quantise a task model "
                                    "(classifier, regressor, token classifier, span).")
        num_labels = (head_cls.resolve_num_labels(num_labels, label_names)
                      if head_cls is not None else None)
        if label_names and num_labels is not None and len(label_names) != num_labels:
            raise ValueError(f"{len(label_names)} label_names for a {head} head with "
                             f"{num_labels} outputs.")
        self.bert_config = config
        self.head_type = head
        self.num_labels = num_labels
        self.label_names = list(label_names) if label_names and num_labels else None
        self.vocab = list(vocab) if vocab is not None else None
        c, p = config, self.dtype_policy
        self.token_embedding = keras.layers.Embedding(
            c.vocab_size, c.hidden_size, embeddings_initializer=initializer(c.initializer_range),
            dtype=p, name="token_embedding")
        self.position_embedding = PositionEmbedding(
            c.max_position_embeddings, c.initializer_range, dtype=p, name="position_embedding")
        self.segment_embedding = (keras.layers.Embedding(
            c.type_vocab_size, c.hidden_size,
            embeddings_initializer=initializer(c.initializer_range), dtype=p,
            name="segment_embedding") if c.type_vocab_size > 0 else None)
        self.embeddings_layer_norm = keras.layers.LayerNormalization(
            epsilon=c.layer_norm_epsilon, dtype=p, name="embeddings_layer_norm")
        self.embeddings_dropout = keras.layers.Dropout(c.hidden_dropout, dtype=p,
                                                       name="embeddings_dropout")
        self.transformer_layers = [
            TransformerLayer(c.num_heads, c.head_size, c.intermediate_size, c.hidden_act,
                             c.hidden_dropout, c.attention_dropout, c.layer_norm_epsilon,
                             c.initializer_range, dtype=p, name=f"transformer_layer_{i}")
            for i in range(c.num_layers)]
        self.pooled_dense = (keras.layers.Dense(
            c.hidden_size, activation="tanh", kernel_initializer=initializer(c.initializer_range),
            dtype=p, name="pooled_dense") if c.use_pooler else None)
        self.head = (head_cls.create(c, num_labels, self.token_embedding, p)
                     if head_cls is not None else None)
        self.quantization = quantization
        self.quant_ranges = (ActivationRanges(quantization, owner=self.name,
                                              name="quantization")
                             if quantization is not None else None)
        # Create every variable now, so weights can be loaded right after construction.
        self._int8_ready = False
        self.build()
        if quantization is not None:
            # The int8 trace reads built layers' weights; its first call creates its points.
            self._int8_ready = True
            extra = head_cls.build_inputs if head_cls is not None else {}
            self(dummy_inputs(1, 2, mlm_positions=extra.get("masked_lm_positions", 0)))

    def build(self, input_shape=None) -> None:
        """Create every layer's variables from the config alone (the input shapes do
        not matter: only the width H does). Without this, keras builds a subclassed
        model by tracing `call` symbolically and then running it: 0.7 s for a 2-layer
        model of width 32, 2.6 s for a 6-layer one of width 384."""
        ids, hidden = (None, None), (None, None, self.bert_config.hidden_size)
        self.token_embedding.build(ids)
        self.position_embedding.build(hidden)
        if self.segment_embedding is not None:
            self.segment_embedding.build(ids)
        self.embeddings_layer_norm.build(hidden)
        for layer in self.transformer_layers:
            layer.build(hidden)
        if self.pooled_dense is not None:
            self.pooled_dense.build(hidden[1:])
        if self.head is not None:
            self.head.build(hidden)  # every head reads [..., H]
        self.built = True

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        # Text is the commonest first call; Keras would say only "Only input tensors may be
        # passed as positional arguments".
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                       and all(isinstance(t, str) for t in inputs)):
            raise TypeError("BertModel takes token ids (a dict of input_word_ids, input_mask "
                            "and input_type_ids), not text: tokenise first, e.g. "
                            "tok = tinybert_tf.load_tokenizer(model); model(tok(texts)).")
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs: dict[str, Any], training=None,
             mask_value: float = MASK_VALUE, integer_friendly: bool = False) -> dict[str, Any]:
        """inputs: int [B, L] input_word_ids, input_mask, input_type_ids (and
        masked_lm_positions [B, P] for the MLM head).

        mask_value: the additive attention mask of padded keys (-1e4; the int8
        TFLite export traces with a smaller, calibrated one).
        integer_friendly: embeddings by plain GATHER and centred LayerNorms
        (`layers.embed` / `layers.normalize`): the same maths in ops that the
        full-integer TFLite flavours quantise to integer kernels.
        A quantised model (`quantization`) always computes its int8 trace and
        ignores both arguments (its mask value is calibrated).
        """
        word_ids = inputs["input_word_ids"]
        mask = inputs.get("input_mask")
        if mask is None:
            mask = ops.ones_like(word_ids)
        q = Quant(self.quant_ranges) if self.quant_ranges is not None and self._int8_ready \
            else None
        x = embed(self.token_embedding, word_ids, integer_friendly, quant=q)
        positions = self.position_embedding(x)
        if q is not None:  # rows of the int8 position table
            positions = tensor_weights(positions, range_of=self.position_embedding.embeddings)
        x = self._add(x, positions, q, "embeddings.position", training)
        if self.segment_embedding is not None:
            type_ids = inputs.get("input_type_ids")
            if type_ids is None:
                type_ids = ops.zeros_like(word_ids)
            x = self._add(x, embed(self.segment_embedding, type_ids, integer_friendly, quant=q),
                          q, "embeddings.segment", training)
        x = normalize(self.embeddings_layer_norm, x, integer_friendly,
                      quant=q and q.scope("embeddings_norm"), training=training)
        x = self.embeddings_dropout(x, training=training)
        hidden_states, scores, qkv = [x], [], []
        for i, layer in enumerate(self.transformer_layers):
            x, s, layer_qkv = layer(x, mask, training=training, mask_value=mask_value,
                                    integer_friendly=integer_friendly,
                                    quant=q and q.scope(f"transformer_layer_{i}"))
            hidden_states.append(x)
            scores.append(s)
            qkv.append(layer_qkv)
        cls = x[:, 0, :]
        if self.pooled_dense is None:
            pooled = cls
        elif q is None:
            pooled = self.pooled_dense(cls)
        else:
            pooled = ops.cast(dense(self.pooled_dense, cls, q.scope("pooler"), training),
                              x.dtype)
        out = {"embeddings": hidden_states[0], "hidden_states": hidden_states,
               "attention_scores": scores, "sequence_output": x, "pooled_output": pooled,
               "attention_queries": [t[0] for t in qkv],
               "attention_keys": [t[1] for t in qkv],
               "attention_values": [t[2] for t in qkv]}
        if self.head is not None:
            head_quant = {} if q is None else {"quant": q.scope("head")}
            out["logits"] = self.head(self.head.select(out, inputs), training=training,
                                      **head_quant)
        return out

    @staticmethod
    def _add(x, y, q: Optional[Quant], name: str, training):
        """x + y (the embedding sums); in the int8 trace the sum is point `name`."""
        if q is None:
            return x + y
        return ops.cast(q.act(name, ops.cast(x, "float32") + ops.cast(y, "float32"), training),
                        x.dtype)

    def quantized(self, config: Optional[QuantizationConfig] = None) -> "BertModel":
        """A fake-quantised copy of this model (same weights, `config` or the default
        QuantizationConfig): the student of quantisation-aware distillation. Its
        activation ranges are unset until `quantization.calibrate`."""
        model = BertModel(self.bert_config, head=self.head_type, num_labels=self.num_labels,
                          label_names=self.label_names, vocab=self.vocab,
                          quantization=config or QuantizationConfig(), name=self.name)
        targets = model.weight_dict()
        for path, v in self.weight_dict().items():
            targets[path].assign(v)
        model.metadata = dict(getattr(self, "metadata", None) or {})
        return model

    # Keras's own format: `model.save("x.keras")` and `keras.models.load_model("x.keras")`
    # (with tinybert_tf imported: the class is registered as "tinybert_tf>BertModel").
    # The config holds the encoder's BertConfig, the head and its label names; the
    # vocab travels as an asset (vocab.txt in the archive), as keras-hub's tokenizers
    # keep theirs. Our model directory (checkpoint.py) stays the pipeline's format.
    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "trainable": self.trainable,
                "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
                "config": self.bert_config.to_dict(), "head": self.head_type,
                "num_labels": self.num_labels, "label_names": self.label_names,
                "quantization": self.quantization.to_dict() if self.quantization else None}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        dtype = config.pop("dtype", None)
        quant = config.get("quantization")
        return cls(BertConfig.from_dict(config["config"]), head=config["head"],
                   num_labels=config["num_labels"], label_names=config["label_names"],
                   quantization=QuantizationConfig.from_dict(quant) if quant else None,
                   name=config.get("name", "bert"), trainable=config.get("trainable", True),
                   dtype=keras.saving.deserialize_keras_object(dtype) if dtype else None)

    def save_assets(self, dir_path: str) -> None:
        if self.vocab is not None:
            with open(os.path.join(dir_path, VOCAB_ASSET), "w", encoding="utf-8") as f:
                f.write("".join(t + "\n" for t in self.vocab))

    def load_assets(self, dir_path: str) -> None:
        path = os.path.join(dir_path, VOCAB_ASSET)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                self.vocab = f.read().split("\n")[:-1]

    def weight_dict(self) -> dict[str, keras.Variable]:
        """Variables by their path ("transformer_layer_0/.../kernel"), model prefix removed."""
        prefix = self.name + "/"
        out = {}
        for v in self.weights:
            path = v.path[len(prefix):] if v.path.startswith(prefix) else v.path
            out[path] = v
        return out


def dummy_inputs(batch: int, length: int, mlm_positions: int = 0) -> dict[str, Any]:
    """All-ones inputs of shape [batch, length], for building and shape checks."""
    inputs = {
        "input_word_ids": ops.ones((batch, length), "int32"),
        "input_mask": ops.ones((batch, length), "int32"),
        "input_type_ids": ops.zeros((batch, length), "int32"),
    }
    if mlm_positions:
        inputs["masked_lm_positions"] = ops.zeros((batch, mlm_positions), "int32")
    return inputs


def count_params(model: keras.Model, exclude_embeddings: bool = False) -> int:
    """Parameter count, optionally without the token-embedding table."""
    total = 0
    for path, v in model.weight_dict().items():
        if exclude_embeddings and path.startswith("token_embedding"):
            continue
        total += int(v.numpy().size)
    return total


def flops_per_example(config: BertConfig, seq_len: int, num_labels: int = 0) -> int:
    """Forward FLOPs (2 x multiply-adds) of the encoder (+classifier) for one
    sequence of `seq_len` tokens: projections, attention matmuls and FFN.
    Embedding lookups, LayerNorm and softmax are ignored (< 1%)."""
    h, n_tok, i, n = config.hidden_size, seq_len, config.intermediate_size, config.num_layers
    per_layer = 2 * n_tok * h * h * 4 + 2 * n_tok * n_tok * h * 2 + 2 * n_tok * h * i * 2
    pool = 2 * h * h if config.use_pooler else 0
    return n * per_layer + pool + 2 * h * num_labels
