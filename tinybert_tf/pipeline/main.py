"""`bin/distill`: parse flags into typed configs, check everything, run the stages in order.

`run_argv(argv)` is the whole tool in-process (tests and notebooks call it; the
`bin/distill` script calls it with sys.argv). Re-running the same command
resumes: finished stages are skipped, an interrupted one continues from its
latest checkpoint, and a stage made with other settings (or from an output
redone since) runs again.

Once every check has passed the run locks `--output_dir` (the chief alone under
multi_worker: the workers share its folder), removes what killed writers left,
records its config and runs the stages; the lock is released at the end.

Exit codes of `main` (bin/distill) are every tool's (`tinybert_tf.cli.tool`):
0 done; 2 an error of the command or its environment (flag, file, data, a
folder in use, full disk, read-only folder, a plugin's code), printed as one
message naming the flag or file and the fix; 1 an internal error (a bug: one
line, the traceback saved to a file it names); 130 interrupted (Ctrl-C); an
exception with an int `exit_code` attribute ends with that code and its message
(75: preempted). A re-run of the same command resumes after any of them.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from typing import Any, Optional, Sequence

import keras
from absl import flags

from tinybert_tf import plugins
from tinybert_tf.cli import tool as cli
from tinybert_tf.cli.flagfiles import command_line_names, expand_flagfiles
from tinybert_tf.cli.tool import UsageError, environment_message  # noqa: F401
from tinybert_tf.config import ConfigError
from tinybert_tf.data.examples import DataError
from tinybert_tf.models.checkpoint import CheckpointError
from tinybert_tf.pipeline import autosize, preflight, stage_io
from tinybert_tf.pipeline import flags as tb_flags
from tinybert_tf.pipeline.preflight.unread import unread_flag_warnings
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.lock import FileLock, LockError, read_holder
from tinybert_tf.pipeline.run.state import LOCK_FILE, OutputDirError, RunState
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages import (
    get_stage,
    output_entries,
    settings_of,
    stage_names,
    stage_seed,
)
from tinybert_tf.pipeline.summary import artefacts_table
from tinybert_tf.pipeline.training.strategy import make_strategy
from tinybert_tf.tasks.catalog import resolve_task

log = logging.getLogger("tinybert_tf")

# Errors that reach the user as one line naming the flag or file (exit code 2).
USER_ERRORS = (ValueError, FileNotFoundError, ConfigError, DataError, CheckpointError)

USAGE = """Distil a BERT teacher into a small student, stage by stage (docs/pipeline.md).

  bin/distill --flagfile=configs/demo.cfg [--flag=value ...]
  bin/distill --flagfile=configs/td_sst2.cfg --dry_run      # check and print the plan

