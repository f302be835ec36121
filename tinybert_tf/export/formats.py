"""The export format table: every way a task model leaves the package, in one place.

Each `ExportFormat` says where its artefact goes under the export folder, how
to write it, how to run it back on the dev set (for the parity check), and
how to time it at a fixed batch (for `bin/benchmark`). `bin/export`,
`bin/benchmark`, the pipeline's export stage, `export_all` (and its clean-up
of artefacts from formats not exported this time) and the `--export_formats`
flag all read `FORMATS`; a new format is one `register_format(...)` call.

  saved_model    TF Serving SavedModel, raw text in (saved_model.py), published as the
                 next version folder serving/<N>/ with warm-up requests and a
                 models.config (serving.py); never rewritten, never removed as stale
  saved_model_ids  the same for token ids only, without tensorflow-text ops (servers
                 that lack them), as serving_ids/<N>/
  float32 ...    TFLite flavours for Android (tflite.py FLAVOURS), with TFLite metadata;
                 text_float32 takes raw strings
  hf             a Hugging Face BERT directory (models/hf_io.py)
  keras_hub      a keras-hub preset directory (models/keras_hub_io.py)
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf import plugins
from tinybert_tf.config import BertConfig
from tinybert_tf.export import serving
from tinybert_tf.export import tflite as tfl
from tinybert_tf.export import tflite_metadata as tm
from tinybert_tf.export.common import ExportError, keras_outputs, output_function
from tinybert_tf.export.saved_model import IDS_SIGNATURE, TEXT_SIGNATURE, export_saved_model
from tinybert_tf.models.checkpoint import load_model, load_tokenizer
from tinybert_tf.models.encoder import INPUT_NAMES
from tinybert_tf.models.hf_io import export_hf
from tinybert_tf.models.keras_hub_io import export_keras_hub, keras_hub_problems
from tinybert_tf.tasks import TaskType


@dataclasses.dataclass
class ExportContext:
    """What writing and checking an export needs.

    dev_inputs: packed dev inputs, int32 [N, L] each; dev_a / dev_b: the same
    examples as text; representative: packed calibration inputs (int8) or None;
    serving_name / serving_version: the TF Serving model name (models.config)
    and an explicit version to publish (None: the next free one); options:
    per-format settings by name (`FORMAT_OPTIONS`), e.g. keras_hub_approximate_gelu;
    quantized: the fake-quantised student (the quantize stage's) that formats with
    `learnt_ranges` convert instead of `model`, or None.
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
    serving_name: str = "tinybert"
    serving_version: Optional[int] = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    quantized: Any = None


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
    not benchmarked); calibrated: needs representative task text; describe(path)
    -> extra parity.json fields of the written artefact; published: the
    artefact holds served versions, so `export_all` never removes it as stale;
    check(config, head, options) -> why a model of that BertConfig and head
    cannot be written in this format (empty: it can), asked before anything is
    written (`export_all`, `bin/export`, `bin/distill --dry_run`).
    learnt_ranges: written from the quantised student when the export has one.
    """

    name: str
    artefact: str
    write: Callable[[ExportContext, str], str]
    load: Callable[[ExportContext, str], Loaded]
    description: str
    timer: Optional[Callable[[Any, str, int, int], Callable[[dict], Any]]] = None
    calibrated: bool = False
    describe: Optional[Callable[[str], dict[str, Any]]] = None
    published: bool = False
    check: Optional[Callable[[BertConfig, Optional[str], Mapping[str, Any]], list[str]]] = None
    learnt_ranges: bool = False


FORMATS: dict[str, ExportFormat] = {}
# Settings of single formats, by name, with their defaults (ExportContext.options).
FORMAT_OPTIONS: dict[str, Any] = {"keras_hub_approximate_gelu": False}


def format_problems(formats: Sequence[str], config: BertConfig, head: Optional[str],
                    options: Optional[Mapping[str, Any]] = None) -> list[str]:
    """Every reason the formats cannot export a model of `config` and `head`, each
    naming its format (empty: all can)."""
    opts = {**FORMAT_OPTIONS, **(options or {})}
    return [f"--export_formats={name}: {problem}" for name in formats
            if name in FORMATS and FORMATS[name].check is not None
            for problem in FORMATS[name].check(config, head, opts)]


def register_format(fmt: ExportFormat, replace: bool = False) -> ExportFormat:
    """Add `fmt` to the table; a name already there is refused unless `replace=True`."""
    return plugins.register(FORMATS, fmt.name, fmt, what="export format", replace=replace)


def format_names() -> tuple[str, ...]:
    return tuple(FORMATS)


def registered_name(name: str) -> str:
    """`name` as its format is registered when they differ only in case or surrounding
    spaces (`HF` -> `hf`, as task names are read); otherwise `name` stripped, for
    `check_formats` to name as unknown."""
    key = name.strip()
    if key in FORMATS:
        return key
    return next((n for n in FORMATS if n.lower() == key.lower()), key)


def check_formats(formats: Sequence[str], flag: str = "--export_formats") -> tuple[str, ...]:
    """Validate format names (`registered_name`: any case); returns them as registered,
    de-duplicated, in the given order."""
    if isinstance(formats, str):
        formats = [f for f in formats.split(",") if f.strip()]
    out: list[str] = []
    for name in formats:
        name = registered_name(name)
        if name not in FORMATS:
            raise ExportError(f"{flag}: unknown export format {name!r}; use any of "
                              f"{', '.join(FORMATS)}.")
        if name not in out:
            out.append(name)
    if not out:
        raise ExportError(f"{flag}: no export format given; use any of {', '.join(FORMATS)}.")
    return tuple(out)


# --- SavedModel --------------------------------------------------------------------

WARMUP_TEXTS = 8  # dev examples in the warm-up requests (batch 8 = all of them)


def _publish(ctx: ExportContext, path: str, text: bool) -> str:
    """Publish the SavedModel as the next version under `path` (the serving root),
    with warm-up requests from the first dev texts, and (re)write models.config.
    text=False: the token-ids servable (`export_saved_model(..., text=False)`)."""
    texts = (ctx.dev_a[:WARMUP_TEXTS] if ctx.dev_b is None
             else list(zip(ctx.dev_a[:WARMUP_TEXTS], ctx.dev_b[:WARMUP_TEXTS])))
    name = ctx.serving_name if text else f"{ctx.serving_name}_ids"
    _, version_dir = serving.publish_version(
        lambda d: export_saved_model(ctx.model, d, ctx.max_seq_len, ctx.is_pair,
                                     task=ctx.task, text=text),
        path, version=ctx.serving_version, warmup_texts=texts,
        tokenizer=load_tokenizer(ctx.model, ctx.max_seq_len),
        text_inputs=[spec.name for spec in ctx.task.text_input_specs(ctx.is_pair)])
    serving.write_models_config(path, name, base_path=f"/models/{name}")
    return version_dir


def _write_saved_model(ctx: ExportContext, path: str) -> str:
    return _publish(ctx, path, text=True)


def _describe_saved_model(path: str) -> dict[str, Any]:
    root = os.path.dirname(path)
    return {"version": int(os.path.basename(path)),
            "versions": sorted(serving.list_versions(root)),
            "models_config": os.path.join(os.path.basename(root), serving.MODELS_CONFIG)}


def serving_model_name(name: Optional[str]) -> str:
    """A TF Serving model name from a task name: "SST-2" -> "sst-2"; None -> "tinybert"."""
    clean = re.sub(r"[^a-z0-9_.-]+", "_", (name or "").lower()).strip("_.-")
    return clean or "tinybert"


def _ids_loaded(ctx: ExportContext, loaded: Any) -> Loaded:
    """The SavedModel's ids signature run on the packed dev inputs."""
    fn_ids, key = loaded.signatures[IDS_SIGNATURE], ctx.task.output_name

    def run_ids(x):
        out = fn_ids(**{k: tf.constant(x[k]) for k in INPUT_NAMES})[key].numpy()
        return out.reshape(len(x["input_word_ids"]), -1) if out.ndim == 1 else out

    one = {k: v[:1] for k, v in ctx.dev_inputs.items()}
    return Loaded(lambda: run_ids(ctx.dev_inputs), lambda: run_ids(one))


