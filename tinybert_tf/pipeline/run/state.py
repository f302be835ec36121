"""The output directory's bookkeeping: which config made it, which stages are done and
from what, who writes it now, and what an interrupted run left behind.

`OUTPUT/run_config.json` holds the result-affecting configs of the run
(`PipelineConfig.results()`), written only once every check has passed.
Re-running with the same configs resumes; with different ones it is an error
(unless `--overwrite`), so two experiments never mix in one folder.

A stage is done when its folder holds `stage_done.json`, written last and
atomically. It records the stage's own settings, the fingerprints of the
stage outputs it read, the absolute path (links resolved) and content fingerprint of every
other input it read (`reads`: data files, models, word vectors, corpus;
`read_facts`), and the content fingerprints of the artefacts it published
(`outputs`); its fingerprint hashes all of it but the outputs. A done stage
is stale, and runs again (with everything made from it), when its settings
differ from the current ones, it read an output that has since been redone,
an input file changed or is now read from another path, or one of its
published artefacts is missing or changed.

Only a stage folder with `stage_done.json` is a finished output; without it the
folder is work in progress (checkpoints, and a `model` that may be replaced).
A stage that writes its outputs into `work_path(stage, ...)` (`STAGE/.work/`)
has them published into `STAGE/` by `mark_done`, just before the marker, so
nothing under `STAGE/` but the done marker's companions looks finished.

`lock()` makes the run the folder's only writer (`OUTPUT/.lock`, see
`tinybert_tf.pipeline.run.lock`); `clean_temporaries()` then removes what killed
writers left: hidden temporaries of whole-or-nothing writes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import re
import time
from typing import Any, Iterable, Optional

import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.pipeline.run.lock import DEFAULT_STALE_MINUTES, FileLock, read_holder
from tinybert_tf.pipeline.training.strategy import WORKERS_DIR
from tinybert_tf.processes import TEMPORARY, left_by_a_dead_writer

RUN_CONFIG = "run_config.json"
STAGE_DONE = "stage_done.json"
LOCK_FILE = ".lock"
WORK_DIR = ".work"
PHASE_STATE = "phase_state.json"
PHASE_DONE = "phase_done.json"


@dataclasses.dataclass(frozen=True)
class StageFolder:
    """What a stage keeps in its folder besides its done record and phase states.

    records: JSON files a later run reads back (a damaged one is reported with its fix:
      delete it, the stage makes it again).
    progress: glob patterns of work the stage leaves before it finishes (a folder that
      holds them has results a config change must not silently mix with).
    remakes_report: redoing the stage deletes the run's report.json (export only adds
      its parity to evaluate's report, so redoing it keeps the report).
    """

    records: tuple[str, ...] = ()
    progress: tuple[str, ...] = ()
    remakes_report: bool = True


# Stage name -> its StageFolder, filled by the stage registry (`register_stage`); this
# layer knows no stage by name.
STAGE_FOLDERS: dict[str, StageFolder] = {}


def _folder(stage: str) -> StageFolder:
    return STAGE_FOLDERS.get(stage, StageFolder())


class OutputDirError(ValueError):
    """The output directory belongs to another config, or cannot be written."""


def fingerprint(settings: dict[str, Any], inputs: dict[str, str],
                reads: Optional[dict[str, Any]] = None) -> str:
    """Hash of a stage's settings, the fingerprints of the outputs it read and the facts
    of its other inputs (`read_facts`)."""
    record = {"settings": settings, "inputs": inputs}
    if reads:
        record["reads"] = reads
    blob = json.dumps(record, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def read_facts(reads: dict[str, Any], record: bool = False
               ) -> dict[str, list[dict[str, str]]]:
    """{role: path, list of paths, or a name} -> {role: [{"path": absolute path,
    "content": content fingerprint} or {"name": name}]}: what a done record keeps of
    a stage's inputs (`record`: with the whole content's hash of large files,
    `files.recorded_fingerprint`), or what is there now to compare with it. A value
    that is not an existing path and holds no "/" is a name (a preset, a hub model,
    tfds:NAME). Paths are recorded with their links resolved, so an input reached
    through another link to the same file (a virtual environment linked into a second
    checkout) is the same input."""
    fingerprint_of = files.recorded_fingerprint if record else files.content_fingerprint
    out: dict[str, list[dict[str, str]]] = {}
    for role, value in reads.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        facts = []
        for item in items:
            item = str(item or "")
            if not item:
                continue
            if files.is_remote(item) or "/" in item or files.exists(item):
                facts.append({"path": files.canonical(item),
                              "content": fingerprint_of(item)})
            else:
                facts.append({"name": item})
        out[role] = facts
    return out


def output_facts(output_dir: str, outputs: dict[str, str]) -> dict[str, str]:
    """{path: "content" | "exists"} -> {path relative to output_dir: content fingerprint
    (`files.recorded_fingerprint`), or "exists"}: what a done record keeps of the
    artefacts a stage published."""
    out = {}
    for path, mode in outputs.items():
        rel = os.path.relpath(path, output_dir) if not files.is_remote(path) else \
            path[len(output_dir.rstrip("/")) + 1:]
        if mode == "exists":
            out[rel] = "exists" if files.exists(path) else "missing"
        else:
            out[rel] = files.recorded_fingerprint(path)
    return out


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
                     inputs: dict[str, str],
                     reads: Optional[dict[str, Any]] = None) -> Optional[str]:
        """Why a done stage no longer matches (None: it matches): its settings, the
        outputs it read, its other inputs (`read_facts` of now) or its published
        artefacts. Parts a record predates (older versions) are trusted."""
        rec = self.record(stage) or {}
        missing = self.output_problem(stage)
        if missing:
            return missing
        if "settings" not in rec:
            return None
        if rec["settings"] != settings:
            return "made with other settings: " + _diff(rec["settings"], settings)
        changed = [s for s, fp in inputs.items() if rec.get("inputs", {}).get(s) != fp]
        if changed:
            return f"made from an earlier output of {', '.join(changed)}"
        if reads is not None and "reads" in rec:
            return _reads_diff(rec["reads"], reads)
        return None

    def output_problem(self, stage: str) -> Optional[str]:
        """A message when an artefact the done stage published is missing or changed
        since (e.g. deleted by hand), else None."""
        rec = self.record(stage) or {}
        for rel, recorded in sorted((rec.get("outputs") or {}).items()):
            path = self.path(rel)
            if not files.exists(path):
                return f"its output {path} is missing (deleted since the stage finished)"
            if recorded != "exists" and not files.same_content(path, recorded):
                return f"its output {path} changed since the stage finished"
        return None

    def mark_done(self, stage: str, info: dict[str, Any], settings: dict[str, Any],
                  inputs: dict[str, str], reads: Optional[dict[str, Any]] = None,
                  outputs: Optional[dict[str, str]] = None) -> str:
        """Publish the stage's work outputs, then write its done record; returns its
        fingerprint. reads: `read_facts` of its inputs; outputs: {path: "content" |
        "exists"} of the artefacts it published (fingerprinted after publishing)."""
        self.publish(stage)
        fp = fingerprint(settings, inputs, reads)
        record = {"stage": stage, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "fingerprint": fp, "settings": settings, "inputs": inputs,
                  **({"reads": reads} if reads is not None else {}),
                  **({"outputs": output_facts(self.output_dir, outputs)}
                     if outputs is not None else {}),
                  **(info or {})}
        write_json_atomic(self.path(stage, STAGE_DONE), record)
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

    def drop_checkpoints(self, stage: str) -> list[str]:
        """Delete the chief's training checkpoints of `stage`'s phases (STAGE/PHASE/ckpt),
        once the stage is marked done; returns the folders. The workers' scratch copies
        under them (`.workers/`) stay: a worker cannot tell when the chief has marked the
        stage done, and until then a resume of the stage needs them."""
        dropped = files.glob(self.path(stage, "*", "ckpt"))
        for folder in dropped:
            for name in files.listdir(folder):
                if name.rstrip("/") != WORKERS_DIR:
                    _remove(posixpath.join(folder, name.rstrip("/")))
            if not files.listdir(folder):
                _remove(folder)
        return dropped

    def stage_fingerprint(self, stage: str) -> Optional[str]:
        rec = self.record(stage)
        if rec is None:
            return None
        return rec.get("fingerprint") or rec.get("finished")

    def reset(self, stages: Iterable[str], keep: Iterable[str] = ()) -> None:
        """Delete the folders of `stages` (and the report made from them: unless only
        export is redone, whose parity the report merely quotes), except the
        paths in `keep` (published TF Serving versions: never deleted) and the folders
        between them and the stage folder. Only what a run made is deleted: a folder
        without run_config.json is left alone (preflight refuses to write into one
        that holds files of the pipeline's names)."""
        if not self.made_by_a_run():
            return
        kept = {files.absolute(k).rstrip("/") for k in keep}
        stages = list(stages)
        for stage in stages:
            _remove_except(self.path(stage), kept)
        if any(_folder(s).remakes_report for s in stages):
            for name in ("report.json", "loss_curves.png"):
                _remove(self.path(name))

    def made_by_a_run(self) -> bool:
        """Whether a bin/distill run made this folder: it holds run_config.json or a run's
        lock, or (run_config.json deleted to reset the config) a stage record or phase
        state of ours."""
        if files.isfile(self.path(RUN_CONFIG)) or self._holds_a_run_lock():
            return True
        if not files.isdir(self.output_dir):
            return False
        return any(self._in_stage_folders(*parts) for parts in (
            (STAGE_DONE,), ("*", PHASE_STATE), ("*", PHASE_DONE), ("*", "ckpt", "checkpoint")))

    def _holds_a_run_lock(self) -> bool:
        """Whether the folder's `.lock` is a lock record of ours (another program may
        keep a file of that name)."""
        try:
            return read_holder(self.path(LOCK_FILE)) is not None
        except (ValueError, files.FileAccessError):
            return False

    def holds_results(self) -> bool:
        """Whether a run here produced anything: a finished stage, a checkpoint, a
        finished phase, a best model so far, augmentation progress or an export."""
        if not files.isdir(self.output_dir):
            return False
        progress = [(stage, pattern) for stage, folder in STAGE_FOLDERS.items()
                    for pattern in folder.progress]
        return any(files.glob(self.path(*parts)) for parts in progress) or any(
            self._in_stage_folders(*parts) for parts in (
                (STAGE_DONE,), ("*", "ckpt", "*.index"), ("*", PHASE_DONE), (WORK_DIR,)))

    def _in_stage_folders(self, *parts: str) -> list[str]:
        """The paths matching STAGE/`parts` for each registered stage's folder: only
        those are a run's (--output_dir may hold other folders with checkpoints of their
        own, `--output_dir=~/projects` say)."""
        return [p for stage in STAGE_FOLDERS for p in files.glob(self.path(stage, *parts))]

    def foreign_entries(self, names: Iterable[str]) -> list[str]:
        """Entries of the folder, among `names` (what the pipeline writes), that no run
        made: the folder has no run_config.json and they are not finished stage
        folders of ours. A run must not write into (or delete) them."""
        if self.made_by_a_run() or not files.isdir(self.output_dir):
            return []
        found = []
        for name in names:
            path = self.path(name)
            if files.exists(path) and not files.isfile(os.path.join(path, STAGE_DONE)):
                found.append(path)
        return found

    # --- damaged records ----------------------------------------------------------------
    def damaged_records(self, redone: Iterable[str] = ()) -> list[str]:
        """One message per bookkeeping file that cannot be read (empty, cut, not JSON),
        each with its fix. Stages in `redone` (about to be deleted) are not read."""
        if not files.isdir(self.output_dir):
            return []
        redone = set(redone)
        found = []
        paths = [self.path(RUN_CONFIG)] + [self.path(stage, name) for stage, folder
                                           in STAGE_FOLDERS.items() for name in folder.records]
        for pattern in ((STAGE_DONE,), ("*", PHASE_STATE), ("*", PHASE_DONE)):
            paths += self._in_stage_folders(*pattern)
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
        if name in _folder(stage).records:
            return f"delete it: the {stage} stage makes it again."
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

    def clean_temporaries(self, before: float, entries: Iterable[str]) -> list[str]:
        """Remove temporaries left by killed writers (see TEMPORARY); returns their paths.

        Only in what the caller's writers own: the top-level `entries` (a folder with all
        it holds) and, beside them, their own temporaries and those of the run's records
        (run_config.json, the lock). Nothing else in --output_dir is looked at: it may be
        a folder of other files (`--output_dir=.`, a home folder) named like ours.

        Call with the lock held: no other run writes here then, so a temporary made
        before `before` (the lock's time) belongs to a dead writer, unless its name
        holds the pid of a live process on this host (a tool writing without the lock).
        """
        owned = {*entries, RUN_CONFIG, LOCK_FILE}
        found: list[str] = []
        if not files.isdir(self.output_dir):
            return found
        for name in sorted(files.listdir(self.output_dir)):
            path = self.path(name)
            if TEMPORARY.match(name):
                if temporary_of(name) in owned:
                    found.append(path)
            elif name in owned and files.isdir(path):
                for folder, dirs, names in _walk(path):
                    found += [os.path.join(folder, n) for n in sorted(dirs) + sorted(names)
                              if TEMPORARY.match(n)]
                    dirs[:] = [d for d in dirs if not TEMPORARY.match(d)]
        removed = [path for path in found if left_by_a_dead_writer(path, before)]
        for path in removed:
            _remove(path)
        return removed

    # --- the run's config ---------------------------------------------------------------
    def check_config(self, config: dict[str, Any], overwrite: bool,
                     stage_flags: Optional[dict[str, Iterable[str]]] = None) -> None:
        """Refuse a folder made with other result-affecting configs (unless overwrite).

        stage_flags: {stage: the flags its output depends on}. Only the settings of
        stages that ran here (their folder exists) count, with those no stage declares:
        a setting of a stage that never ran shaped nothing in the folder. The
        message names the stages the differing flags change (and the command that
        redoes only those).
        """
        if overwrite:
            return
        try:
            old = read_json(self.path(RUN_CONFIG), default=None, error=OutputDirError)
        except OutputDirError:
            raise OutputDirError("; ".join(self.damaged_records())) from None
        if old is None or old == config or not self.holds_results():
            # A run that failed before producing anything blocks no corrected command.
            return
        a, b = _flat(old), _flat(config)
        changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
        if stage_flags is not None:
            changed = self._shaping(changed, stage_flags)
            if not changed:
                return
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

    def _shaping(self, changed: set, stage_flags: dict[str, Iterable[str]]) -> set:
        """The `changed` flags that shaped what the folder holds: those of the stages
        that ran here (their folder exists), and those no stage declares."""
        declared = {f for names in stage_flags.values() for f in names}
        shaped = {f for stage, names in stage_flags.items()
                  if files.isdir(self.path(stage)) for f in names}
        return {k for k in changed if k in shaped or k not in declared}

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


def temporary_of(name: str) -> Optional[str]:
    """The entry a hidden temporary stands for: "report.json" for
    ".report.json.tmp-123", "general" for ".general.old-x1y2"; None for other names."""
    m = re.match(r"^\.(.+?)\.(?:tmp|old)-[A-Za-z0-9_]+$", name)
    return m.group(1) if m else None


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


def _remove_except(path: str, kept: set) -> None:
    """Delete `path` (a file or folder) but the paths in `kept` under it."""
    if not any(k == path or k.startswith(path.rstrip("/") + "/") for k in kept):
        _remove(path)
        return
    if path in kept or not files.isdir(path):
        return
    for name in files.listdir(path):
        _remove_except(os.path.join(path, name), kept)


def _reads_diff(old: dict[str, Any], new: dict[str, Any]) -> Optional[str]:
    """Why the inputs recorded as `old` differ from `new` (read_facts), else None."""
    for role in sorted(set(old) | set(new)):
        a, b = old.get(role), new.get(role)
        if a == b:
            continue
        if a is None or b is None:
            return f"it {'now reads' if a is None else 'no longer reads'} {role}"
        paths_a = [f.get("path", f.get("name")) for f in a]
        paths_b = [f.get("path", f.get("name")) for f in b]
        if paths_a != paths_b:
            return (f"its {role} input is now read from another path ({', '.join(paths_a)} "
                    f"there, {', '.join(paths_b)} now)")
        changed = [f.get("path") for f, g in zip(a, b) if not _same_fact(f, g)]
        if changed:
            return f"its {role} input changed since it was made ({', '.join(changed[:3])})"
    return None


def _same_fact(recorded: dict[str, str], now: dict[str, str]) -> bool:
    """Whether an input's fact of now matches its recorded one: the same, or the same
    path whose large files' mtimes differ but whose content does not (a copy)."""
    if recorded == now:
        return True
    content = recorded.get("content", "")
    return (":" in content and recorded["path"] == now.get("path")
            and files.same_content(recorded["path"], content, now.get("content")))


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


def _as_typed(value: Any) -> str:
    """A recorded value as it is typed after `--flag=`: a list comma-separated, a bool
    as true/false; an empty one named, not left blank."""
    if isinstance(value, (list, tuple)):
        return ",".join(_as_typed(v) for v in value) if value else "(empty)"
    if isinstance(value, bool):
        return str(value).lower()
    if value is None or value == "":
        return "(unset)" if value is None else "(empty)"
    return str(value)


def _diff(old: dict[str, Any], new: dict[str, Any], limit: int = 5) -> str:
    """'--flag: X there, Y now; ...' for the differing leaves (named as flags): values
    changed first, then flags only one side has (an older or newer version's)."""
    a, b = _flat(old), _flat(new)
    keys = sorted((k for k in set(a) | set(b) if a.get(k) != b.get(k)),
                  key=lambda k: (k not in a or k not in b, k))
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""

    def side(flat: dict[str, Any], key: str, where: str) -> str:
        if key in flat:
            return f"{_as_typed(flat[key])} {where}"
        return ("not recorded there (a run made by a version without the setting)"
                if where == "there" else "no such setting now")
    return "; ".join(f"--{k}: {side(a, k, 'there')}, {side(b, k, 'now')}"
                     for k in keys[:limit]) + more
