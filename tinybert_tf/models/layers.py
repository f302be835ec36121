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
from typing import Optional

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from tinybert_tf.models.quantization import (
    SOFTMAX_RANGE,
    Quant,
    dense,
    fixed_range,
    tensor_weights,
)

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


def embed(layer: keras.layers.Embedding, ids, integer_friendly: bool = False,
          quant: Optional[Quant] = None):
    """ids int [B, L] -> [B, L, H]: `layer(ids)`, or with `integer_friendly` the
    same rows by a plain GATHER (from the int8 table, with `quant`).

    Keras's TF `take` first maps negative ids (LESS/ADD/SELECT on int32), which the
    16x8 quantiser cannot calibrate; ids here are never negative. tf.gather and not
    keras.ops because every keras op adds that fix-up.
    """
    if quant is not None:
        return quant.rows(layer.embeddings, ids)
    if not integer_friendly or getattr(layer, "lora_enabled", False) or getattr(
            layer, "quantization_mode", None) is not None:
        return layer(ids)
    return ops.cast(tf.gather(layer.embeddings, ops.cast(ids, "int32")), layer.compute_dtype)


def normalize(layer: keras.layers.LayerNormalization, x, integer_friendly: bool = False,
              quant: Optional[Quant] = None, training=None):
    """x [..., H] -> [..., H]: `layer(x)`, or with `integer_friendly` the same maths
    centred first, for the full-integer TFLite flavours (with `quant`: each op's
    output fake-quantised, gamma and beta int8).

    Keras computes x * (gamma * rsqrt(var)) + (beta - mean * gamma * rsqrt(var)):
    two large terms that cancel (a quantised ADD cannot resolve them) and a NEG
    with no integer kernel. Here: (x - mean) * rsqrt(mean((x - mean)^2) + eps) *
    gamma + beta, squaring by MUL (SQUARED_DIFFERENCE has no int16 kernel).
    """
    if quant is not None:
        return _quantized_normalize(layer, x, quant, training)
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


_RSQRT_FLOOR = 1e-12  # rsqrt 1e6: far above any learnt rsqrt range, so still saturated


