"""Every command-line flag of the `bin/` tools, defined here and only here.

It sits in the pipeline package, the top of the data flow, because it reads the
lists of choices of every layer below.

Flags come in groups (`define_*`, each taking the `FlagValues` to define into).
Each tool defines exactly the groups it reads, so `--helpfull` lists nothing
it ignores: `distill_flags()` for the pipeline, and `define_*_tool_flags()`
for `bin/augment`, `bin/export`, `bin/benchmark` and `bin/pretokenize`.

The pipeline's flags are generated from the fields of the typed configs
(`settings.configs`, `tasks.TaskConfig`): each field declares its default, help,
range and stages once (`settings.fields.setting`), and a group defines the fields
of its configs with `define_flags`. Two helps list names whose modules import the
configs (--stages, --task_phases): their groups give them here. The tools' own
flags (bin/augment's --shard, bin/reproduce's --table, ...) read no config and are
defined by hand below.

Lists of choices come from the modules that own them (strategies, stages,
export formats, loss terms, task names); `--loss_terms`, `--export_formats`
and `--task` are checked when the typed configs are built, because a term,
format or task registered by user code is as valid as ours.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from absl import flags

from tinybert_tf.cli.tool import UsageError
from tinybert_tf.fields import define_flags, flag_name, flag_range_errors
from tinybert_tf.pipeline.settings.configs import (
    AUTO_STUDENT,
    PART_TYPES,
    AugmentConfig,
    EvaluateConfig,
    ExportConfig,
    FinetuneConfig,
    GeneralConfig,
    LossConfig,
    ModelsConfig,
    Numerics,
    OptimConfig,
    QuantizeConfig,
    RunOptions,
    TaskDistillConfig,
)
from tinybert_tf.pipeline.stages import stage_names
from tinybert_tf.pipeline.training.phases import PHASE_KINDS
from tinybert_tf.pipeline.training.recipes import RECIPES
from tinybert_tf.pipeline.training.strategy import STRATEGIES
from tinybert_tf.tasks.catalog import TaskConfig

FLAGS = flags.FLAGS

# Flags that existed once: the message names what replaced them.
REMOVED_FLAGS = {
    "shard": "bin/distill augments the whole task; split augmentation across machines with "
             "bin/augment --shard=i/n and pass the concatenated file's folder instead.",
    "model_dir": "--model_dir belongs to bin/export; bin/distill exports OUTPUT/task/model.",
    "output": "--output belongs to bin/augment and bin/pretokenize.",
    "vocab": "--vocab belongs to bin/augment and bin/pretokenize; bin/distill uses the "
             "teacher's vocab.txt.",
    "vector_cache": "--vector_cache belongs to bin/augment; bin/distill caches word vectors "
                    "in OUTPUT/augment/vectors.",
    "intermediate": "--task_phases lists the task stage's phases in order; "
                    "--task_phases=prediction skips the intermediate-layer phase.",
}


# Flags only --student_config=auto reads (declared `when=AUTO_STUDENT`): set with a fixed
# student, they would be ignored.
AUTO_STUDENT_FLAGS = tuple(flag_name(f) for f in dataclasses.fields(ModelsConfig)
                           if f.metadata.get("when") == AUTO_STUDENT)


def ignored_auto_student_flags(fv: flags.FlagValues) -> list[str]:
    """The `AUTO_STUDENT_FLAGS` given (on the command line or in a flagfile) with a value
    other than their default while --student_config is not auto, as `--name`."""
    if fv["student_config"].value == "auto":
        return []
    return [f"--{name}" for name in AUTO_STUDENT_FLAGS
            if fv[name].present and fv[name].value != fv[name].default]


def check_tool_ranges(fv: flags.FlagValues = FLAGS) -> None:
    """A UsageError when a config-defined flag a tool (bin/augment, bin/export) defines
    into `fv` lies outside its range, worded as bin/distill's preflight words it."""
    errors = flag_range_errors(fv, tuple(PART_TYPES.values()))
    if errors:
        raise UsageError(" ".join(errors))


# --- groups -------------------------------------------------------------------------

# FlagValues -> names of the groups and tools already defined into it.
_defined: "weakref.WeakKeyDictionary[flags.FlagValues, set[str]]" = weakref.WeakKeyDictionary()


