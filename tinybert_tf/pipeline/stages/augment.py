"""The augment stage: Algorithm 1 -> OUTPUT/augment/<the source's augmented file>
(skipped with --nouse_augmented, --augmented_file, or task phases that read none)."""
from __future__ import annotations

import posixpath
from typing import Any, Optional

from tinybert_tf import files
from tinybert_tf.augment.augmenter import augment_source
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.data.sources import RowTable
from tinybert_tf.models.checkpoint import inspect_model
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import StageFolder
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages.base import (
    TASK_DATA,
    TASK_TEACHER,
    TEACHER_VOCAB,
    Findings,
    PlanInputs,
    Stage,
)
from tinybert_tf.pipeline.stages.common import corpus_files, model_path, task_data
from tinybert_tf.pipeline.stages.inspect import inspect_flag
from tinybert_tf.pipeline.training.phases import reads_augmented
from tinybert_tf.tasks.catalog import resolve_task

NAME = "augment"


def augment(ctx: Context) -> dict[str, Any]:
    a, r = ctx.config.augment, ctx.config.run
    # The teacher's vocab, read without weights: augmentation must tokenise as the
    # task models do.
    teacher_vocab = inspect_model(ctx.config.models.vocab_teacher).vocab
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




def written(ctx: Context) -> bool:
    """Whether the augmented file is there to read: this run's augment stage finished,
    or --augmented_file gives it."""
    return (ctx.state.is_done(NAME) or bool(ctx.config.distill.augmented_file)) \
        and files.exists(ctx.augmented_path())


def rows_per_example(ctx: Context, table: Optional[RowTable] = None) -> int:
    """At most how many rows augmentation writes per training example: the example, then
    N_a variants of each text field it varies, one field at a time (1 + 2 N_a for a
    pair; 1 + 3 N_a for SQuAD: the question, the context before and after the answer).
    `table`: the source's augmentation table when read (else a pair counts two fields).
    At least 1 (the example itself), whatever --num_aug says: a refused value is reported
    by its range check, not again as an empty augmented set."""
    fields = len(table.text_columns) if table is not None else (2 if ctx.task.is_pair else 1)
    return 1 + max(0, ctx.config.augment.num_aug) * max(1, fields)


def reads(ctx: Context) -> dict[str, Any]:
    m, a = ctx.config.models, ctx.config.augment
    found = {"data": task_data(ctx), "vocab_model": model_path(m.vocab_teacher),
             "mlm_model": model_path(a.mlm_model), "word_vectors": a.word_vectors}
    if not a.word_vectors:
        found["corpus"] = corpus_files(a.corpus)
    return found


def handed_file(output_dir: str, config: PipelineConfig) -> str:
    """The augmented file in the run folder `output_dir` (as `Context.augmented_path`)."""
    return posixpath.join(output_dir, NAME, resolve_task(config.task).source.augmented_name)


def skipped(config: PipelineConfig) -> bool:
    """No task phase reads augmented rows, or --augmented_file gives them."""
    return not reads_augmented(config) or bool(config.distill.augmented_file)


# Not collective: under multi_worker the chief alone runs it, and the workers wait for
# its file (their task stage reads it).
def checks(ctx: Context, found: Findings) -> None:
    """Algorithm 1's models (an MLM model with the teacher's vocab, word vectors) or the
    fallback, and no --augmented_file standing in for its output."""
    a, d = ctx.config.augment, ctx.config.distill
    if d.augmented_file:
        found.errors.append(
            f"--augmented_file={d.augmented_file} replaces the augment stage, which "
            f"--stages={','.join(found.stages)} also runs; drop one of the two.")
    missing = [f for f, v in (("--mlm_model", a.mlm_model), ("--word_vectors", a.word_vectors))
               if not v]
    if missing and not a.augment_fallback:
        found.errors.append(
            f"augment: Algorithm 1 needs {' and '.join(missing)}: a BERT with an MLM head "
            "(e.g. the pre-trained bert-base-uncased directory) for single-piece words and "
            "GloVe vectors (e.g. glove.840B.300d.txt) for the rest. Give them, or set "
            "--augment_fallback to use word vectors trained on --corpus for every word (weak; "
            "the demo does this), or --nouse_augmented.")
    if a.mlm_model:
        info = inspect_flag(found, a.mlm_model, "--mlm_model")
        vocab_model = found.models.vocab_model
        if info is not None and info.head != "mlm":
            found.errors.append(f"--mlm_model={a.mlm_model}: the checkpoint has no MLM head "
                                f"(head: {info.head}); give a BertForMaskedLM / keras-hub "
                                "BertMaskedLM / our MLM directory.")
        if info is not None and vocab_model is not None and info.vocab != vocab_model.vocab:
            found.errors.append(f"--mlm_model={a.mlm_model} has another vocabulary than the "
                                "teacher; augmentation must tokenise as the task models do.")
    if a.word_vectors and not files.isfile(a.word_vectors):
        found.errors.append(f"--word_vectors={a.word_vectors}: file not found.")


def phases(ctx: Context, found: Findings, inputs: PlanInputs) -> list:
    """No phase of its own: it reads the source's augmentation table, which bounds the
    rows per example the later phases are sized on (`rows_per_example`)."""
    if inputs.train is not None:
        inputs.table = found.run(lambda: ctx.task.source.augment_table(), "augment: ")
    return []


STAGE = Stage(
    NAME, augment, reads=reads, checks=checks, phases=phases,
    needs=frozenset({TEACHER_VOCAB, TASK_TEACHER, TASK_DATA}),
    outputs=lambda ctx: {ctx.augmented_path(): "content"},
    skipped=skipped, chief_only=True, workers_wait=True, replaced_by="--nouse_augmented",
    artefacts=lambda ctx: [("augmented training data", ctx.augmented_path())],
    handover_flag="augmented_file", handover=handed_file,
    folder=StageFolder(progress=("*.progress.json", "*.parts")))
