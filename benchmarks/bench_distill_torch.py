"""The same distillation step as bench_distill.py, written the way the PyTorch
reference does it, to compare on one machine.

Why this exists: the reference TinyBERT code runs intermediate-layer
distillation in eager PyTorch (teacher forward under no_grad, student forward
and backward, MSE on attention scores with masked entries zeroed, MSE on
projected hidden states and embeddings, Adam). Comparing our examples/s with a
figure measured on another machine says little, so this script times that step
on the machine at hand: bert_base-shaped teacher, tinybert_4l_312d student
(random weights), seq 128, batch 16, layer map 3,6,9,12.

Needs PyTorch, which tinybert_tf does not depend on; install it in a separate
environment (`pip install torch numpy`) and run
`python benchmarks/bench_distill_torch.py`. It prints one line per dtype in
bench_distill.py's format, plus the fp32 matmul peak measured by torch.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
import torch
from torch import nn


class Layer(nn.Module):
    """Post-LayerNorm BERT layer returning (output, pre-softmax scores)."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.o = nn.Linear(hidden, hidden)
        self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
        self.ff1, self.ff2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x, additive_mask):
        b, l, _ = x.shape
        split = lambda t: t.view(b, l, self.heads, self.d).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        probs = torch.softmax(scores + additive_mask, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, l, -1)
        x = self.ln1(x + self.o(ctx))
        x = self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))
        return x, scores + additive_mask  # the reference returns masked scores


class Bert(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, vocab: int = 30522):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(512, hidden)
        self.typ = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(Layer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, ids, mask, types):
        pos = torch.arange(ids.shape[1])[None]
        x = self.ln(self.word(ids) + self.pos(pos) + self.typ(types))
        additive = ((1.0 - mask[:, None, None, :].float()) * -10000.0).to(x.dtype)
        hidden, scores = [x], []
        for layer in self.layers:
            x, s = layer(x, additive)
            hidden.append(x)
            scores.append(s)
        return hidden, scores


def matmul_peak(dtype, n: int = 2048, repeats: int = 8) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            out = a
            for _ in range(4):
                out = (out @ b) * 1e-2
            float(out.float().sum())
            best = min(best, time.perf_counter() - start)
    return 4 * 2 * n ** 3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", default="fp32,bf16", help="comma list of fp32, bf16")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(1000, 30000, (args.batch, args.seq)))
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    types = torch.zeros(args.batch, args.seq, dtype=torch.long)
    peak = matmul_peak(torch.float32)
    print(f"cpu cores: {os.cpu_count()}  torch {torch.__version__}  threads "
          f"{torch.get_num_threads()}")
    print(f"matmul peak: fp32 {peak / 1e9:.1f} GFLOP/s")
    print(f"{'run':<14}{'step s':>9}{'steps/s':>9}{'ex/s':>8}")
    for key in [r.strip() for r in args.runs.split(",") if r.strip()]:
        if key not in ("fp32", "bf16"):
            parser.error(f"--runs: unknown run {key!r}; use fp32, bf16.")
        teacher = Bert(12, 768, 12, 3072).eval()
        if key == "bf16":
            teacher = teacher.to(torch.bfloat16)
        student = Bert(4, 312, 12, 1200).train()
        fit = nn.ModuleList(nn.Linear(312, 768) for _ in range(5))
        opt = torch.optim.AdamW(list(student.parameters()) + list(fit.parameters()), lr=1e-4)
        mse = nn.MSELoss()

        def step():
            with torch.no_grad():
                t_hidden, t_scores = teacher(ids, mask, types)
            s_hidden, s_scores = student(ids, mask, types)
            loss = 0.0
            for m, g in enumerate((3, 6, 9, 12)):
                s_att, t_att = s_scores[m], t_scores[g - 1].float()
                # The reference zeroes masked entries (<= -100) before the MSE.
                s_att = torch.where(s_att <= -1e2, torch.zeros_like(s_att), s_att)
                t_att = torch.where(t_att <= -1e2, torch.zeros_like(t_att), t_att)
                loss = loss + mse(s_att, t_att)
            for m, g in enumerate((0, 3, 6, 9, 12)):
                loss = loss + mse(fit[m](s_hidden[m]), t_hidden[g].float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            return float(loss.detach())

        step()
        step()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - start)
        assert np.isfinite(loss), loss
        t = float(np.median(times))
        label = "fp32" if key == "fp32" else "bf16-teacher"
        print(f"{label:<14}{t:>9.2f}{1 / t:>9.3f}{args.batch / t:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
