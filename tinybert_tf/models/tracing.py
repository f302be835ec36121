"""Inference functions traced once for every batch size and sequence length.

A forward pass over a dataset meets several input shapes: the full batches, a
smaller last batch, and one sequence length per length bucket. `tf.function` with
`reduce_retracing=True` traces the first shape, then the second, and only then a
graph with the differing dimensions unknown (three traces, each as costly as the
model is deep). `any_shape_function` traces that general graph on the first call
instead, so every later shape reuses it: one trace per function.

Autograph is off: these functions call Keras models (whose `call` autograph never
converts) and a few TensorFlow ops, with no Python control flow on tensors, and
converting the code around them (tensorflow-text's tokenizers, for instance) cost
more than a second in a fresh process.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf


def any_shape_spec(value: Any) -> Any:
    """The nest of TensorSpecs of `value` (tensors or arrays) with every dimension None."""
    return tf.nest.map_structure(
        lambda t: tf.TensorSpec([None] * len(t.shape), tf.as_dtype(t.dtype)), value)


def any_shape_function(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn` (one argument: a nest of tensors) as a tf.function whose first call traces
    it for inputs of that structure and dtypes with unknown dimensions (module
    docstring); later calls of any shape run that graph."""
    traced = tf.function(fn, autograph=False, reduce_retracing=True)

    def call(inputs):
        if not traced.experimental_get_tracing_count():
            traced.get_concrete_function(any_shape_spec(inputs))
        return traced(inputs)

    call.traced = traced  # the tf.function itself, for callers that inspect its traces
    return call
