"""Every check before the first training step, and the resolved plan of the run.

A misconfigured multi-day job fails in seconds: flag ranges, the task's data,
the models' configs and vocabularies (read without their weights), layer
mappings, sequence lengths against position tables, batch splits, export
formats, the stages a stage reads, and free disk. `check(ctx, stages)`
gathers EVERY problem and returns the plan (`bin/distill --dry_run` prints
it) or raises one `PreflightError` listing them all.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from typing import Any, Callable, Optional, Sequence

from tinybert_tf.config import BertConfig, ConfigError, get_config
from tinybert_tf.data.examples import DataError
from tinybert_tf.distill.distilbert import init_mismatch
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.terms import layer_weights, resolve_names
from tinybert_tf.export.formats import check_formats
from tinybert_tf.models.checkpoint import CheckpointError, ModelInfo, inspect_model
from tinybert_tf.models.labels import label_order
from tinybert_tf.pipeline import stages as S
from tinybert_tf.pipeline.configs import PipelineConfig
from tinybert_tf.tokenizer import SPECIAL_TOKENS

log = logging.getLogger("tinybert_tf")

# Free space asked for on top of the models' own size (checkpoints, logs, exports).
_DISK_MARGIN_BYTES = 256 * 2**20


class PreflightError(ValueError):
    """Checks failed before training; the message lists each with its flag and fix."""

    def __init__(self, errors: Sequence[str]):
        self.errors = list(errors)
        super().__init__(self.errors[0] if len(self.errors) == 1 else
                         f"{len(self.errors)} problems:\n  - " + "\n  - ".join(self.errors))


def resolve_stages(requested: Sequence[str], config: PipelineConfig) -> list[str]:
    """`--stages` -> the ordered list to run. `all` drops the stages an ablation skips:
    general with --general_model, finetune_teacher with --task_teacher, augment with
    --nouse_augmented."""
    names = [s.strip() for s in requested if s.strip()]
    if names == ["all"]:
        m = config.models
        skip = {"general": bool(m.general_model), "finetune_teacher": bool(m.task_teacher),
                "augment": not config.distill.use_augmented}
        return [s for s in S.STAGES if not skip.get(s)]
    unknown = [s for s in names if s not in S.STAGES]
    if unknown or not names:
        raise PreflightError([f"--stages: unknown stage(s) {unknown}; use a comma list of "
                              f"{', '.join(S.STAGES)} or 'all'."])
    return [s for s in S.STAGES if s in names]


# --- flag ranges -------------------------------------------------------------------------

def _ranges(c: PipelineConfig) -> list[tuple[str, Any, Callable[[Any], bool], str]]:
    """(flag, value, ok, what is allowed) for every numeric flag."""
    pos, nonneg = (lambda v: v > 0), (lambda v: v >= 0)
    g, f, d, a, r, o = c.general, c.finetune, c.distill, c.augment, c.run, c.optim
    return [
        ("--general_batch_size", g.batch_size, pos, "> 0"),
        ("--teacher_batch_size", f.batch_size, pos, "> 0"),
        ("--task_batch_size", d.batch_size, pos, "> 0"),
        ("--eval_batch_size", r.eval_batch_size, pos, "> 0"),
        ("--augment_batch_size", r.augment_batch_size, pos, "> 0"),
        ("--general_epochs", g.epochs, nonneg, ">= 0"),
        ("--teacher_epochs", f.epochs, nonneg, ">= 0"),
        ("--intermediate_epochs", d.intermediate_epochs, nonneg, ">= 0"),
        ("--pred_epochs", d.pred_epochs, nonneg, ">= 0"),
        ("--general_max_steps", g.max_steps, nonneg, ">= 0 (0 = no limit)"),
        ("--task_max_steps", d.max_steps, nonneg, ">= 0 (0 = no limit)"),
        ("--general_lr", g.lr, pos, "> 0"), ("--teacher_lr", f.lr, pos, "> 0"),
        ("--intermediate_lr", d.intermediate_lr, pos, "> 0"), ("--pred_lr", d.pred_lr, pos, "> 0"),
        ("--general_warmup", g.warmup, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--warmup_proportion", o.warmup_proportion, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--weight_decay", o.weight_decay, nonneg, ">= 0"),
        ("--clip_norm", o.clip_norm, nonneg, ">= 0 (0 = off)"),
        ("--grad_accum_steps", o.grad_accum_steps, pos, ">= 1"),
        ("--temperature", c.loss.temperature, pos, "> 0"),
        ("--distil_temperature", g.distil_temperature, pos, "> 0"),
        ("--hard_label_weight", c.loss.hard_label_weight, nonneg, ">= 0"),
        ("--checkpoint_every", r.checkpoint_every, pos, ">= 1"),
        ("--keep_checkpoints", r.keep_checkpoints, pos, ">= 1"),
        ("--eval_every", d.eval_every, nonneg, ">= 0 (0 = once per epoch)"),
        ("--latency_runs", r.latency_runs, pos, ">= 1"),
        ("--export_latency_runs", r.export_latency_runs, pos, ">= 1"),
        ("--export_threads", r.export_threads, nonneg, ">= 0 (0 = all cores)"),
        ("--export_max_examples", r.export_max_examples, nonneg, ">= 0 (0 = all)"),
        ("--representative_examples", c.export.representative_examples, nonneg, ">= 0"),
        ("--num_aug", a.num_aug, pos, ">= 1"),
        ("--replace_prob", a.replace_prob, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--num_candidates", a.num_candidates, pos, ">= 1"),
        ("--vector_vocab_limit", a.vector_vocab_limit, nonneg, ">= 0 (0 = all)"),
        ("--max_seq_len", c.task.max_seq_len, nonneg, ">= 0 (0 = the task's default)"),
        ("--general_max_seq_len", g.max_seq_len, lambda v: v >= 4, ">= 4"),
        ("--seed", c.numerics.seed, nonneg, ">= 0"),
    ]


# --- the checks ------------------------------------------------------------------------------

@dataclasses.dataclass
class _Checks:
    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def run(self, fn: Callable[[], Any], prefix: str = "") -> Any:
        """fn(), recording its error (ours are ValueErrors naming the flag) instead of raising."""
        try:
            return fn()
        except PreflightError as e:
            self.errors.extend(prefix + m for m in e.errors)
        except (ValueError, ConfigError, CheckpointError, DataError, OSError) as e:
            self.errors.append(prefix + str(e))
        return None


def _model(checks: _Checks, path: str, flag: str) -> Optional[ModelInfo]:
    info = checks.run(lambda: inspect_model(path), f"{flag}={path}: ")
    if info is None:
        return None
    if info.vocab is None:
        checks.errors.append(f"{flag}={path}: the model directory has no vocab.txt.")
        return None
    missing = [t for t in SPECIAL_TOKENS if t not in info.vocab]
    if missing:
        checks.errors.append(f"{flag}={path}: vocab.txt lacks {missing}; BERT inputs need them.")
    return info


def check(ctx: S.Context, stages: Sequence[str], count_corpus: bool = False
          ) -> dict[str, Any]:
    """Every check for running `stages`; returns the plan (see module doc).

    count_corpus: count the general corpus for the plan's steps even when no
    count is cached (the dry run does; a real run counts at the stage's start).
    """
    c, checks = ctx.config, _Checks()
    for flag, value, ok, allowed in _ranges(c):
        if not ok(value):
            checks.errors.append(f"{flag}={value}: must be {allowed}.")
    m = c.models
    needs = set(stages)
    plan: dict[str, Any] = {"output_dir": ctx.state.output_dir, "stages": list(stages),
                            "replicas": ctx.replicas, "task": ctx.task.describe()}

    # Models, read without weights.
    teacher = None
    if needs & {"general", "finetune_teacher", "augment"} or (m.random_student and "task" in needs
                                                             and not m.task_teacher):
        teacher = _model(checks, m.teacher, "--teacher")
    task_teacher = None
    if m.task_teacher and needs & {"task", "evaluate", "augment"}:
        task_teacher = _model(checks, m.task_teacher, "--task_teacher")
        if task_teacher is not None:
            _check_task_head(checks, task_teacher, ctx, "--task_teacher", plan)
    if teacher is not None and task_teacher is not None and teacher.vocab != task_teacher.vocab:
        checks.errors.append("--task_teacher and --teacher use different vocabularies; the "
                             "student can follow only one. Use teachers of one vocab.")
    if m.teacher_label_order and not m.task_teacher:
        checks.errors.append("--teacher_label_order describes the outputs of --task_teacher, "
                             "which is not given (the finetune_teacher stage names its "
                             "labels itself); drop the flag or give --task_teacher.")
    vocab_model = task_teacher or teacher
    student_cfg: Optional[BertConfig] = None
    if "general" in needs or (m.random_student and "task" in needs):
        student_cfg = checks.run(lambda: get_config(m.student_config), "--student_config: ")
    general_model = None
    if m.general_model and not m.random_student and "task" in needs:
        general_model = _model(checks, m.general_model, "--general_model")
        if general_model is not None and vocab_model is not None \
                and general_model.vocab != vocab_model.vocab:
            checks.errors.append(f"--general_model={m.general_model} and the teacher use "
                                 "different vocabularies (or special-token ids); distil from a "
                                 "teacher with the student's vocab.txt.")
    if "general" in needs and teacher is not None:
        if c.general.distilbert and teacher.head != "mlm":
            checks.errors.append(f"--recipe=distilbert needs a teacher with an MLM head; "
                                 f"--teacher={m.teacher} has none. Use a BertForMaskedLM "
                                 "checkpoint or --recipe=tinybert.")
        if student_cfg is not None and (m.init_from_teacher or c.general.distilbert):
            mismatch = init_mismatch(student_cfg, teacher.config)
            if mismatch:
                field, s, t = mismatch
                what = "--init_from_teacher" if m.init_from_teacher else "--recipe=distilbert"
                checks.errors.append(
                    f"{what} copies teacher layers into the student, but --student_config="
                    f"{m.student_config} has {field}={s} and the teacher {t}; use a student of "
                    "the teacher's width or drop the flag (random initialisation).")
    # Loss terms and layer maps against the models they will join.
    checks.run(lambda: resolve_names(c.loss.loss_terms))
    pairs = []
    if "general" in needs and student_cfg is not None and teacher is not None:
        pairs.append((student_cfg, teacher.config))
    if "task" in needs and vocab_model is not None:
        s_cfg = student_cfg if m.random_student else (
            general_model.config if general_model is not None else None)
        if s_cfg is not None:
            pairs.append((s_cfg, vocab_model.config))
    for s_cfg, t_cfg in pairs:
        checks.run(lambda: layer_map(c.loss.layer_mapping, s_cfg.num_layers, t_cfg.num_layers))
        checks.run(lambda: layer_weights(c.loss.lambdas, s_cfg.num_layers))
        if s_cfg.num_heads != t_cfg.num_heads and "attn" in resolve_safe(c.loss.loss_terms):
            checks.warnings.append(f"student has {s_cfg.num_heads} heads, teacher "
                                   f"{t_cfg.num_heads}: the attention loss compares "
                                   "head-averaged maps.")
    # Sequence lengths against position tables.
    for info, flag in ((teacher, "--teacher"), (task_teacher, "--task_teacher"),
                       (general_model, "--general_model")):
        if info is None:
            continue
        limit = info.config.max_position_embeddings
        if ctx.max_seq_len > limit and needs & {"finetune_teacher", "task", "evaluate", "export"}:
            checks.errors.append(f"--max_seq_len={ctx.max_seq_len} exceeds {flag}'s "
                                 f"max_position_embeddings={limit}; lower --max_seq_len.")
        if flag == "--teacher" and "general" in needs and c.general.max_seq_len > limit:
            checks.errors.append(f"--general_max_seq_len={c.general.max_seq_len} exceeds the "
                                 f"teacher's max_position_embeddings={limit}.")
    if student_cfg is not None:
        limit = student_cfg.max_position_embeddings
        if "general" in needs and c.general.max_seq_len > limit:
            checks.errors.append(f"--general_max_seq_len={c.general.max_seq_len} exceeds "
                                 f"--student_config's max_position_embeddings={limit}.")
        if "task" in needs and m.random_student and ctx.max_seq_len > limit:
            checks.errors.append(f"--max_seq_len={ctx.max_seq_len} exceeds --student_config's "
                                 f"max_position_embeddings={limit}.")
    # Augmentation inputs.
    if "augment" in needs:
        _check_augment(checks, ctx, vocab_model)
    if "export" in needs:
        checks.run(lambda: check_formats(c.export.formats))
    # Data and phases.
    plan["phases"] = _phases(checks, ctx, needs, count_corpus)
    # What each stage reads must be there (or come first in this run).
    for stage in stages:
        for up in S.upstream(stage, c):
            if up not in stages and not ctx.state.is_done(up):
                checks.errors.append(
                    f"--stages={','.join(stages)}: {stage} reads the output of {up}, which "
                    f"is not in {ctx.state.path(up)}; add {up} to --stages (or give "
                    + _explicit_flag(up) + ").")
    # Disk.
    needed = _DISK_MARGIN_BYTES + (16 * teacher.num_weights() if teacher is not None else 0)
    free = shutil.disk_usage(_existing_parent(ctx.state.output_dir)).free
    if free < needed:
        checks.errors.append(f"--output_dir={ctx.state.output_dir}: {free / 2**30:.2f} GiB "
                             f"free, about {needed / 2**30:.2f} GiB needed; free space or "
                             "choose another folder.")
    plan["models"] = {name: _describe(info) for name, info in
                      (("teacher", teacher), ("task_teacher", task_teacher),
                       ("general_model", general_model)) if info is not None}
    if student_cfg is not None:
        plan["models"]["student_config"] = student_cfg.to_dict()
    plan["warnings"] = checks.warnings
    if checks.errors:
        raise PreflightError(checks.errors)
    for w in checks.warnings:
        log.warning(w)
        print(f"warning: {w}", flush=True)
    return plan


def resolve_safe(names) -> tuple[str, ...]:
    try:
        return resolve_names(names)
    except ValueError:
        return ()


def _explicit_flag(stage: str) -> str:
    return {"general": "--general_model=DIR", "finetune_teacher": "--task_teacher=DIR",
            "augment": "--nouse_augmented", "task": "a finished task stage"}.get(stage, stage)


def _describe(info: ModelInfo) -> dict[str, Any]:
    c = info.config
    return {"path": info.path, "format": info.format, "head": info.head,
            "labels": info.label_names, "layers": c.num_layers, "hidden_size": c.hidden_size,
            "heads": c.num_heads, "vocab_size": c.vocab_size, "lower_case": c.lower_case}


def _check_task_head(checks: _Checks, info: ModelInfo, ctx: S.Context, flag: str,
                     plan: dict[str, Any]) -> None:
    want = ctx.task.type
    if info.head != want.head:
        checks.errors.append(f"{flag}={info.path} has head {info.head!r} but task "
                             f"{ctx.task.name} needs a {want.head} head; give a teacher "
                             "fine-tuned on it.")
    elif info.num_labels != want.num_outputs:
        checks.errors.append(
            f"{flag}={info.path} has {info.num_labels} outputs but task {ctx.task.name} has "
            f"{want.num_outputs} labels; give a teacher fine-tuned on it.")
    elif want.named_outputs:
        order = checks.run(lambda: label_order(
            list(ctx.config.models.teacher_label_order) or info.label_names,
            want.label_names, f"{flag}={info.path}"))
        if order is not None:
            plan["teacher_label_mapping"] = {n: i for n, i in zip(want.label_names, order)}


def _check_augment(checks: _Checks, ctx: S.Context, vocab_model: Optional[ModelInfo]) -> None:
    a = ctx.config.augment
    missing = [f for f, v in (("--mlm_model", a.mlm_model), ("--word_vectors", a.word_vectors))
               if not v]
    if missing and not a.augment_fallback:
        checks.errors.append(
            f"augment: Algorithm 1 needs {' and '.join(missing)}: a BERT with an MLM head "
            "(e.g. the pre-trained bert-base-uncased directory) for single-piece words and "
            "GloVe vectors (e.g. glove.840B.300d.txt) for the rest. Give them, or set "
            "--augment_fallback to use word vectors trained on --corpus for every word (weak; "
            "the demo does this), or --nouse_augmented.")
    if a.mlm_model:
        info = _model(checks, a.mlm_model, "--mlm_model")
        if info is not None and info.head != "mlm":
            checks.errors.append(f"--mlm_model={a.mlm_model}: the checkpoint has no MLM head "
                                 f"(head: {info.head}); give a BertForMaskedLM / keras-hub "
                                 "BertMaskedLM / our MLM directory.")
        if info is not None and vocab_model is not None and info.vocab != vocab_model.vocab:
            checks.errors.append(f"--mlm_model={a.mlm_model} has another vocabulary than the "
                                 "teacher; augmentation must tokenise as the task models do.")
    if a.word_vectors and not os.path.isfile(a.word_vectors):
        checks.errors.append(f"--word_vectors={a.word_vectors}: file not found.")
    checks.run(lambda: ctx.task.source.augment_table(), "augment: ")


def _phases(checks: _Checks, ctx: S.Context, needs: set, count_corpus: bool
            ) -> list[dict[str, Any]]:
    """Each training phase's spec (checked), reading the data it trains on."""
    specs = []
    if "general" in needs:
        count = None
        if count_corpus:
            count = checks.run(lambda: S.corpus_sequences(ctx))
        else:
            checks.run(lambda: S.corpus_lib.source_facts(S._corpus_source(ctx)), "--corpus: ")
        if count is not None:
            specs.append(checks.run(lambda: S.general_phase(ctx, count)))
    if needs & {"finetune_teacher", "task", "evaluate", "export", "augment"}:
        train = checks.run(lambda: ctx.examples("train"), "")
        dev = checks.run(lambda: ctx.examples(ctx.task.dev_splits[0]), "")
        n_train = checks.run(lambda: S.rows(ctx, train)) if train is not None else None
        if n_train is not None and "finetune_teacher" in needs:
            specs.append(checks.run(lambda: S.finetune_phase(ctx, n_train)))
        if "task" in needs and n_train is not None:
            d = ctx.config.distill
            size = n_train
            if d.use_augmented:
                aug = (checks.run(lambda: ctx.examples("train_aug"))
                       if ctx.state.is_done("augment") else None)
                # Not augmented yet: N_a + 1 rows per example at most.
                size = checks.run(lambda: S.rows(ctx, aug)) if aug is not None else None
            note = ("" if size is not None else "the augmented set is not written yet: sizes "
                    f"and steps assume the {n_train} original rows; augmentation adds "
                    f"up to {ctx.config.augment.num_aug} variants each")
            phases = []
            if d.intermediate:
                phases.append(checks.run(lambda: S.intermediate_phase(ctx, size or n_train)))
            original = S.prediction_on_original(ctx)
            phases.append(checks.run(lambda: S.prediction_phase(
                ctx, n_train if original else (size or n_train))))
            for i, spec in enumerate(phases):
                if spec is not None and note and (i == 0 or not original):
                    spec.note = note
            specs.extend(phases)
        del dev
    out = []
    for spec in specs:
        if spec is None:
            continue
        checks.run(spec.check)
        if 0 < spec.micro_batch < 1:
            checks.errors.append(
                f"{spec.batch_flag}={spec.global_batch} over {spec.replicas} replica(s) x "
                f"--grad_accum_steps={spec.accumulation} leaves micro-batches below 1 row; "
                "raise the batch or lower --grad_accum_steps.")
        out.append(spec.describe())
    return out


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return path
