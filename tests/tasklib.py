"""The real TFLite Task Library, run from an isolated virtual environment, for tests.

The Task Library's Python package, tflite-support (0.4.4, the last release),
pins protobuf < 4 and numpy < 2, which TensorFlow 2.20 cannot use, so it gets
its own venv: created once under .cache/tasklib-venv (git-ignored) and reused
while its requirements and interpreter stay the same. Tests send it a JSON
request on stdin and read a JSON answer (`classify`, `answer`, `metadata`).

What making it takes, found on a Debian 12 box (2026-11):
- a CPython with tflite-support 0.4.4 wheels: 3.9, 3.10 or 3.11 (3.12+ has
  none; 3.8 stops at 0.4.3). The test interpreter is used when it is one of
  those, else python3.11/3.10/3.9 on PATH or under pyenv;
- numpy < 2: the wheels' extensions were built against numpy 1.x;
- libusb-1.0.so.0, which every extension of the wheel links to (an Edge TPU
  leftover) and which slim images lack: the `libusb-package` wheel ships the
  library, and the client preloads it (RTLD_GLOBAL) before importing
  tflite_support, so no system package is needed.

When the venv cannot be made (no network, no suitable Python), `ensure_venv`
raises TaskLibUnavailable with the reason; tests skip on it. The failure is
remembered for FAIL_TTL_S so parallel test workers do not each retry pip.
Environment: TINYBERT_TASKLIB=0 skips, TINYBERT_TASKLIB_PYTHON names the
interpreter to build the venv from.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
VENV_DIR = ROOT / ".cache" / "tasklib-venv"
STAMP = VENV_DIR / "tinybert-tasklib.json"
LOCK = VENV_DIR.with_name("tasklib-venv.lock")
FAILED = VENV_DIR.with_name("tasklib-venv.failed")
FAIL_TTL_S = 600
UV = Path(sys.executable).with_name("uv")  # next to the test interpreter in .venv
REQUIREMENTS = ("tflite-support==0.4.4", "numpy==1.26.4", "libusb-package==1.0.30.0")
PYTHON_VERSIONS = ((3, 11), (3, 10), (3, 9))  # those tflite-support 0.4.4 has wheels for
PIP_TIMEOUT_S = 900
RUN_TIMEOUT_S = 300
RESULT_MARK = "TASKLIB_RESULT "

# Every extension of tflite-support links libusb-1.0.so.0; loading the wheel's
# copy first (its SONAME is libusb-1.0.so.0) satisfies them without a system package.
PRELOAD = r'''
import ctypes
import libusb_package
ctypes.CDLL(str(libusb_package.get_library_path()), mode=ctypes.RTLD_GLOBAL)
'''

# Runs inside the venv (Python 3.9+, tflite-support only): one JSON request on
# stdin -> one line RESULT_MARK + JSON on stdout.
CLIENT = PRELOAD + r'''
import json, sys
from tflite_support import metadata
from tflite_support.task import text


def classify(req):
    model = text.BertNLClassifier.create_from_file(req["model"])
    out = []
    for t in req["texts"]:
        cats = model.classify(t).classifications[0].categories
        out.append([{"label": c.category_name, "score": c.score} for c in cats])
    return out


def answer(req):
    model = text.BertQuestionAnswerer.create_from_file(req["model"])
    out = []
    for item in req["items"]:
        res = model.answer(item["context"], item["question"])
        out.append([{"text": a.text, "start": a.pos.start, "end": a.pos.end,
                     "logit": a.pos.logit} for a in res.answers])
    return out


def show(req):
    d = metadata.MetadataDisplayer.with_model_file(req["model"])
    return {"metadata": json.loads(d.get_metadata_json()),
            "files": d.get_packed_associated_file_list()}


req = json.loads(sys.stdin.read())
try:
    res = {"ok": True, "result": {"classify": classify, "answer": answer,
                                  "metadata": show}[req["op"]](req)}
except Exception as e:  # reported to the test, which decides
    res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print("TASKLIB_RESULT " + json.dumps(res), flush=True)
'''


class TaskLibUnavailable(RuntimeError):
    """The isolated Task Library venv cannot be made here (the message says why)."""


class TaskLibError(RuntimeError):
    """The Task Library refused a model or request (its own message)."""


def ensure_venv() -> Path:
    """Create (once) or reuse the venv; returns its python. Raises TaskLibUnavailable."""
    if os.environ.get("TINYBERT_TASKLIB", "1") == "0":
        raise TaskLibUnavailable("TINYBERT_TASKLIB=0: Task Library checks turned off.")
    VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    with _locked():
        python = VENV_DIR / "bin" / "python"
        if _stamp_ok(python):
            return python
        _recent_failure()
        try:
            _create(python)
        except TaskLibUnavailable as e:
            FAILED.write_text(json.dumps({"time": time.time(), "reason": str(e)}))
            raise
        FAILED.unlink(missing_ok=True)
        return python


def run(request: dict[str, Any]) -> Any:
    """Send one request to the client in the venv; returns its result or raises TaskLibError."""
    python = ensure_venv()
    proc = subprocess.run([str(python), "-c", CLIENT], input=json.dumps(request),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env=_clean_env(), cwd=str(ROOT))
    lines = [x for x in proc.stdout.splitlines() if x.startswith(RESULT_MARK)]
    if not lines:
        raise TaskLibError(f"the Task Library client died (exit {proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    res = json.loads(lines[-1][len(RESULT_MARK):])
    if not res["ok"]:
        raise TaskLibError(res["error"])
    return res["result"]


def classify(model_path: str, texts: list[str]) -> list[dict[str, float]]:
    """BertNLClassifier.create_from_file(model).classify(text) per text -> {label: score}."""
    out = run({"op": "classify", "model": str(model_path), "texts": list(texts)})
    return [{c["label"]: c["score"] for c in cats} for cats in out]


def answer(model_path: str, context: str, question: str) -> list[dict[str, Any]]:
    """BertQuestionAnswerer.create_from_file(model).answer(context, question): the
    answers, best first, as {"text", "start", "end", "logit"}."""
    out = run({"op": "answer", "model": str(model_path),
               "items": [{"context": context, "question": question}]})
    return out[0]


def show_metadata(model_path: str) -> dict[str, Any]:
    """tflite-support's own MetadataDisplayer: {"metadata": its JSON, "files": packed names}."""
    return run({"op": "metadata", "model": str(model_path)})


