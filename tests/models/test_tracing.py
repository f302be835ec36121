"""Inference functions traced once for every input shape (`models.tracing`)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tinybert_tf.models import BertModel
from tinybert_tf.models.tracing import any_shape_function, any_shape_spec
from tinybert_tf.tasks.base import forward_fn


def test_the_spec_keeps_structure_and_dtypes_and_frees_every_dimension():
    spec = any_shape_spec({"a": np.zeros((4, 24), np.int32), "b": tf.zeros([3], tf.float32)})
    assert spec == {"a": tf.TensorSpec([None, None], tf.int32),
                    "b": tf.TensorSpec([None], tf.float32)}


def test_one_trace_serves_every_batch_size_and_length():
    calls = []

    def double(x):
        calls.append(x["ids"].shape.as_list())  # runs once per trace
        return x["ids"] * 2

    fn = any_shape_function(double)
    for shape in [(4, 24), (3, 24), (4, 16), (1, 5)]:
        ids = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
        np.testing.assert_array_equal(fn({"ids": tf.constant(ids)}).numpy(), ids * 2)
    assert calls == [[None, None]]
    assert fn.traced.experimental_get_tracing_count() == 1


def test_a_models_forward_function_gives_its_logits_at_every_shape(tiny_config):
    tf.keras.utils.set_random_seed(3)
    model = BertModel(tiny_config, head="classifier", num_labels=3)
    forward = forward_fn(model)
    assert forward_fn(model) is forward  # one per model
    rng = np.random.default_rng(0)
    for batch, length in [(4, 12), (2, 12), (4, 7)]:
        inputs = {"input_word_ids": rng.integers(1, tiny_config.vocab_size, (batch, length)),
                  "input_mask": np.ones((batch, length)),
                  "input_type_ids": np.zeros((batch, length))}
        inputs = {k: tf.constant(v, tf.int32) for k, v in inputs.items()}
        expected = model(inputs, training=False)["logits"].numpy()
        np.testing.assert_allclose(forward(inputs).numpy(), expected, atol=1e-6)
    assert forward.traced.experimental_get_tracing_count() == 1
