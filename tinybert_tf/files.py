"""File access for every module: `tf.io.gfile` underneath, whole-or-nothing writes, one JSON layout.

Every path goes through `tf.io.gfile`, so local paths, `gs://`, `hdfs://`
(with tensorflow-io installed) and TensorFlow's in-memory `ram://` work alike.
A path that cannot be reached (no such scheme, no network or credentials,
permission denied) raises one `FileAccessError` naming it, translated from
`tf.errors.*` here at the boundary, so callers need no TensorFlow error types.

Whole-or-nothing writes (`atomic_path`, `write_bytes_atomic`, ...): the data
goes to a hidden temporary sibling, then one `tf.io.gfile.rename(overwrite=True)`
publishes it. Readers, and a re-run after SIGKILL, see the old file or the
complete new one, never half of it. On a local or POSIX-like file system the
rename is atomic; on object stores (GCS, S3) a rename is a copy and a delete,
so a reader racing the copy could see a missing file, but never a truncated
one: GCS objects appear whole when their upload completes.
"""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
from typing import Any, Iterator, Optional

import tensorflow as tf


class FileAccessError(ValueError):
    """A path cannot be read or written; the message names the path and what to check."""


class FileMissingError(FileAccessError, FileNotFoundError):
    """A path that must exist does not (also a FileNotFoundError for callers that catch it)."""


def is_remote(path: str) -> bool:
    """True for URLs (gs://, hdfs://, ram://, s3://): paths no `os` call can reach."""
    return "://" in str(path)


def absolute(path: str) -> str:
    """A local path made absolute; a URL unchanged."""
    return str(path) if is_remote(path) else os.path.abspath(path)


def canonical(path: str) -> str:
    """A local path made absolute with its symbolic links resolved (one spelling per
    file: a folder reached through a link is the folder); a URL unchanged."""
    return str(path) if is_remote(path) else os.path.realpath(path)


