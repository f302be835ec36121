"""Typed configs of the pipeline: one dataclass per concern, built once from the flags.

Stages read their config, never the flags object. `PipelineConfig.results()`
is what `run_config.json` records: every config that changes what a run
computes. `RunOptions` (folders, stages, checkpoint cadence, timing repeats,
thread counts, the output lock's staleness) steers how a run proceeds and is
not recorded, so changing it never refuses a resume. `stage_settings(stage)`
is the part a stage's output depends on; the stage records it, and a later run
with other settings redoes the stage (and everything made from it).

A setting is one field, declared with `fields.setting`: its default, help,
range and the stages it shapes; flags.py defines the flags from these fields,
flag_ranges checks the ranges, and `stage_settings` reads the stages. A field
maps to the flag of the same name unless its `flag=` names another.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from tinybert_tf import fields
from tinybert_tf.data import holdout
from tinybert_tf.distill.terms import ALIASES, TERMS
from tinybert_tf.export.formats import FORMATS, registered_name
from tinybert_tf.export.parity import DEFAULT_FORMATS
from tinybert_tf.fields import (
    FRACTION,
    above_zero_fraction,
    at_least,
    flag,
    non_negative,
    positive,
    setting,
    within,
)
from tinybert_tf.pipeline.settings import precision
from tinybert_tf.tasks.catalog import TaskConfig

PRECISIONS = ("none", "mixed_float16", "mixed_bfloat16")
# --mixed_precision's default: mixed_bfloat16 under --strategy=tpu (TPUs compute in
# bfloat16 natively), none elsewhere; resolved when the configs are built.
AUTO_PRECISION = "auto"
INPUT_SHARDING = ("auto", "exact")
# Defaults other modules share: a stale lock's age (run/lock.py), the wait for
# multi_worker peers (training/strategy.py) and --student_config=auto's shapes, the 24
# BERT miniatures of Turc et al. 2019 ("Well-Read Students Learn Better").
DEFAULT_STALE_MINUTES = 10.0
DEFAULT_PEER_TIMEOUT = 300  # seconds
# The `when=` of the settings only --student_config=auto reads.
AUTO_STUDENT = ("student_config", "auto")
DEFAULT_CANDIDATES = tuple(f"{n}x{h}" for n in (2, 4, 6, 8, 10, 12)
                           for h in (128, 256, 512, 768))

# Stage names (`fields.STAGES`), short, for the `stages=` of the fields below.
GEN, FT, AUG, TASK, QUANT, EVAL, EXPORT = fields.STAGES
TRAINING = (GEN, FT, TASK, QUANT)  # the stages that run an optimizer
STUDENT = (GEN, TASK)  # the stages that make the student's shape and layers
DISTILL = (TASK, QUANT)  # the task student, and its int8 copy taught by it


def _terms_help() -> str:
    aliases = "; ".join(f"{a} = {','.join(v)}" for a, v in ALIASES.items())
    return f"any of {', '.join(sorted(TERMS))} ({aliases})"


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the run proceeds (not part of its results): no field shapes a stage; `read_by`
    names the stages that read a field (the unread-flag warning)."""

    output_dir: str = setting(None, "Where every stage writes its folder and report.json "
                              "(required).", group="run")
    # Its help lists the stages, which live in modules that import this one (flags.py).
    stages: tuple[str, ...] = setting(["all"], group="run")
    plugins: tuple[str, ...] = setting(
        [], "Python modules to import first: your own loss terms, task types, data sources, "
        "export formats or strategies register themselves on import (docs/extending.md).",
        group="plugins")
    overwrite: bool = setting(False, "Start the named stages over: delete their folders "
                              "(later stages made from them are redone as stale).", group="run")
    dry_run: bool = setting(False, "Check everything and print the resolved plan as JSON; "
                            "train nothing (exit 0, or 2 with every error).", group="run")
    # A string checked by strategy.make_strategy: strategies registered by user code count.
    strategy: str = setting("default", None, group="distribution")  # help: flags.py
    tpu: str = setting("", "TPU address for --strategy=tpu (e.g. grpc://10.0.0.2:8470).",
                       group="distribution", when=("strategy", "tpu"))
    checkpoint_every: int = setting(200, "Save a checkpoint every N steps.",
                                    check=at_least(1), group="run")
    keep_checkpoints: int = setting(2, "Checkpoints kept per phase.", check=at_least(1),
                                    group="run")
    keep_finished_checkpoints: bool = setting(
        False, "Keep a stage's training checkpoints (weights and optimizer state) once the "
        "stage is done. Only a resume within the stage reads them, and a done stage is never "
        "resumed (a changed setting redoes it from the start), so by default they are deleted "
        "when the stage is marked done: they are most of a run's disk (multi_worker: the "
        "chief's; the workers' scratch copies stay).", group="run")
    eval_batch_size: int = setting(64, "Batch size of evaluation.", check=positive(),
                                   group="run")
    latency_runs: int = setting(100, "Rounds of batch-1 forward passes timed for report.json, "
                                "one call of each model per round.", check=at_least(1),
                                group="run")
    augment_batch_size: int = setting(256, "Masked rows per MLM forward pass.",
                                      check=positive(), group="augment", read_by=["augment"])
    export_threads: int = setting(0, "TFLite interpreter threads for parity latency (0 = all "
                                  "CPU cores).", check=non_negative("0 = all cores"),
                                  group="export", read_by=["export"])
    export_latency_runs: int = setting(30, "Batch-1 calls timed per format.", check=at_least(1),
                                       group="export", read_by=["export"])
    export_max_examples: int = setting(0, "Dev examples checked for parity (0 = all).",
                                       check=non_negative("0 = all"), group="export",
                                       read_by=["export"])
    peer_timeout: float = setting(
        DEFAULT_PEER_TIMEOUT, "multi_worker: seconds to wait for every worker to start; after a "
        "SIGTERM, the longest wait for a step boundary before exiting anyway. A worker that "
        "dies mid-run is noticed within 10 s.", check=positive("seconds"), group="distribution")
    input_sharding: str = setting(
        "auto", "General stage under multi_worker/TPU pods: auto = each worker reads only its "
        "own corpus files when there are at least as many files as workers (else exact); "
        "exact = every worker reads the whole corpus and keeps its slice of each global batch "
        "(the batches of one replica).", choices=INPUT_SHARDING, group="distribution",
        read_by=["general"])
    teacher_cache: bool = setting(
        True, "Compute the teacher's logits (prediction phase) or mapped layers (intermediate "
        "phase, within --teacher_cache_budget_gb) once and reuse them every epoch.",
        group="run", read_by=["task"])
    teacher_cache_budget_gb: float = setting(
        8.0, "Most GiB of the teacher's mapped layers (bfloat16) cached for an intermediate "
        "phase of several epochs (0 = never); the plan says whether they fit.",
        check=non_negative("0 = never"), group="run", when=("teacher_cache", True),
        read_by=["task"])
    lock_stale_minutes: float = setting(
        DEFAULT_STALE_MINUTES, "A run locks --output_dir (OUTPUT/.lock) and heartbeats; a lock "
        "left on another host counts as dead, and is taken over, once its heartbeat is this "
        "old (same host: once its process is gone).", check=positive(), group="run")
    # How steps run, not what they compute: a run may switch it and reuse its stages.
    run_eagerly: bool = setting(
        False, "Run each training step eagerly instead of tracing it into a graph (keras' "
        "run_eagerly): to step through a loss term with pdb or print. Same results; slower per "
        "step on real models, faster only for phases of a few steps on toy models (the tests). "
        "Excludes --jit_compile.", group="numerics")
    # --teacher_precision as given (`TaskDistillConfig.teacher_precision` holds the
    # resolved dtype); the plan explains the choice from it.
    teacher_precision_request: str = flag("teacher_precision")


