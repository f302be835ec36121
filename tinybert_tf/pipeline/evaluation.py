"""Predictions, dev metrics and batch-1 latency of a task model."""
from __future__ import annotations

import time
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from tinybert_tf.data import glue
from tinybert_tf.distill.keras_compat import MultiWorkerBuildMixin
from tinybert_tf.models import BertModel, count_params, flops_per_example
from tinybert_tf.tokenizer import Tokenizer


class ClassifierTrainer(MultiWorkerBuildMixin, keras.Model):
    """Wraps a BertModel with a classifier/regressor head for plain fine-tuning:
    `call` returns only the logits [B, num_labels] so keras losses apply."""

    def __init__(self, bert: BertModel, **kwargs):
        super().__init__(**kwargs)
        self.bert = bert

    def call(self, inputs, training=None):
        logits = self.bert(inputs, training=training)["logits"]
        return keras.ops.cast(logits, "float32")

    def train_step(self, data):
        return self._multi_worker_logs(super().train_step(data))

    def test_step(self, data):
        return self._multi_worker_logs(super().test_step(data))


def _forward_fn(model: BertModel):
    """One traced inference function per model, reused by every evaluation."""
    fn = getattr(model, "_tinybert_logits_fn", None)
    if fn is None:
        @tf.function(reduce_retracing=True)
        def fn(inputs):
            return tf.cast(model(inputs, training=False)["logits"], tf.float32)
        model._tinybert_logits_fn = fn
    return fn


def predict_logits(model: BertModel, dataset: tf.data.Dataset) -> np.ndarray:
    """Logits [N, num_labels] over a dataset of (inputs, labels) batches."""
    forward = _forward_fn(model)
    chunks = [forward(inputs).numpy() for inputs, _ in dataset]
    return np.concatenate(chunks, axis=0) if chunks else np.zeros((0, model.num_labels))


def task_metrics(task: str, model: BertModel, examples: Sequence[Any], tokenizer: Tokenizer,
                 max_seq_len: int, batch_size: int) -> dict[str, float]:
    """The task's GLUE metrics of `model` on labelled `examples`."""
    spec = glue.get_task(task)
    dataset = glue.make_dataset(examples, tokenizer, max_seq_len, batch_size)
    logits = predict_logits(model, dataset)
    preds = logits[:, 0] if spec.is_regression else logits.argmax(-1)
    labels = np.array([ex.label for ex in examples])
    return {k: float(v) for k, v in glue.compute_metrics(task, preds, labels).items()}


def latency_ms(model: BertModel, max_seq_len: int, runs: int = 30) -> float:
    """Median wall time of one batch-1 forward pass at `max_seq_len`, in ms."""
    inputs = {
        "input_word_ids": tf.ones((1, max_seq_len), tf.int32),
        "input_mask": tf.ones((1, max_seq_len), tf.int32),
        "input_type_ids": tf.zeros((1, max_seq_len), tf.int32),
    }

    @tf.function
    def forward(x):
        out = model(x, training=False)
        return out["logits"] if "logits" in out else out["sequence_output"]

    for _ in range(3):
        forward(inputs).numpy()
    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        forward(inputs).numpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000.0)


def model_facts(model: BertModel, max_seq_len: int, latency_runs: int) -> dict[str, Any]:
    """params, FLOPs per example at max_seq_len, batch-1 latency."""
    return {
        "params": count_params(model),
        "params_without_embeddings": count_params(model, exclude_embeddings=True),
        "flops": flops_per_example(model.bert_config, max_seq_len, model.num_labels or 0),
        "latency_ms": latency_ms(model, max_seq_len, latency_runs),
    }
