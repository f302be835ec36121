"""Checks run before any training, so a misconfigured multi-day job fails in seconds."""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Sequence

from tinybert_tf.config import ConfigError, get_config
from tinybert_tf.data import glue
from tinybert_tf.distill.distilbert import init_mismatch
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.flags import LOSS_TERMS, STAGES
from tinybert_tf.models.checkpoint import load_model

log = logging.getLogger("tinybert_tf")

# Free space asked for on top of the models' own size (checkpoints, logs, exports).
_DISK_MARGIN_BYTES = 256 * 2**20


class PreflightError(ValueError):
    """A check failed before training; the message names the flag and the fix."""


def resolve_stages(requested: Sequence[str], f: Any) -> list[str]:
    """`--stages` -> the ordered list to run. `all` drops the stages an ablation skips:
    general with --general_model, finetune_teacher with --task_teacher, augment with
    --nouse_augmented."""
    names = [s.strip() for s in requested if s.strip()]
    if names == ["all"]:
        out = list(STAGES)
        if f.general_model:
            out.remove("general")
        if f.task_teacher:
            out.remove("finetune_teacher")
        if not f.use_augmented:
            out.remove("augment")
        return out
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        raise PreflightError(f"--stages: unknown stage(s) {unknown}; use a comma list of "
                             f"{', '.join(STAGES)} or 'all'.")
    return [s for s in STAGES if s in names]


def _load_checked(path: str, what: str):
    model = load_model(path)
    if model.vocab is None:
        raise PreflightError(f"{what}={path}: the model directory has no vocab.txt.")
    return model


def run_preflight(ctx: Any, stages: Sequence[str]) -> list[str]:
    """Validate flags, models and disk for `stages`; return warnings (also logged)."""
    f, warnings = ctx.flags, []
    try:
        spec = glue.get_task(f.task)
    except ValueError as e:
        raise PreflightError(f"--task={f.task!r}: {e}") from e
    builds_student = "general" in stages or (f.general_model.lower() == "none"
                                              and "task" in stages)
    student_config = None
    if builds_student:
        try:
            student_config = get_config(f.student_config)
        except ConfigError as e:
            raise PreflightError(f"--student_config: {e}") from e
    bad_terms = [t for t in f.loss_terms if t not in LOSS_TERMS + ("trm",)]
    if bad_terms:
        raise PreflightError(f"--loss_terms: unknown {bad_terms}; use any of "
                             f"{', '.join(LOSS_TERMS)} or trm (= attn,hidn).")
    if f.recipe == "distilbert" and "general" in stages and f.student_config == "tinybert_4l_312d":
        warnings.append("--recipe=distilbert with the default --student_config; "
                        "configs/distilbert.cfg uses distilbert_6l.")

    teacher = None
    needs_teacher = ("general" in stages or "finetune_teacher" in stages
                     or (f.general_model.lower() == "none" and not f.task_teacher))
    if needs_teacher:
        teacher = _load_checked(f.teacher, "--teacher")
        _check_specials(teacher.vocab, "--teacher")
        if f.recipe == "distilbert" and "general" in stages and teacher.head_type != "mlm":
            raise PreflightError(f"--recipe=distilbert needs a teacher with an MLM head; "
                                 f"--teacher={f.teacher} has none. Use a BertForMaskedLM "
                                 "checkpoint or --recipe=tinybert.")
    if f.task_teacher and any(s in stages for s in ("task", "evaluate")):
        task_teacher = _load_checked(f.task_teacher, "--task_teacher")
        expected = 1 if spec.is_regression else len(spec.label_names)
        if task_teacher.num_labels != expected:
            raise PreflightError(
                f"--task_teacher={f.task_teacher} has {task_teacher.num_labels} outputs but "
                f"task {spec.name} has {expected} labels; give a teacher fine-tuned on it.")
        if teacher is not None and task_teacher.vocab != teacher.vocab:
            raise PreflightError("--task_teacher and --teacher use different vocabularies; "
                                 "the student can follow only one. Use teachers of one vocab.")
        teacher = teacher or task_teacher
    if teacher is not None and student_config is not None:
        try:
            layer_map(f.layer_mapping, student_config.num_layers, teacher.bert_config.num_layers)
        except ValueError as e:
            raise PreflightError(str(e)) from e
        if ((f.init_from_teacher or f.recipe == "distilbert") and "general" in stages
                and f.general_model.lower() != "none"):
            mismatch = init_mismatch(student_config, teacher.bert_config)
            if mismatch:
                field, s, t = mismatch
                what = "--init_from_teacher" if f.init_from_teacher else "--recipe=distilbert"
                raise PreflightError(
                    f"{what} copies teacher layers into the student, but "
                    f"--student_config={f.student_config} has {field}={s} and the teacher "
                    f"{t}; use a student of the teacher's width or drop the flag (random "
                    "initialisation).")
        if student_config.num_heads != teacher.bert_config.num_heads and "attn" in f.loss_terms:
            warnings.append(f"student has {student_config.num_heads} heads, teacher "
                            f"{teacher.bert_config.num_heads}: the attention loss compares "
                            "head-averaged maps.")
    if f.general_model and f.general_model.lower() != "none" and "task" in stages:
        student = _load_checked(f.general_model, "--general_model")
        if teacher is not None and student.vocab != teacher.vocab:
            raise PreflightError(f"--general_model={f.general_model} and the teacher use "
                                 "different vocabularies (or special-token ids); distil from "
                                 "a teacher with the student's vocab.txt.")
        if teacher is not None:
            try:
                layer_map(f.layer_mapping, student.bert_config.num_layers,
                          teacher.bert_config.num_layers)
            except ValueError as e:
                raise PreflightError(str(e)) from e
    if f.mlm_model and "augment" in stages:
        from tinybert_tf.augment import load_mlm_model
        mlm = load_mlm_model(f.mlm_model)  # refuses a checkpoint without a trained MLM head
        if teacher is not None and mlm.vocab != teacher.vocab:
            raise PreflightError(f"--mlm_model={f.mlm_model} has another vocabulary than the "
                                 "teacher; augmentation must tokenise as the task models do.")

    needed = _DISK_MARGIN_BYTES
    if teacher is not None:
        needed += 4 * 4 * sum(int(v.numpy().size) for v in teacher.weights)
    free = shutil.disk_usage(_existing_parent(ctx.state.output_dir)).free
    if free < needed:
        raise PreflightError(f"--output_dir={ctx.state.output_dir}: {free / 2**30:.2f} GiB "
                             f"free, about {needed / 2**30:.2f} GiB needed; free space or "
                             "choose another folder.")
    for w in warnings:
        log.warning(w)
        print(f"warning: {w}", flush=True)
    return warnings


def _check_specials(vocab: list[str], what: str) -> None:
    for tok in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        if tok not in vocab:
            raise PreflightError(f"{what}: vocab has no {tok}; BERT inputs need it.")


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return path
