"""Building blocks of the post-LayerNorm BERT encoder.

Layer and variable names mirror keras-hub's `BertBackbone` / `TransformerEncoder`
(`token_embedding`, `position_embedding`, `segment_embedding`,
`embeddings_layer_norm`, `transformer_layer_{i}/self_attention_layer/{query,key,
value,attention_output}`, `self_attention_layer_norm`,
`feedforward_intermediate_dense`, `feedforward_output_dense`,
`feedforward_layer_norm`, `pooled_dense`) with the same kernel shapes, so weights
copy between the two by path. We write our own attention instead of using
`keras.layers.MultiHeadAttention` because distillation needs the raw
pre-softmax scores QK^T/sqrt(d_k) without the mask, which MHA does not return.
"""
from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops

# Added to the scores of padded keys before the softmax. The softmax runs in
# float32, and -1e4 is finite in float16 (max 65504) and bfloat16 alike, so a
# mixed-precision model never produces inf - inf = nan here.
MASK_VALUE = -1e4


def activation_fn(name: str):
    """The feed-forward activation for a `BertConfig.hidden_act` name."""
    if name == "gelu":
        return lambda x: keras.activations.gelu(x, approximate=False)
    if name == "gelu_tanh":
        return lambda x: keras.activations.gelu(x, approximate=True)
    if name == "relu":
        return keras.activations.relu
    raise ValueError(f"unknown activation {name!r}")


def initializer(stddev: float) -> keras.initializers.Initializer:
    return keras.initializers.TruncatedNormal(stddev=stddev)


def embed(layer: keras.layers.Embedding, ids, integer_friendly: bool = False):
    """ids int [B, L] -> [B, L, H]: `layer(ids)`, or with `integer_friendly` the
    same rows by a plain GATHER.

    Keras's TF `take` first maps negative ids (LESS/ADD/SELECT on int32), which the
    16x8 quantiser cannot calibrate; ids here are never negative. tf.gather and not
    keras.ops because every keras op adds that fix-up.
    """
    if not integer_friendly or getattr(layer, "lora_enabled", False) or getattr(
            layer, "quantization_mode", None) is not None:
        return layer(ids)
    return ops.cast(tf.gather(layer.embeddings, ops.cast(ids, "int32")), layer.compute_dtype)


def normalize(layer: keras.layers.LayerNormalization, x, integer_friendly: bool = False):
    """x [..., H] -> [..., H]: `layer(x)`, or with `integer_friendly` the same maths
    centred first, for the full-integer TFLite flavours.

    Keras computes x * (gamma * rsqrt(var)) + (beta - mean * gamma * rsqrt(var)):
    two large terms that cancel (a quantised ADD cannot resolve them) and a NEG
    with no integer kernel. Here: (x - mean) * rsqrt(mean((x - mean)^2) + eps) *
    gamma + beta, squaring by MUL (SQUARED_DIFFERENCE has no int16 kernel).
    """
    if (not integer_friendly or layer.rms_scaling
            or tuple(np.atleast_1d(layer.axis)) not in ((-1,), (len(x.shape) - 1,))):
        return layer(x)
    x32 = ops.cast(x, "float32")
    centred = x32 - ops.mean(x32, axis=-1, keepdims=True)
    out = centred * ops.rsqrt(ops.mean(centred * centred, axis=-1, keepdims=True)
                              + layer.epsilon)
    if layer.gamma is not None:
        out = out * ops.cast(layer.gamma, "float32")
    if layer.beta is not None:
        out = out + ops.cast(layer.beta, "float32")
    return ops.cast(out, layer.compute_dtype)


class PositionEmbedding(keras.layers.Layer):
    """Learned absolute position embeddings: weight `embeddings` [max_len, H]."""

    def __init__(self, sequence_length: int, initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = sequence_length
        self.initializer_range = initializer_range

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.sequence_length, input_shape[-1]),
            initializer=initializer(self.initializer_range))
        self.built = True

    def call(self, x):
        """x: [B, L, H] token embeddings -> [1, L, H] position embeddings."""
        length = ops.shape(x)[1]
        return ops.expand_dims(ops.cast(self.embeddings[:length], x.dtype), 0)

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length,
                "initializer_range": self.initializer_range}


