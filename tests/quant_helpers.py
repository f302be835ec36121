"""Helpers of the int8 tests (test_quantization.py, test_quantize_stage.py): what a
.tflite file's int8 tensors say, and the toy classifier of export_helpers."""
from __future__ import annotations

import numpy as np
from export_helpers import L, fit_toy_classifier, float_ops, toy_task, unique
from tensorflow.lite.python import schema_py_generated as schema_fb
from tensorflow.lite.tools import flatbuffer_utils

__all__ = ["L", "fit_toy_classifier", "float_ops", "toy_task", "unique", "expected_params",
           "activation_params"]


def expected_params(lo: float, hi: float) -> tuple[float, int]:
    """TFLite int8 (scale, zero point) of a FakeQuant range [lo, hi] (8 bits, not
    narrow): scale = (hi - lo) / 255, zero point = round(-128 - lo / scale)."""
    scale = (hi - lo) / 255.0
    return scale, int(np.clip(np.round(-128 - lo / scale), -128, 127))


def activation_params(flat: bytes) -> list[tuple[float, int]]:
    """(scale, zero point) of every per-tensor int8 tensor an operator outputs."""
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    sg = model.subgraphs[0]
    out = []
    for op in sg.operators:
        for i in op.outputs:
            t = sg.tensors[i]
            q = t.quantization
            if t.type == schema_fb.TensorType.INT8 and q is not None and q.scale is not None \
                    and len(q.scale) == 1:
                out.append((float(q.scale[0]), int(q.zeroPoint[0])))
    return out
