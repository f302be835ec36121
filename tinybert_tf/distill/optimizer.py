"""AdamW with BERT's settings and the learning-rate schedules of the recipes.

We use keras' own `AdamW` (decoupled weight decay, lr-scaled as in BERT's
AdamWeightDecay) and its `exclude_from_weight_decay`, with one change: on the
TensorFlow backend each variable's Adam update runs as TensorFlow's fused
`ResourceApplyAdam` kernel, which computes keras' update formula in one op instead
of about fifteen (see `AdamW`). The schedule is ours, because keras has no "linear
warm-up then linear decay to 0" schedule.
"""
from __future__ import annotations

from typing import Optional, Sequence

import keras
import tensorflow as tf
from keras import ops

SCHEDULES = ("linear", "constant")
# Variables whose name contains one of these get no weight decay (BERT): LayerNorm
# gamma/beta and every bias (dense biases and the MLM head's output_bias).
NO_DECAY = ("gamma", "beta", "bias")


@keras.saving.register_keras_serializable(package="tinybert_tf")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = peak * step / warmup for step < warmup, then
    "linear": peak * max(0, (total - step) / (total - warmup))  (decays to 0 at total),
    "constant": peak.

    Args:
      peak_learning_rate: the rate reached at the end of warm-up.
      num_train_steps: total optimizer steps (the end of the linear decay).
      warmup_steps: steps of linear warm-up from 0 (0 = none).
      decay: "linear" or "constant".
    """

    def __init__(self, peak_learning_rate: float, num_train_steps: int, warmup_steps: int = 0,
                 decay: str = "linear"):
        if decay not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {decay!r}.")
        if peak_learning_rate <= 0:
            raise ValueError(f"learning rate must be > 0, got {peak_learning_rate}.")
        if decay == "linear" and num_train_steps < 1:
            raise ValueError(f"a linear schedule needs num_train_steps >= 1, got "
                             f"{num_train_steps}.")
        if warmup_steps < 0 or (decay == "linear" and warmup_steps > num_train_steps):
            raise ValueError(f"warmup_steps={warmup_steps} must lie in 0..num_train_steps="
                             f"{num_train_steps} (check --warmup_proportion).")
        self.peak_learning_rate = float(peak_learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak = self.peak_learning_rate
        if self.decay == "linear":
            span = float(max(self.num_train_steps - self.warmup_steps, 1))
            after = peak * ops.maximum(0.0, (self.num_train_steps - step) / span)
        else:
            after = ops.convert_to_tensor(peak, "float32")
        if self.warmup_steps == 0:
            return after
        warm = peak * step / float(self.warmup_steps)
        return ops.where(step < float(self.warmup_steps), warm, after)

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate,
                "num_train_steps": self.num_train_steps, "warmup_steps": self.warmup_steps,
                "decay": self.decay}


@keras.saving.register_keras_serializable(package="tinybert_tf")
class AdamW(keras.optimizers.AdamW):
    """keras' `AdamW`, its per-variable Adam step done by TensorFlow's fused kernel.

    `ResourceApplyAdam` computes what keras' `Adam.update_step` writes op by op:
    m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
    var -= m * lr sqrt(1 - b2^t) / (1 - b1^t) / (sqrt(v) + eps), t = iterations + 1.
    One kernel per variable instead of about fifteen ops: a train step's graph holds
    far fewer nodes (its trace is seconds shorter for a BERT student, which every
    phase pays) and runs fewer kernels per step. A sparse (IndexedSlices) gradient is
    made dense first: Adam's moments decay in every row anyway. (keras' own sparse
    path drifts from the formula under two mirrored replicas; this one does not:
    tests/distill/test_distill_optimizer.py.) Keras' update is kept for AMSGrad and other
    backends. Weight decay is keras' decoupled decay, lr-scaled, before the step.
    """

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # The step's scalars (t, b1^t, b2^t, lr) are built once per apply and dtype,
        # not once per variable.
        self._step_scalars = {}
        try:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        finally:
            self._step_scalars = None

    def _apply_weight_decay(self, variables):
        """keras' decoupled decay, var -= var * wd * lr, with lr (the schedule at this
        step) computed once per apply instead of once per variable."""
        if self.weight_decay is None or keras.backend.backend() != "tensorflow":
            return super()._apply_weight_decay(variables)
        factors: dict = {}

        def decay(distribution, variables):
            def fn(variable):
                if self._use_weight_decay(variable):
                    dtype = variable.dtype
                    if dtype not in factors:
                        factors[dtype] = (tf.cast(self.learning_rate, dtype)
                                          * tf.cast(self.weight_decay, dtype))
                    variable.assign_sub(variable * factors[dtype])

            for variable in variables:
                if isinstance(variable, keras.Variable):
                    variable = variable.value
                distribution.extended.update(variable, fn, group=False)

        tf.__internal__.distribute.interim.maybe_merge_call(
            decay, self._distribution_strategy, variables)

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        if isinstance(gradient, tf.IndexedSlices):
            # Embedding gradients (a gather's) come as rows; Adam's moments decay in
            # every row, so the update is dense either way (keras densifies too).
            gradient = tf.convert_to_tensor(gradient)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        cache = getattr(self, "_step_scalars", None)
        scalars = cache.get(dtype) if cache is not None else None
        if scalars is None:
            step = tf.cast(tf.convert_to_tensor(self.iterations) + 1, dtype)
            beta_1 = tf.cast(self.beta_1, dtype)
            beta_2 = tf.cast(self.beta_2, dtype)
            scalars = {"beta1_power": tf.pow(beta_1, step),
                       "beta2_power": tf.pow(beta_2, step),
                       "lr": tf.cast(learning_rate, dtype), "beta1": beta_1,
                       "beta2": beta_2, "epsilon": tf.cast(self.epsilon, dtype)}
            if cache is not None:
                cache[dtype] = scalars
        tf.raw_ops.ResourceApplyAdam(var=_handle(variable), m=_handle(m), v=_handle(v),
                                     grad=tf.cast(gradient, dtype), **scalars)


def _handle(variable):
    """The resource handle of a keras or tf variable (under tf.distribute, the
    component being updated)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


def create_optimizer(learning_rate: float, num_train_steps: int, warmup_steps: int = 0,
                     weight_decay: float = 0.01, schedule: str = "linear",
                     clip_norm: Optional[float] = None, epsilon: float = 1e-6,
                     beta_1: float = 0.9, beta_2: float = 0.999,
                     no_decay: Sequence[str] = NO_DECAY) -> keras.optimizers.Optimizer:
    """BERT's AdamW: epsilon 1e-6, weight decay off for LayerNorm and biases,
    linear warm-up then linear decay to 0 (or constant after warm-up).

    `clip_norm` sets keras' `global_clipnorm`, for plain `model.fit` (teacher
    fine-tuning). Leave it None with the `Distiller`, which clips the full-batch
    gradient itself (keras clips each replica's part under tf.distribute).
    """
    lr = WarmupSchedule(learning_rate, num_train_steps, warmup_steps, schedule)
    opt = AdamW(
        learning_rate=lr, weight_decay=weight_decay if weight_decay else None,
        beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
        global_clipnorm=clip_norm if clip_norm else None)
    if weight_decay:
        opt.exclude_from_weight_decay(var_names=list(no_decay))
    return opt