def _group(define):
    """A group goes into a FlagValues once, whichever tools ask for it (tests load
    several bin/ scripts into one process, all defining into absl's FLAGS)."""
    def wrapped(fv: flags.FlagValues, *args: Any) -> None:
        if _first_time(fv, define.__name__):
            define(fv, *args)
    wrapped.__name__ = define.__name__
    wrapped.__doc__ = define.__doc__
    return wrapped


@_group
def define_numerics(fv: flags.FlagValues) -> None:
    define_flags(fv, Numerics)
    define_flags(fv, RunOptions, "numerics")


@_group
def define_distribution(fv: flags.FlagValues) -> None:
    define_flags(fv, RunOptions, "distribution", helps={"strategy": (
        f"tf.distribute strategy: {', '.join(STRATEGIES)} (see BUILD.md for multi_worker "
        "and tpu).")})


@_group
def define_task_data(fv: flags.FlagValues) -> None:
    """What the task is and where its data is (`tinybert_tf.tasks.TaskConfig`)."""
    define_flags(fv, TaskConfig)


@_group
def define_augment(fv: flags.FlagValues) -> None:
    """Algorithm 1's settings (the pipeline's augment stage and bin/augment)."""
    define_flags(fv, AugmentConfig)
    define_flags(fv, RunOptions, "augment")


@_group
def define_corpus(fv: flags.FlagValues, help_text: str = "") -> None:
    define_flags(fv, GeneralConfig, "corpus", {"corpus": help_text} if help_text else None)


@_group
def define_export(fv: flags.FlagValues) -> None:
    define_flags(fv, ExportConfig)
    define_flags(fv, RunOptions, "export")


@_group
def define_run(fv: flags.FlagValues) -> None:
    """How the pipeline proceeds: folder, stages, resume, dry run."""
    define_flags(fv, RunOptions, "run", {
        "stages": f"Comma list of {', '.join(stage_names())}, or 'all'."})


@_group
def define_plugins(fv: flags.FlagValues) -> None:
    """--plugins: every tool that reads a registry (tasks, sources, export formats, ...)
    takes it, so a model trained on a plugin's task can be augmented for and exported."""
    define_flags(fv, RunOptions, "plugins")


@_group
def define_models(fv: flags.FlagValues) -> None:
    define_flags(fv, ModelsConfig)


@_group
def define_general(fv: flags.FlagValues) -> None:
    define_flags(fv, GeneralConfig, helps={"recipe": (
        "Recipe of the general stage: " + "; ".join(
            f"{name} = {r.summary}" for name, r in sorted(RECIPES.items()))
        + " (pipeline/training/recipes.py).")})


@_group
def define_finetune(fv: flags.FlagValues) -> None:
    define_flags(fv, FinetuneConfig)


@_group
def define_task_distillation(fv: flags.FlagValues) -> None:
    define_flags(fv, TaskDistillConfig, helps={"task_phases": (
        f"Phases of the task stage, in order: {', '.join(PHASE_KINDS)} (and phases "
        "registered by --plugins). The last one trains the head and keeps its best dev "
        "checkpoint.")})


@_group
def define_quantize(fv: flags.FlagValues) -> None:
    """The quantize stage (quantisation-aware distillation to a full-integer student)."""
    define_flags(fv, QuantizeConfig)


def define_evaluation(fv: flags.FlagValues) -> None:
    define_flags(fv, EvaluateConfig)


@_group
def define_losses(fv: flags.FlagValues) -> None:
    define_flags(fv, LossConfig)


@_group
def define_optimizer(fv: flags.FlagValues) -> None:
    define_flags(fv, OptimConfig)


# --- tools ---------------------------------------------------------------------------

def _loose(define, name: str, *args, fv: flags.FlagValues, **kwargs) -> None:
    """Define a tool's own flag unless another tool loaded in this process did."""
    if name not in fv:
        define(name, *args, flag_values=fv, **kwargs)


def _first_time(fv: flags.FlagValues, what: str) -> bool:
    """True the first time `what` (a group or a tool) is defined into `fv` (a test may
    load a bin/ script twice, and several scripts into one process)."""
    done = _defined.setdefault(fv, set())
    if what in done:
        return False
    done.add(what)
    return True


