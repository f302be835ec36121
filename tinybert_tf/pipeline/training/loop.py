"""A resumable training phase: keras `fit` driven epoch by epoch with checkpoints.

Each phase (general distillation, teacher fine-tuning, the intermediate and
prediction phases of task distillation) saves a `tf.train.CheckpointManager`
checkpoint every N steps and at its end. The checkpoint holds what the phase
trains (student, projections), the optimizer and the step. The position in
the data is the step: each epoch's input is rebuilt with the epoch's seed and
the batches already consumed are skipped, so a run killed with SIGKILL and
re-run continues on the very batches it would have seen.

Files (all through `tinybert_tf.files`, so gs:// and ram:// work): the phase
folder holds `ckpt/`, `history.jsonl` (one row per logged step; rows are
buffered and appended when a checkpoint is saved, so the file never runs
ahead of the checkpoint a re-run resumes from), `phase_state.json` (dev
evaluations, the best one) and `phase_done.json`. TensorBoard scalars go where
keras.callbacks.TensorBoard puts them: the training ones (loss, each loss term,
learning_rate) in OUTPUT/logs/<stage>[/<phase>]/train, the dev metrics
(accuracy, ...) in .../validation (`log_dir`).

Preemption: while a phase trains, SIGTERM (a preemptible VM's or a TPU
maintenance notice, `kill`, a scheduler's eviction) asks to stop. The request
travels with the next step's all-reduce of the loss counts (the Distiller's
`watch_stop_requests`), so every worker learns of it at the same step; each
then saves a checkpoint of that step and `Preempted` ends the process with
PREEMPTED_EXIT_CODE (75). Re-running the same command resumes from that
checkpoint to the same final weights as an uninterrupted run (a stop at a step
due a dev evaluation runs that evaluation on resume). A second SIGTERM
ends the process at once; if the step boundary is not reached within
`stop_grace_seconds` (a step blocked on a dead peer), the process exits with
143 (128 + SIGTERM) and the previous checkpoint is the resume point. Ctrl-C
(SIGINT) is the same request, and its stop exits with 130 (`_StopWatch`).

A truncated or unreadable latest checkpoint (a disk filled or a copy cut
during the save) is skipped with a warning: the phase resumes from the newest
readable kept checkpoint (`--keep_checkpoints`).

Divergence: the loss Keras logs each step (already fetched for the logs) is
checked for finite values at every step, and the trained weights before every
checkpoint, every dev evaluation and the phase's end. A non-finite value stops
the phase with `Diverged` (one line: the phase, the step, the terms at fault
and the likely flag, `Phase.hint`): no checkpoint is written after it, so the
last kept one is finite, and the stage is not marked done, so nothing is
published. A dev metric that is undefined (NaN: e.g. Pearson of one example)
never selects a checkpoint; a phase that selects by it and never gets a
defined value keeps its last weights, with a warning.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import posixpath
import signal
import sys
import threading
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.data.metrics import is_defined
from tinybert_tf.pipeline.training.strategy import is_chief, num_workers, worker_dir
from tinybert_tf.pipeline.training.summaries import ScalarRows
from tinybert_tf.progress import fit_progress

log = logging.getLogger("tinybert_tf")

# sysexits.h EX_TEMPFAIL: "temporary failure, the user is invited to retry".
PREEMPTED_EXIT_CODE = 75
# The shell's code for a process ended by SIGTERM: no checkpoint was saved for the stop.
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
# The shell's code for Ctrl-C: a phase stopped by it has saved its checkpoint first.
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT


class Preempted(Exception):
    """SIGTERM (or Ctrl-C) stopped a phase after saving a checkpoint; re-run the command
    to resume.

    `bin/distill` prints the message and exits with `exit_code`: 75
    (PREEMPTED_EXIT_CODE) after a SIGTERM, 130 (INTERRUPTED_EXIT_CODE) after Ctrl-C.
    """

    def __init__(self, phase: str, step: int, checkpoint: str,
                 by: Optional[str] = "SIGTERM"):
        """`by`: the signal's name, or None for a worker that received none and
        stopped at the step its peers agreed on (multi-worker)."""
        self.exit_code = INTERRUPTED_EXIT_CODE if by == "SIGINT" else PREEMPTED_EXIT_CODE
        how = ("interrupted (Ctrl-C)" if by == "SIGINT" else f"stopped by {by}" if by
               else "stopped with the other workers (one of them was asked to stop)")
        super().__init__(f"{phase}: {how} at step {step}, checkpoint {checkpoint} saved; "
                         f"re-run the same command to resume (exit code {self.exit_code}).")
        self.phase, self.step, self.checkpoint = phase, step, checkpoint


class TrainingStateError(ValueError):
    """A phase's saved state cannot be used; the message names the folder and the fix."""