Exit codes: 0 done; 2 an error of the command or its environment (one line naming
the flag or file and the fix); 1 an internal error; 75 preempted (re-run to resume);
130 interrupted."""


def parse_argv(argv: Sequence[str]) -> PipelineConfig:
    """argv (argv[0] = program name, --flagfile allowed) -> the typed configs."""
    return parse_command(argv)[0]


def parse_command(argv: Sequence[str]) -> tuple[PipelineConfig, list[str]]:
    """argv -> the typed configs, and a warning for each flag typed in argv (not in a
    flagfile) that the run reads nowhere: only skipped stages, unlisted phases or
    another recipe read it, or its `when=` flag has another value
    (preflight/unread.py). Preflight lists the warnings with its own."""
    fv = tb_flags.distill_flags()
    try:
        rest = fv(expand_flagfiles(argv))
    except flags.UnrecognizedFlagError as e:
        name = getattr(e, "flagname", "") or ""
        hint = tb_flags.REMOVED_FLAGS.get(name.removeprefix("no"))
        raise UsageError(f"--{name}: {hint}" if hint else str(e)) from None
    except flags.Error as e:
        raise UsageError(str(e).removeprefix("ERROR:: ")) from None
    if len(rest) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(rest[1:])}; use --flag=value.")
    if not fv.output_dir:
        raise UsageError("--output_dir is required: the folder for every stage's output.")
    if fv.run_eagerly and fv.jit_compile:
        raise UsageError("--run_eagerly and --jit_compile exclude each other (an eager "
                         "step is not compiled): drop one of them.")
    ignored = tb_flags.ignored_auto_student_flags(fv)
    if ignored:
        it, they = ("it", "it") if len(ignored) == 1 else ("them", "they")
        raise UsageError(f"{', '.join(ignored)}: only --student_config=auto reads {it} (to "
                         f"size the student); --student_config={fv.student_config} fixes the "
                         f"shape, so {they} would be ignored: drop {it}, or use "
                         "--student_config=auto.")
    load_plugins(fv.plugins)
    config = PipelineConfig.from_flags(fv)
    typed = {n[2:] if n not in fv and n.startswith("no") else n
             for n in command_line_names(argv)}
    return config, unread_flag_warnings(config, typed, fv)


def load_plugins(modules: Sequence[str]) -> None:
    """Import `--plugins` modules: they register loss terms, task types, sources,
    formats or strategies (docs/extending.md)."""
    plugins.load(modules)


def run_argv(argv: Sequence[str]) -> dict[str, Any]:
    """Run the pipeline for a command line, in-process, exactly as `bin/distill` does.

    Returns {stage: info} for the stages run or skipped; with --dry_run, the plan.
    Raises our errors (UsageError, PreflightError, OutputDirError, DataError, ...)
    instead of exiting; `main` turns them into exit code 2.
    """
    config, warnings = parse_command(argv)
    return run(config, warnings)


def run(config: PipelineConfig, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """Run (or with --dry_run, plan) the pipeline for `config`; `warnings` (of the
    command line) are printed and planned with preflight's."""
    stages = preflight.resolve_stages(config.run.stages, config)
    # --student_config=auto: measure (or read) the candidates and fix the student first,
    # when a stage builds it.
    refusal = preflight.auto_student_error(config, stages)
    if refusal:
        raise preflight.PreflightError([refusal])
    with contextlib.redirect_stdout(sys.stderr) if config.run.dry_run else \
            contextlib.nullcontext():
        config, sizing = autosize.resolve(config)
    r = config.run
    if config.numerics.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(config.numerics.mixed_precision)
    task = resolve_task(config.task)
    strategy = make_strategy(r.strategy, r.tpu, r.peer_timeout)
    state = RunState(r.output_dir)
    ctx = Context(config, task, state, strategy)
    lock = state.lock(r.lock_stale_minutes)
    in_use = _in_use(lock) if ctx.chief else None
    stage_flags = {s: list(settings_of(s, config)) for s in stage_names()}
    try:
        state.check_config(config.results(), r.overwrite, stage_flags)
        config_error = None
    except OutputDirError as e:
        config_error = e
    if r.dry_run:
        try:
            # stdout carries the plan alone: progress lines go to stderr.
            with contextlib.redirect_stdout(sys.stderr):
                plan = preflight.check(ctx, stages, count_corpus=True, warnings=warnings)
            errors = [] if config_error is None else [str(config_error)]
        except preflight.PreflightError as e:
            plan, errors = None, e.errors + ([str(config_error)] if config_error else [])
        if errors:
            raise preflight.PreflightError(errors)
        if in_use:
            plan["warnings"].append(in_use + " A real run now would be refused.")
        if sizing is not None:
            plan.update(student=sizing.student, candidates=sizing.candidates,
                        student_reason=sizing.reason)
        print(json.dumps(plan, indent=1, default=str), flush=True)
        return plan
    if in_use:
        raise LockError(in_use)
    preflight.check(ctx, stages, warnings=warnings)
    keras.utils.set_random_seed(config.numerics.seed)  # checked: in [0, 2**32)
    if config_error is not None:
        raise config_error
    if not ctx.chief:
        return _run_stages(ctx, stages, None)
    with lock:
        # Under the lock: nothing changes the folder but this run from here on.
        state.check_config(config.results(), r.overwrite, stage_flags)
        removed = state.clean_temporaries(before=lock.acquired_at, entries=output_entries())
        if removed:
            print(f"== removed {len(removed)} temporary file(s) left by an interrupted run: "
                  + ", ".join(os.path.relpath(p, state.output_dir) for p in removed[:5])
                  + (" ..." if len(removed) > 5 else ""), flush=True)
        # Checks passed: now (and only now) the folder records this config.
        if r.overwrite:
            state.reset(stages, keep=stage_io.keep_of(ctx, stages))
        state.write_config(config.results())
        return _run_stages(ctx, stages, lock)


