"""The output directory's bookkeeping: which config made it, which stages are done and
from what, who writes it now, and what an interrupted run left behind.

`OUTPUT/run_config.json` holds the result-affecting configs of the run
(`PipelineConfig.results()`), written only once every check has passed.
Re-running with the same configs resumes; with different ones it is an error
(unless `--overwrite`), so two experiments never mix in one folder.

A stage is done when its folder holds `stage_done.json`, written last and
atomically. It records the stage's own settings and the fingerprints of the
stage outputs it read; its fingerprint hashes both. A done stage whose
settings differ from the current ones, or which read an output that has
since been redone, is stale: it runs again, and so does everything made from it.

Only a stage folder with `stage_done.json` is a finished output; without it the
folder is work in progress (checkpoints, and a `model` that may be replaced).
A stage that writes its outputs into `work_path(stage, ...)` (`STAGE/.work/`)
has them published into `STAGE/` by `mark_done`, just before the marker, so
nothing under `STAGE/` but the done marker's companions looks finished.

`lock()` makes the run the folder's only writer (`OUTPUT/.lock`, see
`tinybert_tf.pipeline.lock`); `clean_temporaries()` then removes what killed
writers left: hidden temporaries of whole-or-nothing writes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from typing import Any, Iterable, Optional

import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.pipeline.lock import DEFAULT_STALE_MINUTES, FileLock, process_alive

RUN_CONFIG = "run_config.json"
STAGE_DONE = "stage_done.json"
LOCK_FILE = ".lock"
WORK_DIR = ".work"
PHASE_STATE = "phase_state.json"
PHASE_DONE = "phase_done.json"
CORPUS_COUNT = "corpus_count.json"

# Temporaries of the package's whole-or-nothing writers: files.atomic_path
# (".NAME.tmp-PID"), model_dir.atomic_directory (".NAME.tmp-XXXX", ".NAME.old-XXXX"),
# serving.publish_version (".publish-PID-HEX"), the Word2Vec sentence file
# ("NAME.sentences.tmp-PID"). Group 1: the writer's pid when the name holds one.
_TEMPORARY = re.compile(r"^(?:\..+\.(?:tmp|old)-(?:(\d+)$|[A-Za-z0-9_]+$)"
                        r"|\.publish-(\d+)-[0-9a-f]+$|.+\.sentences\.tmp-(\d+)$)")


class OutputDirError(ValueError):
    """The output directory belongs to another config, or cannot be written."""


def fingerprint(settings: dict[str, Any], inputs: dict[str, str]) -> str:
    """Hash of a stage's settings and the fingerprints of the outputs it read."""
    blob = json.dumps({"settings": settings, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


class RunState:
    """Stage folders and markers under one `--output_dir`."""

    def __init__(self, output_dir: str):
        self.output_dir = files.absolute(output_dir)

    def path(self, *parts: str) -> str:
        return os.path.join(self.output_dir, *parts)

    def stage_dir(self, stage: str) -> str:
        d = self.path(stage)
        files.makedirs(d)
        return d

    def work_path(self, stage: str, *parts: str) -> str:
        """Where `stage` writes an output that `mark_done` publishes as STAGE/<parts>."""
        files.makedirs(self.path(stage, WORK_DIR))
        return self.path(stage, WORK_DIR, *parts)

    # --- stages -----------------------------------------------------------------------
    def record(self, stage: str) -> Optional[dict[str, Any]]:
        """The stage's done record, or None when it has not finished."""
        path = self.path(stage, STAGE_DONE)
        return read_json(path, default=None, error=OutputDirError, expect=dict)

    def is_done(self, stage: str) -> bool:
        return files.isfile(self.path(stage, STAGE_DONE))

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
        """Publish the stage's work outputs, then write its done record; returns its
        fingerprint."""
        self.publish(stage)
        fp = fingerprint(settings, inputs)
        write_json_atomic(self.path(stage, STAGE_DONE),
                          {"stage": stage, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "fingerprint": fp, "settings": settings, "inputs": inputs,
                           **(info or {})})
        return fp

    def publish(self, stage: str) -> list[str]:
        """Move every entry of STAGE/.work/ to STAGE/ (replacing what is there); returns
        the published paths."""
        work = self.path(stage, WORK_DIR)
        if not files.isdir(work):
            return []
        published = []
        for name in files.listdir(work):
            target = self.path(stage, name)
            old = self.path(stage, f".{name}.old-{os.getpid()}")
            if files.exists(target):
                _move(target, old)
            _move(os.path.join(work, name), target)
            _remove(old)
            published.append(target)
        _remove(work)
        return published

    def stage_fingerprint(self, stage: str) -> Optional[str]:
        rec = self.record(stage)
        if rec is None:
            return None
        return rec.get("fingerprint") or rec.get("finished")

    def reset(self, stages: Iterable[str]) -> None:
        """Delete the folders of `stages` (and the report made from them)."""
        for stage in stages:
            _remove(self.path(stage))
        for name in ("report.json", "loss_curves.png"):
            _remove(self.path(name))

    # --- damaged records ----------------------------------------------------------------
    def damaged_records(self, redone: Iterable[str] = ()) -> list[str]:
        """One message per bookkeeping file that cannot be read (empty, cut, not JSON),
        each with its fix. Stages in `redone` (about to be deleted) are not read."""
        if not files.isdir(self.output_dir):
            return []
        redone = set(redone)
        found = []
        paths = [self.path(RUN_CONFIG), self.path("general", CORPUS_COUNT)]
        for pattern in (("*", STAGE_DONE), ("*", "*", PHASE_STATE), ("*", "*", PHASE_DONE)):
            paths += files.glob(self.path(*pattern))
        for path in paths:
            stage = path[len(self.output_dir):].strip("/").split("/")[0]
            if stage in redone or not files.isfile(path):
                continue
            try:
                read_json(path, error=ValueError, expect=dict)
            except ValueError as e:
                reason = ("empty" if files.stat(path).size == 0
                          else str(e).split(": ", 1)[-1].split(";")[0].rstrip("."))
                found.append(f"{path}: damaged ({reason}); {self._record_fix(path, stage)}")
        return found

    def _record_fix(self, path: str, stage: str) -> str:
        name = os.path.basename(path)
        if name == RUN_CONFIG:
            return ("delete it (this run then records its own flags as the folder's "
                    "config) or use another --output_dir.")
        if name == STAGE_DONE:
            return (f"delete it to have the {stage} stage finish again from its checkpoints, "
                    f"or redo the stage with --stages={stage} --overwrite.")
        if name == CORPUS_COUNT:
            return "delete it: the general stage counts the corpus again."
        phase = os.path.basename(os.path.dirname(path))
        if name == PHASE_DONE:
            return (f"delete it: the {stage}/{phase} phase then restores its last "
                    "checkpoint and finishes again.")
        return (f"delete it: the {stage}/{phase} phase resumes from its last checkpoint but "
                "forgets its dev evaluations so far (the best-checkpoint choice restarts); or "
                f"redo the stage with --stages={stage} --overwrite.")

    # --- who writes, and what killed writers left -----------------------------------------
    def lock(self, stale_minutes: float = DEFAULT_STALE_MINUTES) -> FileLock:
        """This run's lock on the folder (not yet acquired)."""
        return FileLock(self.path(LOCK_FILE), f"--output_dir={self.output_dir}",
                        stale_after=stale_minutes * 60,
                        hint="One run per output folder: wait for it to finish, or use "
                             "another --output_dir.")

    def clean_temporaries(self, before: float) -> list[str]:
        """Remove temporaries left by killed writers (see _TEMPORARY); returns their paths.

        Call with the lock held: no other run writes here then, so a temporary made
        before `before` (the lock's time) belongs to a dead writer, unless its name
        holds the pid of a live process on this host (a tool writing without the lock).
        """
        removed = []
        if not files.isdir(self.output_dir):
            return removed
        for folder, dirs, names in _walk(self.output_dir):
            for name in sorted(dirs) + sorted(names):
                m = _TEMPORARY.match(name)
                if not m:
                    continue
                pid = next((int(g) for g in m.groups() if g), None)
                if pid is not None and (pid == os.getpid() or process_alive(pid)):
                    continue
                path = os.path.join(folder, name)
                with contextlib.suppress(files.FileAccessError):
                    mtime = files.stat(path).mtime_ns / 1e9
                    if mtime and mtime > before:
                        continue
                _remove(path)
                removed.append(path)
            dirs[:] = [d for d in dirs if not _TEMPORARY.match(d)]
        return removed

    # --- the run's config ---------------------------------------------------------------
    def check_config(self, config: dict[str, Any], overwrite: bool,
                     stage_flags: Optional[dict[str, Iterable[str]]] = None) -> None:
        """Refuse a folder made with other result-affecting configs (unless overwrite).

        stage_flags: {stage: the flags its output depends on}, to name the stages the
        differing flags change (and the command that redoes only those).
        """
        if overwrite:
            return
        try:
            old = read_json(self.path(RUN_CONFIG), default=None, error=OutputDirError)
        except OutputDirError:
            raise OutputDirError("; ".join(self.damaged_records())) from None
        if old is None or old == config:
            return
        a, b = _flat(old), _flat(config)
        changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
        redo = ""
        affected = [s for s, names in (stage_flags or {}).items() if changed & set(names)]
        if affected and len(affected) < len(stage_flags or {}):
            redo = (f" These flags change the {', '.join(affected)} stage(s): to redo only "
                    f"those here, run with --overwrite --stages={','.join(affected)} (stages "
                    "made from them are then redone as stale by the next full run).")
        raise OutputDirError(
            f"--output_dir={self.output_dir} holds a run with a different config "
            f"({_diff(old, config)}). Use another --output_dir, the same flags to resume, or "
            f"--overwrite to redo the stages you name with the new flags.{redo}")

    def write_config(self, config: dict[str, Any]) -> None:
        files.makedirs(self.output_dir)
        write_json_atomic(self.path(RUN_CONFIG), config)


def unfinished_stage_output(path: str) -> Optional[str]:
    """A message when `path` is inside a pipeline stage folder whose stage has not
    finished (no stage_done.json next to the output), else None."""
    path = files.absolute(path.rstrip("/"))
    stage_dir = os.path.dirname(path)
    run_dir = os.path.dirname(stage_dir)
    try:
        if not files.isfile(os.path.join(run_dir, RUN_CONFIG)) \
                or files.isfile(os.path.join(stage_dir, STAGE_DONE)):
            return None
    except files.FileAccessError:
        return None
    stage = os.path.basename(stage_dir)
    return (f"{path} is the output of the {stage} stage, which has not finished (no "
            f"{os.path.join(stage_dir, STAGE_DONE)}): it may be a mid-training snapshot. "
            f"Finish the stage (re-run the bin/distill command that started it: it resumes) "
            "or give a finished model.")


def _walk(root: str):
    """os.walk for local folders (top-down, prunable), tf.io.gfile.walk elsewhere."""
    if files.is_remote(root):
        return tf.io.gfile.walk(root)
    return os.walk(root)


def _move(src: str, dst: str) -> None:
    """Rename a file or folder. A local rename is atomic; elsewhere folders move file by
    file (ram:// renames a folder without its contents)."""
    if not files.is_remote(src) or not files.isdir(src):
        files.rename(src, dst, overwrite=False)
        return
    for folder, _, names in list(_walk(src)):
        target = dst + folder[len(src):]
        files.makedirs(target)
        for name in names:
            files.rename(os.path.join(folder, name), os.path.join(target, name))
    files.rmtree(src)


def _remove(path: str) -> None:
    """Delete a file or folder if it exists."""
    with contextlib.suppress(files.FileMissingError):
        if files.isdir(path):
            files.rmtree(path)
        elif files.exists(path):
            files.remove(path)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat(v, ""))
        else:
            out[prefix + k] = v
    return out


def _diff(old: dict[str, Any], new: dict[str, Any], limit: int = 5) -> str:
    """'--flag: X there, Y now; ...' for the differing leaves (named as flags): values
    changed first, then flags only one side has (an older or newer version's)."""
    a, b = _flat(old), _flat(new)
    keys = sorted((k for k in set(a) | set(b) if a.get(k) != b.get(k)),
                  key=lambda k: (k not in a or k not in b, k))
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(f"--{k}: {a.get(k)!r} there, {b.get(k)!r} now"
                     for k in keys[:limit]) + more
