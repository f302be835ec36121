"""The training phases a stage plans (`PhaseSpec`), and the phase kinds of the task stage.

`--task_phases=intermediate,prediction` (the default) lists the task stage's
phases in order; each name is a `PhaseKind` in `PHASE_KINDS`. A kind says what
its phase is, and nothing in the stage compares names:

  terms(config, task)   its loss terms (`tinybert_tf.distill.terms`),
  on_augmented(task)    whether it trains on the augmented set when
                        --use_augmented (else on the original training set),
  trains_head           whether it trains the task head (the last phase must:
                        its best dev checkpoint is the task model),
  epochs / lr / warmup / schedule / batch_size(config)
                        its hyper-parameters, read from its flags.

Built-in kinds (the paper's Sec. 3.3 / 4, footnote 9, Table 2):

  intermediate  embd + attn + hidn (--loss_terms) on the augmented set;
                --intermediate_epochs, --intermediate_lr, constant rate (the
                reference's schedule), no warm-up.
  prediction    the prediction-layer loss (soft cross-entropy against the
                teacher; MSE to its score for regression) on the augmented set,
                STS-B's on the original one; --pred_epochs, --pred_lr, linear
                warm-up (--warmup_proportion) and decay.
  finetune      standard fine-tuning: cross-entropy (MSE for a score) against
                the ground truth, no teacher, on the data the prediction phase
                would read (the augmented set with --use_augmented, STS-B's and
                SQuAD's original one), so that each of the paper's "w/o Pred"
                (after intermediate) and "w/o TD" (alone) changes one thing;
                --nouse_augmented fine-tunes on the original set;
                --finetune_epochs, --finetune_lr, linear warm-up and decay.

A kind registered by user code (`@register_phase`, imported with --plugins)
plugs in the same way, e.g. a Patient-KD phase whose terms are the normalised
[CLS] states of mapped layers plus soft and hard cross-entropy.

`--pred_grid=B:LR,...` runs the last phase once per (batch, learning rate)
cell from one run of the phases before it, each cell in its own folder; the
cell best on dev is kept (the paper's §4.2 search over {16, 32} x {1e-5,
2e-5, 3e-5} for the prediction layer).

W_e/W_h: the general stage saves them with the General TinyBERT (attachment
PROJECTIONS of its model directory); the first task phase with a projected
term starts from them when their shapes fit (`general_projections`), else
from new ones with a one-line warning (a general model imported without
them, e.g. a released General TinyBERT, or one distilled from a teacher of
another width: loading those would map into the wrong space, and the student
itself is still a valid start). Each plan entry says where its phase's
projections start.

Planning functions take the stage `Context` (pipeline/run/context.py), which this
module cannot import: `PlanContext` names what they read of it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Optional, Protocol, Sequence

import keras
import numpy as np

from tinybert_tf import plugins
from tinybert_tf.config import BertConfig
from tinybert_tf.distill.optimizer import create_optimizer
from tinybert_tf.distill.projections import expected_shapes, mismatch
from tinybert_tf.distill.terms import HardLabelTerm, LossTerm, PredictionTerm, make_terms
from tinybert_tf.models.checkpoint import attachment_info, read_attachment
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.training import task_input
from tinybert_tf.pipeline.training import teacher_cache as cache_lib
from tinybert_tf.pipeline.training.loop import schedule_steps
from tinybert_tf.tasks.base import TaskType

# The general model's attachment holding its W_e/W_h (models.checkpoint.save_model).
PROJECTIONS = "projections"


class PlanContext(Protocol):
    """What planning reads of `pipeline.run.context.Context`."""

    config: PipelineConfig
    replicas: int
    max_seq_len: int
    state: Any  # RunState: .path(*parts)
    task: Any  # tasks.catalog.Task: .type

    def general_path(self) -> str: ...

# --- planned phases ----------------------------------------------------------------------


@dataclasses.dataclass
class PhaseSpec:
    """A training phase as planned: sizes, batches, steps, schedule and terms.

    kind: the task phase's `PhaseKind` name ("" for other stages' phases);
    projections: where W_e/W_h start ("general model", "new", "phase NAME"; None
    when the phase has none); evaluation: the dev evaluations' cost (the phase
    that selects the task model); cell: its --pred_grid cell.
    """

    stage: str
    name: str
    directory: str
    data: str
    examples: int
    global_batch: int
    accumulation: int
    replicas: int
    epochs: float
    max_steps: int
    lr: float
    schedule: str
    warmup_fraction: float
    terms: list[LossTerm]
    batch_flag: str
    note: str = ""
    kind: str = ""
    projections: Optional[str] = None
    evaluation: Optional[dict[str, Any]] = None
    cell: Optional[dict[str, Any]] = None
    augmented: bool = False  # trains on the augmented set (a task phase)
    # The phase trains no weight (its stage decides: the quantize stage's ranges-only
    # steps); its optimizer then holds no state.
    frozen_weights: bool = False
    # How batches are padded (task phases, teacher fine-tuning; None: the phase builds
    # its own input), and further plan entries: the teacher's precision, its caches.
    padding: Optional[task_input.Padding] = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def micro_batch(self) -> float:
        """Rows per replica per accumulation micro-batch."""
        return self.global_batch / max(1, self.replicas * self.accumulation)

    @property
    def steps_per_epoch(self) -> int:
        return self.examples // self.global_batch if self.global_batch > 0 else 0

    @property
    def total_steps(self) -> int:
        return schedule_steps(self.epochs, self.steps_per_epoch, self.max_steps)

    @property
    def warmup_steps(self) -> int:
        if not math.isfinite(self.warmup_fraction):  # refused, naming its flag, by preflight
            return 0
        return int(self.warmup_fraction * self.total_steps)

    @property
    def needs_projections(self) -> bool:
        """Whether a term uses W_e/W_h (known once the terms are planned or built)."""
        return any(t.needs_projections for t in self.terms)

    @property
    def layer_mapping(self) -> Optional[list]:
        """The layer map g(1..M) of the phase's layer-wise terms (None: it has none)."""
        for term in self.terms:
            mapping = term.get_config().get("layer_mapping")
            if mapping is not None:
                return mapping
        return None

    def check(self) -> None:
        """Raise ValueError naming the flag when the batch cannot be split or filled."""
        if self.global_batch < 1:
            raise ValueError(f"{self.batch_flag}={self.global_batch}: must be >= 1.")
        if self.global_batch % (self.replicas * self.accumulation):
            raise ValueError(
                f"{self.batch_flag}={self.global_batch} is the effective global batch of one "
                f"update; it must divide into {self.replicas} replica(s) x "
                f"{self.accumulation} accumulation step(s) (--grad_accum_steps): use a "
                f"multiple of {self.replicas * self.accumulation}.")
        if self.steps_per_epoch < 1:
            raise ValueError(f"{self.batch_flag}={self.global_batch}: the {self.data} has "
                             f"{self.examples} examples, not one full batch; lower "
                             f"{self.batch_flag}.")

    def optimizer(self, weight_decay: float) -> keras.optimizers.Optimizer:
        if self.frozen_weights:
            # keras still compiles with an optimizer; SGD at 0 keeps no slot variable.
            return keras.optimizers.SGD(learning_rate=0.0)
        return create_optimizer(self.lr, max(1, self.total_steps),
                                warmup_steps=self.warmup_steps, weight_decay=weight_decay,
                                schedule=self.schedule)

    def set_evaluation(self, every: int, dev_examples: int) -> None:
        """Record the cost of selecting on dev every `every` steps (0: every epoch):
        evaluations, dev examples each, and their share of the examples trained on."""
        period = every if every > 0 else max(1, self.steps_per_epoch)
        count = math.ceil(self.total_steps / period) if self.total_steps else 0
        trained = self.total_steps * self.global_batch
        self.evaluation = {
            "every": f"{every} steps" if every > 0 else "epoch",
            "evaluations": count, "dev_examples": int(dev_examples),
            "examples_evaluated": count * int(dev_examples),
            "share_of_training_examples": round(count * dev_examples / trained, 4)
            if trained else None}

    def describe(self) -> dict[str, Any]:
        out = {"stage": self.stage, "phase": self.name, "folder": self.directory,
               "data": self.data, "examples": self.examples,
               "global_batch": self.global_batch, "micro_batch": self.micro_batch,
               "accumulation": self.accumulation, "replicas": self.replicas,
               "steps_per_epoch": self.steps_per_epoch, "epochs": self.epochs,
               "steps": self.total_steps,
               "learning_rate": {"peak": self.lr, "schedule": self.schedule,
                                 "warmup_steps": self.warmup_steps},
               "loss_terms": [t.get_config() for t in self.terms],
               "layer_mapping": self.layer_mapping,
               "projections": self.projections}
        if self.kind:
            out["kind"] = self.kind
        if self.cell is not None:
            out["grid_cell"] = self.cell
        if self.evaluation is not None:
            out["evaluation"] = self.evaluation
        if self.padding is not None:
            out["padding"] = self.padding.describe()
        out.update(self.extra)
        if self.note:
            out["note"] = self.note
        return out


