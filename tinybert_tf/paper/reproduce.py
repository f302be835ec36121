"""`bin/reproduce --table=N --output_dir=DIR`: every cell of one of the paper's tables.

It owns no training code: each cell is `bin/distill` (`main.run`) with the
cell's flagfile (configs/paper/), the paper's per-task settings, the command
line's own flags (task data, models, sizes: they come last, so they win), and
`--task`. What cells share runs once, in DIR/shared/:

  general distillation   one run per distinct general-stage setting (the flags
                         of `PipelineConfig.stage_settings("general")`), shared
                         across tasks and cells;
  teacher fine-tuning    one per task and teacher setting;
  augmentation           one per task and augmentation setting.

A cell then runs its task stage, its quantize stage when its flags make an int8
student (the default; --noquantize skips it), and evaluate in DIR/<task>/<cell>/ with
`--general_model`, `--task_teacher` and `--augmented_file` pointing at the
shared outputs.

Where a cell's student starts: a cell that needs a pre-trained model it cannot make
(Table 1's BERT-Small: `Cell.model_flag`, --bert_small_model) gets it as its
--general_model and refuses to run without it. A --general_model on the command line
is a General TinyBERT: it starts only the cells that start from one (the tinybert
recipe, not --student_init=random), and is refused where its shape is not the cell's
--student_config; the other cells (BERT-Tiny, PD, PKD, DistilBERT) make their student
with their own recipe's general stage. A shared run records the command it was made with
(`reproduce.json`) and is re-run with that command, so re-running
`bin/reproduce` resumes every run where it stopped, as `bin/distill` does, and
skips what is done. `--dry_run` prints the plan of every shared run and of every
cell (each cell planned as a whole pipeline in its own folder) as one JSON
object and trains nothing.

Results: DIR/table<N>.json, DIR/table<N>.md and DIR/table<N>.png, each cell's
dev score beside the paper's published number (`paper_tables`), and the share
of the teacher's score each retains (ours of our teacher, the paper's of its).
With --seeds=42,1,2 each seed is such a run in DIR/seed-N/ (--seed=N), and
DIR/table<N>.* hold the table over the seeds: mean, spread and each row's
paired difference to the first (`seed_tables`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import posixpath
import sys
from typing import Any, Optional, Sequence

from absl import flags

from tinybert_tf import files
from tinybert_tf.cli import tool as cli
from tinybert_tf.cli.flagfiles import expand_flagfiles
from tinybert_tf.cli.interrupts import ctrl_c_always_stops
from tinybert_tf.config import get_config
from tinybert_tf.data import glue
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.models.checkpoint import inside_model_dir_error, inspect_model
from tinybert_tf.paper import seed_tables, table_files
from tinybert_tf.paper import tables as paper_tables
from tinybert_tf.paper.tables import Cell, Column, PaperTable
from tinybert_tf.pipeline import flags as tb_flags
from tinybert_tf.pipeline import main as distill_main
from tinybert_tf.pipeline import preflight
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages import get_stage, stage_names
from tinybert_tf.tasks.catalog import task_names

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs", "paper")
# The tables read the report.json this stage writes; cells run no stage after it.
TABLES_READ = "evaluate"
# Flags of bin/distill that bin/reproduce sets per run: given on its command line,
# they are an error naming what to use instead.
_REFUSED = {"task": "--tasks=NAME,... (bin/reproduce sets --task per run)",
            "stages": "nothing (bin/reproduce runs the stages each cell needs)",
            "overwrite": "deleting the cell's folder (DIR/<task>/<cell>) or DIR/shared/..."}
_OWN = set(tb_flags.REPRODUCE_FLAGS) | {"output_dir", "dry_run"}
# --general_model goes only to the cells that start from a General TinyBERT (`start_flags`).
_PER_CELL = {"general_model"}
USAGE = """Run the cells of one of the TinyBERT paper's tables, each a bin/distill run
(tinybert_tf/paper/reproduce.py; docs/pipeline.md):

  bin/reproduce --table=2 --output_dir=runs/table2 --glue_dir=glue_data --teacher=DIR \\
      [--general_model=DIR --task_teacher=DIR ...] [--dry_run]

