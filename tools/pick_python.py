"""Which Python `make` builds .venv with: the first of the candidates named on the
command line whose version setup.py's `python_requires` allows.

    python3 tools/pick_python.py [--venv DIR] CANDIDATE...

Prints the chosen interpreter's path or, with --venv, the command that makes the venv at
DIR: `PYTHON -m venv DIR`, with `--clear` where DIR holds a venv of another Python
version (or one whose Python no longer runs). `python -m venv` over such a venv keeps
its old `bin/python` link beside the new version's libraries, a venv of two Pythons, so
it is made anew. With no candidate allowed it exits 1 with one line: what each
candidate is, the versions allowed, and how to name another.

Standard library only, and no syntax newer than Python 3.6, for whatever Python 3 `make`
finds first: it runs before the venv (and so the `packaging` module) exists, which is why
it reads the specifier itself. setup.py writes it with `>=X.Y` and `<X.Y` clauses only,
and any other is refused.
"""
import os
import re
import shutil
import subprocess
import sys
from typing import List, Optional, Tuple

Version = Tuple[int, ...]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_VERSION_CODE = "import sys; print('%d %d %d' % sys.version_info[:3])"


def allowed() -> Tuple[str, List[Tuple[str, Version]]]:
    """setup.py's `python_requires` as written and as (operator, (major, minor)) clauses."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        found = re.search(r'python_requires\s*=\s*"([^"]+)"', f.read())
    if found is None:
        raise SystemExit("tools/pick_python.py: setup.py has no python_requires")
    spec, clauses = found.group(1), []
    for part in spec.split(","):
        clause = re.fullmatch(r"\s*(>=|<)\s*(\d+)\.(\d+)\s*", part)
        if clause is None:
            raise SystemExit(f"tools/pick_python.py: setup.py's python_requires={spec!r}: "
                             "write it with '>=X.Y' and '<X.Y' clauses, the only ones read here")
        clauses.append((clause.group(1), (int(clause.group(2)), int(clause.group(3)))))
    return spec, clauses


def satisfies(version: Version, clauses: List[Tuple[str, Version]]) -> bool:
    return all(version >= bound if op == ">=" else version < bound for op, bound in clauses)


def version_of(python: str) -> Optional[Version]:
    """The (major, minor, micro) of the interpreter at `python`; None where it does not run."""
    try:
        done = subprocess.run([python, "-c", _VERSION_CODE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        major, minor, micro = (int(x) for x in done.stdout.split())
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return (major, minor, micro) if done.returncode == 0 else None


def _shown(version: Version) -> str:
    return ".".join(str(x) for x in version)


def pick(candidates: List[str], venv: Optional[str] = None) -> Tuple[str, bool, str]:
    """(the interpreter, whether `venv` must be made anew, a note for stderr or '');
    SystemExit when no candidate fits."""
    spec, clauses = allowed()
    seen = []
    for name in candidates:
        path = shutil.which(name)
        version = version_of(path) if path else None
        if version is None:
            seen.append(f"{name} not found")
            continue
        if not satisfies(version[:2], clauses):
            seen.append(f"{name} is {_shown(version)}")
            continue
        venv_python = os.path.join(venv, "bin", "python") if venv else None
        if venv_python is None or not os.path.lexists(venv_python):
            return path, False, ""
        had = version_of(venv_python)
        if had is not None and had[:2] == version[:2]:
            return path, False, ""
        was = f"Python {_shown(had)}" if had else "a Python that no longer runs"
        return path, True, (f"make: {venv} was made with {was}; making it anew with {path} "
                            f"({_shown(version)})")
    raise SystemExit(f"make: tinybert_tf needs Python {spec} (setup.py), and {'; '.join(seen)}: "
                     "install one and run make again, or name it, e.g. "
                     "make PYTHON=/usr/bin/python3.11 demo")


def main(argv: List[str]) -> int:
    venv = None
    if argv[:1] == ["--venv"] and len(argv) > 1:
        venv, argv = argv[1], argv[2:]
    if not argv:
        raise SystemExit("usage: tools/pick_python.py [--venv DIR] CANDIDATE...")
    python, clear, note = pick(argv, venv)
    if note:
        print(note, file=sys.stderr)
    print(python if venv is None else
          " ".join([python, "-m", "venv"] + (["--clear"] if clear else []) + [venv]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
