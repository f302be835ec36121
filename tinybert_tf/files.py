"""Whole-or-nothing file writes: a temporary sibling, flushed, then one rename.

Readers, and a re-run after SIGKILL, see either the old file or the complete
new one, never half of it. Every module that writes a file others read back
(run bookkeeping, TSVs, TFRecord shards, exported models, reports) uses these.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a hidden temporary path next to `path` to write to.

    On normal exit the temporary file is renamed onto `path` (atomic within a
    file system); on any exception it is removed and `path` is left untouched.
    The name starts with a dot, so globs such as `PREFIX-*` never see it.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_bytes_atomic(path: str, data: bytes) -> None:
    """`data` to `path`, fsynced before the rename."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_json_atomic(path: str, data: Any) -> None:
    """`data` as indented, key-sorted JSON (non-JSON values via str)."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in `path`, or `default` when there is no such file."""
    if not os.path.isfile(path):
        return default
    with open(path, encoding="utf-8") as f:
        return json.load(f)
