"""The pipeline's stages (paper Figure 1), each reading the previous stage's folder.

  general          GD: pre-trained teacher -> student on the general corpus (embd+attn+hidn),
                   or the DistilBERT recipe (--recipe=distilbert)
  finetune_teacher the teacher fine-tuned on the task (skipped when --task_teacher is given)
  augment          Algorithm 1 -> OUTPUT/augment/<the source's augmented file>
  task             TD: intermediate layers on the (augmented) task data, then prediction layer
  evaluate         dev metrics, params, FLOPs, latency -> report.json, loss_curves.png
  export           every --export_formats artefact + parity.json under OUTPUT/export

Every stage writes its model as a model directory (`load_model` reads it back),
so a user can start anywhere by pointing the next stage at an explicit path.
Each training phase is first described by a `PhaseSpec` (sizes, batches,
steps, schedule, loss terms) from the configs and the data sizes alone; the
dry run prints the same specs the stages train with.

Input distribution. Task phases give Keras one dataset of global batches
(rows in `task_input.epoch_rows` order, padded or length-bucketed as the
phase's `padding` says), which tf.distribute splits. The general stage
builds its input per worker (`strategy.distribute_datasets_from_function`,
`general_input`): with at least as many corpus files as workers each worker
reads only its own files ("file" sharding: less reading, but other batches
than one replica would see, and an epoch sized on the smallest worker's
share); otherwise, or with `--input_sharding=exact`, every worker reads the
whole corpus and keeps its slice of every global batch ("exact": the very
batches of a single replica).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import posixpath
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tinybert_tf.augment.augmenter import augment_source
from tinybert_tf.config import BertConfig, get_config
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.distill.distilbert import (
    describe_init,
    init_student_from_teacher,
    teacher_layers_for,
)
from tinybert_tf.distill.distiller import Distiller
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.optimizer import create_optimizer
from tinybert_tf.distill.terms import HardLabelTerm, LossTerm, PredictionTerm, make_terms
from tinybert_tf.export.parity import export_all
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import inspect_model, load_model, load_tokenizer, save_model
from tinybert_tf.models.labels import put_in_order
from tinybert_tf.pipeline import evaluation, report, task_input
from tinybert_tf.pipeline import teacher_cache as cache_lib
from tinybert_tf.pipeline.configs import PipelineConfig
from tinybert_tf.pipeline.precision import with_precision
from tinybert_tf.pipeline.state import RunState
from tinybert_tf.pipeline.strategy import is_chief, num_workers, peer_errors
from tinybert_tf.pipeline.training import Phase, run_phase, schedule_steps
from tinybert_tf.tasks.catalog import Task

log = logging.getLogger("tinybert_tf")

STAGES = ("general", "finetune_teacher", "augment", "task", "evaluate", "export")
# Stages that train nothing: under multi_worker only the chief runs them.
CHIEF_ONLY_STAGES = ("augment", "evaluate", "export")


@dataclasses.dataclass
class Context:
    """What every stage needs: the configs, the resolved task, the output folder,
    the strategy."""

    config: PipelineConfig
    task: Task
    state: RunState
    strategy: tf.distribute.Strategy

    @property
    def chief(self) -> bool:
        return is_chief(self.strategy)

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    @property
    def max_seq_len(self) -> int:
        return self.task.max_seq_len(self.config.task.max_seq_len)

    @functools.cached_property
    def tokenizer(self):
        """The task tokenizer at the task length: the teacher's vocab and casing (read
        from --task_teacher when given, else --teacher: fine-tuning keeps the vocab)."""
        models = self.config.models
        return load_tokenizer(models.task_teacher or models.teacher, self.max_seq_len)

    def augmented_path(self) -> str:
        return self.state.path("augment", self.task.source.augmented_name)

    def examples(self, split: str):
        task = self.task
        if split == "train_aug":
            task = task.with_augmented(self.augmented_path())
        return task.examples(split)

    @functools.cached_property
    def row_lengths(self) -> task_input.RowLengths:
        """Real tokens of each row of a list of examples (computed once per list)."""
        return task_input.RowLengths(self.task.type, self.tokenizer, self.max_seq_len)

    @property
    def inference_buckets(self) -> tuple[int, ...]:
        """Length buckets of evaluation and caching passes (() = padded)."""
        return task_input.inference_buckets(self.config, self.task.type, self.max_seq_len)

    def teacher_path(self) -> str:
        return self.config.models.task_teacher or self.state.path("finetune_teacher", "model")

    def general_path(self) -> str:
        return self.config.models.general_model or self.state.path("general", "model")

    def student_path(self) -> str:
        return self.state.path("task", "model")

    def trained_on(self) -> dict[str, Any]:
        """What a task model records of its training: the task (its flags, data paths
        absolute) and the sequence length, which bin/export defaults to."""
        return {"task": self.config.task.to_record(), "max_seq_len": self.max_seq_len}


def upstream(stage: str, config: PipelineConfig) -> list[str]:
    """The earlier stages whose output `stage` reads under `config`."""
    m, d = config.models, config.distill
    if stage == "task":
        return ([] if m.general_model else ["general"]) + \
               ([] if m.task_teacher else ["finetune_teacher"]) + \
               (["augment"] if d.use_augmented else [])
    if stage == "evaluate":
        return ([] if m.task_teacher else ["finetune_teacher"]) + ["task"]
    if stage == "export":
        return ["task"]
    return []


def rows(ctx: Context, examples) -> int:
    """Training rows of `examples` (QA: windows), the size a phase's steps come from."""
    return ctx.task.type.dataset_rows(examples, ctx.tokenizer, ctx.max_seq_len)


