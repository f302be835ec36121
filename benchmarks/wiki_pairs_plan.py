"""Step times of every training phase at wiki_pairs shapes, and the wall time per seed
they imply for the ablation tables (paper Tables 2, 3 and 4) on this machine.

Measures, with the embedded MiniLM teacher (6 x 384, a 2-label head) and a student
config (default minilm_2l_384d), on real wiki_pairs train pairs padded to the
task stages' fixed length:

  gd          general distillation step (embd+attn+hidn), --general_seq, batch --general_batch
  finetune    teacher fine-tuning step (cross-entropy on the labels), --seq, --teacher_batch
  inter       intermediate-layer step (embd+attn+hidn), --seq, --batch
  pred        prediction-layer step, teacher recomputed
  pred_cached prediction-layer step, teacher logits read from the batch
  hard        student step on the labels only (w/o TD, w/o Pred's second phase)
  fwd_teacher, fwd_student   forward pass per example at --eval_batch (dev evaluation)

then projects each cell and each table per seed from the sizes given (steps, epochs,
augmentation; the defaults are configs/wiki_pairs_sizes.cfg's, which runs one last phase
per cell: no --pred_grid). The teacher runs in float32 here; the pipeline's
--teacher_precision=auto picks bfloat16 on a CPU with AVX512-BF16. The cells (an
estimate: the flagfiles of configs/paper/ define them):

  Table 2  main, w/o GD (random student: no general stage), w/o TD (general student
           fine-tuned on the labels), w/o DA (task distillation on the 2,786 original
           pairs); one general distillation shared by the cells that have one
  Table 3  main, w/o Embd, w/o Attn, w/o Hidn, w/o Trm (each its own general stage),
           w/o Pred (shares main's; its second phase is "hard" steps)
  Table 4  uniform, top, bottom: each its own general stage (the map shapes it)

Shared by every cell and seed: the fine-tuned teacher (--task_teacher) and the
augmented file (timed by `bin/distill --stages=augment`, given as --augment_s).
Every cell also runs the evaluate stage (teacher and student over dev, latency).

Usage:
  .venv/bin/python benchmarks/wiki_pairs_plan.py [--steps 5] [--seq 128] ...
About 3 minutes on 2 idle cores (the teacher-side steps dominate).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.config import get_config  # noqa: E402
from tinybert_tf.data import wiki_pairs  # noqa: E402
from tinybert_tf.distill import Distiller, create_optimizer, make_terms  # noqa: E402
from tinybert_tf.distill.terms import HardLabelTerm, PredictionTerm  # noqa: E402
from tinybert_tf.models import BertModel  # noqa: E402
from tinybert_tf.models.checkpoint import load_model, load_tokenizer  # noqa: E402
from tinybert_tf.models.encoder import flops_per_example  # noqa: E402
from tinybert_tf.tasks.sentence import Classification  # noqa: E402

DEV, TRAIN = 2400, 2786


def median_step(fn, steps: int) -> float:
    fn()  # trace
    fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def batch_of(tokenizer, pairs, n: int, seq: int) -> tuple[dict, np.ndarray]:
    """`n` real train pairs packed to the fixed length `seq` (as the task stages pack)."""
    chosen = [pairs[i % len(pairs)] for i in range(n)]
    x = tokenizer([p.text_a for p in chosen], [p.text_b for p in chosen], max_seq_len=seq)
    return ({k: v.numpy() for k, v in x.items()},
            np.array([p.label for p in chosen], np.int32))


def measure(args) -> dict[str, float]:
    keras.utils.set_random_seed(0)
    task = Classification(wiki_pairs.LABELS)
    pairs = wiki_pairs.build()["train"]
    teacher = load_model(args.teacher, **task.head_kwargs())
    vocab = teacher.bert_config.vocab_size
    s_cfg = get_config(args.student).replace(vocab_size=vocab,
                                             lower_case=teacher.bert_config.lower_case)
    student = BertModel(s_cfg, vocab=teacher.vocab, **task.head_kwargs())
    tok = load_tokenizer(teacher, max(args.seq, args.general_seq))
    out = {}

    def step_of(distiller, batch):
        x, y = batch
        return lambda: distiller.train_on_batch(x, y)

    gd_student = BertModel(s_cfg, vocab=teacher.vocab)
    gd_teacher = load_model(args.teacher)
    gd = Distiller(student=gd_student, teacher=gd_teacher, terms=make_terms("embd,attn,hidn"))
    gd.compile(optimizer=create_optimizer(1e-4, 1000))
    x, _ = batch_of(tok, pairs, args.general_batch, args.general_seq)
    out["gd"] = median_step(lambda: gd.train_on_batch(x), args.steps)

    ft_teacher = load_model(args.teacher, **task.head_kwargs())
    ft = Distiller(student=ft_teacher, teacher=None, terms=[HardLabelTerm(task=task)])
    ft.compile(optimizer=create_optimizer(5e-5, 1000))
    out["finetune"] = median_step(step_of(ft, batch_of(tok, pairs, args.teacher_batch,
                                                       args.seq)), args.steps)

    batch = batch_of(tok, pairs, args.batch, args.seq)
    inter = Distiller(student=student, teacher=teacher, terms=make_terms("embd,attn,hidn"))
    inter.compile(optimizer=create_optimizer(5e-4, 1000))
    out["inter"] = median_step(step_of(inter, batch), args.steps)
    pred = Distiller(student=student, teacher=teacher, terms=[PredictionTerm(task=task)])
    pred.compile(optimizer=create_optimizer(5e-4, 1000))
    out["pred"] = median_step(step_of(pred, batch), args.steps)
    logits = teacher(batch[0], training=False)["logits"].numpy()
    out["pred_cached"] = median_step(
        step_of(pred, (dict(batch[0], teacher_logits=logits), batch[1])), args.steps)
    hard = Distiller(student=student, teacher=None, terms=[HardLabelTerm(task=task)])
    hard.compile(optimizer=create_optimizer(5e-4, 1000))
    out["hard"] = median_step(step_of(hard, batch), args.steps)

    xe, _ = batch_of(tok, pairs, args.eval_batch, args.seq)
    for who, model in (("teacher", teacher), ("student", student)):
        forward = tf.function(lambda z, m=model: m(z, training=False)["logits"])
        out[f"fwd_{who}"] = median_step(lambda: forward(xe).numpy(), args.steps) / \
            args.eval_batch
    return out


def plan(t: dict[str, float], a) -> dict[str, dict[str, float]]:
    """Seconds per cell and per table (one seed) from step times `t` and the sizes."""
    rows = TRAIN * (1 + 2 * a.num_aug)

    def steps(n_rows: int, epochs: float) -> int:
        s = int(epochs * (n_rows // a.batch))
        return min(s, a.task_max_steps) if a.task_max_steps else s

    def evals(pred_steps: int) -> int:
        return (pred_steps // a.eval_every if a.eval_every else math.ceil(a.pred_epochs)) + 1

    gd = a.gd_steps * t["gd"]
    dev_student = DEV * t["fwd_student"]
    evaluate = DEV * (t["fwd_teacher"] + t["fwd_student"])

    def td(n_rows: int, pred_kind: str = "pred") -> float:
        i, p = steps(n_rows, a.inter_epochs), steps(n_rows, a.pred_epochs)
        return i * t["inter"] + p * t[pred_kind] + evals(p) * dev_student + evaluate

    main, no_da = td(rows), td(TRAIN)
    no_td = steps(rows, a.pred_epochs) * t["hard"] + evals(steps(rows, a.pred_epochs)) * \
        dev_student + evaluate
    no_pred = td(TRAIN, "hard") - steps(TRAIN, a.inter_epochs) * t["inter"] + \
        steps(rows, a.inter_epochs) * t["inter"]
    teacher_steps = math.ceil(a.teacher_epochs * math.ceil(TRAIN / a.teacher_batch))
    shared = {"teacher fine-tuning (once)": teacher_steps * t["finetune"]
              + math.ceil(a.teacher_epochs) * DEV * t["fwd_teacher"],
              "augmentation (once)": a.augment_s}
    cells = {"general stage": gd, "TD main": main, "TD w/o DA": no_da,
             "w/o TD (fine-tuning)": no_td, "TD w/o Pred": no_pred}
    tables = {"Table 2": gd + main + main + no_td + no_da,
              "Table 3": 5 * gd + 5 * main + no_pred,
              "Table 4": 3 * gd + 3 * main}
    return {"shared": shared, "cells": cells, "tables": tables}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="timed steps per measurement")
    p.add_argument("--teacher", default="minilm-l6")
    p.add_argument("--student", default="minilm_2l_384d")
    p.add_argument("--seq", type=int, default=96, help="--max_seq_len of the task stages")
    p.add_argument("--batch", type=int, default=32, help="--task_batch_size")
    p.add_argument("--general_seq", type=int, default=64)
    p.add_argument("--general_batch", type=int, default=32)
    p.add_argument("--teacher_batch", type=int, default=32)
    p.add_argument("--eval_batch", type=int, default=64)
    p.add_argument("--gd_steps", type=int, default=100, help="--general_max_steps")
    p.add_argument("--teacher_epochs", type=float, default=3)
    p.add_argument("--num_aug", type=int, default=4)
    p.add_argument("--inter_epochs", type=float, default=1)
    p.add_argument("--pred_epochs", type=float, default=1)
    p.add_argument("--task_max_steps", type=int, default=200)
    p.add_argument("--eval_every", type=int, default=50)
    p.add_argument("--augment_s", type=float, default=60.0,
                   help="seconds of the augment stage (measured with bin/distill)")
    a = p.parse_args(argv)
    t = measure(a)
    t_cfg = get_config("minilm_l6_384d")
    s_cfg = get_config(a.student)
    print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
          f"teacher minilm-l6 {flops_per_example(t_cfg, a.seq, 2) / 1e9:.2f} GFLOP/example, "
          f"student {a.student} {flops_per_example(s_cfg, a.seq, 2) / 1e9:.2f} at seq {a.seq}")
    for k, v in t.items():
        unit = "ms/example" if k.startswith("fwd") else "ms/step"
        print(f"  {k:12} {v * 1e3:9.1f} {unit}")
    out = plan(t, a)
    rows = TRAIN * (1 + 2 * a.num_aug)
    print(f"\nplan: {a.gd_steps} GD steps; teacher {a.teacher_epochs:g} epochs; N_a={a.num_aug} "
          f"({rows} rows); TD {a.inter_epochs:g} + {a.pred_epochs:g} epochs, at most "
          f"{a.task_max_steps or 'no cap'} steps a phase, dev eval every {a.eval_every} steps")
    for group, items in out.items():
        for k, v in items.items():
            print(f"  {group:7} {k:28} {v / 60:7.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
