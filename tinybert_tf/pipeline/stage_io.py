"""What each stage reads and publishes, declared once per stage (`STAGE_IO`).

A stage's done record (`RunState.mark_done`) keeps, besides its settings and the
fingerprints of the earlier stages it read (`stages.upstream`):

  reads     the absolute path and content fingerprint of every other input
            (`files.content_fingerprint`: small files hashed whole, large ones by
            size, mtime and their first and last MiB), e.g. the task's data
            files, the teacher, the word vectors, the corpus;
  outputs   the content fingerprint (or, for artefacts other tools may rewrite,
            the existence) of what it published, the TF Serving version folders
            an export published included.

A re-run reuses a done stage only when all of it still matches (`reuse_problem`);
otherwise the stage runs again, saying why, and so does every stage made from it.
A stage this run does not run but reads must match too, or the run refuses
before anything runs (preflight). `keep` names what a redo never deletes: the
TF Serving versions an export published.

A new stage declares its `StageIO` here with `register_stage_io(name, StageIO(...))`;
the fingerprint and staleness code (`state.py`) needs no change.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from tinybert_tf import files, plugins
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.export.formats import FORMATS
from tinybert_tf.export.parity import POST_TRAINING_INT8
from tinybert_tf.models.checkpoint import CheckpointError, resolve
from tinybert_tf.pipeline.run.context import STAGES, Context, has_quantize_stage, upstream
from tinybert_tf.pipeline.run.state import read_facts


@dataclasses.dataclass(frozen=True)
class StageIO:
    """A stage's inputs besides earlier stages' outputs, and its published artefacts.

    reads(ctx) -> {role: a path, a list of paths, or a name};
    outputs(ctx) -> {path: "content" | "exists"} (exists: artefacts another tool may
      legitimately rewrite, such as report.json, to which export adds its parity);
    keep(ctx) -> paths under the stage's folder that a redo never deletes.
    """

    reads: Callable[[Context], dict[str, Any]] = lambda ctx: {}
    outputs: Callable[[Context], dict[str, str]] = lambda ctx: {}
    keep: Callable[[Context], list[str]] = lambda ctx: []


STAGE_IO: dict[str, StageIO] = {}


def register_stage_io(stage: str, io: StageIO, replace: bool = False) -> StageIO:
    return plugins.register(STAGE_IO, stage, io, what="stage I/O declaration",
                            replace=replace)


# --- what the stages read ---------------------------------------------------------------

def model_path(name: str) -> str:
    """A model flag's directory (short names resolved to the installed package); the
    name itself when it is not a local or remote folder (a preset or hub name)."""
    if not name or name.lower() == "none":
        return ""
    try:
        return resolve(name)
    except CheckpointError:
        return name


def task_data(ctx: Context) -> list[str]:
    """Every file the task's data source reads (from its `describe()`), or its name
    (TFDS)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("path"), str):
                found.append(value["path"])
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
    described = ctx.task.source.describe()
    walk(described)
    if found:
        return sorted(set(found))
    return [f"{described.get('kind', 'data')}:{described.get('name') or ctx.task.name}"]


def corpus_files(source: str) -> list[str]:
    """The corpus's files (tfds:NAME stays a name)."""
    source = source or corpus_lib.default_corpus_path()
    if corpus_lib.detect_format(source) == "tfds":
        return [source]
    return [path for path, _, _ in corpus_lib.source_facts(source)]


def _general_reads(ctx: Context) -> dict[str, Any]:
    m, g = ctx.config.models, ctx.config.general
    return {"teacher": model_path(m.teacher), "corpus": corpus_files(g.corpus),
            "student_config": m.student_config}


def _finetune_reads(ctx: Context) -> dict[str, Any]:
    return {"teacher": model_path(ctx.config.models.teacher), "data": task_data(ctx)}


def _augment_reads(ctx: Context) -> dict[str, Any]:
    m, a = ctx.config.models, ctx.config.augment
    reads = {"data": task_data(ctx), "vocab_model": model_path(m.task_teacher or m.teacher),
             "mlm_model": model_path(a.mlm_model), "word_vectors": a.word_vectors}
    if not a.word_vectors:
        reads["corpus"] = corpus_files(a.corpus)
    return reads


def _task_reads(ctx: Context) -> dict[str, Any]:
    m = ctx.config.models
    return {"data": task_data(ctx), "task_teacher": model_path(m.task_teacher),
            "general_model": model_path(m.general_model)}


def _quantize_reads(ctx: Context) -> dict[str, Any]:
    """The task data (the task student and the augmented file are earlier stages')."""
    return {"data": task_data(ctx)}


def _evaluate_reads(ctx: Context) -> dict[str, Any]:
    return {"data": task_data(ctx), "task_teacher": model_path(ctx.config.models.task_teacher)}


