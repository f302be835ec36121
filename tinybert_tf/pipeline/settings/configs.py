"""Typed configs of the pipeline: one dataclass per concern, built once from the flags.

Stages read their config, never the flags object. `PipelineConfig.results()`
is what `run_config.json` records: every config that changes what a run
computes. `RunOptions` (folders, stages, checkpoint cadence, timing repeats,
thread counts, the output lock's staleness) steers how a run proceeds and is
not recorded, so changing it never refuses a resume. `stage_settings(stage)`
is the part a stage's output depends on; the stage records it, and a later run
with other settings redoes the stage (and everything made from it).

Each field maps to the flag of the same name unless its metadata names
another (`flag("general_batch_size")`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from tinybert_tf.data import holdout
from tinybert_tf.pipeline.settings import precision
from tinybert_tf.tasks.catalog import TaskConfig

PRECISIONS = ("none", "mixed_float16", "mixed_bfloat16")
# --mixed_precision's default: mixed_bfloat16 under --strategy=tpu (TPUs compute in
# bfloat16 natively), none elsewhere; resolved when the configs are built.
AUTO_PRECISION = "auto"
INPUT_SHARDING = ("auto", "exact")


def flag(name: str) -> Any:
    """A dataclass field read from flag `name` (when it differs from the field name)."""
    return dataclasses.field(metadata={"flag": name})


def _from_flags(cls, values: Any):
    kwargs = {}
    for f in dataclasses.fields(cls):
        name = f.metadata.get("flag", f.name)
        value = getattr(values, name)
        if isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the run proceeds (not part of its results)."""

    output_dir: str
    stages: tuple[str, ...]
    plugins: tuple[str, ...]
    overwrite: bool
    dry_run: bool
    strategy: str
    tpu: str
    checkpoint_every: int
    keep_checkpoints: int
    eval_batch_size: int
    latency_runs: int
    augment_batch_size: int
    export_threads: int
    export_latency_runs: int
    export_max_examples: int
    peer_timeout: float
    input_sharding: str
    teacher_cache: bool
    teacher_cache_budget_gb: float
    lock_stale_minutes: float
    # How steps run, not what they compute: a run may switch it and reuse its stages.
    run_eagerly: bool
    # --teacher_precision as given (`TaskDistillConfig.teacher_precision` holds the
    # resolved dtype); the plan explains the choice from it.
    teacher_precision_request: str = flag("teacher_precision")


@dataclasses.dataclass(frozen=True)
class Numerics:
    seed: int
    mixed_precision: str
    jit_compile: bool
    length_buckets: int


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
    teacher: str
    task_teacher: str
    teacher_label_order: tuple[str, ...]
    student_config: str
    latency_budget_ms: float
    latency_runtime: str
    latency_seq_len: int
    latency_batch: int
    latency_table: str
    latency_candidates: tuple[str, ...]
    init_from_teacher: bool
    general_model: str
    student_init: str
    classifier_head: str

    @property
    def random_student(self) -> bool:
        """--student_init=random (or --general_model=none): task distillation from a
        randomly initialised student (the paper's "w/o GD")."""
        return self.student_init == "random" or self.general_model.lower() == "none"

    @property
    def general_given(self) -> bool:
        """The task stage's student comes from no general stage of this run: a given
        --general_model, or a random start."""
        return bool(self.general_model) or self.random_student


@dataclasses.dataclass(frozen=True)
class LossConfig:
    loss_terms: tuple[str, ...]
    temperature: float
    hard_label_weight: float
    pkd_alpha: float
    pkd_beta: float
    layer_mapping: str
    layer_weights: tuple[str, ...]
    share_hidden_projection: bool
    mask_padding: bool
    minilm_relation_heads: int
    minilm_teacher_layer: int

    @property
    def lambdas(self) -> Optional[list[float]]:
        return [float(w) for w in self.layer_weights] or None

    def term_settings(self) -> dict[str, Any]:
        """The settings `make_terms` hands each named term (each takes the ones it uses)."""
        return {"layer_mapping": self.layer_mapping, "layer_weights": self.lambdas,
                "mask_padding": self.mask_padding,
                "relation_heads": self.minilm_relation_heads,
                "teacher_layer": self.minilm_teacher_layer}


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    weight_decay: float
    warmup_proportion: float
    clip_norm: float
    grad_accum_steps: int


