#!/usr/bin/env python3
"""The whole method on real GLUE tasks, with its baselines, as one resumable command.

  .venv/bin/python benchmarks/glue.py --glue_dir=../shared/data/glue \
      --work_dir=runs/glue --tasks=MRPC,RTE,SST-2

Per task, each step a `bin/distill` run of --config (by default the recommended student,
configs/glue_minilm_3l.cfg, whose seed-42 table is --results_dir's default) in its own
folder under --work_dir, so re-running the command resumes where it stopped:

  teacher/<cell>    the embedded MiniLM-L6 fine-tuned, one run per --teacher_grid
                    cell (LR:EPOCHS); the best on dev is the task's teacher
  tinybert          general distillation (run once, in the first task's folder, and
                    shared through --general_model), augmentation, task distillation,
                    quantize, evaluate, export
  finetuned         the same general student fine-tuned on the original training set
                    without a teacher (the paper's "TinyBERT (GD)" baseline)

then writes, under --results_dir, every model's dev and GLUE-test predictions in the
GLUE submission format (`<model>/<Task>.tsv`, `<model>/dev/<Task>.tsv`: `index`,
`prediction`), a TF-IDF + logistic-regression baseline's, and `results.json` with the
metrics, sizes, batch-1 latencies, host and commands. Test labels are never read: the
test predictions are scored outside the project. --train_limit (by default SST-2:8000,
as in every table here) trains on a seeded subset of a task's training set (dev and
test stay whole). --config=configs/glue_minilm.cfg --results_dir=benchmarks/results/glue
is the 2 x 384 student's table; --config=configs/glue_minilm_long.cfg runs its task
stage about five times as long (five intermediate epochs, N_a = 4);
docs/measurements.md gives what each costs and keeps.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # glue_meta, glue_results

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

from absl import app, flags  # noqa: E402
from glue_meta import (  # noqa: E402
    PAPER,
    PRIMARY,
    check_task_folders,
    commit,
    extra_flags,
    glue_tasks,
    host,
    recipe_changes,
    run_distill,
)

FLAGS = flags.FLAGS
flags.DEFINE_string("glue_dir", os.path.join(ROOT, "..", "shared", "data", "glue"),
                    "Folder with SST-2/, MRPC/, RTE/ in the GLUE TSV layout.")
flags.DEFINE_string("work_dir", os.path.join(ROOT, "runs", "glue"), "Where the runs go.")
flags.DEFINE_string("results_dir", os.path.join(ROOT, "benchmarks", "results", "glue",
                                                 "minilm_3l_ffn768", "seed42"),
                    "Where the small result files go (results.json, prediction TSVs): "
                    "one folder per config and seed.")
flags.DEFINE_list("tasks", ["MRPC", "RTE", "SST-2"], "GLUE tasks, in the order to run.")
flags.DEFINE_list("teacher_grid", ["1e-4:3"], "Teacher fine-tuning cells LR:EPOCHS; "
                  "the best dev score is the task's teacher.")
flags.DEFINE_list("train_limit", ["SST-2:8000"], "TASK:N: train on a seeded subset of N "
                  "rows.")
flags.DEFINE_string("config", os.path.join(ROOT, "configs", "glue_minilm_3l.cfg"),
                    "The flagfile every run starts from (the recommended student's; "
                    "configs/glue_minilm.cfg: the 2 x 384 student).")
flags.DEFINE_list("extra", [], "More bin/distill flags for every run (e.g. --seed=1).")
flags.DEFINE_string("general_model", "", "A general model to share with every task; empty: "
                    "the first task runs the general stage and shares its model.")

def log(msg: str) -> None:
    print(f"[glue {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def distill(args: list[str], log_path: str) -> list[str]:
    """One bin/distill run of --config (it resumes when its folder exists); returns its
    command."""
    return run_distill(FLAGS.config, [*args, *[a for a in FLAGS.extra if a]], log_path,
                       "benchmarks/glue.py", log)


def task_data(task: str) -> str:
    """The task's data folder: the GLUE one, or a seeded training subset beside it."""
    src = os.path.join(FLAGS.glue_dir, task)
    limits = dict(item.split(":") for item in FLAGS.train_limit)
    if task not in limits:
        return os.path.abspath(src)
    n = int(limits[task])
    dst = os.path.join(FLAGS.work_dir, "data", f"{task}-train{n}")
    if not os.path.exists(os.path.join(dst, "train.tsv")):
        os.makedirs(dst, exist_ok=True)
        with open(os.path.join(src, "train.tsv")) as f:
            header, *rows = f.readlines()
        rows = random.Random(0).sample(rows, min(n, len(rows)))
        for name in ("dev.tsv", "test.tsv"):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
        with open(os.path.join(dst, "train.tsv.tmp"), "w") as f:
            f.writelines([header, *rows])
        os.replace(os.path.join(dst, "train.tsv.tmp"), os.path.join(dst, "train.tsv"))
    return os.path.abspath(dst)


def done(folder: str, stage: str) -> dict[str, Any]:
    path = os.path.join(folder, stage, "stage_done.json")
    with open(path) as f:
        return json.load(f)


