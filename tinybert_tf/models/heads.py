"""Task heads on top of the encoder: classifier, regressor, masked-LM."""
from __future__ import annotations

import keras
from keras import ops

from tinybert_tf.models.layers import activation_fn, initializer

HEAD_TYPES = ("classifier", "regressor", "mlm")


class ClassifierHead(keras.layers.Layer):
    """pooled_output [B, H] -> dropout -> dense -> logits [B, num_labels].

    A regressor is the same head with one output (STS-B).
    """

    def __init__(self, num_labels: int, dropout: float = 0.1,
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.dropout_rate = dropout
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.classifier = keras.layers.Dense(
            num_labels, kernel_initializer=initializer(initializer_range),
            dtype=self.dtype_policy, name="classifier")

    def build(self, input_shape):
        self.classifier.build(input_shape)
        self.built = True

    def call(self, pooled, training=None):
        return self.classifier(self.dropout(pooled, training=training))

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels,
                "dropout": self.dropout_rate}


class MaskedLMHead(keras.layers.Layer):
    """BERT's MLM head: dense + activation + LayerNorm, decoder tied to the
    token embedding matrix [V, H], plus an output bias [V].

    hidden [B, P, H] -> logits [B, P, V].
    """

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

    def call(self, hidden):
        x = self.mlm_layer_norm(self.mlm_dense(hidden))
        table = ops.cast(self.token_embedding.embeddings, x.dtype)
        logits = ops.einsum("bph,vh->bpv", x, table)
        return logits + ops.cast(self.output_bias, x.dtype)
