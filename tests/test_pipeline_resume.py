"""A task-distillation run killed with SIGKILL mid-phase and re-run ends with the
same weights as an uninterrupted run of the same command."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import time

import numpy as np

from pipeline_helpers import (
    REPO,
    distill_command,
    load_weights,
    run_distill,
    tiny_flags,
    write_flagfile,
    write_teacher,
)


def _first_checkpoint(out: str):
    return glob.glob(os.path.join(out, "task", "*", "ckpt", "ckpt-*.index"))


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, tiny_vocab):
    teacher = write_teacher(str(tmp_path / "task_teacher"), tiny_vocab, head="classifier")
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], general_model="none",
                    task_teacher=teacher, use_augmented=False, intermediate_epochs=3,
                    pred_epochs=2, checkpoint_every=2)
    # Uninterrupted reference.
    ref_file = write_flagfile(ns, str(tmp_path / "ref.cfg"))
    ref = run_distill(ref_file, f"--output_dir={tmp_path / 'ref'}")
    assert ref.returncode == 0, ref.stderr[-3000:]

    # Same command, killed as soon as its first checkpoint exists, then re-run.
    out = tmp_path / "killed"
    cmd = distill_command(ref_file, f"--output_dir={out}")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    deadline = time.time() + 240
    while not _first_checkpoint(str(out)) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not os.path.isfile(out / "task" / "stage_done.json")

    resumed = run_distill(ref_file, f"--output_dir={out}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr + resumed.stdout

    a = load_weights(str(tmp_path / "ref" / "task" / "model"))
    b = load_weights(str(out / "task" / "model"))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=1e-5, err_msg=key)
