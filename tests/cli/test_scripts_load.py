"""Every benchmark and tool script loads: its imports of the package still resolve.

These scripts run for minutes to hours and no other test runs them, so a renamed or
moved name in the package would break them unnoticed. Loading a script runs its
imports and definitions, not its `main`.
"""
from __future__ import annotations

import ast
import glob
import importlib.util
import os

import numpy as np
import pytest

from pipeline_helpers import REPO

SCRIPTS = sorted(glob.glob(os.path.join(REPO, "benchmarks", "*.py"))
                 + glob.glob(os.path.join(REPO, "tools", "*.py")))
# Run with a Python that has torch (never in .venv): parsed here, not loaded.
TORCH_SCRIPTS = {"bench_distill_torch.py", "bench_task_distill_torch.py"}


def load_script(path: str):
    """The script at `path` as a module: its imports and definitions run, its `main` not."""
    name = os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_scripts_to_check():
    names = {os.path.basename(p) for p in SCRIPTS}
    assert {"bench_quantize.py", "bench_task_distill.py", "demo_ab.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_script_loads_without_running_its_main(path):
    name = os.path.basename(path)
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    assert any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body), f"{name}: main() must run only under __main__"
    if name in TORCH_SCRIPTS:
        return
    assert callable(getattr(load_script(path), "main", None)), f"{name} has no main()"


def test_bench_quantize_counts_disagreements_by_the_float_top2_gap():
    bench = load_script(os.path.join(REPO, "benchmarks", "bench_quantize.py"))
    # Float top-2 gaps of 1, 3, 6, 12 and 40 int8 steps (1/256); the int8 flavour turns
    # the labels of the 3- and the 12-step rows.
    p1 = 0.5 + np.array([1, 3, 6, 12, 40]) / 512.0
    reference = np.stack([1 - p1, p1], 1)
    outputs = reference.copy()
    outputs[[1, 3]] = outputs[[1, 3]][:, ::-1]
    bands = bench.near_tie_bands(reference, outputs)
    assert list(bands) == ["<2", "<4", "<8", "<16"]
    assert [bands[k]["disagreements"] for k in bands] == [0, 1, 1, 2]
    assert [bands[k]["share"] for k in bands] == [0.2, 0.4, 0.6, 0.8]
    assert all(b["of"] == 2 for b in bands.values())


def test_wiki_kinds_splits_people_and_places_by_article(tmp_path):
    """The real-text task of the 4-layer quantize benchmark (docs/deploy.md): the
    documented sizes, both kinds in each split, and no dev sentence in train."""
    import csv
    import io
    kinds = load_script(os.path.join(REPO, "benchmarks", "wiki_kinds.py"))
    assert kinds.build(str(tmp_path)) == {"train": 7300, "dev": 1234}
    rows = {split: list(csv.DictReader(io.StringIO(
                (tmp_path / f"{split}.csv").read_text(encoding="utf-8"), newline="")))
            for split in ("train", "dev")}
    assert {r["label"] for r in rows["dev"]} == {"person", "place"}
    assert sum(r["label"] == "person" for r in rows["dev"]) == 620
    assert sum(r["label"] == "person" for r in rows["train"]) == 2937
    assert not {r["text"] for r in rows["dev"]} & {r["text"] for r in rows["train"]}
    assert set(kinds.DEV) < set(kinds.PEOPLE) | set(kinds.PLACES)
