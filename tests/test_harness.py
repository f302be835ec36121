"""What tests/conftest.py sets in every test process, and that errors still read well
under it."""
from __future__ import annotations

import os

import pytest
import tensorflow as tf


def _mul_op(graph: tf.Graph) -> tf.Operation:
    return next(op for op in graph.get_operations() if op.type == "Mul")


@pytest.mark.skipif(os.environ.get("TINYBERT_TEST_OP_TRACEBACKS") == "1",
                    reason="op tracebacks asked for")
def test_graph_ops_built_in_test_processes_record_no_python_stack():
    """conftest's `_stop_recording_op_tracebacks` (it says why); if a TensorFlow upgrade
    moves the argument it sets, this fails rather than the suite silently slowing down."""
    graph = tf.function(lambda x: x * 2.0).get_concrete_function(tf.TensorSpec([2])).graph
    assert _mul_op(graph).traceback is None  # as for the ops of a loaded SavedModel


def test_an_op_error_in_a_traced_function_is_still_tensorflows_error_naming_the_op():
    """Without op stacks an error raised by a graph op keeps its type and names the op
    (TensorFlow's error messages read a missing stack as they do a loaded graph's)."""
    @tf.function
    def pick(x, i):
        return tf.gather(x, i, name="pick_row")

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)pick_row.*indices\[0\] = 7"):
        pick(tf.constant([1.0, 2.0]), tf.constant([7]))
