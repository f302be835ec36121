#!/usr/bin/env python3
"""Table 2's ablations on a real GLUE task, each one change from the --config flagfile
(configs/glue_minilm.cfg by default), over several training seeds, with paired
differences against the recipe.

  .venv/bin/python benchmarks/glue_ablations.py --task=MRPC \
      --task_teacher=TEACHER/finetune_teacher/model --general_model=GENERAL/general/model \
      --seeds=42,1,2 --work_dir=runs/glue_ablations \
      --results_dir=benchmarks/results/glue/ablations

The teacher and the general model are fixed (give those benchmarks/glue.py made, or any
bin/distill run of the same config); per seed, every cell distils from them:

  tinybert  the recipe: task distillation (intermediate, then prediction layer) on the
            augmented data, from the general model
  no_gd     w/o GD: the same, from the student the general stage starts from
            (--recipe=mapped_layers: the teacher's embeddings and layers g(m), no
            general distillation), made once and shared by the seeds
  no_td     w/o TD: the general model fine-tuned on the same augmented data, no teacher
            signal (--task_phases=finetune)
  no_da     w/o DA: task distillation on the original training set (--nouse_augmented)

The cells of a seed read the augmented file the recipe's cell wrote (--augmented_file),
so they differ in their one flag and nothing else. Writes, under --results_dir,
`<cell>/seed<S>/dev/<Task>.tsv` and `<cell>/seed<S>/<Task>.tsv` (GLUE format; test
labels are never read), and `<Task>.json` / `<Task>.md`: the dev metric per cell and
seed; each cell's paired difference from the recipe per seed (paired bootstrap,
McNemar; glue_paired.py); and over the seeds, the mean difference with its standard
deviation and a 95% interval from resampling the dev examples once for all seeds (the
dev set's noise in the mean; "beyond noise" when it excludes 0). Re-running resumes: a
finished run is skipped, a scored cell is not scored again; --summarise_only rewrites
the tables from the predictions without running anything. One `<Task>.json` holds one
recipe (--config, --extra, --task_teacher, --general_model): a run with others is
refused before anything runs, so that seeds of two recipes never share a table.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import time
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # glue_meta, glue_results

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from glue_meta import (  # noqa: E402
    PRIMARY,
    check_task_folders,
    check_teacher_labels,
    commit,
    extra_flags,
    glue_tasks,
    host,
    recipe_changes,
    run_distill,
)

FLAGS = flags.FLAGS
flags.DEFINE_string("task", None, "GLUE task name (SST-2, MRPC, RTE).")
flags.DEFINE_string("glue_dir", os.path.join(ROOT, "..", "shared", "data", "glue"),
                    "Folder with <task>/ in the GLUE TSV layout.")
flags.DEFINE_string("task_teacher", "", "The task's fine-tuned teacher (a model folder).")
flags.DEFINE_string("general_model", "", "The recipe's general model (a model folder).")
flags.DEFINE_list("seeds", ["42", "1", "2"], "Training seeds (--seed of every cell).")
flags.DEFINE_list("cells", ["tinybert", "no_da", "no_td", "no_gd"],
                  "Cells to run, in order; tinybert (the recipe) must be among them.")
flags.DEFINE_string("work_dir", os.path.join(ROOT, "runs", "glue_ablations"),
                    "Where the runs go.")
flags.DEFINE_string("results_dir", os.path.join(ROOT, "benchmarks", "results", "glue",
                                                "ablations"),
                    "Where the small result files go.")
flags.DEFINE_string("config", os.path.join(ROOT, "configs", "glue_minilm.cfg"),
                    "The flagfile every run starts from.")
flags.DEFINE_list("extra", [], "More bin/distill flags for every run.")
flags.DEFINE_bool("summarise_only", False, "Run nothing: rewrite <Task>.json's summary and "
                  "<Task>.md from the finished runs' dev predictions.")
flags.mark_flag_as_required("task")

RECIPE = "tinybert"
# cell -> (what it is, its one change from the recipe); "{no_gd}" is the untrained start.
CELLS: dict[str, tuple[str, list[str]]] = {
    RECIPE: ("TinyBERT: GD + TD on augmented data", []),
    "no_gd": ("w/o GD (teacher-initialised, not general-distilled)",
              ["--general_model={no_gd}"]),
    "no_td": ("w/o TD (fine-tuned on the augmented data)", ["--task_phases=finetune"]),
    "no_da": ("w/o DA (distilled on the original data)", ["--nouse_augmented"]),
}


def log(msg: str) -> None:
    print(f"[ablations {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def distill(args: list[str], out: str) -> list[str]:
    """One bin/distill run of the task into `out` (it resumes, or skips finished
    stages); returns its command."""
    return run_distill(FLAGS.config, [
        f"--task={FLAGS.task}", f"--data_dir={os.path.join(FLAGS.glue_dir, FLAGS.task)}",
        f"--task_teacher={FLAGS.task_teacher}", *args, f"--output_dir={out}",
        *[a for a in FLAGS.extra if a]], os.path.join(out, "log.txt"),
        "benchmarks/glue_ablations.py", log)


def augmented_file(recipe_dir: str) -> str:
    """The augmented training file the recipe's cell wrote (OUTPUT/augment/<file>)."""
    found = [p for p in glob.glob(os.path.join(recipe_dir, "augment", "*"))
             if os.path.isfile(p) and not p.endswith(".json")]
    if len(found) != 1:
        raise SystemExit(f"benchmarks/glue_ablations.py: expected one augmented file in "
                         f"{recipe_dir}/augment, found {found}")
    return found[0]


