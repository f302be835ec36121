"""Work-arounds for Keras 3 trainer behaviour that breaks our distributed training."""
from __future__ import annotations

import tensorflow as tf
from keras import tree


class MultiWorkerBuildMixin:
    """Keras 3.15's `fit` builds a model symbolically from the first batch, and
    for that reduces the distributed batch with `strategy.reduce("MEAN", ...)`.
    Under MultiWorkerMirroredStrategy that collective reduce fails on a dict of
    inputs ("Attempt to convert a value ({...PerReplica...}) to a Tensor"). A
    symbolic build only needs shapes and dtypes, so we build from this worker's
    first local replica batch instead. Other strategies keep Keras' path.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is None or not isinstance(
                strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:
            batch = next(it)
            local = tree.map_structure(
                lambda v: strategy.experimental_local_results(v)[0]
                if isinstance(v, tf.distribute.DistributedValues) else v, batch)
            with strategy.scope():
                self._symbolic_build(data_batch=local)
            return

    def _multi_worker_logs(self, logs):
        """Keras 3.15 reduces step outputs under MultiWorkerMirroredStrategy with
        `strategy.reduce("MEAN", v, axis=0)`, which fails on scalars; give each
        metric a leading axis of 1 there so the reduce yields the scalar mean."""
        strategy = tf.distribute.get_strategy()
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return logs
        return {k: tf.reshape(v, [1]) for k, v in logs.items()}
