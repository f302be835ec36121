"""What a newcomer reads: no CUDA error on a CPU machine, a size/speed table that
says "larger" when the student is larger, progress that stays line by line in a
log file."""
from __future__ import annotations

import importlib
import io
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tinybert_tf import progress, startup
from tinybert_tf.pipeline.run.report import ratio_words, summary_table

from pipeline_helpers import REPO


def test_the_startup_filter_drops_the_cuda_probe_and_keeps_every_other_line(capfd):
    with startup.filtered_stderr():
        os.write(2, b"keep: a real warning\n")
        os.write(2, b"2026-12-01 E external/local_xla/xla/stream_executor/cuda/"
                    b"cuda_platform.cc:51] failed call to cuInit: INTERNAL: CUDA error\n")
        os.write(2, b"keep: the last line\n")
    assert capfd.readouterr().err == "keep: a real warning\nkeep: the last line\n"


# absl-format log lines as TensorFlow 2.21 writes them at import (it no longer reads
# TF_CPP_MIN_LOG_LEVEL), and the preamble absl writes before its first line.
ABSL_LINES = {
    "I": "I0000 00:00:1796639250.269172   18603 port.cc:153] oneDNN custom operations are on.",
    "W": "W0000 00:00:1796639250.300000   18603 converter.cc:12] a warning",
    "E": "E0000 00:00:1796639251.020880   18614 some_kernel.cc:52] a real error",
}
ABSL_PREAMBLE = ("WARNING: All log messages before absl::InitializeLog() is called are "
                 "written to STDERR")


@pytest.mark.parametrize("level, kept", [("0", "IWE"), ("1", "WE"), ("2", "E"), ("3", "")])
def test_the_start_drops_the_absl_log_lines_tf_cpp_min_log_level_hides(level, kept,
                                                                       monkeypatch, capfd):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
    written = [ABSL_PREAMBLE, *ABSL_LINES.values(), "keep: a Python warning",
               "I am no log line", ""]
    with startup.quiet_tensorflow_start():
        os.write(2, "\n".join(written).encode())
    expected = ([ABSL_PREAMBLE] if level == "0" else []) + [ABSL_LINES[k] for k in kept]
    assert capfd.readouterr().err.splitlines() == [*expected, "keep: a Python warning",
                                                   "I am no log line"]