def _load_saved_model(ctx: ExportContext, path: str) -> Loaded:
    loaded = tf.saved_model.load(path)
    key = ctx.task.output_name
    if not ctx.task.parity_through_text:
        return _ids_loaded(ctx, loaded)
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
    "saved_model", "serving", _write_saved_model, _load_saved_model,
    "TF Serving SavedModel (raw-text and ids signatures) as version serving/<N>/ with "
    "warm-up requests and models.config", timer=_time_saved_model,
    describe=_describe_saved_model, published=True))
register_format(ExportFormat(
    "saved_model_ids", "serving_ids", lambda ctx, path: _publish(ctx, path, text=False),
    lambda ctx, path: _ids_loaded(ctx, tf.saved_model.load(path)),
    "TF Serving SavedModel taking token ids only (no tensorflow-text op: any TF Serving "
    "version) as version serving_ids/<N>/ with warm-up requests and models.config",
    describe=_describe_saved_model, published=True))


# --- TFLite flavours ---------------------------------------------------------------

def _tflite_format(flavour: str) -> ExportFormat:
    spec = tfl.FLAVOURS[flavour]

    def write(ctx: ExportContext, path: str) -> str:
        if spec.learnt_ranges and ctx.quantized is not None:
            flat = tfl.convert(ctx.quantized, flavour, ctx.max_seq_len, task=ctx.task,
                               is_pair=ctx.is_pair)
        else:
            rep = [ctx.representative] if ctx.representative is not None else None
            flat = tfl.convert(ctx.model, flavour, ctx.max_seq_len, rep, task=ctx.task,
                               is_pair=ctx.is_pair)
        return tfl.write_tflite(flat, path)

    def load(ctx: ExportContext, path: str) -> Loaded:
        runner = tfl.TFLiteRunner(path, num_threads=ctx.num_threads)
        if spec.text_input:
            texts = {"text": np.array(ctx.dev_a, object)}
            if ctx.dev_b is not None:
                texts["text_b"] = np.array(ctx.dev_b, object)
            one = {k: v[:1] for k, v in texts.items()}
            return Loaded(lambda: ctx.task.from_tflite(runner.predict(texts)),
                          lambda: runner(one))
        one = {k: v[:1] for k, v in ctx.dev_inputs.items()}
        return Loaded(lambda: ctx.task.from_tflite(runner.predict(ctx.dev_inputs)),
                      lambda: runner(one))

    def timer(model, work_dir: str, seq_len: int, batch: int):
        rep = None
        if spec.calibrated:
            rep = [_random_ids(model, 8, seq_len)]
        # One conversion per batch size: TFLite graphs have fixed shapes.
        runner = tfl.TFLiteRunner(tfl.convert(model, flavour, seq_len, rep, batch_size=batch,
                                              metadata=False), batch_size=batch)
        return runner

    return ExportFormat(flavour, tfl.tflite_file(flavour), write, load, spec.description,
                        timer=None if spec.text_input else timer,
                        calibrated=spec.calibrated, describe=_describe_tflite,
                        learnt_ranges=spec.learnt_ranges)