# --- phase specs ---------------------------------------------------------------------

@dataclasses.dataclass
class PhaseSpec:
    """A training phase as planned: sizes, batches, steps, schedule and terms."""

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
    # How batches are padded (task phases; None: the phase builds its own input).
    padding: Optional[task_input.Padding] = None
    # Further plan entries: the teacher's precision, the teacher caches.
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
        return int(self.warmup_fraction * self.total_steps)

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
        # max(1, .): --pred_epochs=0 (no prediction phase) still builds a valid schedule.
        return create_optimizer(self.lr, max(1, self.total_steps),
                                warmup_steps=self.warmup_steps, weight_decay=weight_decay,
                                schedule=self.schedule)

    def describe(self) -> dict[str, Any]:
        return {"stage": self.stage, "phase": self.name, "folder": self.directory,
                "data": self.data, "examples": self.examples,
                "global_batch": self.global_batch, "micro_batch": self.micro_batch,
                "accumulation": self.accumulation, "replicas": self.replicas,
                "steps_per_epoch": self.steps_per_epoch, "epochs": self.epochs,
                "steps": self.total_steps,
                "learning_rate": {"peak": self.lr, "schedule": self.schedule,
                                  "warmup_steps": self.warmup_steps},
                "loss_terms": [t.get_config() for t in self.terms],
                **({"padding": self.padding.describe()} if self.padding else {}),
                **self.extra,
                **({"note": self.note} if self.note else {})}


def _phase(ctx: Context, stage: str, name: str, data: str, examples: int, batch: int,
           batch_flag: str, epochs: float, max_steps: int, lr: float, schedule: str,
           warmup: float, terms: list[LossTerm]) -> PhaseSpec:
    return PhaseSpec(stage, name, ctx.state.path(stage, name), data, int(examples), int(batch),
                     int(ctx.config.optim.grad_accum_steps), ctx.replicas, float(epochs),
                     int(max_steps), float(lr), schedule, float(warmup), terms, batch_flag)


def _corpus_source(ctx: Context) -> str:
    return ctx.config.general.corpus or corpus_lib.default_corpus_path()


def general_terms(ctx: Context) -> list[LossTerm]:
    c, loss = ctx.config.general, ctx.config.loss
    if c.distilbert:
        return make_terms("ce,mlm,cos", temperature=c.distil_temperature,
                          restrict_ce_to_mask=c.restrict_ce_to_mask,
                          weights={"ce": c.alpha_ce, "mlm": c.alpha_mlm, "cos": c.alpha_cos})
    return make_terms(loss.loss_terms, layer_mapping=loss.layer_mapping,
                      layer_weights=loss.lambdas, mask_padding=loss.mask_padding)


