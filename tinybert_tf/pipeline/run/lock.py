"""One writer per output: an exclusive lock file that names its holder.

`bin/distill` locks its `--output_dir` (`OUTPUT/.lock`) for the whole run,
`bin/export` the same folder while it exports, and `bin/augment` its
`--output` file (`.NAME.lock` next to it). A second writer is refused with
an error naming the holder: host, pid, start time, command and the age of its
heartbeat.

The lock file is created exclusively and holds the holder's facts as JSON.
Locally (NFS included) that is `open(O_CREAT | O_EXCL)`, atomic. Other file
systems (gs://, ram://) have no exclusive create through `tf.io.gfile`: the
facts are written to a temporary sibling, renamed onto the lock name with
`overwrite=False`, and read back after a short pause; a process that finds
another holder's token there lost a (narrow) race and is refused.

A lock left by a dead process is taken over, with a message saying so:
  - same host: its pid is gone (or now belongs to a younger process);
  - another host: its heartbeat is older than `stale_after` seconds
    (`--lock_stale_minutes`, default 10). The holder rewrites its heartbeat
    every `heartbeat_every` seconds (default: a tenth of `stale_after`, at most
    30 s) from a background thread, so a live holder is never that old unless
    its machine stopped (or the clocks of the two hosts differ by that much:
    keep them in sync with NTP);
  - an empty or unreadable lock file older than `_DAMAGED_GRACE_S` seconds (a
    holder killed between creating the file and writing its facts); a file of that
    name that is not JSON at all is another program's, and refused.
A holder that finds its lock taken over (its own heartbeat stopped for longer
than `stale_after`, e.g. a suspended VM) stops heartbeating and raises
`LockError` at its next `check()`: between stages, and before marking a stage done.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Optional

import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.pipeline.settings.configs import DEFAULT_STALE_MINUTES
from tinybert_tf.processes import process_alive, process_start

log = logging.getLogger("tinybert_tf")

_DAMAGED_GRACE_S = 10.0  # a holder writes its facts right after creating the file
_REMOTE_SETTLE_S = 0.2  # pause before reading back a lock made without O_EXCL
_VANISHED = "its lock file vanished"


class LockError(ValueError):
    """The output is locked by a live run, or the lock cannot be made; names holder and fix."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """The facts a lock file holds."""

    host: str
    pid: int
    started: float
    heartbeat: float
    command: str
    token: str
    pid_start: Optional[int] = None
    extra: dict = dataclasses.field(default_factory=dict)

    def describe(self, now: Optional[float] = None) -> str:
        """'bin/distill ... on host h, pid 12, started 2024-05-01 10:00:00, heartbeat 3 s ago'."""
        age = max(0.0, (now or time.time()) - self.heartbeat)
        extra = "".join(f", {k} {v}" for k, v in sorted(self.extra.items()))
        return (f"{self.command!r} on host {self.host}, pid {self.pid}, started "
                f"{_when(self.started)}{extra}, heartbeat {_age(age)} ago")

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "started_at": _when(self.started)}


def read_holder(path: str) -> Optional[Holder]:
    """The holder recorded in lock file `path`; None when there is no such file.
    Raises ValueError when the file is empty or not a lock record."""
    try:
        raw = files.read_bytes(path)
    except files.FileMissingError:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        fields = {f.name for f in dataclasses.fields(Holder)}
        return Holder(**{k: v for k, v in data.items() if k in fields})
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a lock record ({e})") from None


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def command_line() -> str:
    """This process's command, short: the script name and its first arguments."""
    argv = [os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]]
    text = " ".join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


