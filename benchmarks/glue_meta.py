"""What benchmarks/glue.py and its helpers share, without flags or TensorFlow: the
paper's Table 1 figures, each task's primary metric, the host, the commit, the extra
flags that make a table's recipe, and how a `bin/distill` run is started and logged.

Run alone, it prints the host and commit that a results.json made here would record.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any, Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The paper's Table 1 (GLUE test server): BERT-base teacher and TinyBERT4.
PAPER = {"SST-2": {"metric": "accuracy", "bert_base": 93.4, "tinybert4": 92.6},
         "MRPC": {"metric": "f1", "bert_base": 87.5, "tinybert4": 86.4},
         "RTE": {"metric": "accuracy", "bert_base": 67.0, "tinybert4": 66.6}}
PRIMARY = {"SST-2": "accuracy", "MRPC": "f1", "RTE": "accuracy"}
# What a task folder holds in the GLUE TSV layout; test.tsv for the submission predictions
# every table writes.
TASK_FILES = ("train.tsv", "dev.tsv", "test.tsv")


def host() -> dict[str, Any]:
    info: dict[str, Any] = {"machine": platform.machine(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                           if line.startswith("model name"))
        flag_line = next(line for line in text.splitlines() if line.startswith("flags"))
        info["isa"] = sorted({f for f in flag_line.split() if f.startswith(
            ("avx512f", "avx512_bf16", "avx512_vnni", "amx", "avx2"))})
    except (OSError, StopIteration):
        pass
    return info


def commit() -> str:
    try:
        return subprocess.check_output(["git", "-C", ROOT, "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def config_lines(path: str) -> set[str]:
    """The flags a local flagfile sets, nested --flagfile= lines (relative to the including
    file's folder) expanded. Not tinybert_tf.cli.flagfiles: it reads through tf.io.gfile,
    and the scripts' table checks run before TensorFlow starts."""
    found: set[str] = set()
    with open(path, encoding="utf-8-sig") as f:
        for line in (ln.strip() for ln in f):
            if line.startswith("--flagfile="):
                found |= config_lines(os.path.join(os.path.dirname(path),
                                                   line[len("--flagfile="):]))
            elif line and not line.startswith(("#", "//")):
                found.add(line)
    return found


def extra_flags(config: str, extra: list[str]) -> list[str]:
    """The non-empty `extra` flags that `config` does not set already: with the config,
    what makes a table's recipe (`--extra=--seed=42` on a config of seed 42 is that
    config's own table)."""
    own = config_lines(config) if os.path.isfile(config) else set()
    return [a for a in extra if a and a not in own]


def recipe_changes(recorded: dict[str, Any], current: dict[str, Any]
                   ) -> list[tuple[str, Any, Any]]:
    """(field, recorded value, current value) for each field of `current` that
    `recorded` (a table's JSON) holds with another value: one table is one recipe. A
    table made before a field was recorded is compared on the fields it has."""
    return [(key, recorded[key], value) for key, value in current.items()
            if recorded.get(key) is not None and recorded[key] != value]


def check_teacher_labels(path: str, task: str, flag: str, script: str) -> None:
    """Stop with one line when the model at `path` is fine-tuned for labels other than
    the GLUE task's (a teacher of another task), before anything is run or scored."""
    from tinybert_tf.data import glue
    from tinybert_tf.models.checkpoint import inspect_model
    from tinybert_tf.models.labels import same_labels

    want = sorted(str(n) for n in glue.get_task(task).label_names)
    have = inspect_model(path).label_names
    if have and not same_labels(have, want):
        raise SystemExit(f"{script}: {flag}={path} is fine-tuned for the labels {list(have)}, "
                         f"not {task}'s {want}; give the teacher fine-tuned on {task} (the "
                         f"finetune_teacher/model folder of a --task={task} run).")


def glue_tasks(names: Sequence[str], script: str, flag: str) -> list[str]:
    """The GLUE tasks `names` (any case) as PRIMARY spells them; else one line naming the
    script's flag and the tasks it scores."""
    known = {name.lower(): name for name in PRIMARY}
    unknown = [n for n in names if n.lower() not in known]
    if unknown or not names:
        raise SystemExit(f"{script}: {flag}={','.join(names)}: "
                         f"{'no task given' if not names else ', '.join(unknown) + ' unknown'}; "
                         f"this benchmark scores {', '.join(PRIMARY)} (their metrics and the "
                         "paper's Table 1 figures are in benchmarks/glue_meta.py).")
    return [known[n.lower()] for n in names]


def check_task_folders(tasks: Sequence[str], glue_dir: str, script: str) -> None:
    """Each task's folder under `glue_dir` holds TASK_FILES; else one line naming
    --glue_dir and the fix. Checked before anything runs, so a wrong folder never waits
    for a teacher's fine-tuning to fail."""
    for task in tasks:
        folder = os.path.join(glue_dir, task)
        missing = [n for n in TASK_FILES if not os.path.isfile(os.path.join(folder, n))]
        if missing:
            raise SystemExit(f"{script}: --glue_dir={glue_dir}: {folder} holds no "
                             f"{', '.join(missing)}; give the folder with "
                             f"{', '.join(t + '/' for t in tasks)} in the GLUE TSV layout "
                             "(the project's is ../shared/data/glue).")


def last_error(log_path: str) -> str:
    """The last `distill: error:` line of a bin/distill log, else its last line."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("distill: error:")]
    return (errors or lines or [""])[-1]


def run_distill(config: str, args: list[str], log_path: str, script: str,
                log: Callable[[str], None]) -> list[str]:
    """One `bin/distill --flagfile=config *args` run (it resumes when its output folder
    exists), its output appended to `log_path`; returns the command without the
    interpreter. A failed run exits naming `script`, the run's error and the log."""
    cmd = [sys.executable, os.path.join(ROOT, "bin", "distill"), f"--flagfile={config}", *args]
    log(" ".join(cmd[1:]))
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc:
        raise SystemExit(f"{script}: {cmd[1]} exited {rc}: {last_error(log_path)} "
                         f"(its whole output: {log_path})")
    return cmd[1:]


def main() -> None:
    print(json.dumps({"host": host(), "commit": commit()}, indent=1))


if __name__ == "__main__":
    main()