def general_sharding(ctx: Context) -> str:
    """How the general stage's input is split over the workers: "file" (each worker
    reads only its own corpus files) or "exact" (every worker reads the whole corpus
    and keeps its slice of each global batch; also a single worker's only mode)."""
    n = num_workers(ctx.strategy)
    if n <= 1 or ctx.config.run.input_sharding == "exact":
        return "exact"
    shard = corpus_lib.input_shard(_corpus_source(ctx), n, 0)
    return "file" if shard.mode == "file" else "exact"


def general_phase(ctx: Context, count: Optional[int] = None) -> PhaseSpec:
    """The general stage's phase; `count` = packed sequences per epoch (counted
    and cached in the stage folder when not given). Under "file" sharding with
    known per-file counts (TFRecord shards), an epoch is as many steps as the
    smallest worker's share fills: every worker must take the same steps."""
    c = ctx.config.general
    if count is None:
        count = corpus_sequences(ctx)
    note = ""
    if general_sharding(ctx) == "file":
        n = num_workers(ctx.strategy)
        shares = corpus_lib.pipeline_sequence_counts(_corpus_source(ctx), n)
        if shares:
            count = min(shares) * n
            note = (f"file sharding over {n} workers: an epoch is {min(shares)} sequences "
                    f"per worker (the smallest share of {shares})")
        else:
            note = (f"file sharding over {n} workers: per-worker counts are unknown (no "
                    "PREFIX.json), so workers with fewer sequences wrap around in an epoch")
    spec = _phase(ctx, "general", "distill", f"corpus {_corpus_source(ctx)}", count,
                  c.batch_size, "--general_batch_size", c.epochs, c.max_steps, c.lr, "linear",
                  c.warmup, general_terms(ctx))
    spec.note = note
    return spec


def corpus_sequences(ctx: Context) -> int:
    """Packed sequences per epoch of the corpus, cached by path, size and mtime."""
    c = ctx.config.general
    source = _corpus_source(ctx)
    pack = "single" if c.distilbert else "pair"
    key = {"source": source, "max_seq_len": c.max_seq_len, "pack": pack,
           "files": corpus_lib.source_facts(source)}
    count_path = ctx.state.path("general", "corpus_count.json")
    counted = read_json(count_path, default=None)
    if counted is not None and counted.get("key") == key:
        return int(counted["sequences"])
    print(f"[general] counting sequences of {source} ...", flush=True)
    tokenizer = load_tokenizer(ctx.config.models.teacher, c.max_seq_len)
    n = corpus_lib.count_sequences(source, tokenizer, c.max_seq_len, pack=pack)
    if ctx.chief and not ctx.config.run.dry_run:  # a dry run writes nothing
        write_json_atomic(count_path, {"key": key, "sequences": int(n)})
    return int(n)


def finetune_phase(ctx: Context, train_size: int) -> PhaseSpec:
    c = ctx.config.finetune
    spec = _phase(ctx, "finetune_teacher", "train", "task train split", train_size,
                  c.batch_size, "--teacher_batch_size", c.epochs, c.max_steps, c.lr, "linear",
                  ctx.config.optim.warmup_proportion,
                  [HardLabelTerm(task=ctx.task.type)])
    return _with_padding(ctx, spec)


def _with_padding(ctx: Context, spec: PhaseSpec) -> PhaseSpec:
    spec.padding = task_input.padding_for(ctx.config, ctx.task.type, spec.terms,
                                          ctx.max_seq_len)
    return spec


def _task_teacher_plan(ctx: Context, spec: PhaseSpec) -> PhaseSpec:
    """A task phase's padding and the frozen teacher's dtype (`--teacher_precision`)."""
    spec.extra["teacher_precision"] = ctx.config.teacher_precision.describe()
    return _with_padding(ctx, spec)


def intermediate_phase(ctx: Context, train_size: int) -> PhaseSpec:
    d, loss = ctx.config.distill, ctx.config.loss
    terms = make_terms(loss.loss_terms, layer_mapping=loss.layer_mapping,
                       layer_weights=loss.lambdas, mask_padding=loss.mask_padding)
    data = "augmented train split" if d.use_augmented else "task train split"
    # The reference trains the intermediate phase at a constant rate.
    return _task_teacher_plan(ctx, _phase(
        ctx, "task", "intermediate", data, train_size, d.batch_size, "--task_batch_size",
        d.intermediate_epochs, d.max_steps, d.intermediate_lr, "constant", 0.0, terms))


