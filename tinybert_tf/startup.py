"""What a `bin/` tool does first: run under the project's venv when the Python that
started it lacks the packages (`use_project_environment`), then start TensorFlow without
its CUDA noise on a CPU machine.

The TensorFlow wheel for Linux is built with CUDA. On a machine without an
NVIDIA driver, the first device query logs, at ERROR level (which
TF_CPP_MIN_LOG_LEVEL=2 still shows):

  E external/local_xla/xla/stream_executor/cuda/cuda_platform.cc:51] failed call to
  cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)

It is no error of the user's: the CPU is used, as it should be. The message
is written by C++ straight to file descriptor 2, before any of our code runs,
so `start_tensorflow()` makes that first query itself with descriptor 2
going through a filter that passes every line but the CUDA probe's. With an
NVIDIA driver present (`/proc/driver/nvidia`, `/dev/nvidia0`) nothing is
filtered: there a CUDA error means something.

TensorFlow 2.21 writes its C++ log through absl, which does not read
TF_CPP_MIN_LOG_LEVEL: importing it prints oneDNN's notice and the CUDA stub's at INFO
level, after absl's preamble ("WARNING: All log messages before absl::InitializeLog()
..."), all of which 2.20 hid at the tools' level 2. So `start_tensorflow()` imports
TensorFlow inside the same filter, which also drops the absl-format lines below
TF_CPP_MIN_LOG_LEVEL (`below_log_level`); those at import are the only ones a tiny run of
every stage printed with 2.21.

Only the tools call it: a library must not initialise devices on import (a
user configures logical devices before the first op), nor change other
libraries' logging.

`import_tensorflow()` is how a tool loads TensorFlow. `import tensorflow` loads
keras, and keras imports scikit-learn (for its scikit-learn wrappers, which
import scipy.stats) and matplotlib's pyplot (for its image-gallery plots)
whenever they are installed: a large share of a tool's start, for keras features no
tool uses (docs/measurements.md). The tools load
TensorFlow with both hidden; afterwards each imports as usual (the report's
plots import pyplot), and only those keras features see them missing. A
library imported by a user's program must not do this, so this module imports
no TensorFlow until a tool asks.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
import types
from typing import Iterator, Pattern

# The lines TensorFlow writes when it looks for CUDA on a machine without a driver.
CPU_ONLY_NOISE: Pattern[str] = re.compile(
    r"(failed call to cuInit|Could not find cuda drivers|cuda_platform\.cc|cudart_stub\.cc|"
    r"Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered)")
_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidia0", "/dev/nvidiactl")
# absl's C++ log line, "I0000 00:00:1796639250.269172   18603 port.cc:153] ...", and the
# preamble absl writes before its first one; severities as TF_CPP_MIN_LOG_LEVEL counts them.
_ABSL_LINE = r"^[{letters}]\d{{4}} \d\d:\d\d:\d+\.\d+ +\d+ [^\s\]]+:\d+\] "
_ABSL_PREAMBLE = r"^WARNING: All log messages before absl::InitializeLog\(\) is called"
_SEVERITIES = "IWE"
# Libraries whose INFO records would otherwise reach the tools' output once the tool
# logs at INFO: gensim's Word2Vec lifecycle events (augmentation's word vectors) and
# TensorFlow's Python side (its checkpoint saver logs "Sharding callback duration"
# through absl at every save). bin/augment, bin/export and bin/benchmark already set
# absl's verbosity to WARNING; this does it for every tool.
QUIET_LOGGERS = ("gensim", "smart_open", "tensorflow", "absl")
# What keras imports when installed and the tools never use (see the module docstring).
KERAS_OPTIONAL_IMPORTS = ("sklearn", "matplotlib")
# What a tool cannot start without; `make install` puts them in ROOT/.venv.
REQUIRED_MODULES = ("tensorflow", "keras")
# Set in the environment of a tool started again under the project's venv, so that a
# venv without the packages gets the install hint instead of a loop.
REEXEC_MARK = "TINYBERT_TF_VENV_REEXEC"


def use_project_environment() -> None:
    """Make a tool run with the project's packages whichever `python3` started it.

    When this Python lacks `REQUIRED_MODULES` and the project's venv (`.venv` beside
    the package, what `make install` makes) exists, the tool starts again under the
    venv's Python with the same arguments; with no such venv it stops with one line that
    says how to make it (exit 2). Nothing happens when the packages are importable, so
    an activated venv, a conda environment or a system install are used as they are.
    """
    missing = [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(root, ".venv")
    python = os.path.join(venv, "bin", "python")
    script = os.path.abspath(sys.argv[0])
    in_venv = os.path.realpath(sys.prefix) == os.path.realpath(venv)
    if os.path.exists(python) and not in_venv and not os.environ.get(REEXEC_MARK):
        os.environ[REEXEC_MARK] = "1"
        os.execv(python, [python, script, *sys.argv[1:]])
    where = (f"the project's venv ({venv})" if in_venv or os.path.exists(python)
             else f"this Python ({sys.executable}), and {venv} does not exist")
    sys.stderr.write(f"{os.path.relpath(script, root)}: {', '.join(missing)} not installed "
                     f"in {where}. Run `make install` in {root}; the tools then use {venv} "
                     "by themselves.\n")
    raise SystemExit(2)


@contextlib.contextmanager
def modules_hidden(names: tuple[str, ...]) -> Iterator[None]:
    """Inside the block, `import name` (and its submodules) raises ImportError for each
    of `names` not yet imported; after it, they import as usual."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # the import system's "not available" mark
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


