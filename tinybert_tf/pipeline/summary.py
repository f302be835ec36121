"""The lines a finished `bin/distill` run ends with: what it left, and where.

Read from the output folder after the stages ran (finished earlier or in this
run), so a run of one stage names everything the folder holds: the models,
the augmented data, report.json, the exports that `export/parity.json` lists
(the TF Serving version, each TFLite file, hf/, keras_hub/) and the
TensorBoard logs.
"""
from __future__ import annotations

import posixpath
from typing import Optional

from tinybert_tf import files
from tinybert_tf.export.parity import PARITY_FILE
from tinybert_tf.pipeline.stages import Context


def artefacts(ctx: Context) -> list[tuple[str, str]]:
    """(what, path) of every artefact the output folder holds, in pipeline order."""
    found: list[tuple[str, str]] = []

    def add(what: str, path: Optional[str]) -> None:
        if path and files.exists(path):
            found.append((what, path))

    state = ctx.state
    add("general model (student before task distillation)", state.path("general", "model"))
    add("fine-tuned teacher", state.path("finetune_teacher", "model"))
    add("augmented training data", ctx.augmented_path())
    add("student (task model directory)", ctx.student_path())
    add("int8 student (quantize stage, fake-quantised model directory)", ctx.quantized_path())
    add("report: dev metrics, size, speed", state.path("report.json"))
    add("loss curves", state.path("loss_curves.png"))
    export_dir = state.path("export")
    try:
        parity = files.read_json(posixpath.join(export_dir, PARITY_FILE), default=None)
    except ValueError:  # a damaged parity.json: the export stage redoes it; list none
        parity = None
    rows = parity.get("formats", {}) if isinstance(parity, dict) else {}
    for name, row in rows.items():
        path = row.get("path") if isinstance(row, dict) else None
        if not path:
            continue
        if row.get("version") is not None:
            what = (f"TF Serving model{'' if name == 'saved_model' else f' ({name})'}, "
                    f"version {row['version']} (base path: its parent)")
        else:
            what = f"export {name}"
        add(what, posixpath.join(export_dir, path))
    add("export parity check", posixpath.join(export_dir, PARITY_FILE))
    add("TensorBoard logs (tensorboard --logdir ...)", state.path("logs"))
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
