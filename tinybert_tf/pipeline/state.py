"""The output directory's bookkeeping: which config made it, which stages are done and from what.

`OUTPUT/run_config.json` holds the result-affecting configs of the run
(`PipelineConfig.results()`), written only once every check has passed.
Re-running with the same configs resumes; with different ones it is an error
(unless `--overwrite`), so two experiments never mix in one folder.

A stage is done when its folder holds `stage_done.json`, written last and
atomically. It records the stage's own settings and the fingerprints of the
stage outputs it read; its fingerprint hashes both. A done stage whose
settings differ from the current ones, or which read an output that has
since been redone, is stale: it runs again, and so does everything made from it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from typing import Any, Iterable, Optional

from tinybert_tf.files import read_json, write_json_atomic

RUN_CONFIG = "run_config.json"
STAGE_DONE = "stage_done.json"


class OutputDirError(ValueError):
    """The output directory belongs to another config, or cannot be written."""


def fingerprint(settings: dict[str, Any], inputs: dict[str, str]) -> str:
    """Hash of a stage's settings and the fingerprints of the outputs it read."""
    blob = json.dumps({"settings": settings, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


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

    # --- stages -----------------------------------------------------------------------
    def record(self, stage: str) -> Optional[dict[str, Any]]:
        """The stage's done record, or None when it has not finished."""
        path = self.path(stage, STAGE_DONE)
        return read_json(path, default=None, error=OutputDirError, expect=dict)

    def is_done(self, stage: str) -> bool:
        return os.path.isfile(self.path(stage, STAGE_DONE))

    def done_info(self, stage: str) -> dict[str, Any]:
        return self.record(stage) or {}

    def stale_reason(self, stage: str, settings: dict[str, Any],
                     inputs: dict[str, str]) -> Optional[str]:
        """Why a done stage no longer matches (None: it matches). Stages finished
        before records carried settings are trusted."""
        rec = self.record(stage) or {}
        if "settings" not in rec:
            return None
        if rec["settings"] != settings:
            return "made with other settings: " + _diff(rec["settings"], settings)
        changed = [s for s, fp in inputs.items() if rec.get("inputs", {}).get(s) != fp]
        if changed:
            return f"made from an earlier output of {', '.join(changed)}"
        return None

    def mark_done(self, stage: str, info: dict[str, Any], settings: dict[str, Any],
                  inputs: dict[str, str]) -> str:
        """Write the stage's done record; returns its fingerprint."""
        fp = fingerprint(settings, inputs)
        write_json_atomic(self.path(stage, STAGE_DONE),
                          {"stage": stage, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "fingerprint": fp, "settings": settings, "inputs": inputs,
                           **(info or {})})
        return fp

    def stage_fingerprint(self, stage: str) -> Optional[str]:
        rec = self.record(stage)
        if rec is None:
            return None
        return rec.get("fingerprint") or rec.get("finished")

    def reset(self, stages: Iterable[str]) -> None:
        """Delete the folders of `stages` (and the report made from them)."""
        for stage in stages:
            shutil.rmtree(self.path(stage), ignore_errors=True)
        for name in ("report.json", "loss_curves.png"):
            if os.path.exists(self.path(name)):
                os.remove(self.path(name))

    # --- the run's config ---------------------------------------------------------------
    def check_config(self, config: dict[str, Any], overwrite: bool) -> None:
        """Refuse a folder made with other result-affecting configs (unless overwrite)."""
        old = read_json(self.path(RUN_CONFIG), default=None, error=OutputDirError)
        if overwrite or old is None or old == config:
            return
        raise OutputDirError(
            f"--output_dir={self.output_dir} holds a run with a different config "
            f"({_diff(old, config)}). Use another --output_dir, the same flags to resume, or "
            "--overwrite to redo the stages you name with the new flags.")

    def write_config(self, config: dict[str, Any]) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        write_json_atomic(self.path(RUN_CONFIG), config)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat(v, ""))
        else:
            out[prefix + k] = v
    return out


def _diff(old: dict[str, Any], new: dict[str, Any], limit: int = 5) -> str:
    """'--flag: X there, Y now; ...' for the differing leaves (named as flags)."""
    a, b = _flat(old), _flat(new)
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(f"--{k}: {a.get(k)!r} there, {b.get(k)!r} now" for k in keys[:limit])
