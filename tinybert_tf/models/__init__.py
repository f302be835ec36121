"""Encoder, heads and checkpoint I/O."""
from tinybert_tf.models.encoder import (
    INPUT_NAMES,
    BertModel,
    count_params,
    dummy_inputs,
    flops_per_example,
)

__all__ = ["INPUT_NAMES", "BertModel", "count_params", "dummy_inputs", "flops_per_example"]