class SelfAttention(keras.layers.Layer):
    """Multi-head self-attention that also returns the raw scores.

    Kernels follow keras `MultiHeadAttention`: query/key/value [H, heads, d_k]
    with bias [heads, d_k]; attention_output [heads, d_k, H] with bias [H].
    """

    def __init__(self, num_heads: int, head_size: int, dropout: float = 0.0,
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_size = head_size
        self.dropout_rate = dropout
        self.initializer_range = initializer_range
        # One initializer object per projection: an unseeded Keras 3 initializer
        # returns the same values on every call, so a shared one would start
        # Q, K and V with identical kernels.
        proj = dict(equation="abc,cde->abde", output_shape=(None, num_heads, head_size),
                    bias_axes="de", dtype=self.dtype_policy)
        self.query = keras.layers.EinsumDense(
            name="query", kernel_initializer=initializer(initializer_range), **proj)
        self.key = keras.layers.EinsumDense(
            name="key", kernel_initializer=initializer(initializer_range), **proj)
        self.value = keras.layers.EinsumDense(
            name="value", kernel_initializer=initializer(initializer_range), **proj)
        self.attention_output = None  # built once the width is known
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        hidden = input_shape[-1]
        self.query.build(input_shape)
        self.key.build(input_shape)
        self.value.build(input_shape)
        self.attention_output = keras.layers.EinsumDense(
            "abcd,cde->abe", output_shape=(None, hidden), bias_axes="e",
            kernel_initializer=initializer(self.initializer_range),
            dtype=self.dtype_policy, name="attention_output")
        self.attention_output.build((input_shape[0], input_shape[1], self.num_heads,
                                     self.head_size))
        self.built = True

    def call(self, x, input_mask, training=None, mask_value: float = MASK_VALUE):
        """x: [B, L, H]; input_mask: [B, L] (1 real, 0 pad).

        mask_value: added to the scores of padded keys before the softmax.
        Returns (output [B, L, H], scores [B, heads, L, L], (q, k, v)) where scores
        are QK^T/sqrt(d_k) before any mask is added and q, k, v are the per-head
        projections [B, L, heads, d_k] (MiniLM's relations are built on them).
        """
        q = self.query(x)  # [B, L, h, d]
        k = self.key(x)
        v = self.value(x)
        scores = ops.einsum("bqhd,bkhd->bhqk", q, k) * ops.cast(
            1.0 / math.sqrt(self.head_size), q.dtype)
        # Softmax in float32 with a finite additive mask on padded keys.
        mask = ops.cast(input_mask, "float32")[:, None, None, :]
        probs = ops.softmax(ops.cast(scores, "float32") + (1.0 - mask) * mask_value, axis=-1)
        probs = self.dropout(ops.cast(probs, v.dtype), training=training)
        context = ops.einsum("bhqk,bkhd->bqhd", probs, v)
        return self.attention_output(context), scores, (q, k, v)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads,
                "head_size": self.head_size, "dropout": self.dropout_rate,
                "initializer_range": self.initializer_range}


class TransformerLayer(keras.layers.Layer):
    """One post-LayerNorm BERT layer: attention + residual + LN, FFN + residual + LN."""

    def __init__(self, num_heads: int, head_size: int, intermediate_size: int,
                 hidden_act: str = "gelu", dropout: float = 0.1,
                 attention_dropout: float = 0.1, layer_norm_epsilon: float = 1e-12,
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_size = head_size
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.dropout_rate = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        p = self.dtype_policy
        self.self_attention_layer = SelfAttention(
            num_heads, head_size, attention_dropout, initializer_range, dtype=p,
            name="self_attention_layer")
        self.self_attention_dropout = keras.layers.Dropout(dropout, dtype=p,
                                                           name="self_attention_dropout")
        self.self_attention_layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=p, name="self_attention_layer_norm")
        self.feedforward_intermediate_dense = keras.layers.Dense(
            intermediate_size, activation=activation_fn(hidden_act),
            kernel_initializer=initializer(initializer_range), dtype=p,
            name="feedforward_intermediate_dense")
        self.feedforward_output_dense = None
        self.feedforward_dropout = keras.layers.Dropout(dropout, dtype=p,
                                                        name="feedforward_dropout")
        self.feedforward_layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=p, name="feedforward_layer_norm")

    def build(self, input_shape):
        hidden = input_shape[-1]
        self.self_attention_layer.build(input_shape)
        self.self_attention_layer_norm.build(input_shape)
        self.feedforward_intermediate_dense.build(input_shape)
        self.feedforward_output_dense = keras.layers.Dense(
            hidden, kernel_initializer=initializer(self.initializer_range),
            dtype=self.dtype_policy, name="feedforward_output_dense")
        self.feedforward_output_dense.build((*input_shape[:-1], self.intermediate_size))
        self.feedforward_layer_norm.build(input_shape)
        self.built = True

    def call(self, x, input_mask, training=None, mask_value: float = MASK_VALUE,
             integer_friendly: bool = False):
        """x: [B, L, H] -> (y [B, L, H], scores [B, heads, L, L], (q, k, v) each
        [B, L, heads, d_k]).

        integer_friendly: LayerNorms by `normalize` (same maths; full-integer export).
        """
        attn, scores, qkv = self.self_attention_layer(x, input_mask, training=training,
                                                 mask_value=mask_value)
        x = normalize(self.self_attention_layer_norm,
                      x + self.self_attention_dropout(attn, training=training),
                      integer_friendly)
        ffn = self.feedforward_output_dense(self.feedforward_intermediate_dense(x))
        x = normalize(self.feedforward_layer_norm,
                      x + self.feedforward_dropout(ffn, training=training), integer_friendly)
        return x, scores, qkv

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads,
                "head_size": self.head_size, "intermediate_size": self.intermediate_size,
                "hidden_act": self.hidden_act, "dropout": self.dropout_rate,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range}