def _quantized_normalize(layer: keras.layers.LayerNormalization, x, quant: Quant,
                         training=None):
    """`normalize`'s centred LayerNorm on int8 grids, as TFLite's kernels compute it.

    The variance is a sum of squares by BATCH_MATMUL (c . c, accumulated in int32)
    rather than MUL then MEAN: an int8 MUL rounds every square to the grid of the
    largest one, and with BERT's outlier dimensions most squares become 0 (measured:
    97% in the demo student's embedding LayerNorm). The 1/H of the mean moves into
    gamma: (x - mean) * rsqrt(sum + H * eps) * (gamma * sqrt(H)) + beta, the same
    maths.
    """
    if layer.rms_scaling or tuple(np.atleast_1d(layer.axis)) not in ((-1,), (len(x.shape) - 1,)):
        raise ValueError(f"{layer.name}: only a LayerNorm over the last axis has a "
                         "quantised form.")
    x32 = tf.cast(x, tf.float32)
    width = int(x32.shape[-1])
    mean = quant.act("mean", tf.reduce_mean(x32, axis=-1, keepdims=True), training)
    centred = quant.act("centred", x32 - mean, training)
    rows = tf.reshape(centred, [-1, 1, width])
    squares = tf.matmul(rows, tf.reshape(centred, [-1, width, 1]))  # [N, 1, 1]
    total = quant.act("sum_squares", tf.reshape(squares, tf.shape(mean)), training)
    if layer.epsilon:
        total = quant.act("sum_squares_eps", total + width * layer.epsilon, training)
    # A sum below half an int8 step is 0 on the grid (eps too); RSQRT then saturates
    # to its range's top, in TFLite as here. Outside a converter trace the floor keeps
    # that saturation's gradient 0 instead of 0 * inf = NaN.
    root = tf.math.rsqrt(total if quant.converter_trace
                         else tf.maximum(total, _RSQRT_FLOOR))
    out = quant.act("normalized", centred * quant.act("rsqrt", root, training), training)
    scale = math.sqrt(width) * (tf.cast(layer.gamma, tf.float32) if layer.gamma is not None
                                else tf.ones((width,)))
    out = quant.act("scaled", out * tensor_weights(scale), training)
    if layer.beta is not None:
        out = quant.act("output", out + tensor_weights(layer.beta), training)
    return tf.cast(out, layer.compute_dtype)


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

    def call(self, x, input_mask, training=None, mask_value: float = MASK_VALUE,
             quant: Optional[Quant] = None):
        """x: [B, L, H]; input_mask: [B, L] (1 real, 0 pad).

        mask_value: added to the scores of padded keys before the softmax.
        quant: the int8 trace (`_quantized_call`; its own calibrated mask value).
        Returns (output [B, L, H], scores [B, heads, L, L], (q, k, v)) where scores
        are QK^T/sqrt(d_k) before any mask is added and q, k, v are the per-head
        projections [B, L, heads, d_k] (MiniLM's relations are built on them).
        """
        if quant is not None:
            return self._quantized_call(x, input_mask, quant, training)
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

    def _quantized_call(self, x, input_mask, quant: Quant, training=None):
        """`call`'s maths as TFLite's int8 kernels compute it: Q/K/V and the output as
        FULLY_CONNECTED with int8 kernels ([H, heads * d_k], 1/sqrt(d_k) folded into
        Q), every matmul, the masked scores and the context on their int8 grids, the
        softmax on its fixed one, the padded keys' mask from `quant.mask`."""
        x = tf.cast(x, tf.float32)
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        width = self.num_heads * self.head_size

        def project(layer, name, scale=1.0):
            kernel = tf.reshape(tf.cast(layer.kernel, tf.float32), [-1, width]) * scale
            bias = tf.reshape(tf.cast(layer.bias, tf.float32), [width]) * scale
            y = quant.act(name, ops.matmul(x, quant.kernel(kernel)) + bias, training)
            return tf.reshape(y, [batch, length, self.num_heads, self.head_size])

        q = project(self.query, "query", 1.0 / math.sqrt(self.head_size))
        k = project(self.key, "key")
        v = project(self.value, "value")
        scores = quant.act("scores", tf.einsum("bqhd,bkhd->bhqk", q, k), training)
        masked = quant.act("masked_scores", scores + quant.mask(input_mask), training)
        probs = fixed_range(tf.nn.softmax(masked, axis=-1), SOFTMAX_RANGE)
        probs = self.dropout(probs, training=training)
        context = quant.act("context", tf.einsum("bhqk,bkhd->bqhd", probs, v), training)
        out = self.attention_output
        kernel = tf.reshape(tf.cast(out.kernel, tf.float32), [width, -1])
        y = ops.matmul(tf.reshape(context, [batch, length, width]), quant.kernel(kernel))
        y = quant.act("output", y + tf.cast(out.bias, tf.float32), training)
        dtype = self.compute_dtype
        # q without the folded 1/sqrt(d_k), as `call` returns it.
        qkv = tuple(tf.cast(t, dtype) for t in (q * math.sqrt(self.head_size), k, v))
        return tf.cast(y, dtype), tf.cast(scores, dtype), qkv

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
             integer_friendly: bool = False, quant: Optional[Quant] = None):
        """x: [B, L, H] -> (y [B, L, H], scores [B, heads, L, L], (q, k, v) each
        [B, L, heads, d_k]).

        integer_friendly: LayerNorms by `normalize` (same maths; full-integer export).
        quant: the int8 trace (`_quantized_call`).
        """
        if quant is not None:
            return self._quantized_call(x, input_mask, quant, training)
        attn, scores, qkv = self.self_attention_layer(x, input_mask, training=training,
                                                 mask_value=mask_value)
        x = normalize(self.self_attention_layer_norm,
                      x + self.self_attention_dropout(attn, training=training),
                      integer_friendly)
        ffn = self.feedforward_output_dense(self.feedforward_intermediate_dense(x))
        x = normalize(self.feedforward_layer_norm,
                      x + self.feedforward_dropout(ffn, training=training), integer_friendly)
        return x, scores, qkv

    def _quantized_call(self, x, input_mask, quant: Quant, training=None):
        """`call` on int8 grids: attention, residual sums, LayerNorms and the FFN
        (its GELU output included) each fake-quantised where TFLite quantises."""
        attn, scores, qkv = self.self_attention_layer(x, input_mask, training=training,
                                                      quant=quant.scope("attention"))
        x = quant.act("attention_residual",
                      x + self.self_attention_dropout(attn, training=training), training)
        x = normalize(self.self_attention_layer_norm, x, quant=quant.scope("attention_norm"),
                      training=training)
        ffn = dense(self.feedforward_intermediate_dense, x, quant.scope("intermediate"),
                    training)
        ffn = dense(self.feedforward_output_dense, ffn, quant.scope("output"), training)
        x = quant.act("output_residual", x + self.feedforward_dropout(ffn, training=training),
                      training)
        x = normalize(self.feedforward_layer_norm, x, quant=quant.scope("output_norm"),
                      training=training)
        return x, scores, qkv

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads,
                "head_size": self.head_size, "intermediate_size": self.intermediate_size,
                "hidden_act": self.hidden_act, "dropout": self.dropout_rate,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range}