def test_lines_written_before_a_crash_inside_the_filter_still_reach_stderr():
    """A converter that aborts the process inside the block: what it wrote first is the
    only account of why, so it must not die with the process."""
    code = ("import os, re\nfrom tinybert_tf.startup import filtered_stderr\n"
            "with filtered_stderr(re.compile('NOISE')):\n"
            "    os.write(2, b'NOISE: dropped\\nF check failed: the reason\\n')\n"
            "    os.abort()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGABRT, proc.stderr
    assert "F check failed: the reason" in proc.stderr
    assert "NOISE" not in proc.stderr


@pytest.mark.skipif(startup.nvidia_driver_present(),
                    reason="an NVIDIA driver is present: CUDA messages are meaningful here")
def test_a_bin_tool_on_a_cpu_machine_prints_no_cuda_error(tmp_path, tiny_vocab_file):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog ran .\n\nhello world .\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bin", "pretokenize"),
                           f"--corpus={corpus}", f"--vocab={tiny_vocab_file}",
                           f"--output={tmp_path / 'out' / 'c'}", "--num_shards=1",
                           "--num_workers=1", "--max_seq_len=16"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "cuInit" not in proc.stderr and "CUDA error" not in proc.stderr, proc.stderr


def _python_without_keras() -> str:
    """The interpreter the venv was made from, when it lacks keras (else the test skips)."""
    base = os.path.join(sys.base_prefix, "bin", "python3")
    probe = subprocess.run([base, "-c", "import keras"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} has keras: no Python without the packages to start a tool with")
    return base


def test_a_bin_tool_started_without_the_packages_runs_under_the_projects_venv():
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(REPO, ".venv")):
        pytest.skip("the suite does not run in the project's .venv")
    proc = subprocess.run([_python_without_keras(), os.path.join(REPO, "bin", "distill"),
                           "--helpshort"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "--flagfile" in proc.stdout and "Traceback" not in proc.stderr


def test_a_bin_tool_without_the_packages_or_a_venv_says_how_to_install(tmp_path):
    # A copy of the project without .venv: bin/distill beside the package.
    (tmp_path / "bin").mkdir()
    shutil.copy(os.path.join(REPO, "bin", "distill"), tmp_path / "bin" / "distill")
    os.symlink(os.path.join(REPO, "tinybert_tf"), tmp_path / "tinybert_tf")
    env = {k: v for k, v in os.environ.items() if k != startup.REEXEC_MARK}
    proc = subprocess.run([_python_without_keras(), str(tmp_path / "bin" / "distill"),
                           "--helpshort"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bin/distill: ") and "make install" in lines[0]
    assert str(tmp_path / ".venv") in lines[0] and "keras" in lines[0]


def test_the_startup_keeps_library_info_logs_out():
    import logging

    before = {name: logging.getLogger(name).level for name in startup.QUIET_LOGGERS}
    try:
        startup.start_tensorflow()
        for name in ("gensim", "tensorflow", "absl"):
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger("gensim").isEnabledFor(logging.WARNING)
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def _report(teacher_params, student_params, teacher_ms, student_ms):
    def facts(params, ms):
        return {"params": params, "flops": 10 * params, "latency_ms": ms,
                "dev": {"accuracy": 0.8}}
    t, s = facts(teacher_params, teacher_ms), facts(student_params, student_ms)
    return {"task": "t", "max_seq_len": 8, "primary_metric": "accuracy", "teacher": t,
            "student": s, "ratios": {"params": t["params"] / s["params"],
                                     "flops": t["flops"] / s["flops"],
                                     "speedup": teacher_ms / student_ms, "retained": 1.0}}


def test_the_summary_table_says_larger_and_slower_when_the_student_is():
    table = summary_table(_report(1e6, 4e6, 2.0, 5.0))
    assert "4.0x larger" in table and "4.0x more" in table and "2.5x slower" in table
    assert "smaller" not in table and "fewer" not in table and "faster" not in table


def test_ratio_words():
    assert ratio_words(4.0, "smaller", "larger") == "4.0x smaller"
    assert ratio_words(0.25, "smaller", "larger") == "4.0x larger"
    assert ratio_words(1.02, "faster", "slower") == "about the same"
    assert ratio_words(float("nan"), "faster", "slower") == "-"


def test_progress_in_a_log_file_is_whole_lines():
    out = io.StringIO()
    bar = progress.progress_bar(stream=out, total=3, unit="ex", desc="augment", mininterval=0)
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and "\b" not in text
    lines = text.splitlines()
    assert lines and all(line.startswith("augment") for line in lines)
    assert "3/3" in lines[-1]


def test_a_phase_without_a_terminal_prints_step_lines_not_a_redrawn_bar(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # what `> run.log` gives
    assert not progress.interactive()
    verbose, callbacks = progress.fit_progress("general", 0, 10, verbose=1)
    assert verbose == 0 and isinstance(callbacks[0], progress.LineProgress)
    line = callbacks[0]
    line.step = 4
    text = line.line(line._started + 8.0, {"loss": 0.5, "note": "x"})
    assert text == "[general] step 4/10 2.00s/step eta 12s loss=0.5"


def test_hidden_modules_fail_to_import_inside_the_block_and_import_after_it():
    name = "colorsys"  # a standard module nothing here imports
    sys.modules.pop(name, None)
    with startup.modules_hidden((name, "json")):
        with pytest.raises(ImportError):
            importlib.import_module(name)
        assert importlib.import_module("json")  # already imported: left alone
    assert importlib.import_module(name).rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