Exit codes: 0 done; 2 a bad command or a failed run's error (one line); 75 a run
stopped by SIGTERM (re-run to resume); 130 interrupted."""
_PASSED_ON = ("Every flag of bin/distill (teachers, data, sizes, ...) is passed on to each "
              "run, after the cell's flagfile: --helpfull lists them.")


class ReproduceError(ValueError):
    """A bad bin/reproduce command; the message names the flag and the fix."""


@dataclasses.dataclass
class Options:
    table: PaperTable
    output_dir: str
    tasks: tuple[str, ...]
    cells: tuple[Cell, ...]
    dry_run: bool
    glue_dir: str
    squad_dir: str
    config_dir: str
    passthrough: list[str]
    seeds: tuple[int, ...] = ()
    general_model: str = ""  # the command line's: a General TinyBERT (`start_flags`)
    cell_models: dict[str, str] = dataclasses.field(default_factory=dict)  # Cell.model_flag


def shared_stages() -> tuple[str, ...]:
    """The stages a cell can be handed by flag (`Stage.handover`), in run order: each
    runs once per distinct setting and its output goes to every cell that reads it."""
    return tuple(s for s in stage_names() if get_stage(s).handover is not None)


def cell_stages() -> tuple[str, ...]:
    """The stages a cell runs in its own folder: the others, up to TABLES_READ."""
    names = stage_names()
    return tuple(s for s in names[:names.index(TABLES_READ) + 1]
                 if get_stage(s).handover is None)


def _folder_name(stage: str, config: PipelineConfig) -> str:
    """A shared run's folder name before its key (`Stage.handover_name`)."""
    named = get_stage(stage).handover_name
    return named(config) if named is not None else stage


@dataclasses.dataclass
class SharedRun:
    """A stage several cells read, run once: its folder, command, and `output`, what
    the cells receive (`Stage.handover`: the model directory, or the augmented file)."""

    stage: str
    task: str
    key: str
    directory: str
    argv: list[str]
    output: str
    cells: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CellRun:
    cell: Cell
    task: str
    directory: str
    argv: list[str]  # the cell alone (every stage in its folder)
    shared: dict[str, SharedRun] = dataclasses.field(default_factory=dict)
    # The stages the cell runs in its own folder (`cell_stages`): task, then quantize
    # where the cell's flags make an int8 student (evaluate reads it), then evaluate.
    stages: tuple[str, ...] = dataclasses.field(default_factory=cell_stages)

    @property
    def general_model(self) -> Optional[str]:
        """The model given to the cell (`start_flags`), or None (a shared general run's,
        or a random student)."""
        given = [a.split("=", 1)[1] for a in self.argv if a.startswith("--general_model=")]
        return given[-1] if given else None

    def run_argv(self) -> list[str]:
        """The cell's command with the shared outputs and its own stages."""
        extra = [f"--output_dir={self.directory}", f"--stages={','.join(self.stages)}"]
        extra += [f"--{get_stage(stage).handover_flag}={run.output}"
                  for stage, run in self.shared.items()]
        return self.argv + extra


# --- the command line -----------------------------------------------------------------

