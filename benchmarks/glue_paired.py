#!/usr/bin/env python3
"""Paired comparisons of two models' dev predictions on a GLUE task.

  .venv/bin/python benchmarks/glue_paired.py --glue_dir=../shared/data/glue

reads the dev predictions `benchmarks/glue.py` wrote (`<model>/dev/<Task>.tsv`) and
the dev labels, and adds to each task of results.json, for each pair (A, B):
A's primary metric minus B's, in points; its 95% interval from a paired bootstrap
over dev examples (both models scored on the same resampled rows); and the exact
McNemar p-value of the examples one model gets right and the other wrong. A single
training seed per model: the interval is the dev sample's spread, not the spread
over training seeds. results.md is rewritten with the comparisons.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
# A:B pairs compared by default, with their row labels in results.md.
PAIR_ROWS = {"tinybert:finetuned_no_kd": "student - same student without distillation",
             "tinybert:teacher": "student - teacher",
             "tinybert_int8_tflite:tinybert": "int8 TFLite - float student",
             # Where the quantize stage was also run training the weights (SST-2).
             "tinybert_int8_qat_tflite:tinybert":
                 "int8 TFLite, weights trained in the quantize stage - float student",
             "tinybert_int8_qat_tflite:tinybert_int8_tflite":
                 "int8 TFLite: weights trained - ranges only",
             # Where benchmarks/glue_flavour.py scored the float student's dynamic int8 file.
             "tinybert_dynamic_int8_tflite:tinybert": "dynamic int8 TFLite - float student",
             "tinybert_dynamic_int8_tflite:tinybert_int8_tflite":
                 "dynamic int8 TFLite - int8 TFLite"}
PAIRS = tuple(PAIR_ROWS)


def _define_flags() -> None:
    """The command's flags (not defined on import: benchmarks/glue.py imports this module
    and has flags of the same names)."""
    flags.DEFINE_string("glue_dir", os.path.join(ROOT, "..", "shared", "data", "glue"),
                        "Folder with SST-2/, MRPC/, RTE/ (their dev.tsv labels).")
    flags.DEFINE_string("results_dir", os.path.join(ROOT, "benchmarks", "results", "glue"),
                        "Where results.json and the prediction TSVs are.")
    flags.DEFINE_list("pairs", list(PAIRS), "A:B model pairs.")
    flags.DEFINE_integer("resamples", 2000, "Bootstrap resamples.")




def mcnemar_p(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value: the discordant pairs under a fair coin."""
    n, k = a_only + b_only, min(a_only, b_only)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def compare(score, a: np.ndarray, b: np.ndarray, gold: np.ndarray, resamples: int,
            seed: int = 0) -> dict[str, Any]:
    """`score(pred ids [N], gold [N]) -> float` of A and B, their difference in points
    with a paired-bootstrap 95% interval, and McNemar on per-example correctness."""
    rng = np.random.default_rng(seed)
    n = len(gold)
    diffs = np.empty(resamples)
    for r in range(resamples):
        idx = rng.integers(0, n, n)
        diffs[r] = score(a[idx], gold[idx]) - score(b[idx], gold[idx])
    a_right, b_right = a == gold, b == gold
    a_only, b_only = int(np.sum(a_right & ~b_right)), int(np.sum(b_right & ~a_right))
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {"difference_points": round(100 * (score(a, gold) - score(b, gold)), 2),
            "ci95_points": [round(100 * low, 2), round(100 * high, 2)],
            "a_only_correct": a_only, "b_only_correct": b_only,
            "mcnemar_p": round(mcnemar_p(a_only, b_only), 5), "resamples": resamples,
            "dev_examples": n}


def read_predictions(path: str, label_names: Sequence[str]) -> np.ndarray:
    """A GLUE prediction file (`index`, `prediction`) -> label ids [N]."""
    ids = {name: i for i, name in enumerate(label_names)}
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    return np.array([ids[prediction] for _, prediction in rows])


class DevSet:
    """A task's dev labels and scorer, and where its models' dev predictions are."""

    def __init__(self, task_name: str, glue_dir: str, primary: str):
        from tinybert_tf.data import glue, glue_submission
        from tinybert_tf.tasks import TaskConfig, resolve_task

        self.task = resolve_task(TaskConfig(task=task_name,
                                            data_dir=os.path.join(glue_dir, task_name)))
        self.gold = np.asarray(self.task.type.gold(self.task.examples("dev")))
        self.label_names = glue.get_task(task_name).label_names
        self.file = glue_submission.SUBMISSIONS[task_name.lower()][0].file
        self.primary = primary

    def score(self, pred: np.ndarray, gold: np.ndarray) -> float:
        return self.task.type.score_labels(pred, gold)[self.primary]

    def path(self, results_dir: str, model: str) -> str:
        return os.path.join(results_dir, model, "dev", self.file)

    def predictions(self, results_dir: str, model: str) -> np.ndarray:
        return read_predictions(self.path(results_dir, model), self.label_names)


def task_pairs(task_name: str, entry: dict[str, Any], glue_dir: str, results_dir: str,
               pairs: Sequence[str] = PAIRS, resamples: int = 2000) -> dict[str, Any]:
    """The comparisons of `pairs` on one task whose dev predictions are all written."""
    dev = DevSet(task_name, glue_dir, entry["primary_metric"])
    out = {}
    for pair in pairs:
        a, b = pair.split(":")
        if all(os.path.exists(dev.path(results_dir, m)) for m in (a, b)):
            out[pair] = compare(dev.score, dev.predictions(results_dir, a),
                                dev.predictions(results_dir, b), dev.gold, resamples)
    return out


def markdown(results: dict[str, Any]) -> str:
    """The comparisons as a table: one row per pair and task."""
    lines = ["| task | comparison (dev) | difference, points | paired-bootstrap 95% "
             "interval | A right, B wrong / B right, A wrong | McNemar p |",
             "|---|---|---|---|---|---|"]
    for task, entry in results.get("tasks", {}).items():
        for pair, c in entry.get("paired", {}).items():
            lines.append(f"| {task} | {PAIR_ROWS.get(pair, pair)} | {c['difference_points']:+.1f}"
                         f" | [{c['ci95_points'][0]:+.1f}, {c['ci95_points'][1]:+.1f}] | "
                         f"{c['a_only_correct']} / {c['b_only_correct']} | "
                         f"{c['mcnemar_p']:.3g} |")
    return "\n".join(lines) + "\n"


def write_table(results_dir: str, results: dict[str, Any]) -> str:
    """Write `results` as `results_dir`/results.json (whole or not at all) and its tables
    as results.md; returns the JSON's path. Every script that changes a table writes it
    here."""
    import glue_results  # TensorFlow starts here

    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(glue_results.markdown(results) + "\n" + markdown(results))
    return path


def main(argv: Sequence[str]) -> None:
    del argv
    path = os.path.join(FLAGS.results_dir, "results.json")
    with open(path) as f:
        results = json.load(f)
    for task, entry in results.get("tasks", {}).items():
        entry["paired"] = task_pairs(task, entry, FLAGS.glue_dir, FLAGS.results_dir,
                                     FLAGS.pairs, FLAGS.resamples)
    write_table(FLAGS.results_dir, results)
    print(markdown(results), end="")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