# --- phase kinds ---------------------------------------------------------------------------

class PhaseKind:
    """A kind of task-stage phase (see the module docstring); subclasses set `name`
    and implement `terms`, `epochs` and `lr`."""

    name: ClassVar[str] = ""
    trains_head: ClassVar[bool] = True
    # Whether it trains on the augmented set (when --use_augmented) for some task; the
    # augment stage is needed when a listed phase does. `on_augmented` decides per task.
    reads_augmented: ClassVar[bool] = True
    schedule: ClassVar[str] = "linear"
    # The flags that set its hyper-parameters, for messages.
    epochs_flag: ClassVar[str] = ""
    lr_flag: ClassVar[str] = ""

    def terms(self, config: PipelineConfig, task: TaskType) -> list[LossTerm]:
        raise NotImplementedError(f"{type(self).__name__}.terms")

    def on_augmented(self, task: TaskType) -> bool:
        """Whether it trains on the augmented set of `task` when --use_augmented."""
        return self.reads_augmented

    def epochs(self, config: PipelineConfig) -> float:
        raise NotImplementedError(f"{type(self).__name__}.epochs")

    def lr(self, config: PipelineConfig) -> float:
        raise NotImplementedError(f"{type(self).__name__}.lr")

    def warmup(self, config: PipelineConfig) -> float:
        return config.optim.warmup_proportion

    def batch_size(self, config: PipelineConfig) -> int:
        return config.distill.batch_size


