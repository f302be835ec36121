"""The lines a finished `bin/distill` run ends with: what it left, and where.

Read from the output folder after the stages ran (finished earlier or in this
run), so a run of one stage names everything the folder holds: each registered
stage's `artefacts` in pipeline order (the models, the augmented data,
report.json, the exports that `export/parity.json` lists), then the TensorBoard
logs.
"""
from __future__ import annotations

from typing import Optional

from tinybert_tf import files
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.stages import get_stage, stage_names


def artefacts(ctx: Context) -> list[tuple[str, str]]:
    """(what, path) of every artefact the output folder holds, in pipeline order."""
    found: list[tuple[str, str]] = []

    def add(what: str, path: Optional[str]) -> None:
        if path and files.exists(path):
            found.append((what, path))

    for name in stage_names():
        for what, path in get_stage(name).artefacts(ctx):
            add(what, path)
    add("TensorBoard logs (tensorboard --logdir ...)", ctx.state.path("logs"))
    return found


def artefacts_table(ctx: Context) -> str:
    """`artefacts` as the block printed at the end of a run."""
    found = artefacts(ctx)
    if not found:
        return f"== nothing written yet in {ctx.state.output_dir}"
    width = max(len(what) for what, _ in found)
    lines = [f"== done; the run's artefacts in {ctx.state.output_dir}:"]
    lines += [f"  {what.ljust(width)}  {path}" for what, path in found]
    return "\n".join(lines)
