"""Ctrl-C that always stops a tool.

Python turns SIGINT into KeyboardInterrupt in whatever code runs when the signal
lands. Raised inside a weakref callback or a `__del__` (Keras and TensorFlow run
many), it is printed as "Exception ignored in ..." and dropped, and the tool would go
on as if nothing had been pressed. Inside `ctrl_c_always_stops`, a SIGINT raises
KeyboardInterrupt as before and then again every `REPEAT_SECONDS` until the block
is left, so a dropped one is followed by one that ends the tool. A training phase
takes SIGINT over meanwhile, as a stop request at the next step boundary
(pipeline/training/loop.py), and hands it back when it ends.
"""
from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from typing import Iterator, Optional

REPEAT_SECONDS = 1.0


class _Repeater:
    """The SIGINT handler: KeyboardInterrupt now, and again every REPEAT_SECONDS from a
    daemon thread until `stop`."""

    def __init__(self) -> None:
        self.left = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def handle(self, signum, frame) -> None:
        if self.left.is_set():
            return  # a repeat sent as the block was left: the tool is ending anyway
        if self._thread is None:
            self._thread = threading.Thread(target=self._repeat, daemon=True,
                                            name="ctrl-c-repeat")
            self._thread.start()
        raise KeyboardInterrupt

    def _repeat(self) -> None:
        while not self.left.wait(REPEAT_SECONDS):
            _thread.interrupt_main(signal.SIGINT)  # runs `handle` in the main thread

    def stop(self) -> None:
        """No repeat after this returns: the thread has ended, and a repeat it sent
        last has met `handle` (which now ignores it) before Python's own handler is
        back."""
        self.left.set()
        if self._thread is not None:
            self._thread.join()
            _pending_signals_run_here()


def _pending_signals_run_here() -> None:
    """An empty Python call: entering it runs the signal handlers pending in the main
    thread (Python checks for them as a function starts)."""


@contextlib.contextmanager
def ctrl_c_always_stops() -> Iterator[None]:
    """The block with the repeating SIGINT handler (module doc). Only where Python's own
    handler is in place in the main thread: a process that ignores SIGINT (a background
    job) or an embedding program with its own handler keeps it."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    repeater = _Repeater()
    signal.signal(signal.SIGINT, repeater.handle)
    try:
        yield
    finally:
        repeater.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
