"""The export stage: every --export_formats artefact and parity.json under
OUTPUT/export; the SavedModel is published as the next TF Serving version, which a
redo never deletes."""
from __future__ import annotations

import posixpath
from typing import Any, Optional

from tinybert_tf import files
from tinybert_tf.export.formats import FORMATS, check_formats, format_problems
from tinybert_tf.export.parity import PARITY_FILE, POST_TRAINING_INT8, ExportRequest, export_all
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.models.checkpoint import inspect_model, load_model
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import StageFolder
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages.base import (
    TASK_DATA,
    TASK_LENGTH,
    TEACHER_VOCAB,
    Findings,
    Stage,
    makes_output,
)
from tinybert_tf.pipeline.stages.common import task_data

NAME = "export"


def export(ctx: Context) -> dict[str, Any]:
    e, r = ctx.config.export, ctx.config.run
    student = load_model(ctx.student_path())
    quantized = (load_model(ctx.quantized_path()) if makes_output("quantize", ctx.config)
                 else None)
    dev = ctx.examples(ctx.task.dev_splits[0])
    train = ctx.examples("train")

    def texts(examples):
        return [(ex.text_a, ex.text_b) if ctx.task.is_pair else ex.text_a for ex in examples]

    parity = export_all(ExportRequest(
        student, ctx.state.path("export"), max_seq_len=ctx.max_seq_len, formats=e.formats,
        dev_texts=texts(dev), dev_labels=[ex.label for ex in dev],
        representative_texts=texts(train[: e.representative_examples]),
        is_pair=ctx.task.is_pair, task=ctx.task.type, task_name=ctx.task.name,
        latency_runs=r.export_latency_runs,
        num_threads=r.export_threads or None, max_examples=r.export_max_examples or None,
        options=e.options(), quantized=quantized))
    report_path = ctx.state.path("report.json")
    data = read_json(report_path, default=None)
    if data is not None and ctx.chief:
        data["export"] = parity
        write_json_atomic(report_path, data)
    # The SavedModel is published as the next TF Serving version (export/serving/<N>/).
    served = parity["formats"].get("saved_model", {})
    return {"formats": list(e.formats), "serving_version": served.get("version")}



def outputs(ctx: Context) -> dict[str, str]:
    """parity.json, each unpublished artefact, and the version folder each published
    format served (export/serving/<N>, as parity.json names it): TF Serving may add
    files to it, so it is recorded as existing, not by content."""
    out = {ctx.state.path(NAME, PARITY_FILE): "content"}
    # With the quantize stage, int8_ptq is written beside the learnt-range int8.
    ptq = [POST_TRAINING_INT8] if makes_output("quantize", ctx.config) else []
    for name in [*ctx.config.export.formats, *ptq]:
        fmt = FORMATS.get(name)
        if fmt is not None and not fmt.published:
            out[ctx.state.path(NAME, fmt.artefact)] = "exists"
    for name, row in _parity_rows(ctx).items():
        fmt = FORMATS.get(name)
        if fmt is not None and fmt.published and isinstance(row.get("path"), str):
            out[ctx.state.path(NAME, row["path"])] = "exists"
    return out


def _parity_rows(ctx: Context) -> dict[str, dict]:
    """parity.json's formats ({} when it is missing or damaged: the stage redoes it)."""
    try:
        parity = files.read_json(ctx.state.path(NAME, PARITY_FILE), default=None)
    except ValueError:
        parity = None
    rows = parity.get("formats") if isinstance(parity, dict) else None
    return {k: v for k, v in rows.items() if isinstance(v, dict)} \
        if isinstance(rows, dict) else {}


def keep(ctx: Context) -> list[str]:
    """Published formats (TF Serving versions) are never deleted: a redo publishes the
    next version next to them."""
    return [ctx.state.path(NAME, f.artefact) for f in FORMATS.values() if f.published]


def artefacts(ctx: Context) -> list[tuple[str, Optional[str]]]:
    """Each export parity.json lists (the TF Serving version, each TFLite file, hf/,
    keras_hub/), then parity.json."""
    export_dir = ctx.state.path(NAME)
    found: list[tuple[str, Optional[str]]] = []
    for name, row in _parity_rows(ctx).items():
        path = row.get("path")
        if not path:
            continue
        if row.get("version") is not None:
            what = (f"TF Serving model{'' if name == 'saved_model' else f' ({name})'}, "
                    f"version {row['version']} (base path: its parent)")
        else:
            what = f"export {name}"
        found.append((what, posixpath.join(export_dir, path)))
    found.append(("export parity check", posixpath.join(export_dir, PARITY_FILE)))
    return found


def upstream(config: PipelineConfig) -> list[str]:
    """The student, and the int8 student when the quantize stage makes it."""
    return ["task"] + (["quantize"] if makes_output("quantize", config) else [])


def checks(ctx: Context, found: Findings) -> None:
    """--export_formats against the model it will write (the task stage's student of
    this run, or the finished one): a format that cannot hold it fails before
    training, not after."""
    c = ctx.config
    formats = found.run(lambda: check_formats(c.export.formats))
    exported = found.models.task_student if found.runs("task") else None
    if exported is None and not found.runs("task") and ctx.state.is_done("task"):
        info = found.run(lambda: inspect_model(ctx.student_path()), f"{ctx.student_path()}: ")
        exported = info.config if info is not None else None
    if formats and exported is not None:
        found.errors.extend(format_problems(formats, exported, ctx.task.type.head,
                                            c.export.options()))
    calibrated = [f for f in formats or () if FORMATS[f].calibrated]
    if calibrated and c.export.representative_examples <= 0:
        found.errors.append(
            f"--representative_examples={c.export.representative_examples}: "
            f"{', '.join(calibrated)} calibrate on task text; give > 0 examples or drop "
            "them from --export_formats.")


STAGE = Stage(
    NAME, export, reads=lambda ctx: {"data": task_data(ctx)}, outputs=outputs, keep=keep,
    upstream=upstream, chief_only=True, artefacts=artefacts, checks=checks,
    needs=frozenset({TEACHER_VOCAB, TASK_DATA, TASK_LENGTH}),
    # It only adds its parity to evaluate's report; anything it wrote is progress.
    folder=StageFolder(progress=("*",), remakes_report=False))
