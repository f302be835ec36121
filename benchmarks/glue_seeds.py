#!/usr/bin/env python3
"""Every training seed's GLUE run side by side, with the spread over seeds.

  .venv/bin/python benchmarks/glue_seeds.py

reads the `results.json` of --results_dir (the run at the config's own seed) and of
each `seed*/` folder under it (`benchmarks/glue.py --extra=--seed=N
--results_dir=<results_dir>/seedN`), and writes `seeds.json` and `seeds.md` beside
them. Per task and seed: the dev score (the task's primary metric, in points) of the
teacher, the TinyBERT student, its int8 TFLite file (and its dynamic-range int8 file
where benchmarks/glue_flavour.py scored one), the same student trained without a
teacher and TF-IDF, and the student's share of its teacher. Over the seeds: each
figure's mean and standard deviation, and for the share and the paired differences
(student minus the student without distillation, int8 minus float, student minus
teacher) a 95% interval of the mean from Student's t with n - 1 degrees of freedom;
for each quantised file, on how many seeds it is within a point of the float student.

benchmarks/glue_paired.py's intervals are the dev sample's spread for one seed; these
are the training seeds' spread, for a claim about the recipe rather than one run.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import statistics
import sys
from typing import Any, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

from absl import app, flags  # noqa: E402
from scipy import stats  # noqa: E402

FLAGS = flags.FLAGS
# The models of a seed's row, in the table's order: results.json's name -> column.
MODELS = {"teacher": "teacher", "tinybert": "student", "tinybert_int8_tflite": "int8 TFLite",
          "tinybert_dynamic_int8_tflite": "dynamic int8 TFLite",
          "finetuned_no_kd": "no KD", "tfidf_logreg": "TF-IDF"}
# Paired differences over seeds: (A, B, label); each seed gives A - B in points.
DIFFERENCES = (("tinybert", "finetuned_no_kd", "student - no KD"),
               ("tinybert_int8_tflite", "tinybert", "int8 - float student"),
               ("tinybert_dynamic_int8_tflite", "tinybert", "dynamic int8 - float student"),
               ("tinybert", "teacher", "student - teacher"))
# The quantised files' goal: within this many points of the float student, per seed.
QUANTIZED = {"int8 - float student", "dynamic int8 - float student"}
WITHIN_POINTS = 1.0


def _define_flags() -> None:
    flags.DEFINE_string("results_dir", os.path.join(ROOT, "benchmarks", "results", "glue"),
                        "Folder with results.json and seed*/results.json.")
    flags.DEFINE_string("config", os.path.join(ROOT, "configs", "glue_minilm.cfg"),
                        "The flagfile whose --seed the runs without --seed used.")


def config_seed(config: str) -> int:
    """The `--seed=N` line of a flagfile (the seed of runs that give none). A flagfile
    that sets its seed only in one it includes is refused with the fix: name that one."""
    try:
        with open(config, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"--config={config}: {e.strerror}") from None
    for line in lines:
        found = re.fullmatch(r"\s*--seed=(\d+)\s*", line)
        if found:
            return int(found.group(1))
    raise ValueError(f"--config={config}: no --seed=N line; give the flagfile that sets "
                     "the runs' seed (an included one is not read)")


def run_seed(entry: dict[str, Any], default: int) -> int:
    """The --seed one task's commands ran with (`default` when none gives one)."""
    seeds = set(re.findall(r"--seed=(\d+)", json.dumps(entry.get("commands", {}))))
    if len(seeds) > 1:
        raise ValueError(f"the task's commands ran with several seeds: {sorted(seeds)}")
    return int(seeds.pop()) if seeds else default


