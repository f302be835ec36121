"""Teacher vs student efficiency on this machine (the paper's Table 1 columns).

  bin/benchmark                       # bert_base_uncased vs tinybert_4l_312d, seq 128
  bin/benchmark --quick               # smoke test: tiny configs, seq 16, few runs

Prints parameters, FLOPs, latency and throughput at batch 1 and 32 for Keras,
SavedModel and each TFLite flavour, each runtime's label agreement with Keras
on the timed inputs (random weights: a numerics check of e.g. int8), and the
teacher/student ratios; writes --benchmark_output/benchmark.json and
benchmark.png. int16x8 is timed on request (--benchmark_formats=...,int16x8):
its x86 kernels are reference code. Exit codes as every bin/ tool: 0 done; 2 a
bad flag (one line `bin/benchmark: error: ...` naming it); 1 an internal error.
"""
from __future__ import annotations

import os
import sys

from absl import logging

from tinybert_tf import files, plugins
from tinybert_tf.cli import tool as cli
from tinybert_tf.config import BertConfig, ConfigError, get_config
from tinybert_tf.export.benchmark import run_benchmark, runtime_names
from tinybert_tf.models.checkpoint import (
    SHORT_NAMES,
    CheckpointError,
    inside_model_dir_error,
    resolve,
)
from tinybert_tf.pipeline import flags as tflags

tflags.define_benchmark_tool_flags()
FLAGS = tflags.FLAGS


# Flags --quick replaces with its own tiny settings: giving one with --quick is an error.
QUICK_IGNORES = ("benchmark_models", "benchmark_seq_len", "benchmark_batch_sizes",
                 "benchmark_runs", "benchmark_seconds")


def check_flags() -> list[int]:
    """Every flag's range, before anything is timed; returns the batch sizes."""
    if FLAGS.quick:
        ignored = [f"--{n}" for n in QUICK_IGNORES if FLAGS[n].present]
        if ignored:
            raise ConfigError(f"--quick times two tiny built-in configs at seq 16 and would "
                              f"ignore {', '.join(ignored)}; drop --quick or those flags.")
    batches = []
    for b in FLAGS.benchmark_batch_sizes:
        try:
            batches.append(int(b))
        except ValueError:
            raise ConfigError(f"--benchmark_batch_sizes={','.join(FLAGS.benchmark_batch_sizes)}:"
                              f" {b!r} is not an integer; give a comma list of batch sizes "
                              "(e.g. 1,32).") from None
    bad = [b for b in batches if b < 1]
    if bad or not batches:
        raise ConfigError(f"--benchmark_batch_sizes={','.join(FLAGS.benchmark_batch_sizes)}: "
                          "every batch size must be >= 1 (e.g. 1,32).")
    for name, ok, allowed in (("benchmark_seq_len", FLAGS.benchmark_seq_len >= 3, ">= 3"),
                              ("benchmark_runs", FLAGS.benchmark_runs >= 1, ">= 1"),
                              ("benchmark_seconds", FLAGS.benchmark_seconds > 0, "> 0"),
                              ("benchmark_threads", FLAGS.benchmark_threads >= 0,
                               ">= 0 (0 = all cores)")):
        if not ok:
            raise ConfigError(f"--{name}={FLAGS[name].value}: must be {allowed}.")
    unknown = [r for r in FLAGS.benchmark_formats if r not in runtime_names()]
    if unknown or not FLAGS.benchmark_formats:
        what = f"unknown runtime(s) {', '.join(unknown)}" if unknown else "no runtime given"
        raise ConfigError(f"--benchmark_formats={','.join(FLAGS.benchmark_formats)}: {what}; "
                          f"use any of {', '.join(runtime_names())}.")
    for name, values in (("benchmark_batch_sizes", batches),
                         ("benchmark_formats", FLAGS.benchmark_formats)):
        twice = cli.repeated(values)
        if twice:  # each would be timed, and be a row of the table, twice
            raise ConfigError(f"--{name}={','.join(FLAGS[name].value)}: "
                              f"{', '.join(twice)} given twice; name each once.")
    if not FLAGS.quick and len(FLAGS.benchmark_models) != 2:
        raise ConfigError(f"--benchmark_models={','.join(FLAGS.benchmark_models)}: give two "
                          "models, the teacher then the student (each a config preset, a "
                          "config JSON file, a model directory or a model's short name).")
    out = FLAGS.benchmark_output
    if not out:
        raise ConfigError("--benchmark_output is empty: give the folder for benchmark.json "
                          "and benchmark.png.")
    if files.exists(out) and not files.isdir(out):
        raise ConfigError(f"--benchmark_output={out}: is a file; give a folder (new, or one "
                          "holding an earlier benchmark.json, which is replaced).")
    inside = inside_model_dir_error(out, "--benchmark_output")
    if inside:
        raise ConfigError(inside)
    earlier = os.path.join(out, "benchmark.json")
    if files.isfile(earlier) and not _a_benchmark(earlier):
        raise ConfigError(f"--benchmark_output={out}: {earlier} is not an earlier "
                          "bin/benchmark's, and this run would replace it (with "
                          "benchmark.png); choose another folder.")
    chart = os.path.join(out, "benchmark.png")
    if not files.isfile(earlier) and files.exists(chart):  # ours comes after the JSON
        raise ConfigError(f"--benchmark_output={out}: {chart} is not an earlier "
                          "bin/benchmark's (it has no benchmark.json beside it), and this run "
                          "would replace it; choose another folder.")
    try:  # now, not after the timing: a folder that cannot be made is known at once
        files.makedirs(out)
    except files.FileAccessError as e:
        raise ConfigError(f"--benchmark_output={out}: {e} Choose another folder.") from e
    return batches