class Diverged(TrainingStateError):
    """The loss or the weights of a phase became NaN or infinite (module docstring)."""


@dataclasses.dataclass
class Phase:
    """One resumable training phase.

    make_dataset(epoch) returns that epoch's batches (global batch size), at
    least `steps_per_epoch` of them. Instead, `make_input(epoch, offset, steps)`
    may return exactly what `fit` reads for `steps` steps from step `offset` of
    the epoch (e.g. a `tf.distribute` dataset built per worker, with the skip
    and take applied inside). `evaluate()` returns dev metrics;
    `on_best(metrics)` is called when `select_metric` improves (e.g. to save
    the best model), or once at the end when no evaluation gave it a defined value.
    """

    name: str
    directory: str
    model: keras.Model
    checkpoint_objects: dict[str, Any]
    make_dataset: Optional[Callable[[int], tf.data.Dataset]]
    steps_per_epoch: int
    epochs: float
    max_steps: int = 0
    evaluate: Optional[Callable[[], dict[str, float]]] = None
    select_metric: Optional[str] = None
    on_best: Optional[Callable[[dict[str, float]], None]] = None
    eval_every: int = 0
    make_input: Optional[Callable[[int, int, int], Any]] = None
    # What to change when the phase diverges (e.g. "lower --pred_lr (now 1e+09) ...").
    hint: str = ""

    @property
    def total_steps(self) -> int:
        return schedule_steps(self.epochs, self.steps_per_epoch, self.max_steps)

    def epoch_input(self, epoch: int, offset: int, steps: int) -> Any:
        """What `fit` reads for `steps` steps from step `offset` of `epoch`."""
        if self.make_input is not None:
            return self.make_input(epoch, offset, steps)
        dataset = self.make_dataset(epoch)
        if offset:
            dataset = dataset.skip(offset)
        return dataset.take(steps)


def schedule_steps(epochs: float, steps_per_epoch: int, max_steps: int = 0) -> int:
    """Optimizer steps of a phase: ceil(epochs * steps_per_epoch), capped by max_steps > 0.

    The one formula for a phase's length; stages size their learning-rate
    schedules with it before the Phase (which needs the optimizer) exists.
    """
    total = int(math.ceil(epochs * steps_per_epoch))
    return min(total, max_steps) if max_steps > 0 else total


# --- preemption ------------------------------------------------------------------------

# Each stop signal's default action, restored after its first arrival: a second one
# acts at once (SIGTERM ends the process, Ctrl-C raises KeyboardInterrupt).
_STOP_SIGNALS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}