PHASE_KINDS: dict[str, PhaseKind] = {}
# name -> the registered class (the registry rule compares classes, not instances).
_PHASE_CLASSES: dict[str, type[PhaseKind]] = {}


# `@register_phase` / `@register_phase(replace=True)`: a kind available to --task_phases
# by its `name`.
register_phase = plugins.class_decorator(PHASE_KINDS, _PHASE_CLASSES, what="task phase")


def phase_kinds(names: Sequence[str], flag: str = "--task_phases") -> list[PhaseKind]:
    """The kinds of `names`, in order; ValueError naming `flag` for an unknown or empty
    list, or when the last phase trains no head (the task model would keep an
    untrained one)."""
    names = [str(n).strip().lower() for n in names if str(n).strip()]
    unknown = [n for n in names if n not in PHASE_KINDS]
    if unknown or not names:
        what = f"unknown phase(s) {', '.join(unknown)}" if unknown else "no phase given"
        raise ValueError(f"{flag}={','.join(names)}: {what}; use a comma list of "
                         f"{', '.join(PHASE_KINDS)} (or a phase registered by --plugins).")
    kinds = [PHASE_KINDS[n] for n in names]
    if not kinds[-1].trains_head:
        raise ValueError(f"{flag}={','.join(names)}: the last phase ({names[-1]}) does not "
                         "train the task head, so the task model would keep an untrained "
                         "one; end with a phase that does (prediction, finetune).")
    return kinds


