"""The output directory's bookkeeping: which config made it, which stages are done.

`OUTPUT/run_config.json` records the flags that change results. Re-running
with the same flags resumes; with different ones it is an error (unless
`--overwrite`), so two experiments never mix in one folder. A stage is done
when its folder holds `stage_done.json`, written last and atomically.
"""
from __future__ import annotations

import os
import shutil
import time
from typing import Any, Iterable

from tinybert_tf.files import read_json, write_json_atomic

# Flags that only steer how a run proceeds, not what it computes.
NON_RESULT_FLAGS = frozenset({
    "stages", "overwrite", "output_dir", "checkpoint_every", "keep_checkpoints",
    "latency_runs", "eval_batch_size", "export_formats", "strategy", "tpu",
    "augment_batch_size", "representative_examples", "flagfile",
})


class OutputDirError(ValueError):
    """The output directory belongs to another config, or cannot be written."""


class RunState:
    """Stage folders and markers under one `--output_dir`."""

    def __init__(self, output_dir: str):
        self.output_dir = os.path.abspath(output_dir)

    def path(self, *parts: str) -> str:
        return os.path.join(self.output_dir, *parts)

    def stage_dir(self, stage: str) -> str:
        d = self.path(stage)
        os.makedirs(d, exist_ok=True)
        return d

    def is_done(self, stage: str) -> bool:
        return os.path.isfile(self.path(stage, "stage_done.json"))

    def mark_done(self, stage: str, info: dict[str, Any] | None = None) -> None:
        write_json_atomic(self.path(stage, "stage_done.json"),
                          {"stage": stage, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           **(info or {})})

    def done_info(self, stage: str) -> dict[str, Any]:
        return read_json(self.path(stage, "stage_done.json"), {})

    def check_config(self, config: dict[str, Any], overwrite: bool,
                     stages: Iterable[str]) -> None:
        """Record `config`, or compare it with the recorded one.

        `--overwrite` deletes the folders of the stages about to run (and
        everything after them), then records the new config.
        """
        record = self.path("run_config.json")
        os.makedirs(self.output_dir, exist_ok=True)
        old = read_json(record)
        if overwrite:
            for stage in stages:
                shutil.rmtree(self.path(stage), ignore_errors=True)
            for name in ("report.json", "loss_curves.png"):
                if os.path.exists(self.path(name)):
                    os.remove(self.path(name))
        elif old is not None and old != config:
            diffs = [k for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]
            shown = "; ".join(f"--{k}: {old.get(k)!r} there, {config.get(k)!r} now"
                              for k in diffs[:5])
            raise OutputDirError(
                f"--output_dir={self.output_dir} holds a run with a different config ({shown}). "
                f"Use another --output_dir, the same flags to resume, or --overwrite to start over.")
        write_json_atomic(record, config)


def result_config(flag_values: dict[str, Any]) -> dict[str, Any]:
    """The flags that define a run's results, JSON-friendly."""
    out = {}
    for k, v in flag_values.items():
        if k in NON_RESULT_FLAGS:
            continue
        out[k] = list(v) if isinstance(v, (list, tuple)) else v
    return out
