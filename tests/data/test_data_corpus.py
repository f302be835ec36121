"""General corpora: sources, sentence splitting, packing and masking statistics,
worker sharding, determinism, TFRecord shards, TFDS wikipedia via mock_data,
ram:// paths, data errors as one line naming the file, and no silent data loss."""
import bz2
import gzip
import itertools
import json
import os
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data import corpus, pretokenize, pretrain, sentence_split, tfrecords
from tinybert_tf.data.examples import DataError
from tinybert_tf.tokenizer import Tokenizer

from pipeline_helpers import run_tool

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
    assert sentence_split.split_sentences(text) == [
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
    with pytest.raises(DataError, match=r"broken\.xml\.bz2: bzip2 data truncated or corrupt"):
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


def test_split_long_cuts_each_sentence_into_budget_pieces_and_drops_empty_ones():
    rng = np.random.default_rng(5)
    for budget in (1, 4, 13):
        for trial in range(6):
            lens = rng.integers(0, 30, size=int(rng.integers(0, 7)))
            doc = [[int(x) for x in rng.integers(1, 99, size=n)] for n in lens]
            ragged = tf.RaggedTensor.from_row_lengths(
                tf.constant([x for s in doc for x in s], tf.int64), tf.constant(lens, tf.int64))
            want = [s[i:i + budget] for s in doc for i in range(0, len(s), budget)]
            assert pretrain.split_long(ragged, budget).to_list() == want, (budget, lens)


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


def test_every_corpus_dataset_calls_one_traced_packer_that_packs_as_pack_document(
        tok, text_corpus):
    """`document_packer`: the packing graph traced once per setting, however many corpus
    datasets map through it, with `pack_document`'s rows."""
    pattern, _ = text_corpus
    L = 19  # a length no other test packs at: this process has not traced it yet
    for pair in (True, False):
        packer = pretrain.document_packer(L, tok.cls_id, tok.sep_id, tok.pad_id, pair)
        assert packer.experimental_get_tracing_count() == 0
        mode = "pair" if pair else "single"
        rows = [list(corpus.packed_dataset(pattern, tok, L, mode, seed=3)) for _ in range(2)]
        assert packer.experimental_get_tracing_count() == 1
        assert pretrain.document_packer(L, tok.cls_id, tok.sep_id, tok.pad_id, pair) is packer
        assert len(rows[0]) == len(rows[1]) > 0
        ids = tf.ragged.constant([[40, 41, 42, 43, 44], [45, 46], [47] * 20, []],
                                 dtype=tf.int64, ragged_rank=1)
        seed = tf.constant([3, 7], tf.int64)
        got, want = packer(ids, seed), pretrain.pack_document(
            ids, L, tok.cls_id, tok.sep_id, tok.pad_id, pair, seed)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)


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
        # Pre-tokenised twice: a TFDS corpus has no files to fingerprint, so it is read
        # again (a set of the same files is kept: the test above).
        metas = [pretokenize.pretokenize("tfds:wikipedia/20230601.en", tok.vocab,
                                         str(tmp_path / "w"), num_shards=1, max_seq_len=16,
                                         num_workers=1, progress=False) for _ in range(2)]
        assert [m["reused"] for m in metas] == [False, False] and metas[1]["num_sequences"]
    with pytest.raises(DataError, match=r"tfds:wikipedia/20230601.en split train is not "
                                         r"prepared.*tfds build"):
        corpus.general_dataset("tfds:wikipedia/20230601.en", tok, 16, 2,
                               tfds_data_dir=str(tmp_path))


# --- remote file systems (tf.io.gfile): TF's in-memory ram:// --------------------------

