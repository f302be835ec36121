"""The general stage (GD): the pre-trained teacher distils the student on the general
corpus (embd+attn+hidn), or another registered recipe does (--recipe: distilbert,
mlm, first_layers; pipeline/training/recipes.py); W_e/W_h are saved with the general
model when the recipe trains them.

Input distribution: the stage builds its input per worker
(`strategy.distribute_datasets_from_function`, `general_input`): with at least as
many corpus files as workers each worker reads only its own files ("file" sharding:
less reading, but other batches than one replica would see, and an epoch sized on
the smallest worker's share); otherwise, or with `--input_sharding=exact`, every
worker reads the whole corpus and keeps its slice of every global batch ("exact":
the very batches of a single replica).
"""
from __future__ import annotations

import functools
import posixpath
from typing import Any, Optional

import tensorflow as tf

from tinybert_tf.config import BertConfig
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.data import holdout as holdout_lib
from tinybert_tf.distill.distilbert import (
    describe_init,
    init_student_from_teacher,
    teacher_layers_for,
)
from tinybert_tf.distill.terms import LossTerm
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import inspect_model, load_model, load_tokenizer, save_model
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import StageFolder
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages.base import (
    STUDENT_CONFIG,
    TEACHER,
    Findings,
    PlanInputs,
    Stage,
)
from tinybert_tf.pipeline.stages.common import (
    corpus_files,
    make_distiller,
    model_path,
    run_training,
    student_config,
)
from tinybert_tf.pipeline.stages.inspect import check_distilled_pair
from tinybert_tf.pipeline.training.loop import Phase
from tinybert_tf.pipeline.training.phases import PROJECTIONS, PhaseSpec, plan_phase
from tinybert_tf.pipeline.training.recipes import RECIPES, GeneralRecipe, get_recipe
from tinybert_tf.pipeline.training.strategy import num_workers

NAME = "general"
# The corpus count the plan and the phase size themselves on, cached in the folder.
CORPUS_COUNT = "corpus_count.json"


def corpus_source(ctx: Context) -> str:
    return ctx.config.general.corpus or corpus_lib.default_corpus_path()


def general_recipe(ctx: Context) -> GeneralRecipe:
    """The registered recipe of --recipe (pipeline/training/recipes.py)."""
    return get_recipe(ctx.config.general.recipe)


def held_out_titles(ctx: Context) -> frozenset[str]:
    """Articles the general corpus leaves out (`--general_holdout`, resolved)."""
    return holdout_lib.corpus_titles(ctx.config.general.holdout, corpus_source(ctx))


def general_terms(ctx: Context) -> list[LossTerm]:
    return general_recipe(ctx).terms(ctx.config)


def general_sharding(ctx: Context) -> str:
    """How the general stage's input is split over the workers: "file" (each worker
    reads only its own corpus files) or "exact" (every worker reads the whole corpus
    and keeps its slice of each global batch; also a single worker's only mode)."""
    n = num_workers(ctx.strategy)
    if n <= 1 or ctx.config.run.input_sharding == "exact":
        return "exact"
    shard = corpus_lib.input_shard(corpus_source(ctx), n, 0)
    return "file" if shard.mode == "file" else "exact"


def general_phase(ctx: Context, count: Optional[int] = None) -> PhaseSpec:
    """The general stage's phase; `count` = packed sequences per epoch (counted
    and cached in the stage folder when not given). Under "file" sharding with
    known per-file counts (TFRecord shards), an epoch is as many steps as the
    smallest worker's share fills: every worker must take the same steps."""
    c = ctx.config.general
    note, extra = "", {}
    if count is None:
        cap = step_cap_sequences(ctx)
        count = corpus_sequences(ctx, cap)
        if count == cap:
            note = (f"--general_max_steps={c.max_steps} ends the phase within its first "
                    f"epoch: the corpus was counted only as far as {count} sequences")
            extra = {"sequences_at_least": count}
    if general_sharding(ctx) == "file":
        n = num_workers(ctx.strategy)
        shares = corpus_lib.pipeline_sequence_counts(corpus_source(ctx), n)
        if shares:
            count, extra = min(shares) * n, {}
            note = (f"file sharding over {n} workers: an epoch is {min(shares)} sequences "
                    f"per worker (the smallest share of {shares})")
        else:
            note = (f"file sharding over {n} workers: per-worker counts are unknown (no "
                    "PREFIX.json), so workers with fewer sequences wrap around in an epoch"
                    ) + (f"; {note}" if note else "")
    held_out = held_out_titles(ctx)
    data = f"corpus {corpus_source(ctx)}" + (
        f" without the {len(held_out)} articles held out for {c.holdout} "
        "(--general_holdout)" if held_out else "")
    spec = plan_phase(ctx, NAME, "distill", data, count,
                  c.batch_size, "--general_batch_size", c.epochs, c.max_steps, c.lr, "linear",
                  c.warmup, general_terms(ctx))
    spec.note = note
    spec.extra.update(extra)
    return spec


