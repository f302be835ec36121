"""Fake quantisation of the encoder where TFLite's full-integer int8 kernels quantise.

A `BertModel(config, ..., quantization=QuantizationConfig())` (the quantize
stage's student) always computes the integer-friendly trace (`layers.embed` /
`layers.normalize`, the attention mask from a GATHER) and passes every tensor
that TFLite's int8 kernels hold in int8 through TensorFlow's own fake
quantisation ops, so the float model computes what the integer model will:

  kernels      FULLY_CONNECTED weights (Q/K/V with 1/sqrt(d_k) folded into Q,
               attention output, FFN, pooler, head): per output channel,
               symmetric [-127, 127] (`channel_weights`)
  constants    GATHER tables (token, segment, position embeddings), the
               LayerNorm gamma/beta that MUL/ADD read, the attention-mask
               table: per tensor (`tensor_weights`)
  activations  every output of a matmul, ADD, SUB, MUL, MEAN, RSQRT and GELU:
               per tensor, asymmetric, one learnt [min, max] per point
               (`ActivationRanges`); softmax and tanh outputs get the ranges
               their int8 kernels fix ([0, 255/256], [-1, 127/128])

Weight ranges come from the weights themselves at every call (min/max; the
frozen graph folds them to constants). Activation ranges are variables:
`calibrate` sets each to the extremes the float trace reaches on task data,
then training (quantisation-aware distillation) moves them by an exponential
moving average of each batch's range, as Q8BERT and TF-MOT's default
quantizers do, while gradients pass the fake quantisation straight through
(TF's FakeQuant gradient: 1 inside the range, 0 outside).

Frozen, every FakeQuant op carries constant ranges, and the TFLite converter
(`optimizations=[DEFAULT]`, int8 builtins only, no representative data)
quantises each tensor with exactly those ranges (export/tflite.py).

Padded keys: the quantised graph adds a calibrated mask value (not -10000) to
their scores, from a two-entry table [mask_value, 0] gathered by the 0/1 mask:
-(largest spread of real-key scores + `mask_margin`), so the int8 range of the
masked scores keeps resolution for the real ones (see export/tflite.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterable, Iterator

import keras
import numpy as np
import tensorflow as tf

# The ranges TFLite's int8 SOFTMAX and TANH kernels give their outputs
# (scale 1/256, zero point -128; scale 1/128, zero point 0).
SOFTMAX_RANGE = (0.0, 255.0 / 256.0)
TANH_RANGE = (-1.0, 127.0 / 128.0)
MASK_VALUE_FLOAT = -1e4  # the mask value before calibration (layers.MASK_VALUE)


class QuantizationError(ValueError):
    """A model or setting cannot be quantised; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class QuantizationConfig:
    """How the encoder is fake-quantised (stored in a model directory's config.json).

    ema_decay: weight of the old range in each training step's moving average.
    mask_margin: padded keys score `mask_margin` below the lowest real key of a
      row with the widest spread seen in calibration (weight < e^-margin).
    """

    ema_decay: float = 0.99
    mask_margin: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.ema_decay) < 1.0:
            raise QuantizationError(f"quantization ema_decay must be in [0, 1), got "
                                    f"{self.ema_decay!r}.")
        if not float(self.mask_margin) > 0:
            raise QuantizationError(f"quantization mask_margin must be > 0, got "
                                    f"{self.mask_margin!r}.")

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": "int8", **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "quantization") -> \
            "QuantizationConfig":
        data = dict(data)
        scheme = data.pop("scheme", "int8")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if scheme != "int8" or unknown:
            raise QuantizationError(f"{source}: expected scheme 'int8' with keys "
                                    f"{sorted(known)}, got scheme {scheme!r} and unknown "
                                    f"keys {unknown}.")
        return cls(**data)


# --- weights -------------------------------------------------------------------------

def channel_weights(kernel) -> tf.Tensor:
    """kernel [in, out] -> the same, fake-quantised per output channel, symmetric
    int8 [-127, 127] (what TFLite's int8 FULLY_CONNECTED stores)."""
    k = tf.cast(kernel, tf.float32)
    bound = tf.stop_gradient(tf.maximum(tf.reduce_max(tf.abs(k), axis=0), 1e-8))
    return tf.quantization.fake_quant_with_min_max_vars_per_channel(
        k, -bound, bound, num_bits=8, narrow_range=True)