def seed_rows(results_dir: str, default: int) -> dict[str, dict[int, dict[str, Any]]]:
    """{task: {seed: {model: points, "retained": %, "folder": path}}} from every
    results.json found; a seed found twice for a task is an error (which run is it?)."""
    paths = [os.path.join(results_dir, "results.json")]
    paths += sorted(glob.glob(os.path.join(results_dir, "seed*", "results.json")))
    tasks: dict[str, dict[int, dict[str, Any]]] = {}
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                results = json.load(f)
            found = {task: (entry["primary_metric"], run_seed(entry, default), entry)
                     for task, entry in results["tasks"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not a results.json of benchmarks/glue.py "
                             f"({type(e).__name__}: {e})") from None
        for task, (metric, seed, entry) in found.items():
            row: dict[str, Any] = {"folder": os.path.relpath(os.path.dirname(path), results_dir)}
            for name in MODELS:
                dev = entry.get("models", {}).get(name, {}).get("dev", {})
                if metric in dev:
                    row[name] = 100.0 * dev[metric]
            if "tinybert" in row and "teacher" in row:
                row["retained"] = 100.0 * row["tinybert"] / row["teacher"]
            by_seed = tasks.setdefault(task, {})
            if seed in by_seed:
                raise ValueError(f"{task}: seed {seed} is in both {by_seed[seed]['folder']} "
                                 f"and {row['folder']}; keep one")
            by_seed[seed] = row
    return tasks


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, sample standard deviation and the t-based 95% interval of the mean."""
    n = len(values)
    mean = statistics.fmean(values)
    out: dict[str, Any] = {"n": n, "mean": mean, "sd": None, "ci95": None}
    if n >= 2:
        sd = statistics.stdev(values)
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        out.update(sd=sd, ci95=[mean - half, mean + half])
    return out


def summarise(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Over one task's seeds: each model's and the share's spread, and the paired
    differences' (only seeds that have both models count)."""
    out: dict[str, Any] = {"seeds": sorted(rows)}
    for key in (*MODELS, "retained"):
        values = [rows[s][key] for s in sorted(rows) if key in rows[s]]
        if values:
            out[key] = spread(values)
    for a, b, label in DIFFERENCES:
        values = [rows[s][a] - rows[s][b] for s in sorted(rows) if a in rows[s] and b in rows[s]]
        if values:
            out[label] = spread(values)
            if label in QUANTIZED:
                out[label]["within_1_point"] = sum(v >= -WITHIN_POINTS - 1e-9 for v in values)
    return out


def _cell(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f}"


def _mean_sd(s: dict[str, Any]) -> str:
    return _cell(s["mean"]) + ("" if s["sd"] is None else f" ± {s['sd']:.1f}")


def _interval(s: dict[str, Any], sign: str = "+") -> str:
    """"mean [low, high]", signed for differences (`sign="+"`), plain for shares."""
    mean = format(s["mean"], f"{sign}.1f")
    if s["ci95"] is None:
        return f"{mean} (one seed)"
    low, high = (format(v, f"{sign}.1f") for v in s["ci95"])
    return f"{mean} [{low}, {high}]"


def markdown(tasks: dict[str, dict[int, dict[str, Any]]],
             summaries: dict[str, dict[str, Any]]) -> str:
    lines = []
    for task in sorted(tasks):
        rows, summary = tasks[task], summaries[task]
        lines += [f"### {task}", "",
                  "| seed | " + " | ".join(MODELS.values()) + " | student / teacher |",
                  "|---" * (len(MODELS) + 2) + "|"]
        for seed in sorted(rows):
            row = rows[seed]
            share = "" if "retained" not in row else f"{row['retained']:.1f}%"
            lines.append(f"| {seed} | " + " | ".join(_cell(row.get(m)) for m in MODELS)
                         + f" | {share} |")
        lines.append("| mean ± sd | " + " | ".join(
            _mean_sd(summary[m]) if m in summary else "" for m in MODELS)
            + (f" | {_mean_sd(summary['retained'])}% |" if "retained" in summary else " | |"))
        lines += ["", "| over the seeds | mean [95% interval, t over seeds] |", "|---|---|"]
        if "retained" in summary:
            lines.append(f"| student / teacher, % | {_interval(summary['retained'], sign='')} |")
        for _, _, label in DIFFERENCES:
            if label in summary:
                within = summary[label].get("within_1_point")
                note = "" if within is None else (
                    f" (within {WITHIN_POINTS:g} point on {within} of {summary[label]['n']} "
                    f"seed{'s' if summary[label]['n'] != 1 else ''})")
                lines.append(f"| {label}, points | {_interval(summary[label])}{note} |")
        lines.append("")
    return "\n".join(lines)


def _rounded(value: Any) -> Any:
    """`value` with every float to 3 decimals (seeds.json is read by people too)."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        tasks = seed_rows(FLAGS.results_dir, config_seed(FLAGS.config))
    except ValueError as e:
        sys.exit(f"glue_seeds.py: {e}")
    if not tasks:
        sys.exit(f"glue_seeds.py: no results.json under {FLAGS.results_dir}; run "
                 "benchmarks/glue.py first, or give --results_dir")
    summaries = {task: summarise(rows) for task, rows in tasks.items()}
    text = markdown(tasks, summaries)
    out = _rounded({task: {"per_seed": {str(s): r for s, r in sorted(tasks[task].items())},
                           "over_seeds": summaries[task]} for task in sorted(tasks)})
    # Written here rather than with tinybert_tf.files' atomic writers (or the flagfile read
    # with tinybert_tf.cli.flagfiles): those import TensorFlow, which this table needs not.
    for name, body in (("seeds.json", json.dumps(out, indent=1, sort_keys=True) + "\n"),
                       ("seeds.md", text)):
        path = os.path.join(FLAGS.results_dir, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(body)
        os.replace(path + ".tmp", path)
    print(text, end="")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