def parse(argv: Sequence[str], config_dir: str = CONFIG_DIR) -> Options:
    """bin/reproduce's argv -> Options; bin/distill's flags pass through to every run."""
    fv = tb_flags.reproduce_flags()
    try:
        rest = fv(expand_flagfiles(argv))
    except flags.Error as e:
        raise ReproduceError(str(e).removeprefix("ERROR:: ")) from None
    if len(rest) > 1:
        raise ReproduceError(f"unexpected arguments: {' '.join(rest[1:])}; use --flag=value.")
    for name, instead in _REFUSED.items():
        if fv[name].present:
            raise ReproduceError(f"--{name}: not a bin/reproduce flag; use {instead}.")
    if not fv.output_dir:
        raise ReproduceError("--output_dir is required: the folder of every run and table.")
    inside = inside_model_dir_error(fv.output_dir, "--output_dir")
    if inside:  # named here, not as a cell's folder under it
        raise ReproduceError(inside)
    table = _checked(lambda: paper_tables.get_table(fv.table))
    for name, default in (("tasks", "the table's tasks"), ("cells", "every cell"),
                          ("seeds", "one run with --seed")):
        if fv[name].present and not [v for v in fv[name].value if str(v).strip()]:
            # an empty shell variable, say: the default would run hours of other work
            raise ReproduceError(f"--{name}=: none given; name at least one, or drop the "
                                 f"flag for {default}.")
    cells = [c for c in table.cells if not c.is_teacher]
    if fv.cells:
        names = {c.name for c in table.cells}
        unknown = [n for n in fv.cells if n not in names]
        if unknown:
            raise ReproduceError(f"--cells: Table {table.number} has no cell "
                                 f"{', '.join(unknown)}; its cells are "
                                 f"{', '.join(c.name for c in table.cells)}.")
        cells = [c for c in cells if c.name in fv.cells]
    tasks = tuple(t.strip().lower() for t in fv.tasks if t.strip()) or table.tasks
    twice = cli.repeated(tasks)
    if twice:  # each would run, and be a row of the table, twice
        raise ReproduceError(f"--tasks={','.join(fv.tasks)}: {', '.join(twice)} is given "
                             "twice; name each task once.")
    distill_main.load_plugins(fv.plugins)  # the tasks they register are --tasks too
    unknown = [t for t in tasks if t not in task_names()]
    if unknown:
        raise ReproduceError(f"--tasks={','.join(fv.tasks)}: unknown task(s) "
                             f"{', '.join(unknown)}; use any of {', '.join(task_names())} "
                             "(case-insensitive).")
    passthrough = [fv[name].serialize() for name in tb_flags.distill_flags()
                   if fv[name].present and name not in _OWN | _PER_CELL]
    seeds = _seeds(fv)
    _refuse_others_table_files(fv.output_dir, table.number, seeds)
    missing = [c.flagfile for c in cells if not os.path.isfile(os.path.join(config_dir,
                                                                            c.flagfile))]
    if missing:
        raise ReproduceError(f"{config_dir}: no flagfile {', '.join(missing)} for Table "
                             f"{table.number}; choose other --cells.")
    for c in cells:
        if c.model_flag and not fv[c.model_flag].value:
            others = ",".join(o.name for o in cells if o is not c)
            raise ReproduceError(
                f"--{c.model_flag} is required for the {c.label} cell of Table "
                f"{table.number} ({c.flagfile}): give the pre-trained model it starts from "
                "(a model directory: config.json, vocab.txt, weights; --general_model is a "
                "General TinyBERT, not this model)"
                + (f", or leave the cell out: --cells={others}." if others else "."))
    general_model = fv.general_model if fv["general_model"].present else ""
    cell_models = {c.model_flag: fv[c.model_flag].value for c in cells if c.model_flag}
    return Options(table, fv.output_dir, tasks, tuple(cells), bool(fv.dry_run), fv.glue_dir,
                   fv.squad_dir, config_dir, passthrough, seeds, general_model, cell_models)


def _refuse_others_table_files(output_dir: str, number: int, seeds: Sequence[int]) -> None:
    """Refuse, before any run, a DIR/table<N>.* (and with --seeds, DIR/seed-N/table<N>.*)
    that the table would replace but bin/reproduce did not write."""
    for folder in (output_dir, *(posixpath.join(output_dir, f"seed-{s}") for s in seeds)):
        other = table_files.not_ours(folder, number)
        if other:
            raise ReproduceError(f"--output_dir={output_dir}: {other} is not a table "
                                 "bin/reproduce wrote, and this run would replace it; move "
                                 "it, or choose another --output_dir.")