def tensor_weights(values, range_of=None) -> tf.Tensor:
    """A constant (table, gamma, beta) fake-quantised per tensor over its own range,
    or over `range_of`'s (a table it is sliced from); the range includes 0."""
    v = tf.cast(values, tf.float32)
    source = v if range_of is None else tf.cast(range_of, tf.float32)
    lo = tf.stop_gradient(tf.minimum(tf.reduce_min(source), 0.0))
    hi = tf.stop_gradient(tf.maximum(tf.reduce_max(source), 0.0))
    return tf.quantization.fake_quant_with_min_max_vars(v, lo, hi, num_bits=8)


def fixed_range(x, bounds: tuple[float, float]) -> tf.Tensor:
    """x fake-quantised to a range an int8 kernel fixes (softmax, tanh outputs)."""
    return tf.quantization.fake_quant_with_min_max_args(
        tf.cast(x, tf.float32), min=bounds[0], max=bounds[1], num_bits=8)


# --- activations ---------------------------------------------------------------------

class ActivationRanges(keras.layers.Layer):
    """One [min, max] variable per activation point (name -> float32 [2]), plus the
    attention mask value of padded keys; all non-trainable, saved with the model.

    Points are created on the encoder's first call (in its constructor, eagerly);
    a point first met inside a traced function is an error. Their variable paths
    are "<owner>/<name>/<point>" wherever in the encoder a point is met
    (`owner`: the encoder's name).
    """

    def __init__(self, config: QuantizationConfig, owner: str = "", **kwargs):
        kwargs.setdefault("name", "quantization")
        super().__init__(**kwargs)
        self.config = config
        self.owner = owner
        self.points: dict[str, Any] = {}
        # Shape [1], not a scalar: safetensors stores scalars as [1].
        self.mask_value = self.add_weight(
            name="attention_mask_value", shape=(1,), trainable=False, autocast=False,
            initializer=keras.initializers.Constant(MASK_VALUE_FLOAT), aggregation="mean")
        self._calibrating = False
        self._converter_trace = False
        self.built = True

    @contextlib.contextmanager
    def converter_trace(self) -> Iterator[None]:
        """Traces inside leave FULLY_CONNECTED kernels float: the TFLite converter
        quantises them itself, per output channel to max|w|/127, which is what
        `channel_weights` simulates (TF 2.20's converter cannot take a per-channel
        FakeQuant on a matmul kernel: "tfl.transpose op has mismatched quantized axes")."""
        self._converter_trace = True
        try:
            yield
        finally:
            self._converter_trace = False

    @contextlib.contextmanager
    def calibrating(self) -> Iterator[None]:
        """Calls inside record each point's extremes (float trace, no fake quantisation)."""
        self._calibrating = True
        try:
            yield
        finally:
            self._calibrating = False

    def variable(self, name: str):
        if name not in self.points:
            if tf.inside_function():
                raise QuantizationError(
                    f"activation point {name!r} first met inside a traced function; the "
                    "encoder creates its points on its first (eager) call.")
            # Not under the calling layer's name scope: one path per point.
            with keras.name_scope(self.name, caller=self, override_parent=self.owner):
                self.points[name] = self.add_weight(
                    name=name, shape=(2,), initializer="zeros", trainable=False,
                    autocast=False, aggregation="mean")
        return self.points[name]

    def activation(self, name: str, x, training=None):
        """x fake-quantised with point `name`'s range; while training, the range first
        moves towards this batch's (EMA); while calibrating, x passes unchanged and the
        range widens to cover it."""
        var = self.variable(name)
        x32 = tf.cast(x, tf.float32)
        if self._calibrating or training:
            seen = tf.stack([tf.minimum(tf.reduce_min(x32), 0.0),
                             tf.maximum(tf.reduce_max(x32), 0.0)])
            if self._calibrating:
                var.assign(tf.stack([tf.minimum(var[0], seen[0]), tf.maximum(var[1], seen[1])]))
                return x
            d = float(self.config.ema_decay)
            var.assign(d * tf.convert_to_tensor(var) + (1.0 - d) * seen)
        out = tf.quantization.fake_quant_with_min_max_vars(x32, var[0], var[1], num_bits=8,
                                                           name=op_name(name))
        return tf.cast(out, x.dtype)

    def mask_table(self) -> tf.Tensor:
        """[mask_value, 0]: the additive mask of a padded (0) and a real (1) key, as int8
        represents them exactly."""
        table = tf.concat([tf.cast(self.mask_value, tf.float32), tf.zeros((1,))], axis=0)
        return tensor_weights(table)

    def reset(self) -> None:
        for var in self.points.values():
            var.assign(tf.zeros((2,), tf.float32))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "quantization": self.config.to_dict()}


def op_name(point: str) -> str:
    """The FakeQuant op name of activation point `point` (TFLite tensor names keep it)."""
    return "int8_" + point.replace(".", "_")