def is_within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies under it, links resolved (`canonical`)."""
    path, folder = canonical(path), canonical(folder).rstrip("/")
    return path == folder or path.startswith(folder + "/")


def _hint(path: str, error: tf.errors.OpError) -> str:
    scheme = str(path).split("://", 1)[0] if is_remote(path) else ""
    text = _reason(error)
    if "No space left" in text or "Disk quota" in text or \
            isinstance(error, tf.errors.ResourceExhaustedError):
        return "the disk (or quota) is full: free space or choose another folder"
    if "Read-only file system" in text:
        return "the folder is on a read-only file system: choose another folder"
    if isinstance(error, tf.errors.UnimplementedError):
        return (f"this TensorFlow has no file system for {scheme}:// (hdfs:// and s3:// need "
                "`pip install tensorflow-io` and `import tensorflow_io`); use a local path, "
                "gs:// or ram://")
    if isinstance(error, tf.errors.PermissionDeniedError):
        return "check the permissions of the path (and its folder)"
    if scheme == "gs":
        return ("check the bucket name, network access and credentials "
                "(GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`)")
    if scheme:
        return f"check the {scheme}:// address, network access and credentials"
    return "check the path and its permissions"


def _reason(error: BaseException) -> str:
    text = getattr(error, "message", None) or str(error)
    return " ".join(text.split())


@contextlib.contextmanager
def translate_errors(path: str, action: str = "access", missing: str = "not found"
                     ) -> Iterator[None]:
    """Turns `tf.errors.*` raised inside into FileMissingError / FileAccessError naming `path`
    (`missing`: what a NotFoundError means for `action`)."""
    try:
        yield
    except tf.errors.NotFoundError as e:
        raise FileMissingError(f"{path}: {missing} ({_reason(e)}).") from None
    except tf.errors.OpError as e:
        raise FileAccessError(f"{path}: cannot {action} ({_reason(e)}); "
                              f"{_hint(path, e)}.") from None


# --- small helpers every module can use ----------------------------------------------

@dataclasses.dataclass(frozen=True)
class FileStat:
    """Size in bytes and modification time in ns (0 where the file system keeps none)."""
    size: int
    mtime_ns: int


def exists(path: str) -> bool:
    with translate_errors(path, "check"):
        return bool(tf.io.gfile.exists(path))


def isdir(path: str) -> bool:
    with translate_errors(path, "check"):
        return bool(tf.io.gfile.isdir(path))


def isfile(path: str) -> bool:
    """Exists and is not a directory."""
    with translate_errors(path, "check"):
        return bool(tf.io.gfile.exists(path)) and not tf.io.gfile.isdir(path)


def makedirs(path: str) -> None:
    """`path` and its parents; no error when it exists."""
    if path:
        # NotFound here: a parent that cannot hold folders (/proc, a file's path).
        with translate_errors(path, "create the folder", missing="cannot be made"):
            tf.io.gfile.makedirs(path)


def glob(pattern: str) -> list[str]:
    """Sorted matches of `pattern` (`*`, `?`, `[...]`; no `**`). Like Python's glob, names
    starting with a dot (our temporary files) match only a pattern that starts with one."""
    with translate_errors(pattern, "list"):
        hits = tf.io.gfile.glob(pattern)
    if not os.path.basename(pattern).startswith("."):
        hits = [h for h in hits if not os.path.basename(h.rstrip("/")).startswith(".")]
    return sorted(hits)


def listdir(path: str) -> list[str]:
    """Sorted entry names of a folder (folders without their trailing slash)."""
    with translate_errors(path, "list"):
        return sorted(n.rstrip("/") for n in tf.io.gfile.listdir(path))


def remove(path: str) -> None:
    with translate_errors(path, "remove"):
        tf.io.gfile.remove(path)


def rmtree(path: str) -> None:
    with translate_errors(path, "remove"):
        tf.io.gfile.rmtree(path)


def rename(src: str, dst: str, overwrite: bool = True) -> None:
    """Atomic locally; a copy then a delete on object stores."""
    with translate_errors(src, f"rename to {dst}"):
        tf.io.gfile.rename(src, dst, overwrite=overwrite)


def copy(src: str, dst: str, overwrite: bool = True) -> None:
    with translate_errors(src, f"copy to {dst}"):
        tf.io.gfile.copy(src, dst, overwrite=overwrite)


def stat(path: str) -> FileStat:
    """Size and mtime. Local files use os.stat: TensorFlow's POSIX stat keeps whole
    seconds, too coarse for cache keys that must notice a file rewritten at once."""
    if not is_remote(path):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise FileMissingError(f"{path}: not found.") from None
        except OSError as e:
            raise FileAccessError(f"{path}: cannot stat ({e.strerror}); check the path and "
                                  "its permissions.") from None
        return FileStat(int(st.st_size), int(st.st_mtime_ns))
    with translate_errors(path, "stat"):
        st = tf.io.gfile.stat(path)
    return FileStat(int(st.length), int(st.mtime_nsec))


def open(path: str, mode: str = "r") -> tf.io.gfile.GFile:
    """A `tf.io.gfile.GFile`: "r"/"w"/"a" text (UTF-8), "rb"/"wb"/"ab" bytes.

    Reading a missing file raises FileMissingError here, not at the first read.
    Errors while reading or writing later are `tf.errors.*`; wrap such code in
    `translate_errors(path)` to name the path.
    """
    if mode not in ("r", "rb", "w", "wb", "a", "ab"):
        raise ValueError(f"files.open: mode {mode!r} not supported (r, rb, w, wb, a, ab).")
    if mode.startswith("r") and not isfile(path):
        raise FileMissingError(f"{path}: file not found.")
    with translate_errors(path, "open"):
        return tf.io.gfile.GFile(path, mode)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f, translate_errors(path, "read"):
        return f.read()


# Byte-order marks of the encodings a text file that is not UTF-8 most often has (Excel's
# "Unicode Text" is UTF-16 little-endian with its mark); UTF-32's before UTF-16's, whose
# little-endian mark begins UTF-32's.
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
               (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def reencode_hint(data: bytes) -> str:
    """How to make UTF-8 of a file whose bytes begin with `data`: its encoding where a
    byte-order mark names it, else a command to adapt."""
    for bom, name in _OTHER_BOMS:
        if data.startswith(bom):
            return (f"the file is {name} (its byte-order mark says so): re-encode it, e.g. "
                    f"iconv -f {name} -t UTF-8 FILE > FILE.utf8")
    return "re-encode it from its encoding, e.g. iconv -f LATIN1 -t UTF-8 FILE > FILE.utf8"


def read_text(path: str) -> str:
    """UTF-8 text; bad bytes raise UnicodeDecodeError (callers name the line)."""
    return read_bytes(path).decode("utf-8")


# --- content fingerprints ------------------------------------------------------------

# Files up to this size are hashed whole; larger ones by size, mtime and their first and
# last EDGE_BYTES, so a 10 GB corpus costs two 1 MiB reads per run, not a full pass.
FULL_HASH_LIMIT = 64 * 2**20
EDGE_BYTES = 2**20
# A copy (`cp -r`, `gsutil cp`, a reinstalled package) keeps a file's content but not its
# mtime. So what a done record keeps of a path whose large files total at most this
# (`recorded_fingerprint`) also carries the hash of their whole content, and
# `same_content` falls back to it when the size-and-mtime part differs: a copied run
# folder or a re-downloaded teacher is the same input. Beyond it (a corpus of many GB)
# a full pass at each stage start would cost more than it saves; there a copy counts as
# a change and the stages that read it run again.
CONTENT_HASH_LIMIT = 4 * 2**30


def content_fingerprint(path: str) -> str:
    """A short hash of the content of a file, or of every file under a folder (their
    names relative to it, hidden names such as temporaries skipped); "missing" when
    nothing is there.

    Files up to FULL_HASH_LIMIT are hashed whole (a copy or a `touch` does not change
    the fingerprint; one flipped label does). Larger files hash their size, mtime and
    first and last EDGE_BYTES: an edit in the middle of a large file that keeps its
    size and mtime goes unseen, anything else changes it.
    """
    entries = _fingerprinted_files(path)
    return "missing" if entries is None else _digests(entries, whole=False)[0]


def whole_content_fingerprint(path: str) -> str:
    """`content_fingerprint` with every file hashed whole, large ones too: for what must
    match a copy (a cache kept with a run folder that moves to another machine)."""
    entries = _fingerprinted_files(path)
    return "missing" if entries is None else _digests(entries, whole=True)[1]


def recorded_fingerprint(path: str) -> str:
    """`content_fingerprint`, and, when `path` holds files over FULL_HASH_LIMIT that total
    at most CONTENT_HASH_LIMIT, ":" and the hash of their whole content: what a done
    record keeps, for `same_content` to compare with later."""
    entries = _fingerprinted_files(path)
    if entries is None:
        return "missing"
    large = sum(size for _, _, size in entries if size > FULL_HASH_LIMIT)
    quick, whole = _digests(entries, whole=0 < large <= CONTENT_HASH_LIMIT)
    return quick if whole is None else f"{quick}:{whole}"


def same_content(path: str, recorded: str, current: Optional[str] = None) -> bool:
    """Whether `path` holds what `recorded` (a `recorded_fingerprint`, or a
    `content_fingerprint` of an older record) was taken of: its quick part matches, or
    its large files' mtimes differ but their whole content matches. `current`: the
    path's `content_fingerprint`, where the caller has it already."""
    quick, _, whole = recorded.partition(":")
    if current is None:
        current = content_fingerprint(path)
    return current == quick or (bool(whole) and whole_content_fingerprint(path) == whole)