def _export_reads(ctx: Context) -> dict[str, Any]:
    return {"data": task_data(ctx)}


def _export_outputs(ctx: Context) -> dict[str, str]:
    """parity.json, each unpublished artefact, and the version folder each published
    format served (export/serving/<N>, as parity.json names it): TF Serving may add
    files to it, so it is recorded as existing, not by content."""
    parity_path = ctx.state.path("export", "parity.json")
    out = {parity_path: "content"}
    # With the quantize stage, int8_ptq is written beside the learnt-range int8.
    ptq = [POST_TRAINING_INT8] if has_quantize_stage(ctx.config) else []
    for name in [*ctx.config.export.formats, *ptq]:
        fmt = FORMATS.get(name)
        if fmt is not None and not fmt.published:
            out[ctx.state.path("export", fmt.artefact)] = "exists"
    try:
        rows = files.read_json(parity_path, default={}).get("formats") or {}
    except (ValueError, AttributeError):  # a damaged parity.json is reported as changed
        rows = {}
    for name, row in rows.items():
        fmt = FORMATS.get(name)
        if fmt is not None and fmt.published and isinstance(row, dict) \
                and isinstance(row.get("path"), str):
            out[ctx.state.path("export", row["path"])] = "exists"
    return out


def _export_keep(ctx: Context) -> list[str]:
    """Published formats (TF Serving versions) are never deleted: a redo publishes the
    next version next to them."""
    return [ctx.state.path("export", f.artefact) for f in FORMATS.values() if f.published]


register_stage_io("general", StageIO(
    _general_reads, lambda ctx: {ctx.state.path("general", "model"): "content"}))
register_stage_io("finetune_teacher", StageIO(
    _finetune_reads, lambda ctx: {ctx.state.path("finetune_teacher", "model"): "content"}))
register_stage_io("augment", StageIO(
    _augment_reads, lambda ctx: {ctx.augmented_path(): "content"}))
register_stage_io("task", StageIO(
    _task_reads, lambda ctx: {ctx.state.path("task", "model"): "content"}))
register_stage_io("quantize", StageIO(
    _quantize_reads, lambda ctx: {ctx.state.path("quantize", "model"): "content"}))
register_stage_io("evaluate", StageIO(
    _evaluate_reads, lambda ctx: {ctx.state.path("report.json"): "exists",
                                  ctx.state.path("evaluate", "metrics.json"): "content"}))
register_stage_io("export", StageIO(_export_reads, _export_outputs, _export_keep))


def io_of(stage: str) -> StageIO:
    return STAGE_IO.get(stage, StageIO())


def reads_of(ctx: Context, stage: str) -> dict[str, Any]:
    """The `read_facts` of `stage`'s declared inputs now."""
    return read_facts(io_of(stage).reads(ctx))


def keep_of(ctx: Context, stages) -> list[str]:
    return [p for s in stages for p in io_of(s).keep(ctx)]


def missing_output(ctx: Context, stage: str) -> Optional[str]:
    """The first artefact of the done `stage` (recorded, or declared when its record
    predates outputs) that is not there, else None."""
    record = ctx.state.record(stage) or {}
    paths = list(io_of(stage).outputs(ctx)) + [ctx.state.path(rel)
                                               for rel in record.get("outputs") or {}]
    return next((p for p in paths if not files.exists(p)), None)


def upstream_fingerprints(ctx: Context, stage: str) -> dict[str, str]:
    return {up: ctx.state.stage_fingerprint(up) or "" for up in upstream(stage, ctx.config)}


def reuse_problem(ctx: Context, stage: str, redone: frozenset = frozenset()
                  ) -> Optional[str]:
    """Why the done `stage` cannot be reused (None: it can), given the stages this run
    redoes first (`redone`): their outputs change."""
    redone_up = [up for up in upstream(stage, ctx.config) if up in redone]
    if redone_up:
        return f"made from the output of {', '.join(redone_up)}, which runs again"
    missing = missing_output(ctx, stage)
    if missing:
        return f"its output {missing} is missing (deleted since the stage finished)"
    return ctx.state.stale_reason(stage, ctx.config.stage_settings(stage),
                                  upstream_fingerprints(ctx, stage), reads_of(ctx, stage))


def plan_reuse(ctx: Context, stages) -> dict[str, Optional[str]]:
    """For each done stage of `stages` (in order): None when it is reused, else why it
    runs again. Stages not done are absent."""
    plan: dict[str, Optional[str]] = {}
    redone: set = set()
    for stage in [s for s in STAGES if s in stages]:
        if not ctx.state.is_done(stage):
            redone.add(stage)
            continue
        reason = reuse_problem(ctx, stage, frozenset(redone))
        plan[stage] = reason
        if reason is not None:
            redone.add(stage)
    return plan
