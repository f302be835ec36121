"""Runs that can be left alone: one writer per output (locks), damaged bookkeeping named
with its fix, stale temporaries removed, outputs published with the done marker, disk
full and read-only folders as one-line errors that a re-run recovers from."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from tinybert_tf.pipeline.main import main
from tinybert_tf.pipeline.preflight import PreflightError
from tinybert_tf.pipeline.preflight import folder as preflight_folder
from tinybert_tf.pipeline.run.lock import FileLock, Holder, LockError, read_holder
from tinybert_tf.pipeline.run.state import OutputDirError, RunState
from tinybert_tf.processes import process_start

from augment_helpers import tiny_vectors
from pipeline_helpers import REPO, argv, load_tool, run, tiny_flags, write_teacher


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_vocab):
    """Tiny flags whose cheap stages (augment on given vectors, task from a given
    teacher) run in seconds."""
    tmp = tmp_path_factory.mktemp("faults")
    vectors = str(tmp / "vectors.txt")
    tiny_vectors().save_word2vec_format(vectors, binary=False)
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier")
    return tiny_flags(tmp, tiny_vocab, word_vectors=vectors, task_teacher=teacher,
                      general_model="none", checkpoint_every=2)


def _with(ns, **changes):
    return type(ns)(**{**vars(ns), **changes})


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_holder(path: str, **facts) -> None:
    now = time.time()
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": now - 60,
              "heartbeat": now, "command": "bin/distill --flagfile=other.cfg",
              "token": "someone-else", **facts}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f)


# --- one run per output folder --------------------------------------------------------

def test_a_second_run_is_refused_naming_the_holder_and_a_dead_ones_lock_is_taken_over(
        base, tmp_path, capsys):
    out = tmp_path / "out"
    ns = _with(base, output_dir=str(out), stages=["augment"])
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]);"
         "from tinybert_tf.pipeline.run.state import RunState;"
         "lock = RunState(sys.argv[2]).lock().acquire(); print('locked', flush=True);"
         "time.sleep(120)", REPO, str(out)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["bin/distill", *argv(ns)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("distill: error: --output_dir=") and "in use by another run" in err
        assert f"pid {holder.pid}" in err and socket.gethostname() in err and "started" in err
        assert not (out / "run_config.json").exists()
        # The dry run of the same command warns instead.
        plan = run(_with(ns, dry_run=True))
        assert any("in use by another run" in w for w in plan["warnings"])
    finally:
        holder.kill()  # SIGKILL: the lock file stays behind
        holder.wait()
    assert (out / ".lock").exists()
    # Temporaries of writers killed earlier, and one of a live process (kept).
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    planted = {"export/.saved_model.tmp-k2j4x/saved_model.pb": False,
               f"export/serving/.publish-{holder.pid}-0a1b2c3d/saved_model.pb": False,
               f"augment/.train_aug.tsv.tmp-{holder.pid}": False,
               f".report.json.tmp-{holder.pid}": False,
               f"augment/.notes.txt.tmp-{sleeper.pid}": True,
               # Named like ours, but outside what a run writes (an --output_dir of other
               # files too): not looked at. bin/export deleted both.
               f"notes/.draft.txt.tmp-{holder.pid}": True,
               ".data.csv.old-x1y2": True}
    for rel in planted:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("x")
    try:
        run(ns)
    finally:
        sleeper.kill()
        sleeper.wait()
    captured = capsys.readouterr()
    assert "taking over the lock of a dead run" in captured.err
    assert f"its process {holder.pid} is gone" in captured.err
    assert "removed 4 temporary file(s)" in captured.out
    for rel, kept in planted.items():
        assert (out / rel).exists() == kept, rel
    assert not (out / "export" / ".saved_model.tmp-k2j4x").exists()
    assert (out / "augment" / "stage_done.json").exists()
    assert not (out / ".lock").exists()  # released at the end


def test_a_lock_from_another_host_is_taken_over_only_once_its_heartbeat_is_old(tmp_path):
    path = str(tmp_path / ".lock")
    _write_holder(path, host="other-host", pid=1, heartbeat=time.time() - 30)
    lock = FileLock(path, "--output_dir=x", stale_after=600)
    with pytest.raises(LockError, match=r"in use by another run: .*other-host, pid 1, .*"
                       r"heartbeat 30 s ago.*older than 10 min"):
        lock.acquire()
    _write_holder(path, host="other-host", pid=1, heartbeat=time.time() - 700)
    with lock:
        assert "heartbeat is 12 min old" in lock.replaced
        assert read_holder(path).token == lock.holder.token
    assert not os.path.exists(path)


def test_a_reused_pid_does_not_keep_a_dead_runs_lock(tmp_path):
    path = str(tmp_path / ".lock")
    _write_holder(path, pid=os.getpid(), pid_start=process_start(os.getpid()))
    with pytest.raises(LockError, match=f"pid {os.getpid()}"):
        FileLock(path, "x").acquire()  # alive: this very process
    _write_holder(path, pid=os.getpid(), pid_start=process_start(os.getpid()) - 1)
    with FileLock(path, "x") as lock:  # same pid, another (earlier) process: dead
        assert "is gone" in lock.replaced


def test_an_empty_lock_file_counts_as_dead_once_it_is_old(tmp_path):
    path = tmp_path / ".lock"
    path.write_text("")
    with pytest.raises(LockError, match="being created"):
        FileLock(str(path), "x").acquire()
    old = time.time() - 60
    os.utime(path, (old, old))
    with FileLock(str(path), "x") as lock:
        assert "empty or damaged" in lock.replaced
    # Another program's file of that name (not JSON): refused, kept.
    path.write_text("pid 4242\n")
    os.utime(path, (old, old))
    with pytest.raises(LockError, match=r"^x: .*\.lock is not a lock of ours .*Move it, or "
                       r"choose another folder\.$"):
        FileLock(str(path), "x").acquire()
    assert path.read_text() == "pid 4242\n"


def test_locks_work_on_ram_filesystems():
    path = "ram://faults/lock_test/.lock"
    first = FileLock(path, "--output_dir=ram://faults/lock_test").acquire()
    try:
        with pytest.raises(LockError, match="in use by another run"):
            FileLock(path, "--output_dir=ram://faults/lock_test").acquire()
    finally:
        first.release()
    assert not tf.io.gfile.exists(path)
    with tf.io.gfile.GFile(path, "w") as f:  # a dead holder on this host
        f.write(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "started": 1.0,
                            "heartbeat": 1.0, "command": "x", "token": "t"}))
    with FileLock(path, "y") as lock:
        assert "is gone" in lock.replaced


def test_the_heartbeat_advances_and_a_lock_taken_over_meanwhile_stops_the_run(tmp_path):
    path = str(tmp_path / ".lock")
    lock = FileLock(path, "--output_dir=x", heartbeat_every=0.05).acquire()
    try:
        first = read_holder(path).heartbeat
        deadline = time.time() + 5
        while read_holder(path).heartbeat == first and time.time() < deadline:
            time.sleep(0.02)
        assert read_holder(path).heartbeat > first
        lock.check()
        with lock._mutex:  # between two heartbeats
            _write_holder(path, host="other-host", token="thief")
        time.sleep(0.3)
        with pytest.raises(LockError, match="another process took over"):
            lock.check()
    finally:
        lock.release()
    assert read_holder(path).token == "thief"  # not ours: left alone


def test_only_the_chief_takes_the_output_lock(base, tmp_path, monkeypatch, tiny_vocab):
    from tinybert_tf.pipeline import main as main_module
    out = tmp_path / "worker"
    _write_holder(str(out / ".lock"))  # the chief's lock, held by a live process
    write_teacher(str(out / "task" / "model"), tiny_vocab, head="classifier")
    (out / "task" / "stage_done.json").write_text('{"stage": "task"}')
    ns = _with(base, output_dir=str(out), stages=["evaluate"])
    monkeypatch.setattr(main_module.Context, "chief", property(lambda self: False))
    assert run(ns) == {}  # a worker skips the chief-only stage and never touches the lock
    assert read_holder(str(out / ".lock")).token == "someone-else"


# --- sharded augmentation ---------------------------------------------------------------

def _bin_augment(args, capsys):
    module = load_tool("augment")
    try:
        module.FLAGS(["augment", *args])
        rc = module.main(["augment"])
    finally:
        module.FLAGS.unparse_flags()
    return rc, capsys.readouterr().err


def test_two_shards_given_one_output_are_refused_with_the_way_to_join_them(base, tmp_path,
                                                                            capsys):
    out = tmp_path / "aug" / "train_aug.tsv"
    args = ["--task=sst-2", f"--data_dir={base.data_dir}", f"--output={out}",
            f"--word_vectors={base.word_vectors}", "--augment_fallback", "--num_aug=2",
            "--vector_vocab_limit=0"]
    join = r"cat train_aug\.tsv\.shard0 train_aug\.tsv\.shard1 > train_aug\.tsv"
    # Shard 0 is writing: shard 1 on the same file is refused, naming its holder.
    lock = FileLock(str(out.parent / ".train_aug.tsv.lock"), f"--output={out}",
                    extra={"shard": "0/2"}).acquire()
    try:
        rc, err = _bin_augment([*args, "--shard=1/2"], capsys)
    finally:
        lock.release()
    assert rc == 2 and "in use by another run" in err and "shard 0/2" in err
    assert re.search(join, err)
    # Shard 0 finished there: shard 1 would destroy it.
    rc, err = _bin_augment([*args, "--shard=0/2"], capsys)
    assert rc == 0, err
    before = out.read_bytes()
    rc, err = _bin_augment([*args, "--shard=1/2"], capsys)
    assert rc == 2 and "holds the output of shard 0/2" in err and re.search(join, err)
    assert out.read_bytes() == before
    # Each shard to its own file, joined with cat: the unsharded file.
    rc, _ = _bin_augment([*args[:2], f"--output={out}.shard1", *args[3:], "--shard=1/2"],
                         capsys)
    assert rc == 0
    rc, _ = _bin_augment([*args[:2], f"--output={tmp_path / 'whole.tsv'}", *args[3:]], capsys)
    assert rc == 0
    assert before + (tmp_path / "aug" / "train_aug.tsv.shard1").read_bytes() == \
        (tmp_path / "whole.tsv").read_bytes()


# --- damaged bookkeeping -----------------------------------------------------------------

@pytest.mark.parametrize("rel,content,fix", [
    ("run_config.json", "", r"run_config\.json: damaged \(empty\); delete it"),
    ("task/stage_done.json", '{"stage": "task", ', r"stage_done\.json: damaged \(invalid JSON"
     r".*--stages=task --overwrite"),
    ("task/prediction/phase_state.json", "", r"phase_state\.json: damaged \(empty\); delete "
     r"it: the task/prediction phase resumes from its last checkpoint"),
    ("task/intermediate/phase_done.json", "[1, 2]", r"phase_done\.json: damaged \(expected a "
     r"JSON dict.*restores its last checkpoint"),
    # A stage's own record (`StageFolder.records`): the general stage's corpus count.
    ("general/corpus_count.json", "{", r"corpus_count\.json: damaged \(invalid JSON.*delete "
     r"it: the general stage makes it again"),
])
def test_a_damaged_record_is_one_error_naming_the_file_and_the_fix(base, tmp_path, rel, content,
                                                                   fix):
    out = tmp_path / "out"
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_text(content)
    ns = _with(base, output_dir=str(out), stages=["task"], use_augmented=False)
    for dry_run in (True, False):
        with pytest.raises(PreflightError) as info:
            run(_with(ns, dry_run=dry_run))
        damaged = [e for e in info.value.errors if ": damaged (" in e]
        assert len(damaged) == 1 and re.search(fix, damaged[0]), info.value.errors
        assert str(out / rel) in damaged[0]
    assert (out / rel).read_text() == content  # nothing rewritten
    # The refusal of another config on a damaged run_config.json names it as well.
    if rel == "run_config.json":
        with pytest.raises(OutputDirError, match="damaged"):
            RunState(str(out)).check_config({"seed": 1}, overwrite=False)


def test_a_setting_one_side_lacks_is_named_as_not_recorded_not_as_none(tmp_path):
    """A run made by a version without a setting: the refusal says so, instead of
    '--alpha_cos: None there'."""
    out = tmp_path / "out"
    (out / "general").mkdir(parents=True)
    (out / "general" / "stage_done.json").write_text("{}")
    (out / "run_config.json").write_text(json.dumps({"seed": 42, "gone": 1}))
    with pytest.raises(OutputDirError) as info:
        RunState(str(out)).check_config({"seed": 42, "alpha_cos": 1.0}, overwrite=False)
    message = str(info.value)
    assert "--alpha_cos: not recorded there (a run made by a version without the setting), " \
        "1.0 now" in message, message
    assert "--gone: 1 there, no such setting now" in message and "None" not in message


def test_a_differing_setting_is_shown_as_it_is_typed_not_as_a_python_value(tmp_path):
    """'--export_formats: ['saved_model', 'float32'] there' was Python's list, and a bool
    read 'True'."""
    out = tmp_path / "out"
    (out / "export").mkdir(parents=True)
    (out / "export" / "stage_done.json").write_text("{}")
    (out / "run_config.json").write_text(json.dumps(
        {"export_formats": ["saved_model", "float32"], "mask_padding": True,
         "plugins": [], "vocab": ""}))
    with pytest.raises(OutputDirError) as info:
        RunState(str(out)).check_config({"export_formats": ["saved_model", "float16"],
                                         "mask_padding": False, "plugins": ["my_terms"],
                                         "vocab": "v.txt"}, overwrite=False)
    assert "(--export_formats: saved_model,float32 there, saved_model,float16 now; " \
        "--mask_padding: true there, false now; --plugins: (empty) there, my_terms now; " \
        "--vocab: (empty) there, v.txt now)" in str(info.value), str(info.value)


# --- publishing, unfinished outputs and temporaries -------------------------------------------

@pytest.mark.parametrize("root", ["local", "ram"])
def test_work_outputs_are_published_with_the_done_marker(tmp_path, root):
    out = str(tmp_path / "out") if root == "local" else "ram://faults/publish"
    state = RunState(out)
    model = state.work_path("task", "model")
    tf.io.gfile.makedirs(os.path.join(model, "assets"))
    for name in ("config.json", "assets/vocab.txt"):
        with tf.io.gfile.GFile(os.path.join(model, name), "w") as f:
            f.write("new")
    tf.io.gfile.makedirs(state.path("task", "model"))  # an older model, replaced
    with tf.io.gfile.GFile(state.path("task", "model", "stale.bin"), "w") as f:
        f.write("old")
    assert not state.is_done("task")
    state.mark_done("task", {}, {}, {})
    assert state.is_done("task")
    assert tf.io.gfile.exists(state.path("task", "model", "assets", "vocab.txt"))
    assert not tf.io.gfile.exists(state.path("task", "model", "stale.bin"))
    assert sorted(n.rstrip("/") for n in tf.io.gfile.listdir(state.path("task"))) == \
        ["model", "stage_done.json"]


def test_temporaries_are_cleaned_on_ram_filesystems():
    state = RunState("ram://faults/clean")
    dead = _dead_pid()
    for rel in (f".run_config.json.tmp-{dead}", "export/.saved_model.tmp-ab12cd/x.pb",
                "task/model/config.json", f"task/.work/model/.weights.tmp-{os.getpid()}"):
        tf.io.gfile.makedirs(os.path.dirname(state.path(rel)))
        with tf.io.gfile.GFile(state.path(rel), "w") as f:
            f.write("x")
    removed = state.clean_temporaries(before=time.time(), entries=["export", "task"])
    assert sorted(os.path.relpath(p, state.output_dir) for p in removed) == \
        [f".run_config.json.tmp-{dead}", "export/.saved_model.tmp-ab12cd"]
    assert tf.io.gfile.exists(state.path("task", "model", "config.json"))
    assert tf.io.gfile.exists(state.path(f"task/.work/model/.weights.tmp-{os.getpid()}"))


def test_an_unfinished_stages_model_is_not_taken_as_a_finished_one(base, tmp_path,
                                                                    tiny_vocab):
    out = tmp_path / "out"
    write_teacher(str(out / "general" / "model"), tiny_vocab)
    (out / "run_config.json").write_text("{}")
    ns = _with(base, output_dir=str(tmp_path / "next"), stages=["task"],
               general_model=str(out / "general" / "model"), use_augmented=False)
    with pytest.raises(PreflightError, match=r"--general_model=.*general/model is the output "
                       r"of the general stage, which has not finished"):
        run(ns)
    (out / "general" / "stage_done.json").write_text('{"stage": "general"}')
    run(_with(ns, dry_run=True))  # finished: accepted


# --- the environment ---------------------------------------------------------------------------

def _fail_writes(monkeypatch, marker: str, code: int = errno.ENOSPC, times: int = 1):
    """Writes to paths containing `marker` raise OSError(code), `times` times: through
    tf.io.gfile and through Python's open (whichever the writer uses)."""
    import builtins
    left = {"n": times}

    def failing(path):
        if marker in str(path) and left["n"] > 0:
            left["n"] -= 1
            raise OSError(code, os.strerror(code), str(path))

    real_write = tf.io.gfile.GFile.write
    real_open = builtins.open

    def gfile_write(self, data):
        failing(self.name)
        return real_write(self, data)

    def py_open(file, mode="r", *args, **kwargs):
        if any(m in mode for m in "wax"):
            failing(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(tf.io.gfile.GFile, "write", gfile_write)
    monkeypatch.setattr(builtins, "open", py_open)
    return left


def test_disk_full_during_training_is_one_error_and_the_rerun_resumes(base, tmp_path, capsys,
                                                                      monkeypatch):
    out = tmp_path / "out"
    ns = _with(base, output_dir=str(out), stages=["task"], use_augmented=False)
    left = _fail_writes(monkeypatch, "phase_state.json")
    assert main(["bin/distill", *argv(ns)]) == 2
    err = capsys.readouterr().err
    assert left["n"] == 0
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert re.search(r"^distill: error: .*phase_state\.json.*: No space left on device; the "
                     r"disk \(or quota\) is full.*re-run the same command", err)
    assert not (out / ".lock").exists() and not (out / "task" / "stage_done.json").exists()
    assert not [p for p in os.listdir(out / "task" / "intermediate") if ".tmp-" in p]
    monkeypatch.undo()
    assert main(["bin/distill", *argv(ns)]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert (out / "task" / "stage_done.json").exists()


def test_disk_full_during_augmentation_is_one_error_and_the_rerun_finishes(base, tmp_path,
                                                                           capsys, monkeypatch):
    ns = _with(base, output_dir=str(tmp_path / "full"), stages=["augment"])
    _fail_writes(monkeypatch, "train_aug.tsv.partial")
    assert main(["bin/distill", *argv(ns)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "No space left on device" in err and "partial" in err
    monkeypatch.undo()
    assert main(["bin/distill", *argv(ns)]) == 0
    clean = _with(ns, output_dir=str(tmp_path / "clean"))
    run(clean)
    name = os.path.join("augment", "train_aug.tsv")
    with open(os.path.join(ns.output_dir, name), "rb") as a, \
            open(os.path.join(clean.output_dir, name), "rb") as b:
        assert a.read() == b.read()


def test_a_read_only_or_file_output_dir_is_refused_before_anything_is_written(base, tmp_path,
                                                                              monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(PreflightError, match=r"--output_dir=.*a_file: is a file"):
        run(_with(base, output_dir=str(a_file), stages=["augment"]))
    with pytest.raises(PreflightError, match=r"a_file is a file, so the folder cannot be made"):
        run(_with(base, output_dir=str(a_file / "out"), stages=["augment"]))
    ro = tmp_path / "read_only"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(preflight_folder.os, "access",  # tests may run as root, who writes anyway
                        lambda p, mode: False if str(p) == str(ro) else real_access(p, mode))
    with pytest.raises(PreflightError, match=r"read_only: is not writable by this user"):
        run(_with(base, output_dir=str(ro), stages=["augment"]))
    assert os.listdir(ro) == []


def test_a_lock_that_cannot_be_created_names_the_folder_and_the_fix(tmp_path, monkeypatch):
    from tinybert_tf.pipeline.run import lock as lock_module

    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(lock_module.os, "open", read_only)
    with pytest.raises(LockError, match=r"cannot create the lock file .*\(Read-only file "
                       r"system\); the folder is read-only"):
        RunState(str(tmp_path)).lock().acquire()


@pytest.mark.parametrize("error,code,pattern", [
    (OSError(errno.EROFS, "Read-only file system", "/o/x"), 2,
     r"error: /o/x: Read-only file system; the folder is read-only"),
    (tf.errors.UnknownError(None, None, "/o/ckpt-4.data: No space left on device"), 2,
     r"error: /o/ckpt-4\.data: No space left on device; the disk"),
    # TensorFlow's op named before and after the path: dropped.
    (tf.errors.UnknownError(None, None, "{{function_node __wrapped__SaveV2_dtypes_26_device_/"
                            "job:localhost/replica:0/task:0/device:CPU:0}} /o/v.data: No space "
                            "left on device [Op:SaveV2]"), 2,
     r"error: /o/v\.data: No space left on device; the disk \(or quota\) is full"),
    (KeyboardInterrupt(), 130, r"interrupted; re-run the same command"),
    (TypeError("unsupported operand"), 1, r"internal error: TypeError: unsupported operand "
     r"\(the traceback is in .*distill-error-.*\.txt; please report it\)"),
])
def test_every_failure_is_one_line_with_a_documented_exit_code(monkeypatch, capsys, error, code,
                                                               pattern):
    from tinybert_tf.pipeline import main as main_module

    def fail(argv):
        raise error
    monkeypatch.setattr(main_module, "run_argv", fail)
    assert main(["bin/distill"]) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(pattern, err), err
    if code == 1:
        path = err.split("the traceback is in ")[1].split(";")[0]
        assert "Traceback" in open(path, encoding="utf-8").read()
        os.remove(path)


@pytest.mark.parametrize("tool,rerun", [
    ("augment", "re-run the same command: it resumes where it stopped"),
    ("export", "re-run the same command: it exports again"),
    ("benchmark", "re-run the same command: it times every model again"),
    ("pretokenize", "re-run the same command: it starts over (the shards this run wrote are "
                    "removed)"),
])
def test_a_full_disk_or_ctrl_c_says_what_a_rerun_of_each_tool_does(monkeypatch, capsys, tool,
                                                                   rerun):
    """Every tool said "it resumes where it stopped"; bin/export, bin/benchmark and
    bin/pretokenize start over."""
    module = load_tool(tool)
    for error, said in [(OSError(errno.ENOSPC, "No space left on device", "/o/x"),
                         f"bin/{tool}: error: /o/x: No space left on device; the disk (or "
                         f"quota) is full: free space or choose another folder; then {rerun}."),
                        (KeyboardInterrupt(), f"bin/{tool}: interrupted; {rerun}.")]:
        def fail(error=error):
            raise error
        monkeypatch.setattr(module, "run", fail)
        module.main([f"bin/{tool}"])
        assert capsys.readouterr().err.strip() == said


def test_a_truncated_word_vector_cache_is_rebuilt(base, tmp_path, capsys):
    cache = tmp_path / "vectors"
    args = ["--task=sst-2", f"--data_dir={base.data_dir}", "--augment_fallback", "--num_aug=2",
            f"--corpus={base.corpus}", f"--vector_cache={cache}"]
    rc, err = _bin_augment([*args, f"--output={tmp_path / 'a' / 'train_aug.tsv'}"], capsys)
    assert rc == 0, err
    (cached,) = [p for p in cache.iterdir() if p.suffix == ".bin"]
    data = cached.read_bytes()
    cached.write_bytes(data[: len(data) // 2])
    rc, err = _bin_augment([*args, f"--output={tmp_path / 'b' / 'train_aug.tsv'}"], capsys)
    assert rc == 0, err
    assert cached.read_bytes() == data  # rebuilt, the same vectors
    assert (tmp_path / "a" / "train_aug.tsv").read_bytes() == \
        (tmp_path / "b" / "train_aug.tsv").read_bytes()


def test_holder_facts_describe_the_run(tmp_path):
    lock = FileLock(str(tmp_path / ".lock"), "--output_dir=x", extra={"shard": "1/4"})
    with lock:
        holder = read_holder(str(tmp_path / ".lock"))
        assert isinstance(holder, Holder) and holder.pid == os.getpid()
        text = holder.describe()
        assert f"pid {os.getpid()}" in text and "shard 1/4" in text and "heartbeat" in text


# --- the other tools ---------------------------------------------------------------------------

def test_bin_export_refuses_a_model_that_does_not_fit_the_task_or_is_unfinished(tmp_path,
                                                                                tiny_vocab):
    from tinybert_tf.export import ExportError
    tool = load_tool("export")
    model = write_teacher(str(tmp_path / "run" / "task" / "model"), tiny_vocab,
                          head="classifier")  # 2 labels
    out = tmp_path / "out"
    mnli = os.path.join(REPO, "tests", "fixtures", "glue", "MNLI")
    sst2 = os.path.join(REPO, "tests", "fixtures", "glue", "SST-2")

    def export(*args):
        tool.FLAGS(["bin/export", f"--model_dir={model}", f"--output_dir={out}",
                    "--max_seq_len=16", "--export_formats=float32",
                    *(args or ["--task=sst-2", f"--data_dir={sst2}"])])
        try:
            return tool.run()
        finally:
            tool.FLAGS.unparse_flags()

    with pytest.raises(ExportError, match=r"--model_dir=.* has 2 outputs but task mnli has 3 "
                       r"labels.*Pass the --task"):
        export("--task=mnli", f"--data_dir={mnli}")
    assert not (out / "export").exists()  # no accuracy of 0.333 written
    (tmp_path / "run" / "run_config.json").write_text("{}")  # a pipeline folder ...
    with pytest.raises(ExportError, match=r"task stage, which has not finished"):
        export()  # ... whose task stage has no stage_done.json
    (tmp_path / "run" / "task" / "stage_done.json").write_text('{"stage": "task"}')
    lock = RunState(str(out)).lock().acquire()
    try:
        with pytest.raises(LockError, match=r"--output_dir=.*out is in use by another run"):
            export()
    finally:
        lock.release()


def test_bin_benchmark_quick_refuses_explicit_models(capsys):
    tool = load_tool("benchmark")
    tool.FLAGS(["bin/benchmark", "--quick", "--benchmark_models=bert_base_uncased,tiny"])
    try:
        assert tool.main(["bin/benchmark"]) == 2
    finally:
        tool.FLAGS.unparse_flags()
    err = capsys.readouterr().err
    assert re.search(r"^bin/benchmark: error: --quick .* would ignore --benchmark_models", err)


@pytest.mark.parametrize("args,pattern", [
    (["--benchmark_batch_sizes=1,0"], r"--benchmark_batch_sizes=1,0: every batch size must be "
                                      r">= 1"),
    (["--benchmark_batch_sizes=-2"], r"--benchmark_batch_sizes=-2: every batch size must be"),
    (["--quick", "--benchmark_runs=50"], r"--quick .* would ignore --benchmark_runs; drop"),
    (["--benchmark_output={file}"], r"--benchmark_output=.*a_file: is a file; give a folder"),
    # Made before the timing, named by its flag (it was an error without the flag).
    (["--benchmark_output={file}/sub"], r"--benchmark_output=.*a_file/sub: .*a_file/sub: "
                                        r"cannot create the folder .* Choose another folder\.$"),
    (["--benchmark_formats=keras,onnx"], r"--benchmark_formats=keras,onnx: unknown "
                                         r"runtime\(s\) onnx; use any of keras, "),
    (["--benchmark_formats="], r"--benchmark_formats=: no runtime given; use any of keras, "),
    # Each would be timed twice and be two rows of the table.
    (["--benchmark_batch_sizes=1,32,1"], r"--benchmark_batch_sizes=1,32,1: 1 given twice"),
    (["--benchmark_formats=keras,int8,keras"], r"--benchmark_formats=keras,int8,keras: keras "
                                               r"given twice"),
    (["--benchmark_models=tinybert_4l_312d"], r"--benchmark_models=tinybert_4l_312d: give two "
                                              r"models, .* a model directory"),
    # A folder whose benchmark.json another program wrote: it was replaced.
    (["--quick", "--benchmark_output={mine}"], r"--benchmark_output=.*mine: .*mine/benchmark"
                                               r"\.json is not an earlier bin/benchmark's"),
    # A chart of another program's, named benchmark.png, with no benchmark.json beside it.
    (["--quick", "--benchmark_output={chart}"], r"--benchmark_output=.*chart: .*chart/"
                                                r"benchmark\.png is not an earlier bin/"
                                                r"benchmark's \(it has no benchmark\.json"),
])
def test_bin_benchmark_refuses_bad_flags_before_timing_anything(tmp_path, capsys, args,
                                                                pattern):
    (tmp_path / "a_file").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "benchmark.json").write_text('{"mine": 1}')
    (tmp_path / "chart").mkdir()
    (tmp_path / "chart" / "benchmark.png").write_bytes(b"my chart")
    tool = load_tool("benchmark")
    tool.FLAGS(["bin/benchmark", *[a.format(file=tmp_path / "a_file", mine=tmp_path / "mine",
                                            chart=tmp_path / "chart") for a in args]])
    try:
        assert tool.main(["bin/benchmark"]) == 2
    finally:
        tool.FLAGS.unparse_flags()
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(r"^bin/benchmark: error: " + pattern,
                                                            err), err
    assert (tmp_path / "a_file").read_text() == "mine"
    assert os.listdir(tmp_path / "mine") == ["benchmark.json"]
    assert (tmp_path / "mine" / "benchmark.json").read_text() == '{"mine": 1}'
    assert os.listdir(tmp_path / "chart") == ["benchmark.png"]
    assert (tmp_path / "chart" / "benchmark.png").read_bytes() == b"my chart"


def test_bin_augment_writes_a_task_in_its_own_format_only(tmp_path, capsys):
    own = os.path.join(REPO, "tests", "fixtures", "own_data")
    args = ["--task=text_classification", f"--train_file={own}/reviews_train.csv",
            f"--validation_file={own}/reviews_dev.csv", "--augment_fallback",
            f"--word_vectors={tmp_path / 'v.txt'}"]
    rc, err = _bin_augment([*args, f"--output={tmp_path / 'aug' / 'train_aug.tsv'}"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert re.search(r"^bin/augment: error: --output=.*train_aug\.tsv: the task's data is "
                     r"written back in its own format \(CSV, as train_aug\.csv\).*name it "
                     r"train_aug\.csv", err), err
    rc, err = _bin_augment([*args, f"--output={tmp_path / 'aug' / 'train_aug'}"], capsys)
    assert rc == 2 and err.strip().endswith(
        "(CSV, as train_aug.csv), so a file without an extension would read back wrongly; "
        "name it train_aug.csv."), err
    assert not (tmp_path / "aug").exists()


def test_bin_augment_never_writes_over_the_task_data_it_reads(tmp_path, capsys):
    """The augmented file replaces --output when complete: given the training file as
    --output, it replaced the user's training data (exit 0)."""
    own = os.path.join(REPO, "tests", "fixtures", "own_data")
    train = tmp_path / "data" / "train.csv"
    os.makedirs(train.parent)
    shutil.copy(os.path.join(own, "reviews_train.csv"), train)
    before = train.read_bytes()
    rc, err = _bin_augment(["--task=text_classification", f"--train_file={train}",
                            f"--validation_file={own}/reviews_dev.csv", "--augment_fallback",
                            f"--word_vectors={tmp_path / 'v.txt'}", f"--output={train}"], capsys)
    assert rc == 2 and err.strip().splitlines()[-1] == (
        f"bin/augment: error: --output={train}: is the task's data file {train}, which the "
        f"augmented rows would replace; give a new file, e.g. {train.parent / 'train_aug.csv'}.")
    assert train.read_bytes() == before and sorted(os.listdir(train.parent)) == ["train.csv"]


_TOOLS_SCRIPT = r"""
import contextlib, io, runpy, sys
import tinybert_tf.startup
print("PACKAGE_IMPORTS_TF", "tensorflow" in sys.modules)
for tool in ("distill", "export", "augment", "benchmark", "pretokenize"):
    for flag in ("--help", "--helpfull", "--nosuch=1"):
        sys.argv = [f"bin/{tool}", flag]
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(f"{sys.argv[0]}", run_name="__main__")
            except SystemExit as e:
                code = e.code
        print("RC", tool, flag, code, out.getvalue().count("--"),
              "flags:" in out.getvalue(), repr(err.getvalue().strip()[-80:]))
print("KERAS_OPTIONALS_LOADED", "sklearn" in sys.modules, "matplotlib" in sys.modules)
import matplotlib.pyplot, sklearn.metrics  # hidden from keras only: they import as usual
print("IMPORTED_AFTER", matplotlib.pyplot.__name__, sklearn.metrics.__name__)
"""


def test_every_tool_answers_help_and_uses_exit_code_2_for_a_bad_flag():
    """Each bin/ script run as __main__ (one process: TensorFlow is imported once)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _TOOLS_SCRIPT], capture_output=True,
                          text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split(" ", 6)[1:] for line in proc.stdout.splitlines()
            if line.startswith("RC ")]
    assert len(rows) == 15, proc.stdout
    # The tools start TensorFlow without keras's optional imports (tinybert_tf.startup),
    # and importing the package alone imports no TensorFlow.
    assert "PACKAGE_IMPORTS_TF False" in proc.stdout
    assert "KERAS_OPTIONALS_LOADED False False" in proc.stdout
    assert "IMPORTED_AFTER matplotlib.pyplot sklearn.metrics" in proc.stdout
    for tool, flag, code, dashes, has_flags, err in rows:
        if flag == "--nosuch=1":
            assert code == "2" and "Unknown command line flag 'nosuch'" in err, (tool, err)
        else:
            assert code == "0" and has_flags == "True" and int(dashes) > 10, (tool, flag, err)


# --- a diverging phase names its learning-rate flag, and the redo the docs promise ---------

def _spec(stage, name, kind="", cell=None):
    from tinybert_tf.pipeline.training.phases import PhaseSpec
    spec = PhaseSpec(stage, name, f"/out/{stage}/{name}", "data", 8, 4, 1, 1, 1.0, 0, 1e-3,
                     "linear", 0.1, [], "--batch")
    spec.kind, spec.cell = kind, cell
    return spec


def test_every_diverging_phase_is_told_its_own_learning_rate_flag(tmp_path):
    import types

    from tinybert_tf.pipeline.main import parse_argv
    from tinybert_tf.pipeline.stages.common import divergence_hint
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path}", "--teacher_lr=3e-05",
                         "--quantize_lr=2e-05", "--pkd_lr=1e-05", "--finetune_lr=4e-05",
                         "--general_lr=1e-04", "--intermediate_lr=5e-05", "--pred_lr=6e-05",
                         "--pred_grid=16:1e-05,32:2e-05"])
    ctx = types.SimpleNamespace(config=config)
    for spec, lower in (
            (_spec("general", "distill"), "lower --general_lr (now 0.0001)"),
            (_spec("finetune_teacher", "train"), "lower --teacher_lr (now 3e-05)"),
            (_spec("quantize", "qat"), "lower --quantize_lr (now 2e-05)"),
            (_spec("task", "intermediate", "intermediate"), "lower --intermediate_lr (now 5e-05)"),
            (_spec("task", "intermediate_2", "intermediate"), "lower --intermediate_lr"),
            (_spec("task", "prediction", "prediction"), "lower --pred_lr (now 6e-05)"),
            (_spec("task", "pkd", "pkd"), "lower --pkd_lr (now 1e-05)"),
            (_spec("task", "finetune", "finetune"), "lower --finetune_lr (now 4e-05)"),
            (_spec("task", "prediction_b32_lr2e-05", "prediction", {"batch": 32, "lr": 2e-05}),
             "lower the learning rate of its --pred_grid cell 32:2e-05 (--pred_grid=16:1e-05,"
             "32:2e-05)")):
        hint = divergence_hint(ctx, spec)
        assert hint.startswith(lower), (spec.stage, spec.name, hint)
        assert hint.endswith(f", then redo the stage with --stages={spec.stage} --overwrite")
        assert "the phase's learning rate" not in hint


def test_a_diverged_stage_is_redone_with_the_lower_rate_as_the_message_and_docs_say(
        base, tmp_path, capsys):
    """docs/pipeline.md's fault table: a changed rate is another config, which a plain
    re-run refuses; `--stages=STAGE --overwrite` (the message's fix) redoes the stage."""
    from tinybert_tf.pipeline.training.loop import Diverged
    ns = _with(base, output_dir=str(tmp_path / "out"), stages=["task"], use_augmented=False,
               task_phases=["prediction"], pred_lr=1e9, pred_epochs=3)
    with pytest.raises(Diverged) as info:
        run(ns)
    assert ("too high a learning rate: lower --pred_lr (now 1e+09), then redo the stage with "
            "--stages=task --overwrite") in str(info.value)
    lower = _with(ns, pred_lr=1e-3, pred_epochs=1)
    with pytest.raises(OutputDirError, match=r"--pred_lr.*--overwrite"):
        run(lower)
    run(_with(lower, overwrite=True))
    assert RunState(lower.output_dir).is_done("task")
    doc = open(os.path.join(REPO, "docs", "pipeline.md"), encoding="utf-8").read()
    row = next(line for line in doc.splitlines() if "training diverged at step N" in line)
    assert "learning rate lowered and `--stages=STAGE --overwrite`" in row
    assert "a plain re-run refuses" in row
