"""wiki_pairs: coherence pairs from Wikipedia articles, split by article, held out of GD.

A tiny dump whose sentences name their own position ("Topic3 paragraph 1
sentence 2 ...") lets every label be checked against the article's order.
"""
from __future__ import annotations

import bz2
import os
import re

import numpy as np
import pytest

from tinybert_tf.data import corpus, glue, holdout, wiki_pairs
from tinybert_tf.data.examples import DataError
from tinybert_tf.data.wiki_pairs import SplitSpec, WikiPairsSource

from pipeline_helpers import run, tiny_flags

SIZES = [[3, 4, 2], [5, 1, 3], [2, 2, 2, 2], [4, 4], [3, 3, 3], [6], [2, 5], [1, 1, 1],
         [4, 2, 3], [3, 5], [2, 3, 4], [5, 5]]
POSITION = re.compile(r"^Topic(\d+) paragraph (\d+) sentence (\d+) ")
HEAD = '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">\n'


def _page(k: int, sizes: list[int]) -> str:
    lines = []
    for p, n in enumerate(sizes):
        if p == 1:
            lines += ["== History ==", "Short caption"]  # a heading and a dropped short line
        lines.append(" ".join(f"Topic{k} paragraph {p} sentence {s} tells a story."
                              for s in range(n)))
    lines += ["== References ==", "Topic99 paragraph 0 sentence 0 must not appear here."]
    text = "\n".join(lines)
    return (f"  <page><title>Article {k}</title><ns>0</ns><id>{k + 1}</id><revision>"
            f"<id>{k + 100}</id><text xml:space=\"preserve\">{text}</text></revision></page>\n")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("wiki") / "tiny-pages-articles.xml.bz2"
    xml = HEAD + "".join(_page(k, s) for k, s in enumerate(SIZES)) + "</mediawiki>\n"
    path.write_bytes(bz2.compress(xml.encode()))
    return str(path)


SPEC = SplitSpec(seed=0, per_article=4, dev_anchors=10)


def position(text: str) -> tuple[int, int, int]:
    return tuple(int(g) for g in POSITION.match(text).groups())


def flat_index(k: int, p: int, s: int) -> int:
    return sum(SIZES[k][:p]) + s


def test_labels_follow_the_articles_own_order(dump):
    split = wiki_pairs.split_pairs(corpus.iter_wiki_articles(dump), SPEC)
    for name, pairs in split.items():
        assert sum(p.label for p in pairs) * 2 == len(pairs)  # exactly balanced
        for pos, neg in zip(pairs[::2], pairs[1::2]):  # each anchor: positive, then negative
            assert (pos.label, neg.label) == (1, 0) and pos.text_a == neg.text_a
            (ka, pa, sa), (kb, pb, sb) = position(pos.text_a), position(pos.text_b)
            assert (kb, pb, sb) == (ka, pa, sa + 1)  # B is A's next sentence, same paragraph
            assert pos.article == f"Article {ka}" and (pos.a, pos.b) == (
                flat_index(ka, pa, sa), flat_index(kb, pb, sb))
            kn, pn, sn = position(neg.text_b)
            assert kn == ka and sn > 0  # same article; never a paragraph's first sentence
            assert abs(flat_index(kn, pn, sn) - flat_index(ka, pa, sa)) > 1
            assert neg.b == flat_index(kn, pn, sn)
        assert not any(p.text_b.startswith("Topic99") for p in pairs)  # end matter cut


