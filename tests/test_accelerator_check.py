"""benchmarks/accelerator_check.sh without a usable GPU: on a CPU-only machine it says
so and exits 0; when nvidia-smi sees a GPU that TensorFlow cannot use it exits 1 with
the fix. (The GPU path itself needs a GPU; see BUILD.md.)"""
from __future__ import annotations

import os
import subprocess

from pipeline_helpers import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "accelerator_check.sh")


def _run(tmp_path, fake_nvidia_smi: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + fake_nvidia_smi + "\n")
    tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               CUDA_VISIBLE_DEVICES="")
    return subprocess.run(["bash", SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_cpu_only_machine_says_so_and_exits_0(tmp_path):
    done = _run(tmp_path, "echo 'NVIDIA-SMI has failed: no devices' >&2; exit 9")
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU on this machine" in done.stdout


def test_a_gpu_tensorflow_cannot_use_is_an_error_with_the_fix(tmp_path):
    done = _run(tmp_path, 'case "$1" in -L) echo "GPU 0: NVIDIA H200 (UUID: x)";; '
                          '*) echo "NVIDIA H200";; esac')
    assert done.returncode == 1
    assert "TensorFlow finds no GPU" in done.stderr and "tensorflow[and-cuda]" in done.stderr
