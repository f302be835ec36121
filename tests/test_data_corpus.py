"""General corpora: sources, sentence splitting, packing and masking statistics,
worker sharding, determinism, TFRecord shards, TFDS wikipedia via mock_data."""
import bz2
import gzip
import itertools
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.data import corpus, pretokenize, pretrain
from tinybert_tf.data.glue import DataError
from tinybert_tf.tokenizer import Tokenizer

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "movie", "film", "good", "bad", "great",
         "plot", "actor", "story", "fun", "boring", "run", "ran", "play", "hello", "world"]


@pytest.fixture(scope="module")
def tok(tiny_vocab):
    return Tokenizer(tiny_vocab, max_seq_len=32)


def make_docs(n_docs=12, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        sents = []
        for _ in range(int(rng.integers(1, 7))):
            words = rng.choice(WORDS, size=int(rng.integers(1, 12)))
            sents.append(" ".join(words) + " .")
        docs.append(sents)
    return docs


def write_text(path, docs, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    docs = make_docs(12)
    write_text(d / "part-0.txt", docs[:4])
    write_text(d / "part-1.txt.gz", docs[4:8], gzip.open)
    write_text(d / "part-2.txt.bz2", docs[8:], bz2.open)
    return str(d / "part-*"), docs


def test_sentence_splitter():
    text = ('Dr. Smith met J. R. Tolkien in the U.S. in 1950. He said "Hello!" Then they left? '
            'Yes. The value is 3.5 today, e.g. here. 2010 was a year.')
    assert corpus.split_sentences(text) == [
        "Dr. Smith met J. R. Tolkien in the U.S. in 1950.", 'He said "Hello!"',
        "Then they left?", "Yes.", "The value is 3.5 today, e.g. here.", "2010 was a year."]


def test_text_sources_globs_compression_and_errors(text_corpus, tmp_path):
    pattern, docs = text_corpus
    assert list(corpus.iter_documents(pattern)) == docs
    shards = [list(corpus.iter_documents(pattern, num_shards=2, index=i)) for i in range(2)]
    assert sorted(map(tuple, shards[0] + shards[1])) == sorted(map(tuple, docs))
    assert not set(map(tuple, shards[0])) & set(map(tuple, shards[1]))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\n\ncaf\xe9 line\n")
    with pytest.raises(DataError, match=r"bad\.txt:3: invalid UTF-8"):
        list(corpus.iter_documents(str(bad)))
    with pytest.raises(DataError, match=r"nothing-\*\.txt: no corpus file matches"):
        list(corpus.iter_documents(str(tmp_path / "nothing-*.txt")))
    with pytest.raises(DataError, match="not documents"):
        list(corpus.iter_documents("x.tfrecord"))


WIKI_XML = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">
  <page><title>Cat</title><ns>0</ns><id>1</id><revision><id>11</id><text xml:space="preserve">
'''Cats''' are small [[mammal|mammals]] kept as pets. Dr. Jones wrote about them in 1990.
{{Infobox animal|name=Cat}}
== History ==
The cat was domesticated long ago in the Near East.
* They like to sleep in the sun for many hours.
thumb
== References ==
Some reference text that must not appear here.
</text></revision></page>
  <page><title>Kitty</title><ns>0</ns><id>2</id><revision><id>12</id><text xml:space="preserve">#REDIRECT [[Cat]]</text></revision></page>
  <page><title>Talk:Cat</title><ns>1</ns><id>3</id><revision><id>13</id><text xml:space="preserve">This talk page is not an article at all.</text></revision></page>
  <page><title>Dog</title><ns>0</ns><id>4</id><revision><id>14</id><text xml:space="preserve">Dogs are loyal animals that bark at strangers. They were bred from wolves.</text></revision></page>
</mediawiki>
"""  # noqa: E501


def test_wiki_dump_markup_stripped_and_streamed(tmp_path):
    path = tmp_path / "tiny-pages-articles.xml.bz2"
    path.write_bytes(bz2.compress(WIKI_XML.encode()))
    docs = list(corpus.iter_documents(str(path)))
    assert docs == [["Cats are small mammals kept as pets.", "Dr. Jones wrote about them in 1990.",
                     "The cat was domesticated long ago in the Near East.",
                     "They like to sleep in the sun for many hours."],
                    ["Dogs are loyal animals that bark at strangers.", "They were bred from wolves."]]  # noqa: E501
    assert [list(corpus.iter_documents(str(path), num_shards=2, index=i)) for i in range(2)] == \
        [docs[:1], docs[1:]]
    broken = tmp_path / "broken.xml.bz2"
    broken.write_bytes(bz2.compress(WIKI_XML.encode())[:60])
    with pytest.raises(DataError, match="cannot read the Wikipedia dump"):
        list(corpus.iter_documents(str(broken)))
    # The embedded sample: streamed lazily (first two articles only), clean sentences.
    first = list(itertools.islice(corpus.iter_documents(None), 2))
    assert os.path.isfile(corpus.default_corpus_path())
    assert first[1][0].startswith("Autism is a neurodevelopmental disorder")
    assert not any("'''" in s or "[[" in s or "{{" in s for d in first for s in d)


def tokens_of(tok, docs):
    return [tok.tokenize(d).numpy().tolist() for d in docs]


def check_packing(out, doc_ids, L, pair, cls_id, sep_id):
    """Independent reconstruction: sequences hold every document token once, in order."""
    ids, mask, typ = (out[k].numpy() for k in ("input_word_ids", "input_mask", "input_type_ids"))
    budget = L - 3 if pair else L - 2
    flat, groups = [], []
    for row, m, t in zip(ids, mask, typ):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any() and not row[n:].any() and not t[n:].any()
        assert row[0] == cls_id and row[n - 1] == sep_id
        seps = np.flatnonzero(row[:n] == sep_id)
        assert len(seps) in (1, 2)
        if not pair:
            assert len(seps) == 1 and not t.any()
        if len(seps) == 2:  # [CLS] A [SEP] B [SEP]: type 0 up to the first [SEP], 1 after
            assert (t[:seps[0] + 1] == 0).all() and (t[seps[0] + 1:n] == 1).all()
            assert seps[0] > 1 and seps[1] > seps[0] + 1
        body = [x for x in row[1:n] if x != sep_id]
        assert len(body) <= budget
        flat.extend(body)
        groups.append(len(body))
    want = [x for s in doc_ids for x in s]
    assert flat == want
    return groups


@pytest.mark.parametrize("pair", [True, False])
def test_pack_document_keeps_every_token_in_order(tok, pair):
    rng = np.random.default_rng(1)
    L = 16
    budget = L - 3 if pair else L - 2
    for trial in range(4):
        lens = rng.integers(0, 25, size=int(rng.integers(1, 9)))  # incl. empty and over-long
        doc = [[int(x) for x in rng.integers(40, 60, size=n)] for n in lens]
        ragged = tf.ragged.constant(doc, dtype=tf.int32, ragged_rank=1) if any(lens) else \
            tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), lens)
        out = pretrain.pack_document(ragged, L, tok.cls_id, tok.sep_id, tok.pad_id, pair,
                                     tf.constant([trial, 0], tf.int64))
        groups = check_packing(out, doc, L, pair, tok.cls_id, tok.sep_id)
        # Greedy: pieces of <= budget; a group closes only when the next piece would overflow.
        pieces = [len(s[i:i + budget]) for s in doc for i in range(0, len(s), budget)]
        expect, used = [], None
        for p in pieces:
            if used is None or used + p > budget:
                expect.append(p)
                used = p
            else:
                expect[-1] += p
                used += p
        assert groups == expect


def test_mask_batch_statistics_and_rules(tok):
    rng = np.random.default_rng(0)
    B, L = 1024, 32
    lens = rng.integers(5, L + 1, size=B)
    ids = np.zeros((B, L), np.int32)
    for i, n in enumerate(lens):
        ids[i, 0], ids[i, n - 1] = tok.cls_id, tok.sep_id
        ids[i, 1:n - 1] = rng.integers(40, 60, size=n - 2)
    mask = (np.arange(L)[None] < lens[:, None]).astype(np.int32)
    inputs = {"input_word_ids": tf.constant(ids), "input_mask": tf.constant(mask),
              "input_type_ids": tf.zeros_like(ids)}
    random_ids = pretrain.random_token_ids(tok.vocab)
    special = [tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id]
    out = pretrain.mask_batch(inputs, tf.constant([5, 6], tf.int64), tok.mask_id, special,
                              random_ids, mask_prob=0.15, max_predictions=5)
    pos, lm_ids, w = (out[k].numpy() for k in
                      ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"))
    new = out["input_word_ids"].numpy()
    assert pos.shape == lm_ids.shape == w.shape == (B, 5)
    n_expected = np.minimum(np.maximum(np.round(lens * 0.15), 1), 5)  # BERT's rule
    np.testing.assert_array_equal(w.sum(1), n_expected)
    sel = w > 0
    rows = np.repeat(np.arange(B)[:, None], 5, 1)
    assert (pos[sel] > 0).all() and (pos[sel] < lens[rows[sel]] - 1).all()  # never CLS/SEP/pad
    assert np.where(sel[:, 1:], np.diff(pos, axis=1) > 0, True).all()  # distinct, ascending
    assert (sel[:, :-1] >= sel[:, 1:]).all()  # chosen first, then padding
    assert not pos[~sel].any() and not lm_ids[~sel].any()
    np.testing.assert_array_equal(lm_ids[sel], ids[rows[sel], pos[sel]])
    changed = np.zeros_like(ids, bool)
    changed[rows[sel], pos[sel]] = True
    np.testing.assert_array_equal(new[~changed], ids[~changed])  # only chosen positions change
    after = new[rows[sel], pos[sel]]
    frac_mask = np.mean(after == tok.mask_id)
    same = after == ids[rows[sel], pos[sel]]
    frac_rand = np.mean(~same & (after != tok.mask_id))
    n = sel.sum()
    assert n == n_expected.sum() > 2500
    assert abs(frac_mask - 0.8) < 0.04 and abs(frac_rand + np.mean(same) - 0.2) < 0.04
    # Random replacements are ordinary tokens (never [CLS]/[PAD]/[unusedN]); "same" includes
    # random draws that hit the original, so kept is >= 10% minus noise.
    assert np.isin(after[~same & (after != tok.mask_id)], random_ids).all()
    assert np.mean(same) > 0.08 and frac_rand > 0.07
    again = pretrain.mask_batch(inputs, tf.constant([5, 6], tf.int64), tok.mask_id, special,
                                random_ids, 0.15, 5)
    np.testing.assert_array_equal(again["input_word_ids"].numpy(), new)
    other = pretrain.mask_batch(inputs, tf.constant([5, 7], tf.int64), tok.mask_id, special,
                                random_ids, 0.15, 5)
    assert not np.array_equal(other["masked_lm_positions"].numpy(), pos)


def seqs(ds):
    return [tuple(r) for b in ds for r in b["input_word_ids"].numpy().tolist()]


def test_general_dataset_sharding_determinism_masking(tok, text_corpus):
    pattern, docs = text_corpus
    L = 24
    base = corpus.general_dataset(pattern, tok, L, batch_size=4, seed=1, shuffle_buffer=0)
    b0 = next(iter(base))
    assert set(b0) == {"input_word_ids", "input_mask", "input_type_ids"}
    assert all(v.dtype == tf.int32 and v.shape[1] == L for v in b0.values())
    all_seqs = seqs(base)
    flat = [x for s in all_seqs for x in s if x not in (tok.cls_id, tok.sep_id, tok.pad_id)]
    assert flat == [x for d in tokens_of(tok, docs) for s in d for x in s]
    a = seqs(corpus.general_dataset(pattern, tok, L, 4, seed=1, shuffle_buffer=100))
    b = seqs(corpus.general_dataset(pattern, tok, L, 4, seed=1, shuffle_buffer=100))
    c = seqs(corpus.general_dataset(pattern, tok, L, 4, seed=2, shuffle_buffer=100))
    assert a == b and a != c and sorted(a) == sorted(all_seqs)
    parts = []
    for i in range(2):  # three files, two workers: whole files per worker
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
        ds = corpus.general_dataset(pattern, tok, L, 8, seed=1, shuffle_buffer=0,
                                    input_context=ctx,
                                    masking=True, max_predictions=4)
        first = next(iter(ds))
        assert first["input_word_ids"].shape[0] <= 4  # per-replica batch
        assert first["masked_lm_positions"].shape[1] == 4
        assert first["masked_lm_weights"].dtype == tf.float32
        parts.append([tuple(r) for b in ds for r in b["input_type_ids"].numpy().tolist()])
    unmasked = [list(corpus.packed_dataset(pattern, tok, L, seed=1, num_shards=2, index=i)
                     .map(lambda x: x["input_word_ids"]).as_numpy_iterator()) for i in range(2)]
    s0, s1 = ({tuple(x) for x in u} for u in unmasked)
    # Split points are keyed by the document, so sharding does not change any sequence.
    assert not s0 & s1 and sorted(map(tuple, unmasked[0] + unmasked[1])) == sorted(all_seqs)
    assert len(parts[0]) == len(unmasked[0]) and len(parts[1]) == len(unmasked[1])
    assert corpus.count_sequences(pattern, tok, L) == len(all_seqs)  # split points vary, count not


def test_tfrecord_shards_round_trip(tok, text_corpus, tmp_path):
    pattern, _ = text_corpus
    L = 24
    prefix = str(tmp_path / "shards" / "c")
    meta = pretokenize.pretokenize(pattern, tok.vocab, prefix, num_shards=3, max_seq_len=L,
                                 num_workers=1, progress=False)
    files = sorted(os.listdir(tmp_path / "shards"))
    assert files == ["c-00000-of-00003.tfrecord", "c-00001-of-00003.tfrecord",
                     "c-00002-of-00003.tfrecord", "c.json"]
    assert json.load(open(prefix + ".json"))["num_sequences"] == meta["num_sequences"]
    direct = sorted(seqs(corpus.general_dataset(pattern, tok, L, 4, shuffle_buffer=0)))
    src = prefix + "-*.tfrecord"
    from_records = corpus.general_dataset(src, tok, L, 4, shuffle_buffer=0)
    assert sorted(seqs(from_records)) == direct and meta["num_sequences"] == len(direct)
    b = next(iter(corpus.general_dataset(src, tok, 32, 4, shuffle_buffer=0, masking=True)))
    assert b["input_word_ids"].shape[1] == 32 and "masked_lm_ids" in b  # padded further
    assert corpus.count_sequences(src, tok, L) == len(direct)
    workers = [seqs(corpus.general_dataset(src, tok, L, 4, shuffle_buffer=0,
                                           input_context=tf.distribute.InputContext(2, i, 2)))
               for i in range(2)]
    assert sorted(workers[0] + workers[1]) == direct and not set(workers[0]) & set(workers[1])
    with pytest.raises(DataError, match="max_seq_len=24 > the requested 16"):
        corpus.general_dataset(src, tok, 16, 4)
    other = Tokenizer(list(dict.fromkeys(tok.vocab)) + ["zebra"], max_seq_len=L)
    with pytest.raises(DataError, match="different vocab"):
        corpus.general_dataset(src, other, L, 4)
    with pytest.raises(DataError, match="no TFRecord shards found"):
        corpus.general_dataset(str(tmp_path / "none-*.tfrecord"), tok, L, 4)


def test_tfds_wikipedia_mock_and_offline_error(tok, tmp_path):
    import tensorflow_datasets as tfds
    with tfds.testing.mock_data(num_examples=5):
        docs = list(corpus.iter_documents("tfds:wikipedia/20230601.en",
                                          tfds_data_dir=str(tmp_path)))
        assert 0 < len(docs) <= 5 and all(isinstance(s, str) for d in docs for s in d)
        ds = corpus.general_dataset("tfds:wikipedia/20230601.en", tok, 16, 2, shuffle_buffer=0)
        assert next(iter(ds))["input_word_ids"].shape[1] == 16
    with pytest.raises(DataError, match=r"tfds:wikipedia/20230601.en split train is not "
                                         r"prepared.*tfds build"):
        corpus.general_dataset("tfds:wikipedia/20230601.en", tok, 16, 2,
                               tfds_data_dir=str(tmp_path))