@dataclasses.dataclass(frozen=True)
class Numerics:
    seed: int = setting(42, "Random seed for data order, dropout, augmentation.",
                        check=within(0, 2**32 - 1, "in [0, 2**32 - 1] (NumPy's seed range)"),
                        stages=(GEN, FT, AUG, TASK, QUANT))
    mixed_precision: str = setting(
        AUTO_PRECISION, "Keras mixed-precision policy for training; losses stay float32. "
        "auto: mixed_bfloat16 with --strategy=tpu, none otherwise.",
        choices=(AUTO_PRECISION, *PRECISIONS), stages=TRAINING)
    jit_compile: bool = setting(False, "XLA-compile the train step (each phase compiles once "
                                "per sequence length: full batches, --length_buckets lengths "
                                "at most).", stages=TRAINING)
    length_buckets: int = setting(
        8, "Pad each batch to the smallest of N evenly spaced lengths holding its longest row, "
        "not --max_seq_len (0), where padding does not change the loss (docs/distillation.md).",
        check=non_negative("0 = every batch padded to --max_seq_len"), stages=(FT, TASK, QUANT))


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
    teacher: str = setting("minilm-l6", "Pre-trained teacher: a model directory (ours, Hugging "
                           "Face, keras-hub preset) or a short name (minilm-l6 = the embedded "
                           "teacher).", stages=(GEN, FT, AUG, TASK))
    task_teacher: str = setting("", "Fine-tuned teacher with a task head. Empty: the "
                                "finetune_teacher stage fine-tunes --teacher on the task.",
                                stages=(AUG, TASK))
    teacher_label_order: tuple[str, ...] = setting(
        [], "The task teacher's label names in its output order, when its directory does not "
        "name them (e.g. LABEL_0, LABEL_1, ...).", stages=(TASK,))
    student_config: str = setting(
        "tinybert_4l_312d", "Student shape: a preset name, a config JSON file, or 'auto': the "
        "shape within --latency_budget_ms with the most transformer-layer parameters "
        "(docs/pipeline.md).", stages=STUDENT)
    # --student_config=auto's settings (when=AUTO_STUDENT): they shape the student only, and
    # with a fixed --student_config they are refused (flags.ignored_auto_student_flags).
    latency_budget_ms: float = setting(0.0, "--student_config=auto: the most one call of the "
                                       "student may take on --latency_runtime.",
                                       stages=STUDENT, when=AUTO_STUDENT)
    latency_runtime: str = setting(
        "tflite_float32", "--student_config=auto: the runtime the student ships on, which each "
        "candidate is exported to and timed in.",
        choices=("tflite_float32", "tflite_dynamic_int8", "tflite_int8", "saved_model"),
        stages=STUDENT, when=AUTO_STUDENT)
    latency_seq_len: int = setting(128, "--student_config=auto: tokens per call timed.",
                                   stages=STUDENT, when=AUTO_STUDENT)
    latency_batch: int = setting(1, "--student_config=auto: sequences per call timed.",
                                 stages=STUDENT, when=AUTO_STUDENT)
    latency_table: str = setting(
        "", "--student_config=auto: a CSV of latencies measured on the target device "
        "(layers,hidden,heads,intermediate,latency_ms) instead of measuring here "
        "(docs/pipeline.md).", stages=STUDENT, when=AUTO_STUDENT)
    latency_candidates: tuple[str, ...] = setting(
        list(DEFAULT_CANDIDATES), "--student_config=auto: the shapes measured, "
        "LAYERSxHIDDEN[xHEADS[xFFN]] (default: the 24 BERT miniatures of Turc et al. 2019; "
        "H/64 heads, 4H feed-forward; the teacher's heads, H rounded to a multiple of them, "
        "when --loss_terms or --recipe compares heads one to one; with teacher layers "
        "copied (--init_from_teacher), 1..N layers of the teacher's width with its "
        "feed-forward size or 3/4, 1/2, 1/4 of it).", stages=STUDENT, when=AUTO_STUDENT)
    init_from_teacher: bool = setting(
        False, "General stage: start the student from the teacher's embeddings and its mapped "
        "layers (--layer_mapping) instead of random weights, as DistilBERT does; needs the "
        "teacher's width, FFN size and head count.", stages=(GEN,))
    general_model: str = setting(
        "", "Student to start task distillation from: a model directory, 'none' (random init, "
        "as --student_init=random), or empty for OUTPUT/general.", stages=(TASK,))
    student_init: str = setting(
        "general", "Where the task stage's student starts: general (--general_model, or "
        "OUTPUT/general) or random (no general distillation: the paper's 'w/o GD'; "
        "--general_model is then not read).", choices=("general", "random"), stages=(TASK,))
    # A string checked when the task is resolved: task types registered by user code
    # may bring their own head styles.
    classifier_head: str = setting(
        "pooler", "The student's head for sentence tasks: pooler (BERT's: dropout and a dense "
        "layer on the pooled [CLS] output) or pre_classifier (DistilBERT's: dense, ReLU, "
        "dropout 0.2, dense on the [CLS] state, no pooler). Teachers keep their own head.",
        stages=(TASK,))

    @property
    def random_student(self) -> bool:
        """--student_init=random (or --general_model=none): task distillation from a
        randomly initialised student (the paper's "w/o GD")."""
        return self.student_init == "random" or self.general_model.lower() == "none"

    @property
    def teacher_given(self) -> bool:
        """--task_teacher gives the fine-tuned teacher: the finetune_teacher stage makes
        none, later stages read --task_teacher, and --teacher_label_order describes it."""
        return bool(self.task_teacher)

    @property
    def vocab_teacher(self) -> str:
        """The model whose vocab and casing the task models share: --task_teacher when
        given, else --teacher (fine-tuning keeps the vocab)."""
        return self.task_teacher if self.teacher_given else self.teacher

    @property
    def general_given(self) -> bool:
        """The task stage's student comes from no general stage of this run: a given
        --general_model, or a random start."""
        return bool(self.general_model) or self.random_student