def _seeds(fv: flags.FlagValues) -> tuple[int, ...]:
    """--seeds as distinct integers. Each replaces --seed (a flagfile's too, such as
    configs/wiki_pairs_sizes.cfg's) in its runs."""
    if not fv.seeds:
        return ()
    try:
        seeds = tuple(int(s) for s in fv.seeds)
    except ValueError:
        raise ReproduceError(f"--seeds={','.join(fv.seeds)}: give integers, e.g. "
                             "--seeds=42,1,2.") from None
    if cli.repeated(seeds):
        raise ReproduceError(f"--seeds={','.join(fv.seeds)}: a seed is given twice.")
    bad = [s for s in seeds if not 0 <= s < 2**32]
    if bad:
        raise ReproduceError(f"--seeds={','.join(fv.seeds)}: {', '.join(map(str, bad))} is "
                             "out of range; each seed is in [0, 2**32 - 1] (NumPy's seed "
                             "range), e.g. --seeds=42,1,2.")
    return seeds


def seed_options(opts: Options, seed: int) -> Options:
    """One seed's run of the table: its own folder DIR/seed-N and --seed=N last."""
    return dataclasses.replace(opts, output_dir=posixpath.join(opts.output_dir,
                                                               f"seed-{seed}"),
                               passthrough=[*opts.passthrough, f"--seed={seed}"], seeds=())


def _checked(fn):
    try:
        return fn()
    except ValueError as e:
        raise ReproduceError(str(e)) from None


def data_flags(task: str, opts: Options) -> list[str]:
    """--data_dir / --train_file / --validation_file of `task` from --glue_dir / --squad_dir."""
    if task in paper_tables.GLUE_FOLDERS and opts.glue_dir:
        return [f"--data_dir={posixpath.join(opts.glue_dir, paper_tables.GLUE_FOLDERS[task])}"]
    if task in paper_tables.SQUAD_FILES and opts.squad_dir:
        train, dev = paper_tables.SQUAD_FILES[task]
        return [f"--train_file={posixpath.join(opts.squad_dir, train)}",
                f"--validation_file={posixpath.join(opts.squad_dir, dev)}"]
    return []


def check_data(opts: Options) -> None:
    """Each GLUE and SQuAD task of the table has its data: --glue_dir / --squad_dir with
    the task's folder and files, or bin/distill's own data flags given (--data_dir,
    --train_file). ReproduceError naming the flag and what is missing."""
    given = {a.split("=", 1)[0] for a in opts.passthrough}
    glue_tasks = [t for t in opts.tasks if t in paper_tables.GLUE_FOLDERS]
    if glue_tasks and "--data_dir" not in given:
        folders = [paper_tables.GLUE_FOLDERS[t] for t in glue_tasks]
        if not opts.glue_dir:
            raise ReproduceError(
                f"--glue_dir is required for {', '.join(glue_tasks)}: give the folder of the "
                f"GLUE download holding {', '.join(f + '/' for f in folders)} (train.tsv and "
                "the dev files each), or choose other --tasks.")
        missing = []
        for task, folder in zip(glue_tasks, folders):
            spec = glue.get_task(task)
            where = posixpath.join(opts.glue_dir, folder)
            if not files.isdir(where):
                missing.append(f"{where}/")
                continue
            missing += [posixpath.join(where, spec.layout(split).file)
                        for split in ("train", *spec.dev_splits)
                        if not files.isfile(posixpath.join(where, spec.layout(split).file))]
        if missing:
            raise ReproduceError(f"--glue_dir={opts.glue_dir}: no {', '.join(missing)}; point "
                                 "it at the GLUE download (one folder per task), or choose "
                                 "other --tasks.")
    squad_tasks = [t for t in opts.tasks if t in paper_tables.SQUAD_FILES]
    if squad_tasks and "--train_file" not in given:
        if not opts.squad_dir:
            names = [f for t in squad_tasks for f in paper_tables.SQUAD_FILES[t]]
            raise ReproduceError(f"--squad_dir is required for {', '.join(squad_tasks)}: give "
                                 f"the folder holding {', '.join(names)}, or choose other "
                                 "--tasks.")
        missing = [posixpath.join(opts.squad_dir, f) for t in squad_tasks
                   for f in paper_tables.SQUAD_FILES[t]
                   if not files.isfile(posixpath.join(opts.squad_dir, f))]
        if missing:
            raise ReproduceError(f"--squad_dir={opts.squad_dir}: no {', '.join(missing)}; "
                                 "download SQuAD's train and dev files into it, or choose "
                                 "other --tasks.")


