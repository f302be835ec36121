#!/usr/bin/env python3
"""Score one more student beside a task's GLUE table: another shape, or another
initialisation, distilled with `bin/distill` from the same teacher.

  .venv/bin/python benchmarks/glue_student.py --task=SST-2 --data_dir=DATA \
      --teacher=TEACHER/finetune_teacher/model --student_dir=RUN \
      [--finetuned_dir=RUN_NO_KD] --name=tinybert_4l_312d \
      --results_dir=benchmarks/results/glue/seed1

RUN is a `bin/distill` output folder that went through the task stage (its
`task/model` is scored); RUN_NO_KD, if given, holds the same student fine-tuned
without a teacher (`--task_phases=finetune --nouse_augmented`). Writes, under
--results_dir, the student's (and its no-KD twin's) dev and GLUE-test predictions
(`<name>/<Task>.tsv`, `<name>/dev/<Task>.tsv`) and `<name>.json`: dev metrics, sizes,
FLOPs, batch-1 TFLite float32 latency against the teacher's, timed interleaved with
the same thread count as benchmarks/glue.py's table, and paired dev comparisons
(glue_paired.py) against its no-KD twin, the table's teacher (its `teacher/`
predictions, which this script does not write) and the table's student. With
--int8_name, RUN's int8 TFLite file is scored too, against RUN's own float student,
the table's float student and the table's int8 file: what quantizing RUN's student
loses, and how a quantize stage run with other settings on a copy of the table's run
compares. Test labels are never read.
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
from glue_meta import PRIMARY, check_teacher_labels, commit, host  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("task", None, "GLUE task name (SST-2, MRPC, RTE).")
flags.DEFINE_string("data_dir", None, "The task's folder in the GLUE TSV layout.")
flags.DEFINE_string("teacher", None, "The fine-tuned teacher's model directory.")
flags.DEFINE_string("student_dir", None, "The student's bin/distill output folder.")
flags.DEFINE_string("finetuned_dir", "", "The same student fine-tuned without a teacher "
                    "(a bin/distill output folder); empty: not scored.")
flags.DEFINE_string("name", None, "The student's name in the results (a folder name).")
flags.DEFINE_string("int8_name", "", "Also score RUN's int8 TFLite file "
                    "(export/model_int8.tflite) under this name, paired against "
                    "RUN's float student, the table's float student and its int8 file (e.g. "
                    "tinybert_int8_qat_tflite for a quantize stage that trained the "
                    "weights); empty: not scored.")
flags.DEFINE_string("results_dir", os.path.join(ROOT, "benchmarks", "results", "glue"),
                    "Where the predictions and <name>.json go.")
flags.DEFINE_string("glue_dir", os.path.join(ROOT, "..", "shared", "data", "glue"),
                    "The GLUE folder whose <task>/dev.tsv the paired comparisons read.")
flags.DEFINE_multi_string("command", [], "A bin/distill command that made the models, "
                         "recorded in the JSON as given; once per command.")
for _name in ("task", "data_dir", "teacher", "student_dir", "name"):
    flags.mark_flag_as_required(_name)
# The table's own models (the names of glue_results.MODEL_ROWS, written out because
# importing glue_results starts TensorFlow): a student named like one would overwrite
# its predictions.
TABLE_MODELS = ("teacher", "tinybert", "tinybert_int8_tflite", "tinybert_dynamic_int8_tflite",
                "finetuned_no_kd", "tfidf_logreg")
# The export stage's int8 TFLite file (export/tflite.py tflite_file("int8"), written out
# for the same reason: a missing one is refused before TensorFlow starts).
INT8_FILE = "model_int8.tflite"
flags.register_validator("name", lambda n: n not in TABLE_MODELS,
    "--name: the table's models use that name already (their predictions would be "
    "overwritten); name the student by its shape, e.g. --name=tinybert_4l_312d.")
flags.register_validator("int8_name", lambda n: n not in TABLE_MODELS,
    "--int8_name: the table's models use that name already (their predictions would "
    "be overwritten); e.g. --int8_name=tinybert_int8_qat_tflite.")


def main(argv: list[str]) -> None:
    del argv
    # What the flags name is checked before TensorFlow starts: a wrong path costs seconds.
    path = os.path.join(FLAGS.results_dir, f"{FLAGS.name}.json")
    if os.path.isfile(path):
        with open(path) as f:
            other = json.load(f).get("task")
        if other != FLAGS.task:
            raise SystemExit(f"benchmarks/glue_student.py: {path} holds --name={FLAGS.name} "
                             f"on {other}, which this {FLAGS.task} run would overwrite; give "
                             f"another --name (e.g. --name={FLAGS.name}_{FLAGS.task.lower()}"
                             ") or another --results_dir.")
    int8_path = os.path.join(FLAGS.student_dir, "export", INT8_FILE)
    if FLAGS.int8_name and not os.path.isfile(int8_path):
        raise SystemExit(f"benchmarks/glue_student.py: --int8_name: {int8_path} does not "
                         "exist; run the student's quantize and export stages first "
                         "(bin/distill ... --stages=quantize,export).")
    import glue_paired
    import glue_results as gr  # TensorFlow starts here

    check_teacher_labels(FLAGS.teacher, FLAGS.task, "--teacher", "benchmarks/glue_student.py")
    task = gr.resolve_task(gr.TaskConfig(task=FLAGS.task, data_dir=FLAGS.data_dir))
    max_seq_len = task.max_seq_len(0)
    teacher = gr.load_model(FLAGS.teacher)
    student = gr.load_model(os.path.join(FLAGS.student_dir, "task", "model"))
    tokenizer = gr.load_tokenizer(FLAGS.teacher, max_seq_len)
    predictor = gr.Predictor(FLAGS.task, task, tokenizer, max_seq_len, FLAGS.results_dir)
    primary = PRIMARY[FLAGS.task]
    models = {
        # Scored, not written: teacher/ holds the table's teacher's predictions.
        "teacher": {**gr.facts(teacher, max_seq_len), "dev": predictor.keras_dev(teacher)},
        FLAGS.name: {**gr.facts(student, max_seq_len),
                     "dev": predictor.keras(FLAGS.name, student)},
    }
    if FLAGS.finetuned_dir:
        finetuned = gr.load_model(os.path.join(FLAGS.finetuned_dir, "task", "model"))
        models[f"{FLAGS.name}_no_kd"] = {**gr.facts(finetuned, max_seq_len),
                                         "dev": predictor.keras(f"{FLAGS.name}_no_kd",
                                                                finetuned)}
    timed = {"teacher": gr.tflite.convert(teacher, "float32", max_seq_len, metadata=False),
             FLAGS.name: gr.tflite.convert(student, "float32", max_seq_len, metadata=False)}
    if FLAGS.int8_name:
        models[FLAGS.int8_name] = {"dev": predictor.tflite(FLAGS.int8_name, int8_path,
                                                           student.label_names)}
        timed[FLAGS.int8_name] = int8_path
    lat = gr.latencies(timed, max_seq_len)
    for who in timed:
        kind = "int8" if who == FLAGS.int8_name else "float32"
        models[who][f"latency_ms_tflite_{kind}"] = lat[who]
    t_score, s_score = models["teacher"]["dev"][primary], models[FLAGS.name]["dev"][primary]
    out = {"task": FLAGS.task, "primary_metric": primary, "max_seq_len": max_seq_len,
           "models": models, "retained": round(s_score / t_score, 4) if t_score else None,
           "teacher_over_student_tflite": round(lat["teacher"] / lat[FLAGS.name], 2),
           "threads": gr.THREADS, "pipeline_seconds": {
               who: gr.seconds(d) for who, d in (
                   (FLAGS.name, FLAGS.student_dir), (f"{FLAGS.name}_no_kd", FLAGS.finetuned_dir))
               if d},
           "host": host(), "commit": commit(), "commands": FLAGS.command}
    # Paired over dev: against its no-KD twin, the teacher, and the table's student.
    pairs = [f"{FLAGS.name}:{FLAGS.name}_no_kd", f"{FLAGS.name}:teacher",
             f"tinybert:{FLAGS.name}"]
    if FLAGS.int8_name:
        pairs += [f"{FLAGS.int8_name}:{FLAGS.name}", f"{FLAGS.int8_name}:tinybert",
                  f"{FLAGS.int8_name}:tinybert_int8_tflite"]
    out["paired"] = glue_paired.task_pairs(FLAGS.task, out, FLAGS.glue_dir, FLAGS.results_dir,
                                           pairs)
    os.makedirs(FLAGS.results_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    print(json.dumps({k: v["dev"] for k, v in models.items()}, indent=1))
    print(f"{path}: student keeps {100 * out['retained']:.1f}% of the teacher, "
          f"{out['teacher_over_student_tflite']}x faster (TFLite float32, batch 1)")


if __name__ == "__main__":
    app.run(main)
