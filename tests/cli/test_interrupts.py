"""Ctrl-C always stops a tool (tinybert_tf/cli/interrupts.py): a KeyboardInterrupt that
Python drops (raised in a weakref callback) is followed by another."""
from __future__ import annotations

import gc
import os
import signal
import time
import weakref

import pytest

from tinybert_tf.cli import interrupts
from tinybert_tf.cli.tool import EXIT_INTERRUPTED, guard


class _Thing:
    pass


# Python reports the dropped KeyboardInterrupt as unraisable: that is the case tested.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_dropped_in_a_weakref_callback_still_stops_the_tool(monkeypatch, capsys):
    monkeypatch.setattr(interrupts, "REPEAT_SECONDS", 0.1)

    def body():
        thing = _Thing()
        # The signal lands while the callback runs: its KeyboardInterrupt is dropped.
        ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGINT))
        del thing
        gc.collect()
        assert ref() is None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the tool's work goes on
            time.sleep(0.01)
        return 0

    start = time.monotonic()
    assert guard("tool", body) == EXIT_INTERRUPTED
    assert time.monotonic() - start < 10
    assert "tool: interrupted" in capsys.readouterr().err
    # Python's own handler is back, and nothing repeats after the tool has stopped.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    time.sleep(0.3)


def test_a_process_that_ignores_ctrl_c_keeps_ignoring_it(monkeypatch):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        def body():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            return 0
        assert guard("tool", body) == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
