"""A task-distillation run killed with SIGKILL mid-phase, or stopped with SIGTERM (a
preemption: checkpoint at the next step boundary, exit code 75, then resumed from a
copy of its folder), and re-run ends with the same weights as an uninterrupted run of
the same command.

Only the interrupted runs need a process of their own (a signal, a kill); the
uninterrupted run and the re-runs run in this one, as `bin/distill` runs them."""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from pipeline_helpers import (
    REPO,
    distill_command,
    load_weights,
    run,
    tiny_flags,
    with_flags,
    write_flagfile,
    write_teacher,
)


def _first_checkpoint(out: str):
    return glob.glob(os.path.join(out, "task", "*", "ckpt", "ckpt-*.index"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_vocab):
    """The flag values and flagfile of a short task-distillation run (one phase: two
    epochs of 6 steps, a checkpoint every 2; the epoch-end evaluation leaves seconds
    to interrupt it after its first checkpoint) and its uninterrupted weights."""
    tmp = tmp_path_factory.mktemp("resume")
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier")
    ns = tiny_flags(tmp, tiny_vocab, stages=["task"], general_model="none",
                    task_teacher=teacher, use_augmented=False, task_phases=["prediction"],
                    pred_epochs=2, checkpoint_every=2)
    flagfile = write_flagfile(ns, str(tmp / "ref.cfg"))
    run(with_flags(ns, output_dir=str(tmp / "ref")))
    return ns, flagfile, load_weights(str(tmp / "ref" / "task" / "model"))


def _interrupt(flagfile: str, out, sig: int) -> subprocess.CompletedProcess:
    """Start the command, send `sig` as soon as its first checkpoint exists."""
    proc = subprocess.Popen(distill_command(flagfile, f"--output_dir={out}"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    deadline = time.time() + 240
    while not _first_checkpoint(str(out)) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=240)
    assert not os.path.isfile(out / "task" / "stage_done.json")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _resume_and_compare(ns, out, expected, capfd) -> str:
    """The same command re-run (in this process) on `out`: it resumes and ends with
    the `expected` weights; returns what it printed."""
    capfd.readouterr()
    run(with_flags(ns, output_dir=str(out)))
    captured = capfd.readouterr()
    text = captured.err + captured.out
    assert "resumed from" in text
    b = load_weights(str(out / "task" / "model"))
    assert expected.keys() == b.keys()
    for key in expected:
        np.testing.assert_allclose(expected[key], b[key], atol=1e-5, err_msg=key)
    return text


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, reference, capfd):
    ns, flagfile, expected = reference
    _interrupt(flagfile, tmp_path / "killed", signal.SIGKILL)
    _resume_and_compare(ns, tmp_path / "killed", expected, capfd)


def test_sigterm_saves_a_checkpoint_exits_75_and_the_resume_matches(tmp_path, reference,
                                                                   capfd):
    ns, flagfile, expected = reference
    out = tmp_path / "preempted"
    stopped = _interrupt(flagfile, out, signal.SIGTERM)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "SIGTERM: stopping at the next step boundary" in stopped.stderr
    step = int(stopped.stderr.split("stopped by SIGTERM at step ")[1].split(",")[0])
    assert glob.glob(str(out / "task" / "*" / "ckpt" / f"ckpt-{step}.index"))
    # Resumed elsewhere, as on another VM after a preemption: the folder copied without
    # its mtimes (`cp -r`, `gsutil cp -r`), the original gone.
    moved = tmp_path / "elsewhere"
    shutil.copytree(out, moved, copy_function=shutil.copyfile)
    shutil.rmtree(out)
    text = _resume_and_compare(ns, moved, expected, capfd)
    assert f"(step {step})" in text
