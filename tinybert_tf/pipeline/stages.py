"""The pipeline's stages (paper Figure 1), each reading the previous stage's folder.

  general          GD: pre-trained teacher -> student on the general corpus (embd+attn+hidn),
                   or another registered recipe (--recipe: distilbert, mlm, first_layers;
                   pipeline/training/recipes.py); W_e/W_h saved with it when it trains them
  finetune_teacher the teacher fine-tuned on the task (skipped when --task_teacher is given)
  augment          Algorithm 1 -> OUTPUT/augment/<the source's augmented file>
  task             TD: the phases of --task_phases (training/phases.py; default intermediate
                   layers on the (augmented) task data, then the prediction layer), the last
                   one once per --pred_grid cell; the best dev checkpoint is the task model
  quantize         the task student teaches its int8 fake-quantised copy (quantisation-aware
                   distillation; pipeline/quantize_stage.py), the int8 export's model
  evaluate         dev metrics, params, FLOPs, latency -> report.json, loss_curves.png
                   (+ GLUE server files with --glue_test_predictions)
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

import functools
import logging
import posixpath
from typing import Any, Callable, Optional

import tensorflow as tf

from tinybert_tf.augment.augmenter import augment_source
from tinybert_tf.config import BertConfig, get_config
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.data import glue_submission
from tinybert_tf.data import holdout as holdout_lib
from tinybert_tf.distill.distilbert import (
    describe_init,
    init_student_from_teacher,
    teacher_layers_for,
)
from tinybert_tf.distill.distiller import Distiller
from tinybert_tf.distill.terms import HardLabelTerm, LossTerm
from tinybert_tf.export.parity import ExportRequest, export_all
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import (
    inspect_model,
    load_model,
    load_tokenizer,
    save_model,
)
from tinybert_tf.models.labels import put_in_order
from tinybert_tf.pipeline import autosize
from tinybert_tf.pipeline.run import report
from tinybert_tf.pipeline.run.context import Context, has_quantize_stage, rows
from tinybert_tf.pipeline.settings.precision import with_precision
from tinybert_tf.pipeline.training import (
    baseline_phases,  # noqa: F401  (registers --task_phases=pkd)
    evaluation,
    task_input,
)
from tinybert_tf.pipeline.training.loop import Phase, run_phase
from tinybert_tf.pipeline.training.phases import (
    PHASE_KINDS,
    PROJECTIONS,
    PhaseSpec,
    general_projections,
    plan_phase,
    reads_augmented,
    task_phase_specs,
)
from tinybert_tf.pipeline.training.recipes import GeneralRecipe, get_recipe
from tinybert_tf.pipeline.training.strategy import can_create_variables, num_workers, peer_errors

log = logging.getLogger("tinybert_tf")

# --- phase specs ---------------------------------------------------------------------

def _phase(ctx: Context, stage: str, name: str, data: str, examples: int, batch: int,
           batch_flag: str, epochs: float, max_steps: int, lr: float, schedule: str,
           warmup: float, terms: list[LossTerm]) -> PhaseSpec:
    return plan_phase(ctx, stage, name, data, examples, batch, batch_flag, epochs, max_steps,
                      lr, schedule, warmup, terms)


def _corpus_source(ctx: Context) -> str:
    return ctx.config.general.corpus or corpus_lib.default_corpus_path()


def general_recipe(ctx: Context) -> GeneralRecipe:
    """The registered recipe of --recipe (pipeline/training/recipes.py)."""
    return get_recipe(ctx.config.general.recipe)


def held_out_titles(ctx: Context) -> frozenset[str]:
    """Articles the general corpus leaves out (`--general_holdout`, resolved)."""
    return holdout_lib.corpus_titles(ctx.config.general.holdout, _corpus_source(ctx))


def general_terms(ctx: Context) -> list[LossTerm]:
    return general_recipe(ctx).terms(ctx.config)


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
    held_out = held_out_titles(ctx)
    data = f"corpus {_corpus_source(ctx)}" + (
        f" without the {len(held_out)} articles held out for {c.holdout} "
        "(--general_holdout)" if held_out else "")
    spec = _phase(ctx, "general", "distill", data, count,
                  c.batch_size, "--general_batch_size", c.epochs, c.max_steps, c.lr, "linear",
                  c.warmup, general_terms(ctx))
    spec.note = note
    return spec


def corpus_sequences(ctx: Context) -> int:
    """Packed sequences per epoch of the corpus, cached by path, size and mtime."""
    c = ctx.config.general
    source = _corpus_source(ctx)
    pack = general_recipe(ctx).pack
    key = {"source": source, "max_seq_len": c.max_seq_len, "pack": pack,
           "files": corpus_lib.source_facts(source), "holdout": c.holdout}
    count_path = ctx.state.path("general", "corpus_count.json")
    counted = read_json(count_path, default=None)
    if counted is not None and counted.get("key") == key:
        return int(counted["sequences"])
    print(f"[general] counting sequences of {source} ...", flush=True)
    tokenizer = load_tokenizer(ctx.config.models.teacher, c.max_seq_len)
    n = corpus_lib.count_sequences(source, tokenizer, c.max_seq_len, pack=pack,
                                   exclude_titles=held_out_titles(ctx))
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


# --- shared helpers --------------------------------------------------------------------

# The learning-rate flag of each stage's phase (the task stage's: its phase kind's
# `lr_flag`, or the --pred_grid cell): what a diverged phase's message names.
LR_FLAGS = {"general": "general_lr", "finetune_teacher": "teacher_lr",
            "quantize": "quantize_lr"}


def divergence_hint(ctx: Context, spec: PhaseSpec) -> str:
    """What to change when the phase of `spec` diverges: its learning-rate flag and
    value (or its --pred_grid cell), and the command that redoes the stage."""
    results = ctx.config.results()
    kind = PHASE_KINDS.get(spec.kind) if spec.stage == "task" else None
    flag = kind.lr_flag.removeprefix("--") if kind is not None else LR_FLAGS.get(spec.stage)
    if spec.cell is not None:
        lower = (f"lower the learning rate of its --pred_grid cell "
                 f"{spec.cell['batch']}:{spec.cell['lr']:g} (--pred_grid="
                 f"{','.join(results['pred_grid'])})")
    elif flag in results:
        lower = f"lower --{flag} (now {results[flag]:g})"
    else:  # a phase kind or stage of a plugin that names no flag
        lower = f"lower the learning rate of {spec.stage}/{spec.name}"
    return f"{lower}, then redo the stage with --stages={spec.stage} --overwrite"


def _run(ctx: Context, phase: Phase, spec: PhaseSpec) -> dict[str, Any]:
    r = ctx.config.run
    phase.hint = phase.hint or divergence_hint(ctx, spec)
    with peer_errors(r.peer_timeout):
        return run_phase(phase, ctx.strategy, checkpoint_every=r.checkpoint_every,
                         keep_checkpoints=r.keep_checkpoints, log_every=1, verbose=1,
                         stop_grace_seconds=r.peer_timeout)


def _distiller(ctx: Context, student, teacher, spec: PhaseSpec,
               label_metrics=(), prepare: Optional[Callable[[Distiller], None]] = None
               ) -> Distiller:
    """The phase's Distiller, compiled with its optimizer (after `prepare(distiller)`,
    e.g. to fix its projections)."""
    o, loss = ctx.config.optim, ctx.config.loss
    distiller = Distiller(student=student, teacher=teacher, terms=spec.terms,
                          clip_norm=o.clip_norm or None, grad_accum_steps=o.grad_accum_steps,
                          share_hidden_projection=loss.share_hidden_projection,
                          label_metrics=list(label_metrics))
    if prepare is not None:
        prepare(distiller)
    distiller.compile(optimizer=spec.optimizer(o.weight_decay),
                      jit_compile=ctx.config.numerics.jit_compile,
                      run_eagerly=ctx.config.run.run_eagerly)
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
    recipe = general_recipe(ctx)
    spec = general_phase(ctx) if recipe.trains else None
    if spec is not None:
        spec.check()
    info = inspect_model(m.teacher)
    config = student_config(ctx, info.config, len(info.vocab))
    layers = recipe.init_layers(ctx.config, config, info.config)
    with ctx.strategy.scope():
        # The teacher's weights only when the recipe runs it or copies its layers.
        teacher = (load_model(m.teacher, head=recipe.teacher_head_for(ctx.config))
                   if recipe.teacher_forward or layers is not None else None)
        tokenizer = load_tokenizer(teacher if teacher is not None else m.teacher,
                                   c.max_seq_len)
        student = BertModel(config, head=recipe.student_head, vocab=info.vocab)
        if layers is not None:
            copied = init_student_from_teacher(student, teacher, layers=layers)
            chosen = teacher_layers_for(layers, config.num_layers,
                                        teacher.bert_config.num_layers)
            print(f"[general] student initialised from the teacher: copied "
                  f"{describe_init(copied, chosen)}", flush=True)
        if not recipe.teacher_forward:
            teacher = None
        distiller = _distiller(ctx, student, teacher, spec) if spec is not None else None

    steps = 0
    if spec is not None:
        phase = Phase("general", spec.directory, distiller, distiller.checkpoint_items(), None,
                      spec.steps_per_epoch, spec.epochs, max_steps=spec.max_steps,
                      make_input=functools.partial(general_input, ctx, tokenizer))
        steps = _run(ctx, phase, spec)["steps"]
    else:
        print(f"[general] --recipe={recipe.name} trains nothing: the initialised student is "
              "the general model", flush=True)
    if ctx.chief:
        # Written aside; published as general/model with the stage's done marker.
        # The projections travel with the General TinyBERT: task distillation starts
        # from them (as the reference's fit_dense does).
        p = distiller.projections if distiller is not None else None
        attachments = {PROJECTIONS: (p.arrays(), {
            "teacher": m.teacher, "teacher_hidden_size": p.teacher_width,
            "share_hidden": p.share_hidden, "use_bias": p.use_bias})} if p is not None else {}
        save_model(student, ctx.state.work_path("general", "model"),
                   metadata={"stage": "general", "teacher": m.teacher, "recipe": c.recipe},
                   attachments=attachments)
    return {"steps": steps, "sequences_per_epoch": spec.examples if spec is not None else 0}


def general_input(ctx: Context, tokenizer, epoch: int, offset: int, steps: int):
    """The general stage's input for `steps` steps from step `offset` of `epoch`, built
    on each worker (`distribute_datasets_from_function`, see the module docstring).

    Each input pipeline yields per-replica batches (static shapes: drop_remainder),
    `replicas per worker` of them per step; the skip and take for a resume apply
    inside, in those units.
    """
    c = ctx.config.general
    recipe = general_recipe(ctx)
    source = _corpus_source(ctx)
    mode = general_sharding(ctx)
    options = dict(max_seq_len=c.max_seq_len, seed=ctx.config.numerics.seed + epoch,
                   pack=recipe.pack, masking=recipe.masking,
                   next_sentence=recipe.next_sentence, drop_remainder=True,
                   exclude_titles=held_out_titles(ctx))

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
    result = _run(ctx, phase, spec)
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
    head = ctx.student_task_type.head_kwargs()
    if ctx.config.models.random_student:
        config = student_config(ctx, teacher.bert_config, len(teacher.vocab))
        return BertModel(config, vocab=teacher.vocab, **head)
    return load_model(ctx.general_path(), **head)


def task(ctx: Context) -> dict[str, Any]:
    """Task distillation: the phases of --task_phases in order; the last one (once per
    --pred_grid cell) selects the task model on dev."""
    augmented = reads_augmented(ctx.config)
    sets = {False: ctx.examples("train")}
    if augmented:
        sets[True] = ctx.examples("train_aug")
    dev = ctx.examples(ctx.task.dev_splits[0])
    with ctx.strategy.scope():
        # Frozen from here on: computes in --teacher_precision (the plan says why).
        dtype = ctx.config.distill.teacher_precision
        stored = can_create_variables(ctx.strategy, dtype)
        teacher = with_precision(load_task_teacher(ctx), dtype, float32_weights=not stored)
        student = _student_for_task(ctx, teacher)
    kept = "" if stored else (f"; weights kept in float32, cast at each use: this strategy's "
                              f"collectives cannot broadcast {dtype} variables")
    print(f"[task] teacher in {dtype} ({ctx.config.teacher_precision.reason}{kept})",
          flush=True)
    carried, start, warning = general_projections(ctx, student.bert_config,
                                                  teacher.bert_config)
    specs = task_phase_specs(ctx, {k: rows(ctx, v) for k, v in sets.items()}, len(dev),
                             (student.bert_config, teacher.bert_config), start)
    if warning and any(s.projections == "new" for s in specs):
        log.warning(warning)
        print(f"warning: {warning}", flush=True)
    for spec in specs:
        spec.check()
    before = [s for s in specs if s.evaluation is None]
    selecting = [s for s in specs if s.evaluation is not None]
    out: dict[str, Any] = {"train_examples": len(sets[augmented]), "phases": {}}
    for spec in before:
        result, carried = _task_phase(ctx, spec, student, teacher, sets, carried)
        out["phases"][spec.name] = result["steps"]
    if len(selecting) == 1:
        # The best model so far, written aside; published as task/model with the marker.
        spec = selecting[0]
        result, _ = _task_phase(ctx, spec, student, teacher, sets, carried, dev,
                                ctx.state.work_path("task", "model"))
        out["phases"][spec.name] = result["steps"]
        out["best"] = result["best"]
        return out
    # --pred_grid: every cell from the same student (the phases before, run once).
    start_weights = [v.numpy() for v in student.variables]
    cells = []
    for spec in selecting:
        for variable, value in zip(student.variables, start_weights):
            variable.assign(value)
        result, _ = _task_phase(ctx, spec, student, teacher, sets, carried, dev,
                                posixpath.join(spec.directory, "model"),
                                cache=ctx.state.path("task", f"{spec.kind}_teacher_cache"))
        cells.append({**spec.cell, "phase": spec.name, "steps": result["steps"],
                      "best": result["best"]})
    metric = ctx.task.type.primary_metric
    scored = [c for c in cells if c["best"] is not None]
    if not scored:
        raise RuntimeError("--pred_grid: no cell was evaluated on dev.")
    best = max(scored, key=lambda c: c["best"][metric])  # the first of equals
    for cell in cells:
        cell["selected"] = cell is best
    print(f"[task] --pred_grid: cell batch {best['batch']} lr {best['lr']:g} is best on dev "
          f"({metric} {best['best'][metric]:.4f})", flush=True)
    if ctx.chief:
        chosen = load_model(ctx.state.path("task", best["phase"], "model"))
        save_model(chosen, ctx.state.work_path("task", "model"))
    out.update(best=best["best"], grid=cells)
    return out


def _task_phase(ctx: Context, spec: PhaseSpec, student: BertModel, teacher: BertModel,
                sets: dict[bool, Any], projections: Optional[dict], dev=None,
                model_dir: Optional[str] = None, cache: Optional[str] = None
                ) -> tuple[dict[str, Any], Optional[dict]]:
    """Train one task phase; with `dev`, evaluate (every --eval_every steps or epoch)
    and save the best student to `model_dir`. `projections`: W_e/W_h arrays to start
    from; returns the phase's result and the projections the next phase starts from."""
    examples = sets[spec.augmented]
    heads = ctx.task.type.label_metrics() if dev is not None else ()
    with ctx.strategy.scope():
        distiller = _distiller(ctx, student, teacher, spec, heads)
    if distiller.projections is not None and projections is not None:
        distiller.projections.assign(projections)
    if spec.projections:
        print(f"[{spec.name}] projections W_e/W_h: {spec.projections}", flush=True)
    logits = task_input.teacher_logits(ctx, teacher, distiller, examples, spec, cache)
    layers = (task_input.teacher_layers(ctx, teacher, student, examples, spec)
              if logits is None else None)
    selection: dict[str, Any] = {}
    if dev is not None:
        def on_best(metrics):
            if ctx.chief:
                save_model(student, model_dir, metadata={
                    "stage": "task", "dev": metrics, **ctx.trained_on(),
                    **ctx.task.type.model_metadata(metrics)})

        selection = dict(evaluate=_evaluator(ctx, student, dev), on_best=on_best,
                         select_metric=ctx.task.type.primary_metric,
                         eval_every=ctx.config.distill.eval_every)
    phase = Phase(spec.name, spec.directory, distiller, distiller.checkpoint_items(),
                  task_input.phase_input(ctx, examples, spec, teacher_logits=logits,
                                         teacher_layers=layers),
                  spec.steps_per_epoch, spec.epochs, max_steps=spec.max_steps, **selection)
    result = _run(ctx, phase, spec)
    if distiller.projections is not None:
        projections = distiller.projections.arrays()
    return result, projections


