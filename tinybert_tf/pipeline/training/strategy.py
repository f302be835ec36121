"""`--strategy` -> a `tf.distribute.Strategy`, plus chief/worker facts for I/O.

Multi-worker runs (`--strategy=multi_worker`, TF_CONFIG) get TensorFlow's
coordination service with `--peer_timeout` seconds for every worker to
register (a worker that never starts fails the others with one clear error
instead of a silent wait); a worker that dies mid-run misses its heartbeats
(10 s, or --peer_timeout when shorter) and the others' collectives abort (an
UnavailableError, translated by `peer_error`). The coordination service
installs its own SIGTERM handler, which swallows the signal; `make_strategy`
restores the default action, and a training phase installs the preemption
handler (pipeline/training/loop.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from typing import Callable, Iterator, Optional

import tensorflow as tf
from tensorflow.python.eager import context as tf_context

from tinybert_tf import plugins
from tinybert_tf.pipeline.settings.configs import DEFAULT_PEER_TIMEOUT

# TensorFlow's default heartbeat timeout: a dead peer is noticed within 10 s (sooner
# when --peer_timeout is shorter).
_HEARTBEAT_TIMEOUT_MS = 10_000


class StrategyError(ValueError):
    """A strategy cannot be built here; the message names the flag and the fix."""


class PeerError(ValueError):
    """A multi-worker peer did not start, or stopped answering, within --peer_timeout."""


def _default(tpu: str) -> tf.distribute.Strategy:
    return tf.distribute.get_strategy()


def _one_device(tpu: str) -> tf.distribute.Strategy:
    gpus = tf.config.list_logical_devices("GPU")
    return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")


def _mirrored(tpu: str) -> tf.distribute.Strategy:
    """Every GPU, or every logical CPU device when there is none (tests split one CPU
    into two)."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy(devices=[d.name for d in gpus])
    # CPU replicas reduce on one device: collective ops add nothing there, and
    # their instance keys collide between strategies made in one process.
    return tf.distribute.MirroredStrategy(
        devices=[d.name for d in tf.config.list_logical_devices("CPU")],
        cross_device_ops=tf.distribute.ReductionToOneDevice())


def _tf_config() -> dict:
    try:
        return json.loads(os.environ.get("TF_CONFIG", "") or "{}")
    except ValueError as e:
        raise StrategyError(f"TF_CONFIG is not JSON ({e}); see BUILD.md for its form.") from None


def _cluster_jobs(config: dict) -> dict[str, int]:
    """Tasks per coordinated job ("chief", "worker") of a TF_CONFIG."""
    cluster = config.get("cluster") or {}
    return {job: len(cluster[job]) for job in ("chief", "worker") if cluster.get(job)}


def configure_peer_timeout(peer_timeout: float) -> None:
    """Before the first multi-worker strategy of the process: registration barrier and
    heartbeat timeouts of the coordination service, `peer_timeout` seconds each."""
    # A private TensorFlow module (2.x): only multi-worker runs need it.
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2

    config = _tf_config()
    jobs = _cluster_jobs(config)
    if not jobs or tf_context.context().coordination_service is not None:
        return
    ms = int(max(1.0, float(peer_timeout)) * 1000)
    leader = "chief" if "chief" in jobs else "worker"
    tf_context.context().configure_coordination_service(
        service_type="standalone", service_leader=f"/job:{leader}/replica:0/task:0",
        cluster_register_timeout_in_ms=ms,
        heartbeat_timeout_in_ms=min(ms, _HEARTBEAT_TIMEOUT_MS),
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name=job, num_tasks=n)
                          for job, n in jobs.items()])
    # Registration is a barrier with the timeout above (the Python API has no argument).
    tf_context.context().coordination_service.cluster_register_with_barrier = True


def _multi_worker(tpu: str) -> tf.distribute.Strategy:
    if "TF_CONFIG" not in os.environ:
        raise StrategyError("--strategy=multi_worker needs the TF_CONFIG environment "
                            "variable (cluster and task); see BUILD.md.")
    check_tf_config(_tf_config())
    return tf.distribute.MultiWorkerMirroredStrategy()


def check_tf_config(config: dict) -> None:
    """A TF_CONFIG's task must name a job of its cluster and an index of that job."""
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise StrategyError('TF_CONFIG has no "cluster" (a dict of job -> list of host:port); '
                            "see BUILD.md for its form.")
    if not isinstance(task, dict) or "type" not in task:
        raise StrategyError('TF_CONFIG has no "task" ({"type": "worker", "index": N}: this '
                            "process's place in the cluster); see BUILD.md.")
    job, index = task.get("type"), task.get("index", 0)
    if job not in cluster:
        raise StrategyError(f"TF_CONFIG: this process's task type {job!r} is not a job of the "
                            f"cluster (jobs: {', '.join(sorted(cluster))}); fix task.type.")
    hosts = cluster[job]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(hosts):
        raise StrategyError(f"TF_CONFIG: task index {index!r} of job {job!r}, but the cluster "
                            f"lists {len(hosts)} {job} task(s) (indexes 0..{len(hosts) - 1}); "
                            "give each process its own index in that range.")


