"""Task heads on top of the encoder, and their registry.

A head is a Keras layer that turns the encoder's outputs into `logits`. Each
head class is registered under the name stored in a model directory's
`config.json` ("head"); its `layer_name` is the prefix of its weight paths
(`classifier_head/classifier/kernel`), which checkpoints and converters key on.

  classifier        pooled [B, H] -> [B, C] class logits
  regressor         pooled [B, H] -> [B, 1] score (the classifier with one output)
  pre_classifier    [CLS] state [B, H] -> dense H, ReLU, dropout -> [B, C] (DistilBERT's head)
  pre_regressor     the pre_classifier head with one output: a score [B, 1]
  mlm               sequence at masked positions [B, P, H] -> [B, P, V] (tied decoder)
  token_classifier  sequence [B, L, H] -> [B, L, C] tag logits
  span              sequence [B, L, H] -> [B, L, 2] start / end logits

Task types (`tinybert_tf.tasks`) name the head they train; a new head is a
new registered class here.
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence

import keras
from keras import ops

from tinybert_tf import plugins
from tinybert_tf.models.layers import activation_fn, initializer
from tinybert_tf.models.quantization import Quant, dense

HEADS: dict[str, type["Head"]] = {}


def register_head(cls: Optional[type["Head"]] = None, *, replace: bool = False):
    """Class decorator: make a head available to `BertModel(head=kind)` by its `kind`
    (`@register_head(replace=True)` replaces a registered kind)."""
    def add(c: type["Head"]) -> type["Head"]:
        return plugins.register(HEADS, c.kind, c, what="head", replace=replace)
    return add(cls) if cls is not None else add


def get_head(kind: str) -> type["Head"]:
    if kind not in HEADS:
        raise ValueError(f"unknown head {kind!r}; use one of {', '.join(HEADS)} or None.")
    return HEADS[kind]


def head_prefixes() -> tuple[str, ...]:
    """Weight-path prefixes of every registered head (e.g. "classifier_head/")."""
    return tuple(sorted({f"{cls.layer_name}/" for cls in HEADS.values()}))


class Head(keras.layers.Layer):
    """Base class of a registered head.

    kind: the name in config.json; layer_name: its weight-path prefix;
    has_labels: whether it predicts named labels (then `num_labels` is its width).
    """

    kind: ClassVar[str] = ""
    layer_name: ClassVar[str] = ""
    has_labels: ClassVar[bool] = True
    # Whether `call` takes `quant` (an int8 trace for the quantize stage).
    quantizable: ClassVar[bool] = False
    # Extra dummy inputs the encoder needs to build this head (e.g. MLM positions).
    build_inputs: ClassVar[dict[str, int]] = {}

    @classmethod
    def resolve_num_labels(cls, num_labels: Optional[int],
                           label_names: Optional[Sequence[str]]) -> Optional[int]:
        """The head's output width from the arguments, or a ValueError."""
        if num_labels is None and label_names:
            num_labels = len(label_names)
        if num_labels is None or num_labels < 2:
            raise ValueError(f"a {cls.kind} head needs num_labels >= 2 (or label_names).")
        return int(num_labels)

    @classmethod
    def create(cls, config, num_labels: Optional[int], token_embedding, dtype) -> "Head":
        raise NotImplementedError

    def select(self, outputs: dict[str, Any], inputs: dict[str, Any]):
        """The encoder output this head reads (a tensor), e.g. the pooled output."""
        raise NotImplementedError

    def permute_outputs(self, order: Sequence[int]) -> None:
        """Reorder the output axis: new output j = old output order[j] (a teacher's
        labels put in the task's order)."""
        raise ValueError(f"a {self.kind} head has no label outputs to reorder.")


class _DenseHead(Head):
    """dropout -> dense (BERT's fine-tuning heads), on the pooled or sequence output."""

    reads = "pooled_output"
    dense_name = "classifier"
    quantizable = True

    def __init__(self, num_labels: int, dropout: float = 0.1,
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.dropout_rate = dropout
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        setattr(self, self.dense_name, keras.layers.Dense(
            num_labels, kernel_initializer=initializer(initializer_range),
            dtype=self.dtype_policy, name=self.dense_name))

    @classmethod
    def create(cls, config, num_labels, token_embedding, dtype):
        return cls(num_labels, config.hidden_dropout, config.initializer_range, dtype=dtype,
                   name=cls.layer_name)

    def build(self, input_shape):
        getattr(self, self.dense_name).build(input_shape)
        self.built = True

    def select(self, outputs, inputs):
        return outputs[self.reads]

    def call(self, x, training=None, quant: Optional[Quant] = None):
        """x [..., H] -> logits [..., num_labels]; with `quant`, int8 kernel and logits."""
        x = self.dropout(x, training=training)
        layer = getattr(self, self.dense_name)
        return layer(x) if quant is None else dense(layer, x, quant, training)

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels,
                "dropout": self.dropout_rate}

    def permute_outputs(self, order: Sequence[int]) -> None:
        _permute_dense(getattr(self, self.dense_name), order, self.num_labels)


def _permute_dense(dense: keras.layers.Dense, order: Sequence[int], num_labels: int) -> None:
    """Reorder a dense layer's outputs: new output j = old output order[j]."""
    order = list(order)
    if sorted(order) != list(range(num_labels)):
        raise ValueError(f"{order} is not a permutation of the {num_labels} outputs.")
    dense.kernel.assign(ops.take(dense.kernel, order, axis=1))
    dense.bias.assign(ops.take(dense.bias, order, axis=0))


@register_head
class ClassifierHead(_DenseHead):
    """pooled_output [B, H] -> dropout -> dense -> logits [B, num_labels]."""

    kind = "classifier"
    layer_name = "classifier_head"


