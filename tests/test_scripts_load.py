"""Every benchmark and tool script loads: its imports of the package still resolve.

These scripts run for minutes to hours and no other test runs them, so a renamed or
moved name in the package broke them unnoticed (bench_quantize.py imported STAGES from
pipeline/stages.py after it moved to pipeline/context.py). Loading a script runs its
imports and definitions, not its `main`.
"""
from __future__ import annotations

import ast
import glob
import importlib.util
import os

import pytest

from pipeline_helpers import REPO

SCRIPTS = sorted(glob.glob(os.path.join(REPO, "benchmarks", "*.py"))
                 + glob.glob(os.path.join(REPO, "tools", "*.py")))
# Run with a Python that has torch (never in .venv): parsed here, not loaded.
TORCH_SCRIPTS = {"bench_distill_torch.py", "bench_task_distill_torch.py"}


def test_there_are_scripts_to_check():
    names = {os.path.basename(p) for p in SCRIPTS}
    assert {"bench_quantize.py", "bench_task_distill.py", "demo_ab.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_script_loads_without_running_its_main(path):
    name = os.path.basename(path)
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source, path)
    assert any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body), f"{name}: main() must run only under __main__"
    if name in TORCH_SCRIPTS:
        return
    spec = importlib.util.spec_from_file_location(f"script_{name[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{name} has no main()"
