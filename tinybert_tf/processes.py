"""Whether a process of this host still runs: what tells a killed writer's leftovers (a
lock record, a temporary file named by its pid) from those of a writer still at work."""
from __future__ import annotations

import contextlib
import os
import re
from typing import Optional

from tinybert_tf import files

# Temporaries of the package's whole-or-nothing writers: files.atomic_path
# (".NAME.tmp-PID"), model_dir.atomic_directory (".NAME.tmp-XXXX", ".NAME.old-XXXX"),
# serving.publish_version (".publish-PID-HEX"), the Word2Vec sentence file
# ("NAME.sentences.tmp-PID"). Group 1: the writer's pid when the name holds one.
TEMPORARY = re.compile(r"^(?:\..+\.(?:tmp|old)-(?:(\d+)$|[A-Za-z0-9_]+$)"
                       r"|\.publish-(\d+)-[0-9a-f]+$|.+\.sentences\.tmp-(\d+)$)")


def process_start(pid: int) -> Optional[int]:
    """The start time of process `pid` in clock ticks since boot (Linux /proc), or None.
    With the pid it identifies a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int, start: Optional[int] = None) -> bool:
    """True when process `pid` runs on this host (and, if `start` is known, is the same
    process, not a later one given the same pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False
    return True


def left_by_a_dead_writer(path: str, before: float) -> bool:
    """Whether the temporary `path` (its name matches TEMPORARY) was made before `before`
    (a lock's time; with no lock, now) by no live process of this host: a name with the
    pid of a live process, or a file changed after `before`, is a writer's at work."""
    pid = next((int(g) for g in TEMPORARY.match(os.path.basename(path)).groups() if g),
               None)
    if pid is not None and (pid == os.getpid() or process_alive(pid)):
        return False
    with contextlib.suppress(files.FileAccessError):
        mtime = files.stat(path).mtime_ns / 1e9
        if mtime and mtime > before:
            return False
    return True
