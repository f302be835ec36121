#!/usr/bin/env python3
"""Score another TFLite flavour of a GLUE table's float student beside its int8 file.

  .venv/bin/python benchmarks/glue_flavour.py --task=MRPC --student_dir=RUN \
      --results_dir=benchmarks/results/glue/minilm_3l_ffn768/seed42 [--format=dynamic_int8]

RUN is the `bin/distill` output folder whose student the table scored (glue.py's
`<work_dir>/<Task>/tinybert`): its `task/model` is converted to --format (as the
export stage converts it) and its `export/model_int8.tflite` is the table's int8 file.
Adds to the task's entry in --results_dir's results.json the model
`tinybert_<format>_tflite`: its dev metrics (its dev and GLUE-test predictions are
written beside the table's, `<model>/dev/<Task>.tsv`, `<model>/<Task>.tsv`) and its
batch-1 latency, timed interleaved with the float32 student and the int8 file (the
table's thread count); then the paired comparisons against the float student and the
int8 file; results.md is written again from results.json. The table's own figures are
not touched. Test labels are never read. (benchmarks/glue.py scores the dynamic int8
file itself; this script adds it to tables made before it did.)

It answers: where the integer-only int8 file loses more than a point of the float
student's score, does a file with int8 weights and float activations keep it, and at
what speed?
"""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # glue_meta, glue_results

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

from absl import app, flags  # noqa: E402
from glue_meta import PRIMARY, commit, host  # noqa: E402

FLAGS = flags.FLAGS
# Flavours of the float student: the integer-only int8 file is the table's own, made
# from the quantize stage's student, so it is not one of these.
FORMATS = ("dynamic_int8", "float16")
flags.DEFINE_enum("task", None, sorted(PRIMARY), "GLUE task name.")
flags.DEFINE_string("student_dir", None, "The bin/distill output folder of the table's "
                    "student (its task/model and export/model_int8.tflite).")
flags.DEFINE_string("results_dir", None, "The table's folder: its results.json gets "
                    "the model, the predictions go beside the table's.")
flags.DEFINE_enum("format", "dynamic_int8", FORMATS, "The TFLite flavour to score.")
flags.DEFINE_string("glue_dir", os.path.join(ROOT, "..", "shared", "data", "glue"),
                    "The GLUE folder with <task>/dev.tsv and test.tsv.")
for _name in ("task", "student_dir", "results_dir"):
    flags.mark_flag_as_required(_name)


def model_name(fmt: str) -> str:
    return f"tinybert_{fmt}_tflite"


def main(argv: list[str]) -> None:
    del argv
    # What the flags name is checked before TensorFlow starts (a few seconds).
    path = os.path.join(FLAGS.results_dir, "results.json")
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
        entry = results["tasks"][FLAGS.task]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"benchmarks/glue_flavour.py: --results_dir: {path} holds no "
                         f"{FLAGS.task} table of benchmarks/glue.py ({type(e).__name__}: {e}); "
                         "run benchmarks/glue.py for the task first.") from None
    student_path = os.path.join(FLAGS.student_dir, "task", "model")
    if not os.path.isdir(student_path):
        raise SystemExit(f"benchmarks/glue_flavour.py: --student_dir: {student_path} (the "
                         "float student) does not exist; give the table's run folder "
                         f"(<work_dir>/{FLAGS.task}/tinybert of benchmarks/glue.py).")
    import glue_paired
    import glue_results as gr  # TensorFlow starts here

    int8_path = os.path.join(FLAGS.student_dir, "export", gr.tflite.tflite_file("int8"))
    if not os.path.isfile(int8_path):
        raise SystemExit(f"benchmarks/glue_flavour.py: --student_dir: {int8_path} (the "
                         "table's int8 file) does not exist; give the table's run folder.")
    data_dir = os.path.join(FLAGS.glue_dir, FLAGS.task)
    task = gr.resolve_task(gr.TaskConfig(task=FLAGS.task, data_dir=data_dir))
    max_seq_len = task.max_seq_len(0)
    if max_seq_len != entry.get("max_seq_len"):
        raise SystemExit(f"benchmarks/glue_flavour.py: the table scored {FLAGS.task} at "
                         f"sequence length {entry.get('max_seq_len')}, the task reads "
                         f"{max_seq_len} here.")
    student = gr.load_model(student_path)
    primary = entry["primary_metric"]
    # The float student scored again here must be the table's: same model, same dev set.
    table_score = entry["models"]["tinybert"]["dev"][primary]
    tokenizer = gr.load_tokenizer(student_path, max_seq_len)
    predictor = gr.Predictor(FLAGS.task, task, tokenizer, max_seq_len, FLAGS.results_dir)
    score = predictor.keras_dev(student)[primary]
    if abs(score - table_score) > 1e-9:
        raise SystemExit(f"benchmarks/glue_flavour.py: --student_dir's student scores "
                         f"{score:.4f} {primary} on dev, the table's {table_score:.4f}: "
                         "not the table's student; give the run folder that made it.")
    name = model_name(FLAGS.format)
    with gr.flavour_file(student, FLAGS.format, max_seq_len, task) as tmp:
        dev = predictor.tflite(name, tmp, student.label_names)
        size = os.path.getsize(tmp)
        lat = gr.latencies({"float32": gr.tflite.convert(student, "float32", max_seq_len,
                                                         metadata=False),
                            "int8": int8_path, FLAGS.format: tmp}, max_seq_len)
    entry["models"][name] = {
        "dev": dev, "size_bytes": size,
        f"latency_ms_tflite_{FLAGS.format}": lat[FLAGS.format],
        "latency_interleaved_with": {"tinybert_tflite_float32": lat["float32"],
                                     "tinybert_int8_tflite": lat["int8"]},
        "threads": gr.THREADS, "host": host(), "commit": commit(),
        "command": " ".join(["benchmarks/glue_flavour.py"] + sys.argv[1:])}
    pairs = [f"{name}:tinybert", f"{name}:tinybert_int8_tflite"]
    entry.setdefault("paired", {}).update(glue_paired.task_pairs(
        FLAGS.task, entry, FLAGS.glue_dir, FLAGS.results_dir, pairs))
    glue_paired.write_table(FLAGS.results_dir, results)
    diff = 100 * (dev[primary] - table_score)
    int8_score = 100 * entry["models"]["tinybert_int8_tflite"]["dev"][primary]
    print(f"{FLAGS.task} {name}: dev {primary} {100 * dev[primary]:.1f} ({diff:+.1f} against "
          f"the float student, int8 file {int8_score:.1f}); "
          f"batch 1: {lat[FLAGS.format]:.2f} ms, float32 {lat['float32']:.2f}, int8 "
          f"{lat['int8']:.2f} ({path})")


if __name__ == "__main__":
    app.run(main)
