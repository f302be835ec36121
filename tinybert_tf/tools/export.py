"""Export a task model for deployment and check parity with Keras.

  bin/export --model_dir=OUT/task/model --output_dir=OUT [--task=SST-2 --data_dir=glue/SST-2]
             [--max_seq_len=64 --export_formats=saved_model,float32,float16,dynamic_int8,int8]

Writes OUT/export/<one artefact per format> (the format table: the SavedModel
as the next TF Serving version OUT/export/serving/<N>/ with warm-up requests and
OUT/export/serving/models.config, TFLite flavours with TFLite metadata for
Android, hf and keras_hub directories) and OUT/export/parity.json, and prints
the parity table. A re-export publishes version N+1 next to N; --serving_version
picks the number (an existing one or 0 is refused). Dev text (parity) and train
text (int8 calibration) come from --task and its data flags; without --task, from
the task the model records (bin/distill's task models record it, with their
sequence length, which --max_seq_len then defaults to).

Labels come from the model: the exports name its outputs in its own order, and a
--task whose label names differ from the model's is refused.

--quantized_model_dir=OUT/quantize/model (the pipeline's quantize stage) adds the
int8 student: int8 is converted from it with its learnt ranges, and int8_ptq (the
float model's post-training int8) is exported beside it.

The model must suit --task (head kind and label count: a 2-label model is refused
for --task=mnli), and must not be the model of an unfinished pipeline stage;
--output_dir lies outside the model directories, and its export/ folder is new or an
earlier export's (one of other files is refused, not written among).
--output_dir is locked while exporting (the same OUTPUT/.lock as bin/distill),
so an export never mixes with a running pipeline or another export. Exit codes
(as every bin/ tool): 0 done; 2 an error of the command, its data or its
environment, printed as one line `bin/export: error: ...` naming the flag or
file and the fix; 1 an internal error; 130 interrupted.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Optional, Sequence

from absl import logging

from tinybert_tf import files, plugins
from tinybert_tf.cli import tool as cli
from tinybert_tf.export import FORMATS, ExportError, ExportRequest, check_formats, export_all
from tinybert_tf.export.common import seq_len_within
from tinybert_tf.export.formats import format_problems
from tinybert_tf.export.parity import PARITY_FILE, check_quantized
from tinybert_tf.export.serving import check_model_name, check_version, list_versions
from tinybert_tf.models.checkpoint import (
    CheckpointError,
    ModelInfo,
    inside_model_dir_error,
    inspect_model,
    load_model,
)
from tinybert_tf.pipeline import flags as tflags
from tinybert_tf.pipeline.preflight import task_head_errors
from tinybert_tf.pipeline.run.state import (
    STAGE_DONE,
    WORK_DIR,
    RunState,
    temporary_of,
    unfinished_stage_output,
)
from tinybert_tf.tasks import Task, TaskConfig, resolve_task
from tinybert_tf.tasks.catalog import is_known_task

tflags.define_export_tool_flags()
FLAGS = tflags.FLAGS
# The flags that define the task and its data (TaskConfig's fields).
TASK_FLAGS = tuple(f.name for f in dataclasses.fields(TaskConfig))


def run() -> dict:
    """Check the flags, the model and the task, then export with --output_dir locked."""
    plugins.load(FLAGS.plugins)  # their tasks and formats are as valid as ours
    if not FLAGS.model_dir:
        raise ExportError("--model_dir is required: the task model directory to export.")
    if not FLAGS.output_dir:
        raise ExportError("--output_dir is required: the export goes to OUTPUT/export/.")
    tflags.check_tool_ranges(FLAGS)
    if FLAGS.serving_model_name:  # before anything is written
        check_model_name(FLAGS.serving_model_name, "--serving_model_name")
    formats = check_formats(FLAGS.export_formats)
    serving_version = None
    if FLAGS["serving_version"].present:  # an explicit 0 is refused (the help says so)
        serving_version = check_version(FLAGS.serving_version, "--serving_version")
        for name in (f for f in formats if FORMATS[f].published):
            root = os.path.join(FLAGS.output_dir, "export", FORMATS[name].artefact)
            existing = list_versions(root)
            if serving_version in existing:
                raise ExportError(f"--serving_version={serving_version}: "
                                  f"{os.path.join(root, existing[serving_version])} exists and "
                                  "a published version is never rewritten (TF Serving may serve "
                                  "it); drop the flag to publish the next version "
                                  f"({max(existing) + 1}), or pick an unused number.")
            if existing and serving_version < max(existing):
                print(f"bin/export: warning: --serving_version={serving_version} is below "
                      f"{os.path.join(root, existing[max(existing)])}: TF Serving's default "
                      "version policy (latest) keeps serving that one. Drop the flag to "
                      f"publish {max(existing) + 1}, the next after it.", file=sys.stderr,
                      flush=True)
    for flag, path in (("--model_dir", FLAGS.model_dir),
                       ("--quantized_model_dir", FLAGS.quantized_model_dir)):
        unfinished = unfinished_stage_output(path) if path else None
        if unfinished:
            raise ExportError(f"{flag}={path}: {unfinished}")
    check_output_dir(FLAGS.output_dir, {"--model_dir": FLAGS.model_dir,
                                        "--quantized_model_dir": FLAGS.quantized_model_dir})
    try:
        info = inspect_model(FLAGS.model_dir)  # config and head, no weights: checks first
    except CheckpointError as e:
        raise ExportError(f"--model_dir={FLAGS.model_dir}: {e}") from e
    if info.head is None:  # before asking for --task, which would not help
        stage = info.metadata.get("stage")
        what = f"an encoder, the {stage} stage's output" if stage else "an encoder"
        raise ExportError(f"--model_dir={FLAGS.model_dir}: has no task head ({what}); "
                          "bin/export exports task models: give one, e.g. OUTPUT/task/model "
                          "(a general model is where task distillation starts: "
                          "bin/distill --general_model).")
    task = model_task(info)
    wrong = task_head_errors(info, task, "--model_dir") or label_errors(info, task)
    if wrong:
        raise ExportError(f"{wrong[0]} Pass the --task (and data flags) the model was "
                          "trained on; parity and metrics need its dev set.")
    max_seq_len = sequence_length(info, task)
    problems = format_problems(formats, info.config, info.head, _options())
    if problems:  # before anything is written (a published version stays published)
        raise ExportError(f"--model_dir={FLAGS.model_dir}: {' '.join(problems)}")
    with RunState(FLAGS.output_dir).lock() as lock:
        RunState(FLAGS.output_dir).clean_temporaries(before=lock.acquired_at,
                                                     entries=["export"])
        return _export(task, max_seq_len, formats, serving_version)


def check_output_dir(output_dir: str, models: dict[str, str]) -> None:
    """--output_dir is not in a model directory: the given ones (`models`: flag -> path)
    or any other (a run's fine-tuned teacher, say). The export would be written into it,
    and a pipeline that made that model would find it changed and train it again."""
    inside = next((f"{flag}={path}" for flag, path in models.items()
                   if path and files.isdir(path) and files.is_within(output_dir, path)), None)
    if inside:
        raise ExportError(f"--output_dir={output_dir}: inside {inside}; the export would be "
                          "written into the model directory (and a pipeline that made the "
                          "model would find it changed and train it again). Choose an "
                          "--output_dir outside it, e.g. the run's folder.")
    error = inside_model_dir_error(output_dir, "--output_dir")
    if error:
        raise ExportError(error)
    foreign = foreign_export_entries(os.path.join(output_dir, "export"))
    if foreign:
        raise ExportError(
            f"--output_dir={output_dir}: {os.path.join(output_dir, 'export')} holds "
            f"{', '.join(foreign[:4])}{' ...' if len(foreign) > 4 else ''}, which no export "
            "made: the export would write among them and delete what is named like a format "
            "not asked for. Choose an --output_dir whose export/ is new or an earlier "
            "export's.")


def foreign_export_entries(export_dir: str) -> list[str]:
    """The entries of OUTPUT/export that an export (bin/export's or the pipeline's) did not
    make: names other than a format's artefact, parity.json, the stage's records and the
    hidden temporaries of these, or a parity.json that is not an export's."""
    if not files.isdir(export_dir):
        return []
    ours = {fmt.artefact for fmt in FORMATS.values()} | {PARITY_FILE, STAGE_DONE, WORK_DIR}
    foreign = []
    for name in files.listdir(export_dir):
        if name not in ours and temporary_of(name) not in ours:
            foreign.append(name)
    parity = os.path.join(export_dir, PARITY_FILE)
    if files.isfile(parity):
        found = files.json_object(parity)
        if found is None or not isinstance(found.get("formats"), dict):
            foreign.append(PARITY_FILE)
    return foreign


def task_config(info: ModelInfo) -> TaskConfig:
    """--task and its data flags; without --task, the task the model records (a task
    model of bin/distill records it), never a default that may be another task's."""
    given = [f for f in TASK_FLAGS if FLAGS[f].present]
    recorded = info.metadata.get("task")
    if "task" in given or not recorded:
        if "task" not in given:
            raise ExportError(f"--task is required: {info.path} does not record the task it "
                              "was trained on; pass --task (and its data flags, e.g. "
                              "--data_dir or --train_file/--validation_file): parity and "
                              "metrics need its dev set.")
        return TaskConfig.from_flags(FLAGS)
    config = TaskConfig.from_record(recorded)
    # Data flags given explicitly override the recorded ones (e.g. the data moved).
    return dataclasses.replace(config, **{f: getattr(TaskConfig.from_flags(FLAGS), f)
                                          for f in given})


def model_task(info: ModelInfo) -> Task:
    """The task of `task_config`; a recorded task no module here registers is one a
    --plugins module of its training run registered: the error names that module."""
    config = task_config(info)
    if FLAGS["task"].present or is_known_task(config.task):
        return resolve_task(config)
    used = info.metadata.get("plugins") or []
    if used and not all(name in plugins.loaded() for name in used):
        fix = (f"pass --plugins={','.join(used)} as the training run did (each importable, "
               "e.g. on PYTHONPATH)")
    else:
        fix = ("pass --plugins with the module that registers it, as the training run did "
               "(bin/distill --plugins=...)")
    raise ExportError(f"--model_dir={info.path} was trained on --task={config.task}, which "
                      f"no module loaded here registers: {fix}.")


def label_errors(info: ModelInfo, task: Task) -> list[str]:
    """The model's label names must be the task's (in any order: exports follow the
    model's order)."""
    names = list(info.label_names or [])
    want = list(task.type.label_names)
    if task.type.named_outputs and names and sorted(names) != sorted(want):
        return [f"--model_dir={info.path} has the labels {names} but task {task.name} has "
                f"{want}."]
    return []


def sequence_length(info: ModelInfo, task: Task) -> int:
    """--max_seq_len, or the length the model was trained at (recorded), or the task's
    default; a length other than the trained one is allowed with a warning."""
    trained = info.metadata.get("max_seq_len")
    if FLAGS.max_seq_len:  # the length's own error first, not a warning before it
        seq_len_within(info.config, FLAGS.max_seq_len)
    if FLAGS.max_seq_len and trained and FLAGS.max_seq_len != trained:
        print(f"bin/export: warning: --max_seq_len={FLAGS.max_seq_len} but {info.path} was "
              f"trained at {trained}; texts are cut (or padded) to another length than in "
              f"training. Drop the flag to export at {trained}.", file=sys.stderr, flush=True)
    return task.max_seq_len(FLAGS.max_seq_len or trained or 0)


def _options() -> dict:
    return {"keras_hub_approximate_gelu": FLAGS.keras_hub_approximate_gelu}


def _export(task: Task, max_seq_len: int, formats: Sequence[str],
            serving_version: Optional[int]) -> dict:
    """Load the model and write every format (with --output_dir locked)."""
    try:
        model = load_model(FLAGS.model_dir)
    except CheckpointError as e:
        raise ExportError(f"--model_dir={FLAGS.model_dir}: {e}") from e
    quantized = None
    if FLAGS.quantized_model_dir:
        try:
            quantized = load_model(FLAGS.quantized_model_dir)
        except CheckpointError as e:
            raise ExportError(f"--quantized_model_dir={FLAGS.quantized_model_dir}: {e}") from e
    # Named by their flags here (export_all would say model= and quantized=).
    check_quantized(model, quantized, f"--model_dir={FLAGS.model_dir}",
                    f"--quantized_model_dir={FLAGS.quantized_model_dir}")

    def texts(examples):
        return [(ex.text_a, ex.text_b) if task.is_pair else ex.text_a for ex in examples]

    dev = task.examples(task.dev_splits[0])
    representative = None
    calibrated = [f for f in formats if FORMATS[f].calibrated]
    if calibrated:
        if FLAGS.representative_examples <= 0:
            raise ExportError(f"--representative_examples must be > 0 to export "
                              f"{', '.join(calibrated)} (or drop them from --export_formats).")
        representative = texts(task.examples("train")[:FLAGS.representative_examples])
    try:
        return export_all(ExportRequest(
            model, os.path.join(FLAGS.output_dir, "export"), max_seq_len=max_seq_len,
            formats=formats, dev_texts=texts(dev), dev_labels=[ex.label for ex in dev],
            representative_texts=representative, is_pair=task.is_pair, task=task.type,
            task_name=task.name,
            latency_runs=FLAGS.export_latency_runs,
            num_threads=FLAGS.export_threads or None,
            max_examples=FLAGS.export_max_examples or None,
            serving_name=FLAGS.serving_model_name or None,
            serving_version=serving_version, options=_options(), quantized=quantized))
    except ExportError as e:
        raise ExportError(f"--model_dir={FLAGS.model_dir}: {e}") from e


def main(argv: list[str]) -> int:
    """bin/export with its flags parsed: the exit code (tinybert_tf.cli.tool)."""
    logging.set_verbosity(logging.WARNING)
    return cli.guard("bin/export", run,
                     rerun="re-run the same command: it exports again")


def entry_point() -> None:
    """`bin/export`: the tool on sys.argv; exits with its code."""
    sys.exit(cli.run_tool("bin/export", main, sys.argv, FLAGS, __doc__))