class FileLock:
    """An exclusive lock on `what` through the lock file `path` (see module doc).

    Args:
      path: the lock file.
      what: the locked thing as the user names it (e.g. "--output_dir=runs/sst2").
      stale_after: seconds without heartbeat after which a holder on another host
        counts as dead.
      heartbeat_every: seconds between heartbeats (default min(30, stale_after / 10)).
      extra: more facts for the record (e.g. {"shard": "0/2"}).
      hint: what a refused user should do (appended to the error).
    """

    def __init__(self, path: str, what: str, stale_after: float = DEFAULT_STALE_MINUTES * 60,
                 heartbeat_every: Optional[float] = None,
                 extra: Optional[dict[str, Any]] = None, hint: str = ""):
        self.path = files.absolute(path)
        self.what = what
        self.stale_after = float(stale_after)
        self.heartbeat_every = float(heartbeat_every or min(30.0, self.stale_after / 10))
        self.extra = dict(extra or {})
        self.hint = hint
        self.holder: Optional[Holder] = None
        self.replaced: Optional[str] = None  # why the previous holder's lock was taken over
        self.acquired_at = 0.0
        self._lost: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._mutex = threading.Lock()

    # --- acquire / release --------------------------------------------------------
    def acquire(self) -> "FileLock":
        """Take the lock (taking over a dead holder's); raises LockError if a live run has it."""
        me = Holder(host=socket.gethostname(), pid=os.getpid(), started=time.time(),
                    heartbeat=time.time(), command=command_line(), token=uuid.uuid4().hex,
                    pid_start=process_start(os.getpid()), extra=self.extra)
        for _ in range(5):
            if self._create(me):
                self.holder, self.acquired_at = me, time.time()
                self._start_heartbeat()
                return self
            try:
                current = read_holder(self.path)
            except ValueError:
                current = None
                reason = self._damaged_reason()
                if reason == _VANISHED:
                    continue  # released meanwhile: try again
                if reason is None:
                    raise LockError(f"{self.what}: the lock file {self.path} is being created "
                                    "by another process; retry in a few seconds.") from None
            else:
                if current is None:
                    continue  # released meanwhile: try again
                reason = self.stale_reason(current)
                if reason is None:
                    raise LockError(self.held_message(current))
            self._take_over(current, reason)
        raise LockError(f"{self.what}: other processes keep taking the lock {self.path}; "
                        "make sure one run at a time writes there, then retry.")

    def release(self) -> None:
        """Stop heartbeating and remove the lock file if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._mutex:
            if self.holder is not None and self._still_ours():
                with contextlib.suppress(files.FileAccessError):
                    files.remove(self.path)
            self.holder = None

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def live_holder(self) -> Optional[Holder]:
        """Who holds the lock now, if that holder may be alive (the lock is not taken)."""
        try:
            current = read_holder(self.path)
        except (ValueError, files.FileAccessError):
            return None
        return current if current is not None and self.stale_reason(current) is None else None

    def check(self) -> None:
        """Raise LockError if another process took the lock over meanwhile."""
        if self._lost:
            raise LockError(self._lost)

    # --- staleness ------------------------------------------------------------------
    def stale_reason(self, holder: Holder, now: Optional[float] = None) -> Optional[str]:
        """Why `holder` is dead (None: it may be alive)."""
        if holder.host == socket.gethostname():
            if process_alive(int(holder.pid), holder.pid_start):
                return None
            return f"its process {holder.pid} is gone"
        age = (now or time.time()) - float(holder.heartbeat)
        if age > self.stale_after:
            return (f"its heartbeat is {_age(age)} old (more than the "
                    f"{_age(self.stale_after)} after which a holder on another host "
                    "counts as dead)")
        return None

    def _damaged_reason(self) -> Optional[str]:
        try:
            mtime = files.stat(self.path).mtime_ns / 1e9
            head = files.read_bytes(self.path)[:1]
        except files.FileAccessError:
            return _VANISHED
        if head and head != b"{":  # ours is JSON, written whole right after creating it
            raise LockError(f"{self.what}: {self.path} is not a lock of ours (another "
                            "program's file of that name?): it is not taken over or "
                            "deleted. Move it, or choose another folder.")
        if mtime and time.time() - mtime < _DAMAGED_GRACE_S:
            return None
        return "its lock file is empty or damaged"

    def held_message(self, holder: Holder) -> str:
        hint = f" {self.hint}" if self.hint else ""
        return (f"{self.what} is in use by another run: {holder.describe()} (lock file "
                f"{self.path}).{hint} A dead run's lock is taken over automatically (same "
                f"host: once its process is gone; another host: once its heartbeat is older "
                f"than {_age(self.stale_after)}); if you know it is dead, delete {self.path}.")

    def _take_over(self, seen: Optional[Holder], reason: str) -> None:
        """Remove a dead holder's lock, unless it changed since we read it."""
        try:
            now = read_holder(self.path)
        except ValueError:
            now = None
        if (now is not None) if seen is None else (now is None or now.token != seen.token):
            return  # someone else took, renewed or removed it: the caller's loop looks again
        who = seen.describe() if seen is not None else "an unknown holder"
        self.replaced = f"{who}: {reason}"
        message = (f"{self.what}: taking over the lock of a dead run ({self.replaced}); "
                   f"its outputs are resumed or redone as usual.")
        print(f"warning: {message}", file=sys.stderr, flush=True)
        with contextlib.suppress(files.FileMissingError):
            files.remove(self.path)

    # --- the file ---------------------------------------------------------------------
    def _create(self, me: Holder) -> bool:
        """Create the lock file holding `me`, exclusively; False if it exists."""
        data = json.dumps(me.to_json(), indent=1).encode("utf-8")
        try:
            files.makedirs(os.path.dirname(self.path))
        except files.FileAccessError as e:
            raise LockError(f"{self.what}: cannot create its folder ({e}).") from None
        if not files.is_remote(self.path):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            except OSError as e:
                raise LockError(_os_message(self.what, self.path, e)) from None
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        if files.exists(self.path):
            return False
        tmp = os.path.join(os.path.dirname(self.path),
                           f".{os.path.basename(self.path)}.tmp-{os.getpid()}")
        with files.open(tmp, "wb") as f, files.translate_errors(tmp, "write"):
            f.write(data)
        try:
            tf.io.gfile.rename(tmp, self.path, overwrite=False)
        except tf.errors.AlreadyExistsError:
            files.remove(tmp)
            return False
        except tf.errors.OpError as e:
            raise LockError(f"{self.what}: cannot create the lock file {self.path} "
                            f"({e.message}).") from None
        time.sleep(_REMOTE_SETTLE_S)
        try:
            back = read_holder(self.path)
        except ValueError:
            back = None
        return back is not None and back.token == me.token

    def _still_ours(self) -> bool:
        try:
            current = read_holder(self.path)
        except ValueError:
            return False
        return current is not None and self.holder is not None \
            and current.token == self.holder.token

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_every):
            with self._mutex:
                if self.holder is None:
                    return
                try:
                    if not self._still_ours():
                        self._lost = (f"{self.what}: another process took over this run's "
                                      f"lock ({self.path}) while this run was not "
                                      "heartbeating; two runs may now write the same folder: "
                                      "stop one of them.")
                        log.error(self._lost)
                        return
                    self.holder = dataclasses.replace(self.holder, heartbeat=time.time())
                    files.write_json_atomic(self.path, self.holder.to_json())
                except (files.FileAccessError, OSError) as e:
                    log.warning("lock heartbeat %s: %s", self.path, e)


def _os_message(what: str, path: str, e: OSError) -> str:
    """An OSError on creating a lock file as a message with the fix."""
    reason = e.strerror or str(e)
    return f"{what}: cannot create the lock file {path} ({reason}); {files.os_fix(e)}."
