"""TFLite for Android: float32, float16, dynamic-range int8, full-integer int8.

Every flavour has the TFLite Task Library `BertNLClassifier` interface:
inputs `input_word_ids`, `input_mask`, `input_type_ids`, int32 [1, L] (in that
order), and one float32 output named by the task type (`probabilities` [1, C]
for a classifier, `score` [1, 1] for a regressor). `FLAVOURS` is the table of
flavours and their converter settings. The converter names tensors
`serving_default_input_word_ids:0` and orders them alphabetically; we rename
and reorder them in the flatbuffer so the plain names are the tensor names
(the SignatureDef, which refers to tensors by index, stays valid).

The graph is the model at batch 1 and a fixed length, with its variables
frozen to constants first (`convert_variables_to_constants_v2`): handing the
converter a Keras 3 model's live variables leaves READ_VARIABLE ops behind,
which breaks calibration of the int8 flavour.

Full-integer int8 and the attention mask: the encoder adds -10000 to the
scores of padded keys (`layers.MASK_VALUE`, right for float training). In int8
the sum "scores + mask" then spans [-10000, max score], one int8 step is ~40,
and every real score rounds to the same value: attention turns uniform and the
labels are noise (we measured 53% agreement on a toy task). For the int8
flavour only, we trace the graph with a mask value sized from the calibration
data instead (the encoder's `mask_value` call argument): -(max score range
seen + 20), which still gives padded keys a weight below e^-20 of the best
real key while leaving int8 resolution for the real scores (100% agreement on
the same task). The float flavours keep -10000.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from tensorflow.lite.tools import flatbuffer_utils
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tinybert_tf.export.common import ExportError, check_seq_len, export_task
from tinybert_tf.files import write_bytes_atomic
from tinybert_tf.models.encoder import INPUT_NAMES, BertModel
from tinybert_tf.models.layers import MASK_VALUE
from tinybert_tf.tasks import TaskType


@dataclasses.dataclass(frozen=True)
class Flavour:
    """A TFLite flavour: how the converter is set up, and whether it needs
    representative task text to calibrate activation ranges."""

    description: str
    configure: Callable[[Any, Optional[list]], None]
    calibrated: bool = False


def _float32(converter, rows) -> None:
    """No optimisation: the float graph as is."""


def _float16(converter, rows) -> None:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]


def _dynamic_int8(converter, rows) -> None:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]


def _int8(converter, rows) -> None:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(rows)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    # The ids stay int32 and the probabilities float32: the Task Library
    # feeds int32 ids and reads float scores.


FLAVOURS: dict[str, Flavour] = {
    "float32": Flavour("TFLite float32", _float32),
    "float16": Flavour("TFLite with float16 weights", _float16),
    "dynamic_int8": Flavour("TFLite with int8 weights, float activations", _dynamic_int8),
    "int8": Flavour("TFLite full-integer int8 (calibrated)", _int8, calibrated=True),
}


def tflite_file(flavour: str) -> str:
    return f"model_{flavour}.tflite"


MASK_MARGIN = 20.0  # padded keys get weight < e^-20 of the best real key


def calibrated_mask_value(model: BertModel, rows: Sequence[dict[str, np.ndarray]],
                          batch_size: int = 64) -> float:
    """-(largest spread of real-key attention scores in `rows` + MASK_MARGIN).

    Spread = max - min of QK^T/sqrt(d_k) over real query/key positions of one
    example and head, maximised over examples, heads and layers.
    """
    spread = 0.0
    keys = INPUT_NAMES
    data = {k: np.concatenate([r[k] for r in rows], 0) for k in keys}
    for s in range(0, len(data[keys[0]]), batch_size):
        batch = {k: tf.constant(v[s:s + batch_size]) for k, v in data.items()}
        out = model(batch, training=False)
        real = tf.cast(batch["input_mask"], tf.bool)[:, None, None, :]
        for scores in out["attention_scores"]:
            scores = tf.cast(scores, tf.float32)
            hi = tf.reduce_max(tf.where(real, scores, -np.inf), axis=-1)
            lo = tf.reduce_min(tf.where(real, scores, np.inf), axis=-1)
            spread = max(spread, float(tf.reduce_max(hi - lo)))
    return -(spread + MASK_MARGIN)


def model_function(model: BertModel, max_seq_len: int, batch_size: int = 1,
                   mask_value: Optional[float] = None, task: Optional[TaskType] = None):
    """A frozen concrete function: 3 x int32 [batch, L] -> the task's TFLite outputs.

    mask_value: the additive attention mask to trace with (None: the encoder's).
    """
    task = export_task(model, task)
    value = MASK_VALUE if mask_value is None else float(mask_value)
    spec = [tf.TensorSpec([batch_size, max_seq_len], tf.int32, name=n) for n in INPUT_NAMES]

    @tf.function(input_signature=spec)
    def predict(input_word_ids, input_mask, input_type_ids):
        inputs = {"input_word_ids": input_word_ids, "input_mask": input_mask,
                  "input_type_ids": input_type_ids}
        logits = tf.cast(model(inputs, training=False, mask_value=value)["logits"], tf.float32)
        return task.tflite_outputs(logits)

    return convert_variables_to_constants_v2(predict.get_concrete_function())


def convert(model: BertModel, fmt: str, max_seq_len: int,
            representative: Optional[Iterable[dict[str, np.ndarray]]] = None,
            batch_size: int = 1, task: Optional[TaskType] = None) -> bytes:
    """Convert `model` to one TFLite flavour; returns the flatbuffer bytes.

    Args:
      fmt: float32 | float16 | dynamic_int8 | int8.
      max_seq_len: the fixed sequence length L of the inputs.
      representative: for int8, packed inputs (dicts of int32 [N, L]) of real
        task text used to calibrate activation ranges.
      batch_size: the fixed batch of the inputs (1 for Android / the Task
        Library; larger only for throughput benchmarks: TFLite graphs cannot be
        resized afterwards, their reshapes are fixed at conversion).
    """
    if fmt not in FLAVOURS:
        raise ExportError(f"unknown TFLite format {fmt!r}; use one of {', '.join(FLAVOURS)}.")
    flavour = FLAVOURS[fmt]
    task = export_task(model, task)
    max_seq_len = check_seq_len(model, max_seq_len)
    rows, mask_value = None, None
    if flavour.calibrated:
        rows = _representative_rows(representative, max_seq_len, batch_size)
        mask_value = calibrated_mask_value(model, rows)
    fn = model_function(model, max_seq_len, batch_size, mask_value=mask_value, task=task)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn], tf.Module())
    flavour.configure(converter, rows)
    flat = converter.convert()
    return name_io(flat, list(task.tflite_outputs_names()))


def _representative_rows(representative, max_seq_len: int, batch_size: int = 1
                         ) -> list[dict[str, np.ndarray]]:
    """Split packed inputs into [batch_size, L] rows for calibration (cycling
    examples to fill the last one); empty -> ExportError."""
    flat = []
    for batch in representative or ():
        n = len(batch["input_word_ids"])
        for i in range(n):
            row = {k: np.asarray(batch[k][i:i + 1], np.int32) for k in INPUT_NAMES}
            if row["input_word_ids"].shape != (1, max_seq_len):
                raise ExportError(f"representative inputs have shape "
                                  f"{row['input_word_ids'].shape}, expected (1, {max_seq_len}).")
            flat.append(row)
    rows = []
    for s in range(0, len(flat), batch_size):
        chunk = [flat[(s + j) % len(flat)] for j in range(batch_size)]
        rows.append({k: np.concatenate([r[k] for r in chunk], 0) for k in INPUT_NAMES})
    if not rows:
        raise ExportError("int8 export needs a representative data set of task text to "
                          "calibrate activations, and got none: pass representative_texts "
                          "(bin/export: --data_dir with train/dev text, "
                          "--representative_examples > 0), or drop int8 from "
                          "--export_formats.")
    return rows


def name_io(flat: bytes, out_names: Union[str, Sequence[str]]) -> bytes:
    """Rename the inputs to INPUT_NAMES (in that order) and the outputs to `out_names`
    (the keys the traced function returned, in that order)."""
    out_names = [out_names] if isinstance(out_names, str) else list(out_names)

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    if len(model.subgraphs) != 1:
        raise ExportError(f"expected one TFLite subgraph, got {len(model.subgraphs)}.")
    sg = model.subgraphs[0]
    by_name = {}
    for idx in sg.inputs:
        name = sg.tensors[idx].name.decode()
        match = [n for n in INPUT_NAMES if name == n or name.endswith("_" + n + ":0")
                 or name.startswith(n + ":")]
        if len(match) != 1:
            raise ExportError(f"unexpected TFLite input tensor {name!r}.")
        by_name[match[0]] = idx
    if sorted(by_name) != sorted(INPUT_NAMES) or len(sg.outputs) != len(out_names):
        raise ExportError(f"TFLite model has inputs {sorted(by_name)} and "
                          f"{len(sg.outputs)} outputs; expected {INPUT_NAMES} and "
                          f"{len(out_names)}.")
    for n, idx in by_name.items():
        sg.tensors[idx].name = n.encode()
    sg.inputs = np.array([by_name[n] for n in INPUT_NAMES], dtype=np.int32)
    # The SignatureDef maps the function's output keys to tensors.
    by_key = {}
    for sig in model.signatureDefs or []:
        for out in sig.outputs:
            by_key[out.name.decode() if isinstance(out.name, bytes) else out.name] = \
                out.tensorIndex
    generic = [f"output_{i}" for i in range(len(sg.outputs))]
    if sorted(by_key) == sorted(generic) or not by_key:
        # A frozen function's outputs lose their keys: they come in tf.nest's flat
        # order, i.e. sorted by key.
        flat = [by_key[g] for g in generic] if by_key else list(sg.outputs)
        by_key = dict(zip(sorted(out_names), flat))
    missing = [n for n in out_names if n not in by_key]
    if missing:
        raise ExportError(f"TFLite signature lacks outputs {missing}; has {sorted(by_key)}.")
    for n in out_names:
        sg.tensors[by_key[n]].name = n.encode()
    sg.outputs = np.array([by_key[n] for n in out_names], dtype=np.int32)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


class TFLiteRunner:
    """Runs a converted model with ai-edge-litert's Interpreter.

    Args:
      model: a .tflite path or its bytes.
      batch_size: rows per call; must equal the batch the model was converted
        at (TFLite cannot resize our graphs: their reshapes are fixed).
      num_threads: CPU threads for the interpreter (XNNPACK); None = all cores.
    """

    def __init__(self, model: Union[str, bytes], batch_size: int = 1,
                 num_threads: Optional[int] = None):
        from ai_edge_litert.interpreter import Interpreter

        kwargs = {"model_path": model} if isinstance(model, str) else {"model_content": model}
        # The interpreter's own default is one thread; a 2-core box runs the
        # student ~1.9x faster with both (measured: 20.4 -> 11.1 ms, seq 128).
        self.num_threads = int(num_threads or os.cpu_count() or 1)
        self.interpreter = Interpreter(num_threads=self.num_threads, **kwargs)
        details = {d["name"]: d for d in self.interpreter.get_input_details()}
        missing = [n for n in INPUT_NAMES if n not in details]
        if missing:
            raise ExportError(f"TFLite model lacks input tensors {missing}; got {sorted(details)}.")
        self.input_index = {n: details[n]["index"] for n in INPUT_NAMES}
        self.seq_len = int(details[INPUT_NAMES[0]]["shape"][1])
        self.batch_size = int(details[INPUT_NAMES[0]]["shape"][0])
        if batch_size != self.batch_size:
            raise ExportError(f"this TFLite model was converted for batch {self.batch_size}, "
                              f"not {batch_size}; convert(..., batch_size={batch_size}).")
        self.interpreter.allocate_tensors()
        outputs = self.interpreter.get_output_details()
        self.output_index = {d["name"]: d["index"] for d in outputs}
        self.output_names = [d["name"] for d in outputs]

    def __call__(self, inputs: dict[str, np.ndarray]) -> Union[np.ndarray, dict]:
        """One batch of exactly batch_size rows: int32 [B, L] each -> the output
        ([B, C] for a classifier), or {name: output} when the model has several."""
        for n, idx in self.input_index.items():
            self.interpreter.set_tensor(idx, np.asarray(inputs[n], np.int32))
        self.interpreter.invoke()
        outs = {n: np.array(self.interpreter.get_tensor(i)) for n, i in self.output_index.items()}
        return outs[self.output_names[0]] if len(outs) == 1 else outs

    def predict(self, inputs: dict[str, np.ndarray]) -> Union[np.ndarray, dict]:
        """Any number of rows [N, L] -> [N, ...] (or {name: [N, ...]}), run batch_size
        rows at a time (the last batch padded with copies of its first row)."""
        n = len(inputs[INPUT_NAMES[0]])
        outs = []
        for s in range(0, n, self.batch_size):
            chunk = {k: np.asarray(v[s:s + self.batch_size]) for k, v in inputs.items()}
            m = len(chunk[INPUT_NAMES[0]])
            if m < self.batch_size:
                chunk = {k: np.concatenate([v, np.repeat(v[:1], self.batch_size - m, 0)])
                         for k, v in chunk.items()}
            out = self(chunk)
            outs.append({k: v[:m] for k, v in out.items()} if isinstance(out, dict)
                        else out[:m])
        if not outs:
            return np.zeros((0, 0), np.float32)
        if isinstance(outs[0], dict):
            return {k: np.concatenate([o[k] for o in outs], 0) for k in outs[0]}
        return np.concatenate(outs, 0)


def tensor_types(flat: Union[str, bytes]) -> dict[str, int]:
    """How many tensors of each type the model holds (e.g. to see int8 coverage)."""

    if isinstance(flat, str):
        with open(flat, "rb") as f:
            flat = f.read()
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    counts: dict[str, int] = {}
    for t in model.subgraphs[0].tensors:
        name = flatbuffer_utils.type_to_name(t.type)
        counts[name] = counts.get(name, 0) + 1
    return counts


def operators(flat: Union[str, bytes]) -> list[str]:
    """Sorted builtin/custom operator names used by the model."""

    if isinstance(flat, str):
        with open(flat, "rb") as f:
            flat = f.read()
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    return sorted({flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
                   for op in model.subgraphs[0].operators})


def write_tflite(flat: bytes, path: str) -> str:
    write_bytes_atomic(path, flat)
    return os.path.abspath(path)


__all__: Sequence[str] = ["convert", "TFLiteRunner", "name_io", "model_function",
                          "tensor_types", "operators", "write_tflite"]
