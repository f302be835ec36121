"""The PyTorch side of bench_task_distill.py: task-distillation epochs as the
reference code and a Hugging Face-style loop run them, on the same rows.

bench_task_distill.py writes the rows' lengths (and sizes) to a JSON file and
runs this script with a Python that has torch (tinybert_tf does not need it):

  python benchmarks/bench_task_distill_torch.py --rows rows.json

Loops (eager PyTorch, teacher under no_grad every step, AdamW):
  reference  every batch padded to max_seq_len, as the TinyBERT reference's
             task_distill.py feeds it; attention scores with the -10000 mask,
             entries <= -100 zeroed, MSE over B x h x L x L; hidden MSE over
             B x L x d; prediction: soft cross-entropy against the teacher.
  dynamic    Hugging Face's DataCollatorWithPadding: random batches, each padded
             to its longest row; the same losses over real tokens only.
Prints one JSON object per (data, phase, loop): epoch seconds and rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
from bench_distill_torch import Bert
from torch import nn


class TaskBert(nn.Module):
    """`Bert` (bench_distill_torch.py) with BERT's pooler and a classifier."""

    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, labels: int):
        super().__init__()
        self.bert = Bert(layers, hidden, heads, ffn)
        self.pool = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, ids, mask, types):
        hidden, scores = self.bert(ids, mask, types)
        logits = self.classifier(torch.tanh(self.pool(hidden[-1][:, 0])))
        return hidden, scores, logits


def batches(lengths: np.ndarray, batch: int, max_len: int, dynamic: bool, seed: int):
    """(ids, mask, types) per batch of one epoch: a random permutation (drop last),
    padded to max_len or (dynamic) to the batch's longest row."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths))[: len(lengths) - len(lengths) % batch]
    for b in range(len(order) // batch):
        rows = order[b * batch:(b + 1) * batch]
        n = lengths[rows]
        width = int(n.max()) if dynamic else max_len
        mask = (np.arange(width)[None, :] < n[:, None]).astype(np.int64)
        ids = rng.integers(1000, 30000, (batch, width)) * mask
        yield (torch.from_numpy(ids), torch.from_numpy(mask),
               torch.zeros(batch, width, dtype=torch.long))


def intermediate_loss(s_hidden, s_scores, t_hidden, t_scores, fit, mask, masked: bool):
    """Sum over student layers of attention + hidden MSE (map g(m) = 3m for 4 of 12)."""
    m_s, m_t = len(s_scores), len(t_scores)
    step = m_t // m_s
    loss = 0.0
    real = mask[:, None, :, None].float() * mask[:, None, None, :].float()
    for m in range(m_s):
        s_att, t_att = s_scores[m], t_scores[(m + 1) * step - 1]
        if masked:
            loss = loss + (((s_att - t_att) * real) ** 2).sum() / (real.sum() * s_att.shape[1])
        else:  # the reference: masked entries (<= -100) zeroed, mean over everything
            s_att = torch.where(s_att <= -1e2, torch.zeros_like(s_att), s_att)
            t_att = torch.where(t_att <= -1e2, torch.zeros_like(t_att), t_att)
            loss = loss + ((s_att - t_att) ** 2).mean()
    tokens = mask[:, :, None].float()
    for m in range(m_s + 1):
        diff = fit[m](s_hidden[m]) - t_hidden[m * step]
        if masked:
            loss = loss + ((diff * tokens) ** 2).sum() / (tokens.sum() * diff.shape[-1])
        else:
            loss = loss + (diff ** 2).mean()
    return loss


def epoch(phase: str, loop: str, lengths, args, sizes) -> float:
    """Seconds of one epoch (after one warm-up step)."""
    torch.manual_seed(0)
    t, s = sizes["teacher"], sizes["student"]
    teacher = TaskBert(t["layers"], t["hidden"], t["heads"], t["ffn"], args.labels).eval()
    student = TaskBert(s["layers"], s["hidden"], s["heads"], s["ffn"], args.labels).train()
    fit = nn.ModuleList(nn.Linear(s["hidden"], t["hidden"], bias=False)
                        for _ in range(s["layers"] + 1))
    params = list(student.parameters()) + (list(fit.parameters()) if phase == "intermediate"
                                           else [])
    opt = torch.optim.AdamW(params, lr=5e-5)
    dynamic = loop == "dynamic"

    def step(ids, mask, types):
        with torch.no_grad():
            t_hidden, t_scores, t_logits = teacher(ids, mask, types)
        s_hidden, s_scores, s_logits = student(ids, mask, types)
        if phase == "intermediate":
            loss = intermediate_loss(s_hidden, s_scores, t_hidden, t_scores, fit, mask, dynamic)
        else:
            loss = -(torch.softmax(t_logits, -1) * torch.log_softmax(s_logits, -1)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())

    data = list(batches(lengths, args.batch, args.max_len, dynamic, seed=1))
    step(*data[0])  # warm-up
    start = time.perf_counter()
    for x in data:
        loss = step(*x)
    assert math.isfinite(loss), loss
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", required=True, help="JSON from bench_task_distill.py")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    with open(args.rows, encoding="utf-8") as f:
        spec = json.load(f)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}),
          flush=True)
    for data in spec["data"]:
        run = argparse.Namespace(batch=spec["batch"], max_len=data["max_seq_len"],
                                 labels=data["labels"])
        lengths = np.asarray(data["lengths"])
        for phase in ("intermediate", "prediction"):
            for loop in ("reference", "dynamic"):
                seconds = epoch(phase, loop, lengths, run, spec["models"])
                print(json.dumps({"data": data["name"], "phase": phase, "loop": loop,
                                  "epoch_s": seconds,
                                  "rows": len(lengths) - len(lengths) % spec["batch"]}),
                      flush=True)


if __name__ == "__main__":
    main()
