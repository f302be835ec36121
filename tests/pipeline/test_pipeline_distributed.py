"""Batch sizes are global: one replica, two mirrored replicas (two logical CPUs)
and two workers (two local processes, TF_CONFIG on 127.0.0.1) end with the same
student from the same global batches. Dropout is off so replicas draw no
different random masks.

Multi-worker faults: a SIGTERM to one worker stops both at the same step with a
checkpoint (exit code 75) and the re-run ends as if uninterrupted; a worker that
dies, or never starts, is one clear error on the other within the timeout."""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from numerics import BFLOAT16_CRASH
from pipeline_helpers import (
    REPO,
    distill_command,
    load_weights,
    run,
    tiny_flags,
    write_flagfile,
    write_student_config,
    write_teacher,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_vocab):
    tmp = tmp_path_factory.mktemp("dist")
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier",
                            dropout=0.0)
    ns = tiny_flags(tmp, tiny_vocab, stages=["task"], general_model="none",
                    task_teacher=teacher, use_augmented=False, intermediate_epochs=1,
                    pred_epochs=1, task_batch_size=4, checkpoint_every=100,
                    student_config=write_student_config(str(tmp / "s.json"), len(tiny_vocab),
                                                        dropout=0.0))
    single = type(ns)(**{**vars(ns), "output_dir": str(tmp / "single")})
    run(single)
    return tmp, ns, load_weights(str(tmp / "single" / "task" / "model"))


def _assert_same(a, b, atol):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=atol, err_msg=key)


@pytest.mark.numerics
def test_mirrored_two_replicas_match_one(setup):
    tmp, ns, single = setup
    mirrored = type(ns)(**{**vars(ns), "output_dir": str(tmp / "mirrored"),
                           "strategy": "mirrored"})
    run(mirrored)
    _assert_same(single, load_weights(str(tmp / "mirrored" / "task" / "model")), 1e-5)


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _tf_config(workers, index: int) -> str:
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker",
                                                                "index": index}})


def _start_workers(flagfile: str, workers) -> list[subprocess.Popen]:
    procs = []
    for index in range(len(workers)):
        env = dict(os.environ, TF_CONFIG=_tf_config(workers, index), TF_CPP_MIN_LOG_LEVEL="3")
        procs.append(subprocess.Popen(distill_command(flagfile), cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return procs


def _multi_worker_flagfile(tmp, ns, name: str) -> str:
    return write_flagfile(type(ns)(**{**vars(ns), "output_dir": str(tmp / name),
                                      "strategy": "multi_worker"}), str(tmp / f"{name}.cfg"))


def _wait_for(pattern: str, procs, seconds: float = 240) -> None:
    """Until a file matching `pattern` exists (while every process runs)."""
    deadline = time.time() + seconds
    while not glob.glob(pattern) and time.time() < deadline:
        assert all(p.poll() is None for p in procs), "a worker ended early"
        time.sleep(0.05)
    assert glob.glob(pattern), f"{pattern} did not appear"


def test_two_workers_stop_together_on_sigterm_and_end_as_one_replica_with_chief_writing(setup):
    """Two workers (one run, preempted and re-run: the uninterrupted two-worker run
    would train the same steps again) end with one replica's weights; a SIGTERM to
    one stops both at the same step; only the chief writes next to the output."""
    tmp, ns, single = setup
    out = tmp / "preempted"
    flagfile = _multi_worker_flagfile(tmp, ns, "preempted")
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs = _start_workers(flagfile, workers)
    # The intermediate phase has begun (its TensorBoard folder exists): preempt worker 1.
    _wait_for(str(out / "logs" / "task" / "intermediate" / "*"), procs)
    procs[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    steps = []
    # Worker 0 received no signal: it says it stopped with the others.
    for p, text, how in zip(procs, outputs, ["stopped with the other workers (one of them "
                                             "was asked to stop)", "stopped by SIGTERM"]):
        assert p.returncode == 75, text[-3000:]
        steps.append(text.split(f"{how} at step ")[1].split(",")[0])
    assert steps[0] == steps[1]  # both saved the same step
    # The worker's checkpoints went to its scratch folder, not next to the chief's.
    (saved,) = glob.glob(str(out / "task" / "*" / "ckpt" / f"ckpt-{steps[0]}.index"))
    assert os.path.isdir(os.path.join(os.path.dirname(saved), ".workers", "worker_1"))
    rerun = _start_workers(flagfile, workers)
    for p, text in zip(rerun, [p.communicate(timeout=400)[0] for p in rerun]):
        assert p.returncode == 0, text[-3000:]
        assert f"(step {steps[0]})" in text
    _assert_same(single, load_weights(str(out / "task" / "model")), 1e-4)
    # The stage done, the chief deleted its checkpoints; the worker's scratch copies stay
    # (it cannot tell when the chief has marked the stage done).
    assert not glob.glob(str(out / "task" / "*" / "ckpt" / "ckpt-*"))
    assert glob.glob(str(out / "task" / "*" / "ckpt" / ".workers" / "worker_1" / "ckpt-*"))


def test_a_worker_that_dies_is_one_clear_error_on_the_other(setup):
    """A bfloat16 teacher here, on every host where TensorFlow runs one: multi-worker
    collectives broadcast no bfloat16 variable, so its weights stay float32 (the
    workers reach the intermediate phase only if they do)."""
    tmp, ns, _ = setup
    out = tmp / "dead_peer"
    bfloat16 = not BFLOAT16_CRASH
    flagfile = _multi_worker_flagfile(tmp, type(ns)(**{
        **vars(ns), "teacher_precision": "bfloat16" if bfloat16 else "float32"}), "dead_peer")
    procs = _start_workers(flagfile, [f"127.0.0.1:{p}" for p in _free_ports(2)])
    _wait_for(str(out / "logs" / "task" / "intermediate" / "*"), procs)
    procs[1].kill()
    start = time.time()
    text = procs[0].communicate(timeout=120)[0]
    procs[1].wait()
    assert procs[0].returncode == 2, text[-3000:]
    assert "a worker stopped answering" in text and "Traceback" not in text
    assert ("weights kept in float32" in text) == bfloat16
    assert time.time() - start < 60  # heartbeats: noticed within ~10 s


def test_a_worker_that_never_starts_is_an_error_within_peer_timeout():
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    code = ("from tinybert_tf.startup import import_tensorflow\nimport_tensorflow()\n"
            "from tinybert_tf.pipeline.training.strategy import make_strategy\n"
            "make_strategy('multi_worker', peer_timeout=3)")
    env = dict(os.environ, TF_CONFIG=_tf_config(workers, 0), TF_CPP_MIN_LOG_LEVEL="3")
    start = time.time()
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode != 0
    assert "PeerError" in done.stderr and "not every worker started within --peer_timeout=3s" \
        in done.stderr, done.stderr[-3000:]
    assert "/job:worker/replica:0/task:1" in done.stderr
    assert time.time() - start < 60