def cell_args(cell: str, seed: str, general_model: str, no_gd: str, augmented: str
              ) -> list[str]:
    """The stages and flags of one cell: the recipe's, with the cell's one change.
    `augmented` is the recipe's augmented file, which the other cells read."""
    change = [a.format(no_gd=no_gd) for a in CELLS[cell][1]]
    args = [f"--stages={'augment,task' if cell == RECIPE else 'task'}"]
    if not any(a.startswith("--general_model=") for a in change):
        args.append(f"--general_model={general_model}")
    if cell != RECIPE and "--nouse_augmented" not in change:
        args.append(f"--augmented_file={augmented}")
    return [*args, *change, f"--seed={seed}"]


def pooled_difference(dev, results_dir: str, cell: str, seeds: list[str],
                      resamples: int = 2000, rng_seed: int = 0) -> dict[str, Any]:
    """The cell's metric minus the recipe's, averaged over `seeds`, in points, with a
    95% interval from a bootstrap that draws one resample of the dev examples for all
    seeds: how much the seed mean moves with the dev sample (the spread over seeds is
    reported beside it). `dev`: a glue_paired.DevSet."""
    a = [dev.predictions(results_dir, f"{cell}/seed{s}") for s in seeds]
    b = [dev.predictions(results_dir, f"{RECIPE}/seed{s}") for s in seeds]
    gold = dev.gold

    def mean_difference(idx: np.ndarray) -> float:
        return float(np.mean([dev.score(x[idx], gold[idx]) - dev.score(y[idx], gold[idx])
                              for x, y in zip(a, b)]))

    rng = np.random.default_rng(rng_seed)
    n = len(gold)
    draws = [mean_difference(rng.integers(0, n, n)) for _ in range(resamples)]
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"difference_points": round(100 * mean_difference(np.arange(n)), 2),
            "ci95_points": [round(float(100 * low), 2), round(float(100 * high), 2)],
            "seeds": list(seeds),
            "resamples": resamples}


