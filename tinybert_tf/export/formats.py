"""The export format table: every way a task model leaves the package, in one place.

Each `ExportFormat` says where its artefact goes under the export folder, how
to write it, how to run it back on the dev set (for the parity check), and
how to time it at a fixed batch (for `bin/benchmark`). `bin/export`,
`bin/benchmark`, the pipeline's export stage, `export_all` (and its clean-up
of artefacts from formats not exported this time) and the `--export_formats`
flag all read `FORMATS`; a new format is one `register_format(...)` call.

  saved_model    TF Serving SavedModel, raw text in (saved_model.py)
  float32 ...    TFLite flavours for Android (tflite.py FLAVOURS)
  hf             a Hugging Face BERT directory (models/hf_io.py)
  keras_hub      a keras-hub preset directory (models/keras_hub_io.py)
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf.export import tflite as tfl
from tinybert_tf.export.common import ExportError, keras_outputs
from tinybert_tf.export.saved_model import IDS_SIGNATURE, TEXT_SIGNATURE, export_saved_model
from tinybert_tf.models.checkpoint import load_model
from tinybert_tf.models.encoder import INPUT_NAMES
from tinybert_tf.models.hf_io import export_hf
from tinybert_tf.models.keras_hub_io import export_keras_hub
from tinybert_tf.tasks import TaskType


@dataclasses.dataclass
class ExportContext:
    """What writing and checking an export needs.

    dev_inputs: packed dev inputs, int32 [N, L] each; dev_a / dev_b: the same
    examples as text; representative: packed calibration inputs (int8) or None.
    """

    model: Any
    task: TaskType
    max_seq_len: int
    is_pair: bool
    dev_a: list[str]
    dev_b: Optional[list[str]]
    dev_inputs: dict[str, np.ndarray]
    representative: Optional[dict[str, np.ndarray]] = None
    num_threads: Optional[int] = None


@dataclasses.dataclass
class Loaded:
    """An artefact loaded back: `predict()` gives the dev outputs in the task's
    output space (probabilities, score, ...); `one()` runs one batch-1 call."""

    predict: Callable[[], np.ndarray]
    one: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """One row of the format table (see the module docstring).

    write(ctx, path) -> path written; load(ctx, path) -> Loaded;
    timer(model, work_dir, seq_len, batch) -> fn(inputs) for bin/benchmark (None:
    not benchmarked); calibrated: needs representative task text.
    """

    name: str
    artefact: str
    write: Callable[[ExportContext, str], str]
    load: Callable[[ExportContext, str], Loaded]
    description: str
    timer: Optional[Callable[[Any, str, int, int], Callable[[dict], Any]]] = None
    calibrated: bool = False


FORMATS: dict[str, ExportFormat] = {}


def register_format(fmt: ExportFormat) -> ExportFormat:
    FORMATS[fmt.name] = fmt
    return fmt


def format_names() -> tuple[str, ...]:
    return tuple(FORMATS)


def check_formats(formats: Sequence[str], flag: str = "--export_formats") -> tuple[str, ...]:
    """Validate format names; returns them de-duplicated, in the given order."""
    if isinstance(formats, str):
        formats = [f for f in formats.split(",") if f.strip()]
    out: list[str] = []
    for name in formats:
        name = name.strip()
        if name not in FORMATS:
            raise ExportError(f"{flag}: unknown export format {name!r}; use any of "
                              f"{', '.join(FORMATS)}.")
        if name not in out:
            out.append(name)
    if not out:
        raise ExportError(f"{flag}: no export format given; use any of {', '.join(FORMATS)}.")
    return tuple(out)


# --- SavedModel --------------------------------------------------------------------

def _write_saved_model(ctx: ExportContext, path: str) -> str:
    return export_saved_model(ctx.model, path, ctx.max_seq_len, ctx.is_pair, task=ctx.task)


def _load_saved_model(ctx: ExportContext, path: str) -> Loaded:
    loaded = tf.saved_model.load(path)
    key = ctx.task.output_name
    if not ctx.task.parity_through_text:
        fn_ids = loaded.signatures[IDS_SIGNATURE]

        def run_ids(x):
            out = fn_ids(**{k: tf.constant(x[k]) for k in INPUT_NAMES})[key].numpy()
            return out.reshape(len(x["input_word_ids"]), -1) if out.ndim == 1 else out

        one = {k: v[:1] for k, v in ctx.dev_inputs.items()}
        return Loaded(lambda: run_ids(ctx.dev_inputs), lambda: run_ids(one))
    fn = loaded.signatures[TEXT_SIGNATURE]

    def run(a, b):
        kwargs = {"text": tf.constant(list(a))}
        if b is not None:
            kwargs["text_b"] = tf.constant(list(b))
        out = fn(**kwargs)[key].numpy()
        return out.reshape(len(a), -1) if out.ndim == 1 else out

    def predict():
        n, outs = len(ctx.dev_a), []
        for s in range(0, n, 64):
            outs.append(run(ctx.dev_a[s:s + 64],
                            None if ctx.dev_b is None else ctx.dev_b[s:s + 64]))
        return np.concatenate(outs, 0)

    first_b = None if ctx.dev_b is None else ctx.dev_b[:1]
    return Loaded(predict, lambda: run(ctx.dev_a[:1], first_b))


def _time_saved_model(model, work_dir: str, seq_len: int, batch: int):
    path = export_saved_model(model, os.path.join(work_dir, f"{model.name}_saved_model"),
                              max_seq_len=seq_len)
    fn = tf.saved_model.load(path).signatures[IDS_SIGNATURE]
    return lambda x: fn(**{k: tf.constant(v) for k, v in x.items()})


register_format(ExportFormat(
    "saved_model", "saved_model", _write_saved_model, _load_saved_model,
    "TF Serving SavedModel: raw-text and ids signatures", timer=_time_saved_model))


# --- TFLite flavours ---------------------------------------------------------------

def _tflite_format(flavour: str) -> ExportFormat:
    def write(ctx: ExportContext, path: str) -> str:
        rep = [ctx.representative] if ctx.representative is not None else None
        flat = tfl.convert(ctx.model, flavour, ctx.max_seq_len, rep, task=ctx.task)
        return tfl.write_tflite(flat, path)

    def load(ctx: ExportContext, path: str) -> Loaded:
        runner = tfl.TFLiteRunner(path, num_threads=ctx.num_threads)
        one = {k: v[:1] for k, v in ctx.dev_inputs.items()}
        return Loaded(lambda: ctx.task.from_tflite(runner.predict(ctx.dev_inputs)),
                      lambda: runner(one))

    def timer(model, work_dir: str, seq_len: int, batch: int):
        rep = None
        if tfl.FLAVOURS[flavour].calibrated:
            rep = [_random_ids(model, 8, seq_len)]
        # One conversion per batch size: TFLite graphs have fixed shapes.
        runner = tfl.TFLiteRunner(tfl.convert(model, flavour, seq_len, rep, batch_size=batch),
                                  batch_size=batch)
        return runner

    spec = tfl.FLAVOURS[flavour]
    return ExportFormat(flavour, tfl.tflite_file(flavour), write, load, spec.description,
                        timer=timer, calibrated=spec.calibrated)


def _random_ids(model, batch: int, seq_len: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(99)
    ids = rng.integers(5, model.bert_config.vocab_size, (batch, seq_len)).astype(np.int32)
    return {"input_word_ids": ids, "input_mask": np.ones_like(ids),
            "input_type_ids": np.zeros_like(ids)}


for _flavour in tfl.FLAVOURS:
    register_format(_tflite_format(_flavour))


# --- Model directories of other libraries --------------------------------------------

def _round_trip(ctx: ExportContext, path: str) -> Loaded:
    """Load the directory back with our reader and run it: the check that the
    files hold the same model."""
    model = load_model(path)
    one = {k: v[:1] for k, v in ctx.dev_inputs.items()}
    return Loaded(lambda: keras_outputs(model, ctx.task, ctx.dev_inputs),
                  lambda: keras_outputs(model, ctx.task, one))


register_format(ExportFormat(
    "hf", "hf", lambda ctx, path: export_hf(ctx.model, path), _round_trip,
    "Hugging Face BERT directory (config.json, model.safetensors, vocab.txt)"))
register_format(ExportFormat(
    "keras_hub", "keras_hub",
    lambda ctx, path: export_keras_hub(ctx.model, path, sequence_length=ctx.max_seq_len),
    _round_trip, "keras-hub preset directory (BertTextClassifier / BertBackbone)"))
