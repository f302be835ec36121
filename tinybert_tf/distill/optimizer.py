"""AdamW with BERT's settings and the learning-rate schedules of the recipes.

We use keras' own `AdamW` (decoupled weight decay, lr-scaled as in BERT's
AdamWeightDecay) and its `exclude_from_weight_decay`; only the schedule is ours,
because keras has no "linear warm-up then linear decay to 0" schedule.
"""
from __future__ import annotations

from typing import Optional, Sequence

import keras
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
    opt = keras.optimizers.AdamW(
        learning_rate=lr, weight_decay=weight_decay if weight_decay else None,
        beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
        global_clipnorm=clip_norm if clip_norm else None)
    if weight_decay:
        opt.exclude_from_weight_decay(var_names=list(no_decay))
    return opt