def run_task(task: str, general_model: str) -> dict[str, Any]:
    data = task_data(task)
    base = os.path.join(FLAGS.work_dir, task)
    common = [f"--task={task}", f"--data_dir={data}"]
    commands: dict[str, Any] = {}
    # 1. The teacher: a small grid, the best on dev.
    grid = {}
    for cell in FLAGS.teacher_grid:
        lr, epochs = cell.split(":")
        out = os.path.join(base, "teacher", f"lr{lr}_ep{epochs}")
        commands[f"teacher {cell}"] = distill(
            [*common, "--stages=finetune_teacher", f"--teacher_lr={lr}",
             f"--teacher_epochs={epochs}", f"--output_dir={out}"], os.path.join(out, "log.txt"))
        grid[cell] = {"dir": out, "dev": done(out, "finetune_teacher")["dev"]}
    best = max(grid, key=lambda c: grid[c]["dev"][PRIMARY[task]])
    teacher = os.path.join(grid[best]["dir"], "finetune_teacher", "model")
    log(f"{task}: teacher cell {best} (dev {grid[best]['dev']})")
    # 2. The method: general (or the shared general model), augment, task, quantize,
    # evaluate, export.
    main_dir = os.path.join(base, "tinybert")
    general = [f"--general_model={general_model}"] if general_model else []
    commands["tinybert"] = distill([*common, f"--task_teacher={teacher}", *general,
                                    f"--output_dir={main_dir}"],
                                   os.path.join(main_dir, "log.txt"))
    general_model = general_model or os.path.join(main_dir, "general", "model")
    # 3. The same student fine-tuned without a teacher, from the same general model.
    ft_dir = os.path.join(base, "finetuned")
    commands["finetuned"] = distill(
        [*common, f"--task_teacher={teacher}", f"--general_model={general_model}",
         "--stages=task,evaluate", "--task_phases=finetune", "--nouse_augmented",
         "--noquantize", "--noglue_test_predictions", f"--output_dir={ft_dir}"],
        os.path.join(ft_dir, "log.txt"))
    return {"data_dir": data, "teacher_grid": grid, "teacher_cell": best,
            "teacher": teacher, "main_dir": main_dir, "finetuned_dir": ft_dir,
            "general_model": general_model, "commands": commands}


def recipe() -> tuple[str, list[str]]:
    """(--config relative to the repository, the --extra flags it does not already set):
    what makes one table's runs, recorded in its results.json. `--extra=--seed=42` with a
    config of seed 42 is the config's own table."""
    return os.path.relpath(FLAGS.config, ROOT), extra_flags(FLAGS.config, FLAGS.extra)


def check_same_table(results: dict[str, Any], results_path: str, config: str,
                     extra: list[str]) -> None:
    """Stop when `results_path` holds a table of another recipe than (`config`, `extra`),
    as `recipe()` gives them: one results.json is one recipe (more tasks, or a task
    again), never a mix of two."""
    old_config, old_extra = results.get("config"), results.get("extra")
    if old_config is None or not recipe_changes(results, {"config": config, "extra": extra}):
        return
    raise SystemExit(
        f"benchmarks/glue.py: --results_dir: {results_path} holds a table of "
        f"--config={old_config}" + (f" --extra={','.join(old_extra)}" if old_extra else "")
        + f", and this run has --config={config}"
        + (f" --extra={','.join(extra)}" if extra else "")
        + ": its tasks would mix two recipes in one table. Give another --results_dir "
        "(e.g. benchmarks/results/glue/<student>/seed<N>).")


def main(argv: list[str]) -> None:
    del argv
    results_path = os.path.join(FLAGS.results_dir, "results.json")
    results: dict[str, Any] = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = json.load(f)
    config, extra = recipe()
    check_same_table(results, results_path, config, extra)  # before TensorFlow starts
    tasks = glue_tasks(FLAGS.tasks, "benchmarks/glue.py", "--tasks")
    check_task_folders(tasks, FLAGS.glue_dir, "benchmarks/glue.py")
    import glue_paired
    import glue_results  # TensorFlow starts here, after the flags are parsed

    os.makedirs(FLAGS.work_dir, exist_ok=True)
    results.update({"host": host(), "commit": commit(), "config": config, "extra": extra,
                    "command": " ".join(sys.argv), "paper_table1": PAPER})
    results.setdefault("tasks", {})
    general_model = FLAGS.general_model
    for task in tasks:
        started = time.time()
        run = run_task(task, general_model)
        general_model = run["general_model"]
        entry = glue_results.collect(task, run, FLAGS.results_dir, PRIMARY[task],
                                     PAPER[task])
        entry["paired"] = glue_paired.task_pairs(task, entry, FLAGS.glue_dir, FLAGS.results_dir)
        entry["wall_seconds_this_invocation"] = round(time.time() - started)
        entry["commit"] = commit()
        results["tasks"][task] = entry
        glue_paired.write_table(FLAGS.results_dir, results)
        log(f"{task}: results in {results_path}")


if __name__ == "__main__":
    app.run(main)
