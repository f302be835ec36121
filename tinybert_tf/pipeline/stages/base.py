"""A pipeline stage as one registered object (`Stage`), and the registry of stages in
run order.

Everything that loops over stages (main, preflight and the dry run, stage I/O and
reuse, `--overwrite`, divergence hints, the end-of-run summary) reads this registry;
a stage's module declares what it is, once. A plugin adds a stage with
`register_stage(Stage(...), after="export")` and it runs, is planned, fingerprinted
and resumed like the built-ins (docs/extending.md).
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Callable, Optional

from tinybert_tf import fields, plugins
from tinybert_tf.config import BertConfig, ConfigError
from tinybert_tf.data.examples import DataError
from tinybert_tf.models.checkpoint import CheckpointError, ModelInfo
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import STAGE_FOLDERS, StageFolder
from tinybert_tf.pipeline.settings.configs import PipelineConfig


def _nothing(_: Any) -> dict:
    return {}


def _none(_: Any) -> list:
    return []


def _never(_: Any) -> bool:
    return False


def _no_refusal(_: PipelineConfig) -> Optional[str]:
    return None


# What a stage reads that several stages share (`Stage.needs`): preflight inspects each
# once, for the stages of the run that read it.
TEACHER = "teacher"                # --teacher itself (its weights or its vocab)
TASK_TEACHER = "task_teacher"      # the fine-tuned teacher (given or finetune_teacher's)
TEACHER_VOCAB = "teacher_vocab"    # tokenises task text with the teacher's vocab
TASK_DATA = "task_data"            # the task's data
TASK_LENGTH = "task_length"        # runs task models at --max_seq_len
TASK_ROWS = "task_rows"            # trains a phase sized on the task's training rows
AUGMENTED_ROWS = "augmented_rows"  # trains on the augmented rows (with --use_augmented)
STUDENT_CONFIG = "student_config"  # builds the student from --student_config
TASK_STUDENT = "task_student"      # distils the task student (from the general model)
NEEDS = (TEACHER, TASK_TEACHER, TEACHER_VOCAB, TASK_DATA, TASK_LENGTH, TASK_ROWS,
         AUGMENTED_ROWS, STUDENT_CONFIG, TASK_STUDENT)


@dataclasses.dataclass
class Models:
    """The models a run reads, inspected without their weights (None: not read, or
    failed its check). Preflight fills it before the stages' own checks."""

    teacher: Optional[ModelInfo] = None
    task_teacher: Optional[ModelInfo] = None
    general_model: Optional[ModelInfo] = None
    # --student_config (when a stage builds the student from it).
    student_cfg: Optional[BertConfig] = None
    # The task stage's student: --general_model=none, a given or finished general
    # model, or (the general stage runs first) --student_config.
    task_student: Optional[BertConfig] = None

    @property
    def vocab_model(self) -> Optional[ModelInfo]:
        """The model whose vocab tokenises task text: the fine-tuned teacher's, else
        --teacher's."""
        return self.task_teacher or self.teacher


@dataclasses.dataclass
class Findings:
    """What the checks before training found: errors (each naming its flag or file and
    the fix) and warnings, with what they read: the stages of the run, the models
    (`Models`) and the plan's entries. Preflight gathers every stage's into one."""

    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    stages: tuple[str, ...] = ()
    models: Models = dataclasses.field(default_factory=Models)
    plan: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Flags whose value is out of range: later checks that read them are skipped.
    bad_flags: set[str] = dataclasses.field(default_factory=set)

    def runs(self, name: str) -> bool:
        """Whether stage `name` is among the run's stages."""
        return name in self.stages

    def needed(self, need: str) -> list[str]:
        """The run's stages that read `need` (`Stage.needs`)."""
        return [s for s in self.stages if need in STAGE_TABLE[s].needs]

    def run(self, fn: Callable[[], Any], prefix: str = "") -> Any:
        """fn(), recording its error (ours are ValueErrors naming the flag) instead of
        raising; None when it failed."""
        try:
            return fn()
        except (ValueError, ConfigError, CheckpointError, DataError, OSError) as e:
            self.errors.append(prefix + str(e))
        return None


def _no_checks(_: Context, __: Findings) -> None:
    return None


