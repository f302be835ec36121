"""The evaluate stage: dev metrics, params, FLOPs and latency of the teacher, the
student (and the int8 student) -> report.json, loss_curves.png (+ GLUE server files
with --glue_test_predictions)."""
from __future__ import annotations

from typing import Any

from tinybert_tf.data import glue_submission
from tinybert_tf.files import write_json_atomic
from tinybert_tf.models.checkpoint import load_model
from tinybert_tf.pipeline import autosize
from tinybert_tf.pipeline.run import report
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages.base import (
    TASK_DATA,
    TASK_LENGTH,
    TASK_TEACHER,
    TEACHER_VOCAB,
    Findings,
    Stage,
    makes_output,
)
from tinybert_tf.pipeline.stages.common import evaluator, load_task_teacher, model_path, task_data
from tinybert_tf.pipeline.training import evaluation

NAME = "evaluate"


def evaluate(ctx: Context) -> dict[str, Any]:
    r = ctx.config.run
    models = {"teacher": load_task_teacher(ctx), "student": load_model(ctx.student_path())}
    if makes_output("quantize", ctx.config):
        models["quantized_student"] = load_model(ctx.quantized_path())
    splits = ctx.task.dev_splits
    results: dict[str, Any] = {}
    for who, model in models.items():
        dev: dict[str, float] = {}
        for split in splits:
            prefix = "" if len(splits) == 1 else f"{split}_"
            # Prediction files: the student's in OUTPUT/evaluate/, the teacher's in teacher/.
            out = ctx.state.path("evaluate", *([who] if who != "student" else []),
                                 *([split] if prefix else [])) if ctx.chief else None
            metrics = evaluator(ctx, model, ctx.examples(split), out)()
            dev.update({prefix + k: v for k, v in metrics.items()})
        results[who] = {**evaluation.model_facts(model, ctx.max_seq_len), "dev": dev}
    # Teacher and student only: the int8 student's Keras simulation is not the int8
    # file (whose latency parity.json has), so timing it would cost runs for nothing.
    timed = {who: models[who] for who in ("teacher", "student")}
    latencies = evaluation.latencies_ms(timed, ctx.max_seq_len, r.latency_runs)
    for who, ms in latencies.items():
        results[who]["latency_ms"] = ms
    primary = ctx.task.type.primary_metric
    if len(splits) > 1:
        primary = f"{splits[0]}_{primary}"
    data = report.build_report(ctx.task.name, results["teacher"], results["student"], primary,
                               max_seq_len=ctx.max_seq_len,
                               quantized=results.get("quantized_student"))
    data["latency"] = evaluation.latency_conditions(r.latency_runs)
    data["models"] = {"teacher": ctx.teacher_path(), "student": ctx.student_path(),
                      **({"quantized_student": ctx.quantized_path()}
                         if "quantized_student" in models else {})}
    data.update(autosize.report_entry(ctx.state.output_dir))  # --student_config=auto
    grid = ctx.state.done_info("task").get("grid")
    if grid:  # every --pred_grid cell's best dev score, the selected one marked
        data["pred_grid"] = grid
    if ctx.chief and ctx.config.evaluate.glue_test_predictions:
        student = models["student"]
        data["glue_submission"] = glue_submission.write_submission(
            ctx.task.name, ctx.config.task.data_dir,
            ctx.state.path("evaluate", "glue_submission"),
            lambda examples: ctx.task.type.predict(student, examples, ctx.tokenizer,
                                                   ctx.max_seq_len, r.eval_batch_size))
    if ctx.chief:
        write_json_atomic(ctx.state.path("report.json"), data)
        report.plot_loss_curves(ctx.state.output_dir, ctx.state.path("loss_curves.png"))
        write_json_atomic(ctx.state.path("evaluate", "metrics.json"), data)
    print(report.summary_table(data), flush=True)
    return {"retained": data["ratios"]["retained"]}


def upstream(config: PipelineConfig) -> list[str]:
    """The teacher (unless --task_teacher), the student and the int8 student."""
    return [s for s in ("finetune_teacher", "task", "quantize")
            if s == "task" or makes_output(s, config)]


def checks(ctx: Context, found: Findings) -> None:
    """--glue_test_predictions: the task's GLUE test split is there to predict."""
    if ctx.config.evaluate.glue_test_predictions:
        errors, warnings = glue_submission.check(ctx.task.name, ctx.config.task.data_dir)
        found.errors.extend(errors)
        found.warnings.extend(warnings)


STAGE = Stage(
    NAME, evaluate,
    reads=lambda ctx: {"data": task_data(ctx),
                       "task_teacher": model_path(ctx.config.models.task_teacher)},
    outputs=lambda ctx: {ctx.state.path("report.json"): "exists",
                         ctx.state.path("loss_curves.png"): "exists",
                         ctx.state.path(NAME, "metrics.json"): "content"},
    upstream=upstream, chief_only=True, checks=checks,
    needs=frozenset({TASK_TEACHER, TEACHER_VOCAB, TASK_DATA, TASK_LENGTH}),
    artefacts=lambda ctx: [("report: dev metrics, size, speed", ctx.state.path("report.json")),
                           ("loss curves", ctx.state.path("loss_curves.png"))])