def cell_argv(cell: Cell, task: str, opts: Options) -> list[str]:
    """bin/distill's argv of `cell` on `task` (no output folder, no stages), with the
    model its student starts from (`start_flags`)."""
    argv = ["bin/distill", f"--flagfile={os.path.join(opts.config_dir, cell.flagfile)}",
            *paper_tables.TASK_FLAGS.get(task, ()), *data_flags(task, opts),
            *opts.passthrough, f"--task={task}"]
    return argv + start_flags(cell, argv, opts)


def start_flags(cell: Cell, argv: list[str], opts: Options) -> list[str]:
    """The --general_model of `cell`'s run (argv: its command without one): its own
    pre-trained model (`Cell.model_flag`); else the command line's General TinyBERT when
    the cell starts from one (the tinybert recipe, not a random student) of that
    model's shape; else none (its recipe's general stage makes its student)."""
    if cell.model_flag:
        return [f"--general_model={opts.cell_models[cell.model_flag]}"]
    if not opts.general_model:
        return []
    config = _checked(lambda: distill_main.parse_argv(argv + [
        f"--output_dir={opts.output_dir}"]))
    if config.general.recipe != "tinybert" or config.models.random_student:
        return []
    _check_general_shape(cell, config, opts)
    return [f"--general_model={opts.general_model}"]


def _check_general_shape(cell: Cell, config: PipelineConfig, opts: Options) -> None:
    """ReproduceError when the given General TinyBERT is not the cell's student shape (a
    TinyBERT4 would run as the TinyBERT6 cell); a model or config that cannot be read is
    left to the run's own checks, which name the flag."""
    if opts.general_model.lower() == "none":
        return
    try:
        given = inspect_model(opts.general_model).config
        student = get_config(config.models.student_config)
    except (*distill_main.USER_ERRORS, OSError):
        return
    shape = (given.num_layers, given.hidden_size)
    if shape != (student.num_layers, student.hidden_size):
        raise ReproduceError(
            f"--general_model={opts.general_model} is {shape[0]} x {shape[1]}, but the "
            f"{cell.label} cell of Table {opts.table.number} starts from a General TinyBERT "
            f"of its --student_config={config.models.student_config} ({student.num_layers} "
            f"x {student.hidden_size}); run that cell on its own (--cells={cell.name}) with "
            "its General TinyBERT, or leave --general_model out to distil one.")


# --- the plan -------------------------------------------------------------------------

def _key(settings: dict[str, Any]) -> str:
    blob = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def plan(opts: Options) -> tuple[list[SharedRun], list[CellRun]]:
    """Every cell's run and the shared runs they read, in the order they run."""
    check_data(opts)
    shared: dict[tuple[str, str, str], SharedRun] = {}
    cells: list[CellRun] = []
    order, own = shared_stages(), cell_stages()
    for task in opts.tasks:
        for cell in opts.cells:
            argv = cell_argv(cell, task, opts)
            directory = posixpath.join(opts.output_dir, task, cell.name)
            config = _checked(lambda: distill_main.parse_argv(
                argv + [f"--output_dir={directory}"]))
            stages = _checked(lambda: preflight.resolve_stages(["all"], config))
            run = CellRun(cell, task, directory, argv,
                          stages=tuple(s for s in stages if s in own))
            for stage in order:
                if stage not in stages:
                    continue
                key = _key(config.stage_settings(stage))
                # shared/general/<recipe>-KEY, shared/<task>/teacher-KEY, .../augment-KEY
                per_task = get_stage(stage).per_task
                scope = task if per_task else stage
                ident = (stage, task if per_task else "", key)
                if ident not in shared:
                    folder = posixpath.join(opts.output_dir, "shared", scope,
                                            f"{_folder_name(stage, config)}-{key}")
                    shared[ident] = SharedRun(stage, task, key, folder, list(argv),
                                              get_stage(stage).handover(folder, config))
                shared[ident].cells.append(f"{task}/{cell.name}")
                run.shared[stage] = shared[ident]
            cells.append(run)
    runs = sorted(shared.values(), key=lambda r: order.index(r.stage))
    return runs, cells