@dataclasses.dataclass
class PlanInputs:
    """What the phases' plan reads, read once for every stage (`Stage.phases`).

    count_corpus: count the general corpus when no count is cached (the dry run does).
    train, dev: the task's examples (None: not read, or failed); n_train: the training
    rows after tokenisation (None: the tokenizer's model failed its check, or no
    training stage runs); table: the source's augmentation table when augment runs;
    augmented, n_augmented: the augmented examples and their training rows, when a task
    phase reads them and the file is written (None: not yet, or it failed its check).
    task_models: the task stage's (student, teacher) configs, when known;
    saved_projections: the projection shapes its general model has (or will have).
    """

    count_corpus: bool = False
    train: Any = None
    dev: Any = None
    n_train: Optional[int] = None
    table: Any = None
    augmented: Any = None
    n_augmented: Optional[int] = None
    task_models: Optional[tuple[BertConfig, BertConfig]] = None
    saved_projections: Optional[dict] = None


def _no_phases(_: Context, __: Findings, ___: PlanInputs) -> list:
    return []


def sized_on_task_rows(found: Findings, inputs: PlanInputs,
                       make: Callable[[int], Any]) -> list:
    """[make(training rows)], its error recorded in `found`, for a stage whose one phase
    is sized on the task's training rows; [] while they are unknown."""
    if inputs.n_train is None:
        return []
    spec = found.run(lambda: make(inputs.n_train))
    return [spec] if spec is not None else []


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of `bin/distill`.

    name: its `--stages` name and its folder under --output_dir.
    run(ctx) -> info: does the work (writes its model aside: `RunState.work_path`);
      info is kept in its done record.
    reads(ctx) -> {role: a path, a list of paths, or a name}: its inputs besides
      earlier stages' outputs (fingerprinted in its done record).
    outputs(ctx) -> {path: "content" | "exists"}: what it publishes (exists: artefacts
      another tool may rewrite, such as report.json).
    keep(ctx) -> paths under its folder that a redo never deletes.
    upstream(config) -> the earlier stages whose output it reads under `config`.
    skipped(config): `--stages=all` leaves it out (an ablation or a flag replaces it).
    refusal(config) -> why it cannot run when named in --stages, or None.
    chief_only: trains nothing; under multi_worker only the chief runs it.
    workers_wait: with chief_only, the workers wait for the chief to finish it
      (later stages of theirs read its output).
    lr_flag: the learning-rate flag (no "--") a diverged phase's message names.
    replaced_by: what gives its output instead (named when it is missing); default
      `--<handover_flag>=DIR` for a stage with a handover flag.
    artefacts(ctx) -> [(what, path)]: what the end-of-run summary lists of it.
    settings(config) -> {flag: value} its output depends on (a change redoes it);
      None: the settings configs.py declares for the stage (`stage_settings`).
    checks(ctx, findings): its own settings' checks before training, recorded in
      `findings` (preflight calls them for the stages of the run, in run order; the
      checks that read models several stages share stay in preflight).
    seed_offset: the stage runs with seed --seed + seed_offset (mod 2**32), so its
      initialisation and dropout do not depend on what ran before it. The built-ins
      have 0..6 (their run order); None (a plugin's): a number derived from the name,
      so registering a stage leaves every other stage's seed as it was.
    handover_flag, handover(output_dir, config) -> path: the bin/distill flag that gives
      the stage's finished output to a run that does not make it, and that output's
      path in the run folder `output_dir` (bin/reproduce runs such a stage once and
      hands its output to every table cell that reads it).
    handover_name(config) -> the name bin/reproduce gives the folder of that shared run
      (None: the stage's name).
    per_task: whether its output depends on the task (the general model does not).
    folder: what it keeps in its folder besides its done record (`StageFolder`: files
      read back on resume, work left before it finishes, whether a redo drops the
      run's report).
    """

    name: str
    run: Callable[[Context], Optional[dict[str, Any]]]
    reads: Callable[[Context], dict[str, Any]] = _nothing
    outputs: Callable[[Context], dict[str, str]] = _nothing
    keep: Callable[[Context], list[str]] = _none
    upstream: Callable[[PipelineConfig], list[str]] = _none
    skipped: Callable[[PipelineConfig], bool] = _never
    refusal: Callable[[PipelineConfig], Optional[str]] = _no_refusal
    chief_only: bool = False
    workers_wait: bool = False
    lr_flag: str = ""
    replaced_by: str = ""
    artefacts: Callable[[Context], list[tuple[str, str]]] = _none
    settings: Optional[Callable[[PipelineConfig], dict[str, Any]]] = None
    checks: Callable[[Context, Findings], None] = _no_checks
    needs: frozenset[str] = frozenset()
    phases: Callable[[Context, Findings, PlanInputs], list] = _no_phases
    seed_offset: Optional[int] = None
    handover_flag: str = ""
    handover: Optional[Callable[[str, PipelineConfig], str]] = None
    handover_name: Optional[Callable[[PipelineConfig], str]] = None
    per_task: bool = True
    folder: StageFolder = StageFolder()

    def __post_init__(self) -> None:
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise plugins.PluginError(f"stage {self.name!r}: needs={sorted(unknown)} are not "
                                      f"among {', '.join(NEEDS)}.")
        if not self.replaced_by and self.handover_flag:
            object.__setattr__(self, "replaced_by", f"--{self.handover_flag}=DIR")


# name -> Stage, and the run order of the names.
STAGE_TABLE: dict[str, Stage] = {}
_ORDER: list[str] = []


def register_stage(stage: Stage, after: Optional[str] = None,
                   replace: bool = False) -> Stage:
    """Add `stage` to the registry: at the end, or right `after` a registered stage.
    A taken name is refused unless `replace` (the stage then keeps its place)."""
    if after is not None and after not in STAGE_TABLE:
        raise plugins.PluginError(f"stage {stage.name!r}: after={after!r} is no registered "
                                  f"stage; use one of {', '.join(_ORDER)}.")
    if stage.settings is None and stage.name not in fields.STAGES:
        raise plugins.PluginError(
            f"stage {stage.name!r}: give settings=lambda config: {{flag: value, ...}}, the "
            "settings its output depends on (a change redoes it), or {} when no flag "
            "shapes it; only the built-in stages are named by a setting's stages=.")
    previous = STAGE_TABLE.get(stage.name)
    if replace and previous is not None and stage.seed_offset is None:
        stage = dataclasses.replace(stage, seed_offset=previous.seed_offset)  # its seed too
    plugins.register(STAGE_TABLE, stage.name, stage, what="stage", replace=replace)
    STAGE_FOLDERS[stage.name] = stage.folder
    if stage.name in _ORDER:
        return stage
    _ORDER.insert(_ORDER.index(after) + 1 if after is not None else len(_ORDER), stage.name)
    return stage


def stage_seed(seed: int, name: str) -> int:
    """The seed stage `name` runs with (`Stage.seed_offset`)."""
    offset = STAGE_TABLE[name].seed_offset
    if offset is None:
        offset = 1000 + zlib.crc32(name.encode()) % 2**16
    return (seed + offset) % 2**32


def unregister_stage(name: str) -> None:
    """Remove a stage (tests and notebooks that registered one)."""
    STAGE_TABLE.pop(name, None)
    STAGE_FOLDERS.pop(name, None)
    if name in _ORDER:
        _ORDER.remove(name)


def stage_names() -> tuple[str, ...]:
    """Every registered stage's name, in run order."""
    return tuple(_ORDER)


def output_entries() -> tuple[str, ...]:
    """What a run writes at the top of --output_dir besides run_config.json and the lock:
    each stage's folder, the evaluate stage's report and plot, the TensorBoard logs."""
    return (*stage_names(), "report.json", "loss_curves.png", "logs")


def get_stage(name: str) -> Stage:
    return STAGE_TABLE[name]


def in_order(names) -> list[str]:
    """`names` (registered stages) in run order."""
    wanted = set(names)
    return [s for s in _ORDER if s in wanted]


def upstream(name: str, config: PipelineConfig) -> list[str]:
    """The earlier stages whose output stage `name` reads under `config`."""
    stage = STAGE_TABLE.get(name)
    return list(stage.upstream(config)) if stage is not None else []


def makes_output(name: str, config: PipelineConfig) -> bool:
    """Whether the pipeline of `config` makes stage `name`'s output: it is registered
    and `--stages=all` keeps it (no flag gives its output instead)."""
    stage = STAGE_TABLE.get(name)
    return stage is not None and not stage.skipped(config)


def settings_of(name: str, config: PipelineConfig) -> dict[str, Any]:
    """The settings stage `name`'s output depends on, as {flag: value}."""
    stage = STAGE_TABLE[name]
    return stage.settings(config) if stage.settings is not None \
        else config.stage_settings(name)