def test_split_is_by_article_capped_and_deterministic_from_the_seed(dump):
    articles = list(corpus.iter_wiki_articles(dump))
    split = wiki_pairs.split_pairs(articles, SPEC)
    train = {p.article for p in split["train"]}
    dev = {p.article for p in split["dev"]}
    assert train and dev and not train & dev
    # Every article with an anchor is used; one-sentence paragraphs give none.
    assert train | dev == {f"Article {k}" for k, s in enumerate(SIZES) if max(s) > 1}
    anchors = {a: sum(1 for p in split["dev"] if p.article == a) // 2 for a in dev}
    assert sum(anchors.values()) >= SPEC.dev_anchors
    assert all(sum(1 for p in pairs if p.article == a) <= 2 * SPEC.per_article
               for pairs in split.values() for a in train | dev)
    assert wiki_pairs.split_pairs(articles, SPEC) == split  # same seed: same pairs
    dev_sets = {frozenset(p.article for p in wiki_pairs.split_pairs(
        articles, SplitSpec(seed, 4, 10))["dev"]) for seed in range(4)}
    assert len(dev_sets) > 1  # the seed moves articles between the splits
    # An article's pairs depend on the seed and its title only, not on the others.
    alone = wiki_pairs.article_pairs(*articles[0], seed=0, per_article=4)
    assert alone == [p for pairs in split.values() for p in pairs if p.article == "Article 0"]
    with pytest.raises(DataError, match="cannot give both a train and a dev split"):
        wiki_pairs.split_pairs(articles, SplitSpec(dev_anchors=10_000))


def _vectors():
    from gensim.models import KeyedVectors
    kv = KeyedVectors(vector_size=3)
    groups = [["story", "tale", "yarn"], ["tells", "says", "gives"],
              ["paragraph", "section", "passage"]]
    for i, group in enumerate(groups):
        for j, word in enumerate(group):
            kv.add_vector(word, np.eye(3, dtype=np.float32)[i] * (1 + 0.01 * j))
    return kv


def test_source_reads_both_splits_and_augments_both_sentences(dump, tmp_path):
    from tinybert_tf.augment.augmenter import augment_source
    source = WikiPairsSource(dump, SPEC)
    train, dev = source.load("train"), source.load("dev")
    built = wiki_pairs.build(dump, SPEC)
    assert [(e.text_a, e.text_b, e.label) for e in dev] == [
        (p.text_a, p.text_b, p.label) for p in built["dev"]]
    assert source.describe()["split"] == {"seed": 0, "per_article": 4, "dev_anchors": 10}
    out = str(tmp_path / "augment" / source.augmented_name)
    stats = augment_source(source, out, word_vectors=_vectors(), num_aug=3, replace_prob=0.5,
                           num_candidates=2, seed=0, progress=False)
    assert len(source.augmented(out).load("train_aug")) == stats["written"] > len(train)
    header, rows = glue.read_rows(wiki_pairs.SPEC, os.path.dirname(out), "train_aug")
    assert header == wiki_pairs.HEADER
    original = {r[0]: r for r in wiki_pairs.rows(built["train"], "train")}
    varied = {2: 0, 3: 0}
    for _, row in rows:
        src = original[row[0]]
        assert [row[c] for c in (0, 1, 4)] == [src[c] for c in (0, 1, 4)]  # label copied
        diff = [c for c in (2, 3) if row[c] != src[c]]
        assert len(diff) <= 1  # one sentence varies at a time
        for c in diff:
            varied[c] += 1
    assert varied[2] > 0 and varied[3] > 0  # both sentences get variants
    with pytest.raises(DataError, match="splits"):
        source.load("test")


def test_dev_articles_are_held_out_of_the_general_corpus(dump, tmp_path, tiny_vocab):
    from tinybert_tf.pipeline import preflight
    from tinybert_tf.pipeline.settings.configs import PipelineConfig
    from tinybert_tf.tokenizer import Tokenizer
    dev = frozenset(p.article for p in wiki_pairs.build(dump, SPEC)["dev"])
    everything = list(corpus.iter_documents(dump))
    kept = list(corpus.iter_documents(dump, exclude_titles=dev))
    assert len(kept) == len(everything) - len(dev) > 0
    dev_sentences = {p.text_a for p in wiki_pairs.build(dump, SPEC)["dev"]}
    assert not dev_sentences & {s for doc in kept for s in doc}
    tok = Tokenizer(tiny_vocab, max_seq_len=32)
    sequences = corpus.count_sequences(dump, tok, 32, exclude_titles=dev)
    assert 0 < sequences < corpus.count_sequences(dump, tok, 32)

    # The general stage of a run whose --general_holdout names these articles.
    holdout.register_holdout("tiny_wiki_dev", lambda: dev)
    try:
        def plan(**kw):
            ns = tiny_flags(tmp_path, tiny_vocab, **{"corpus": dump, "dry_run": True,
                                                     "stages": ["general"], **kw})
            return ns, run(ns)["phases"][0]

        ns, phase = plan(general_holdout="tiny_wiki_dev")
        assert PipelineConfig.from_flags(ns).stage_settings("general")["general_holdout"] == \
            "tiny_wiki_dev"  # a general model made without the hold-out is not reused
        assert phase["examples"] == sequences
        assert f"without the {len(dev)} articles held out for tiny_wiki_dev" in phase["data"]
        with pytest.raises(preflight.PreflightError, match="has no article titles"):
            plan(general_holdout="tiny_wiki_dev", corpus=str(tmp_path / "corpus.txt"),
                 output_dir=str(tmp_path / "text"))
    finally:
        holdout.HOLDOUTS.pop("tiny_wiki_dev")
    with pytest.raises(DataError, match="no article titles"):
        corpus.general_dataset(str(tmp_path / "corpus.txt"), tok, 32, exclude_titles=dev)


def test_holdout_flag_resolves_per_task():
    assert holdout.resolve("auto", "wiki_pairs") == "wiki_pairs"
    assert holdout.resolve("auto", "WIKI_PAIRS") == "wiki_pairs"
    assert holdout.resolve("auto", "sst-2") == "none"
    assert holdout.resolve("none", "wiki_pairs") == "none"
    with pytest.raises(ValueError, match="--general_holdout=nope: unknown hold-out"):
        holdout.resolve("nope", "sst-2")


def test_task_flag_builds_the_pair_task_and_refuses_data_flags():
    from tinybert_tf.tasks import TaskConfig, resolve_task
    task = resolve_task(TaskConfig(task="wiki_pairs"))
    assert task.is_pair and list(task.type.label_names) == ["not_next", "next"]
    assert task.max_seq_len() == 128 and task.source.kind == "wiki_pairs"
    with pytest.raises(DataError, match="--data_dir: --task=wiki_pairs builds its data"):
        resolve_task(TaskConfig(task="wiki_pairs", data_dir="glue/RTE"))
    # Flags that describe your own files were ignored without a word.
    with pytest.raises(DataError, match=r"--labels=a,b: describes your own files .*"
                                        r"--task=wiki_pairs builds its own pairs and labels"):
        resolve_task(TaskConfig(task="wiki_pairs", labels=("a", "b")))


def test_the_embedded_split_has_the_documented_sizes():
    """The shipped task has the sizes docs/data.md gives."""
    split = wiki_pairs.build()
    assert {k: len(v) for k, v in split.items()} == {"train": 2786, "dev": 2400}
    assert {k: len({p.article for p in v}) for k, v in split.items()} == \
        {"train": 53, "dev": 45}
    assert wiki_pairs.dev_titles() == holdout.titles("wiki_pairs")
    assert not wiki_pairs.dev_titles() & {p.article for p in split["train"]}