def test_corpus_pretokenized_and_read_back_on_ram_filesystem(tok):
    root = "ram://corpus-test"
    docs = make_docs(12, seed=3)
    text = ["\n\n".join("\n".join(d) for d in part) + "\n" for part in (docs[:4], docs[4:8],
                                                                          docs[8:])]
    for name, data in (("part-0.txt", text[0].encode()), ("part-1.txt.gz",
                       gzip.compress(text[1].encode())), ("part-2.txt.bz2",
                                                         bz2.compress(text[2].encode()))):
        files.write_bytes_atomic(f"{root}/{name}", data)
    pattern = root + "/part-*"
    assert list(corpus.iter_documents(pattern)) == docs
    L = 24
    meta = pretokenize.pretokenize(pattern, tok.vocab, root + "/shards/c", num_shards=2,
                                   max_seq_len=L, num_workers=2, progress=False)
    assert files.listdir(root + "/shards") == ["c-00000-of-00002.tfrecord",
                                               "c-00001-of-00002.tfrecord", "c.json"]
    src = root + "/shards/c-*.tfrecord"
    from_text = sorted(seqs(corpus.general_dataset(pattern, tok, L, 4, shuffle_buffer=0)))
    from_records = sorted(seqs(corpus.general_dataset(src, tok, L, 4, shuffle_buffer=0)))
    assert from_records == from_text and len(from_text) == meta["num_sequences"] > 0
    assert corpus.count_sequences(src, tok, L) == len(from_text)
    facts = corpus.source_facts(src)
    assert [f[0] for f in facts] == [f"{root}/shards/c-0000{i}-of-00002.tfrecord" for i in (0, 1)]
    assert all(size > 0 for _, size, _ in facts)


# --- data errors: one line naming the file, from inside tf.data ----------------------

def _many_docs_text(n=300):
    return ("\n\n".join("\n".join(d) for d in make_docs(n, seed=7)) + "\n").encode()


def _wiki_pages(n=40):
    page = ("  <page><title>P{i}</title><ns>0</ns><id>{i}</id><revision><id>{i}</id>"
            "<text xml:space=\"preserve\">Page {i} talks about cats and dogs at length. "
            "It has a second sentence with more words in it.</text></revision></page>\n")
    head, tail = WIKI_XML.split("  <page>", 1)[0], "</mediawiki>\n"
    return (head + "".join(page.format(i=i) for i in range(n)) + tail).encode()