def shared_argv(run: SharedRun) -> list[str]:
    """The shared run's command: as recorded when it was first made (resume), else the
    command of the first cell that needs it, with its folder and its one stage."""
    recorded = read_json(posixpath.join(run.directory, "reproduce.json"), default=None)
    if isinstance(recorded, dict) and isinstance(recorded.get("argv"), list):
        return [str(a) for a in recorded["argv"]]
    return run.argv + [f"--output_dir={run.directory}", f"--stages={run.stage}"]


# --- running --------------------------------------------------------------------------

def _distill(argv: list[str], what: str) -> dict[str, Any]:
    print(f"== reproduce: {what}", flush=True)
    # Not run_argv: a cell's command holds the user's flags for every cell, and each
    # cell reads its share of them, so the unread-flag warnings would be noise.
    return distill_main.run(distill_main.parse_argv(argv))


def _quiet_plan(argv: list[str]) -> dict[str, Any]:
    """A --dry_run plan with its printing kept off stdout (ours prints one JSON)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return distill_main.run(distill_main.parse_argv(argv + ["--dry_run"]))


def dry_run_plan(opts: Options) -> dict[str, Any]:
    """Every shared run's and every cell's plan, as one JSON-able object."""
    shared, cells = plan(opts)
    return {"table": opts.table.number, "title": opts.table.title,
            "source": opts.table.source, "tasks": list(opts.tasks),
            "shared": [{"stage": r.stage, "folder": r.directory, "cells": r.cells,
                        "plan": _quiet_plan(shared_argv(r))} for r in shared],
            "cells": [{"cell": c.cell.name, "task": c.task, "folder": c.directory,
                       "flagfile": c.cell.flagfile, "general_model": c.general_model,
                       "shares": {s: r.directory for s, r in c.shared.items()},
                       "plan": _quiet_plan(c.argv + [f"--output_dir={c.directory}"])}
                      for c in cells]}


def run(opts: Options) -> dict[str, Any]:
    """Plan, run (or with --dry_run, print the plans) and write the table; with --seeds,
    once per seed and then the table over the seeds."""
    if opts.seeds:
        return run_seeds(opts)
    if opts.dry_run:
        out = dry_run_plan(opts)
        print(json.dumps(out, indent=1, default=str), flush=True)
        return out
    shared, cells = plan(opts)
    if opts.general_model:
        own = sorted({c.cell.label for c in cells if c.general_model is None})
        if own:
            print(f"== reproduce: --general_model={opts.general_model} starts the cells that "
                  f"start from a General TinyBERT; {', '.join(own)} make their own student.",
                  flush=True)
    for r in shared:
        argv = shared_argv(r)
        files.makedirs(r.directory)
        write_json_atomic(posixpath.join(r.directory, "reproduce.json"),
                          {"argv": argv, "stage": r.stage, "cells": r.cells})
        _distill(argv, f"shared {r.stage} ({r.directory}) for {', '.join(r.cells)}")
    for c in cells:
        _distill(c.run_argv(), f"Table {opts.table.number} {c.cell.name} on {c.task}")
    return write_results(opts, cells)


def run_seeds(opts: Options) -> dict[str, Any]:
    """The table once per seed, in DIR/seed-N/ (each resumable as a single run), then
    DIR/table<N>.* over the seeds (`seed_tables`)."""
    runs = [(seed, seed_options(opts, seed)) for seed in opts.seeds]
    if opts.dry_run:
        out = {"table": opts.table.number, "seeds": {
            str(seed): dry_run_plan(one) for seed, one in runs}}
        print(json.dumps(out, indent=1, default=str), flush=True)
        return out
    tables = {}
    for seed, one in runs:
        print(f"== reproduce: Table {opts.table.number}, seed {seed} ({one.output_dir})",
              flush=True)
        tables[seed] = run(one)
    return seed_tables.write(tables, opts.output_dir)


# --- results --------------------------------------------------------------------------

def _columns(opts: Options) -> list[Column]:
    """The table's columns of the chosen tasks, and a column for any other task (its
    primary metric; the paper has no number for it)."""
    cols = [c for c in opts.table.columns if c.task in opts.tasks]
    known = {c.task for c in cols}
    for task in opts.tasks:
        if task not in known:
            cols.append(Column(task, task, "", 100.0))
    return cols


def _score(report: Optional[dict], who: str, col: Column) -> Optional[float]:
    if not report:
        return None
    dev = report.get(who, {}).get("dev", {})
    key = col.metric or _primary_key(report)
    value = dev.get(key)
    return None if value is None else round(float(value) * col.scale, 2)


def _primary_key(report: dict) -> str:
    return str(report.get("primary_metric", ""))


def _retained(score: Optional[float], teacher: Optional[float]) -> Optional[float]:
    return round(score / teacher, 4) if score is not None and teacher else None


def _mean(values: list[Optional[float]]) -> Optional[float]:
    if not values or any(v is None for v in values):
        return None
    return round(sum(values) / len(values), 2)


def _paper_average(published: dict[str, Optional[float]], cols: list[Column],
                   table: PaperTable) -> Optional[float]:
    """The paper's "Avg" when every column of its table is shown, else the mean of the
    shown columns (None when one is blank)."""
    if not published:
        return None
    if [c.header for c in cols] == [c.header for c in table.columns] and "Avg" in published:
        return published["Avg"]
    return _mean([published.get(c.header) for c in cols])


def write_results(opts: Options, cells: list[CellRun]) -> dict[str, Any]:
    """DIR/table<N>.json / .md / .png from every cell's report.json."""
    cols = _columns(opts)
    reports = {(c.task, c.cell.name): read_json(posixpath.join(c.directory, "report.json"),
                                                default=None) for c in cells}
    teacher_cell = next((c for c in opts.table.cells if c.is_teacher), None)
    ours_teacher = {}
    for col in cols:
        found = [_score(r, "teacher", col) for (task, _), r in reports.items()
                 if task == col.task and r]
        ours_teacher[col.header] = found[0] if found else None
    paper_teacher = dict(teacher_cell.published) if teacher_cell else {}
    rows = []
    for cell in ([teacher_cell] if teacher_cell else []) + list(opts.cells):
        entries = {}
        for col in cols:
            if cell.is_teacher:
                ours = ours_teacher[col.header]
            else:
                ours = _score(reports.get((col.task, cell.name)), "student", col)
            paper = cell.published.get(col.header)
            entries[col.header] = {
                "ours": ours, "paper": paper,
                "ours_retained": _retained(ours, ours_teacher[col.header]),
                "paper_retained": _retained(paper, paper_teacher.get(col.header))}
        ours_avg = _mean([e["ours"] for e in entries.values()])
        paper_avg = _paper_average(cell.published, cols, opts.table)
        teacher_avg = _mean(list(ours_teacher.values()))
        paper_teacher_avg = _paper_average(paper_teacher, cols, opts.table)
        rows.append({"cell": cell.name, "label": cell.label, "flagfile": cell.flagfile,
                     "note": cell.note, "scores": entries,
                     "average": {"ours": ours_avg, "paper": paper_avg,
                                 "ours_retained": _retained(ours_avg, teacher_avg),
                                 "paper_retained": _retained(paper_avg, paper_teacher_avg)}})
    data = {"table": opts.table.number, "title": opts.table.title,
            "paper_split": opts.table.split, "our_split": "dev",
            "source": opts.table.source, "note": opts.table.note,
            "columns": [dataclasses.asdict(c) for c in cols], "rows": rows,
            "runs": {f"{c.task}/{c.cell.name}": c.directory for c in cells}}
    return table_files.write(data, opts.output_dir, markdown, plot)