DISTILL_GROUPS = (define_run, define_plugins, define_numerics, define_distribution,
                  define_task_data, define_models, define_general, define_finetune, define_augment,
                  define_task_distillation, define_losses, define_optimizer, define_quantize,
                  define_evaluation,
                  define_export)


def distill_flags() -> flags.FlagValues:
    """A fresh FlagValues with every flag of `bin/distill` (the pipeline)."""
    fv = flags.FlagValues()
    for define in DISTILL_GROUPS:
        define(fv)
    define_corpus(fv)
    return fv


# bin/reproduce's own flags (besides bin/distill's, which pass through to every run).
REPRODUCE_FLAGS = ("table", "tasks", "cells", "seeds", "glue_dir", "squad_dir",
                   "bert_small_model")


def reproduce_flags() -> flags.FlagValues:
    """A fresh FlagValues for `bin/reproduce`: every flag of bin/distill (passed to each
    run) and its own."""
    fv = distill_flags()
    flags.DEFINE_integer("table", None, "The paper's table to reproduce, 1-7 "
                         "(tinybert_tf/paper/tables.py).", flag_values=fv)
    flags.DEFINE_list("tasks", [], "Tasks to run each cell on (--task names); default: the "
                      "table's tasks.", flag_values=fv)
    flags.DEFINE_list("cells", [], "Only these cells of the table (default: every cell but "
                      "the teacher's row, whose score every cell's report holds).",
                      flag_values=fv)
    flags.DEFINE_list("seeds", [], "Run the table once per seed (--seed=N of every run, "
                      "whatever --seed says), "
                      "in DIR/seed-N/, and write DIR/table<N>.* with each cell's mean, "
                      "standard deviation and paired difference to the table's first row "
                      "over the seeds; default: one run with --seed, in DIR.", flag_values=fv)
    flags.DEFINE_string("glue_dir", "", "Folder of the GLUE download (CoLA/, MNLI/, ...): "
                        "each GLUE task gets --data_dir=GLUE_DIR/<Task>.", flag_values=fv)
    flags.DEFINE_string("squad_dir", "", "Folder holding train-v1.1.json, dev-v1.1.json, "
                        "train-v2.0.json and dev-v2.0.json for the SQuAD tasks.",
                        flag_values=fv)
    flags.DEFINE_string("bert_small_model", "",
                        "Table 1's BERT-Small cell: the pre-trained 4 x 512 checkpoint it "
                        "fine-tunes (Turc et al. 2019, Google's uncased_L-4_H-512_A-8 as a "
                        "model directory; docs/models.md). --general_model is a General "
                        "TinyBERT and starts only the cells that start from one.",
                        flag_values=fv)
    flags.mark_flag_as_required("table", flag_values=fv)
    return fv