@register_head
class RegressorHead(ClassifierHead):
    """The classifier head with one output: a score [B, 1] (STS-B)."""

    kind = "regressor"

    @classmethod
    def resolve_num_labels(cls, num_labels, label_names):
        return 1


@register_head
class PreClassifierHead(Head):
    """DistilBERT's sequence-classification head (Hugging Face
    `DistilBertForSequenceClassification`), which reads the last hidden state of
    [CLS], not the pooler: [B, H] -> dense H -> ReLU -> dropout -> dense C.

    The dropout is DistilBERT's `seq_classif_dropout` (0.2 in its config), not the
    encoder's hidden dropout. Weight paths: `pre_classifier_head/pre_classifier/*`
    and `pre_classifier_head/classifier/*`.
    """

    kind = "pre_classifier"
    layer_name = "pre_classifier_head"
    dropout_rate = 0.2

    def __init__(self, num_labels: int, hidden_size: int, initializer_range: float = 0.02,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.hidden_size = hidden_size
        init = initializer(initializer_range)
        self.pre_classifier = keras.layers.Dense(
            hidden_size, activation="relu", kernel_initializer=init, dtype=self.dtype_policy,
            name="pre_classifier")
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)
        self.classifier = keras.layers.Dense(num_labels, kernel_initializer=init,
                                             dtype=self.dtype_policy, name="classifier")

    @classmethod
    def create(cls, config, num_labels, token_embedding, dtype):
        return cls(num_labels, config.hidden_size, config.initializer_range, dtype=dtype,
                   name=cls.layer_name)

    def build(self, input_shape):
        self.pre_classifier.build(input_shape)
        self.classifier.build((*input_shape[:-1], self.hidden_size))
        self.built = True

    def select(self, outputs, inputs):
        return outputs["sequence_output"][:, 0, :]  # [CLS], no pooler

    def call(self, x, training=None):
        return self.classifier(self.dropout(self.pre_classifier(x), training=training))

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels,
                "hidden_size": self.hidden_size}

    def permute_outputs(self, order: Sequence[int]) -> None:
        _permute_dense(self.classifier, order, self.num_labels)


@register_head
class PreRegressorHead(PreClassifierHead):
    """DistilBERT's head with one output: a score [B, 1] (STS-B)."""

    kind = "pre_regressor"

    @classmethod
    def resolve_num_labels(cls, num_labels, label_names):
        return 1


@register_head
class TokenClassifierHead(_DenseHead):
    """sequence_output [B, L, H] -> dropout -> dense -> tag logits [B, L, num_labels]."""

    kind = "token_classifier"
    layer_name = "token_classifier_head"
    reads = "sequence_output"


@register_head
class SpanHead(_DenseHead):
    """sequence_output [B, L, H] -> dense -> [B, L, 2]: start ([..., 0]) and end
    ([..., 1]) logits of the answer span (BERT's SQuAD head has no dropout)."""

    kind = "span"
    layer_name = "span_head"
    reads = "sequence_output"
    dense_name = "qa_outputs"

    @classmethod
    def resolve_num_labels(cls, num_labels, label_names):
        return 2

    @classmethod
    def create(cls, config, num_labels, token_embedding, dtype):
        return cls(2, 0.0, config.initializer_range, dtype=dtype, name=cls.layer_name)


@register_head
class MaskedLMHead(Head):
    """BERT's MLM head: dense + activation + LayerNorm, decoder tied to the
    token embedding matrix [V, H], plus an output bias [V].

    hidden [B, P, H] (the sequence at `masked_lm_positions`, or every position
    when none are given) -> logits [B, P, V].
    """

    kind = "mlm"
    layer_name = "mlm_head"
    has_labels = False
    build_inputs = {"masked_lm_positions": 1}

    def __init__(self, token_embedding: keras.layers.Embedding, hidden_act: str = "gelu",
                 layer_norm_epsilon: float = 1e-12, initializer_range: float = 0.02,
                 **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.hidden_act = hidden_act
        self.mlm_dense = None
        self.mlm_layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="mlm_layer_norm")
        self.initializer_range = initializer_range

    @classmethod
    def resolve_num_labels(cls, num_labels, label_names):
        return None

    @classmethod
    def create(cls, config, num_labels, token_embedding, dtype):
        return cls(token_embedding, config.hidden_act, config.layer_norm_epsilon,
                   config.initializer_range, dtype=dtype, name=cls.layer_name)

    def build(self, input_shape):
        hidden = input_shape[-1]
        self.mlm_dense = keras.layers.Dense(
            hidden, activation=activation_fn(self.hidden_act),
            kernel_initializer=initializer(self.initializer_range),
            dtype=self.dtype_policy, name="mlm_dense")
        self.mlm_dense.build(input_shape)
        self.mlm_layer_norm.build(input_shape)
        vocab = self.token_embedding.input_dim
        self.output_bias = self.add_weight(name="output_bias", shape=(vocab,),
                                           initializer="zeros")
        self.built = True

    def select(self, outputs, inputs):
        hidden = outputs["sequence_output"]
        positions = inputs.get("masked_lm_positions")
        if positions is None:
            return hidden
        return ops.take_along_axis(
            hidden, ops.expand_dims(ops.cast(positions, "int32"), -1), axis=1)

    def call(self, hidden, training=None):
        x = self.mlm_layer_norm(self.mlm_dense(hidden))
        table = ops.cast(self.token_embedding.embeddings, x.dtype)
        logits = ops.einsum("bph,vh->bpv", x, table)
        return logits + ops.cast(self.output_bias, x.dtype)