def step_cap_sequences(ctx: Context) -> Optional[int]:
    """Sequences that --general_max_steps' steps consume (None: no cap). A corpus
    holding at least that many gives the same phase whatever its full count: the cap
    ends it within the first epoch, with the schedule over the capped steps."""
    c = ctx.config.general
    return c.max_steps * c.batch_size if c.max_steps > 0 and c.batch_size > 0 else None


def corpus_sequences(ctx: Context, limit: Optional[int] = None) -> int:
    """Packed sequences per epoch of the corpus, cached by path, size and mtime;
    with `limit`, counted only that far (min(count, limit)), which sizes a phase
    that --general_max_steps ends in its first epoch at a fraction of the cost."""
    c = ctx.config.general
    source = corpus_source(ctx)
    pack = general_recipe(ctx).pack
    key = {"source": source, "max_seq_len": c.max_seq_len, "pack": pack,
           "files": corpus_lib.source_facts(source), "holdout": c.holdout}
    count_path = ctx.state.path(NAME, CORPUS_COUNT)
    counted = read_json(count_path, default=None)
    if counted is not None and counted.get("key") == key:
        n, whole = int(counted["sequences"]), counted.get("complete", True)
        if whole or (limit is not None and n >= limit):
            return n if limit is None else min(n, limit)
    upto = "" if limit is None else f" (up to {limit}: --general_max_steps={c.max_steps})"
    print(f"[general] counting sequences of {source}{upto} ...", flush=True)
    tokenizer = load_tokenizer(ctx.config.models.teacher, c.max_seq_len)
    n = corpus_lib.count_sequences(source, tokenizer, c.max_seq_len, pack=pack,
                                   exclude_titles=held_out_titles(ctx), limit=limit)
    if ctx.chief and not ctx.config.run.dry_run:  # a dry run writes nothing
        write_json_atomic(count_path, {"key": key, "sequences": int(n),
                                       "complete": limit is None or n < limit})
    return int(n)



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
            narrower = config.intermediate_size < teacher.bert_config.intermediate_size
            ffn = (f"; each copied layer keeps the {config.intermediate_size} of the "
                   f"teacher's {teacher.bert_config.intermediate_size} feed-forward units "
                   "with the largest weight norms" if narrower else "")
            print(f"[general] student initialised from the teacher: copied "
                  f"{describe_init(copied, chosen)}{ffn}", flush=True)
        if not recipe.teacher_forward:
            teacher = None
        distiller = make_distiller(ctx, student, teacher, spec) if spec is not None else None

    steps = 0
    if spec is not None:
        phase = Phase("general", spec.directory, distiller, distiller.checkpoint_items(), None,
                      spec.steps_per_epoch, spec.epochs, max_steps=spec.max_steps,
                      make_input=functools.partial(general_input, ctx, tokenizer))
        steps = run_training(ctx, phase, spec)["steps"]
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
    if spec is None:
        return {"steps": steps, "sequences_per_epoch": 0}
    # A count stopped at the step cap is a lower bound, and says so.
    at_least = "sequences_at_least" in spec.extra
    return {"steps": steps,
            "sequences_per_epoch" + ("_at_least" if at_least else ""): spec.examples}


