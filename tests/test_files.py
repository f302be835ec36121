"""tinybert_tf.files: every operation through tf.io.gfile (local and ram:// alike),
whole-or-nothing writes, JSON helpers, and one clear error for a path that
cannot be reached."""
import os

import pytest

from tinybert_tf import files


@pytest.fixture(params=["local", "ram"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path)
    return f"ram://files-{os.getpid()}-{tmp_path.name}"


def test_atomic_write_publishes_whole_files_and_leaves_no_temporary(root):
    path = f"{root}/sub/dir/a.json"
    files.write_json_atomic(path, {"b": 1, "a": [1, 2]})
    assert files.read_json(path) == {"a": [1, 2], "b": 1}
    assert files.read_text(path) == files.json_text({"a": [1, 2], "b": 1})
    with pytest.raises(RuntimeError), files.atomic_path(path) as tmp:
        with files.open(tmp, "w") as f:
            f.write("half a fi")
        raise RuntimeError("killed mid-write")
    assert files.read_json(path) == {"a": [1, 2], "b": 1}  # the old file, untouched
    assert files.listdir(f"{root}/sub/dir") == ["a.json"]  # no temporary left
    files.write_bytes_atomic(path, b"[]")
    assert files.read_json(path) == [] and files.stat(path).size == 2


def test_helpers_glob_stat_remove_and_plain_json(root):
    for name in ("x-0.txt", "x-1.txt", ".x-2.txt.tmp-1", "y.txt"):
        files.write_text_atomic(f"{root}/{name}", name)
    assert files.glob(f"{root}/x-*") == [f"{root}/x-0.txt", f"{root}/x-1.txt"]  # no dot files
    assert files.isfile(f"{root}/y.txt") and not files.isdir(f"{root}/y.txt")
    assert files.isdir(root) and not files.isfile(root) and not files.exists(f"{root}/nope")
    files.makedirs(f"{root}/d")
    files.write_json(f"{root}/d/plain.json", {"k": "v"})
    assert files.read_json(f"{root}/d/plain.json") == {"k": "v"}
    files.rename(f"{root}/y.txt", f"{root}/z.txt")
    files.copy(f"{root}/z.txt", f"{root}/d/z.txt")
    assert files.read_text(f"{root}/d/z.txt") == "y.txt" and not files.exists(f"{root}/y.txt")
    files.remove(f"{root}/z.txt")
    files.rmtree(f"{root}/d")
    assert not files.exists(f"{root}/d") and files.stat(f"{root}/x-0.txt").size == 7


def test_read_json_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1,\n  oops}\n')
    with pytest.raises(ValueError, match=r"bad\.json:2: invalid JSON"):
        files.read_json(str(bad))
    assert files.read_json(str(tmp_path / "none.json"), default=None) is None
    with pytest.raises(KeyError, match=r"none\.json: file not found"):
        files.read_json(str(tmp_path / "none.json"), error=KeyError)
    bad.write_text("[1]")
    with pytest.raises(ValueError, match=r"bad\.json: expected a JSON dict"):
        files.read_json(str(bad), expect=dict)
    # Saved by a Windows editor: a UTF-8 byte-order mark is read past; UTF-16 is named.
    bad.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}')
    assert files.read_json(str(bad)) == {"a": 1}
    bad.write_bytes('{"a": 1}'.encode("utf-16"))
    with pytest.raises(ValueError, match=r"bad\.json: not UTF-8 text .*the file is UTF-16 "
                       r"\(its byte-order mark says so\): re-encode it, .*; or fix the file\.$"):
        files.read_json(str(bad))


def test_json_object_tells_a_record_from_other_files(tmp_path):
    """A tool's own record (a JSON object) or None for a user's file of that name."""
    path = tmp_path / "x.json"
    path.write_text('{"shards": []}')
    assert files.json_object(str(path)) == {"shards": []}
    assert files.json_object(str(path), limit=5) is None  # larger than the limit: unread
    for content in (b"[1, 2]", b"not json", '{"a": 1}'.encode("utf-16")):
        path.write_bytes(content)
        assert files.json_object(str(path)) is None, content


def test_unreachable_and_missing_paths_are_one_clear_error(tmp_path):
    with pytest.raises(files.FileAccessError,
                       match=r"hdfs://namenode/corpus/a\.txt: cannot check .*no file system for "
                             r"hdfs:// .*tensorflow-io") as info:
        files.exists("hdfs://namenode/corpus/a.txt")
    assert "\n" not in str(info.value)
    with pytest.raises(files.FileAccessError, match=r"s3://bucket/x\*: cannot list"):
        files.glob("s3://bucket/x*")
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=r"missing\.txt: file not found"):
        files.open(missing)  # also a FileAccessError (a ValueError) for our callers
    with pytest.raises(files.FileAccessError, match=r"missing\.txt: not found"):
        files.stat(missing)
    assert not files.is_remote(missing) and files.is_remote("gs://b/x")
    assert files.absolute("gs://b/x") == "gs://b/x" and os.path.isabs(files.absolute("rel"))


def test_usual_permissions_give_owner_only_files_the_umasks_mode_and_keep_exec_bits(
        tmp_path):
    folder = tmp_path / "made_by_mkdtemp"
    (folder / "sub").mkdir(parents=True)
    for name, mode in (("weights", 0o600), ("sub/tool", 0o700)):
        (folder / name).write_bytes(b"x")
        os.chmod(folder / name, mode)
    os.chmod(folder, 0o700)
    old = os.umask(0o022)
    try:
        files.usual_permissions(str(folder))
        single = tmp_path / "single"
        single.write_bytes(b"y")
        os.chmod(single, 0o600)
        files.usual_permissions(str(single))
        with files.atomic_path(str(tmp_path / "atomic")) as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)  # as tempfile.mkstemp does
            os.close(fd)
    finally:
        os.umask(old)

    def mode(path):
        return os.stat(path).st_mode & 0o777
    assert (mode(folder), mode(folder / "sub")) == (0o755, 0o755)
    assert (mode(folder / "weights"), mode(folder / "sub" / "tool")) == (0o644, 0o755)
    assert mode(single) == 0o644 and mode(tmp_path / "atomic") == 0o644