@dataclasses.dataclass(frozen=True)
class LossConfig:
    # The quantize stage's own terms are --quantize_loss_terms.
    loss_terms: tuple[str, ...] = setting(["embd", "attn", "hidn"],
                                          lambda: f"Intermediate loss terms: {_terms_help()}.",
                                          stages=STUDENT)
    temperature: float = setting(1.0, "Temperature t of the prediction loss.",
                                 check=positive(), stages=DISTILL)
    hard_label_weight: float = setting(0.0, "Weight of the ground-truth loss mixed into the "
                                       "prediction phase (0 = the paper).",
                                       check=non_negative(), stages=(TASK,))
    pkd_alpha: float = setting(0.7, "Patient KD: weight alpha of the soft targets (1 - alpha "
                               "weighs the ground truth); T is --temperature.", check=FRACTION,
                               stages=(TASK,))
    pkd_beta: float = setting(500.0, "Patient KD: weight beta of the patient loss on the "
                              "normalised [CLS] states of the mapped layers.",
                              check=non_negative(), stages=(TASK,))
    layer_mapping: str = setting(
        "uniform", "Student->teacher layer map: uniform, top, bottom, or a comma list of "
        "teacher layers (1-based) for student layers 1..M.", stages=STUDENT)
    layer_weights: tuple[str, ...] = setting(
        [], "lambda_m per student layer 0..M+1 (default all 1).", stages=STUDENT)
    share_hidden_projection: bool = setting(
        True, "One W_h for all layers (reference code) instead of one per layer.",
        stages=STUDENT)
    mask_padding: bool = setting(False, "Restrict intermediate losses to real tokens (a "
                                 "deviation from the reference; see docs).",
                                 stages=(GEN, TASK, QUANT))
    minilm_relation_heads: int = setting(
        48, "MiniLMv2 (minilm_rel): relation heads the concatenated Q, K and V of both models "
        "are split into; must divide both attention widths (paper: 48 for base-size "
        "teachers).", stages=(GEN, TASK, QUANT))
    minilm_teacher_layer: int = setting(
        0, "MiniLMv2 (minilm_rel): the teacher layer (1-based) whose relations the student's "
        "last layer learns; 0 = the teacher's last layer (the paper's choice for base-size "
        "teachers; an upper-middle layer for large ones).", stages=(GEN, TASK, QUANT))

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
    weight_decay: float = setting(0.01, "AdamW weight decay (not on LayerNorm or biases).",
                                  check=non_negative(), stages=TRAINING)
    warmup_proportion: float = setting(0.1, "Linear warm-up fraction of task phases.",
                                       check=FRACTION, stages=TRAINING)
    clip_norm: float = setting(1.0, "Global-norm gradient clipping (0 = off).",
                               check=non_negative("0 = off"), stages=TRAINING)
    grad_accum_steps: int = setting(1, "Micro-batches per update: each global batch is split "
                                    "into this many (memory), the update is the same.",
                                    check=at_least(1), stages=TRAINING)