class _StopWatch:
    """SIGTERM or Ctrl-C (SIGINT) -> a stop request, while a phase trains (main thread
    only).

    Python runs signal handlers between bytecodes of the main thread, i.e. at
    the latest when the running step returns; a timer thread (which runs while
    the main thread waits in TensorFlow) ends the process if the phase has not
    stopped `grace_seconds` after the signal. Leaving the phase (stopped at the
    agreed step, finished, or failed) cancels the timer. Ctrl-C is a stop request
    too, not Python's KeyboardInterrupt: that is raised in whatever code runs when the
    signal arrives, and one raised in a weakref callback (Keras and TensorFlow run
    many) is printed and dropped, and the run would go on.
    """

    def __init__(self, phase: str, grace_seconds: float):
        self.phase = phase
        self.grace_seconds = float(grace_seconds)
        self.received: Optional[str] = None  # the signal's name, once one arrived
        self.saved = False
        self._previous: dict[int, Any] = {}
        self._timer: Optional[threading.Timer] = None

    def __enter__(self) -> "_StopWatch":
        if threading.current_thread() is threading.main_thread():
            # A signal the process ignores (SIGINT of a background job) stays ignored.
            self._previous = {s: signal.signal(s, self._handle) for s in _STOP_SIGNALS
                              if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else _STOP_SIGNALS[signum])

    def _second(self, signum: int) -> Any:
        """The handler a second `signum` meets: the default action; for Ctrl-C, the
        tool's own handler when it has one (cli/interrupts.py: it repeats)."""
        previous = self._previous.get(signum)
        return previous if signum == signal.SIGINT and callable(previous) \
            else _STOP_SIGNALS[signum]

    def _handle(self, signum, frame) -> None:
        if self.received:  # the other signal after the first: act on it at once
            signal.signal(signum, self._second(signum))
            signal.raise_signal(signum)
            return
        self.received = signal.Signals(signum).name
        signal.signal(signum, self._second(signum))
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        print(f"[{self.phase}] {name}: stopping at the next step boundary to save a "
              f"checkpoint (exit code {self.exit_code(saved=True)}); a second {name} "
              "ends the process now", file=sys.stderr, flush=True)
        if self.grace_seconds > 0:
            self._timer = threading.Timer(self.grace_seconds, self._give_up)
            self._timer.daemon = True
            self._timer.start()

    def exit_code(self, saved: bool) -> int:
        """The exit code of a stop by the signal received: with its checkpoint saved,
        75 (SIGTERM) or 130 (Ctrl-C); else the shell's code for the signal."""
        if self.received == "SIGINT":
            return INTERRUPTED_EXIT_CODE
        return PREEMPTED_EXIT_CODE if saved else SIGTERM_EXIT_CODE

    def _give_up(self) -> None:
        code = self.exit_code(self.saved)
        print(f"[{self.phase}] {self.received}: no step boundary within "
              f"{self.grace_seconds:.0f}s (a peer not responding?); exiting with code {code}"
              f"{'' if self.saved else ' without a new checkpoint'}.",
              file=sys.stderr, flush=True)
        os._exit(code)


