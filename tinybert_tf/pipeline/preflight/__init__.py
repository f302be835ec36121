"""Every check before the first training step, and the resolved plan of the run.

A misconfigured multi-day job fails in seconds: flag ranges, the task's data,
the models' configs and vocabularies (read without their weights), layer
mappings, sequence lengths against position tables, batch splits, export
formats, the stages a stage reads, and free disk. `check(ctx, stages)`
gathers EVERY problem and returns the plan (`bin/distill --dry_run` prints
it) or raises one `PreflightError` listing them all.

What several stages share is checked here, once: the output folder (folder.py),
the models the stages read by `Stage.needs` (models.py) and the phases' inputs
(plan.py). Each stage checks its own settings and plans its own phases
(`Stage.checks`, `Stage.phases`) in its module.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

from tinybert_tf import files
from tinybert_tf.distill.terms import resolve_names
from tinybert_tf.fields import range_error
from tinybert_tf.pipeline import flag_ranges, stage_io
from tinybert_tf.pipeline.preflight import folder, models
from tinybert_tf.pipeline.preflight.collect import Checks, PreflightError
from tinybert_tf.pipeline.preflight.models import auto_student_error, task_head_errors
from tinybert_tf.pipeline.preflight.plan import plan_phases
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages import get_stage, in_order, stage_names

__all__ = ["PreflightError", "auto_student_error", "check", "resolve_stages",
           "task_head_errors"]


def resolve_stages(requested: Sequence[str], config: PipelineConfig) -> list[str]:
    """`--stages` -> the ordered list to run. `all` drops the stages an ablation skips
    (each stage's `skipped`: general with --general_model or --student_init=random,
    finetune_teacher with --task_teacher, augment with --nouse_augmented,
    --augmented_file or task phases that read none, quantize with --noquantize or
    without int8 in --export_formats)."""
    names = [s.strip() for s in requested if s.strip()]
    known = stage_names()
    if names == ["all"]:
        return [s for s in known if not get_stage(s).skipped(config)]
    unknown = [s for s in names if s not in known]
    if unknown or not names:
        what = f"unknown stage(s) {', '.join(unknown)}" if unknown else "no stage given"
        raise PreflightError([f"--stages: {what}; use a comma list of {', '.join(known)} "
                              "or 'all'."])
    for name in in_order(names):
        refusal = get_stage(name).refusal(config)
        if refusal:
            raise PreflightError([f"--stages={','.join(names)}: {refusal}"])
    return in_order(names)


def check(ctx: Context, stages: Sequence[str], count_corpus: bool = False,
          warnings: Sequence[str] = ()) -> dict[str, Any]:
    """Every check for running `stages`; returns the plan (see module doc).

    count_corpus: count the general corpus for the plan's steps even when no
    count is cached (the dry run does; a real run counts at the stage's start).
    warnings: found before (the command line's), listed and printed with these.
    """
    found = Checks(stages=tuple(stages))
    found.warnings.extend(warnings)
    _check_flags(found, ctx)
    unreadable = folder.check_folder(found, ctx)
    plan: dict[str, Any] = {"output_dir": ctx.state.output_dir, "stages": list(stages),
                            "replicas": ctx.replicas, "task": ctx.task.describe()}
    if not found.errors and ctx.config.run.overwrite:  # every named stage's folder goes
        plan["reuse"] = {stage: "runs again: --overwrite starts it over"
                         for stage in stages if ctx.state.is_done(stage)}
    elif not found.errors:
        plan["reuse"] = {stage: "reused" if why is None else f"runs again: {why}"
                         for stage, why in (found.run(
                             lambda: stage_io.plan_reuse(ctx, stages)) or {}).items()}
    found.warnings.extend(same_data_warnings(ctx))
    models.check_teachers(found, ctx, unreadable)
    models.check_students(found, ctx)
    models.check_lengths(found, ctx)
    for name in stages:  # each stage's own checks (`Stage.checks`), in run order
        get_stage(name).checks(ctx, found)
    found.run(lambda: resolve_names(ctx.config.loss.loss_terms))
    # The phases' plan reads the layer weights and packs texts at --max_seq_len: with
    # either refused it would only repeat the refusal in other words.
    if not {"--layer_weights", "--max_seq_len"} & found.bad_flags:
        plan["phases"] = plan_phases(found, ctx, count_corpus)
    plan.update(found.plan)  # what the stages' checks and the phases' plan found
    folder.check_disk(found, ctx, plan)
    plan["models"] = models.describe(found)
    # Once each: stages that check the same pair (general, task) find the same thing.
    found.warnings[:] = list(dict.fromkeys(found.warnings))
    plan["warnings"] = found.warnings
    errors = found.final()
    if errors:
        raise PreflightError(errors)
    for w in found.warnings:  # once each, on stderr beside the errors, as every tool's
        print(f"distill: warning: {w}", file=sys.stderr, flush=True)
    return plan


def same_data_warnings(ctx: Context) -> list[str]:
    """A dev split read from the training file (or a copy of it): its metrics then score
    the rows the models trained on, and every choice made on dev (the best checkpoint,
    the teacher's grid cell) picks what fits them. Allowed, with a warning: a smoke test
    may do it on purpose."""
    try:
        splits = {s: f["path"] for s, f in (ctx.task.source.describe().get("files") or
                                             {}).items() if not f.get("missing")}
    except Exception:  # noqa: BLE001  (a source that cannot say: the data checks report it)
        return []
    train = splits.get("train")
    out = []
    for split in ctx.task.dev_splits:
        dev = splits.get(split)
        if not train or not dev:
            continue
        if files.canonical(dev) == files.canonical(train):
            how = "is the same file as the train split"
        elif files.content_fingerprint(dev) == files.content_fingerprint(train):
            how = "is a copy of the train split"
        else:
            continue
        out.append(f"the {split} split ({dev}) {how} ({train}): dev "
                   "metrics then score rows the models trained on, and the checkpoints and "
                   "settings chosen on dev are the ones that fit them; give held-out rows "
                   "(e.g. --validation_file) for a real measure.")
    return out


def _check_flags(found: Checks, ctx: Context) -> None:
    """Flag ranges, --max_seq_len's floor and --layer_weights (layer maps and phases
    are not checked against bad weights)."""
    c = ctx.config
    for flag, value, ok, allowed in flag_ranges.ranges(c):
        if not ok(value):
            found.range_error(flag, range_error(flag, value, allowed))
    shortest = 5 if ctx.task.is_pair else 3  # [CLS] a [SEP] (b [SEP]): a token per text
    if 0 < c.task.max_seq_len < shortest:
        kind = "pair" if ctx.task.is_pair else "single-text"
        found.range_error("--max_seq_len", f"--max_seq_len={c.task.max_seq_len}: must be 0 "
                          f"(the task's default) or >= {shortest} (the special tokens and "
                          f"one word piece per text of a {kind} task).")
    for e in flag_ranges.layer_weight_errors(c.loss.layer_weights):
        found.range_error("--layer_weights", e)