class Quant:
    """A name scope into `ActivationRanges`, handed down the encoder's layers:
    `act("mean", x, training)` quantises point "<scope>.mean"."""

    def __init__(self, ranges: ActivationRanges, prefix: str = ""):
        self.ranges = ranges
        self.prefix = prefix

    def scope(self, name: str) -> "Quant":
        return Quant(self.ranges, f"{self.prefix}{name}.")

    def act(self, name: str, x, training=None):
        return self.ranges.activation(self.prefix + name, x, training)

    @property
    def converter_trace(self) -> bool:
        """Whether the graph is traced for the TFLite converter (`ActivationRanges.
        converter_trace`)."""
        return self.ranges._converter_trace

    def rows(self, table, ids) -> tf.Tensor:
        """table [V, H] rows at int `ids` [...] -> [..., H], on the table's int8 grid.

        The same values either way: in a converter trace the whole table is
        fake-quantised and then gathered (GATHER reads the int8 table); otherwise
        the gathered rows are (fake quantisation is elementwise), which keeps the
        table's gradient sparse and the step cheap.
        """
        ids = tf.cast(ids, tf.int32)
        if self.converter_trace:
            return tf.gather(tensor_weights(table), ids)
        return tensor_weights(tf.gather(table, ids), range_of=table)

    def kernel(self, kernel) -> tf.Tensor:
        """A FULLY_CONNECTED kernel [in, out]: `channel_weights`, or float in a
        converter trace (the converter quantises it the same way)."""
        if self.converter_trace:
            return tf.cast(kernel, tf.float32)
        return channel_weights(kernel)

    def mask(self, input_mask) -> tf.Tensor:
        """input_mask int [B, L] (1 real, 0 pad) -> additive mask [B, 1, 1, L]."""
        table = self.ranges.mask_table()
        return tf.gather(table, tf.cast(input_mask, tf.int32))[:, None, None, :]


def dense(layer: keras.layers.Dense, x, quant: Quant, training=None) -> tf.Tensor:
    """A Keras Dense layer's maths with int8 weights and activations: x [..., in] ->
    [..., out]. Its activation (tanh, GELU, ...) gets its own point."""
    y = keras.ops.matmul(tf.cast(x, tf.float32), quant.kernel(layer.kernel))
    if layer.bias is not None:
        y = y + tf.cast(layer.bias, tf.float32)
    y = quant.act("dense", y, training)
    activation = layer.activation
    if activation is None or activation is keras.activations.linear:
        return y
    if activation is keras.activations.tanh:
        return fixed_range(keras.activations.tanh(y), TANH_RANGE)
    return quant.act("activation", activation(y), training)


# --- calibration ---------------------------------------------------------------------

def calibrate(model, batches: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Set a quantised `model`'s attention mask value and every activation range from
    the float trace on `batches` (input dicts, int32 [B, L]); two passes: the widest
    spread of real-key scores first, then every point's extremes.

    Returns {"mask_value", "points"}.
    """
    ranges = getattr(model, "quant_ranges", None)
    if ranges is None:
        raise QuantizationError("calibrate: the model is not quantised (build it with "
                                "quantization=QuantizationConfig()).")
    keys = ("input_word_ids", "input_mask", "input_type_ids")
    batches = [{k: tf.constant(np.asarray(b[k], np.int32)) for k in keys} for b in batches]
    if not batches:
        raise QuantizationError("calibrate: no calibration batches (task text is needed).")
    spread = 0.0
    # Eager: a few batches cost less than tracing the int8 graph (hundreds of points).
    with ranges.calibrating():
        for x in batches:
            out = model(x, training=False)
            real = tf.cast(x["input_mask"], tf.bool)[:, None, None, :]
            for scores in out["attention_scores"]:
                s = tf.cast(scores, tf.float32)
                hi = tf.reduce_max(tf.where(real, s, -np.inf), axis=-1)
                lo = tf.reduce_min(tf.where(real, s, np.inf), axis=-1)
                spread = max(spread, float(tf.reduce_max(hi - lo)))
        ranges.mask_value.assign([-(spread + float(ranges.config.mask_margin))])
        ranges.reset()
        for x in batches:
            model(x, training=False)
    return {"mask_value": float(ranges.mask_value.numpy()[0]), "points": len(ranges.points)}


def is_quantized(model) -> bool:
    """Whether `model` is a fake-quantised encoder (built with a QuantizationConfig)."""
    return getattr(model, "quantization", None) is not None


__all__ = ["QuantizationConfig", "QuantizationError", "ActivationRanges", "Quant",
           "calibrate", "channel_weights", "tensor_weights", "fixed_range", "dense",
           "is_quantized"]