def mean_sd(values: list[float]) -> tuple[float, Optional[float]]:
    """The mean and sample standard deviation (None for one value) of `values`."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def summarise(results: dict[str, Any]) -> None:
    """Per cell: the metric over seeds, and its paired difference from the recipe (per
    seed, and pooled over seeds in results["pooled"] when computed)."""
    primary = results["primary_metric"]
    summary = {}
    for cell in results["cells"]:
        per_seed = results["runs"].get(cell, {})
        scores = [r["dev"][primary] for r in per_seed.values()]
        entry: dict[str, Any] = {"seeds": sorted(per_seed, key=int), "n": len(scores)}
        if scores:
            mean, sd = mean_sd([100 * x for x in scores])
            entry["mean"], entry["sd"] = round(mean, 3), None if sd is None else round(sd, 3)
        diffs = [r["paired_with_recipe"]["difference_points"] for r in per_seed.values()
                 if "paired_with_recipe" in r]
        if diffs:
            mean, sd = mean_sd(diffs)
            entry.update({
                "difference_mean": round(mean, 2),
                "difference_sd": None if sd is None else round(sd, 2),
                "seeds_below_recipe": sum(d < 0 for d in diffs),
            })
        pooled = results.get("pooled", {}).get(cell)
        if pooled:
            low, high = pooled["ci95_points"]
            # Beyond the dev set's noise: the pooled interval excludes 0.
            entry["beyond_noise"] = high < 0 or low > 0
        summary[cell] = entry
    results["summary"] = summary


def markdown(results: dict[str, Any]) -> str:
    task, primary = results["task"], results["primary_metric"]
    lines = [f"{task}: Table 2's cells on dev ({primary}), teacher {results['teacher_dev']}; "
             f"each cell one change from the recipe, the same teacher and general model.",
             "", "| cell | seeds | dev mean ± sd | cell − recipe: mean over seeds ± sd "
             "(points) | dev-resampled 95% interval of the mean | seeds below the recipe |",
             "|---|---|---|---|---|---|"]
    for cell, s in results["summary"].items():
        if not s["n"]:
            continue
        sd = f" ± {s['sd']:.1f}" if s.get("sd") is not None else ""
        diff, interval, below = "–", "–", "–"
        if cell != RECIPE and "difference_mean" in s:
            dsd = f" ± {s['difference_sd']:.1f}" if s.get("difference_sd") is not None else ""
            diff = f"{s['difference_mean']:+.1f}{dsd}"
            below = f"{s['seeds_below_recipe']} of {s['n']}"
            pooled = results.get("pooled", {}).get(cell)
            if pooled:
                interval = f"[{pooled['ci95_points'][0]:+.1f}, {pooled['ci95_points'][1]:+.1f}]"
        lines.append(f"| {CELLS[cell][0]} | {', '.join(s['seeds'])} | {s['mean']:.1f}{sd} | "
                     f"{diff} | {interval} | {below} |")
    lines += ["", "| cell | seed | dev | cell − recipe | paired-bootstrap 95% interval | "
              "McNemar p |", "|---|---|---|---|---|---|"]
    for cell, per_seed in results["runs"].items():
        for seed, r in sorted(per_seed.items(), key=lambda kv: int(kv[0])):
            c = r.get("paired_with_recipe")
            pair = (f"{c['difference_points']:+.1f} | [{c['ci95_points'][0]:+.1f}, "
                    f"{c['ci95_points'][1]:+.1f}] | {c['mcnemar_p']:.3g}") if c else "– | – | –"
            lines.append(f"| {cell} | {seed} | {100 * r['dev'][primary]:.1f} | {pair} |")
    return "\n".join(lines) + "\n"


def pool(results: dict[str, Any], dev, accuracy=None) -> None:
    """results["pooled"]: each cell's pooled difference over the seeds it shares with the
    recipe; results["pooled_accuracy"] the same in accuracy, given `accuracy` (a DevSet
    scoring it) for a task whose primary metric is another (MRPC's F1)."""
    recipe = results["runs"].get(RECIPE, {})
    for key, scorer in (("pooled", dev), ("pooled_accuracy", accuracy)):
        if scorer is None:
            continue
        results[key] = {}
        for cell, per_seed in results["runs"].items():
            seeds = sorted((s for s in per_seed if s in recipe), key=int)
            if cell != RECIPE and seeds:
                results[key][cell] = pooled_difference(scorer, FLAGS.results_dir, cell, seeds)


def accuracy_markdown(results: dict[str, Any]) -> str:
    """The cells in accuracy, with the pooled intervals of results["pooled_accuracy"]."""
    lines = ["", "In accuracy:", "", "| cell | dev accuracy mean ± sd | cell − recipe, mean "
             "over seeds | dev-resampled 95% interval of the mean |", "|---|---|---|---|"]
    for cell in results["cells"]:
        per_seed = results["runs"].get(cell, {})
        scores = [100 * r["dev"]["accuracy"] for r in per_seed.values()]
        if not scores:
            continue
        mean, sd = mean_sd(scores)
        spread = f" ± {sd:.1f}" if sd is not None else ""
        c = results["pooled_accuracy"].get(cell)
        diff = f"{c['difference_points']:+.1f}" if c else "–"
        interval = f"[{c['ci95_points'][0]:+.1f}, {c['ci95_points'][1]:+.1f}]" if c else "–"
        lines.append(f"| {CELLS[cell][0]} | {mean:.1f}{spread} | {diff} | {interval} |")
    return "\n".join(lines) + "\n"


def recipe() -> dict[str, Any]:
    """What makes one table: the config, the extra flags it does not set already
    (`glue_meta.extra_flags`, as for benchmarks/glue.py's tables), the teacher and the
    general model."""
    return {"config": os.path.relpath(FLAGS.config, ROOT),
            "extra": extra_flags(FLAGS.config, FLAGS.extra),
            "task_teacher": os.path.abspath(FLAGS.task_teacher),
            "general_model": os.path.abspath(FLAGS.general_model)}


def check_same_recipe(results: dict[str, Any], path: str, current: dict[str, Any]) -> None:
    """Stop when `path` holds cells of another recipe than `current` (`recipe()`),
    compared as `glue_meta.recipe_changes` compares them."""
    changed = [f"--{key}={','.join(old) if isinstance(old, list) else old} there, "
               f"--{key}={','.join(new) if isinstance(old, list) else new} here"
               for key, old, new in recipe_changes(results, current)]
    if changed:
        raise SystemExit(
            f"benchmarks/glue_ablations.py: --results_dir: {path} holds the cells of another "
            f"recipe ({'; '.join(changed)}): its seeds and these would share one table. Give "
            "another --results_dir (e.g. benchmarks/results/glue/<student>/ablations), or "
            "that table's flags to resume it.")


def save(results: dict[str, Any]) -> None:
    summarise(results)
    base = os.path.join(FLAGS.results_dir, FLAGS.task)
    os.makedirs(FLAGS.results_dir, exist_ok=True)
    with open(base + ".json.tmp", "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(base + ".json.tmp", base + ".json")
    with open(base + ".md", "w") as f:
        f.write(markdown(results) + (accuracy_markdown(results)
                                     if "pooled_accuracy" in results else ""))


def run_cells(results: dict[str, Any], dev, gr, glue_paired, accuracy=None) -> None:
    """Every (seed, cell) not yet in `results`: its bin/distill run, its dev and test
    predictions, its paired comparison with the recipe; the files rewritten after each."""
    task = dev.task
    max_seq_len = task.max_seq_len(0)
    tokenizer = gr.load_tokenizer(FLAGS.task_teacher, max_seq_len)
    predictor = gr.Predictor(FLAGS.task, task, tokenizer, max_seq_len, FLAGS.results_dir)
    primary = dev.primary
    if "teacher_dev" not in results:
        score = predictor.keras_dev(gr.load_model(FLAGS.task_teacher))
        results["teacher_dev"] = round(100 * score[primary], 2)
    results.update({"host": host(), "commit": commit(), "command": " ".join(sys.argv),
                    **recipe()})
    no_gd = os.path.join(FLAGS.work_dir, FLAGS.task, "no_gd_start")
    if "no_gd" in FLAGS.cells:
        results["no_gd_start_command"] = distill(
            ["--stages=general", "--recipe=mapped_layers"], no_gd)
    for seed in FLAGS.seeds:
        recipe_dir = os.path.join(FLAGS.work_dir, FLAGS.task, f"seed{seed}", RECIPE)
        for cell in [RECIPE] + [c for c in FLAGS.cells if c != RECIPE]:
            if seed in results["runs"].get(cell, {}):
                continue
            out = os.path.join(FLAGS.work_dir, FLAGS.task, f"seed{seed}", cell)
            augmented = augmented_file(recipe_dir) if cell != RECIPE else ""
            command = distill(cell_args(cell, seed, FLAGS.general_model,
                                        os.path.join(no_gd, "general", "model"), augmented),
                              out)
            model = gr.load_model(os.path.join(out, "task", "model"))
            name = f"{cell}/seed{seed}"
            run = {"dev": predictor.keras(name, model), "command": command,
                   "seconds": gr.seconds(out), "commit": commit()}
            if cell != RECIPE:
                pair = f"{name}:{RECIPE}/seed{seed}"
                run["paired_with_recipe"] = glue_paired.task_pairs(
                    FLAGS.task, {"primary_metric": primary}, FLAGS.glue_dir,
                    FLAGS.results_dir, [pair])[pair]
            results["runs"].setdefault(cell, {})[seed] = run
            pool(results, dev, accuracy)
            save(results)
            log(f"{name}: dev {run['dev']}")


def main(argv: list[str]) -> None:
    del argv
    FLAGS.task = glue_tasks([FLAGS.task], "benchmarks/glue_ablations.py", "--task")[0]
    unknown = [c for c in FLAGS.cells if c not in CELLS]
    if unknown or RECIPE not in FLAGS.cells:
        raise SystemExit(f"--cells: use {', '.join(CELLS)} (with {RECIPE}); got {FLAGS.cells}")
    missing = [f"--{n}" for n in ("task_teacher", "general_model") if not FLAGS[n].value]
    if missing and not FLAGS.summarise_only:
        raise SystemExit(f"benchmarks/glue_ablations.py: give {' and '.join(missing)} "
                         "(or --summarise_only to rewrite the tables of finished runs).")
    absent = [f"--{n}={FLAGS[n].value}" for n in ("task_teacher", "general_model")
              if FLAGS[n].value and not os.path.isdir(FLAGS[n].value)]
    if absent and not FLAGS.summarise_only:
        raise SystemExit(f"benchmarks/glue_ablations.py: {', '.join(absent)}: no such model "
                         "folder; give the folders bin/distill wrote (OUTPUT/<stage>/model).")
    path = os.path.join(FLAGS.results_dir, f"{FLAGS.task}.json")
    results: dict[str, Any] = {}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    elif FLAGS.summarise_only:
        raise SystemExit(f"--summarise_only: {path} does not exist; run the cells first.")
    if not FLAGS.summarise_only:
        check_same_recipe(results, path, recipe())  # before TensorFlow starts
    check_task_folders([FLAGS.task], FLAGS.glue_dir, "benchmarks/glue_ablations.py")
    import glue_paired
    import glue_results as gr  # TensorFlow starts here, after the flags are parsed

    if FLAGS.task_teacher:
        check_teacher_labels(FLAGS.task_teacher, FLAGS.task, "--task_teacher",
                             "benchmarks/glue_ablations.py")
    results.update({"task": FLAGS.task, "primary_metric": PRIMARY[FLAGS.task],
                    "cells": FLAGS.cells, "changes": {c: CELLS[c][1] for c in FLAGS.cells}})
    results.setdefault("runs", {})
    dev = glue_paired.DevSet(FLAGS.task, FLAGS.glue_dir, PRIMARY[FLAGS.task])
    accuracy = glue_paired.DevSet(FLAGS.task, FLAGS.glue_dir, "accuracy") \
        if PRIMARY[FLAGS.task] != "accuracy" else None
    if not FLAGS.summarise_only:
        run_cells(results, dev, gr, glue_paired, accuracy)
    pool(results, dev, accuracy)
    save(results)
    log(f"results in {path}")


if __name__ == "__main__":
    app.run(main)