def prediction_phase(ctx: Context, train_size: int) -> PhaseSpec:
    d, loss = ctx.config.distill, ctx.config.loss
    terms: list[LossTerm] = [PredictionTerm(task=ctx.task.type, temperature=loss.temperature,
                                            layer_weights=loss.lambdas)]
    if loss.hard_label_weight > 0:
        terms.append(HardLabelTerm(task=ctx.task.type, weight=loss.hard_label_weight))
    data = ("augmented train split" if d.use_augmented and not prediction_on_original(ctx)
            else "task train split")
    spec = _task_teacher_plan(ctx, _phase(
        ctx, "task", "prediction", data, train_size, d.batch_size, "--task_batch_size",
        d.pred_epochs, d.max_steps, d.pred_lr, "linear", ctx.config.optim.warmup_proportion,
        terms))
    spec.extra["teacher_cache"] = cache_lib.plan(ctx.task.type, terms,
                                                 ctx.config.run.teacher_cache)
    return spec


def prediction_on_original(ctx: Context) -> bool:
    return ctx.config.distill.use_augmented and ctx.task.type.predict_on_original_data


# --- shared helpers --------------------------------------------------------------------

# The learning-rate flag of each (stage, phase): what a diverged phase's message names.
LR_FLAGS = {("general", "distill"): "general_lr", ("finetune_teacher", "train"): "teacher_lr",
            ("task", "intermediate"): "intermediate_lr", ("task", "prediction"): "pred_lr"}


def divergence_hint(ctx: Context, stage: str, phase: str) -> str:
    """What to change when `phase` of `stage` diverges: its learning-rate flag and value,
    and the command that redoes the stage."""
    flag = LR_FLAGS.get((stage, phase))
    results = ctx.config.results()
    lower = (f"lower --{flag} (now {results[flag]:g})" if flag in results
             else "lower the phase's learning rate")
    return f"{lower}, then redo the stage with --stages={stage} --overwrite"


def _run(ctx: Context, phase: Phase) -> dict[str, Any]:
    r = ctx.config.run
    stage = posixpath.basename(posixpath.dirname(phase.directory.rstrip("/")))
    phase.hint = phase.hint or divergence_hint(ctx, stage, phase.name)
    with peer_errors(r.peer_timeout):
        return run_phase(phase, ctx.strategy, checkpoint_every=r.checkpoint_every,
                         keep_checkpoints=r.keep_checkpoints, log_every=1, verbose=1,
                         stop_grace_seconds=r.peer_timeout)


def _distiller(ctx: Context, student, teacher, spec: PhaseSpec,
               label_metrics=()) -> Distiller:
    o, loss = ctx.config.optim, ctx.config.loss
    distiller = Distiller(student=student, teacher=teacher, terms=spec.terms,
                          clip_norm=o.clip_norm or None, grad_accum_steps=o.grad_accum_steps,
                          share_hidden_projection=loss.share_hidden_projection,
                          label_metrics=list(label_metrics))
    distiller.compile(optimizer=spec.optimizer(o.weight_decay),
                      jit_compile=ctx.config.numerics.jit_compile)
    return distiller


def _evaluator(ctx: Context, model, examples,
               out_dir: Optional[str] = None) -> Callable[[], dict[str, float]]:
    batch = ctx.config.run.eval_batch_size
    where: dict[str, Any] = {"out_dir": out_dir} if out_dir else {}  # prediction files
    if ctx.inference_buckets:
        where["length_buckets"] = ctx.inference_buckets
    return lambda: ctx.task.type.evaluate(model, examples, ctx.tokenizer, ctx.max_seq_len,
                                          batch, **where)


def load_task_teacher(ctx: Context) -> BertModel:
    """The fine-tuned teacher, its outputs put in the task's label order by name."""
    teacher = load_model(ctx.teacher_path())
    task = ctx.task.type
    if task.named_outputs:
        m = ctx.config.models
        # --teacher_label_order describes an external --task_teacher only; ours name theirs.
        given = m.teacher_label_order if m.task_teacher else ()
        mapping = put_in_order(teacher, task.label_names, given,
                               what=f"the task teacher ({ctx.teacher_path()})")
        if list(mapping.values()) != list(range(len(mapping))):
            print(f"[teacher] outputs reordered to the task's labels: {mapping}", flush=True)
    return teacher