# --- evaluation and report -------------------------------------------------------------

def evaluate(ctx: Context) -> dict[str, Any]:
    r = ctx.config.run
    models = {"teacher": load_task_teacher(ctx), "student": load_model(ctx.student_path())}
    if has_quantize_stage(ctx.config):
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
            metrics = _evaluator(ctx, model, ctx.examples(split), out)()
            dev.update({prefix + k: v for k, v in metrics.items()})
        results[who] = {**evaluation.model_facts(model, ctx.max_seq_len), "dev": dev}
    latencies = evaluation.latencies_ms(models, ctx.max_seq_len, r.latency_runs)
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


# --- export ------------------------------------------------------------------------------

def export(ctx: Context) -> dict[str, Any]:
    e, r = ctx.config.export, ctx.config.run
    student = load_model(ctx.student_path())
    quantized = load_model(ctx.quantized_path()) if has_quantize_stage(ctx.config) else None
    dev = ctx.examples(ctx.task.dev_splits[0])
    train = ctx.examples("train")

    def texts(examples):
        return [(ex.text_a, ex.text_b) if ctx.task.is_pair else ex.text_a for ex in examples]

    parity = export_all(ExportRequest(
        student, ctx.state.path("export"), max_seq_len=ctx.max_seq_len, formats=e.formats,
        dev_texts=texts(dev), dev_labels=[ex.label for ex in dev],
        representative_texts=texts(train[: e.representative_examples]),
        is_pair=ctx.task.is_pair, task=ctx.task.type, task_name=ctx.task.name,
        latency_runs=r.export_latency_runs,
        num_threads=r.export_threads or None, max_examples=r.export_max_examples or None,
        options=e.options(), quantized=quantized))
    report_path = ctx.state.path("report.json")
    data = read_json(report_path, default=None)
    if data is not None and ctx.chief:
        data["export"] = parity
        write_json_atomic(report_path, data)
    # The SavedModel is published as the next TF Serving version (export/serving/<N>/).
    served = parity["formats"].get("saved_model", {})
    return {"formats": list(e.formats), "serving_version": served.get("version")}


# The quantize stage's function is in quantize_stage.py (it builds on this module);
# main.py runs STAGE_FUNCTIONS and it.
STAGE_FUNCTIONS = {
    "general": general,
    "finetune_teacher": finetune_teacher,
    "augment": augment,
    "task": task,
    "evaluate": evaluate,
    "export": export,
}
