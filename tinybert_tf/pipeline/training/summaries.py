"""TensorBoard scalars written one row (a step's logs) per call.

Eager `tf.summary.scalar` builds and runs a small op each call; with a handful
of loss terms logged every step that cost more than the 1-layer student's own
step on a 2-core CPU. `ScalarRows` traces one function per set of names that
writes the whole row, so a step costs one call whatever the number of scalars.
The events are the same as from eager calls: one scalar per name and step.
"""
from __future__ import annotations

from typing import Callable

import tensorflow as tf


class ScalarRows:
    """Writes {name: float} rows to one summary writer (`writer`), one traced call
    per row; a new set of names traces a new function."""

    def __init__(self, writer: tf.summary.SummaryWriter):
        self.writer = writer
        self._functions: dict[tuple[str, ...], Callable] = {}

    def _function(self, names: tuple[str, ...]) -> Callable:
        fn = self._functions.get(names)
        if fn is None:
            @tf.function(autograph=False, input_signature=[
                tf.TensorSpec([], tf.int64), tf.TensorSpec([len(names)], tf.float32)])
            def write(step, values):
                with self.writer.as_default(step=step):
                    for i, name in enumerate(names):
                        tf.summary.scalar(name, values[i])
                return tf.constant(True)
            fn = self._functions[names] = write
        return fn

    def write(self, step: int, row: dict[str, float]) -> None:
        """Writes each value of `row` as the scalar of that name at `step`."""
        names = tuple(sorted(row))
        if names:
            self._function(names)(tf.constant(step, tf.int64),
                                  tf.constant([row[n] for n in names], tf.float32))
