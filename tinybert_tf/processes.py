"""Whether a process of this host still runs: what tells a killed writer's leftovers (a
lock record, a temporary file named by its pid) from those of a writer still at work."""
from __future__ import annotations

import os
from typing import Optional


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
