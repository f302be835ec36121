"""Helpers the stage modules share: a phase's Distiller, its run with the divergence
hint, dev evaluation, the task teacher and the student's config."""
from __future__ import annotations

from typing import Any, Callable, Optional

from tinybert_tf.config import BertConfig, get_config
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.distill.distiller import Distiller
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import CheckpointError, load_model, resolve
from tinybert_tf.models.labels import put_in_order
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.stages.base import STAGE_TABLE
from tinybert_tf.pipeline.training import task_input
from tinybert_tf.pipeline.training.loop import Phase, run_phase
from tinybert_tf.pipeline.training.phases import PHASE_KINDS, PhaseSpec
from tinybert_tf.pipeline.training.strategy import peer_errors


def with_padding(ctx: Context, spec: PhaseSpec) -> PhaseSpec:
    """`spec` padded or length-bucketed as its terms allow (task_input.padding_for)."""
    spec.padding = task_input.padding_for(ctx.config, ctx.task.type, spec.terms,
                                          ctx.max_seq_len)
    return spec


def divergence_hint(ctx: Context, spec: PhaseSpec) -> str:
    """What to change when the phase of `spec` diverges: its learning-rate flag and
    value (or its --pred_grid cell), and the command that redoes the stage. The flag
    is the phase kind's `lr_flag` when the phase has a registered kind, else its
    stage's `lr_flag`."""
    results = ctx.config.results()
    kind = PHASE_KINDS.get(spec.kind) if spec.kind else None
    stage = STAGE_TABLE.get(spec.stage)
    flag = (kind.lr_flag.removeprefix("--") if kind is not None
            else stage.lr_flag if stage is not None else "")
    if spec.cell is not None:
        lower = (f"lower the learning rate of its --pred_grid cell "
                 f"{spec.cell['batch']}:{spec.cell['lr']:g} (--pred_grid="
                 f"{','.join(results['pred_grid'])})")
    elif flag in results:
        lower = f"lower --{flag} (now {results[flag]:g})"
    else:  # a phase kind or stage of a plugin that names no flag
        lower = f"lower the learning rate of {spec.stage}/{spec.name}"
    return f"{lower}, then redo the stage with --stages={spec.stage} --overwrite"


def run_training(ctx: Context, phase: Phase, spec: PhaseSpec) -> dict[str, Any]:
    """Run `phase` (resumable) under the strategy, with the divergence hint of `spec`."""
    r = ctx.config.run
    phase.hint = phase.hint or divergence_hint(ctx, spec)
    with peer_errors(r.peer_timeout):
        return run_phase(phase, ctx.strategy, checkpoint_every=r.checkpoint_every,
                         keep_checkpoints=r.keep_checkpoints, log_every=1, verbose=1,
                         stop_grace_seconds=r.peer_timeout)


def make_distiller(ctx: Context, student, teacher, spec: PhaseSpec,
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


def evaluator(ctx: Context, model, examples,
              out_dir: Optional[str] = None) -> Callable[[], dict[str, float]]:
    """A function giving `model`'s task metrics on `examples` (prediction files in
    `out_dir` when given)."""
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
        given = m.teacher_label_order if m.teacher_given else ()
        mapping = put_in_order(teacher, task.label_names, given,
                               what=f"the task teacher ({ctx.teacher_path()})")
        if list(mapping.values()) != list(range(len(mapping))):
            print(f"[teacher] outputs reordered to the task's labels: {mapping}", flush=True)
    return teacher


def student_config(ctx: Context, teacher_config: BertConfig, vocab_size: int) -> BertConfig:
    """--student_config with the teacher's vocab size and casing (a student always
    tokenises as its teacher does)."""
    return get_config(ctx.config.models.student_config).replace(
        vocab_size=vocab_size, lower_case=teacher_config.lower_case)


# --- what the stages read (their `Stage.reads`) ----------------------------------------

def model_path(name: str) -> str:
    """A model flag's directory (short names resolved to the installed package); the
    name itself when it is not a local or remote folder (a preset or hub name)."""
    if not name or name.lower() == "none":
        return ""
    try:
        return resolve(name)
    except CheckpointError:
        return name


def task_data(ctx: Context) -> list[str]:
    """Every file the task's data source reads (from its `describe()`), or its name
    (TFDS)."""
    found = ctx.task.source.input_paths()
    if found:
        return found
    described = ctx.task.source.describe()
    return [f"{described.get('kind', 'data')}:{described.get('name') or ctx.task.name}"]


def corpus_files(source: str) -> list[str]:
    """The corpus's files (tfds:NAME stays a name)."""
    source = source or corpus_lib.default_corpus_path()
    if corpus_lib.detect_format(source) == "tfds":
        return [source]
    return [path for path, _, _ in corpus_lib.source_facts(source)]