def define_augment_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/augment`: Algorithm 1 on one task, shardable."""
    if not _first_time(fv, "augment"):
        return
    define_plugins(fv)
    define_task_data(fv)
    define_augment(fv)
    define_corpus(fv, "Corpus for the Word2Vec fallback (--augment_fallback without "
                  "--word_vectors); empty: the Wikipedia sample shipped in gensim.")
    s = flags.DEFINE_string
    _loose(flags.DEFINE_integer, "seed", 42, "Random seed of the replacements.", fv=fv)
    _loose(s, "shard", "", "i/n: augment only the i-th of n slices of the task (0-based), for "
           "splitting work across machines.", fv=fv)
    _loose(s, "output", "", "The file to write; name it as the task's augmented file "
           "(train_aug.tsv for GLUE layout), in its own folder.", fv=fv)
    _loose(s, "vocab", "", "The task tokenizer's vocab (the model trained on the output): "
           "its vocab.txt, model directory or short name (minilm-l6); checked against "
           "--mlm_model's vocab. Empty: no check.", fv=fv)
    _loose(s, "vector_cache", "", "Folder caching Word2Vec trained on --corpus. Empty: "
           "'vectors' next to --output.", fv=fv)


def define_export_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/export`: SavedModel, TFLite, ... and parity from a model directory."""
    if not _first_time(fv, "export"):
        return
    define_plugins(fv)
    define_task_data(fv)
    define_export(fv)
    _loose(flags.DEFINE_string, "model_dir", None, "The task model directory to export "
           "(config.json + vocab.txt + weights, with a task head).", fv=fv)
    _loose(flags.DEFINE_string, "quantized_model_dir", "", "The quantize stage's int8 "
           "student of --model_dir (OUTPUT/quantize/model): int8 is converted from it with "
           "its learnt ranges, int8_ptq (post-training int8) beside it.", fv=fv)
    _loose(flags.DEFINE_string, "output_dir", None, "Where to write: OUTPUT/export/.", fv=fv)
    _loose(flags.DEFINE_string, "serving_model_name", "", "TF Serving model name written to "
           "OUTPUT/export/serving/models.config, used as given: letters, digits, '_', '.' "
           "and '-' (empty: the task name, lower-cased).", fv=fv)
    _loose(flags.DEFINE_integer, "serving_version", 0, "Publish the SavedModel as this "
           "version folder, 1 to 2**63 - 1 (TF Serving's int64). Unset: the next free one. "
           "0 and an existing version are errors: served versions are never rewritten.",
           fv=fv)


def define_benchmark_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/benchmark`: the paper's Table 1 efficiency columns on this machine."""
    if not _first_time(fv, "benchmark"):
        return
    define_plugins(fv)
    lst, i = flags.DEFINE_list, flags.DEFINE_integer
    _loose(lst, "benchmark_models", ["bert_base_uncased", "tinybert_4l_312d"],
           "Teacher, then student: each a config preset, a config JSON file, a model "
           "directory (e.g. OUTPUT/task/model) or a model's short name (minilm-l6).", fv=fv)
    _loose(i, "benchmark_seq_len", 128, "Sequence length.", fv=fv)
    _loose(lst, "benchmark_batch_sizes", ["1", "32"], "Batch sizes to time.", fv=fv)
    _loose(lst, "benchmark_formats", ["keras", "saved_model", "float32", "float16",
                                      "dynamic_int8", "int8"],
           "Runtimes to time: keras and the timed export formats.", fv=fv)
    _loose(i, "benchmark_runs", 20, "Timed calls per measurement (median).", fv=fv)
    _loose(flags.DEFINE_float, "benchmark_seconds", 10.0, "Time budget per measurement; "
           "stops early (after at least 3 calls) once spent.", fv=fv)
    _loose(i, "benchmark_threads", 0, "TFLite interpreter threads (0 = all CPU cores).", fv=fv)
    _loose(flags.DEFINE_string, "benchmark_output", "benchmark_out",
           "Folder for benchmark.json and benchmark.png.", fv=fv)
    _loose(flags.DEFINE_bool, "quick", False, "Smoke test: tiny configs, seq 16, 2 runs "
           "(refused with explicit --benchmark_models).", fv=fv)


def define_pretokenize_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/pretokenize`: a general corpus -> packed TFRecord shards."""
    if not _first_time(fv, "pretokenize"):
        return
    define_corpus(fv, "Corpus to pre-tokenise: text files/globs (BERT format, .gz/.bz2), a "
                  "Wikipedia XML dump (.xml.bz2), or tfds:NAME. Empty: the Wikipedia sample "
                  "shipped in gensim.")
    s, i, e = flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_enum
    _loose(s, "vocab", "", "WordPiece vocab.txt, a model directory holding one, or a "
           "model's short name (minilm-l6): the student's vocab, i.e. the teacher's.", fv=fv)
    _loose(s, "output", "", "Shard prefix: writes PREFIX-00000-of-0000N.tfrecord ... and "
           "PREFIX.json.", fv=fv)
    _loose(s, "tfds_data_dir", "", "TFDS data_dir for tfds sources (prepared offline).", fv=fv)
    _loose(i, "max_seq_len", 128, "Packed sequence length.", fv=fv)
    _loose(e, "corpus_format", "auto", ["auto", "text", "wiki", "tfds"],
           "How to read --corpus; auto decides from the name.", fv=fv)
    _loose(e, "pack", "pair", ["pair", "single"], "pair: [CLS] A [SEP] B [SEP] (TinyBERT); "
           "single: one segment (DistilBERT).", fv=fv)
    _loose(i, "num_shards", 8, "TFRecord shards to write (documents are dealt round-robin; "
           "more shards than workers balances the load).", fv=fv)
    _loose(i, "num_workers", 0, "Worker processes (0 = all CPU cores).", fv=fv)
    _loose(flags.DEFINE_bool, "lower_case", True, "Lower-case and strip accents (uncased "
           "vocab).", fv=fv)