def phase_folders(names: Sequence[str]) -> list[str]:
    """Folder (and phase) names: the kind's name, with _2, _3 for repeats."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


@register_phase
class IntermediatePhase(PhaseKind):
    """Intermediate-layer distillation: --loss_terms (embd, attn, hidn) at a constant rate."""

    name = "intermediate"
    trains_head = False
    schedule = "constant"  # the reference trains this phase at a constant rate
    epochs_flag, lr_flag = "--intermediate_epochs", "--intermediate_lr"

    def terms(self, config, task):
        loss = config.loss
        return make_terms(loss.loss_terms, **loss.term_settings())

    def epochs(self, config):
        return config.distill.intermediate_epochs

    def lr(self, config):
        return config.distill.intermediate_lr

    def warmup(self, config):
        return 0.0


@register_phase
class PredictionPhase(PhaseKind):
    """Prediction-layer distillation (soft targets; + --hard_label_weight x ground truth)."""

    name = "prediction"
    epochs_flag, lr_flag = "--pred_epochs", "--pred_lr"

    def terms(self, config, task):
        loss = config.loss
        terms: list[LossTerm] = [PredictionTerm(task=task, temperature=loss.temperature,
                                                layer_weights=loss.lambdas)]
        if loss.hard_label_weight > 0:
            terms.append(HardLabelTerm(task=task, weight=loss.hard_label_weight))
        return terms

    def on_augmented(self, task):
        # STS-B: the original set (paper Sec. 4.2).
        return self.reads_augmented and not task.predict_on_original_data

    def epochs(self, config):
        return config.distill.pred_epochs

    def lr(self, config):
        return config.distill.pred_lr


@register_phase
class FinetunePhase(PhaseKind):
    """Fine-tuning on the ground truth (no teacher), on the prediction phase's data."""

    name = "finetune"
    epochs_flag, lr_flag = "--finetune_epochs", "--finetune_lr"

    def terms(self, config, task):
        return [HardLabelTerm(task=task)]

    def on_augmented(self, task):
        # The prediction phase's data (it stands in for that phase): STS-B's original set.
        return self.reads_augmented and not task.predict_on_original_data

    def epochs(self, config):
        return config.distill.finetune_epochs

    def lr(self, config):
        return config.distill.finetune_lr


# --- the prediction-phase grid ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GridCell:
    """One --pred_grid cell: the last phase's global batch and peak learning rate."""

    batch: int
    lr: float

    def folder(self, phase: str) -> str:
        return f"{phase}_b{self.batch}_lr{self.lr:g}"

    def describe(self) -> dict[str, Any]:
        return {"batch": self.batch, "lr": self.lr}


def parse_grid(values: Sequence[str], flag: str = "--pred_grid") -> list[GridCell]:
    """`["16:1e-5", "32:2e-5"]` -> cells, in order, each once; ValueError naming the flag."""
    cells: list[GridCell] = []
    for raw in values:
        text = str(raw).strip()
        if not text:
            continue
        batch, sep, lr = text.partition(":")
        try:
            cell = GridCell(int(batch), float(lr))
            ok = sep == ":" and cell.batch > 0 and math.isfinite(cell.lr) and cell.lr > 0
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{flag}: {text!r} is not BATCH:LR with a batch >= 1 and a "
                             "learning rate > 0 (e.g. --pred_grid=16:1e-5,32:3e-5).")
        if cell in cells:
            raise ValueError(f"{flag}: the cell {text} appears twice.")
        cells.append(cell)
    return cells


# --- planning ---------------------------------------------------------------------------------

def plan_phase(ctx: PlanContext, stage: str, name: str, data: str, examples: int, batch: int,
               batch_flag: str, epochs: float, max_steps: int, lr: float, schedule: str,
               warmup: float, terms: list[LossTerm]) -> PhaseSpec:
    """A `PhaseSpec` in the stage's folder STAGE/NAME."""
    return PhaseSpec(stage, name, ctx.state.path(stage, name), data, int(examples), int(batch),
                     int(ctx.config.optim.grad_accum_steps), ctx.replicas, float(epochs),
                     int(max_steps), float(lr), schedule, float(warmup), terms, batch_flag)


