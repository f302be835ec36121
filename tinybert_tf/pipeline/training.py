"""A resumable training phase: keras `fit` driven epoch by epoch with checkpoints.

Each phase (general distillation, teacher fine-tuning, the intermediate and
prediction phases of task distillation) saves a `tf.train.CheckpointManager`
checkpoint every N steps and at its end. The checkpoint holds what the phase
trains (student, projections), the optimizer and the step. The position in
the data is the step: each epoch's dataset is rebuilt with the epoch's seed
and the batches already consumed are skipped, so a run killed with SIGKILL and
re-run continues on the very batches it would have seen.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tinybert_tf.files import read_json, write_bytes_atomic, write_json_atomic
from tinybert_tf.pipeline.strategy import is_chief, worker_dir

log = logging.getLogger("tinybert_tf")


@dataclasses.dataclass
class Phase:
    """One resumable training phase.

    make_dataset(epoch) returns that epoch's batches (global batch size), at
    least `steps_per_epoch` of them. `evaluate()` returns dev metrics;
    `on_best(metrics)` is called when `select_metric` improves (e.g. to save
    the best model).
    """

    name: str
    directory: str
    model: keras.Model
    checkpoint_objects: dict[str, Any]
    make_dataset: Callable[[int], tf.data.Dataset]
    steps_per_epoch: int
    epochs: float
    max_steps: int = 0
    evaluate: Optional[Callable[[], dict[str, float]]] = None
    select_metric: Optional[str] = None
    on_best: Optional[Callable[[dict[str, float]], None]] = None
    eval_every: int = 0

    @property
    def total_steps(self) -> int:
        return schedule_steps(self.epochs, self.steps_per_epoch, self.max_steps)


def schedule_steps(epochs: float, steps_per_epoch: int, max_steps: int = 0) -> int:
    """Optimizer steps of a phase: ceil(epochs * steps_per_epoch), capped by max_steps > 0.

    The one formula for a phase's length; stages size their learning-rate
    schedules with it before the Phase (which needs the optimizer) exists.
    """
    total = int(math.ceil(epochs * steps_per_epoch))
    return min(total, max_steps) if max_steps > 0 else total


class _PhaseCallback(keras.callbacks.Callback):
    """Counts steps, saves checkpoints, logs scalars and history, evaluates."""

    def __init__(self, runner: "_Runner"):
        super().__init__()
        self.runner = runner

    def on_train_batch_end(self, batch, logs=None):
        r = self.runner
        r.step.assign_add(1)
        step = int(r.step.numpy())
        r.record(step, logs or {})
        if r.phase.eval_every and step % r.phase.eval_every == 0:
            r.run_eval(step)
        if step % r.checkpoint_every == 0 and step < r.phase.total_steps:
            r.save(step)
        if step >= r.phase.total_steps:
            self.model.stop_training = True


class _Runner:
    def __init__(self, phase: Phase, strategy: tf.distribute.Strategy,
                 checkpoint_every: int, keep_checkpoints: int, log_every: int,
                 verbose: int):
        self.phase = phase
        self.strategy = strategy
        self.checkpoint_every = max(1, checkpoint_every)
        self.log_every = max(1, log_every)
        self.verbose = verbose
        self.chief = is_chief(strategy)
        os.makedirs(phase.directory, exist_ok=True)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.checkpoint = tf.train.Checkpoint(step=self.step, **phase.checkpoint_objects)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, worker_dir(os.path.join(phase.directory, "ckpt"), strategy),
            max_to_keep=keep_checkpoints)
        self.history_path = os.path.join(phase.directory, "history.jsonl")
        self.state_path = os.path.join(phase.directory, "phase_state.json")
        self.writer = tf.summary.create_file_writer(
            worker_dir(os.path.join(os.path.dirname(phase.directory), "..", "logs",
                                    os.path.basename(os.path.dirname(phase.directory)),
                                    phase.name), strategy))
        self.state = read_json(self.state_path, {"best": None, "evals": []})

    # --- persistence ----------------------------------------------------------
    def restore(self) -> int:
        optimizer = getattr(self.phase.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            # Create the slots now so a checkpoint restores them (not lazily later).
            with self.strategy.scope():
                optimizer.build(self.phase.model.trainable_variables)
        latest = self.manager.latest_checkpoint
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            print(f"[{self.phase.name}] resumed from {latest} (step {int(self.step.numpy())})",
                  flush=True)
        self._truncate_history(int(self.step.numpy()))
        return int(self.step.numpy())

    def save(self, step: int) -> None:
        self.manager.save(checkpoint_number=step)  # collective: every worker saves
        if self.chief:
            write_json_atomic(self.state_path, self.state)

    def _truncate_history(self, step: int) -> None:
        """Drop history lines written after the checkpoint we resume from."""
        if not self.chief or not os.path.isfile(self.history_path):
            return
        with open(self.history_path, encoding="utf-8") as f:
            lines = [ln for ln in f if ln.strip() and json.loads(ln)["step"] <= step]
        write_bytes_atomic(self.history_path, "".join(lines).encode("utf-8"))

    # --- logging ----------------------------------------------------------------
    def learning_rate(self) -> Optional[float]:
        opt = getattr(self.phase.model, "optimizer", None)
        if opt is None:
            return None
        lr = opt.learning_rate
        try:
            return float(lr(opt.iterations) if callable(lr) else lr)
        except (TypeError, ValueError):
            return None

    def record(self, step: int, logs: dict[str, Any]) -> None:
        if step % self.log_every and step != self.phase.total_steps:
            return
        row = {"step": step}
        row.update({k: float(v) for k, v in logs.items() if _is_number(v)})
        lr = self.learning_rate()
        if lr is not None:
            row["learning_rate"] = lr
        with self.writer.as_default(step=step):
            for k, v in row.items():
                if k != "step":
                    tf.summary.scalar(k, v)
        if self.chief:
            with open(self.history_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def run_eval(self, step: int) -> Optional[dict[str, float]]:
        if self.phase.evaluate is None:
            return None
        metrics = self.phase.evaluate()
        with self.writer.as_default(step=step):
            for k, v in metrics.items():
                tf.summary.scalar(f"dev_{k}", v)
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
        log.info("%s step %d: dev %s", self.phase.name, step, shown)
        print(f"[{self.phase.name}] step {step}: dev {shown}", flush=True)
        self.state["evals"].append({"step": step, **metrics})
        key = self.phase.select_metric
        if key is not None and (self.state["best"] is None
                                or metrics[key] > self.state["best"][key]):
            self.state["best"] = {"step": step, **metrics}
            if self.phase.on_best is not None:
                self.phase.on_best(metrics)
        if self.chief:
            write_json_atomic(self.state_path, self.state)
        return metrics

    # --- the loop ---------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        phase = self.phase
        total = phase.total_steps
        step = self.restore()
        done_path = os.path.join(phase.directory, "phase_done.json")
        if os.path.isfile(done_path) and step >= total:
            log.info("%s: already finished (%d steps); skipping", phase.name, step)
            return read_json(done_path)
        while step < total:
            epoch, offset = divmod(step, phase.steps_per_epoch)
            steps = min(phase.steps_per_epoch - offset, total - step)
            dataset = phase.make_dataset(epoch)
            if offset:
                dataset = dataset.skip(offset)
            if self.verbose:
                print(f"[{phase.name}] epoch {epoch + 1}/{math.ceil(total / phase.steps_per_epoch)}"
                      f" steps {step}..{step + steps} of {total}", flush=True)
            # steps_per_epoch gives the progress bar its length; the order is the
            # dataset's own (epoch_order), so Keras must not be asked to shuffle.
            phase.model.fit(dataset.take(steps), epochs=1, steps_per_epoch=steps,
                            shuffle=False, verbose=self.verbose,
                            callbacks=[_PhaseCallback(self)])
            new_step = int(self.step.numpy())
            if new_step == step:
                raise RuntimeError(f"{phase.name}: the dataset of epoch {epoch} yielded no "
                                   "batch; check the data and the batch size.")
            step = new_step
            if step % phase.steps_per_epoch == 0 or step >= total:
                if not phase.eval_every:
                    self.run_eval(step)
            self.save(step)
        evals = self.state.get("evals", [])
        if phase.evaluate is not None and (not evals or evals[-1]["step"] != step):
            self.run_eval(step)
            self.save(step)
        result = {"steps": step, "best": self.state.get("best"),
                  "evals": self.state.get("evals", [])}
        if self.chief:
            write_json_atomic(done_path, result)
        return result


def _is_number(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def run_phase(phase: Phase, strategy: tf.distribute.Strategy, *, checkpoint_every: int = 200,
              keep_checkpoints: int = 2, log_every: int = 1, verbose: int = 1
              ) -> dict[str, Any]:
    """Train `phase` to its end, resuming from its latest checkpoint if any.

    Returns {"steps", "best", "evals"}. A finished phase is not retrained: its
    final checkpoint is restored into the objects and its result returned.
    """
    return _Runner(phase, strategy, checkpoint_every, keep_checkpoints, log_every,
                   verbose).run()