def _fingerprinted_files(path: str) -> Optional[list[tuple[Optional[str], str, int]]]:
    """[(name relative to `path`, or None for `path` itself; full path; size)] of the
    file `path` or of the files under the folder `path`, in the order they are hashed
    (hidden names skipped); None when nothing is there."""
    if isfile(path):
        return [(None, path, stat(path).size)]
    if not isdir(path):
        return None
    with translate_errors(path, "list"):
        walked = list(tf.io.gfile.walk(path))
    entries = []
    for folder, dirs, names in sorted(walked):
        if any(part.startswith(".") for part in _relative_parts(folder, path)):
            continue
        for name in sorted(n for n in names if not n.startswith(".")):
            full = os.path.join(folder, name)
            entries.append((os.path.relpath(full, path), full, stat(full).size))
    return entries


def _digests(entries: list[tuple[Optional[str], str, int]], whole: bool
             ) -> tuple[str, Optional[str]]:
    """The fingerprints of `entries`: (quick: large files by size, mtime and edges;
    whole: every byte, or None unless `whole`), from one read of each file."""
    quick = hashlib.sha256()
    full = hashlib.sha256() if whole else None
    for rel, path, _ in entries:
        if rel is not None:
            for digest in (quick, full):
                if digest is not None:
                    digest.update(rel.encode() + b"\0")
        _hash_file(path, quick, full)
    return quick.hexdigest()[:20], None if full is None else full.hexdigest()[:20]


