"""What a `bin/` tool does first: start TensorFlow without its CUDA noise on a CPU machine.

The TensorFlow wheel for Linux is built with CUDA. On a machine without an
NVIDIA driver, the first device query logs, at ERROR level (which
TF_CPP_MIN_LOG_LEVEL=2 still shows):

  E external/local_xla/xla/stream_executor/cuda/cuda_platform.cc:51] failed call to
  cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)

It is no error of the user's: the CPU is used, as it should be. The message
is written by C++ straight to file descriptor 2, before any of our code runs,
so `start_tensorflow()` makes that first query itself with descriptor 2
captured, and writes back every captured line except the CUDA probe's. With
an NVIDIA driver present (`/proc/driver/nvidia`, `/dev/nvidia0`) nothing is
captured: there a CUDA error means something.

Only the tools call it: a library must not initialise devices on import (a
user configures logical devices before the first op), nor change other
libraries' logging.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from typing import Iterator, Pattern

import tensorflow as tf

# The lines TensorFlow writes when it looks for CUDA on a machine without a driver.
CPU_ONLY_NOISE: Pattern[str] = re.compile(
    r"(failed call to cuInit|Could not find cuda drivers|cuda_platform\.cc|cudart_stub\.cc|"
    r"Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered)")
_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidia0", "/dev/nvidiactl")
# Libraries whose INFO records would otherwise reach the tools' output once the tool
# logs at INFO: gensim's Word2Vec lifecycle events (augmentation's word vectors) and
# TensorFlow's Python side (its checkpoint saver logs "Sharding callback duration"
# through absl at every save). bin/augment, bin/export and bin/benchmark already set
# absl's verbosity to WARNING; this does it for every tool.
QUIET_LOGGERS = ("gensim", "smart_open", "tensorflow", "absl")


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA kernel driver (a GPU TensorFlow could use)."""
    return any(os.path.exists(p) for p in _DRIVER_PATHS)


@contextlib.contextmanager
def filtered_stderr(drop: Pattern[str] = CPU_ONLY_NOISE) -> Iterator[None]:
    """Capture file descriptor 2 (C++ logging included) inside the block, then write
    back every captured line that `drop` does not match."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace")
                    .splitlines(keepends=True) if not drop.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def start_tensorflow() -> None:
    """Initialise TensorFlow's devices, without the CUDA probe's error
    on a machine that has no NVIDIA driver (see the module docstring); and keep
    libraries' INFO logging (`QUIET_LOGGERS`) out of the tool's output."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if nvidia_driver_present():
        return
    with filtered_stderr():
        tf.config.list_physical_devices()