# --- general distillation ------------------------------------------------------------

def general(ctx: Context) -> dict[str, Any]:
    c, m = ctx.config.general, ctx.config.models
    spec = general_phase(ctx)
    spec.check()
    with ctx.strategy.scope():
        teacher = load_model(m.teacher, head="mlm" if c.distilbert else None)
        tokenizer = load_tokenizer(teacher, c.max_seq_len)
        config = student_config(ctx, teacher.bert_config, len(teacher.vocab))
        student = BertModel(config, head="mlm" if c.distilbert else None, vocab=teacher.vocab)
        if c.distilbert or m.init_from_teacher:
            # DistilBERT: every other layer; TinyBERT: the layers g(m) the student learns from.
            layers = "every_other" if c.distilbert else [
                g - 1 for g in layer_map(ctx.config.loss.layer_mapping, config.num_layers,
                                         teacher.bert_config.num_layers)[1:]]
            copied = init_student_from_teacher(student, teacher, layers=layers)
            chosen = teacher_layers_for(layers, config.num_layers,
                                        teacher.bert_config.num_layers)
            print(f"[general] student initialised from the teacher: copied "
                  f"{describe_init(copied, chosen)}", flush=True)
        distiller = _distiller(ctx, student, teacher, spec)

    phase = Phase("general", spec.directory, distiller, distiller.checkpoint_items(), None,
                  spec.steps_per_epoch, spec.epochs, max_steps=spec.max_steps,
                  make_input=functools.partial(general_input, ctx, tokenizer))
    result = _run(ctx, phase)
    if ctx.chief:
        # Written aside; published as general/model with the stage's done marker.
        save_model(student, ctx.state.work_path("general", "model"),
                   metadata={"stage": "general", "teacher": m.teacher, "recipe": c.recipe})
    return {"steps": result["steps"], "sequences_per_epoch": spec.examples}


def general_input(ctx: Context, tokenizer, epoch: int, offset: int, steps: int):
    """The general stage's input for `steps` steps from step `offset` of `epoch`, built
    on each worker (`distribute_datasets_from_function`, see the module docstring).

    Each input pipeline yields per-replica batches (static shapes: drop_remainder),
    `replicas per worker` of them per step; the skip and take for a resume apply
    inside, in those units.
    """
    c = ctx.config.general
    source = _corpus_source(ctx)
    mode = general_sharding(ctx)
    options = dict(max_seq_len=c.max_seq_len, seed=ctx.config.numerics.seed + epoch,
                   pack="single" if c.distilbert else "pair", masking=c.distilbert,
                   drop_remainder=True)

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        per_replica = input_context.get_per_replica_batch_size(c.batch_size)
        if mode == "file":
            ds = corpus_lib.general_dataset(source, tokenizer, batch_size=c.batch_size,
                                            input_context=input_context, repeat=True,
                                            **options)
        else:  # the global batches of one replica; this pipeline keeps its slice
            ds = corpus_lib.general_dataset(source, tokenizer, batch_size=c.batch_size,
                                            **options)
            ds = _pipeline_slice(ds, input_context, c.batch_size, per_replica)
        return ds.skip(offset * local).take(steps * local)

    return ctx.strategy.distribute_datasets_from_function(dataset_fn)


def _pipeline_slice(ds: tf.data.Dataset, input_context: tf.distribute.InputContext,
                    global_batch: int, per_replica: int) -> tf.data.Dataset:
    """Global batches [B, ...] -> this input pipeline's contiguous share of each, as
    per-replica batches [B / replicas, ...], in order."""
    n = input_context.num_input_pipelines
    if n == 1 and per_replica == global_batch:
        return ds
    size = global_batch // n
    lo = input_context.input_pipeline_id * size
    ds = ds.map(lambda batch: tf.nest.map_structure(lambda t: t[lo:lo + size], batch))
    if per_replica != size:
        ds = ds.unbatch().batch(per_replica, drop_remainder=True)
    return ds


def student_config(ctx: Context, teacher_config: BertConfig, vocab_size: int) -> BertConfig:
    """--student_config with the teacher's vocab size and casing (a student always
    tokenises as its teacher does)."""
    return get_config(ctx.config.models.student_config).replace(
        vocab_size=vocab_size, lower_case=teacher_config.lower_case)


# --- teacher fine-tuning -------------------------------------------------------------

