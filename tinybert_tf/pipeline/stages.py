"""The pipeline's stages (paper Figure 1), each reading the previous stage's folder.

  general          GD: pre-trained teacher -> student on the general corpus (embd+attn+hidn),
                   or the DistilBERT recipe (--recipe=distilbert)
  finetune_teacher the teacher fine-tuned on the task (skipped when --task_teacher is given)
  augment          Algorithm 1 -> OUTPUT/augment/train_aug.tsv
  task             TD: intermediate layers on the (augmented) task data, then prediction layer
  evaluate         dev metrics, params, FLOPs, latency -> report.json, loss_curves.png
  export           SavedModel + TFLite + parity.json under OUTPUT/export

Every stage writes its model as a model directory (`load_model` reads it back),
so a user can start anywhere by pointing the next stage at an explicit path.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tinybert_tf.config import get_config
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.data import glue
from tinybert_tf.distill.distiller import Distiller
from tinybert_tf.distill.optimizer import create_optimizer
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_model, load_tokenizer, save_model
from tinybert_tf.pipeline import evaluation
from tinybert_tf.pipeline.state import RunState
from tinybert_tf.pipeline.strategy import is_chief
from tinybert_tf.pipeline.training import Phase, run_phase, schedule_steps, trackable
from tinybert_tf.tokenizer import Tokenizer

log = logging.getLogger("tinybert_tf")


@dataclasses.dataclass
class Context:
    """What every stage needs: the flag values, the output folder, the strategy."""

    flags: Any  # absl FlagValues or any object with the same attributes
    state: RunState
    strategy: tf.distribute.Strategy

    @property
    def chief(self) -> bool:
        return is_chief(self.strategy)

    @property
    def spec(self) -> glue.TaskSpec:
        return glue.get_task(self.flags.task)

    @property
    def max_seq_len(self) -> int:
        return self.flags.max_seq_len or self.spec.default_max_seq_len

    def task_data_dir(self) -> str:
        """The task's GLUE-layout folder; the demo task is written out once."""
        if self.flags.data_dir:
            return self.flags.data_dir
        if self.spec.name != "polarity":
            raise ValueError(f"--data_dir is required for --task={self.flags.task}: point it at "
                             "the task's GLUE folder (train.tsv, dev.tsv, ...) or use 'tfds'.")
        from tinybert_tf.data import polarity
        target = self.state.path("data", "polarity")
        if not os.path.isfile(os.path.join(target, "dev.tsv")):
            polarity.write_task_dir(target)
        return target

    def examples(self, split: str):
        data_dir = self.state.path("augment") if split == "train_aug" else self.task_data_dir()
        kwargs = {}
        if data_dir == "tfds":
            kwargs["tfds_data_dir"] = self.flags.tfds_data_dir or None
        return glue.load_examples(self.flags.task, data_dir, split, **kwargs)

    def dev_splits(self) -> tuple[str, ...]:
        return tuple(getattr(self.spec, "dev_splits", None) or ("dev",))

    def teacher_path(self) -> str:
        return self.flags.task_teacher or self.state.path("finetune_teacher", "model")

    def student_path(self) -> str:
        return self.state.path("task", "model")


def epoch_order(examples, seed: int, epoch: int):
    """`examples` in the order of `epoch`: a NumPy permutation seeded by (seed, epoch).

    Shuffling here rather than with `Dataset.shuffle` keeps the order the same
    under every strategy: tf.distribute rewrites the input graph, and a seeded
    tf.data shuffle then yields another order than on one device.
    """
    order = np.random.default_rng([seed, epoch]).permutation(len(examples))
    return [examples[i] for i in order]


def _tokenizer(model: BertModel, max_seq_len: int) -> Tokenizer:
    if model.vocab is None:
        raise ValueError("the model has no vocabulary; load it from a model directory.")
    return Tokenizer(model.vocab, lower_case=model.bert_config.lower_case,
                     max_seq_len=max_seq_len)


def _task_head(spec: glue.TaskSpec) -> dict[str, Any]:
    if spec.is_regression:
        return {"head": "regressor", "num_labels": 1}
    return {"head": "classifier", "num_labels": len(spec.label_names),
            "label_names": list(spec.label_names)}


def _run(ctx: Context, phase: Phase) -> dict[str, Any]:
    f = ctx.flags
    return run_phase(phase, ctx.strategy, checkpoint_every=f.checkpoint_every,
                     keep_checkpoints=f.keep_checkpoints, log_every=1, verbose=1)


def _steps(examples: int, batch_size: int, what: str) -> int:
    steps = examples // batch_size
    if steps < 1:
        raise ValueError(f"{what}: {examples} examples make no full batch of {batch_size}; "
                         "lower the batch size flag.")
    return steps