def _relative_parts(folder: str, root: str) -> list[str]:
    rel = os.path.relpath(folder, root)
    return [] if rel == "." else rel.split(os.sep)


def _hash_file(path: str, quick, full=None) -> None:
    """Feed `path` to `quick` (whole if small, else size, mtime and edges) and, when
    given, every byte of it to `full`."""
    st = stat(path)
    small = st.size <= FULL_HASH_LIMIT
    with open(path, "rb") as f, translate_errors(path, "read"):
        if small or full is not None:
            for block in iter(lambda: f.read(8 * 2**20), b""):
                if small:
                    quick.update(block)
                if full is not None:
                    full.update(block)
        if not small:
            quick.update(f"size={st.size} mtime_ns={st.mtime_ns}\0".encode())
            f.seek(0)
            quick.update(f.read(EDGE_BYTES))
            f.seek(st.size - EDGE_BYTES)
            quick.update(f.read(EDGE_BYTES))
    quick.update(b"\0")
    if full is not None:
        full.update(b"\0")


# --- whole-or-nothing writes ---------------------------------------------------------

def _temporary_sibling(path: str) -> str:
    directory, name = os.path.split(str(path))
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def umask() -> int:
    """This process's umask: from /proc (Linux), else by setting it and setting it back
    (which other threads could see for that instant)."""
    try:
        with builtins.open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def usual_permissions(path: str) -> None:
    """Give the local `path` (a file, or a folder and everything under it) the mode that
    `open` and `mkdir` give under the umask (0644 and 0755 under 022), execute bits
    kept: some writers (tempfile.mkdtemp, safetensors' save_file) make them owner-only,
    and a published model must be readable by a serving account. Remote: nothing."""
    if is_remote(path):
        return
    mask = umask()

    def fix(p: str, folder: bool) -> None:
        mode = 0o777 if folder or os.stat(p).st_mode & 0o100 else 0o666
        os.chmod(p, mode & ~mask)

    with translate_errors(path, "set the permissions of"):
        if not os.path.isdir(path):
            fix(path, False)
            return
        for root, _, names in os.walk(path):
            fix(root, True)
            for name in names:
                child = os.path.join(root, name)
                if not os.path.islink(child):
                    fix(child, False)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a hidden temporary path next to `path` to write to (with `files.open`,
    `tf.io.TFRecordWriter`, or any writer that takes a path).

    On normal exit the temporary file gets the umask's usual mode
    (`usual_permissions`) and is renamed onto `path`; on any exception it is
    removed and `path` is left untouched. The name starts with a dot, so
    globs such as `PREFIX-*` never see it. Local callers may still write the
    temporary path with Python's `open`; remote paths need `files.open`.
    """
    path = absolute(path)
    makedirs(os.path.dirname(path))
    tmp = _temporary_sibling(path)
    try:
        yield tmp
        if not is_remote(tmp) and os.path.exists(tmp):
            usual_permissions(tmp)  # a writer may have made it owner-only
        rename(tmp, path, overwrite=True)
    except BaseException:
        with contextlib.suppress(Exception):
            if tf.io.gfile.exists(tmp):
                tf.io.gfile.remove(tmp)
        raise


def _fsync_local(path: str) -> None:
    """Flush a written local file to disk (gfile does not), so a power cut after the
    rename cannot leave an empty file under the final name."""
    if is_remote(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """`data` to `path`, whole or not at all (fsynced before the rename when local)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f, translate_errors(tmp, "write"):
            f.write(data)
        _fsync_local(tmp)


