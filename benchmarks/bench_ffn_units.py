"""How much of a teacher layer a narrower feed-forward block keeps, by the rule that
picks its units.

`--init_from_teacher` gives a student whose intermediate_size is below the teacher's
the teacher's FFN units of largest ||W_in[:, j]|| * ||W_out[j, :]|| in each copied
layer (`tinybert_tf.distill.distilbert.ffn_units`). This script measures what that
choice keeps, against two others of the same size: the first k units and k units
drawn at random (--draws draws, each seeded).

For each teacher layer l and rule, the layer is rebuilt with only the chosen units
and run on the teacher's own input to it (hidden state l - 1, from real sentences);
printed is the relative error of its output against the full layer's,
||h_pruned - h_full|| / ||h_full - mean(h_full)|| over the real (unpadded) tokens.
Results also go to --output as JSON.

The sentences are the embedded polarity task's (gensim's test data): no network.

Usage:
  python benchmarks/bench_ffn_units.py --keep 768     # the train split's 160 sentences
  python benchmarks/bench_ffn_units.py --quick    # a smoke run: 16 sentences, 1 draw
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This checkout's package, not one installed elsewhere (as bin/distill does).
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()

import numpy as np  # noqa: E402

from tinybert_tf.data import polarity  # noqa: E402
from tinybert_tf.distill.distilbert import ffn_units, slice_ffn  # noqa: E402
from tinybert_tf.models.checkpoint import load_model, load_tokenizer  # noqa: E402
from tinybert_tf.models.layers import TransformerLayer  # noqa: E402
from tinybert_tf.tokenizer import pack_texts  # noqa: E402


def pruned_layer(full: TransformerLayer, units: np.ndarray, hidden: int) -> TransformerLayer:
    """A copy of `full` whose FFN keeps only `units` (same attention, norms, biases)."""
    layer = TransformerLayer(full.num_heads, full.head_size, len(units), full.hidden_act,
                             0.0, 0.0, full.layer_norm_epsilon)
    layer.build((None, None, hidden))
    # Paths below the layer's own name ("bert/transformer_layer_1/..." in the teacher).
    source = {w.path.split(full.name + "/", 1)[1]: w.numpy() for w in full.weights}
    for w in layer.weights:
        key = w.path.split(layer.name + "/", 1)[1]
        w.assign(slice_ffn(key, source[key], units))
    return layer


def relative_error(pruned: np.ndarray, full: np.ndarray, mask: np.ndarray) -> float:
    """||pruned - full|| / ||full - mean(full)||, over the tokens where mask is 1.
    pruned, full: [B, L, H]; mask: [B, L]."""
    keep = mask.astype(bool)
    p, f = pruned[keep], full[keep]
    return float(np.linalg.norm(p - f) / np.linalg.norm(f - f.mean(axis=0)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--keep", type=int, default=768, help="FFN units kept per layer")
    parser.add_argument("--sentences", type=int, default=160,
                        help="the first N of the polarity train split (160 in all)")
    parser.add_argument("--max_seq_len", type=int, default=64)
    parser.add_argument("--draws", type=int, default=5, help="random subsets per layer")
    parser.add_argument("--output", default="bench_ffn_units_out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.sentences, args.draws = 16, 1

    teacher = load_model(args.teacher, head="none")
    width = teacher.bert_config.intermediate_size
    if not 0 < args.keep < width:
        parser.error(f"--keep={args.keep}: give 1 to {width - 1} (the teacher's FFN has "
                     f"{width} units)")
    tokenizer = load_tokenizer(teacher, args.max_seq_len)
    texts = [e.text_a for e in polarity.load_examples("train")][: args.sentences]
    inputs = pack_texts(tokenizer, texts, None, args.max_seq_len)
    out = teacher(inputs)
    mask = inputs["input_mask"]
    hidden = teacher.bert_config.hidden_size

    rules = {"largest norm product (ours)": None, "first k": np.arange(args.keep)}
    results = []
    print(f"teacher {args.teacher}: FFN {width} -> {args.keep} units; {len(texts)} "
          f"polarity sentences, {int(mask.sum())} tokens")
    print(f"{'layer':>5}  {'largest norm product':>20}  {'first k':>8}  "
          f"{'random (mean, min-max over ' + str(args.draws) + ')':>36}")
    for i, full in enumerate(teacher.transformer_layers):
        x, target = out["hidden_states"][i], out["hidden_states"][i + 1].numpy()
        w_in = full.feedforward_intermediate_dense.kernel.numpy()
        w_out = full.feedforward_output_dense.kernel.numpy()
        rules["largest norm product (ours)"] = ffn_units(w_in, w_out, args.keep)
        row = {"layer": i + 1}
        for name, units in rules.items():
            pruned = pruned_layer(full, units, hidden)(x, mask)[0].numpy()
            row[name] = relative_error(pruned, target, mask)
        draws = []
        for d in range(args.draws):
            units = np.sort(np.random.default_rng(d).permutation(width)[: args.keep])
            draws.append(relative_error(pruned_layer(full, units, hidden)(x, mask)[0].numpy(),
                                        target, mask))
        row["random"] = draws
        results.append(row)
        print(f"{i + 1:>5}  {row['largest norm product (ours)']:>20.3f}  {row['first k']:>8.3f}"
              f"  {np.mean(draws):>20.3f} ({min(draws):.3f}-{max(draws):.3f})")
    os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, "ffn_units.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"teacher": args.teacher, "keep": args.keep, "width": width,
                   "sentences": len(texts), "max_seq_len": args.max_seq_len,
                   "host": platform.processor() or platform.machine(),
                   "layers": results}, f, indent=1)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