def find_python() -> tuple[str, str]:
    """An interpreter with tflite-support wheels and venv/ensurepip -> (path, version)."""
    override = os.environ.get("TINYBERT_TASKLIB_PYTHON")
    candidates = [override] if override else []
    if not override:
        candidates.append(sys.executable)
        candidates += [shutil.which(f"python{a}.{b}") for a, b in PYTHON_VERSIONS]
        pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
        for a, b in PYTHON_VERSIONS:
            candidates += [str(p / "bin" / "python")
                           for p in sorted(pyenv.glob(f"{a}.{b}.*"), reverse=True)]
    tried = []
    for cand in dict.fromkeys(c for c in candidates if c):
        try:
            probe = subprocess.run(
                [cand, "-c", "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, env=_clean_env(), timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            tried.append(f"{cand} (cannot run)")
            continue
        version = probe.stdout.strip()
        if probe.returncode == 0 and tuple(map(int, version.split("."))) in PYTHON_VERSIONS:
            return cand, version
        tried.append(f"{cand} ({version or 'unusable'})")
    wanted = ", ".join(f"{a}.{b}" for a, b in PYTHON_VERSIONS)
    raise TaskLibUnavailable(f"no Python {wanted} with venv/ensurepip found for tflite-support "
                             f"0.4.4 wheels (tried {', '.join(tried) or 'nothing'}); set "
                             "TINYBERT_TASKLIB_PYTHON.")


def _create(python: Path) -> None:
    base, version = find_python()
    shutil.rmtree(VENV_DIR, ignore_errors=True)
    steps = [*_install_steps(base, python),
             [str(python), "-c", PRELOAD + "from tflite_support.task import text"]]
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                                  env=_clean_env(), cwd=str(ROOT))
        except subprocess.TimeoutExpired:
            shutil.rmtree(VENV_DIR, ignore_errors=True)
            raise TaskLibUnavailable(f"{' '.join(cmd[:4])} ... timed out after "
                                     f"{PIP_TIMEOUT_S} s.") from None
        if proc.returncode != 0:
            shutil.rmtree(VENV_DIR, ignore_errors=True)
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            errors = [x for x in lines if x.startswith("ERROR")] or lines[-3:]
            tail = " / ".join(errors)[-1500:]
            raise TaskLibUnavailable(f"could not make the Task Library venv at {VENV_DIR} "
                                     f"(Python {version}): {' '.join(cmd[:4])} ... failed: "
                                     f"{tail}")
    STAMP.write_text(json.dumps({"requirements": list(REQUIREMENTS), "base": base,
                                 "version": version}))


def _install_steps(base: str, python: Path) -> list[list[str]]:
    """The venv and its packages: with uv where the test environment has it (`make`
    installs it, constraints.txt), else with the venv's own pip. uv skips ensurepip
    and installs in parallel from its cache (docs/measurements.md gives both times)."""
    if UV.is_file():
        return [[base, "-m", "venv", "--without-pip", str(VENV_DIR)],
                [str(UV), "pip", "install", "-q", "--python", str(python), "--system-certs",
                 "--compile-bytecode", *REQUIREMENTS]]
    return [[base, "-m", "venv", str(VENV_DIR)],
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--timeout", "30", "--retries", "2", *REQUIREMENTS]]


def _stamp_ok(python: Path) -> bool:
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return False
    return python.exists() and stamp.get("requirements") == list(REQUIREMENTS)


def _recent_failure() -> None:
    try:
        failed = json.loads(FAILED.read_text())
    except (OSError, ValueError):
        return
    age = time.time() - failed.get("time", 0)
    if age < FAIL_TTL_S:
        raise TaskLibUnavailable(f"{failed.get('reason')} (failed {age:.0f} s ago; delete "
                                 f"{FAILED} to retry now)")


@contextlib.contextmanager
def _locked():
    """One process at a time makes the venv (pytest-xdist workers share it)."""
    with open(LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clean_env() -> dict[str, str]:
    """Our environment without what would leak our venv into the other one."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def unavailable_reason() -> Optional[str]:
    """None when the Task Library venv is usable, else why not (for pytest.skip)."""
    try:
        ensure_venv()
    except TaskLibUnavailable as e:
        return str(e)
    return None