def _fmt(value: Optional[float], percent: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.1f}%" if percent else f"{value:.1f}"


def markdown(data: dict[str, Any]) -> str:
    """The table as Markdown: per column "ours / paper", then the averages and the
    share of the teacher's average each retains."""
    headers = [c["header"] for c in data["columns"]]
    lines = [f"# Table {data['table']}: {data['title']}", "",
             f"Ours: dev set; paper: {data['paper_split']} ({data['source']}). "
             "Each cell: ours / paper. Retained: the cell's average over the teacher's "
             "(ours of our teacher, the paper's of its BERT-base).", "",
             "| cell | " + " | ".join(headers) + " | average | retained (ours) | "
             "retained (paper) |",
             "|---" * (len(headers) + 4) + "|"]
    for row in data["rows"]:
        cells = [f"{_fmt(row['scores'][h]['ours'])} / {_fmt(row['scores'][h]['paper'])}"
                 for h in headers]
        avg = row["average"]
        lines.append(f"| {row['label']} | " + " | ".join(cells) +
                     f" | {_fmt(avg['ours'])} / {_fmt(avg['paper'])} | "
                     f"{_fmt(avg['ours_retained'], True)} | "
                     f"{_fmt(avg['paper_retained'], True)} |")
    lines += table_files.note_lines(data)
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: str) -> str:
    """Grouped bars per cell: our average (the share of our teacher's it retains above
    it) beside the paper's (PNG, written whole)."""
    rows = data["rows"]
    return table_files.bar_chart(data, [r["average"]["ours"] or 0.0 for r in rows],
                                 [r["average"]["paper"] or 0.0 for r in rows],
                                 "ours (dev)", path,
                                 shares=[r["average"]["ours_retained"] for r in rows])