def _local_flag(strategy: tf.distribute.Strategy, name: str) -> tf.Variable:
    """A float32 scalar each replica reads and writes locally (no communication)."""
    with strategy.scope():
        return tf.Variable(0.0, trainable=False, name=name, dtype=tf.float32,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def _set_local(strategy: tf.distribute.Strategy, variable: tf.Variable, value: float) -> None:
    for v in strategy.experimental_local_results(variable):
        v.assign(value)


def _get_local(strategy: tf.distribute.Strategy, variable: tf.Variable) -> float:
    return float(strategy.experimental_local_results(variable)[0].numpy())


class _PhaseCallback(keras.callbacks.Callback):
    """Counts steps, saves checkpoints, logs scalars and history, evaluates, and stops
    at the step every worker agreed on after a SIGTERM."""

    def __init__(self, runner: "_Runner"):
        super().__init__()
        self.runner = runner

    def on_train_batch_begin(self, batch, logs=None):
        self.runner.forward_stop_request()

    def on_train_batch_end(self, batch, logs=None):
        r = self.runner
        r.step.assign_add(1)
        step = int(r.step.numpy())
        r.record(step, logs or {})
        r.check_loss(step, logs or {})
        if r.stop_agreed():
            r.stop_at(step)
            self.model.stop_training = True
            return
        if r.phase.eval_every and r.eval_due(step):  # the epoch's end: the loop's
            r.run_eval(step)
        if step % r.checkpoint_every == 0 and step < r.phase.total_steps:
            r.save(step)
        if step >= r.phase.total_steps:
            self.model.stop_training = True


class _Runner:
    def __init__(self, phase: Phase, strategy: tf.distribute.Strategy,
                 checkpoint_every: int, keep_checkpoints: int, log_every: int,
                 verbose: int, watch: _StopWatch):
        self.phase = phase
        self.strategy = strategy
        self.checkpoint_every = max(1, checkpoint_every)
        self.log_every = max(1, log_every)
        self.verbose = verbose
        self.chief = is_chief(strategy)
        files.makedirs(phase.directory)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.checkpoint = tf.train.Checkpoint(step=self.step, **phase.checkpoint_objects)
        self.checkpoint_dir = worker_dir(posixpath.join(phase.directory, "ckpt"), strategy)
        with files.translate_errors(self.checkpoint_dir, "read the checkpoints in"):
            self.manager = tf.train.CheckpointManager(
                self.checkpoint, self.checkpoint_dir, max_to_keep=keep_checkpoints)
        self.history_path = posixpath.join(phase.directory, "history.jsonl")
        self.state_path = posixpath.join(phase.directory, "phase_state.json")
        # keras.callbacks.TensorBoard's layout: training scalars in train/, dev in
        # validation/ (made at the first evaluation, as Keras makes it only with dev data).
        self.logs = worker_dir(log_dir(phase), strategy)
        self.writer = tf.summary.create_file_writer(posixpath.join(self.logs, "train"))
        self.scalars = ScalarRows(self.writer)
        self.dev_writer = None
        self.state = files.read_json(self.state_path, {"best": None, "evals": []},
                                     error=TrainingStateError, expect=dict)
        self.pending: list[dict[str, Any]] = []
        self.watch = watch
        self.stopped_at: Optional[int] = None
        self.stopped_checkpoint = ""
        # Stop requests (this worker's SIGTERM) and the step's all-reduced answer.
        self.stop_request = _local_flag(strategy, "stop_request")
        self.stop_agreed_flag = _local_flag(strategy, "stop_agreed")
        self._request_sent = False
        self._finite_weights: Optional[Callable[[], tf.Tensor]] = None
        watch = getattr(phase.model, "watch_stop_requests", None)
        self.in_graph_stop = watch is not None
        if watch is not None:
            watch(self.stop_request, self.stop_agreed_flag)

    # --- persistence ----------------------------------------------------------
    def restore(self) -> int:
        optimizer = getattr(self.phase.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            # Create the slots now so a checkpoint restores them (not lazily later).
            with self.strategy.scope():
                optimizer.build(self.phase.model.trainable_variables)
        kept = self._kept_checkpoints()
        for i, path in enumerate(kept):
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.OpError, IndexError, ValueError, AssertionError) as e:
                reason = " ".join((getattr(e, "message", None) or str(e)).split())[:200]
                log.warning("%s: checkpoint %s is unreadable (%s)", self.phase.name, path,
                            reason)
                print(f"warning: [{self.phase.name}] checkpoint {path} is unreadable or "
                      f"truncated ({reason}); trying the previous kept one", flush=True)
                continue
            if i:
                print(f"warning: [{self.phase.name}] resuming from the older checkpoint "
                      f"{path}: the steps after it are trained again", flush=True)
            print(f"[{self.phase.name}] resumed from {path} (step {int(self.step.numpy())})",
                  flush=True)
            break
        else:
            if kept:
                raise TrainingStateError(
                    f"{self.checkpoint_dir}: none of the kept checkpoints "
                    f"({', '.join(posixpath.basename(p) for p in kept)}) can be read; delete "
                    f"{self.phase.directory} to train the phase {self.phase.name} from its "
                    "start.")
        self._agree_on_start()
        self._truncate_history(int(self.step.numpy()))
        return int(self.step.numpy())

    def _kept_checkpoints(self) -> list[str]:
        """Checkpoint prefixes of this phase, newest (highest step) first: the manager's
        list, plus any complete `ckpt-N` whose save was cut before the manager's state
        file was rewritten (a kill between the two)."""
        found = set(self.manager.checkpoints)
        for index in files.glob(posixpath.join(self.checkpoint_dir, "ckpt-*.index")):
            found.add(index[:-len(".index")])

        def number(path: str) -> int:
            tail = posixpath.basename(path).rsplit("-", 1)[-1]
            return int(tail) if tail.isdigit() else -1
        return sorted(found, key=number, reverse=True)

    def _agree_on_start(self) -> None:
        """Workers resume from one step: each restored its own kept checkpoints; when they
        differ, all go back to the oldest step, which every worker still keeps."""
        if num_workers(self.strategy) <= 1:
            return
        mine = int(self.step.numpy())
        local = tf.constant([mine], tf.int64)

        @tf.function(autograph=False)
        def every_step():
            return self.strategy.gather(self.strategy.run(lambda: tf.identity(local)), axis=0)

        low = int(tf.reduce_min(every_step()))
        if low == mine:
            return
        path = next((p for p in self._kept_checkpoints()
                     if posixpath.basename(p) == f"ckpt-{low}"), None)
        if path is None:
            raise TrainingStateError(
                f"{self.checkpoint_dir}: the workers resume from different steps (this one "
                f"{mine}, another {low}) and this worker does not keep step {low}; delete "
                f"{self.phase.directory} (and the workers' .workers/ copies) to restart the "
                f"phase {self.phase.name}.")
        print(f"warning: [{self.phase.name}] another worker resumes from step {low}; "
              "going back to it", flush=True)
        self.checkpoint.restore(path).assert_existing_objects_matched()

    def save(self, step: int) -> str:
        self.check_weights(step)  # a checkpoint is finite: the resume point after a divergence
        with files.translate_errors(self.checkpoint_dir, "write a checkpoint to"):
            path = self.manager.save(checkpoint_number=step)  # collective: every worker saves
        self.flush_history()
        if self.chief:
            files.write_json_atomic(self.state_path, self.state)
        return path

    def _truncate_history(self, step: int) -> None:
        """Drop history lines written after the checkpoint we resume from."""
        if not self.chief or not files.isfile(self.history_path):
            return
        kept = []
        for line in files.read_text(self.history_path).splitlines():
            try:
                if line.strip() and json.loads(line)["step"] <= step:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a crash mid-write
        files.write_text_atomic(self.history_path, "".join(kept))

    def flush_history(self) -> None:
        """Append the buffered history rows (append: local files and ram://; on object
        stores gfile rewrites the object, once per checkpoint)."""
        if not self.pending:
            return
        rows, self.pending = self.pending, []
        if self.chief:
            with files.open(self.history_path, "a") as f, \
                    files.translate_errors(self.history_path, "append to"):
                f.write("".join(json.dumps(row) + "\n" for row in rows))

    # --- preemption -------------------------------------------------------------
    def forward_stop_request(self) -> None:
        """After a SIGTERM or Ctrl-C, mark this worker's request; the next step
        all-reduces it."""
        if self.watch.received and not self._request_sent:
            self._request_sent = True
            _set_local(self.strategy, self.stop_request, 1.0)

    def stop_agreed(self) -> bool:
        """Whether the step just run agreed to stop (the same answer on every worker)."""
        if self.in_graph_stop:
            return _get_local(self.strategy, self.stop_agreed_flag) > 0
        return bool(self.watch.received)  # a model without the hook: this process decides

    def stop_at(self, step: int) -> None:
        path = self.save(step)
        self.watch.saved = True
        self.stopped_at = step
        self.stopped_checkpoint = path

    # --- divergence ---------------------------------------------------------------
    def check_loss(self, step: int, logs: dict[str, Any]) -> None:
        """Raise Diverged when a logged loss (the total or a term's) is not finite."""
        losses = {k: float(v) for k, v in logs.items() if k.endswith("loss") and _is_number(v)}
        bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
        if bad:
            raise self._diverged(step, bad, losses)

    def check_weights(self, step: int) -> None:
        """Raise Diverged when a trained weight is NaN or infinite (one fused check)."""
        if self._finite_weights is None:
            variables = list(self.phase.model.trainable_weights)

            @tf.function(autograph=False)
            def finite():
                if not variables:
                    return tf.constant(True)
                return tf.reduce_all(tf.stack(
                    [tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32)))
                     for v in variables]))
            self._finite_weights = finite
        if not bool(self._finite_weights()):
            raise self._diverged(step, {}, {})

    def _diverged(self, step: int, bad: dict[str, float], losses: dict[str, float]) -> Diverged:
        name = self.phase.name
        kept = self.manager.latest_checkpoint
        kept_text = (f"the last finite checkpoint, {kept}, is kept" if kept else
                     "no checkpoint was kept (it diverged before the first)")
        terms = [k for k in bad if k != "loss"]
        others = [k for k in losses if k != "loss" and k not in bad]
        if bad:
            what = "the loss is not finite (" + ", ".join(
                f"{k}={v}" for k, v in sorted(bad.items())) + ")"
        else:
            what = "the trained weights hold NaN or infinite values"
        first = ", ".join(t[:-len("_loss")] for t in terms)
        if step <= 1 and terms:
            # Before any update the learning rate cannot be the cause: the terms are.
            cause = (f"it happened before any update, so the learning rate is not the cause: "
                     f"the loss term(s) {first} gave non-finite values on finite weights; "
                     "check that term's code and inputs (a plugin's term?)")
        else:
            cause = ("the likely cause is too high a learning rate: "
                     + (self.phase.hint or "lower it")
                     + (f" (the first non-finite term(s): {first})" if terms and others else ""))
        return Diverged(f"[{name}] training diverged at step {step} of "
                        f"{self.phase.total_steps}: {what}; nothing was published and "
                        f"{kept_text}. {cause}.")

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
        self.scalars.write(step, {k: v for k, v in row.items() if k != "step"})
        self.pending.append(row)

    def run_eval(self, step: int) -> Optional[dict[str, float]]:
        if self.phase.evaluate is None:
            return None
        self.check_weights(step)
        metrics = self.phase.evaluate()
        if self.dev_writer is None:
            self.dev_writer = tf.summary.create_file_writer(
                posixpath.join(self.logs, "validation"))
        with self.dev_writer.as_default(step=step):
            for k, v in metrics.items():
                tf.summary.scalar(k, v)
        shown = " ".join(f"{k}={v:.4f}" if is_defined(v) else f"{k}=undefined"
                         for k, v in metrics.items())
        print(f"[{self.phase.name}] step {step}: dev {shown}", flush=True)
        self.state["evals"].append({"step": step, **metrics})
        key = self.phase.select_metric
        # An undefined metric (NaN) never selects a checkpoint.
        if key is not None and is_defined(metrics.get(key)) and (
                self.state["best"] is None or metrics[key] > self.state["best"][key]):
            self.state["best"] = {"step": step, **metrics}
            if self.phase.on_best is not None:
                self.phase.on_best(metrics)
        if self.chief:
            files.write_json_atomic(self.state_path, self.state)
        return metrics

    def eval_due(self, step: int) -> bool:
        """Whether the phase evaluates after `step`: every --eval_every steps, else at
        each epoch's end (the last step is evaluated after the loop either way)."""
        phase = self.phase
        if phase.evaluate is None:
            return False
        if phase.eval_every:
            return step % phase.eval_every == 0
        return step % phase.steps_per_epoch == 0

    # --- the loop ---------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        result = self._run()
        if self.stopped_at is not None:
            raise Preempted(self.phase.name, self.stopped_at, self.stopped_checkpoint,
                            by=self.watch.received)
        return result

    def _run(self) -> dict[str, Any]:
        phase = self.phase
        total = phase.total_steps
        step = self.restore()
        done_path = posixpath.join(phase.directory, "phase_done.json")
        if files.isfile(done_path) and step >= total:
            log.info("%s: already finished (%d steps); skipping", phase.name, step)
            return files.read_json(done_path, error=TrainingStateError, expect=dict)
        if 0 < step < total and self.eval_due(step) and not any(
                e.get("step") == step for e in self.state.get("evals", [])):
            # A stop (SIGTERM) at an evaluation step saves its checkpoint before that
            # evaluation runs; run it now, on the same weights, so the resumed phase
            # selects among the same evaluations as an uninterrupted one.
            self.run_eval(step)
        while step < total:
            epoch, offset = divmod(step, phase.steps_per_epoch)
            steps = min(phase.steps_per_epoch - offset, total - step)
            if self.verbose:
                print(f"[{phase.name}] epoch {epoch + 1}/{math.ceil(total / phase.steps_per_epoch)}"
                      f" steps {step}..{step + steps} of {total}", flush=True)
            # steps_per_epoch gives the progress bar its length; the order is the
            # dataset's own (task_input.epoch_rows), so Keras must not be asked to shuffle.
            # Data errors raised inside tf.data reach the user as one line.
            # In a terminal Keras's bar; in a log file a whole line now and then.
            fit_verbose, shown = fit_progress(phase.name, step, total, self.verbose)
            with corpus_lib.translate_data_errors():
                phase.model.fit(phase.epoch_input(epoch, offset, steps), epochs=1,
                                steps_per_epoch=steps, shuffle=False, verbose=fit_verbose,
                                callbacks=[_PhaseCallback(self), *shown])
            new_step = int(self.step.numpy())
            self.check_weights(new_step)  # once per epoch, before any evaluation or save
            if new_step == step:
                raise RuntimeError(f"{phase.name}: the dataset of epoch {epoch} yielded no "
                                   "batch; check the data and the batch size.")
            step = new_step
            if self.stopped_at is not None:
                return {}
            if not phase.eval_every and (self.eval_due(step) or step >= total):
                self.run_eval(step)
            self.save(step)
        evals = self.state.get("evals", [])
        if phase.evaluate is not None and (not evals or evals[-1]["step"] != step):
            self.run_eval(step)
            self.save(step)
        self.check_weights(step)
        key = phase.select_metric
        evals = self.state.get("evals", [])
        if key is not None and evals and self.state.get("best") is None:
            # No checkpoint can be selected by an undefined metric: keep the last weights.
            print(f"warning: [{phase.name}] none of the {len(evals)} dev evaluation(s) gave a "
                  f"defined {key} (a correlation needs at least two dev examples with "
                  "different values): the model after the last step is kept, not one "
                  "selected on dev; give a larger dev set to select.", flush=True)
            if phase.on_best is not None:
                phase.on_best({k: v for k, v in evals[-1].items() if k != "step"})
        self.flush_history()
        result = {"steps": step, "best": self.state.get("best"),
                  "evals": self.state.get("evals", [])}
        if self.chief:
            files.write_json_atomic(done_path, result)
        return result


