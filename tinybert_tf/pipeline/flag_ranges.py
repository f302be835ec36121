"""Checks of single flag values the preflight runs first: numeric ranges,
--layer_weights, and stages that would publish an untrained model."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.training import phases as P
from tinybert_tf.pipeline.training.recipes import GeneralRecipe


def ranges(c: PipelineConfig) -> list[tuple[str, Any, Callable[[Any], bool], str]]:
    """(flag, value, ok, what is allowed) for every numeric flag."""
    pos, nonneg = (lambda v: v > 0), (lambda v: v >= 0)
    g, f, d, a, r, o = c.general, c.finetune, c.distill, c.augment, c.run, c.optim
    q = c.quantize
    return [
        ("--quantize_steps", q.steps, nonneg, ">= 0 (0 = calibrate only)"),
        ("--quantize_lr", q.lr, nonneg, ">= 0 (0 = keep the weights, fit the ranges only)"),
        ("--quantize_batch_size", q.batch_size, pos, "> 0"),
        ("--quantize_calibration_examples", q.calibration_examples, pos, ">= 1"),
        ("--quantize_eval_every", q.eval_every, nonneg, ">= 0 (0 = keep the last weights)"),
        ("--general_batch_size", g.batch_size, pos, "> 0"),
        ("--teacher_batch_size", f.batch_size, pos, "> 0"),
        ("--task_batch_size", d.batch_size, pos, "> 0"),
        ("--eval_batch_size", r.eval_batch_size, pos, "> 0"),
        ("--augment_batch_size", r.augment_batch_size, pos, "> 0"),
        ("--general_epochs", g.epochs, nonneg, ">= 0"),
        ("--teacher_epochs", f.epochs, nonneg, ">= 0"),
        ("--intermediate_epochs", d.intermediate_epochs, nonneg, ">= 0"),
        ("--pred_epochs", d.pred_epochs, nonneg, ">= 0"),
        ("--finetune_epochs", d.finetune_epochs, nonneg, ">= 0"),
        ("--general_max_steps", g.max_steps, nonneg, ">= 0 (0 = no limit)"),
        ("--task_max_steps", d.max_steps, nonneg, ">= 0 (0 = no limit)"),
        ("--teacher_max_steps", f.max_steps, nonneg, ">= 0 (0 = no limit)"),
        ("--general_lr", g.lr, pos, "> 0"), ("--teacher_lr", f.lr, pos, "> 0"),
        ("--intermediate_lr", d.intermediate_lr, pos, "> 0"), ("--pred_lr", d.pred_lr, pos, "> 0"),
        ("--finetune_lr", d.finetune_lr, pos, "> 0"),
        ("--general_warmup", g.warmup, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--warmup_proportion", o.warmup_proportion, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--weight_decay", o.weight_decay, nonneg, ">= 0"),
        ("--clip_norm", o.clip_norm, nonneg, ">= 0 (0 = off)"),
        ("--grad_accum_steps", o.grad_accum_steps, pos, ">= 1"),
        ("--temperature", c.loss.temperature, pos, "> 0"),
        ("--distil_temperature", g.distil_temperature, pos, "> 0"),
        ("--hard_label_weight", c.loss.hard_label_weight, nonneg, ">= 0"),
        ("--checkpoint_every", r.checkpoint_every, pos, ">= 1"),
        ("--keep_checkpoints", r.keep_checkpoints, pos, ">= 1"),
        ("--eval_every", d.eval_every, nonneg, ">= 0 (0 = once per epoch)"),
        ("--latency_runs", r.latency_runs, pos, ">= 1"),
        ("--export_latency_runs", r.export_latency_runs, pos, ">= 1"),
        ("--export_threads", r.export_threads, nonneg, ">= 0 (0 = all cores)"),
        ("--export_max_examples", r.export_max_examples, nonneg, ">= 0 (0 = all)"),
        ("--representative_examples", c.export.representative_examples, nonneg, ">= 0"),
        ("--num_aug", a.num_aug, pos, ">= 1"),
        ("--replace_prob", a.replace_prob, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--num_candidates", a.num_candidates, pos, ">= 1"),
        ("--vector_vocab_limit", a.vector_vocab_limit, nonneg, ">= 0 (0 = all)"),
        ("--max_seq_len", c.task.max_seq_len, nonneg, ">= 0 (0 = the task's default)"),
        ("--general_max_seq_len", g.max_seq_len, lambda v: v >= 4, ">= 4"),
        ("--seed", c.numerics.seed, lambda v: 0 <= v < 2**32, "in [0, 2**32 - 1] (NumPy's "
         "seed range)"),
        ("--alpha_ce", g.alpha_ce, nonneg, ">= 0"), ("--alpha_mlm", g.alpha_mlm, nonneg, ">= 0"),
        ("--alpha_cos", g.alpha_cos, nonneg, ">= 0"),
        ("--max_query_len", c.task.max_query_len, pos, ">= 1"),
        ("--doc_stride", c.task.doc_stride, pos, ">= 1"),
        ("--n_best_size", c.task.n_best_size, pos, ">= 1"),
        ("--max_answer_len", c.task.max_answer_len, pos, ">= 1"),
        ("--lock_stale_minutes", r.lock_stale_minutes, pos, "> 0"),
        ("--length_buckets", c.numerics.length_buckets, nonneg,
         ">= 0 (0 = every batch padded to --max_seq_len)"),
        ("--teacher_cache_budget_gb", r.teacher_cache_budget_gb, nonneg, ">= 0 (0 = never)"),
        ("--peer_timeout", r.peer_timeout, pos, "> 0 seconds"),
    ]


def layer_weight_errors(values: Sequence[str]) -> list[str]:
    """--layer_weights must be finite numbers >= 0 (their count is checked against the
    student's layers by `layer_weights`)."""
    bad = []
    for i, v in enumerate(values):
        try:
            ok = math.isfinite(float(v)) and float(v) >= 0
        except ValueError:
            ok = False
        if not ok:
            bad.append(f"item {i + 1} ({v!r})")
    if not bad:
        return []
    return [f"--layer_weights={','.join(values)}: {', '.join(bad)} must be a number >= 0 "
            "(lambda_0 for embeddings, lambda_1..M for the student layers, lambda_M+1 for "
            "the prediction layer)."]


def trains_nothing(c: PipelineConfig, needs: set,
                    recipe: Optional[GeneralRecipe] = None) -> list[str]:
    """Stages that would publish an untrained model as their output (a recipe that
    trains nothing, such as first_layers, is meant to)."""
    out = []
    g, f, d = c.general, c.finetune, c.distill
    if "general" in needs and g.epochs == 0 and (recipe is None or recipe.trains):
        out.append("--general_epochs=0: the general stage would train nothing and save a "
                   "random student as OUTPUT/general/model; give epochs > 0, or skip the stage "
                   "with --general_model=DIR (or --general_model=none for a random start).")
    if "finetune_teacher" in needs and f.epochs == 0:
        out.append("--teacher_epochs=0: the finetune_teacher stage would train nothing and "
                   "save --teacher with an untrained task head as the task teacher; give "
                   "epochs > 0, or a fine-tuned teacher with --task_teacher=DIR.")
    if "task" in needs:
        try:
            kinds = P.phase_kinds(d.task_phases)
        except ValueError:
            kinds = []  # reported by the phase check
        for kind in kinds:
            if kind.epochs(c) == 0:
                out.append(f"{kind.epochs_flag or kind.name}=0: the {kind.name} phase of "
                           f"--task_phases={','.join(d.task_phases)} would train nothing"
                           + (" and leave the task head untrained" if kind is kinds[-1]
                              else "") + f"; give epochs > 0, or drop {kind.name} from "
                           "--task_phases.")
    return out