def _loss_terms(values) -> tuple[str, ...]:
    terms: list[str] = []
    for t in values:
        terms.extend(["attn", "hidn"] if t == "trm" else [t])
    return tuple(dict.fromkeys(terms))


def _distiller_kwargs(f) -> dict[str, Any]:
    return dict(layer_mapping=f.layer_mapping,
                layer_weights=[float(w) for w in f.layer_weights] or None,
                share_hidden_projection=f.share_hidden_projection,
                mask_padding=f.mask_padding, clip_norm=f.clip_norm or None,
                grad_accum_steps=f.grad_accum_steps)


# --- general distillation ------------------------------------------------------

def general(ctx: Context) -> dict[str, Any]:
    f, stage_dir = ctx.flags, ctx.state.stage_dir("general")
    distilbert = f.recipe == "distilbert"
    source = f.corpus or corpus_lib.default_corpus_path()
    with ctx.strategy.scope():
        teacher = load_model(f.teacher, head="mlm" if distilbert else None)
        tokenizer = _tokenizer(teacher, f.general_max_seq_len)
        config = get_config(f.student_config).replace(vocab_size=len(teacher.vocab),
                                                      lower_case=teacher.bert_config.lower_case)
        student = BertModel(config, head="mlm" if distilbert else None, vocab=teacher.vocab)
        if distilbert or f.init_from_teacher:
            from tinybert_tf.distill.distilbert import init_student_from_teacher
            from tinybert_tf.distill.mapping import layer_map
            # DistilBERT: every other layer; TinyBERT: the layers g(m) the student learns from.
            layers = "every_other" if distilbert else [
                g - 1 for g in layer_map(f.layer_mapping, config.num_layers,
                                         teacher.bert_config.num_layers)[1:]]
            copied = init_student_from_teacher(student, teacher, layers=layers)
            print(f"[general] student initialised from the teacher: {len(copied)} layers "
                  "copied", flush=True)
        count_path = os.path.join(stage_dir, "corpus_count.json")
        counted = read_json(count_path)
        if counted is None or counted.get("source") != source:
            print(f"[general] counting sequences of {source} ...", flush=True)
            n = corpus_lib.count_sequences(source, tokenizer, f.general_max_seq_len)
            counted = {"source": source, "sequences": int(n)}
            if ctx.chief:
                write_json_atomic(count_path, counted)
        steps_per_epoch = _steps(counted["sequences"], f.general_batch_size, "--corpus")
        phase_total = schedule_steps(f.general_epochs, steps_per_epoch, f.general_max_steps)
        if distilbert:
            distiller = Distiller(student, teacher, phase="distilbert",
                                  alpha_ce=f.alpha_ce, alpha_mlm=f.alpha_mlm,
                                  alpha_cos=f.alpha_cos, temperature=f.distil_temperature,
                                  **_distiller_kwargs(f))
        else:
            distiller = Distiller(student, teacher, phase="intermediate",
                                  loss_terms=_loss_terms(f.loss_terms), **_distiller_kwargs(f))
        optimizer = create_optimizer(f.general_lr, phase_total,
                                     warmup_steps=int(f.general_warmup * phase_total),
                                     weight_decay=f.weight_decay, schedule="linear")
        distiller.compile(optimizer=optimizer, jit_compile=f.jit_compile)

    def make_dataset(epoch: int) -> tf.data.Dataset:
        return corpus_lib.general_dataset(
            source, tokenizer, max_seq_len=f.general_max_seq_len,
            batch_size=f.general_batch_size, seed=f.seed + epoch, masking=distilbert)

    phase = Phase("general", os.path.join(stage_dir, "distill"), distiller,
                  {"student": trackable(student.variables),
                   "projections": trackable(distiller.projection_variables),
                   "optimizer": optimizer}, make_dataset, steps_per_epoch,
                  f.general_epochs, max_steps=f.general_max_steps)
    result = _run(ctx, phase)
    if ctx.chief:
        save_model(student, os.path.join(stage_dir, "model"),
                   metadata={"stage": "general", "teacher": f.teacher, "recipe": f.recipe})
    return {"steps": result["steps"], "sequences_per_epoch": counted["sequences"]}


# --- teacher fine-tuning -------------------------------------------------------