@dataclasses.dataclass(frozen=True)
class GeneralConfig:
    # A string checked by preflight: recipes registered by user code count.
    recipe: str = setting("tinybert", None, stages=(GEN,))  # help: flags.py (the recipes)
    corpus: str = setting(
        "", "General corpus (general distillation; Word2Vec for augmentation): text "
        "files/globs (BERT format, .gz/.bz2), a Wikipedia XML dump (.xml.bz2), TFRecord shards "
        "(.tfrecord), or tfds:NAME. Empty: the Wikipedia sample shipped in gensim.",
        stages=(GEN,), group="corpus")
    # A resolved hold-out name ("none" or registered): part of the general stage's settings.
    holdout: str = setting(
        "auto", "Articles left out of the general corpus, by title (Wikipedia dumps, "
        "tfds:wikipedia): auto = the task's own hold-out (wiki_pairs: its dev articles; other "
        "tasks: none), none, or a registered hold-out name.", flag="general_holdout",
        stages=(GEN,))
    max_seq_len: int = setting(128, "Sequence length of general distillation.",
                               flag="general_max_seq_len", check=at_least(4), stages=(GEN,))
    batch_size: int = setting(256, "Effective global batch of general distillation (one "
                              "optimizer update; --grad_accum_steps splits it).",
                              flag="general_batch_size", check=positive(), stages=(GEN,))
    epochs: float = setting(3, "Epochs over the corpus in general distillation.",
                            flag="general_epochs", check=non_negative(), stages=(GEN,))
    max_steps: int = setting(0, "Stop general distillation after this many steps (0 = no "
                             "limit).", flag="general_max_steps",
                             check=non_negative("0 = no limit"), stages=(GEN,))
    lr: float = setting(1e-4, "Peak learning rate of general distillation.", flag="general_lr",
                        check=positive(), stages=(GEN,))
    warmup: float = setting(0.1, "Warm-up fraction of general distillation.",
                            flag="general_warmup", check=FRACTION, stages=(GEN,))
    # DistilBERT recipe.
    alpha_ce: float = setting(5.0, "DistilBERT: weight of the soft-target loss.",
                              check=non_negative(), stages=(GEN,))
    alpha_mlm: float = setting(2.0, "DistilBERT: weight of the MLM loss.",
                               check=non_negative(), stages=(GEN,))
    alpha_cos: float = setting(1.0, "DistilBERT: weight of the cosine loss.",
                               check=non_negative(), stages=(GEN,))
    distil_temperature: float = setting(2.0, "DistilBERT: softmax temperature.",
                                        check=positive(), stages=(GEN,))
    restrict_ce_to_mask: bool = setting(
        False, "DistilBERT: soft targets at the masked positions only (the DistilBERT code's "
        "default is every real token).", stages=(GEN,))


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    epochs: float = setting(3, "Epochs of teacher fine-tuning.", flag="teacher_epochs",
                            check=non_negative(), stages=(FT,))
    lr: float = setting(2e-5, "Peak learning rate of teacher fine-tuning.", flag="teacher_lr",
                        check=positive(), stages=(FT,))
    batch_size: int = setting(32, "Batch size of teacher fine-tuning.",
                              flag="teacher_batch_size", check=positive(), stages=(FT,))
    max_steps: int = setting(0, "Stop teacher fine-tuning after this many steps (0 = no "
                             "limit): bounds its time on a large training file.",
                             flag="teacher_max_steps", check=non_negative("0 = no limit"),
                             stages=(FT,))


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    mlm_model: str = setting(
        "", "Model directory with an MLM head for single-piece candidates (Hugging Face "
        "BertForMaskedLM dir, keras-hub BertMaskedLM preset dir, or ours).", stages=(AUG,))
    word_vectors: str = setting("", "Word vectors for multi-piece words: GloVe .txt, word2vec "
                                ".txt/.bin, or gensim .kv.", stages=(AUG,))
    augment_fallback: bool = setting(
        False, "Allow augmentation without --mlm_model (word vectors serve every word) and "
        "without --word_vectors (Word2Vec trained on --corpus). The paper's Algorithm 1 needs "
        "both; the demo sets this.", stages=(AUG,))
    num_aug: int = setting(20, "N_a: augmented variants per example (paper: 20).",
                           check=at_least(1), stages=(AUG,))
    # 0 is refused here, not by the library (augment_source writes the input then): a
    # run's "augmented" data would be its original rows.
    replace_prob: float = setting(0.4, "p_t: probability to replace a word (paper: 0.4).",
                                  check=above_zero_fraction(
                                      "0 replaces no word, and the augmented file would hold "
                                      "only the original rows: for those, give "
                                      "--nouse_augmented"), stages=(AUG,))
    num_candidates: int = setting(15, "K: candidates per word (paper: 15).", check=at_least(1),
                                  stages=(AUG,))
    vector_vocab_limit: int = setting(
        100000, "Neighbours among the first N words of the vector file (the reference: 100000 "
        "GloVe words); 0 = all.", check=non_negative("0 = all"), stages=(AUG,))
    # The Word2Vec fallback's corpus: --corpus, declared by GeneralConfig.corpus.
    corpus: str = flag("corpus", stages=(AUG,))


