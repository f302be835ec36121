"""`bin/distill`: parse flags, check everything, run the stages in order.

Re-running the same command resumes: finished stages are skipped, an
interrupted one continues from its latest checkpoint.
"""
from __future__ import annotations

import logging
import os
import sys
import time

from absl import app, flags

from tinybert_tf import flags as tb_flags

tb_flags.define_distill_flags()
FLAGS = flags.FLAGS
log = logging.getLogger("tinybert_tf")


def _configure(f) -> None:
    import keras
    keras.utils.set_random_seed(f.seed)
    if f.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(f.mixed_precision)


def run(f=None) -> dict:
    """Run the pipeline for flag values `f` (absl FLAGS by default)."""
    from tinybert_tf.pipeline.preflight import resolve_stages, run_preflight
    from tinybert_tf.pipeline.stages import STAGE_FUNCTIONS, Context
    from tinybert_tf.pipeline.state import RunState, result_config
    from tinybert_tf.pipeline.strategy import make_strategy
    import keras
    from tinybert_tf.flags import STAGES

    f = f or FLAGS
    stages = resolve_stages(f.stages, f)
    _configure(f)
    strategy = make_strategy(f.strategy, f.tpu)
    state = RunState(f.output_dir)
    if isinstance(f, flags.FlagValues):
        names = _pipeline_flag_names()
        values = {k: v for k, v in f.flag_values_dict().items() if k in names}
    else:  # a plain namespace (tests)
        values = dict(vars(f))
    state.check_config(result_config(values), f.overwrite, stages)
    ctx = Context(f, state, strategy)
    run_preflight(ctx, stages)
    results = {}
    for stage in stages:
        if not ctx.chief and stage in CHIEF_ONLY_STAGES:
            # Not collective: the chief alone runs it; workers need only augment's file.
            if stage == "augment":
                _wait_for_chief(state, stage)
            continue
        if state.is_done(stage):
            print(f"== {stage}: done already, skipped ({state.path(stage)})", flush=True)
            results[stage] = state.done_info(stage)
            continue
        print(f"== {stage}", flush=True)
        # Seed per stage: a stage's initialisation and dropout do not depend on
        # what ran before it in this process (resume and stage-by-stage runs match).
        keras.utils.set_random_seed(f.seed + STAGES.index(stage))
        start = time.time()
        info = STAGE_FUNCTIONS[stage](ctx) or {}
        info["seconds"] = round(time.time() - start, 1)
        if ctx.chief:
            state.mark_done(stage, info)
        results[stage] = info
        print(f"== {stage}: finished in {info['seconds']:.0f}s", flush=True)
    return results


# Stages that train nothing: under multi_worker only the chief runs them.
CHIEF_ONLY_STAGES = ("augment", "evaluate", "export")


def _wait_for_chief(state, stage: str, poll_seconds: float = 2.0) -> None:
    print(f"== {stage}: waiting for the chief to finish it ({state.path(stage)})", flush=True)
    while not state.is_done(stage):
        time.sleep(poll_seconds)


def _pipeline_flag_names() -> set[str]:
    """Names of the flags the pipeline defines (not absl's own logging flags)."""
    return {fl.name for module, fls in FLAGS.flags_by_module_dict().items()
            if module.startswith("tinybert_tf") for fl in fls}


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    # Checked here, not with mark_flag_as_required: that validator would live on in
    # the process-wide FLAGS and break other tools parsing flags in the same process.
    if not FLAGS.output_dir:
        raise app.UsageError("--output_dir is required: the folder for every stage's output.")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from tinybert_tf.config import ConfigError
    try:
        run(FLAGS)
    except (ValueError, FileNotFoundError, ConfigError) as e:
        # Our errors are ValueErrors that name the file/flag and the fix.
        print(f"distill: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)


def entry_point() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main)