def _describe_tflite(path: str) -> dict[str, Any]:
    """The metadata the file carries: its kind's name and the Task Library API."""
    meta = tm.read_metadata(path).metadata
    name = meta.name.decode() if isinstance(meta.name, bytes) else meta.name
    api = next((k.task_library for k in tm.KINDS.values() if k.name == name), None)
    return {"metadata": name, "task_library": api, "custom_ops": tfl.custom_operators(path)}


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
    files hold the same model. One traced function serves every call, so the batch-1
    latency times the model, not a trace per call."""
    model = load_model(path)
    run = output_function(model, ctx.task)
    one = {k: v[:1] for k, v in ctx.dev_inputs.items()}
    return Loaded(lambda: keras_outputs(model, ctx.task, ctx.dev_inputs, run=run),
                  lambda: keras_outputs(model, ctx.task, one, run=run))


register_format(ExportFormat(
    "hf", "hf", lambda ctx, path: export_hf(ctx.model, path), _round_trip,
    "Hugging Face BERT directory (config.json, model.safetensors, vocab.txt)"))
def _write_keras_hub(ctx: ExportContext, path: str) -> str:
    return export_keras_hub(ctx.model, path, sequence_length=ctx.max_seq_len,
                            allow_activation_mismatch=bool(
                                ctx.options.get("keras_hub_approximate_gelu")))


def _load_keras_hub(ctx: ExportContext, path: str) -> Loaded:
    """The preset as a keras-hub user loads it, `keras_hub.models.TextClassifier.
    from_preset(path)`, run on the dev TEXT through its own preprocessor (its
    tokenizer and packing, not ours): the row shows what that user gets."""
    import keras_hub

    classifier = keras_hub.models.TextClassifier.from_preset(path)
    tflite_output = ctx.task.tflite_output

    @tf.function(reduce_retracing=True)
    def run(texts):
        logits = tf.cast(classifier(classifier.preprocessor(texts), training=False), tf.float32)
        return tflite_output(logits)

    def texts(start: int, stop: int):
        a = tf.constant(ctx.dev_a[start:stop])
        return a if ctx.dev_b is None else (a, tf.constant(ctx.dev_b[start:stop]))

    def predict() -> np.ndarray:
        n = len(ctx.dev_a)
        return np.concatenate([run(texts(s, s + 64)).numpy() for s in range(0, n, 64)], 0)

    return Loaded(predict, lambda: run(texts(0, 1)).numpy())


def _check_keras_hub(config: BertConfig, head: Optional[str],
                     options: Mapping[str, Any]) -> list[str]:
    return keras_hub_problems(config, head, bool(options.get("keras_hub_approximate_gelu")))


register_format(ExportFormat(
    "keras_hub", "keras_hub", _write_keras_hub, _load_keras_hub,
    "keras-hub preset directory (BertTextClassifier: keras_hub.models.TextClassifier."
    "from_preset)", check=_check_keras_hub))