def finetune_teacher(ctx: Context) -> dict[str, Any]:
    train, dev = ctx.examples("train"), ctx.examples(ctx.task.dev_splits[0])
    spec = finetune_phase(ctx, rows(ctx, train))
    spec.check()
    with ctx.strategy.scope():
        teacher = load_model(ctx.config.models.teacher, **ctx.task.type.head_kwargs())
        distiller = _distiller(ctx, teacher, None, spec, ctx.task.type.label_metrics())

    # The teacher after its last epoch, as BERT fine-tuning does: on a small dev
    # set the "best" epoch is noise, and an early teacher's soft targets are
    # near uniform, which leaves the prediction-layer phase nothing to teach.
    phase = Phase("finetune_teacher", spec.directory, distiller,
                  distiller.checkpoint_items(model_key="teacher"),
                  task_input.phase_input(ctx, train, spec), spec.steps_per_epoch,
                  spec.epochs, max_steps=spec.max_steps, evaluate=_evaluator(ctx, teacher, dev))
    result = _run(ctx, phase)
    last = result["evals"][-1] if result["evals"] else {}
    if ctx.chief:
        save_model(teacher, ctx.state.work_path("finetune_teacher", "model"),
                   metadata={"stage": "finetune_teacher", "dev": last, **ctx.trained_on(),
                             **ctx.task.type.model_metadata(last)})
    return {"dev": last}


# --- augmentation --------------------------------------------------------------------

def augment(ctx: Context) -> dict[str, Any]:
    a, r = ctx.config.augment, ctx.config.run
    # The teacher's vocab, read without weights: augmentation must tokenise as the
    # task models do.
    teacher_vocab = inspect_model(ctx.config.models.task_teacher
                                  or ctx.config.models.teacher).vocab
    stats = augment_source(
        ctx.task.source, ctx.augmented_path(), mlm_model=a.mlm_model or None,
        word_vectors=a.word_vectors or None, corpus=a.corpus or corpus_lib.default_corpus_path(),
        num_aug=a.num_aug, replace_prob=a.replace_prob, num_candidates=a.num_candidates,
        seed=ctx.config.numerics.seed, batch_size=r.augment_batch_size,
        vector_cache_dir=ctx.state.path("augment", "vectors"), vocab=teacher_vocab,
        vocab_limit=a.vector_vocab_limit)
    print(f"[augment] mode: {stats['mode']} ({stats['examples']} examples -> "
          f"{stats['written']} rows)", flush=True)
    return dict(stats)


# --- task distillation ---------------------------------------------------------------

def _student_for_task(ctx: Context, teacher: BertModel) -> BertModel:
    head = ctx.task.type.head_kwargs()
    if ctx.config.models.random_student:
        config = student_config(ctx, teacher.bert_config, len(teacher.vocab))
        return BertModel(config, vocab=teacher.vocab, **head)
    return load_model(ctx.general_path(), **head)


def task(ctx: Context) -> dict[str, Any]:
    d = ctx.config.distill
    train = ctx.examples("train_aug" if d.use_augmented else "train")
    pred_train = ctx.examples("train") if prediction_on_original(ctx) else train
    dev = ctx.examples(ctx.task.dev_splits[0])
    with ctx.strategy.scope():
        # Frozen from here on: computes in --teacher_precision (the plan says why).
        teacher = with_precision(load_task_teacher(ctx), d.teacher_precision)
        student = _student_for_task(ctx, teacher)
    print(f"[task] teacher in {d.teacher_precision} ({ctx.config.teacher_precision.reason})",
          flush=True)

    out: dict[str, Any] = {"train_examples": len(train)}
    if d.intermediate:
        spec = intermediate_phase(ctx, rows(ctx, train))
        spec.check()
        with ctx.strategy.scope():
            distiller = _distiller(ctx, student, teacher, spec)
        layers = task_input.teacher_layers(ctx, teacher, student, train, spec)
        phase = Phase("intermediate", spec.directory, distiller, distiller.checkpoint_items(),
                      task_input.phase_input(ctx, train, spec, teacher_layers=layers),
                      spec.steps_per_epoch, spec.epochs, max_steps=spec.max_steps)
        out["intermediate_steps"] = _run(ctx, phase)["steps"]

    # The best model so far, written aside; published as task/model with the done marker.
    model_dir = ctx.state.work_path("task", "model") if ctx.chief else None
    spec = prediction_phase(ctx, rows(ctx, pred_train))
    spec.check()
    with ctx.strategy.scope():
        distiller = _distiller(ctx, student, teacher, spec, ctx.task.type.label_metrics())
    logits = task_input.teacher_logits(ctx, teacher, distiller, pred_train, spec)

    def on_best(metrics):
        if ctx.chief:
            save_model(student, model_dir, metadata={"stage": "task", "dev": metrics,
                                                     **ctx.trained_on(),
                                                     **ctx.task.type.model_metadata(metrics)})

    phase = Phase("prediction", spec.directory, distiller, distiller.checkpoint_items(),
                  task_input.phase_input(ctx, pred_train, spec, teacher_logits=logits),
                  spec.steps_per_epoch, spec.epochs, max_steps=spec.max_steps,
                  evaluate=_evaluator(ctx, student, dev),
                  select_metric=ctx.task.type.primary_metric, on_best=on_best,
                  eval_every=d.eval_every)
    result = _run(ctx, phase)
    out["best"] = result["best"]
    return out


