"""benchmarks/glue_seeds.py: every seed's results.json in one table, the spread over seeds."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pipeline_helpers import REPO, load_script


def _script():
    return load_script(os.path.join(REPO, "benchmarks", "glue_seeds.py"))


def _results(folder, seed, teacher, student, no_kd, int8, task="MRPC", metric="f1",
             dynamic_int8=None):
    """A results.json of one task as benchmarks/glue.py writes it (the fields read)."""
    os.makedirs(folder, exist_ok=True)
    extra = [] if seed is None else [f"--seed={seed}"]
    entry = {"primary_metric": metric,
             "commands": {"tinybert": ["bin/distill", "--task=" + task, *extra],
                          "finetuned": ["bin/distill", *extra]},
             "models": {"teacher": {"dev": {metric: teacher, "accuracy": 0.5}},
                        "tinybert": {"dev": {metric: student}},
                        "finetuned_no_kd": {"dev": {metric: no_kd}},
                        "tinybert_int8_tflite": {"dev": {metric: int8}}}}
    if dynamic_int8 is not None:  # benchmarks/glue_flavour.py's model
        entry["models"]["tinybert_dynamic_int8_tflite"] = {"dev": {metric: dynamic_int8}}
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump({"tasks": {task: entry}}, f)


def test_rows_per_seed_and_the_spread_over_seeds_match_the_formulas(tmp_path):
    seeds = _script()
    root = str(tmp_path)
    _results(root, None, 0.85, 0.82, 0.80, 0.81)                       # the config's seed
    _results(os.path.join(root, "seed1"), 1, 0.86, 0.83, 0.81, 0.83, dynamic_int8=0.825)
    _results(os.path.join(root, "seed2"), 2, 0.84, 0.81, 0.81, 0.80, dynamic_int8=0.799)
    tasks = seeds.seed_rows(root, default=42)
    rows = tasks["MRPC"]
    assert sorted(rows) == [1, 2, 42]
    assert rows[42]["folder"] == "." and rows[1]["folder"] == "seed1"
    assert rows[2]["retained"] == pytest.approx(100 * 0.81 / 0.84)

    summary = seeds.summarise(rows)
    diffs = np.array([83 - 81, 81 - 81, 82 - 80], float)              # student - no KD
    n, mean, sd = 3, diffs.mean(), diffs.std(ddof=1)
    half = 4.302652729911275 * sd / np.sqrt(n)                          # t(0.975, df=2)
    got = summary["student - no KD"]
    assert got["n"] == n and got["mean"] == pytest.approx(mean)
    assert got["sd"] == pytest.approx(sd)
    assert got["ci95"] == pytest.approx([mean - half, mean + half])
    shares = [100 * 0.83 / 0.86, 100 * 0.81 / 0.84, 100 * 0.82 / 0.85]  # seeds 1, 2, 42
    assert summary["retained"]["mean"] == pytest.approx(np.mean(shares))
    assert summary["int8 - float student"]["mean"] == pytest.approx((0 - 1 - 1) / 3)
    # Within a point of the float student: a loss of exactly 1 point counts, 1.1 does not.
    assert summary["int8 - float student"]["within_1_point"] == 3
    dynamic = summary["dynamic int8 - float student"]                 # seeds 1 and 2 only
    assert dynamic["n"] == 2 and dynamic["mean"] == pytest.approx((-0.5 - 1.1) / 2)
    assert dynamic["within_1_point"] == 1
    assert "student - no KD" not in [k for k in summary if "within_1_point" in summary[k]]

    text = seeds.markdown(tasks, {"MRPC": summary})
    assert "| 42 | 85.0 | 82.0 | 81.0 |  | 80.0 |  | 96.5% |" in text
    assert "| 1 | 86.0 | 83.0 | 83.0 | 82.5 | 81.0 |  | 96.5% |" in text
    assert "| dynamic int8 - float student, points | -0.8 [" in text
    assert "(within 1 point on 1 of 2 seeds) |" in text
    assert "| int8 - float student, points | -0.7 [" in text and \
        "(within 1 point on 3 of 3 seeds) |" in text
    assert f"| student - no KD, points | +{mean:.1f} [{mean - half:+.1f}, {mean + half:+.1f}] |" \
        in text


def test_one_seed_has_no_interval_and_says_so(tmp_path):
    seeds = _script()
    _results(str(tmp_path), None, 0.56, 0.53, 0.56, 0.50, task="RTE", metric="accuracy")
    rows = seeds.seed_rows(str(tmp_path), default=42)["RTE"]
    summary = seeds.summarise(rows)
    assert summary["retained"]["sd"] is None and summary["retained"]["ci95"] is None
    assert "| student - no KD, points | -3.0 (one seed) |" in seeds.markdown(
        {"RTE": rows}, {"RTE": summary})


def test_a_seed_in_two_folders_is_refused_naming_both(tmp_path):
    seeds = _script()
    _results(os.path.join(str(tmp_path), "seed1"), 1, 0.85, 0.82, 0.80, 0.81)
    _results(os.path.join(str(tmp_path), "seed1b"), 1, 0.85, 0.83, 0.80, 0.81)
    with pytest.raises(ValueError, match="seed 1 is in both seed1 and seed1b"):
        seeds.seed_rows(str(tmp_path), default=42)


def test_the_default_seed_is_the_configs():
    seeds = _script()
    assert seeds.config_seed(os.path.join(REPO, "configs", "glue_minilm.cfg")) == 42


def test_a_file_that_is_not_a_results_json_is_named(tmp_path):
    seeds = _script()
    folder = tmp_path / "seed3"
    folder.mkdir()
    (folder / "results.json").write_text('{"tasks": {"MRPC": {}}}')
    with pytest.raises(ValueError, match=r"seed3/results.json: not a results.json of "
                                         r"benchmarks/glue.py \(KeyError: 'primary_metric'\)"):
        seeds.seed_rows(str(tmp_path), default=42)
