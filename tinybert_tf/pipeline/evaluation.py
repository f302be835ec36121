"""What report.json says of a model besides its dev metrics: size, FLOPs, latency.

(Dev metrics belong to the task type: `Task.type.evaluate`.)
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from tinybert_tf.models import BertModel, count_params, dummy_inputs, flops_per_example
from tinybert_tf.timing import median_ms


def latency_ms(model: BertModel, max_seq_len: int, runs: int = 30) -> float:
    """Median wall time of one batch-1 forward pass at `max_seq_len`, in ms."""
    inputs = dummy_inputs(1, max_seq_len)

    @tf.function(autograph=False)
    def forward(x):
        out = model(x, training=False)
        return out["logits"] if "logits" in out else out["sequence_output"]

    return median_ms(lambda: forward(inputs).numpy(), runs, warmup=3)


def model_facts(model: BertModel, max_seq_len: int, latency_runs: int) -> dict[str, Any]:
    """params, FLOPs per example at max_seq_len, batch-1 latency."""
    return {
        "params": count_params(model),
        "params_without_embeddings": count_params(model, exclude_embeddings=True),
        "flops": flops_per_example(model.bert_config, max_seq_len, model.num_labels or 0),
        "latency_ms": latency_ms(model, max_seq_len, latency_runs),
    }