def _in_use(lock: FileLock) -> Optional[str]:
    """The refusal message when a live run holds `lock`, else None."""
    holder = lock.live_holder()
    return lock.held_message(holder) if holder is not None else None


def _run_stages(ctx: Context, stages: Sequence[str],
                lock: Optional[FileLock]) -> dict[str, Any]:
    config, state = ctx.config, ctx.state
    results: dict[str, Any] = {}
    # Before anything runs: which done stages are reused, and why the others run again.
    reuse = stage_io.plan_reuse(ctx, stages)
    for stage, reason in reuse.items():
        if reason is not None:
            print(f"== {stage}: {reason}; it runs again", flush=True)
    for stage in stages:
        if lock is not None:
            lock.check()
        definition = get_stage(stage)
        settings = settings_of(stage, config)
        if not ctx.chief and definition.chief_only:
            # Not collective: the chief alone runs it; workers wait only for the output
            # their later stages read.
            if definition.workers_wait:
                _wait_for_chief(state, stage, config.run.lock_stale_minutes * 60)
            continue
        if state.is_done(stage):
            if reuse.get(stage) is None and stage in reuse:
                print(f"== {stage}: done already, skipped ({state.path(stage)})", flush=True)
                results[stage] = state.done_info(stage)
                continue
            if ctx.chief:
                state.reset([stage], keep=stage_io.keep_of(ctx, [stage]))
        print(f"== {stage}", flush=True)
        # What the stage reads, as it starts (the chief's done record keeps it).
        reads = stage_io.reads_of(ctx, stage, record=True) if ctx.chief else None
        # Seed per stage: a stage's initialisation and dropout do not depend on
        # what ran before it in this process (resume and stage-by-stage runs match).
        keras.utils.set_random_seed(stage_seed(config.numerics.seed, stage))
        start = time.time()
        info = definition.run(ctx) or {}
        info["seconds"] = round(time.time() - start, 1)
        if ctx.chief:
            if lock is not None:
                lock.check()
            state.mark_done(stage, info, settings, stage_io.upstream_fingerprints(ctx, stage),
                            reads, stage_io.outputs_of(ctx, stage))
            if not config.run.keep_finished_checkpoints:
                state.drop_checkpoints(stage)
        results[stage] = info
        print(f"== {stage}: finished in {info['seconds']:.0f}s", flush=True)
    if ctx.chief:
        print(artefacts_table(ctx), flush=True)
    return results


def _wait_for_chief(state: RunState, stage: str, stale_after: float,
                    poll_seconds: float = 2.0) -> None:
    """Wait for the chief to finish a stage it runs alone (augment), as long as the
    chief's lock heartbeat says it lives: a chief gone for `stale_after` seconds (or
    whose lock never appears) is an error, not an endless wait."""
    print(f"== {stage}: waiting for the chief to finish it ({state.path(stage)})", flush=True)
    lock_path = state.path(LOCK_FILE)
    since = time.time()
    while not state.is_done(stage):
        holder = read_holder(lock_path)
        last = holder.heartbeat if holder is not None else since
        if time.time() - last > stale_after:
            seen = (f"its lock heartbeat is {time.time() - last:.0f} s old" if holder
                    else f"it holds no lock on {state.output_dir}")
            raise LockError(f"{stage}: this worker waited for the chief, but {seen} (more "
                            f"than --lock_stale_minutes={stale_after / 60:g}); the chief "
                            "stopped: look at its log, then re-run every worker.")
        time.sleep(poll_seconds)


def main(argv: Sequence[str]) -> int:
    """The command: --help, or the run; every error becomes one message on stderr and an
    exit code (tinybert_tf.cli.tool)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    kind = cli.help_request(argv)
    if kind is not None:
        sys.stdout.write(cli.help_text(tb_flags.distill_flags(), USAGE, kind))
        return cli.EXIT_OK
    return cli.guard("distill", lambda: run_argv(argv) and None)


def entry_point() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv))
