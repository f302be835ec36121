"""`--strategy` -> a `tf.distribute.Strategy`, plus chief/worker facts for I/O."""
from __future__ import annotations

import json
import os

import tensorflow as tf


class StrategyError(ValueError):
    """A strategy cannot be built here; the message names the flag and the fix."""


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


def _multi_worker(tpu: str) -> tf.distribute.Strategy:
    if "TF_CONFIG" not in os.environ:
        raise StrategyError("--strategy=multi_worker needs the TF_CONFIG environment "
                            "variable (cluster and task); see BUILD.md.")
    return tf.distribute.MultiWorkerMirroredStrategy()


def _tpu(tpu: str) -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
        raise StrategyError(f"--strategy=tpu: no TPU reachable at --tpu={tpu!r} ({e}).") from e
    return tf.distribute.TPUStrategy(resolver)


# --strategy name -> builder(tpu address). A new strategy is one entry here.
BUILDERS = {"default": _default, "one_device": _one_device, "mirrored": _mirrored,
            "multi_worker": _multi_worker, "tpu": _tpu}
STRATEGIES = tuple(BUILDERS)


def make_strategy(name: str, tpu: str = "") -> tf.distribute.Strategy:
    """Build the strategy named by `--strategy` (`tpu`: the --tpu address)."""
    if name not in BUILDERS:
        raise StrategyError(f"--strategy={name!r} is unknown; use one of "
                            f"{', '.join(STRATEGIES)}.")
    return BUILDERS[name](tpu)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the one process that writes checkpoints, models and reports."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    task_type, task_id = task.get("type"), task.get("index", 0)
    return task_type in (None, "chief") or (task_type == "worker" and task_id == 0)


def worker_dir(directory: str, strategy: tf.distribute.Strategy) -> str:
    """Where this process writes: `directory` on the chief, a scratch folder elsewhere.

    Every MultiWorkerMirroredStrategy worker must take part in saving (the
    save is collective), but only the chief's copy is kept.
    """
    if is_chief(strategy):
        return directory
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    return os.path.join(directory, ".workers", f"{task['type']}_{task['index']}")
