"""The augment stage: Algorithm 1 -> OUTPUT/augment/<the source's augmented file>
(skipped with --nouse_augmented, --augmented_file, or task phases that read none)."""
from __future__ import annotations

import posixpath
from typing import Any, Optional

from tinybert_tf.augment.augmenter import augment_source
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.data.sources import RowTable
from tinybert_tf.models.checkpoint import inspect_model
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import StageFolder
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.stages.base import Stage
from tinybert_tf.pipeline.stages.common import corpus_files, model_path, task_data
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




def rows_per_example(ctx: Context, table: Optional[RowTable] = None) -> int:
    """At most how many rows augmentation writes per training example: the example, then
    N_a variants of each text field it varies, one field at a time (1 + 2 N_a for a
    pair; 1 + 3 N_a for SQuAD: the question, the context before and after the answer).
    `table`: the source's augmentation table when read (else a pair counts two fields)."""
    fields = len(table.text_columns) if table is not None else (2 if ctx.task.is_pair else 1)
    return 1 + ctx.config.augment.num_aug * max(1, fields)

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
STAGE = Stage(
    NAME, augment, reads=reads,
    outputs=lambda ctx: {ctx.augmented_path(): "content"},
    skipped=skipped, chief_only=True, workers_wait=True, replaced_by="--nouse_augmented",
    artefacts=lambda ctx: [("augmented training data", ctx.augmented_path())],
    handover_flag="augmented_file", handover=handed_file,
    folder=StageFolder(progress=("*.progress.json", "*.parts")))
