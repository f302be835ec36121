"""The output folder before a run: writable, no damaged bookkeeping, no foreign files,
the earlier stages' outputs this run reads (there and current), and free disk."""
from __future__ import annotations

import os
import shutil
from typing import Any

from tinybert_tf import files
from tinybert_tf.models.checkpoint import inside_model_dir_error
from tinybert_tf.pipeline import stage_io
from tinybert_tf.pipeline.preflight.collect import Checks
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.stages import get_stage, output_entries, upstream

# Free space asked for on top of the models' own size (checkpoints, logs, exports).
_DISK_MARGIN_BYTES = 256 * 2**20


def check_folder(found: Checks, ctx: Context) -> set:
    """The output folder, what earlier runs left in it, and the stage outputs this run
    reads; returns the stages that cannot read their inputs."""
    stages = found.stages
    found.errors.extend(output_dir_errors(ctx.state.output_dir))
    found.errors.extend(inside_input_errors(ctx, stages))
    found.errors.extend(found.run(lambda: ctx.state.damaged_records(
        stages if ctx.config.run.overwrite else ())) or [])
    # What each stage reads must be there, unchanged (or come first in this run).
    unreadable = _upstream_errors(found, ctx)
    foreign = ctx.state.foreign_entries(output_entries())
    if foreign:
        found.errors.append(
            f"--output_dir={ctx.state.output_dir}: holds {', '.join(foreign[:4])} that no "
            "bin/distill run made (no run_config.json, no stage records): a run would write "
            "into them (and --overwrite delete them); choose a new or empty folder.")
    return unreadable


def check_disk(found: Checks, ctx: Context, plan: dict[str, Any]) -> None:
    """Free disk for the models, and the teacher caches the plan uses."""
    teacher = found.models.teacher
    needed = _DISK_MARGIN_BYTES + (16 * teacher.num_weights() if teacher is not None else 0)
    needed += sum(int(p.get("teacher_cache", {}).get("gib", 0) * 2**30)
                  for p in plan.get("phases", ()) if p.get("teacher_cache", {}).get("use"))
    if not files.is_remote(ctx.state.output_dir):
        free = shutil.disk_usage(_existing_parent(ctx.state.output_dir)).free
        if free < needed:
            found.errors.append(f"--output_dir={ctx.state.output_dir}: {free / 2**30:.2f} "
                                f"GiB free, about {needed / 2**30:.2f} GiB needed; free space "
                                "or choose another folder.")


def output_dir_errors(output_dir: str) -> list[str]:
    """--output_dir must be a folder this user can write (or can create)."""
    if files.is_remote(output_dir):
        return []
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        return [f"--output_dir={output_dir}: is a file; give a folder (new or from an "
                "earlier run of this config)."]
    parent = _existing_parent(output_dir)
    if not os.path.isdir(parent):
        return [f"--output_dir={output_dir}: {parent} is a file, so the folder cannot be "
                "made; choose another path."]
    if not os.access(parent, os.W_OK | os.X_OK):
        what = "is" if parent == output_dir else f"cannot be made in {parent}, which is"
        return [f"--output_dir={output_dir}: {what} not writable by this user (read-only "
                "or another owner); fix its permissions or choose another folder."]
    return []


def inside_input_errors(ctx: Context, stages) -> list[str]:
    """--output_dir must not lie in a folder the run reads (the teacher, a model given by
    a flag: any input of a stage's `reads` that is a folder): a folder input is
    fingerprinted with everything under it, so what the run writes there would change
    it, and each re-run would find the input changed and redo its stages. Nor in any
    other model directory (`inside_model_dir_error`), for the same reason."""
    errors, seen = [], set()
    for stage in stages:
        try:
            reads = get_stage(stage).reads(ctx)
        except Exception:  # noqa: BLE001  (a bad input: the other checks name it)
            continue
        for role, value in reads.items():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                item = str(item or "")
                if not item or item in seen or not files.isdir(item):
                    continue
                seen.add(item)
                if files.is_within(ctx.state.output_dir, item):
                    errors.append(
                        f"--output_dir={ctx.state.output_dir}: inside {item}, the "
                        f"{role.replace('_', ' ')} the {stage} stage reads; what the run "
                        "writes there would change that input, so every re-run would redo "
                        f"the stage. Choose an --output_dir outside {item}.")
    other = inside_model_dir_error(ctx.state.output_dir, "--output_dir")
    if not errors and other:  # another run's model, say: that run would find it changed
        errors.append(other)
    return errors


def _upstream_errors(found: Checks, ctx: Context) -> set:
    """Errors for stages whose input stage is not in this run and is not done, lost an
    output, or is stale; returns the stages that cannot read their inputs."""
    stages, failed = found.stages, set()
    for stage in stages:
        for up in upstream(stage, ctx.config):
            if up in stages:
                continue
            instead = get_stage(up).replaced_by or up
            if not ctx.state.is_done(up):
                found.errors.append(
                    f"--stages={','.join(stages)}: {stage} reads the output of {up}, which "
                    f"is not in {ctx.state.path(up)}; add {up} to --stages (or give "
                    f"{instead}).")
                failed.add(stage)
                continue
            missing = found.run(lambda: stage_io.missing_output(ctx, up))
            reason = None if missing else found.run(lambda: stage_io.reuse_problem(ctx, up))
            if missing:
                found.errors.append(
                    f"{missing}: missing, although the {up} stage is marked done "
                    f"({ctx.state.path(up, 'stage_done.json')}); redo it: add {up} to "
                    f"--stages, or run --stages={up} --overwrite first (or give {instead}).")
            elif reason:
                found.errors.append(
                    f"--stages={','.join(stages)}: {stage} reads the output of {up}, which "
                    f"is stale ({reason}); add {up} to --stages so it runs again first.")
            if missing or reason:
                failed.add(stage)
    return failed


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return path