@dataclasses.dataclass(frozen=True)
class GeneralConfig:
    recipe: str
    corpus: str
    # A resolved hold-out name ("none" or registered): part of the general stage's settings.
    holdout: str = flag("general_holdout")
    max_seq_len: int = flag("general_max_seq_len")
    batch_size: int = flag("general_batch_size")
    epochs: float = flag("general_epochs")
    max_steps: int = flag("general_max_steps")
    lr: float = flag("general_lr")
    warmup: float = flag("general_warmup")
    alpha_ce: float = flag("alpha_ce")
    alpha_mlm: float = flag("alpha_mlm")
    alpha_cos: float = flag("alpha_cos")
    distil_temperature: float = flag("distil_temperature")
    restrict_ce_to_mask: bool = flag("restrict_ce_to_mask")


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    epochs: float = flag("teacher_epochs")
    lr: float = flag("teacher_lr")
    batch_size: int = flag("teacher_batch_size")
    max_steps: int = flag("teacher_max_steps")


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    mlm_model: str
    word_vectors: str
    augment_fallback: bool
    num_aug: int
    replace_prob: float
    num_candidates: int
    vector_vocab_limit: int
    corpus: str


@dataclasses.dataclass(frozen=True)
class TaskDistillConfig:
    use_augmented: bool
    augmented_file: str
    task_phases: tuple[str, ...]
    intermediate_epochs: float
    intermediate_lr: float
    pred_epochs: float
    pred_lr: float
    pkd_epochs: float
    pkd_lr: float
    finetune_epochs: float
    finetune_lr: float
    pred_grid: tuple[str, ...]
    batch_size: int = flag("task_batch_size")
    max_steps: int = flag("task_max_steps")
    eval_every: int = flag("eval_every")
    # Resolved: float32, bfloat16 or float16 (never auto), see `teacher_precision_decision`.
    teacher_precision: str = flag("teacher_precision")


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """The quantize stage: quantisation-aware distillation of the task student into
    its int8 form (the int8 export's model)."""

    enabled: bool = flag("quantize")
    steps: int = flag("quantize_steps")
    lr: float = flag("quantize_lr")
    batch_size: int = flag("quantize_batch_size")
    loss_terms: tuple[str, ...] = flag("quantize_loss_terms")
    calibration_examples: int = flag("quantize_calibration_examples")
    eval_every: int = flag("quantize_eval_every")


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    glue_test_predictions: bool


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    formats: tuple[str, ...] = flag("export_formats")
    representative_examples: int = flag("representative_examples")
    keras_hub_approximate_gelu: bool = flag("keras_hub_approximate_gelu")

    def options(self) -> dict[str, Any]:
        """The per-format settings `export_all` takes (`formats.FORMAT_OPTIONS`)."""
        return {"keras_hub_approximate_gelu": self.keras_hub_approximate_gelu}


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything a pipeline run needs, read once from the flags."""

    run: RunOptions
    numerics: Numerics
    models: ModelsConfig
    task: TaskConfig
    loss: LossConfig
    optim: OptimConfig
    general: GeneralConfig
    finetune: FinetuneConfig
    augment: AugmentConfig
    distill: TaskDistillConfig
    quantize: QuantizeConfig
    evaluate: EvaluateConfig
    export: ExportConfig

    @classmethod
    def from_flags(cls, values: Any) -> "PipelineConfig":
        parts = {name: _from_flags(part, values) for name, part in _TYPES.items()}
        numerics = parts["numerics"]
        if numerics.mixed_precision == AUTO_PRECISION:
            resolved = "mixed_bfloat16" if parts["run"].strategy == "tpu" else "none"
            parts["numerics"] = dataclasses.replace(numerics, mixed_precision=resolved)
        if parts["numerics"].mixed_precision == "mixed_bfloat16":
            precision.refuse_bfloat16_where_it_crashes(
                precision.detect(tpu=parts["run"].strategy == "tpu"),
                "--mixed_precision=mixed_bfloat16", "--mixed_precision=none")
        # The resolved dtype is what run_config.json records: a resume on hardware where
        # `auto` chooses otherwise is refused, not silently continued in another dtype.
        parts["distill"] = dataclasses.replace(
            parts["distill"], teacher_precision=teacher_precision_decision(parts["run"]).dtype)
        general = parts["general"]
        parts["general"] = dataclasses.replace(
            general, holdout=holdout.resolve(general.holdout, parts["task"].task))
        return cls(**parts)

    @property
    def teacher_precision(self) -> "precision.Decision":
        """The task-stage teacher's dtype and why (`--teacher_precision`)."""
        return teacher_precision_decision(self.run)

    def results(self) -> dict[str, Any]:
        """The result-affecting configs as {flag: value}, JSON-friendly (run_config.json)."""
        out: dict[str, Any] = {}
        for name in _TYPES:
            if name != "run":
                out.update(as_flags(getattr(self, name)))
        return out

    def stage_settings(self, stage: str) -> dict[str, Any]:
        """The settings `stage`'s output depends on (besides the stages it reads), as
        {flag: value}."""
        out: dict[str, Any] = {}
        for name in _STAGE_PARTS[stage]:
            part = as_flags(getattr(self, name))
            # Fields a stage does not read would make it stale for nothing.
            ignored = {p.split(".")[1] for p in _STAGE_IGNORES.get(stage, ())
                       if p.startswith(name + ".")}
            out.update({k: v for k, v in part.items() if k not in ignored})
        return out


