"""Stage records and reuse: what each stage read and published, checked against now.

A stage's done record (`RunState.mark_done`) keeps, besides its settings and the
fingerprints of the earlier stages it read (its `Stage.upstream`):

  reads     the absolute path and content fingerprint of every other input its
            `Stage.reads` names (`files.recorded_fingerprint`: small files hashed
            whole, large ones by size, mtime and their first and last MiB, and by
            their whole content up to `files.CONTENT_HASH_LIMIT`, so that a copy with
            a new mtime still matches), e.g. the task's data files, the teacher, the
            word vectors, the corpus;
  outputs   the content fingerprint (or, for artefacts other tools may rewrite,
            the existence) of what its `Stage.outputs` published, the TF Serving
            version folders an export published included: a run folder copied
            without its mtimes (`cp -r`, `gsutil cp -r`) is reused as it was.

A re-run reuses a done stage only when all of it still matches (`reuse_problem`);
otherwise the stage runs again, saying why, and so does every stage made from it.
A stage this run does not run but reads must match too, or the run refuses
before anything runs (preflight). `Stage.keep` names what a redo never deletes:
the TF Serving versions an export published. Every function here reads the stage
registry (pipeline/stages), so a registered plugin stage is fingerprinted and
reused like a built-in.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from tinybert_tf import files
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import read_facts
from tinybert_tf.pipeline.stages import get_stage, in_order, settings_of, upstream


def reads_of(ctx: Context, stage: str, record: bool = False) -> dict[str, Any]:
    """The `read_facts` of `stage`'s declared inputs now (`record`: as its done record
    keeps them)."""
    return read_facts(get_stage(stage).reads(ctx), record)


def outputs_of(ctx: Context, stage: str) -> dict[str, str]:
    """{path: "content" | "exists"} of what `stage` publishes."""
    return get_stage(stage).outputs(ctx)


def keep_of(ctx: Context, stages: Iterable[str]) -> list[str]:
    """What a redo of `stages` never deletes."""
    return [p for s in stages for p in get_stage(s).keep(ctx)]


def missing_output(ctx: Context, stage: str) -> Optional[str]:
    """The first artefact of the done `stage` (recorded, or declared when its record
    predates outputs) that is not there, else None."""
    record = ctx.state.record(stage) or {}
    paths = list(outputs_of(ctx, stage)) + [ctx.state.path(rel)
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
    return ctx.state.stale_reason(stage, settings_of(stage, ctx.config),
                                  upstream_fingerprints(ctx, stage), reads_of(ctx, stage))


def plan_reuse(ctx: Context, stages) -> dict[str, Optional[str]]:
    """For each done stage of `stages` (in order): None when it is reused, else why it
    runs again. Stages not done are absent."""
    plan: dict[str, Optional[str]] = {}
    redone: set = set()
    for stage in in_order(stages):
        if not ctx.state.is_done(stage):
            redone.add(stage)
            continue
        reason = reuse_problem(ctx, stage, frozenset(redone))
        plan[stage] = reason
        if reason is not None:
            redone.add(stage)
    return plan
