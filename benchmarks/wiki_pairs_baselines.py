"""Sizes, balance, lengths and trivial baselines of the `wiki_pairs` task.

Prints what docs/data.md quotes: pairs, articles and label balance per split,
pair lengths in the teacher's word pieces, and dev accuracy of baselines that
use a shallow cue only (thresholds and weights fitted on train):

  majority              the most frequent train label
  word overlap          Jaccard of the two sentences' word sets, one threshold
  content overlap       shared words outside gensim's stop-word list, one threshold
  TF-IDF cosine         cosine of the two sentences' TF-IDF vectors, one threshold
  B only                logistic regression on sentence B's words (no A at all)
  cue features          logistic regression on the overlaps, both lengths and
                        B's first word

Usage (needs scikit-learn, the `test` extra):
  .venv/bin/python benchmarks/wiki_pairs_baselines.py [--teacher=minilm-l6]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import numpy as np  # noqa: E402
from gensim.parsing.preprocessing import STOPWORDS  # noqa: E402
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402

from tinybert_tf.data import wiki_pairs  # noqa: E402
from tinybert_tf.models.checkpoint import load_tokenizer  # noqa: E402

WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The threshold t maximising train accuracy of "next iff score > t"."""
    candidates = np.unique(scores)
    accs = [np.mean((scores > t) == labels) for t in candidates]
    return float(candidates[int(np.argmax(accs))])


def threshold_baseline(train_scores, train_labels, dev_scores, dev_labels) -> float:
    t = best_threshold(train_scores, train_labels)
    return float(np.mean((dev_scores > t) == dev_labels))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="minilm-l6",
                        help="model whose tokenizer counts the word pieces")
    args = parser.parse_args(argv)
    split = wiki_pairs.build()
    train, dev = split["train"], split["dev"]
    y_tr = np.array([p.label for p in train])
    y_dev = np.array([p.label for p in dev])

    print("split  pairs  articles  next  not_next  anchors/article (median)")
    for name, pairs in split.items():
        per = collections.Counter(p.article for p in pairs)
        n_next = sum(p.label for p in pairs)
        print(f"{name:5}  {len(pairs):5}  {len(per):8}  {n_next:4}  {len(pairs) - n_next:8}  "
              f"{np.median([v // 2 for v in per.values()]):.0f}")
    assert not {p.article for p in train} & {p.article for p in dev}

    tok = load_tokenizer(args.teacher, wiki_pairs.MAX_SEQ_LEN)
    lengths = []
    for pairs in (train, dev):
        ids_a = tok.tokenize([p.text_a for p in pairs]).row_lengths().numpy()
        ids_b = tok.tokenize([p.text_b for p in pairs]).row_lengths().numpy()
        lengths.append(ids_a + ids_b + 3)  # [CLS] A [SEP] B [SEP]
    lengths = np.concatenate(lengths)
    pct = np.percentile(lengths, [50, 90, 95, 99])
    print(f"\npair length in word pieces (+3 specials): median {pct[0]:.0f}, 90% {pct[1]:.0f}, "
          f"95% {pct[2]:.0f}, 99% {pct[3]:.0f}, max {lengths.max()}")
    for cut in (64, 96, 128):
        print(f"  pairs that fit in {cut}: {np.mean(lengths <= cut):.1%}")

    def feats(pairs):
        jac, shared, la, lb, first = [], [], [], [], []
        for p in pairs:
            a, b = words(p.text_a), words(p.text_b)
            jac.append(len(a & b) / max(1, len(a | b)))
            shared.append(len((a & b) - STOPWORDS))
            la.append(len(WORD.findall(p.text_a)))
            lb.append(len(WORD.findall(p.text_b)))
            first.append((WORD.findall(p.text_b.lower()) or [""])[0])
        return np.array(jac), np.array(shared), np.array(la), np.array(lb), np.array(first)

    jac_tr, sh_tr, la_tr, lb_tr, f_tr = feats(train)
    jac_dev, sh_dev, la_dev, lb_dev, f_dev = feats(dev)
    tfidf = TfidfVectorizer().fit([p.text_a for p in train] + [p.text_b for p in train])

    def cosine(pairs):
        a = tfidf.transform([p.text_a for p in pairs])
        b = tfidf.transform([p.text_b for p in pairs])
        return np.asarray(a.multiply(b).sum(axis=1)).ravel()

    results = {
        "majority": float(np.mean(y_dev == np.bincount(y_tr).argmax())),
        "word overlap (Jaccard)": threshold_baseline(jac_tr, y_tr, jac_dev, y_dev),
        "content-word overlap": threshold_baseline(sh_tr, y_tr, sh_dev, y_dev),
        "TF-IDF cosine": threshold_baseline(cosine(train), y_tr, cosine(dev), y_dev),
    }
    vec = CountVectorizer(min_df=2).fit([p.text_b for p in train])
    b_only = LogisticRegression(C=1.0, max_iter=2000).fit(
        vec.transform([p.text_b for p in train]), y_tr)
    results["B only (bag of words)"] = float(np.mean(
        b_only.predict(vec.transform([p.text_b for p in dev])) == y_dev))
    onehot = OneHotEncoder(handle_unknown="ignore", min_frequency=10).fit(f_tr[:, None])
    scaler = StandardScaler().fit(np.stack([jac_tr, sh_tr, la_tr, lb_tr], 1))

    def cue_matrix(jac, sh, la, lb, first):
        dense = scaler.transform(np.stack([jac, sh, la, lb], 1))
        return np.hstack([dense, onehot.transform(first[:, None]).toarray()])

    cues = LogisticRegression(max_iter=2000).fit(
        cue_matrix(jac_tr, sh_tr, la_tr, lb_tr, f_tr), y_tr)
    results["cue features (logistic regression)"] = float(np.mean(
        cues.predict(cue_matrix(jac_dev, sh_dev, la_dev, lb_dev, f_dev)) == y_dev))

    se = np.sqrt(0.25 / len(dev))
    print(f"\ndev accuracy of trivial baselines (dev = {len(dev)} pairs; binomial standard "
          f"error at 50%: {se:.1%}):")
    for name, acc in results.items():
        print(f"  {name:36} {acc:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
