"""Whole-or-nothing file writes: a temporary sibling, flushed, then one rename.

Readers, and a re-run after SIGKILL, see either the old file or the complete
new one, never half of it. Every module that writes a file others read back
(run bookkeeping, TSVs, TFRecord shards, exported models, reports) uses these.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator, Optional


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


def json_text(data: Any) -> str:
    """The one JSON layout of the package: indented, key-sorted, non-JSON values via str."""
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def write_json(path: str, data: Any) -> None:
    """`data` as JSON to `path` (inside a folder that is itself published atomically)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json_text(data))


def write_json_atomic(path: str, data: Any) -> None:
    """`data` as JSON, whole or not at all."""
    write_bytes_atomic(path, json_text(data).encode("utf-8"))


_MISSING = object()


def read_json(path: str, default: Any = _MISSING, error: type[Exception] = ValueError,
              expect: Optional[type] = None) -> Any:
    """The JSON in `path`.

    A missing file returns `default` when one is given, else raises `error`;
    invalid JSON, bad UTF-8 or (with `expect`) another top-level type raise
    `error` naming the file, the line and the fix.
    """
    if not os.path.isfile(path):
        if default is not _MISSING:
            return default
        raise error(f"{path}: file not found.")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{e.lineno}: invalid JSON ({e.msg}); fix the file, or delete it "
                    "to have it regenerated.") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason}).") from None
    if expect is not None and not isinstance(data, expect):
        raise error(f"{path}: expected a JSON {expect.__name__} at the top level, got "
                    f"{type(data).__name__}.")
    return data