def _tpu(tpu: str) -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
        raise StrategyError(f"--strategy=tpu: no TPU reachable at --tpu={tpu!r} ({e}).") from e
    return tf.distribute.TPUStrategy(resolver)


# --strategy name -> builder(tpu address). A new strategy is one `register_strategy` call.
BUILDERS: dict[str, Callable[[str], tf.distribute.Strategy]] = {}


def register_strategy(name: str, builder: Callable[[str], tf.distribute.Strategy],
                      replace: bool = False) -> Callable[[str], tf.distribute.Strategy]:
    """Make `--strategy=NAME` build `builder(tpu_address)`; a name already registered is
    refused unless `replace=True`."""
    return plugins.register(BUILDERS, name, builder, what="strategy", replace=replace)


for _name, _builder in (("default", _default), ("one_device", _one_device),
                        ("mirrored", _mirrored), ("multi_worker", _multi_worker),
                        ("tpu", _tpu)):
    register_strategy(_name, _builder)
STRATEGIES = tuple(BUILDERS)


def make_strategy(name: str, tpu: str = "",
                  peer_timeout: float = DEFAULT_PEER_TIMEOUT) -> tf.distribute.Strategy:
    """Build the strategy named by `--strategy` (`tpu`: the --tpu address).

    Under a TF_CONFIG cluster, a peer that does not register within
    `peer_timeout` seconds is a PeerError naming the missing tasks.
    """
    if name not in BUILDERS:
        raise StrategyError(f"--strategy={name!r} is unknown; use one of "
                            f"{', '.join(BUILDERS)}.")
    if name == "multi_worker":
        configure_peer_timeout(peer_timeout)
    with peer_errors(peer_timeout):
        strategy = BUILDERS[name](tpu)
    if threading.current_thread() is threading.main_thread():
        # The coordination service's SIGTERM notifier swallows the signal: restore the
        # default (end the process) until a training phase installs its own handler.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return strategy


def peer_error(error: BaseException, peer_timeout: float) -> Optional[PeerError]:
    """The one-line PeerError a TensorFlow error of a multi-worker run means, or None."""
    if not isinstance(error, (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
                              tf.errors.AbortedError, tf.errors.CancelledError)):
        return None
    config = _tf_config()
    if not _cluster_jobs(config):
        return None
    text = " ".join((getattr(error, "message", None) or str(error)).split())
    task = config.get("task", {})
    me = f"{task.get('type', '?')} {task.get('index', '?')}"
    if "Barrier timed out" in text or "register" in text.lower():
        missing = text.split("Some timed out task names:", 1)[-1].strip()[:200] \
            if "Some timed out task names:" in text else "a peer"
        return PeerError(
            f"TF_CONFIG ({me}): not every worker started within --peer_timeout="
            f"{peer_timeout:g}s (missing: {missing}); start every task of the cluster "
            "with the same command (each with its own TF_CONFIG task), or raise "
            "--peer_timeout.")
    return PeerError(
        f"TF_CONFIG ({me}): a worker stopped answering (it died, was preempted or lost "
        f"the network) and the run cannot continue without it ({text[:200]}); restart "
        "every worker with the same command: they resume from the last checkpoint.")


@contextlib.contextmanager
def peer_errors(peer_timeout: float = DEFAULT_PEER_TIMEOUT) -> Iterator[None]:
    """Around multi-worker work: a lost or missing peer becomes one PeerError."""
    try:
        yield
    except tf.errors.OpError as e:
        translated = peer_error(e, peer_timeout)
        if translated is None:
            raise
        raise translated from None


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Processes that each build an input pipeline: MultiWorkerMirroredStrategy's
    workers, a TPU pod's hosts, else 1."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return max(1, sum(_cluster_jobs(_tf_config()).values()))
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return max(1, int(getattr(strategy.extended, "num_hosts", 1)))
    return 1


# Dtypes the collective ops of MultiWorkerMirroredStrategy broadcast (CollectiveBcastSend
# and Recv, TF 2.20): a variable created under it in another dtype (bfloat16) fails at
# its first read with an InvalidArgumentError.
COLLECTIVE_DTYPES = frozenset({"bool", "float16", "float32", "float64", "int32", "int64"})


def can_create_variables(strategy: tf.distribute.Strategy, dtype: str) -> bool:
    """Whether variables of `dtype` can be created under `strategy` (multi-worker
    strategies broadcast each variable's initial value from the chief)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return dtype in COLLECTIVE_DTYPES
    return True


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the one process that writes checkpoints, models and reports."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    config = _tf_config()
    task = config.get("task", {})
    task_type, task_id = task.get("type"), task.get("index", 0)
    has_chief = "chief" in _cluster_jobs(config)
    return task_type in (None, "chief") or (task_type == "worker" and task_id == 0
                                            and not has_chief)


# Under a chief's folder, the workers' own (`worker_dir`).
WORKERS_DIR = ".workers"


def worker_dir(directory: str, strategy: tf.distribute.Strategy) -> str:
    """Where this process writes: `directory` on the chief, a scratch folder elsewhere.

    Every MultiWorkerMirroredStrategy worker must take part in saving (the
    save is collective), but only the chief's copy is kept.
    """
    if is_chief(strategy):
        return directory
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    return os.path.join(directory, WORKERS_DIR, f"{task['type']}_{task['index']}")