# --- the command ----------------------------------------------------------------------

def help_text(kind: str) -> str:
    """--help: the usage and bin/reproduce's own flags; --helpfull: every flag, bin/distill's
    (passed on to each run) included."""
    fv = tb_flags.reproduce_flags()
    if kind == "full":
        return cli.help_text(fv, USAGE, "full")
    own = flags.FlagValues()
    for name in (*tb_flags.REPRODUCE_FLAGS, "output_dir", "dry_run"):
        own[name] = fv[name]
    return (f"{USAGE.strip()}\n\nflags:\n{own.get_help(include_special_flags=False)}\n\n"
            f"{_PASSED_ON}\n")


def main(argv: Sequence[str]) -> int:
    """bin/reproduce: --help / --helpfull, or the run. 0 done; 2 a bad command or a failed
    run's error (one line); 75 a cell's run stopped by SIGTERM (re-run to resume); as
    bin/distill otherwise (main.py)."""
    kind = cli.help_request(argv)
    if kind is not None:
        sys.stdout.write(help_text(kind))
        return cli.EXIT_OK
    try:
        with ctrl_c_always_stops():
            run(parse(argv))
    except ReproduceError as e:
        print(f"reproduce: error: {e}", file=sys.stderr, flush=True)
        return 2
    except distill_main.USER_ERRORS as e:
        print(f"reproduce: error: {str(e).rstrip()}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("reproduce: interrupted; re-run the same command to resume.", file=sys.stderr,
              flush=True)
        return 130
    except Exception as e:
        # A cell's run that knows its exit status (a SIGTERM'd phase: 75, checkpoint
        # saved) ends bin/reproduce as it ends bin/distill: its one-line message.
        code = cli.exit_code_of(e)
        if code is None:
            raise
        print(f"reproduce: {str(e).rstrip()}", file=sys.stderr, flush=True)
        return code
    return 0


def entry_point() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv))
