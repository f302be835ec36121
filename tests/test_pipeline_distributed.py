"""Batch sizes are global: one replica, two mirrored replicas (two logical CPUs)
and two workers (two local processes, TF_CONFIG on 127.0.0.1) end with the same
student from the same global batches. Dropout is off so replicas draw no
different random masks."""
from __future__ import annotations

import json
import os
import socket
import subprocess

import numpy as np
import pytest

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


def test_two_workers_match_one_replica_and_only_chief_writes(setup):
    tmp, ns, single = setup
    out = tmp / "multi"
    flagfile = write_flagfile(type(ns)(**{**vars(ns), "output_dir": str(out),
                                          "strategy": "multi_worker"}),
                              str(tmp / "multi.cfg"))
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="3")
        procs.append(subprocess.Popen(distill_command(flagfile), cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
    _assert_same(single, load_weights(str(out / "task" / "model")), 1e-4)
    # The worker's checkpoints went to its scratch folder, not next to the chief's.
    chief_ckpts = os.listdir(out / "task" / "prediction" / "ckpt")
    assert any(name.startswith("ckpt-") for name in chief_ckpts)
    assert os.path.isdir(out / "task" / "prediction" / "ckpt" / ".workers" / "worker_1")