def write_text_atomic(path: str, text: str) -> None:
    """UTF-8 `text` to `path`, whole or not at all."""
    write_bytes_atomic(path, text.encode("utf-8"))


def json_text(data: Any) -> str:
    """The one JSON layout of the package: indented, key-sorted, non-JSON values via str."""
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def write_json(path: str, data: Any) -> None:
    """`data` as JSON to `path` (inside a folder that is itself published atomically)."""
    with open(path, "w") as f, translate_errors(path, "write"):
        f.write(json_text(data))


def write_json_atomic(path: str, data: Any) -> None:
    """`data` as JSON, whole or not at all."""
    write_bytes_atomic(path, json_text(data).encode("utf-8"))


_MISSING = object()


def read_json(path: str, default: Any = _MISSING, error: type[Exception] = ValueError,
              expect: Optional[type] = None, fix: str = "fix the file") -> Any:
    """The JSON in `path`.

    A missing file returns `default` when one is given, else raises `error`;
    invalid JSON, bad UTF-8 or (with `expect`) another top-level type raise
    `error` naming the file, the line and `fix` (what repairs it: only the caller
    knows whether the file is regenerated when deleted). An unreachable path
    raises FileAccessError.
    """
    if not isfile(path):
        if default is not _MISSING:
            return default
        raise error(f"{path}: file not found.")
    raw = read_bytes(path)
    try:
        data = json.loads(raw.decode("utf-8-sig"))  # a leading BOM (Windows editors) is dropped
    except json.JSONDecodeError as e:
        raise error(f"{path}:{e.lineno}: invalid JSON ({e.msg}); {fix}.") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason}); {reencode_hint(raw)}; "
                    f"or {fix}.") from None
    if expect is not None and not isinstance(data, expect):
        raise error(f"{path}: expected a JSON {expect.__name__} at the top level, got "
                    f"{type(data).__name__}; {fix}.")
    return data


class _NotAnObject(ValueError):
    """`json_object`'s own signal: the file's content is not a JSON object."""


def json_object(path: str, limit: int = 64 * 2**20) -> Optional[dict]:
    """The JSON object in the file `path`, or None when the file is larger than `limit`
    bytes (not read) or holds no JSON object (bad UTF-8, not JSON, another top-level
    type). For telling a record a tool wrote from a user's file of the same name; an
    unreachable path raises FileAccessError."""
    if stat(path).size > limit:
        return None
    try:
        return read_json(path, error=_NotAnObject, expect=dict)
    except _NotAnObject:
        return None


def os_fix(e: OSError) -> str:
    """What to do about an OSError raised while writing an output."""
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "the folder is read-only for this user: fix its permissions or choose another"
    if e.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return "a path component is a file where a folder belongs (or the reverse): " \
               "choose another path"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk (or quota) is full: free space or choose another folder"
    return "check the path and its permissions"


def save_png(fig, path: str, tight: bool = True) -> str:
    """Write a matplotlib figure to `path` as a PNG, whole or not at all, and close it
    (the loss curves, the latency-budget plot and bin/reproduce's tables). `tight`:
    fit the margins to the labels first (`tight_layout`, which measures every label);
    False for a figure that sets its own."""
    import matplotlib.pyplot as plt  # imported only where a figure is drawn, as above
    if tight:
        fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=90, format="png")
    plt.close(fig)
    write_bytes_atomic(path, png.getvalue())
    return path