def import_tensorflow() -> types.ModuleType:
    """TensorFlow, imported without keras's optional imports when nothing has imported
    keras yet (see the module docstring); the `tensorflow` module."""
    if "keras" in sys.modules:
        import tensorflow as tf
        return tf
    with modules_hidden(KERAS_OPTIONAL_IMPORTS):
        import keras  # noqa: F401  (loaded here, while its optional imports are hidden)
        import tensorflow as tf
    return tf


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA kernel driver (a GPU TensorFlow could use)."""
    return any(os.path.exists(p) for p in _DRIVER_PATHS)


# The filter behind `filtered_stderr`: a separate Python (no site, no environment) that
# copies every line of its stdin to its stdout unless the pattern in argv matches it.
_LINE_FILTER = (
    "import re, sys\n"
    "drop = re.compile(sys.argv[1], int(sys.argv[2]))\n"
    "out = sys.stdout.buffer\n"
    "for line in sys.stdin.buffer:\n"
    "    if not drop.search(line.decode('utf-8', 'replace')):\n"
    "        out.write(line)\n"
    "        out.flush()\n")


@contextlib.contextmanager
def filtered_stderr(drop: Pattern[str] = CPU_ONLY_NOISE) -> Iterator[None]:
    """Inside the block, file descriptor 2 (C++ logging included) goes through a filter
    that writes on every line `drop` does not match, as it comes.

    The filter is a child process reading a pipe, not a buffer read back at the end: when
    the code inside crashes the process (a converter's segfault or failed check), the
    lines it wrote before dying still reach the terminal, and a thread of this process
    could not be relied on to run while C++ code holds the interpreter.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        filt = subprocess.Popen(
            [sys.executable, "-S", "-E", "-c", _LINE_FILTER, drop.pattern, str(int(drop.flags))],
            stdin=subprocess.PIPE, stdout=saved, close_fds=True)
    except OSError:
        os.close(saved)  # no filter: nothing is dropped, and nothing can be lost
        yield
        return
    os.dup2(filt.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        filt.stdin.close()  # the filter sees the end of its input, writes the rest, exits
        try:
            filt.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a child of the block still holds the pipe
            filt.kill()
            filt.wait()


def below_log_level(level: str | None) -> Pattern[str] | None:
    """The absl-format log lines (and absl's preamble) that TF_CPP_MIN_LOG_LEVEL=`level`
    hides: INFO at 1, WARNING too at 2, ERROR too at 3; None at 0 or when unset."""
    try:
        count = min(max(int(level or 0), 0), len(_SEVERITIES))
    except ValueError:
        return None
    if count == 0:
        return None
    return re.compile(f"{_ABSL_LINE.format(letters=_SEVERITIES[:count])}|{_ABSL_PREAMBLE}")


def tensorflow_noise() -> Pattern[str] | None:
    """What is dropped from descriptor 2 while TensorFlow starts: the absl-format lines
    TF_CPP_MIN_LOG_LEVEL hides (TensorFlow 2.21's absl log does not read it) and, on a
    machine without an NVIDIA driver, the CUDA probe's (see the module docstring)."""
    drops = [p for p in (below_log_level(os.environ.get("TF_CPP_MIN_LOG_LEVEL")),
                         None if nvidia_driver_present() else CPU_ONLY_NOISE) if p]
    return re.compile("|".join(p.pattern for p in drops)) if drops else None


@contextlib.contextmanager
def quiet_tensorflow_start() -> Iterator[None]:
    """Descriptor 2 through `filtered_stderr(tensorflow_noise())` inside the block: for
    TensorFlow's import and first device query."""
    noise = tensorflow_noise()
    with filtered_stderr(noise) if noise else contextlib.nullcontext():
        yield


def start_tensorflow() -> None:
    """Import TensorFlow and initialise its devices without the noise of
    `tensorflow_noise`; and keep libraries' INFO logging (`QUIET_LOGGERS`) out of the
    tool's output."""
    with quiet_tensorflow_start():
        tf = import_tensorflow()
        if not nvidia_driver_present():  # with a driver, devices start when first used
            tf.config.list_physical_devices()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def start_spawned_worker() -> None:
    """A tool's worker process (multiprocessing's "spawn" start method, used as the pool
    initializer): TensorFlow started as in the tool, before the worker imports anything
    of ours that imports TensorFlow."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start_tensorflow()