def task_phase_specs(ctx: PlanContext, rows_by_data: dict[bool, int], dev_examples: int = 0,
                     configs: Optional[tuple[BertConfig, BertConfig]] = None,
                     projections: str = "new") -> list[PhaseSpec]:
    """The task stage's phases (--task_phases, the last one once per --pred_grid cell).

    rows_by_data: training rows of the augmented set (key True, when used) and of the
    original one (False); dev_examples: the dev set the last phase selects on;
    configs: (student, teacher) configs, to resolve the terms' layer maps and whether
    they need projections; projections: where the first phase with W_e/W_h starts
    ("general model" or "new"); later ones continue from the phase before them.
    """
    c, d, task_type = ctx.config, ctx.config.distill, ctx.task.type
    kinds = phase_kinds(d.task_phases)
    names = phase_folders([k.name for k in kinds])
    grid = parse_grid(d.pred_grid)
    specs: list[PhaseSpec] = []
    for i, (kind, name) in enumerate(zip(kinds, names)):
        augmented = d.use_augmented and kind.on_augmented(task_type)
        data = "augmented train split" if augmented else "task train split"
        last = i == len(kinds) - 1
        carried = False
        for cell in (grid if last and grid else [None]):
            terms = kind.terms(c, task_type)
            for term in terms if configs is not None else ():
                term.plan(*configs)
            spec = plan_phase(
                ctx, "task", cell.folder(name) if cell else name, data,
                rows_by_data[augmented], cell.batch if cell else kind.batch_size(c),
                "--pred_grid" if cell else "--task_batch_size", kind.epochs(c), d.max_steps,
                cell.lr if cell else kind.lr(c), kind.schedule, kind.warmup(c), terms)
            spec.kind, spec.augmented = kind.name, augmented
            _plan_input(ctx, spec)
            spec.cell = cell.describe() if cell else None
            if spec.needs_projections:
                spec.projections, carried = projections, True
            if last:
                spec.set_evaluation(d.eval_every, dev_examples)
            specs.append(spec)
        if carried:
            projections = f"phase {name}"
    return specs


def _plan_input(ctx: PlanContext, spec: PhaseSpec) -> None:
    """A task phase's padding (length buckets where its terms allow), the frozen
    teacher's dtype (--teacher_precision) and the logits cache's decision; the plan
    replaces the last with the layer cache's where the terms read teacher layers."""
    c, task_type = ctx.config, ctx.task.type
    spec.padding = task_input.padding_for(c, task_type, spec.terms, ctx.max_seq_len)
    spec.extra["teacher_precision"] = c.teacher_precision.describe()
    spec.extra["teacher_cache"] = cache_lib.plan(task_type, spec.terms, c.run.teacher_cache)


def reads_augmented(config: PipelineConfig) -> bool:
    """Whether a task phase trains on the augmented set (so the task stage needs the
    augment stage)."""
    d = config.distill
    if not d.use_augmented:
        return False
    try:
        return any(k.reads_augmented for k in phase_kinds(d.task_phases))
    except ValueError:  # a bad --task_phases: preflight reports it
        return True


def projection_start(ctx: PlanContext, student: BertConfig, teacher: BertConfig,
                     saved: Optional[dict]) -> tuple[str, Optional[str]]:
    """Where the task stage's first W_e/W_h start ("general model" or "new"), and the
    one-line warning when the general model's cannot be used. `saved`: the general
    model's projection shapes (None: it has none)."""
    m = ctx.config.models
    if m.random_student:
        return "new", None
    wanted = expected_shapes(student.hidden_size, teacher.hidden_size, student.num_layers,
                             ctx.config.loss.share_hidden_projection)
    problem = mismatch(saved, wanted)
    if problem is None:
        return "general model", None
    return "new", (f"{ctx.general_path()}: no usable projections W_e/W_h ({problem}); task "
                   "distillation learns new ones from random initialisation")


def general_projections(ctx: PlanContext, student: BertConfig, teacher: BertConfig
                        ) -> tuple[Optional[dict[str, np.ndarray]], str, Optional[str]]:
    """The general model's W_e/W_h arrays when the task stage can use them (else
    None), where its first projection phase starts, and the warning when it cannot
    use them (reads the arrays: the task stage)."""
    saved = None if ctx.config.models.random_student else \
        read_attachment(ctx.general_path(), PROJECTIONS)
    shapes = {k: v.shape for k, v in saved.items()} if saved else None
    start, warning = projection_start(ctx, student, teacher, shapes)
    return (saved if start == "general model" else None), start, warning


def saved_projection_shapes(path: str) -> Optional[dict[str, tuple[int, ...]]]:
    """The projection shapes a model directory lists (config.json only: the plan)."""
    info = attachment_info(path, PROJECTIONS)
    if not info:
        return None
    return {k: tuple(v) for k, v in (info.get("shapes") or {}).items()}
