"""What `make` does before and around the tools: tools/pick_python.py picks the Python
it builds .venv with (the first candidate setup.py allows, one line naming each candidate
when none is, a venv of another Python made anew instead of mixed), and `make demo`
passes DEMO_FLAGS on to bin/distill."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pipeline_helpers import REPO, load_script

SCRIPT = os.path.join(REPO, "tools", "pick_python.py")
pick_python = load_script(SCRIPT)


def _fake_python(folder, version: str) -> str:
    """An executable that answers the version query as a Python `version` would."""
    path = folder / f"python{version}"
    path.write_text("#!/bin/sh\necho '" + version.replace(".", " ") + "'\n")
    path.chmod(0o755)
    return str(path)


def test_the_range_is_setup_pys_and_this_python_is_in_it():
    spec, clauses = pick_python.allowed()
    setup = open(os.path.join(REPO, "setup.py"), encoding="utf-8").read()
    assert f'python_requires="{spec}"' in setup
    assert pick_python.satisfies(sys.version_info[:2], clauses)
    assert not pick_python.satisfies((3, 10), clauses)
    # The README names the same range.
    low = next(b for op, b in clauses if op == ">=")
    high = next(b for op, b in clauses if op == "<")
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert f"Python {low[0]}.{low[1]}–{high[0]}.{high[1] - 1}" in readme


def test_the_first_allowed_candidate_is_picked(tmp_path):
    old, new, good = (_fake_python(tmp_path, v) for v in ("3.10.13", "3.13.1", "3.11.9"))
    assert pick_python.pick([old, str(tmp_path / "missing"), new, good]) == (good, False, "")


def test_with_none_allowed_one_line_names_each_candidate_and_the_fix(tmp_path):
    old, new = _fake_python(tmp_path, "3.10.13"), _fake_python(tmp_path, "3.13.1")
    missing = str(tmp_path / "python3.11")
    with pytest.raises(SystemExit) as info:
        pick_python.pick([old, new, missing])
    message = str(info.value)
    assert "\n" not in message
    assert f"{old} is 3.10.13" in message and f"{new} is 3.13.1" in message
    assert f"{missing} not found" in message
    assert "needs Python >=3.11,<3.13" in message and "make PYTHON=" in message


def test_a_venv_of_another_python_version_is_made_anew(tmp_path):
    good = _fake_python(tmp_path, "3.11.9")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    link = venv / "bin" / "python"
    assert pick_python.pick([good], str(venv)) == (good, False, "")  # no venv yet

    os.symlink(_fake_python(tmp_path, "3.11.2"), link)  # the same minor version: kept
    assert pick_python.pick([good], str(venv)) == (good, False, "")

    link.unlink()
    os.symlink(_fake_python(tmp_path, "3.10.13"), link)
    python, clear, note = pick_python.pick([good], str(venv))
    assert (python, clear) == (good, True)
    assert note == f"make: {venv} was made with Python 3.10.13; making it anew with {good} (3.11.9)"

    link.unlink()
    os.symlink(tmp_path / "uninstalled", link)  # its Python is gone
    assert pick_python.pick([good], str(venv))[1] is True


def test_the_script_prints_the_command_that_makes_the_venv(tmp_path):
    old, good = _fake_python(tmp_path, "3.10.13"), _fake_python(tmp_path, "3.12.4")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(old, venv / "bin" / "python")
    done = subprocess.run([sys.executable, SCRIPT, "--venv", str(venv), old, good],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{good} -m venv --clear {venv}"
    assert re.fullmatch(r"make: .* was made with Python 3\.10\.13; making it anew .*\n",
                        done.stderr)
    done = subprocess.run([sys.executable, SCRIPT, old], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("make: tinybert_tf needs Python")
    assert "Traceback" not in done.stderr


def test_make_demo_passes_demo_flags_after_the_flagfile():
    """As the README says to start the demo over; `make -n` prints without running."""
    # Not as a sub-make of `make test` (which prints "Entering directory" lines).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(["make", "--no-print-directory", "-n", "demo",
                           "DEMO_FLAGS=--overwrite --seed=3"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    runs = [line for line in done.stdout.splitlines() if "bin/distill" in line]
    assert len(runs) == 1 and runs[0].endswith(
        "bin/distill --flagfile=configs/demo.cfg --overwrite --seed=3"), done.stdout
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert "`make demo DEMO_FLAGS=--overwrite` starts over" in readme