def finetune_teacher(ctx: Context) -> dict[str, Any]:
    f, spec, stage_dir = ctx.flags, ctx.spec, ctx.state.stage_dir("finetune_teacher")
    train, dev = ctx.examples("train"), ctx.examples(ctx.dev_splits()[0])
    with ctx.strategy.scope():
        teacher = load_model(f.teacher, **_task_head(spec))
        tokenizer = _tokenizer(teacher, ctx.max_seq_len)
        steps_per_epoch = _steps(len(train), f.teacher_batch_size, "--teacher_batch_size")
        total = schedule_steps(f.teacher_epochs, steps_per_epoch)
        optimizer = create_optimizer(f.teacher_lr, total, warmup_steps=int(0.1 * total),
                                     weight_decay=f.weight_decay, schedule="linear")
        trainer = evaluation.ClassifierTrainer(teacher)
        loss = (keras.losses.MeanSquaredError() if spec.is_regression else
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        trainer.compile(optimizer=optimizer, loss=loss, jit_compile=f.jit_compile,
                        metrics=[] if spec.is_regression else ["accuracy"])

    def make_dataset(epoch: int) -> tf.data.Dataset:
        return glue.make_dataset(epoch_order(train, f.seed, epoch), tokenizer, ctx.max_seq_len,
                                 f.teacher_batch_size, drop_remainder=True)

    # The teacher after its last epoch, as BERT fine-tuning does: on a small dev
    # set the "best" epoch is noise, and an early teacher's soft targets are
    # near uniform, which leaves the prediction-layer phase nothing to teach.
    phase = Phase("finetune_teacher", os.path.join(stage_dir, "train"), trainer,
                  {"teacher": trackable(teacher.variables), "optimizer": optimizer},
                  make_dataset, steps_per_epoch, f.teacher_epochs,
                  evaluate=lambda: evaluation.task_metrics(
                      f.task, teacher, dev, tokenizer, ctx.max_seq_len, f.eval_batch_size))
    result = _run(ctx, phase)
    last = result["evals"][-1] if result["evals"] else {}
    if ctx.chief:
        save_model(teacher, os.path.join(stage_dir, "model"),
                   metadata={"stage": "finetune_teacher", "dev": last})
    return {"dev": last}


# --- augmentation --------------------------------------------------------------

def augment(ctx: Context) -> dict[str, Any]:
    from tinybert_tf.augment.augmenter import augment_task
    f, stage_dir = ctx.flags, ctx.state.stage_dir("augment")
    # The path, not a loaded model: augment's loader refuses a checkpoint without
    # a trained MLM head (load_model would attach a random one).
    teacher_vocab = load_tokenizer(f.task_teacher or f.teacher).vocab
    stats = augment_task(
        f.task, ctx.task_data_dir(), os.path.join(stage_dir, "train_aug.tsv"),
        mlm_model=f.mlm_model or None, word_vectors=f.word_vectors or None,
        corpus=f.corpus or corpus_lib.default_corpus_path(), num_aug=f.num_aug,
        replace_prob=f.replace_prob, num_candidates=f.num_candidates, seed=f.seed,
        shard=f.shard or None, batch_size=f.augment_batch_size,
        vector_cache_dir=os.path.join(stage_dir, "vectors"), vocab=teacher_vocab)
    return dict(stats)


# --- task distillation -----------------------------------------------------------

def _student_for_task(ctx: Context) -> BertModel:
    f, spec = ctx.flags, ctx.spec
    if f.general_model.lower() == "none":
        teacher_vocab = load_model(ctx.teacher_path()).vocab
        base = get_config(f.student_config).replace(vocab_size=len(teacher_vocab))
        return BertModel(base, vocab=teacher_vocab, **_task_head(spec))
    path = f.general_model or ctx.state.path("general", "model")
    return load_model(path, **_task_head(spec))


def task(ctx: Context) -> dict[str, Any]:
    f, spec, stage_dir = ctx.flags, ctx.spec, ctx.state.stage_dir("task")
    use_aug = f.use_augmented
    train = ctx.examples("train_aug" if use_aug else "train")
    # STS-B's prediction phase uses the original training set (paper, Sec. 4.2).
    pred_train = ctx.examples("train") if (spec.is_regression and use_aug) else train
    dev = ctx.examples(ctx.dev_splits()[0])
    with ctx.strategy.scope():
        teacher = load_model(ctx.teacher_path())
        student = _student_for_task(ctx)
        tokenizer = _tokenizer(teacher, ctx.max_seq_len)

    def dataset_fn(examples):
        def make(epoch: int) -> tf.data.Dataset:
            return glue.make_dataset(epoch_order(examples, f.seed, epoch), tokenizer,
                                     ctx.max_seq_len, f.task_batch_size, drop_remainder=True)
        return make

    out: dict[str, Any] = {"train_examples": len(train)}
    if f.intermediate:
        with ctx.strategy.scope():
            steps = _steps(len(train), f.task_batch_size, "--task_batch_size")
            total = schedule_steps(f.intermediate_epochs, steps, f.task_max_steps)
            distiller = Distiller(student, teacher, phase="intermediate",
                                  loss_terms=_loss_terms(f.loss_terms), **_distiller_kwargs(f))
            # The reference trains the intermediate phase at a constant rate.
            optimizer = create_optimizer(f.intermediate_lr, total, weight_decay=f.weight_decay,
                                         schedule="constant")
            distiller.compile(optimizer=optimizer, jit_compile=f.jit_compile)
        phase = Phase("intermediate", os.path.join(stage_dir, "intermediate"), distiller,
                      {"student": trackable(student.variables),
                       "projections": trackable(distiller.projection_variables),
                       "optimizer": optimizer}, dataset_fn(train), steps,
                      f.intermediate_epochs, max_steps=f.task_max_steps)
        out["intermediate_steps"] = _run(ctx, phase)["steps"]

    model_dir = ctx.student_path()
    with ctx.strategy.scope():
        steps = _steps(len(pred_train), f.task_batch_size, "--task_batch_size")
        total = schedule_steps(f.pred_epochs, steps, f.task_max_steps)
        distiller = Distiller(student, teacher, phase="prediction", temperature=f.temperature,
                              is_regression=spec.is_regression, **_distiller_kwargs(f))
        # max(1, .): --pred_epochs=0 (no prediction phase) still builds a valid schedule.
        optimizer = create_optimizer(f.pred_lr, max(1, total),
                                     warmup_steps=int(f.warmup_proportion * total),
                                     weight_decay=f.weight_decay, schedule="linear")
        distiller.compile(optimizer=optimizer, jit_compile=f.jit_compile)

    def on_best(metrics):
        if ctx.chief:
            save_model(student, model_dir, metadata={"stage": "task", "dev": metrics})

    phase = Phase("prediction", os.path.join(stage_dir, "prediction"), distiller,
                  {"student": trackable(student.variables), "optimizer": optimizer}, dataset_fn(pred_train), steps,
                  f.pred_epochs, max_steps=f.task_max_steps,
                  evaluate=lambda: evaluation.task_metrics(
                      f.task, student, dev, tokenizer, ctx.max_seq_len, f.eval_batch_size),
                  select_metric=spec.primary_metric, on_best=on_best,
                  eval_every=f.eval_every)
    result = _run(ctx, phase)
    out["best"] = result["best"]
    return out


# --- evaluation and report ---------------------------------------------------------

def evaluate(ctx: Context) -> dict[str, Any]:
    from tinybert_tf.pipeline import report
    f, spec = ctx.flags, ctx.spec
    eval_dir = ctx.state.stage_dir("evaluate")
    models = {"teacher": load_model(ctx.teacher_path()), "student": load_model(ctx.student_path())}
    tokenizer = _tokenizer(models["teacher"], ctx.max_seq_len)
    results: dict[str, Any] = {}
    for who, model in models.items():
        dev: dict[str, float] = {}
        for split in ctx.dev_splits():
            metrics = evaluation.task_metrics(f.task, model, ctx.examples(split), tokenizer,
                                              ctx.max_seq_len, f.eval_batch_size)
            prefix = "" if len(ctx.dev_splits()) == 1 else f"{split}_"
            dev.update({prefix + k: v for k, v in metrics.items()})
        results[who] = {**evaluation.model_facts(model, ctx.max_seq_len, f.latency_runs),
                        "dev": dev}
    primary = spec.primary_metric
    if len(ctx.dev_splits()) > 1:
        primary = f"{ctx.dev_splits()[0]}_{primary}"
    data = report.build_report(spec.name, results["teacher"], results["student"], primary,
                               max_seq_len=ctx.max_seq_len)
    if ctx.chief:
        write_json_atomic(ctx.state.path("report.json"), data)
        report.plot_loss_curves(ctx.state.output_dir, ctx.state.path("loss_curves.png"))
        write_json_atomic(os.path.join(eval_dir, "metrics.json"), data)
    print(report.summary_table(data), flush=True)
    return {"retained": data["ratios"]["retained"]}


# --- export ---------------------------------------------------------------------------

def export(ctx: Context) -> dict[str, Any]:
    from tinybert_tf.export import export_all
    f, spec = ctx.flags, ctx.spec
    student = load_model(ctx.student_path())
    dev = ctx.examples(ctx.dev_splits()[0])
    train = ctx.examples("train")
    def texts(examples):
        return [(ex.text_a, ex.text_b) if spec.is_pair else ex.text_a for ex in examples]
    parity = export_all(
        student, ctx.state.path("export"), max_seq_len=ctx.max_seq_len,
        formats=tuple(f.export_formats), dev_texts=texts(dev),
        dev_labels=[ex.label for ex in dev],
        representative_texts=texts(train[: f.representative_examples]),
        is_pair=spec.is_pair, is_regression=spec.is_regression, task=f.task)
    report_path = ctx.state.path("report.json")
    data = read_json(report_path)
    if data is not None and ctx.chief:
        data["export"] = parity
        write_json_atomic(report_path, data)
    return {"formats": list(f.export_formats)}


STAGE_FUNCTIONS = {
    "general": general,
    "finetune_teacher": finetune_teacher,
    "augment": augment,
    "task": task,
    "evaluate": evaluate,
    "export": export,
}
