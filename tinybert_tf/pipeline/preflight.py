"""Every check before the first training step, and the resolved plan of the run.

A misconfigured multi-day job fails in seconds: flag ranges, the task's data,
the models' configs and vocabularies (read without their weights), layer
mappings, sequence lengths against position tables, batch splits, export
formats, the stages a stage reads, and free disk. `check(ctx, stages)`
gathers EVERY problem and returns the plan (`bin/distill --dry_run` prints
it) or raises one `PreflightError` listing them all. A stage's checks of its own
settings live in its module (`Stage.checks`); the ones here read what several
stages share: the models, lengths, the output folder, the phases' sizes, disk.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
from typing import Any, Callable, Optional, Sequence

from tinybert_tf import files
from tinybert_tf.config import BertConfig, ConfigError, get_config
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.data.examples import DataError
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.projections import expected_shapes
from tinybert_tf.distill.terms import layer_weights, resolve_names
from tinybert_tf.export.formats import FORMATS, check_formats, format_problems
from tinybert_tf.models.checkpoint import CheckpointError, ModelInfo, inspect_model
from tinybert_tf.models.labels import label_order, output_names
from tinybert_tf.pipeline import flag_ranges, stage_io
from tinybert_tf.pipeline.run.context import Context, rows
from tinybert_tf.pipeline.run.state import unfinished_stage_output
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages import Findings, get_stage, in_order, stage_names, upstream
from tinybert_tf.pipeline.stages import augment as A
from tinybert_tf.pipeline.stages import finetune_teacher as F
from tinybert_tf.pipeline.stages import general as G
from tinybert_tf.pipeline.stages import quantize as Q
from tinybert_tf.pipeline.training import phases as P
from tinybert_tf.pipeline.training import task_input
from tinybert_tf.pipeline.training.recipes import RECIPES, get_recipe
from tinybert_tf.tasks.catalog import Task
from tinybert_tf.tokenizer import SPECIAL_TOKENS

log = logging.getLogger("tinybert_tf")

# Free space asked for on top of the models' own size (checkpoints, logs, exports).
_DISK_MARGIN_BYTES = 256 * 2**20

# The built-in stages by what they read, for the checks several stages share.
# Train on the task's training rows (their phases are sized on them):
_TRAIN_ON_TASK = frozenset({"finetune_teacher", "task", "quantize"})
# Run task models at --max_seq_len:
_RUN_AT_TASK_LENGTH = _TRAIN_ON_TASK | {"evaluate", "export"}
# Read the task's data:
_READ_TASK_DATA = _RUN_AT_TASK_LENGTH | {"augment"}
# Read --teacher itself (its weights or its vocab):
_READ_TEACHER = frozenset({"general", "finetune_teacher", "augment"})
# Read the fine-tuned teacher, or tokenise with its vocab (--teacher's without one):
_READ_TASK_TEACHER = frozenset({"task", "evaluate", "augment"})
_TOKENISE_AS_TEACHER = _RUN_AT_TASK_LENGTH - {"finetune_teacher"}


class PreflightError(ValueError):
    """Checks failed before training; the message lists each with its flag and fix."""

    def __init__(self, errors: Sequence[str]):
        self.errors = list(dict.fromkeys(errors))  # each message once, in order
        super().__init__(self.errors[0] if len(self.errors) == 1 else
                         f"{len(self.errors)} problems:\n  - " + "\n  - ".join(self.errors))


def resolve_stages(requested: Sequence[str], config: PipelineConfig) -> list[str]:
    """`--stages` -> the ordered list to run. `all` drops the stages an ablation skips
    (each stage's `skipped`: general with --general_model or --student_init=random,
    finetune_teacher with --task_teacher, augment with --nouse_augmented,
    --augmented_file or task phases that read none, quantize with --noquantize or
    without int8 in --export_formats)."""
    names = [s.strip() for s in requested if s.strip()]
    known = stage_names()
    if names == ["all"]:
        return [s for s in known if not get_stage(s).skipped(config)]
    unknown = [s for s in names if s not in known]
    if unknown or not names:
        raise PreflightError([f"--stages: unknown stage(s) {unknown}; use a comma list of "
                              f"{', '.join(known)} or 'all'."])
    for name in in_order(names):
        refusal = get_stage(name).refusal(config)
        if refusal:
            raise PreflightError([f"--stages={','.join(names)}: {refusal}"])
    return in_order(names)


def task_head_errors(info: ModelInfo, task: Task, flag: str) -> list[str]:
    """Problems of a model with a task head `info` used for `task` (head kind, output
    count); label names are matched separately (`label_order`)."""
    want = task.type
    if not want.accepts(info.head):
        return [f"{flag}={info.path} has head={info.head!r} but task {task.name} needs a "
                f"{want.head} head; give a model fine-tuned on {task.name}."]
    if info.num_labels != want.num_outputs:
        return [f"{flag}={info.path} has {info.num_labels} outputs but task {task.name} has "
                f"{want.num_outputs} labels; give a model fine-tuned on {task.name} (or the "
                f"--task it was trained on)."]
    return []


# --- the checks ------------------------------------------------------------------------------

@dataclasses.dataclass
class _Checks(Findings):
    # Flags whose value is out of range (and those messages): later errors about
    # them would only echo it.
    bad_flags: set = dataclasses.field(default_factory=set)
    range_errors: set = dataclasses.field(default_factory=set)

    def run(self, fn: Callable[[], Any], prefix: str = "") -> Any:
        """fn(), recording its error (ours are ValueErrors naming the flag) instead of raising."""
        try:
            return fn()
        except PreflightError as e:
            self.errors.extend(prefix + m for m in e.errors)
        except (ValueError, ConfigError, CheckpointError, DataError, OSError) as e:
            self.errors.append(prefix + str(e))
        return None

    def final(self) -> list[str]:
        """The errors, each once, without echoes of an out-of-range flag."""
        out = []
        for e in self.errors:
            m = re.match(r"(?:[a-z_ ]+: )?(--[a-z_]+)\b", e)
            if m and m.group(1) in self.bad_flags and e not in self.range_errors:
                continue
            out.append(e)
        return list(dict.fromkeys(out))

    def range_error(self, flag: str, message: str) -> None:
        self.bad_flags.add(flag)
        self.range_errors.add(message)
        self.errors.append(message)


def _model(checks: _Checks, path: str, flag: str) -> Optional[ModelInfo]:
    if path and ("/" in path or path.startswith(".")):  # a path, not a short or hub name
        if not files.exists(path):
            checks.errors.append(f"{flag}={path}: no such folder; give a model directory "
                                 "(config.json, vocab.txt and weights).")
            return None
        unfinished = unfinished_stage_output(path)
        if unfinished:
            checks.errors.append(f"{flag}={path}: {unfinished}")
            return None
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


@dataclasses.dataclass
class _Models:
    """The models a run reads, inspected without their weights (None: not read, or
    failed its check)."""

    teacher: Optional[ModelInfo] = None
    task_teacher: Optional[ModelInfo] = None
    general_model: Optional[ModelInfo] = None
    # --student_config (when the general stage or a random student needs it).
    student_cfg: Optional[BertConfig] = None
    # The task stage's student: --general_model=none, a given or finished general
    # model, or (general runs first) --student_config.
    task_student: Optional[BertConfig] = None

    @property
    def vocab_model(self) -> Optional[ModelInfo]:
        return self.task_teacher or self.teacher


def check(ctx: Context, stages: Sequence[str], count_corpus: bool = False
          ) -> dict[str, Any]:
    """Every check for running `stages`; returns the plan (see module doc).

    count_corpus: count the general corpus for the plan's steps even when no
    count is cached (the dry run does; a real run counts at the stage's start).
    """
    c, checks, needs = ctx.config, _Checks(), set(stages)
    weight_errors = _check_flags(checks, ctx, stages)
    plan: dict[str, Any] = {"output_dir": ctx.state.output_dir, "stages": list(stages),
                            "replicas": ctx.replicas, "task": ctx.task.describe()}
    recipe = checks.run(lambda: get_recipe(c.general.recipe)) if "general" in needs else None
    if recipe is not None:
        plan["general_recipe"] = recipe.describe()
    checks.errors.extend(flag_ranges.trains_nothing(c, needs, recipe))
    missing_outputs = _check_folder(checks, ctx, stages)
    if not checks.errors:
        plan["reuse"] = {stage: "reused" if why is None else f"runs again: {why}"
                         for stage, why in (checks.run(
                             lambda: stage_io.plan_reuse(ctx, stages)) or {}).items()}
    models = _Models()
    _check_teachers(checks, ctx, needs, missing_outputs, models, plan)
    for name in stages:  # each stage's own settings (`Stage.checks`)
        get_stage(name).checks(ctx, checks)
    _check_students(checks, ctx, needs, models)
    if recipe is not None and models.teacher is not None:
        checks.errors.extend(checks.run(
            lambda: recipe.check(c, models.student_cfg, models.teacher)) or [])
    checks.run(lambda: resolve_names(c.loss.loss_terms))
    _check_layer_maps(checks, ctx, needs, models, weight_errors)
    _check_lengths(checks, ctx, needs, models)
    if "augment" in needs:
        _check_augment(checks, ctx, models.vocab_model)
    if "export" in needs:
        _check_export(checks, ctx, needs, models)
    if not weight_errors:
        plan["phases"] = _plan_phases(checks, ctx, needs, count_corpus, models)
    _check_disk(checks, ctx, models, plan)
    plan["models"] = {name: _describe(info) for name, info in
                      (("teacher", models.teacher), ("task_teacher", models.task_teacher),
                       ("general_model", models.general_model)) if info is not None}
    if models.student_cfg is not None:
        plan["models"]["student_config"] = models.student_cfg.to_dict()
    plan["warnings"] = checks.warnings
    errors = checks.final()
    if errors:
        raise PreflightError(errors)
    for w in checks.warnings:
        log.warning(w)
        print(f"warning: {w}", flush=True)
    return plan


def _check_flags(checks: _Checks, ctx: Context, stages: Sequence[str]) -> list[str]:
    """Flag ranges and flags that exclude each other; returns the --layer_weights
    errors (layer maps and phases are not checked against bad weights)."""
    c = ctx.config
    for flag, value, ok, allowed in flag_ranges.ranges(c):
        if not ok(value):
            checks.range_error(flag, f"{flag}={value}: must be {allowed}.")
    shortest = 5 if ctx.task.is_pair else 3  # [CLS] a [SEP] (b [SEP]): a token per text
    if 0 < c.task.max_seq_len < shortest:
        kind = "pair" if ctx.task.is_pair else "single-text"
        checks.range_error("--max_seq_len", f"--max_seq_len={c.task.max_seq_len}: must be 0 "
                           f"(the task's default) or >= {shortest} (the special tokens and "
                           f"one word piece per text of a {kind} task).")
    if "finetune_teacher" in stages and c.models.teacher_given:
        checks.errors.append(
            f"--stages={','.join(stages)} with --task_teacher={c.models.task_teacher}: the "
            "finetune_teacher stage fine-tunes --teacher, but the later stages read "
            "--task_teacher and would ignore it; drop --task_teacher, or finetune_teacher "
            "from --stages.")
    weight_errors = flag_ranges.layer_weight_errors(c.loss.layer_weights)
    for e in weight_errors:
        checks.range_error("--layer_weights", e)
    return weight_errors


def _check_folder(checks: _Checks, ctx: Context, stages: Sequence[str]) -> set:
    """The output folder, what earlier runs left in it, and the stage outputs this run
    reads; returns the stages that cannot read their inputs."""
    c, needs = ctx.config, set(stages)
    checks.errors.extend(_output_dir_errors(ctx.state.output_dir))
    checks.errors.extend(checks.run(lambda: ctx.state.damaged_records(
        stages if c.run.overwrite else ())) or [])
    # What each stage reads must be there, unchanged (or come first in this run).
    missing_outputs = _upstream_errors(checks, ctx, stages)
    if c.distill.augmented_file:
        if "augment" in needs:
            checks.errors.append(
                f"--augmented_file={c.distill.augmented_file} replaces the augment stage, "
                f"which --stages={','.join(stages)} also runs; drop one of the two.")
        elif "task" in needs and c.distill.use_augmented \
                and not files.isfile(c.distill.augmented_file):
            missing_outputs.add("task")
            checks.errors.append(f"--augmented_file={c.distill.augmented_file}: no such file; "
                                 "give the augmented file (bin/augment --output, or a run's "
                                 "OUTPUT/augment/<file>).")
    foreign = ctx.state.foreign_entries([*stage_names(), "report.json", "loss_curves.png",
                                         "logs"])
    if foreign:
        checks.errors.append(
            f"--output_dir={ctx.state.output_dir}: holds {', '.join(foreign[:4])} that no "
            "bin/distill run made (no run_config.json, no stage records): a run would write "
            "into them (and --overwrite delete them); choose a new or empty folder.")
    return missing_outputs


def _check_teachers(checks: _Checks, ctx: Context, needs: set, missing_outputs: set,
                    models: _Models, plan: dict[str, Any]) -> None:
    """--teacher and --task_teacher, read without weights, when a stage reads them."""
    m = ctx.config.models
    if needs & _READ_TEACHER or (m.random_student and "task" in needs
                                 and not m.teacher_given):
        models.teacher = _model(checks, m.teacher, "--teacher")
    elif not m.teacher_given and needs & _TOKENISE_AS_TEACHER - missing_outputs:
        # These stages tokenise with --teacher's vocab (the fine-tuned teacher keeps it).
        models.teacher = _model(checks, m.teacher, "--teacher")
    if m.teacher_given and needs & _READ_TASK_TEACHER:
        models.task_teacher = _model(checks, m.task_teacher, "--task_teacher")
        if models.task_teacher is not None:
            _check_task_head(checks, models.task_teacher, ctx, "--task_teacher", plan)
    if models.teacher is not None and models.task_teacher is not None \
            and models.teacher.vocab != models.task_teacher.vocab:
        checks.errors.append("--task_teacher and --teacher use different vocabularies; the "
                             "student can follow only one. Use teachers of one vocab.")
    if m.teacher_label_order and not m.teacher_given:
        checks.errors.append("--teacher_label_order describes the outputs of --task_teacher, "
                             "which is not given (the finetune_teacher stage names its "
                             "labels itself); drop the flag or give --task_teacher.")


def _check_students(checks: _Checks, ctx: Context, needs: set, models: _Models) -> None:
    """--student_config and the general model the task stage starts from (given, or a
    finished general stage's)."""
    m = ctx.config.models
    if "general" in needs or (m.random_student and "task" in needs):
        models.student_cfg = checks.run(lambda: get_config(m.student_config),
                                        "--student_config: ")
    if m.general_model and not m.random_student and "task" in needs:
        models.general_model = _model(checks, m.general_model, "--general_model")
        vocab_model = models.vocab_model
        if models.general_model is not None and vocab_model is not None \
                and models.general_model.vocab != vocab_model.vocab:
            checks.errors.append(f"--general_model={m.general_model} and the teacher use "
                                 "different vocabularies (or special-token ids); distil from a "
                                 "teacher with the student's vocab.txt.")
    elif not m.general_given and "task" in needs and "general" not in needs \
            and ctx.state.is_done("general"):
        models.general_model = checks.run(lambda: inspect_model(ctx.general_path()),
                                          f"{ctx.general_path()}: ")
    models.task_student = models.student_cfg if (
        m.random_student or (not m.general_given and "general" in needs)) else (
        models.general_model.config if models.general_model is not None else None)


def _check_layer_maps(checks: _Checks, ctx: Context, needs: set, models: _Models,
                      weight_errors: list[str]) -> None:
    """Layer maps and layer weights against the (student, teacher) pairs that distil."""
    c = ctx.config
    pairs = []
    if "general" in needs and models.student_cfg is not None and models.teacher is not None:
        pairs.append((models.student_cfg, models.teacher.config))
    if "task" in needs and models.vocab_model is not None and models.task_student is not None:
        pairs.append((models.task_student, models.vocab_model.config))
    for s_cfg, t_cfg in pairs:
        checks.run(lambda: layer_map(c.loss.layer_mapping, s_cfg.num_layers, t_cfg.num_layers))
        if not weight_errors:
            checks.run(lambda: layer_weights(c.loss.lambdas, s_cfg.num_layers))
        if s_cfg.num_heads != t_cfg.num_heads and "attn" in resolve_safe(c.loss.loss_terms):
            checks.warnings.append(f"student has {s_cfg.num_heads} heads, teacher "
                                   f"{t_cfg.num_heads}: the attention loss compares "
                                   "head-averaged maps.")


def _check_lengths(checks: _Checks, ctx: Context, needs: set, models: _Models) -> None:
    """Sequence lengths against the models' position tables."""
    c = ctx.config
    task_stages = needs & _RUN_AT_TASK_LENGTH
    for info, flag in ((models.teacher, "--teacher"), (models.task_teacher, "--task_teacher"),
                       (models.general_model, "--general_model")):
        if info is None:
            continue
        limit = info.config.max_position_embeddings
        if ctx.max_seq_len > limit and task_stages:
            checks.errors.append(f"--max_seq_len={ctx.max_seq_len} exceeds {flag}'s "
                                 f"max_position_embeddings={limit}; lower --max_seq_len.")
        if flag == "--teacher" and "general" in needs and c.general.max_seq_len > limit:
            checks.errors.append(f"--general_max_seq_len={c.general.max_seq_len} exceeds the "
                                 f"teacher's max_position_embeddings={limit}; lower "
                                 "--general_max_seq_len.")
    student_cfg = models.student_cfg
    if student_cfg is not None:
        limit = student_cfg.max_position_embeddings
        if "general" in needs and c.general.max_seq_len > limit:
            checks.errors.append(f"--general_max_seq_len={c.general.max_seq_len} exceeds "
                                 f"--student_config's max_position_embeddings={limit}; lower "
                                 "--general_max_seq_len or use a student with a longer table.")
        if "task" in needs and models.task_student is student_cfg \
                and ctx.max_seq_len > limit:
            checks.errors.append(f"--max_seq_len={ctx.max_seq_len} exceeds --student_config's "
                                 f"max_position_embeddings={limit} (the task stage's student); "
                                 "lower --max_seq_len.")


def _check_export(checks: _Checks, ctx: Context, needs: set, models: _Models) -> None:
    """--export_formats against the model the export stage will write: the task
    stage's student, or the finished one. A format that cannot hold it fails here,
    not after training."""
    c = ctx.config
    formats = checks.run(lambda: check_formats(c.export.formats))
    exported = models.task_student if "task" in needs else None
    if exported is None and "task" not in needs and ctx.state.is_done("task"):
        info = checks.run(lambda: inspect_model(ctx.student_path()),
                          f"{ctx.student_path()}: ")
        exported = info.config if info is not None else None
    if formats and exported is not None:
        checks.errors.extend(format_problems(formats, exported, ctx.task.type.head,
                                             c.export.options()))
    calibrated = [f for f in formats or () if FORMATS[f].calibrated]
    if calibrated and c.export.representative_examples <= 0:
        checks.errors.append(
            f"--representative_examples={c.export.representative_examples}: "
            f"{', '.join(calibrated)} calibrate on task text; give > 0 examples or drop "
            "them from --export_formats.")


def _plan_phases(checks: _Checks, ctx: Context, needs: set, count_corpus: bool,
                 models: _Models) -> list[dict[str, Any]]:
    """The phases' plan, unless a flag or model they are built from is already known to
    be bad: the task tokenizer is --task_teacher's or --teacher's, the corpus's
    --teacher's."""
    m = ctx.config.models
    tokenizer_ok = (models.task_teacher if m.teacher_given else models.teacher) is not None \
        or not (needs & _TRAIN_ON_TASK)
    task_models = ((models.task_student, models.vocab_model.config)
                   if models.task_student is not None and models.vocab_model is not None
                   else None)
    return _phases(checks, ctx, needs, count_corpus, tokenizer_ok,
                   models.teacher is not None or "general" not in needs, task_models,
                   _saved_projections(ctx, needs, models.student_cfg, models.teacher))


def _check_disk(checks: _Checks, ctx: Context, models: _Models,
                plan: dict[str, Any]) -> None:
    """Free disk for the models, and the teacher caches the plan uses."""
    teacher = models.teacher
    needed = _DISK_MARGIN_BYTES + (16 * teacher.num_weights() if teacher is not None else 0)
    needed += sum(int(p.get("teacher_cache", {}).get("gib", 0) * 2**30)
                  for p in plan.get("phases", ()) if p.get("teacher_cache", {}).get("use"))
    if not files.is_remote(ctx.state.output_dir):
        free = shutil.disk_usage(_existing_parent(ctx.state.output_dir)).free
        if free < needed:
            checks.errors.append(f"--output_dir={ctx.state.output_dir}: {free / 2**30:.2f} "
                                 f"GiB free, about {needed / 2**30:.2f} GiB needed; free space "
                                 "or choose another folder.")


def _output_dir_errors(output_dir: str) -> list[str]:
    """--output_dir must be a folder this user can write (or can create)."""
    if files.is_remote(output_dir):
        return []
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        return [f"--output_dir={output_dir}: is a file; give a folder (new or from an "
                "earlier run of this config)."]
    parent = _existing_parent(output_dir)
    if not os.path.isdir(parent):
        return [f"--output_dir={output_dir}: {parent} is a file, so the folder cannot be "
                "made; choose another path."]
    if not os.access(parent, os.W_OK | os.X_OK):
        what = "is" if parent == output_dir else f"cannot be made in {parent}, which is"
        return [f"--output_dir={output_dir}: {what} not writable by this user (read-only "
                "or another owner); fix its permissions or choose another folder."]
    return []


def resolve_safe(names) -> tuple[str, ...]:
    try:
        return resolve_names(names)
    except ValueError:
        return ()


def _upstream_errors(checks: _Checks, ctx: Context, stages: Sequence[str]) -> set:
    """Errors for stages whose input stage is not in this run and is not done, lost an
    output, or is stale; returns the stages that cannot read their inputs."""
    failed = set()
    for stage in stages:
        for up in upstream(stage, ctx.config):
            if up in stages:
                continue
            if not ctx.state.is_done(up):
                checks.errors.append(
                    f"--stages={','.join(stages)}: {stage} reads the output of {up}, which "
                    f"is not in {ctx.state.path(up)}; add {up} to --stages (or give "
                    + (get_stage(up).replaced_by or up) + ").")
                failed.add(stage)
                continue
            missing = checks.run(lambda: stage_io.missing_output(ctx, up))
            reason = None if missing else checks.run(lambda: stage_io.reuse_problem(ctx, up))
            if missing:
                checks.errors.append(
                    f"{missing}: missing, although the {up} stage is marked done "
                    f"({ctx.state.path(up, 'stage_done.json')}); redo it: add {up} to "
                    f"--stages, or run --stages={up} --overwrite first (or give "
                    + (get_stage(up).replaced_by or up) + ").")
            elif reason:
                checks.errors.append(
                    f"--stages={','.join(stages)}: {stage} reads the output of {up}, which "
                    f"is stale ({reason}); add {up} to --stages so it runs again first.")
            if missing or reason:
                failed.add(stage)
    return failed


def _describe(info: ModelInfo) -> dict[str, Any]:
    c = info.config
    return {"path": info.path, "format": info.format, "head": info.head,
            "labels": info.label_names, "layers": c.num_layers, "hidden_size": c.hidden_size,
            "heads": c.num_heads, "vocab_size": c.vocab_size, "lower_case": c.lower_case}


def _check_task_head(checks: _Checks, info: ModelInfo, ctx: Context, flag: str,
                     plan: dict[str, Any]) -> None:
    errors = task_head_errors(info, ctx.task, flag)
    checks.errors.extend(errors)
    if not errors and ctx.task.type.named_outputs:
        order = checks.run(lambda: label_order(
            output_names(info.label_names, ctx.config.models.teacher_label_order,
                         f"{flag}={info.path}"),
            ctx.task.type.label_names, f"{flag}={info.path}"))
        if order is not None:
            plan["teacher_label_mapping"] = {n: i for n, i in zip(ctx.task.type.label_names,
                                                                  order)}


def _check_augment(checks: _Checks, ctx: Context, vocab_model: Optional[ModelInfo]) -> None:
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
    if a.word_vectors and not files.isfile(a.word_vectors):
        checks.errors.append(f"--word_vectors={a.word_vectors}: file not found.")


def _saved_projections(ctx: Context, needs: set, student: Optional[BertConfig],
                       teacher: Optional[ModelInfo]) -> Optional[dict]:
    """The projection shapes the task stage's general model has (or will have, when the
    general stage runs first in this run)."""
    m = ctx.config.models
    if m.random_student:
        return None
    if not m.general_given and "general" in needs:
        recipe = RECIPES.get(ctx.config.general.recipe)
        if student is None or teacher is None or recipe is None \
                or not G.recipe_saves_projections(recipe, ctx.config, student, teacher.config):
            return None
        return expected_shapes(student.hidden_size, teacher.config.hidden_size,
                               student.num_layers, ctx.config.loss.share_hidden_projection)
    try:
        return P.saved_projection_shapes(ctx.general_path())
    except (CheckpointError, OSError):
        return None  # the model's own check reports it


def _layer_cache_plan(checks: _Checks, ctx: Context, spec: P.PhaseSpec, train, aug,
                      task_models: tuple[BertConfig, BertConfig], per_example: int) -> None:
    """The teacher-layer cache's decision in the plan of a phase whose terms it can
    hold (pipeline/training/layer_cache.py); rows not augmented yet count `per_example` rows
    (`augment.rows_per_example`) per example."""
    known = aug if spec.augmented else train
    scale = float(per_example) if spec.augmented and aug is None else 1.0
    cache = checks.run(lambda: task_input.layer_cache_plan(
        ctx, spec, known if known is not None else train, *task_models, scale=scale))
    if cache is not None and cache.layout is not None:
        spec.extra["teacher_cache"] = cache.describe()


def _phases(checks: _Checks, ctx: Context, needs: set, count_corpus: bool,
            tokenizer_ok: bool = True, teacher_ok: bool = True,
            task_models: Optional[tuple[BertConfig, BertConfig]] = None,
            saved_projections: Optional[dict] = None) -> list[dict[str, Any]]:
    """Each training phase's spec (checked), reading the data it trains on. Sizes need
    the tokenizers: none is built from a model that failed its checks. `task_models`:
    the task stage's (student, teacher) configs, when known."""
    specs = []
    if "general" in needs and teacher_ok:
        specs.append(_general_phase(checks, ctx, count_corpus))
    if needs & _READ_TASK_DATA:
        train = checks.run(lambda: ctx.examples("train"), "")
        # A folder or flag at fault shows in the train split already: say it once.
        dev = (checks.run(lambda: ctx.examples(ctx.task.dev_splits[0]), "")
               if train is not None else None)
        table = None
        if "augment" in needs and train is not None:
            table = checks.run(lambda: ctx.task.source.augment_table(), "augment: ")
        # Sizing needs the task tokenizer; only training stages need sizes.
        n_train = (checks.run(lambda: rows(ctx, train)) if train is not None and tokenizer_ok
                   and needs & _TRAIN_ON_TASK else None)
        if n_train is not None and "finetune_teacher" in needs:
            specs.append(checks.run(lambda: F.finetune_phase(ctx, n_train)))
        if "task" in needs and n_train is not None:
            specs.extend(_task_phases(checks, ctx, train, dev, n_train, table, task_models,
                                      saved_projections))
        if "quantize" in needs and n_train is not None:
            specs.append(checks.run(lambda: Q.planned_phase(
                ctx, n_train, A.rows_per_example(ctx, table))))
    return [d for d in (_checked(checks, spec) for spec in specs if spec is not None) if d]


def _general_phase(checks: _Checks, ctx: Context, count_corpus: bool
                   ) -> Optional[P.PhaseSpec]:
    """The general stage's phase when its recipe trains (the corpus counted when
    `count_corpus` or cached, else only read)."""
    # An unknown --recipe is reported once, by `check`.
    recipe = RECIPES.get(ctx.config.general.recipe)
    if recipe is None or not recipe.trains:
        return None
    count = None
    if count_corpus:
        count = checks.run(lambda: G.corpus_sequences(ctx))
    else:
        checks.run(lambda: corpus_lib.source_facts(G.corpus_source(ctx)), "--corpus: ")
    return checks.run(lambda: G.general_phase(ctx, count)) if count is not None else None


def _task_phases(checks: _Checks, ctx: Context, train, dev, n_train: int, table,
                 task_models: Optional[tuple[BertConfig, BertConfig]],
                 saved_projections: Optional[dict]) -> list[P.PhaseSpec]:
    """The task stage's phases, sized on the augmented rows when written, else on their
    bound (noted)."""
    size, aug = n_train, None
    if P.reads_augmented(ctx.config):
        d = ctx.config.distill
        written = (ctx.state.is_done("augment") or bool(d.augmented_file)) \
            and files.exists(ctx.augmented_path())
        aug = checks.run(lambda: ctx.examples("train_aug")) if written else None
        # Not augmented yet: at most `per_example` rows per example. Sizes (and
        # the batch checks) use that bound, not the count before augmentation.
        size = checks.run(lambda: rows(ctx, aug)) if aug is not None else None
    per_example = A.rows_per_example(ctx, table)
    bound = n_train * per_example
    note = ("" if size is not None else "the augmented set is not written yet: sizes "
            f"and steps assume at most {bound} rows (the {n_train} original rows "
            f"with up to {per_example - 1} variants each: --num_aug="
            f"{ctx.config.augment.num_aug} per text field augmented, one field at a "
            "time); the stage sizes itself on the rows written")
    size = bound if size is None and P.reads_augmented(ctx.config) else size
    start, warning = "new", None
    if task_models is not None:
        start, warning = P.projection_start(ctx, *task_models, saved_projections)
    phases = checks.run(lambda: P.task_phase_specs(
        ctx, {True: size or n_train, False: n_train},
        len(dev) if dev is not None else 0, task_models, start)) or []
    for spec in phases:
        if note and spec.augmented:
            spec.note = note
        if task_models is not None:
            _layer_cache_plan(checks, ctx, spec, train, aug, task_models, per_example)
    if warning and any(spec.projections == "new" for spec in phases):
        checks.warnings.append(warning)
    return phases


def _checked(checks: _Checks, spec: P.PhaseSpec) -> Optional[dict[str, Any]]:
    """The plan of `spec` after its checks; None when its batch flags are out of range
    (reported once, by the range check)."""
    if {spec.batch_flag, "--grad_accum_steps"} & checks.bad_flags:
        return None
    checks.run(spec.check)
    if 0 < spec.micro_batch < 1:
        checks.errors.append(
            f"{spec.batch_flag}={spec.global_batch} over {spec.replicas} replica(s) x "
            f"--grad_accum_steps={spec.accumulation} leaves micro-batches below 1 row; "
            "raise the batch or lower --grad_accum_steps.")
    return spec.describe()


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return path