def general_input(ctx: Context, tokenizer, epoch: int, offset: int, steps: int):
    """The general stage's input for `steps` steps from step `offset` of `epoch`, built
    on each worker (`distribute_datasets_from_function`, see the module docstring).

    Each input pipeline yields per-replica batches (static shapes: drop_remainder),
    `replicas per worker` of them per step; the skip and take for a resume apply
    inside, in those units.
    """
    c = ctx.config.general
    recipe = general_recipe(ctx)
    source = corpus_source(ctx)
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




def recipe_saves_projections(recipe: GeneralRecipe, config: PipelineConfig,
                             student: BertConfig, teacher: BertConfig) -> bool:
    """Whether the general stage of `recipe` trains (and so saves) W_e/W_h (False when
    its terms cannot be planned: that error is reported with the terms' own check)."""
    if not recipe.trains:
        return False
    try:
        terms = recipe.terms(config)
        for term in terms:
            term.plan(student, teacher)
    except ValueError:
        return False
    return any(t.needs_projections for t in terms)

def reads(ctx: Context) -> dict[str, Any]:
    m, g = ctx.config.models, ctx.config.general
    return {"teacher": model_path(m.teacher), "corpus": corpus_files(g.corpus),
            "student_config": m.student_config}


def skipped(config: PipelineConfig) -> bool:
    """--general_model (or --student_init=random) replaces the general model."""
    return config.models.general_given


def checks(ctx: Context, found: Findings) -> None:
    """--recipe and whether it trains, --general_max_seq_len against the teacher's and
    the student's position tables, and the layer map of (student, teacher)."""
    c, models = ctx.config, found.models
    recipe = found.run(lambda: get_recipe(c.general.recipe))
    if recipe is not None:
        found.plan["general_recipe"] = recipe.describe()
        if models.teacher is not None:
            found.errors.extend(found.run(
                lambda: recipe.check(c, models.student_cfg, models.teacher)) or [])
    if c.general.epochs == 0 and (recipe is None or recipe.trains):
        found.errors.append(
            "--general_epochs=0: the general stage would train nothing and save a random "
            "student as OUTPUT/general/model; give epochs > 0, or skip the stage with "
            "--general_model=DIR (or --general_model=none for a random start).")
    length = c.general.max_seq_len
    if models.teacher is not None \
            and length > models.teacher.config.max_position_embeddings:
        found.errors.append(f"--general_max_seq_len={length} exceeds the teacher's "
                            "max_position_embeddings="
                            f"{models.teacher.config.max_position_embeddings}; lower "
                            "--general_max_seq_len.")
    student = models.student_cfg
    if student is not None and length > student.max_position_embeddings:
        found.errors.append(f"--general_max_seq_len={length} exceeds --student_config's "
                            f"max_position_embeddings={student.max_position_embeddings}; "
                            "lower --general_max_seq_len or use a student with a longer "
                            "table.")
    check_distilled_pair(ctx, found, student,
                         models.teacher.config if models.teacher is not None else None)


def phases(ctx: Context, found: Findings, inputs: PlanInputs) -> list[PhaseSpec]:
    """Its phase when its recipe trains and --teacher passed its checks (the corpus
    counted when `inputs.count_corpus` or cached, else only read)."""
    recipe = RECIPES.get(ctx.config.general.recipe)  # an unknown one: reported by checks
    if found.models.teacher is None or recipe is None or not recipe.trains:
        return []
    count = None
    if inputs.count_corpus:
        count = found.run(lambda: corpus_sequences(ctx))
    else:
        found.run(lambda: corpus_lib.source_facts(corpus_source(ctx)), "--corpus: ")
    spec = found.run(lambda: general_phase(ctx, count)) if count is not None else None
    return [spec] if spec is not None else []


STAGE = Stage(
    NAME, general, reads=reads, checks=checks, phases=phases,
    needs=frozenset({TEACHER, STUDENT_CONFIG}),
    outputs=lambda ctx: {ctx.state.path(NAME, "model"): "content"},
    skipped=skipped, lr_flag="general_lr",
    artefacts=lambda ctx: [("general model (student before task distillation)",
                            ctx.state.path(NAME, "model"))],
    handover_flag="general_model",
    handover=lambda output_dir, config: posixpath.join(output_dir, NAME, "model"),
    handover_name=lambda config: config.general.recipe,  # table folders name the recipe
    per_task=False, folder=StageFolder(records=(CORPUS_COUNT,)))