BROKEN = {
    "truncated .gz": ("part.txt.gz", lambda: gzip.compress(_many_docs_text())[:-200],
                      r"part\.txt\.gz: gzip data truncated or corrupt after \d+ lines, near "
                      r"byte \d+ of \d+ .*fetch it again"),
    "truncated .bz2": ("part.txt.bz2", lambda: bz2.compress(_many_docs_text())[:-200],
                       r"part\.txt\.bz2: bzip2 data truncated or corrupt after \d+ lines"),
    "non-UTF-8 text": ("latin1.txt", lambda: "fine line .\n\ncaf\xe9 au lait .\n".encode("latin1"),
                       r"latin1\.txt:3: invalid UTF-8 at byte 3 of the line; .*iconv -f "
                       r"LATIN1"),
    "UTF-16 text": ("utf16.txt", lambda: "fine line .\n".encode("utf-16"),
                    r"utf16\.txt:1: invalid UTF-8 at byte 0 of the line; corpus text files "
                    r"must be UTF-8: the file is UTF-16 \(its byte-order mark says so\): "
                    r"re-encode it, e\.g\. iconv -f UTF-16 -t UTF-8"),
    "XML cut mid-page": ("cut-pages-articles.xml", lambda: _wiki_pages()[:3000],
                         r"cut-pages-articles\.xml: the XML is cut or malformed at line \d+, "
                         r"column \d+ \(after \d+ pages: .*download it again"),
    "truncated .xml.bz2": ("cut-pages-articles.xml.bz2",
                           lambda: bz2.compress(_wiki_pages(400))[:-300],
                           r"cut-pages-articles\.xml\.bz2: bzip2 data truncated or corrupt "
                           r"after \d+ pages"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_bad_corpus_file_is_one_data_error_naming_the_file(tok, tmp_path, case):
    name, make, pattern = BROKEN[case]
    path = tmp_path / name
    path.write_bytes(make())
    ds = corpus.general_dataset(str(path), tok, 24, 4, shuffle_buffer=0)
    with pytest.raises(DataError) as info, corpus.translate_data_errors():
        for _ in ds:
            pass
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert re.search(pattern, message), message


def test_errors_inside_a_compiled_step_are_translated_too(tok, tmp_path):
    """Keras's fit pulls batches inside a tf.function: TF's message differs, ours does not."""
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good line .\n\nbad \xff line .\n")
    it = iter(corpus.general_dataset(str(path), tok, 24, 1, shuffle_buffer=0))

    @tf.function
    def step(iterator):
        return tf.reduce_sum(next(iterator)["input_mask"])

    with pytest.raises(DataError, match=r"bad\.txt:3: invalid UTF-8") as info, \
            corpus.translate_data_errors():
        for _ in range(3):
            step(it)
    assert "\n" not in str(info.value)


def test_other_errors_pass_the_boundary_unchanged():
    with pytest.raises(tf.errors.InvalidArgumentError), corpus.translate_data_errors():
        tf.debugging.assert_equal(1, 2, message="not a data error")


@pytest.fixture
def shard_set(tok, text_corpus, tmp_path):
    pattern, _ = text_corpus
    prefix = str(tmp_path / "set" / "c")
    pretokenize.pretokenize(pattern, tok.vocab, prefix, num_shards=4, max_seq_len=24,
                            num_workers=1, progress=False)
    return prefix


def _truncate(path, keep):
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_truncated_shard_named_before_the_first_step_and_mid_stream(tok, shard_set, tmp_path):
    prefix = shard_set
    victim = f"{prefix}-00001-of-00004.tfrecord"
    size = os.path.getsize(victim)
    _truncate(victim, size - 7)
    # With PREFIX.json: its recorded size catches the short shard before any read.
    with pytest.raises(DataError, match=rf"{re.escape(victim)}: {size - 7} bytes, but "
                                        rf"{re.escape(prefix)}\.json records {size}"):
        corpus.general_dataset(prefix + "-*.tfrecord", tok, 24, 4)
    # Without it (a set from elsewhere), TF's DataLossError is traced to the file.
    os.remove(prefix + ".json")
    ds = corpus.general_dataset(prefix + "-*.tfrecord", tok, 24, 4, shuffle_buffer=0)
    with pytest.raises(DataError) as info, corpus.translate_data_errors():
        for _ in ds:
            pass
    assert re.fullmatch(rf"{re.escape(victim)}: truncated TFRecord: the record at byte \d+ "
                        r"ends inside a record; .*re-run bin/pretokenize\.", str(info.value))


def test_missing_or_foreign_shards_are_errors_not_less_data(tok, shard_set):
    prefix = shard_set
    os.remove(f"{prefix}-00002-of-00004.tfrecord")
    for source in (prefix + "-*.tfrecord", prefix):  # a glob, a bare prefix
        with pytest.raises(DataError, match=rf"1 of 4 shards listed in .*c\.json are missing: "
                                            rf"{re.escape(prefix)}-00002-of-00004\.tfrecord"):
            corpus.count_sequences(source, tok, 24, fmt="tfrecord")
    os.remove(prefix + ".json")  # the shard names alone still tell
    with pytest.raises(DataError, match=r"1 of 4 shards missing: .*c-00002-of-00004\.tfrecord"):
        corpus.general_dataset(prefix + "-*.tfrecord", tok, 24, 4)
    # Naming files one by one reads just those (a deliberate subset).
    one = f"{prefix}-00000-of-00004.tfrecord"
    assert len(seqs(corpus.general_dataset(one, tok, 24, 4, shuffle_buffer=0))) > 0


def test_pretokenize_writes_the_metadata_last_and_cleans_up(tok, text_corpus, tmp_path):
    pattern, _ = text_corpus
    out = tmp_path / "out"
    prefix = str(out / "c")
    pretokenize.pretokenize(pattern, tok.vocab, prefix, num_shards=3, max_seq_len=24,
                            num_workers=1, progress=False)
    meta = pretokenize.pretokenize(pattern, tok.vocab, prefix, num_shards=2, max_seq_len=24,
                                   num_workers=1, progress=False)
    assert sorted(os.listdir(out)) == ["c-00000-of-00002.tfrecord", "c-00001-of-00002.tfrecord",
                                       "c.json"]  # the 3-shard set is gone
    assert [s["bytes"] for s in meta["shards"]] == [
        os.path.getsize(f"{prefix}-0000{i}-of-00002.tfrecord") for i in range(2)]
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(gzip.compress(_many_docs_text())[:-200])
    with pytest.raises(DataError, match=r"bad\.txt\.gz: gzip data truncated"):
        pretokenize.pretokenize(str(bad), tok.vocab, prefix, num_shards=2, max_seq_len=24,
                                num_workers=1, progress=False)
    assert os.listdir(out) == []  # the old PREFIX.json first, then this run's shards
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n\n")
    with pytest.raises(DataError, match=r"empty\.txt: no sequences: .*nothing written"):
        pretokenize.pretokenize(str(empty), tok.vocab, prefix, num_shards=2, max_seq_len=24,
                                num_workers=1, progress=False)
    assert os.listdir(out) == []
    with pytest.raises(DataError, match=r"empty\.txt: the corpus holds no text"):
        corpus.count_sequences(str(empty), tok, 24)
    # A folder is not a prefix: its shards went beside it (out-00000-of-00002.tfrecord).
    for folder in (str(out), str(out) + "/"):
        with pytest.raises(DataError, match=rf"^--output={re.escape(folder)}: a folder; "
                           rf"--output is the shards' prefix: e\.g\. --output="
                           rf"{re.escape(str(out / 'wiki'))} writes wiki-00000-of-"):
            pretokenize.pretokenize(pattern, tok.vocab, folder, num_shards=2, max_seq_len=24,
                                    num_workers=1, progress=False)
    assert os.listdir(out) == [] and sorted(os.listdir(tmp_path)) == [
        "bad.txt.gz", "empty.txt", "out"]
    # PREFIX.json is a file of the user's (a JSON dataset named wiki.json): it was
    # replaced by the shards' metadata; it is refused, kept, and nothing is written.
    (out / "c.json").write_text('{"my": "dataset"}')
    with pytest.raises(DataError, match=rf"^--output={re.escape(prefix)}: .*c\.json exists "
                       r"and is not the metadata of pre-tokenised shards.*move the file\.$"):
        pretokenize.pretokenize(pattern, tok.vocab, prefix, num_shards=2, max_seq_len=24,
                                num_workers=1, progress=False)
    assert os.listdir(out) == ["c.json"] and (out / "c.json").read_text() == \
        '{"my": "dataset"}'
    # Shards of the prefix no run of ours wrote (Beam names its TFRecord files so too):
    # they were overwritten and removed; refused, kept. A killed run's (its record beside
    # them) are replaced, and the record goes once PREFIX.json is written.
    (out / "c.json").unlink()
    mine = ["c-00000-of-00002.tfrecord", "c-00001-of-00002.tfrecord"]
    for name in mine:
        (out / name).write_bytes(b"mine")
    with pytest.raises(DataError, match=rf"^--output={re.escape(prefix)}: .*c-00000-of-00002"
                       r"\.tfrecord and 1 more are TFRecord files no bin/pretokenize run wrote "
                       r"\(no c\.json or \.c\.pretokenize beside them\).*move them\.$"):
        pretokenize.pretokenize(pattern, tok.vocab, prefix, num_shards=3, max_seq_len=24,
                                num_workers=1, progress=False)
    assert sorted(os.listdir(out)) == mine
    (out / ".c.pretokenize").write_text("{}")
    pretokenize.pretokenize(pattern, tok.vocab, prefix, num_shards=3, max_seq_len=24,
                            num_workers=1, progress=False)
    assert sorted(os.listdir(out)) == [f"c-0000{i}-of-00003.tfrecord" for i in range(3)] + [
        "c.json"]


def test_pretokenize_keeps_a_finished_set_made_from_the_same_corpus(tok, tmp_path):
    """The same call again keeps the shards (a re-run tokenised all of Wikipedia again);
    another setting, a changed corpus file or a shard cut short writes them again."""
    src = tmp_path / "c.txt"
    write_text(src, make_docs(6))
    prefix = str(tmp_path / "out" / "c")

    def call(**changed):
        kwargs = dict(num_shards=2, max_seq_len=24, num_workers=1, progress=False)
        return pretokenize.pretokenize(str(src), tok.vocab, prefix, **{**kwargs, **changed})

    first = call()
    made = {p: os.stat(p).st_mtime_ns for p in tfrecords.set_files(prefix) + [prefix + ".json"]}
    again = call()
    assert not first["reused"] and again["reused"]
    assert {**again, "reused": False} == first
    assert {p: os.stat(p).st_mtime_ns for p in made} == made
    assert not call(max_seq_len=32)["reused"] and call(max_seq_len=32)["reused"]
    write_text(src, make_docs(7))
    assert not call(max_seq_len=32)["reused"]
    shard = tfrecords.set_files(prefix)[0]
    with open(shard, "r+b") as f:
        f.truncate(10)
    meta = call(max_seq_len=32)
    assert not meta["reused"] and os.path.getsize(shard) == meta["shards"][0]["bytes"] > 10


def test_pretokenize_takes_a_models_short_name_as_vocab(tmp_path):
    """--vocab=minilm-l6, as --teacher takes it: it said "vocab file not found"."""
    from tinybert_tf.models.checkpoint import inspect_model, resolve
    corpus_file = tmp_path / "c.txt"
    corpus_file.write_text("the film was good .\nthe plot was thin .\n\nanother one here .\n")
    meta = pretokenize.pretokenize(str(corpus_file), "minilm-l6", str(tmp_path / "p"),
                                   num_shards=1, max_seq_len=16, num_workers=1,
                                   progress=False)
    assert meta["vocab_size"] == 30522
    assert meta["vocab_sha1"] == tfrecords.vocab_sha1(inspect_model(resolve("minilm-l6")).vocab)


def test_bin_pretokenize_reports_a_bad_corpus_in_one_line(tiny_vocab_file, tmp_path, capfd):
    """bin/pretokenize's main in this process (what `python bin/pretokenize` runs after its
    imports); the error is raised in one of its two spawned workers and crosses back."""
    bad = tmp_path / "wiki.txt.bz2"
    bad.write_bytes(bz2.compress(_many_docs_text())[:-200])
    out = tmp_path / "out"
    capfd.readouterr()
    code = run_tool("pretokenize", f"--corpus={bad}", f"--vocab={tiny_vocab_file}",
                    f"--output={out / 'c'}", "--num_shards=2", "--num_workers=2",
                    "--max_seq_len=24")
    stderr = capfd.readouterr().err
    assert code == 2, stderr
    ours = [line for line in stderr.splitlines() if line.startswith("bin/pretokenize:")]
    assert len(ours) == 1 and "Traceback" not in stderr, stderr
    assert re.match(rf"bin/pretokenize: error: {re.escape(str(bad))}: bzip2 data truncated or "
                    r"corrupt after \d+ lines", ours[0]), ours[0]
    assert not out.exists() or os.listdir(out) == []


def test_in_graph_encoding_writes_the_examples_the_protobuf_library_writes():
    rng = np.random.default_rng(4)
    lens = rng.integers(1, 21, size=40)
    mask = (np.arange(20)[None] < lens[:, None]).astype(np.int32)
    ids = rng.integers(1, 30000, size=(40, 20)) * mask
    typ = (np.arange(20)[None] > 6) * mask
    encoded = tfrecords.encode_batch({"input_word_ids": tf.constant(ids, tf.int32),
                                      "input_type_ids": tf.constant(typ, tf.int32),
                                      "input_mask": tf.constant(mask)}).numpy()
    # Equal messages (protobuf may order the feature map either way when it serialises).
    assert [tf.train.Example.FromString(e) for e in encoded] == [
        tf.train.Example.FromString(tfrecords.serialize(ids[i, :n], typ[i, :n]))
        for i, n in enumerate(lens)]
    parsed = tfrecords.parse_batch(tf.constant(encoded), 24, pad_id=0)
    np.testing.assert_array_equal(parsed["input_word_ids"].numpy()[:, :20], ids)
    np.testing.assert_array_equal(parsed["input_mask"].numpy()[:, :20], mask)
    assert parsed["input_word_ids"].shape == (40, 24)
    assert not parsed["input_mask"].numpy()[:, 20:].any()


def test_bin_pretokenize_warns_of_shards_left_empty(tiny_vocab_file, tmp_path, capfd):
    """Documents are dealt round-robin: two documents into four shards leave two empty,
    and a worker given only those has nothing to train on. The shards are still written."""
    corpus_file = tmp_path / "two_docs.txt"
    corpus_file.write_text("the cat sat on the mat .\nit was good .\n\n"
                           "a dog ran .\nthe end .\n", encoding="utf-8")
    out = tmp_path / "out"
    capfd.readouterr()
    code = run_tool("pretokenize", f"--corpus={corpus_file}", f"--vocab={tiny_vocab_file}",
                    f"--output={out / 'c'}", "--num_shards=4", "--num_workers=1",
                    "--max_seq_len=24")
    captured = capfd.readouterr()
    assert code == 0, captured.err
    ours = [ln for ln in captured.err.splitlines() if ln.startswith("bin/pretokenize:")]
    assert len(ours) == 1 and ours[0].startswith(
        "bin/pretokenize: warning: 2 of 4 shards hold no sequence (c-0000"), ours
    assert "fewer documents than --num_shards=4" in ours[0]
    assert json.loads(captured.out)["num_sequences"] >= 2
    # The same command again keeps the set, and says so (and the warning, still true).
    code = run_tool("pretokenize", f"--corpus={corpus_file}", f"--vocab={tiny_vocab_file}",
                    f"--output={out / 'c'}", "--num_shards=4", "--num_workers=1",
                    "--max_seq_len=24")
    again = capfd.readouterr()
    assert code == 0 and json.loads(again.out) == {**json.loads(captured.out), "reused": True}
    assert f"bin/pretokenize: {out / 'c'}.json records shards made from this corpus with " \
           f"these settings, and they are all there; kept. Delete {out / 'c'}.json to " \
           "write them again." in again.err.splitlines()


def test_bin_pretokenize_locks_its_prefix_and_removes_a_killed_runs_temporaries(
        tiny_vocab_file, tmp_path, capfd):
    """A SIGKILLed run left its shard temporaries for good (each up to gigabytes). The
    next run, holding the prefix's lock, removes those of dead writers of this prefix;
    a second run while one holds the lock is refused."""
    from tinybert_tf.pipeline.run.lock import FileLock
    corpus_file = tmp_path / "docs.txt"
    write_text(corpus_file, make_docs(4))
    out = tmp_path / "out"
    out.mkdir()
    dead, live = subprocess.Popen(["true"]), subprocess.Popen(["sleep", "300"])
    dead.wait()
    planted = {f".c-00001-of-00004.tfrecord.tmp-{dead.pid}": False,  # removed
               f".c.json.tmp-{dead.pid}": False,
               f".c-00000-of-00002.tfrecord.tmp-{live.pid}": True,  # a live writer's
               f".cc-00000-of-00002.tfrecord.tmp-{dead.pid}": True,  # another prefix's
               f".c-00000-of-00002.tfrecord.tmp-x{dead.pid}": True}  # not a pid
    for name in planted:
        (out / name).write_bytes(b"partial")
    argv = [f"--corpus={corpus_file}", f"--vocab={tiny_vocab_file}", f"--output={out / 'c'}",
            "--num_shards=2", "--num_workers=1", "--max_seq_len=24"]
    with FileLock(str(out / ".c.lock"), "a test's hold"):
        capfd.readouterr()
        assert run_tool("pretokenize", *argv) == 2
        err = capfd.readouterr().err
        assert "a test's hold" not in err and f"--output={out / 'c'}" in err
        assert "One run at a time writes a shard prefix" in err
    assert {n: (out / n).exists() for n in planted} == {n: True for n in planted}
    try:
        assert run_tool("pretokenize", *argv) == 0
    finally:
        live.kill()
        live.wait()
    err = capfd.readouterr().err
    assert {n: (out / n).exists() for n in planted} == planted
    assert (f"bin/pretokenize: removed 2 temporary file(s) a killed run left: "
            f".c-00001-of-00004.tfrecord.tmp-{dead.pid}, .c.json.tmp-{dead.pid}") in err
    assert not (out / ".c.lock").exists() and (out / "c.json").exists()
