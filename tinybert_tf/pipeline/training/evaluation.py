"""What report.json says of a model besides its dev metrics: size, FLOPs, latency.

(Dev metrics belong to the task type: `Task.type.evaluate`.)
"""
from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from tinybert_tf.models import BertModel, count_params, dummy_inputs, flops_per_example
from tinybert_tf.timing import interleaved_median_ms, median_ms


def _forward(model: BertModel, max_seq_len: int):
    """A blocking batch-1 forward pass of `model` at `max_seq_len` (traced once)."""
    inputs = dummy_inputs(1, max_seq_len)

    @tf.function(autograph=False)
    def forward(x):
        out = model(x, training=False)
        return out["logits"] if "logits" in out else out["sequence_output"]

    return lambda: forward(inputs).numpy()


def latency_ms(model: BertModel, max_seq_len: int, runs: int = 30) -> float:
    """Median wall time of one batch-1 forward pass at `max_seq_len`, in ms."""
    return median_ms(_forward(model, max_seq_len), runs, warmup=3)


def latencies_ms(models: dict[str, BertModel], max_seq_len: int, runs: int = 100
                 ) -> dict[str, float]:
    """Batch-1 latency (median ms) of each model, timed interleaved: one call of each
    per round, so that a machine busy with other work slows every model alike and
    the teacher/student ratio stays meaningful (`timing.interleaved_median_ms`)."""
    return interleaved_median_ms({name: _forward(m, max_seq_len) for name, m in models.items()},
                                 runs, warmup=3)


def latency_conditions(runs: int) -> dict[str, Any]:
    """How the latencies were measured: batch 1, rounds, and TensorFlow's threads
    (0 = TensorFlow's default, one per core)."""
    return {"batch": 1, "rounds": int(runs), "interleaved": True, "cpu_count": os.cpu_count(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}


def model_facts(model: BertModel, max_seq_len: int) -> dict[str, Any]:
    """params and FLOPs per example at max_seq_len (latency: `latencies_ms`)."""
    return {
        "params": count_params(model),
        "params_without_embeddings": count_params(model, exclude_embeddings=True),
        "flops": flops_per_example(model.bert_config, max_seq_len, model.num_labels or 0),
    }
