"""`bin/distill`: parse flags into typed configs, check everything, run the stages in order.

`run_argv(argv)` is the whole tool in-process (tests and notebooks call it; the
`bin/distill` script calls it with sys.argv). Re-running the same command
resumes: finished stages are skipped, an interrupted one continues from its
latest checkpoint, and a stage made with other settings (or from an output
redone since) runs again.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import sys
import time
from typing import Any, Sequence

import keras
from absl import flags

from tinybert_tf.config import ConfigError
from tinybert_tf.data.examples import DataError
from tinybert_tf.models.checkpoint import CheckpointError
from tinybert_tf.pipeline import flags as tb_flags
from tinybert_tf.pipeline import preflight
from tinybert_tf.pipeline.configs import PipelineConfig
from tinybert_tf.pipeline.stages import (
    CHIEF_ONLY_STAGES,
    STAGE_FUNCTIONS,
    STAGES,
    Context,
    upstream,
)
from tinybert_tf.pipeline.state import OutputDirError, RunState
from tinybert_tf.pipeline.strategy import make_strategy
from tinybert_tf.tasks.catalog import resolve_task

log = logging.getLogger("tinybert_tf")

# Errors that reach the user as one line naming the flag or file (exit code 2).
USER_ERRORS = (ValueError, FileNotFoundError, ConfigError, DataError, CheckpointError)


class UsageError(ValueError):
    """Bad command line (unknown or removed flag, stray argument, missing --output_dir)."""


def parse_argv(argv: Sequence[str]) -> PipelineConfig:
    """argv (argv[0] = program name, --flagfile allowed) -> the typed configs."""
    fv = tb_flags.distill_flags()
    try:
        rest = fv(list(argv))
    except flags.UnrecognizedFlagError as e:
        name = getattr(e, "flagname", "") or ""
        hint = tb_flags.REMOVED_FLAGS.get(name.removeprefix("no"))
        raise UsageError(f"--{name}: {hint}" if hint else str(e)) from None
    except flags.Error as e:
        raise UsageError(str(e)) from None
    if len(rest) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(rest[1:])}; use --flag=value.")
    if not fv.output_dir:
        raise UsageError("--output_dir is required: the folder for every stage's output.")
    load_plugins(fv.plugins)
    return PipelineConfig.from_flags(fv)


def load_plugins(modules: Sequence[str]) -> None:
    """Import `--plugins` modules: they register loss terms, task types, sources,
    formats or strategies (docs/extending.md)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UsageError(f"--plugins={name}: cannot import it ({e}); give a module on "
                             "PYTHONPATH, e.g. my_project.distill_terms.") from None


def run_argv(argv: Sequence[str]) -> dict[str, Any]:
    """Run the pipeline for a command line, in-process, exactly as `bin/distill` does.

    Returns {stage: info} for the stages run or skipped; with --dry_run, the plan.
    Raises our errors (UsageError, PreflightError, OutputDirError, DataError, ...)
    instead of exiting; `main` turns them into exit code 2.
    """
    return run(parse_argv(argv))


def run(config: PipelineConfig) -> dict[str, Any]:
    """Run (or with --dry_run, plan) the pipeline for `config`."""
    r = config.run
    stages = preflight.resolve_stages(r.stages, config)
    keras.utils.set_random_seed(config.numerics.seed)
    if config.numerics.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(config.numerics.mixed_precision)
    task = resolve_task(config.task)
    strategy = make_strategy(r.strategy, r.tpu)
    state = RunState(r.output_dir)
    ctx = Context(config, task, state, strategy)
    try:
        state.check_config(config.results(), r.overwrite)
        config_error = None
    except OutputDirError as e:
        config_error = e
    if r.dry_run:
        try:
            # stdout carries the plan alone: progress lines go to stderr.
            with contextlib.redirect_stdout(sys.stderr):
                plan = preflight.check(ctx, stages, count_corpus=True)
            errors = [] if config_error is None else [str(config_error)]
        except preflight.PreflightError as e:
            plan, errors = None, e.errors + ([str(config_error)] if config_error else [])
        if errors:
            raise preflight.PreflightError(errors)
        print(json.dumps(plan, indent=1, default=str), flush=True)
        return plan
    preflight.check(ctx, stages)
    if config_error is not None:
        raise config_error
    # Checks passed: now (and only now) the folder records this config.
    if ctx.chief:
        if r.overwrite:
            state.reset(stages)
        state.write_config(config.results())
    return _run_stages(ctx, stages)


def _run_stages(ctx: Context, stages: Sequence[str]) -> dict[str, Any]:
    config, state = ctx.config, ctx.state
    results: dict[str, Any] = {}
    for stage in stages:
        inputs = {up: state.stage_fingerprint(up) or "" for up in upstream(stage, config)}
        settings = config.stage_settings(stage)
        if not ctx.chief and stage in CHIEF_ONLY_STAGES:
            # Not collective: the chief alone runs it; workers need only augment's file.
            if stage == "augment":
                _wait_for_chief(state, stage)
            continue
        if state.is_done(stage):
            reason = state.stale_reason(stage, settings, inputs)
            if reason is None:
                print(f"== {stage}: done already, skipped ({state.path(stage)})", flush=True)
                results[stage] = state.done_info(stage)
                continue
            print(f"== {stage}: {reason}; running it again", flush=True)
            if ctx.chief:
                state.reset([stage])
        print(f"== {stage}", flush=True)
        # Seed per stage: a stage's initialisation and dropout do not depend on
        # what ran before it in this process (resume and stage-by-stage runs match).
        keras.utils.set_random_seed(config.numerics.seed + STAGES.index(stage))
        start = time.time()
        info = STAGE_FUNCTIONS[stage](ctx) or {}
        info["seconds"] = round(time.time() - start, 1)
        if ctx.chief:
            state.mark_done(stage, info, settings, inputs)
        results[stage] = info
        print(f"== {stage}: finished in {info['seconds']:.0f}s", flush=True)
    return results


def _wait_for_chief(state: RunState, stage: str, poll_seconds: float = 2.0) -> None:
    print(f"== {stage}: waiting for the chief to finish it ({state.path(stage)})", flush=True)
    while not state.is_done(stage):
        time.sleep(poll_seconds)


def main(argv: Sequence[str]) -> int:
    """The command: our errors become one line on stderr and exit code 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        run_argv(argv)
    except USER_ERRORS as e:
        # Our errors are ValueErrors that name the file/flag and the fix.
        print(f"distill: error: {_one_line_head(e)}", file=sys.stderr, flush=True)
        return 2
    return 0


def _one_line_head(e: Exception) -> str:
    return re.sub(r"\s+$", "", str(e))


def entry_point() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv))
