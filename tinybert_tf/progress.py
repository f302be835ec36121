"""Progress that stays readable when the output is a log file, not a terminal.

Keras's progress bar and tqdm redraw one line with carriage returns (Keras
also with backspaces, and it thinks every POSIX process has a terminal). In
a terminal that is a bar; in `bin/distill ... > run.log` or a CI log it is one
line holding every redraw, megabytes long. So:

* `interactive(stream)`: a terminal (or a notebook) is attached to `stream`.
* `fit_progress(name, total_steps, verbose)`: what a training phase gives
  `model.fit`: Keras's own bar in a terminal; elsewhere `verbose=0` and
  `LineProgress`, a callback that prints one whole line every `interval`
  seconds and at the end of each fit call.
* `progress_bar(...)`: a tqdm bar; elsewhere the same bar written as whole
  lines (no carriage returns), at most one every `LOG_INTERVAL` seconds.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO

import keras
from tqdm.auto import tqdm

# Seconds between progress lines in a log file.
LOG_INTERVAL = 30.0


def interactive(stream: Optional[TextIO] = None) -> bool:
    """Whether progress on `stream` (default stdout) is seen live: a terminal or Jupyter."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):
        tty = False
    return tty or "ipykernel" in sys.modules


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class LineProgress(keras.callbacks.Callback):
    """One line per `interval` seconds of a phase: step, rate, ETA and the logs.

    start_step: the phase's step when this `fit` call begins (a resumed phase or a
    later epoch); total_steps: the phase's last step.
    """

    def __init__(self, name: str, start_step: int, total_steps: int,
                 interval: float = LOG_INTERVAL, stream: Optional[TextIO] = None):
        super().__init__()
        self.name, self.total = name, int(total_steps)
        self.step = int(start_step)
        self.interval = float(interval)
        self.stream = stream
        self._started = self._last = time.monotonic()
        self._first_step = self.step

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._print(now, logs)

    def on_train_end(self, logs=None):
        self._print(time.monotonic(), logs)

    def line(self, now: float, logs: Optional[dict[str, Any]]) -> str:
        done = self.step - self._first_step
        elapsed = now - self._started
        parts = [f"[{self.name}] step {self.step}/{self.total}"]
        if done and elapsed > 0:
            per_step = elapsed / done
            parts.append(f"{per_step:.2f}s/step")
            if self.step < self.total:
                parts.append(f"eta {_duration(per_step * (self.total - self.step))}")
        for key, value in (logs or {}).items():
            try:
                parts.append(f"{key}={float(value):.4g}")
            except (TypeError, ValueError):
                continue
        return " ".join(parts)

    def _print(self, now: float, logs: Optional[dict[str, Any]]) -> None:
        self._last = now
        print(self.line(now, logs), file=self.stream or sys.stdout, flush=True)


def fit_progress(name: str, start_step: int, total_steps: int, verbose: int
                 ) -> tuple[int, list[keras.callbacks.Callback]]:
    """(verbose for `model.fit`, extra callbacks) for a phase's progress display."""
    if not verbose:
        return 0, []
    if interactive():
        return verbose, []
    return 0, [LineProgress(name, start_step, total_steps)]


class _Lines:
    """A file for tqdm that writes each redraw as a whole line (no carriage return)."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(stream: Optional[TextIO] = None, **kwargs: Any) -> tqdm:
    """A tqdm bar on `stream` (default stderr): live in a terminal, else whole lines
    at most every LOG_INTERVAL seconds. `kwargs` go to tqdm (total, unit, desc, ...)."""
    stream = sys.stderr if stream is None else stream
    if interactive(stream):
        return tqdm(file=stream, **kwargs)
    kwargs.setdefault("mininterval", LOG_INTERVAL)
    kwargs.setdefault("maxinterval", LOG_INTERVAL * 4)
    return tqdm(file=_Lines(stream), ncols=100, **kwargs)