def log_dir(phase: Phase) -> str:
    """The phase's TensorBoard folder, OUTPUT/logs/<stage>[/<phase>]: it holds train/ and
    validation/ as keras.callbacks.TensorBoard writes them. A stage of one phase named
    like it (general, finetune_teacher) has no phase level."""
    stage_dir = posixpath.dirname(phase.directory.rstrip("/"))
    stage = posixpath.basename(stage_dir)
    logs = posixpath.join(posixpath.dirname(stage_dir), "logs", stage)
    return logs if phase.name == stage else posixpath.join(logs, phase.name)


def _is_number(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def run_phase(phase: Phase, strategy: tf.distribute.Strategy, *, checkpoint_every: int = 200,
              keep_checkpoints: int = 2, log_every: int = 1, verbose: int = 1,
              stop_grace_seconds: float = 300.0) -> dict[str, Any]:
    """Train `phase` to its end, resuming from its latest readable checkpoint if any.

    Returns {"steps", "best", "evals"}. A finished phase is not retrained: its
    final checkpoint is restored into the objects and its result returned.
    Raises `Preempted` (exit code 75) after a SIGTERM once the checkpoint of the
    agreed step is saved.
    """
    with _StopWatch(phase.name, stop_grace_seconds) as watch:
        return _Runner(phase, strategy, checkpoint_every, keep_checkpoints, log_every,
                       verbose, watch).run()