# --- evaluation and report -------------------------------------------------------------

def evaluate(ctx: Context) -> dict[str, Any]:
    r = ctx.config.run
    models = {"teacher": load_task_teacher(ctx), "student": load_model(ctx.student_path())}
    splits = ctx.task.dev_splits
    results: dict[str, Any] = {}
    for who, model in models.items():
        dev: dict[str, float] = {}
        for split in splits:
            prefix = "" if len(splits) == 1 else f"{split}_"
            # Prediction files: the student's in OUTPUT/evaluate/, the teacher's in teacher/.
            out = ctx.state.path("evaluate", *([who] if who != "student" else []),
                                 *([split] if prefix else [])) if ctx.chief else None
            metrics = _evaluator(ctx, model, ctx.examples(split), out)()
            dev.update({prefix + k: v for k, v in metrics.items()})
        results[who] = {**evaluation.model_facts(model, ctx.max_seq_len, r.latency_runs),
                        "dev": dev}
    primary = ctx.task.type.primary_metric
    if len(splits) > 1:
        primary = f"{splits[0]}_{primary}"
    data = report.build_report(ctx.task.name, results["teacher"], results["student"], primary,
                               max_seq_len=ctx.max_seq_len)
    if ctx.chief:
        write_json_atomic(ctx.state.path("report.json"), data)
        report.plot_loss_curves(ctx.state.output_dir, ctx.state.path("loss_curves.png"))
        write_json_atomic(ctx.state.path("evaluate", "metrics.json"), data)
    print(report.summary_table(data), flush=True)
    return {"retained": data["ratios"]["retained"]}


# --- export ------------------------------------------------------------------------------

def export(ctx: Context) -> dict[str, Any]:
    e, r = ctx.config.export, ctx.config.run
    student = load_model(ctx.student_path())
    dev = ctx.examples(ctx.task.dev_splits[0])
    train = ctx.examples("train")

    def texts(examples):
        return [(ex.text_a, ex.text_b) if ctx.task.is_pair else ex.text_a for ex in examples]

    parity = export_all(
        student, ctx.state.path("export"), max_seq_len=ctx.max_seq_len, formats=e.formats,
        dev_texts=texts(dev), dev_labels=[ex.label for ex in dev],
        representative_texts=texts(train[: e.representative_examples]),
        is_pair=ctx.task.is_pair, task=ctx.task.type, task_name=ctx.task.name,
        latency_runs=r.export_latency_runs,
        num_threads=r.export_threads or None, max_examples=r.export_max_examples or None,
        options=e.options())
    report_path = ctx.state.path("report.json")
    data = read_json(report_path, default=None)
    if data is not None and ctx.chief:
        data["export"] = parity
        write_json_atomic(report_path, data)
    # The SavedModel is published as the next TF Serving version (export/serving/<N>/).
    served = parity["formats"].get("saved_model", {})
    return {"formats": list(e.formats), "serving_version": served.get("version")}


STAGE_FUNCTIONS = {
    "general": general,
    "finetune_teacher": finetune_teacher,
    "augment": augment,
    "task": task,
    "evaluate": evaluate,
    "export": export,
}