@dataclasses.dataclass(frozen=True)
class TaskDistillConfig:
    use_augmented: bool = setting(True, "Task distillation on the augmented data (else the "
                                  "original training set).", stages=DISTILL)
    augmented_file: str = setting(
        "", "A finished augmented training file (bin/augment's output, or another run's "
        "OUTPUT/augment/<file>) to distil on instead of running this run's augment stage; "
        "empty: OUTPUT/augment.", stages=DISTILL)
    # Its help lists the phase kinds, which live in a module that imports this one (flags.py).
    task_phases: tuple[str, ...] = setting(["intermediate", "prediction"], stages=(TASK,))
    intermediate_epochs: float = setting(20, "Epochs of the intermediate phase.",
                                         check=non_negative(), stages=(TASK,))
    intermediate_lr: float = setting(5e-5, "Learning rate of the intermediate phase.",
                                     check=positive(), stages=(TASK,))
    pred_epochs: float = setting(3, "Epochs of the prediction-layer phase.",
                                 check=non_negative(), stages=(TASK,))
    pred_lr: float = setting(3e-5, "Learning rate of the prediction-layer phase.",
                             check=positive(), stages=(TASK,))
    pkd_epochs: float = setting(4, "Epochs of the pkd phase (Patient KD; its code's default "
                                "4).", check=non_negative(), stages=(TASK,))
    pkd_lr: float = setting(1e-5, "Learning rate of the pkd phase (the PKD code's patient-KD "
                            "setting).", check=positive(), stages=(TASK,))
    finetune_epochs: float = setting(
        3, "Epochs of the finetune phase (ground-truth labels, no teacher; on the augmented "
        "set with --use_augmented, as the prediction phase).", check=non_negative(),
        stages=(TASK,))
    finetune_lr: float = setting(3e-5, "Learning rate of the finetune phase.", check=positive(),
                                 stages=(TASK,))
    pred_grid: tuple[str, ...] = setting(
        [], "BATCH:LR cells (e.g. 16:1e-5,32:3e-5): the last task phase runs once per cell "
        "from one run of the phases before it; the cell best on dev is kept (the paper's "
        "{16,32} x {1e-5,2e-5,3e-5}).", stages=(TASK,))
    # The quantize stage's records have always held these two as well: dropping them
    # would make every recorded quantize stage stale.
    batch_size: int = setting(32, "Global batch size of task distillation.",
                              flag="task_batch_size", check=positive(), stages=DISTILL)
    max_steps: int = setting(0, "Cap on steps per task phase (0 = none).", flag="task_max_steps",
                             check=non_negative("0 = no limit"), stages=DISTILL)
    eval_every: int = setting(
        0, "Evaluate on dev every N steps in the last task phase (0 = once per epoch); the "
        "best checkpoint is kept. The reference evaluates every 100 steps (the task configs' "
        "value).", check=non_negative("0 = once per epoch"), stages=(TASK,))
    # Resolved: float32, bfloat16 or float16 (never auto), see `teacher_precision_decision`.
    teacher_precision: str = setting(
        "auto", "dtype of the frozen task-stage teacher. auto: bfloat16 on TPUs, Ampere+ GPUs "
        "and CPUs with AVX512-BF16/AMX, else float32; the plan says why.",
        choices=precision.TEACHER_PRECISIONS, stages=DISTILL)


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """The quantize stage: quantisation-aware distillation of the task student into
    its int8 form (the int8 export's model)."""

    enabled: bool = setting(
        True, "Run the quantize stage when --export_formats has int8: the float task student "
        "teaches its int8 fake-quantised copy, and the int8 TFLite flavour is converted from "
        "it with its learnt ranges (--noquantize: int8 is calibrated after training).",
        flag="quantize", stages=(QUANT,))
    steps: int = setting(300, "Optimizer steps of quantisation-aware distillation (0 = "
                         "calibrate the ranges only).", flag="quantize_steps",
                         check=non_negative("0 = calibrate only"), stages=(QUANT,))
    lr: float = setting(
        2e-5, "Peak learning rate of the quantize stage (linear warm-up over "
        "--warmup_proportion, then decay); 0: the int8 copy keeps the float student's weights "
        "and its steps only move the activation ranges (forward passes, no gradients).",
        flag="quantize_lr", check=non_negative("0 = keep the weights, fit the ranges only"),
        stages=(QUANT,))
    batch_size: int = setting(32, "Global batch size of the quantize stage.",
                              flag="quantize_batch_size", check=positive(), stages=(QUANT,))
    loss_terms: tuple[str, ...] = setting(
        ["pred"], "Loss terms of the quantize stage, the float student teaching: pred (soft "
        "cross-entropy, or MSE for a score), and any of embd, attn, hidn (identity "
        "projections).", flag="quantize_loss_terms", stages=(QUANT,))
    calibration_examples: int = setting(
        256, "Training rows (a seeded sample) whose float activations set the int8 ranges "
        "before training.", flag="quantize_calibration_examples", check=at_least(1),
        stages=(QUANT,))
    eval_every: int = setting(
        50, "Every N steps of the quantize stage (and at its end), measure on dev how many of "
        "the float student's answers its int8 copy keeps (label agreement) and keep the "
        "checkpoint that keeps most (the earlier on a tie); 0: keep the last weights. "
        "Regression, with no answers to keep, keeps the last.", flag="quantize_eval_every",
        check=non_negative("0 = keep the last weights"), stages=(QUANT,))


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    glue_test_predictions: bool = setting(
        False, "Evaluate stage: also write the student's predictions on the GLUE test split(s) "
        "as OUTPUT/evaluate/glue_submission/<Task>.tsv, the GLUE server's files (MNLI: "
        "MNLI-m, MNLI-mm and AX).", stages=(EVAL,))


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    formats: tuple[str, ...] = setting(
        list(DEFAULT_FORMATS), lambda: f"What to export: any of {', '.join(FORMATS)}.",
        flag="export_formats", stages=(EXPORT,))
    representative_examples: int = setting(
        200, "Examples of task text used to calibrate full-integer TFLite.",
        check=non_negative(), stages=(EXPORT,))
    keras_hub_approximate_gelu: bool = setting(
        False, "keras_hub format: export a model trained with exact GELU (the embedded MiniLM "
        "teacher's, and so its students') although keras-hub's BERT computes the tanh "
        "approximation; parity.json's keras_hub row shows the cost (docs/models.md). Without "
        "it such an export is refused (by --dry_run too).", stages=(EXPORT,))

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
    general: GeneralConfig
    finetune: FinetuneConfig
    augment: AugmentConfig
    loss: LossConfig
    optim: OptimConfig
    distill: TaskDistillConfig
    quantize: QuantizeConfig
    evaluate: EvaluateConfig
    export: ExportConfig

    @classmethod
    def from_flags(cls, values: Any) -> "PipelineConfig":
        parts = {name: fields.from_flags(part, values) for name, part in PART_TYPES.items()}
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
        # As registered (`HF` -> `hf`): the stages test names like `"int8" in formats`,
        # and run_config.json records one spelling.
        parts["export"] = dataclasses.replace(parts["export"], formats=tuple(
            registered_name(f) for f in parts["export"].formats))
        general = parts["general"]
        parts["general"] = dataclasses.replace(
            general, holdout=holdout.resolve(general.holdout, parts["task"].task))
        return cls(**parts)

    @property
    def teacher_precision(self) -> "precision.Decision":
        """The task-stage teacher's dtype and why (`--teacher_precision`)."""
        return teacher_precision_decision(self.run)

    def parts(self) -> list[Any]:
        """The configs, `run` first."""
        return [getattr(self, name) for name in PART_TYPES]

    def results(self) -> dict[str, Any]:
        """The result-affecting configs as {flag: value}, JSON-friendly (run_config.json)."""
        out: dict[str, Any] = {}
        for name in PART_TYPES:
            if name != "run":
                out.update(as_flags(getattr(self, name)))
        return out

    def stage_settings(self, stage: str) -> dict[str, Any]:
        """The settings `stage`'s output depends on (besides the stages it reads), as
        {flag: value}: the fields whose `stages` name it."""
        if stage not in fields.STAGES:
            raise KeyError(stage)
        return {name: _jsonable(value) for part in self.parts()
                for name, value in fields.stage_fields(part, stage)}


# The configs in the order a stage's settings list them: every config whose fields
# define flags.
PART_TYPES = {"run": RunOptions, "numerics": Numerics, "models": ModelsConfig,
              "task": TaskConfig, "general": GeneralConfig, "finetune": FinetuneConfig,
              "augment": AugmentConfig, "loss": LossConfig, "optim": OptimConfig,
              "distill": TaskDistillConfig, "quantize": QuantizeConfig,
              "evaluate": EvaluateConfig, "export": ExportConfig}


def teacher_precision_decision(run: RunOptions) -> "precision.Decision":
    """--teacher_precision resolved on this host (TPU: --strategy=tpu)."""
    return precision.decide(run.teacher_precision_request,
                            precision.detect(tpu=run.strategy == "tpu"))


def as_flags(part: Any) -> dict[str, Any]:
    """A config dataclass as {flag name: JSON-friendly value}."""
    return {fields.flag_name(f): _jsonable(getattr(part, f.name))
            for f in dataclasses.fields(part)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
