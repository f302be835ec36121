"""`wiki_pairs`: sentence-pair coherence built from the embedded Wikipedia sample.

A proxy pair task for ranking distillation ablations on a machine with no GLUE
data: "does sentence B come right after sentence A in the article?". It is
not a GLUE task and its scores do not compare with GLUE's.

Built from gensim's 206-page sample (106 articles keep text after markup
stripping; `corpus.iter_wiki_articles`), deterministically:

* An *anchor* is a sentence followed by another sentence of the same
  paragraph (a line of the article). Each anchor i gives two pairs sharing A:
  a positive (s_i, s_{i+1}), label "next", and a negative (s_i, s_j), label
  "not_next", with j drawn uniformly from the same article among sentences
  that are not first in their paragraph, j not in {i-1, i, i+1}, and s_j's text
  neither s_i's nor s_{i+1}'s. Labels are exactly balanced.
* Same-article negatives keep the topic, so word overlap is a weak cue; B is
  never a paragraph's first sentence in either label (positives' B never is),
  so B alone tells nothing (its distribution is the same in both labels).
* Per article, anchors are taken in a random order (generator seeded with
  (seed, CRC-32 of the title)), at most `per_article` of them, so long
  articles do not dominate and an article's pairs do not depend on the others.
* Split by article: the articles with pairs, sorted by title, are shuffled
  with `seed`; dev takes them in that order until it holds `dev_anchors`
  anchors; train gets the rest. No article is in both.

`SplitSpec()` (seed 0, 30 anchors per article, dev >= 1,200 anchors) gives
train 2,786 pairs from 53 articles and dev 2,400 pairs from 45 articles
(docs/data.md has the figures and the baselines). The dev articles are held
out of the general corpus (`holdout`, registered under "wiki_pairs"); the
split seed is fixed, not `--seed`, so runs with different seeds share a dev set.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import zlib
from typing import Any, Optional, Sequence

import numpy as np

from tinybert_tf import files
from tinybert_tf.data import corpus, glue, holdout
from tinybert_tf.data.examples import DataError, Example, Examples
from tinybert_tf.data.sources import (
    AUGMENTED_SPLIT,
    AugmentedFile,
    DataSource,
    RowTable,
    file_facts,
    register_source,
)

NAME = "wiki_pairs"
LABELS = ("not_next", "next")
SPLITS = ("train", "dev")
HEADER = ["index", "article", "sentence1", "sentence2", "label"]
MAX_SEQ_LEN = 128


def _layout(file: str) -> glue.FileLayout:
    return glue.FileLayout(file, len(HEADER), 2, 3, 4, ("sentence1", "sentence2", "label"))


# The TSV layout of `write_task_dir` and of the augmented file (read with glue's reader).
SPEC = glue.TaskSpec(
    name=NAME, label_names=LABELS, is_pair=True, is_regression=False,
    metric_names=("accuracy",), primary_metric="accuracy", default_max_seq_len=MAX_SEQ_LEN,
    layouts={split: _layout(f"{split}.tsv") for split in (*SPLITS, AUGMENTED_SPLIT)},
    dev_splits=("dev",))


@dataclasses.dataclass(frozen=True)
class SplitSpec:
    """How pairs are drawn and split (module docstring)."""

    seed: int = 0
    per_article: int = 30
    dev_anchors: int = 1200

    def check(self) -> None:
        if self.per_article < 1 or self.dev_anchors < 1:
            raise ValueError(f"{self}: per_article and dev_anchors must be >= 1.")


@dataclasses.dataclass(frozen=True)
class Pair:
    """One example: sentences `a` and `b` (indexes into the article's sentences)."""

    article: str
    a: int
    b: int
    text_a: str
    text_b: str
    label: int  # 1: b == a + 1 in the same paragraph ("next"); 0: "not_next"


def article_pairs(title: str, paragraphs: Sequence[Sequence[str]], seed: int,
                  per_article: int) -> list[Pair]:
    """Up to `per_article` anchors of one article, each as (positive, negative)."""
    sentences = [s for para in paragraphs for s in para]
    followers, anchors = [], []
    k = 0
    for para in paragraphs:
        followers.extend(range(k + 1, k + len(para)))
        anchors.extend(range(k, k + len(para) - 1))
        k += len(para)
    rng = np.random.default_rng([seed, zlib.crc32(title.encode("utf-8"))])
    out: list[Pair] = []
    for idx in rng.permutation(len(anchors)):
        if len(out) >= 2 * per_article:
            break
        i = anchors[idx]
        nxt = sentences[i + 1]
        negatives = [j for j in followers if abs(j - i) > 1
                     and sentences[j] not in (sentences[i], nxt)]
        if not negatives:
            continue
        j = negatives[int(rng.integers(len(negatives)))]
        out.append(Pair(title, i, i + 1, sentences[i], nxt, 1))
        out.append(Pair(title, i, j, sentences[i], sentences[j], 0))
    return out


def split_pairs(articles: Sequence[tuple[str, Sequence[Sequence[str]]]],
                spec: SplitSpec = SplitSpec()) -> dict[str, list[Pair]]:
    """{"train": pairs, "dev": pairs} of (title, paragraphs) articles, split by article;
    pairs in article (input) order, each anchor's positive before its negative."""
    spec.check()
    by_title: dict[str, list[Pair]] = {}
    order: list[str] = []
    for title, paragraphs in articles:
        if title in by_title:
            raise DataError(f"two articles are titled {title!r}; a split by article needs "
                            "unique titles.")
        by_title[title] = article_pairs(title, paragraphs, spec.seed, spec.per_article)
        order.append(title)
    usable = sorted(t for t in order if by_title[t])
    dev: set[str] = set()
    anchors = 0
    for k in np.random.default_rng(spec.seed).permutation(len(usable)):
        if anchors >= spec.dev_anchors:
            break
        dev.add(usable[k])
        anchors += len(by_title[usable[k]]) // 2
    if not dev or len(dev) == len(usable):
        raise DataError(f"{len(usable)} article(s) with sentence pairs cannot give both a "
                        f"train and a dev split of >= {spec.dev_anchors} anchors.")
    return {"train": [p for t in order if t not in dev for p in by_title[t]],
            "dev": [p for t in order if t in dev for p in by_title[t]]}


@functools.lru_cache(maxsize=4)
def _cached_split(path: str, size: int, mtime_ns: int, spec: SplitSpec
                  ) -> dict[str, tuple[Pair, ...]]:
    split = split_pairs(corpus.iter_wiki_articles(path), spec)
    return {k: tuple(v) for k, v in split.items()}


def build(path: Optional[str] = None, spec: SplitSpec = SplitSpec()
          ) -> dict[str, tuple[Pair, ...]]:
    """The split of a Wikipedia dump (default: the sample in gensim), built once per
    process per file version and spec (reading the sample takes about 10 s)."""
    path = files.absolute(path or corpus.default_corpus_path())
    if not files.isfile(path):
        raise DataError(f"{path}: the Wikipedia sample is missing; it ships with gensim's "
                        "test data (pip install --force-reinstall gensim).")
    st = files.stat(path)
    return _cached_split(path, st.size, st.mtime_ns, spec)


def dev_titles(path: Optional[str] = None, spec: SplitSpec = SplitSpec()) -> frozenset[str]:
    """Titles of the dev articles: what general distillation must not see."""
    return frozenset(p.article for p in build(path, spec)["dev"])


def examples(pairs: Sequence[Pair], split: str, source: str = "") -> Examples:
    return Examples([Example(f"{split}-{k}", p.text_a, p.text_b, p.label)
                     for k, p in enumerate(pairs)], source=source)


def rows(pairs: Sequence[Pair], split: str) -> list[list[str]]:
    """TSV fields (HEADER) of `pairs`."""
    return [[f"{split}-{k}", p.article, p.text_a, p.text_b, LABELS[p.label]]
            for k, p in enumerate(pairs)]


def write_task_dir(out_dir: str, path: Optional[str] = None,
                   spec: SplitSpec = SplitSpec()) -> str:
    """Write train.tsv / dev.tsv (HEADER columns, label names) into `out_dir`: the
    task as files, to read or to feed tools that take files. Returns out_dir."""
    files.makedirs(out_dir)
    for split, pairs in build(path, spec).items():
        glue.write_rows(os.path.join(out_dir, f"{split}.tsv"), HEADER, rows(pairs, split))
    return out_dir


@register_source
class WikiPairsSource(DataSource):
    """The wiki_pairs task read straight from the Wikipedia dump (module docstring)."""

    kind = NAME

    def __init__(self, path: Optional[str] = None, spec: SplitSpec = SplitSpec()):
        self.path = path or corpus.default_corpus_path()
        self.spec = spec

    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def load(self, split: str) -> Examples:
        if split not in SPLITS:
            raise DataError(f"the wiki_pairs task has splits {SPLITS}, not '{split}'.")
        return examples(build(self.path, self.spec)[split], split, self.path)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": file_facts(self.path),
                "split": dataclasses.asdict(self.spec)}

    def augment_table(self) -> RowTable:
        def table_rows():
            for k, fields in enumerate(rows(build(self.path, self.spec)["train"], "train")):
                yield k + 1, fields

        def encode(out_rows):
            return "".join(glue.tsv_line(r, self.path, f"row {i + 1}")
                           for i, r in enumerate(out_rows)).encode()

        # Both sentences vary (one at a time); index, article and label are copied.
        return RowTable(path=self.path, header=list(HEADER), text_columns=[2, 3],
                        rows=table_rows, encode=encode, output_name="train_aug.tsv",
                        num_columns=len(HEADER))

    def augmented(self, path: str) -> DataSource:
        return AugmentedPairs(path)


class AugmentedPairs(AugmentedFile):
    """The augmented wiki_pairs training file (HEADER columns, TSV)."""

    kind = "wiki_pairs_augmented"

    def read(self) -> Examples:
        return glue.load_examples(SPEC, os.path.dirname(self.path), AUGMENTED_SPLIT)


holdout.register_holdout(NAME, dev_titles)