_TYPES = {"run": RunOptions, "numerics": Numerics, "models": ModelsConfig, "task": TaskConfig,
          "loss": LossConfig, "optim": OptimConfig, "general": GeneralConfig,
          "finetune": FinetuneConfig, "augment": AugmentConfig, "distill": TaskDistillConfig,
          "quantize": QuantizeConfig, "evaluate": EvaluateConfig, "export": ExportConfig}

# Which configs each stage reads.
_STAGE_PARTS = {
    "general": ("numerics", "models", "general", "loss", "optim"),
    "finetune_teacher": ("numerics", "models", "task", "finetune", "optim"),
    "augment": ("numerics", "models", "task", "augment"),
    "task": ("numerics", "models", "task", "loss", "optim", "distill"),
    "quantize": ("numerics", "task", "loss", "optim", "distill", "quantize"),
    "evaluate": ("task", "evaluate"),
    "export": ("task", "export"),
}
# --student_config=auto's settings: they shape the student only.
_LATENCY = ("models.latency_budget_ms", "models.latency_runtime", "models.latency_seq_len",
            "models.latency_batch", "models.latency_table", "models.latency_candidates")
_STAGE_IGNORES = {
    "general": ("models.task_teacher", "models.teacher_label_order", "models.general_model",
                "models.student_init", "models.classifier_head",
                "loss.temperature", "loss.hard_label_weight", "loss.pkd_alpha",
                "loss.pkd_beta", "numerics.length_buckets"),
    "finetune_teacher": ("models.task_teacher", "models.teacher_label_order",
                         "models.student_config", "models.init_from_teacher",
                         "models.general_model", "models.student_init",
                         "models.classifier_head") + _LATENCY,
    "augment": ("numerics.mixed_precision", "numerics.jit_compile", "numerics.length_buckets",
                "models.student_config",
                "models.init_from_teacher", "models.general_model",
                "models.teacher_label_order", "models.student_init",
                "models.classifier_head") + _LATENCY,
    "task": ("models.init_from_teacher",),
    # The quantize stage reads the task student and the task data; its own terms,
    # steps and rate are its flags.
    "quantize": ("loss.loss_terms", "loss.hard_label_weight", "loss.pkd_alpha",
                 "loss.pkd_beta", "loss.layer_mapping", "loss.layer_weights",
                 "loss.share_hidden_projection", "distill.task_phases",
                 "distill.intermediate_epochs", "distill.intermediate_lr",
                 "distill.pred_epochs", "distill.pred_lr", "distill.pkd_epochs",
                 "distill.pkd_lr", "distill.finetune_epochs", "distill.finetune_lr",
                 "distill.pred_grid", "distill.batch_size", "distill.max_steps",
                 "distill.eval_every"),
}


def teacher_precision_decision(run: RunOptions) -> "precision.Decision":
    """--teacher_precision resolved on this host (TPU: --strategy=tpu)."""
    return precision.decide(run.teacher_precision_request,
                            precision.detect(tpu=run.strategy == "tpu"))


def as_flags(part: Any) -> dict[str, Any]:
    """A config dataclass as {flag name: JSON-friendly value}."""
    return {f.metadata.get("flag", f.name): _jsonable(getattr(part, f.name))
            for f in dataclasses.fields(part)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