def _a_benchmark(path: str) -> bool:
    """Whether `path` is a benchmark.json bin/benchmark wrote (it replaces only those)."""
    found = files.json_object(path)
    return found is not None and {"models", "ratios"} <= set(found)


def run() -> None:
    """Check the flags, then time the teacher and the student (tiny ones with --quick)."""
    plugins.load(FLAGS.plugins)  # an export format they register with a timer is timed
    batches = check_flags()
    if FLAGS.quick:
        configs = [("tiny_teacher", BertConfig(vocab_size=512, hidden_size=64, num_layers=4,
                                               num_heads=4, intermediate_size=256,
                                               max_position_embeddings=64)),
                   ("tiny_student", BertConfig(vocab_size=512, hidden_size=32, num_layers=2,
                                               num_heads=4, intermediate_size=64,
                                               max_position_embeddings=64))]
        seq_len, batches, runs, budget = 16, [1, 2], 2, 1.0
    else:
        configs = [(_label(n), model_config(n)) for n in FLAGS.benchmark_models]
        seq_len, runs = FLAGS.benchmark_seq_len, FLAGS.benchmark_runs
        budget = FLAGS.benchmark_seconds
    run_benchmark(configs, seq_len, batches, FLAGS.benchmark_formats, runs,
                  FLAGS.benchmark_output, FLAGS.benchmark_threads or None, budget)


def _label(name: str) -> str:
    """A model's name in the table and benchmark.json: as given, whole (a model
    directory's basename alone is 'model', and a cut path names no folder)."""
    return name.rstrip("/") or name


def model_config(name: str) -> BertConfig:
    """A --benchmark_models entry: a preset, a config JSON file, a model directory, or a
    model's short name (minilm-l6: the installed teacher)."""
    if name.lower() in SHORT_NAMES and not files.exists(name):
        try:
            name = resolve(name)
        except CheckpointError as e:
            raise ConfigError(f"--benchmark_models: {e}") from e
    try:
        return get_config(name)
    except ConfigError as e:
        raise ConfigError(f"--benchmark_models: {e}") from e


def main(argv: list[str]) -> int:
    """bin/benchmark with its flags parsed: the exit code (tinybert_tf.cli.tool)."""
    logging.set_verbosity(logging.WARNING)
    return cli.guard("bin/benchmark", run,
                     rerun="re-run the same command: it times every model again")


def entry_point() -> None:
    """`bin/benchmark`: the tool on sys.argv; exits with its code."""
    sys.exit(cli.run_tool("bin/benchmark", main, sys.argv, FLAGS, __doc__))
