"""WordPiece tokenisation and packing: known ids, pairs, BERT's truncation,
accents, empty strings, tf.data."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.tokenizer import Tokenizer, VocabError, read_vocab


@pytest.fixture(scope="module")
def vocab(tiny_vocab):
    """The tiny vocab with unique tokens (tensorflow-text refuses repeats)."""
    return list(dict.fromkeys(tiny_vocab))


def _ids(vocab, tokens):
    return [vocab.index(t) for t in tokens]


@pytest.fixture(scope="module")
def tok(vocab):
    return Tokenizer(vocab, lower_case=True, max_seq_len=12)


@pytest.fixture(scope="module")
def bert_tok(minilm_dir):
    return Tokenizer(f"{minilm_dir}/vocab.txt", lower_case=True, max_seq_len=8)


def test_real_bert_vocab_known_ids(bert_tok):
    out = bert_tok(["Hello world"])
    assert out["input_word_ids"].numpy().tolist() == [[101, 7592, 2088, 102, 0, 0, 0, 0]]
    assert out["input_mask"].numpy().tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]]
    pair = bert_tok(["hello"], ["WORLD"])
    assert pair["input_word_ids"].numpy().tolist() == [[101, 7592, 102, 2088, 102, 0, 0, 0]]
    assert pair["input_type_ids"].numpy().tolist() == [[0, 0, 0, 1, 1, 0, 0, 0]]
    assert pair["input_mask"].numpy().tolist() == [[1, 1, 1, 1, 1, 0, 0, 0]]
    for name in ("input_word_ids", "input_mask", "input_type_ids"):
        assert pair[name].dtype == tf.int32


def test_vocab_single_and_pair(tok, vocab):
    single = tok(["The movie was great!"])
    expect = _ids(vocab, ["[CLS]", "the", "movie", "was", "great", "!", "[SEP]"])
    assert single["input_word_ids"].numpy()[0].tolist() == expect + [0] * 5
    assert single["input_type_ids"].numpy()[0].tolist() == [0] * 12
    pair = tok(["cats played"], ["the dog ran"])
    expect = _ids(vocab, ["[CLS]", "cat", "##s", "play", "##ed", "[SEP]",
                               "the", "dog", "ran", "[SEP]"])
    assert pair["input_word_ids"].numpy()[0].tolist() == expect + [0, 0]
    assert pair["input_type_ids"].numpy()[0].tolist() == [0] * 6 + [1] * 4 + [0, 0]
    unknown = tok(["zzz9 movie"])["input_word_ids"].numpy()[0]
    assert [vocab[i] for i in unknown[:4]] == ["[CLS]", "[UNK]", "movie", "[SEP]"]


def test_accents_and_case_are_stripped_for_uncased(tok, vocab):
    a = tok(["CAFÉ Café café cafe"])["input_word_ids"].numpy()[0]
    cafe = _ids(vocab, ["caf", "##e"])
    assert a[1:9].tolist() == cafe * 4
    cased = Tokenizer(vocab, lower_case=False, max_seq_len=12)
    b = cased(["Café"])["input_word_ids"].numpy()[0]
    assert vocab[b[1]] == "[UNK]"


def test_empty_strings(tok, vocab):
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    out = tok(["", "movie"], ["", ""])
    ids, mask, types = (out[k].numpy() for k in ("input_word_ids", "input_mask", "input_type_ids"))
    assert ids[0, :3].tolist() == [cls, sep, sep] and mask[0].sum() == 3
    assert types[0, :3].tolist() == [0, 0, 1]
    assert ids[1, :4].tolist() == [cls, vocab.index("movie"), sep, sep]
    assert tok([""])["input_mask"].numpy().sum() == 2


def _bert_truncate(a, b, budget):
    """Google BERT's _truncate_seq_pair: pop from the longer; ties pop from b."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def test_truncation_matches_bert_longest_first(tok, vocab):
    letters = [chr(ord("b") + i) for i in range(9)]  # single-letter words, one piece each
    cases = list(itertools.product(range(0, 10), range(0, 10)))
    text_a = [" ".join(letters[:na]) for na, _ in cases]
    text_b = [" ".join(letters[::-1][:nb]) for _, nb in cases]
    out = tok(text_a, text_b, max_seq_len=10)
    ids, types = out["input_word_ids"].numpy(), out["input_type_ids"].numpy()
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    for row, (na, nb) in enumerate(cases):
        ka, kb = _bert_truncate(range(na), range(nb), 10 - 3)
        want = ([cls] + _ids(vocab, letters[:len(ka)]) + [sep]
                + _ids(vocab, letters[::-1][:len(kb)]) + [sep])
        assert ids[row].tolist() == want + [0] * (10 - len(want)), (na, nb)
        assert types[row].tolist()[:len(want)] == [0] * (len(ka) + 2) + [1] * (len(kb) + 1)
    single = tok([" ".join(letters)], max_seq_len=5)["input_word_ids"].numpy()[0]
    assert single.tolist() == [cls] + _ids(vocab, letters[:3]) + [sep]


def test_inside_tf_data_matches_eager(tok):
    a = ["the movie was good", "", "cats sat on the mat", "hello world"]
    b = ["not bad", "fun", "", "the plot"]
    eager = tok(a, b)
    ds = tf.data.Dataset.from_tensor_slices((a, b)).batch(3).map(lambda x, y: tok(x, y))
    got = list(ds)
    for name in eager:
        np.testing.assert_array_equal(
            np.concatenate([g[name].numpy() for g in got]), eager[name].numpy())


def test_bad_vocab(tmp_path):
    with pytest.raises(VocabError, match="not found"):
        read_vocab(str(tmp_path / "missing.txt"))
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\nhello\n", encoding="utf-8")
    with pytest.raises(VocabError, match=r"vocab lacks the special token\(s\) \[CLS\] \[SEP\] "
                       r"\[MASK\]; a BERT WordPiece vocab needs all of \[PAD\] \[UNK\] "):
        read_vocab(str(path))
    # A vocab saved as UTF-16 (Windows Notepad's "Unicode"): the encoding and the fix.
    path.write_bytes("[PAD]\n[UNK]\n".encode("utf-16"))
    with pytest.raises(VocabError, match=r"vocab\.txt:1: not UTF-8 .*the file is UTF-16 \(its "
                       r"byte-order mark says so\): re-encode it, e\.g\. iconv -f UTF-16"):
        read_vocab(str(path))
    # A bad byte after a UTF-8 byte-order mark: the line is counted from the file's start.
    path.write_bytes(b"\xef\xbb\xbf[PAD]\n[UNK]\n\xe9t\n")
    with pytest.raises(VocabError, match=r"vocab\.txt:3: not UTF-8 .*iconv -f LATIN1"):
        read_vocab(str(path))
    with pytest.raises(VocabError, match="appears twice"):
        Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "a"])
    with pytest.raises(ValueError, match="max_seq_len"):
        Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "x", "y"], max_seq_len=4)(["x"], ["y"])  # noqa: E501


@pytest.mark.parametrize("lower_case", [True, False])
def test_cached_models_tokenize_as_tensorflow_texts_own_build(bert_tok, lower_case):
    """The WordPiece/normaliser buffers built once per vocab (`_model_buffers`) give what
    `FastBertTokenizer(vocab=...)` gives: ids and byte offsets, cased and uncased, and a
    second tokenizer of the vocab is the same."""
    import tensorflow_text as tf_text
    texts = tf.constant(["Hello, Café crème world! unaffable", "the 東京 quick ÀÉÎ straße",
                         "x" * 150 + " y", ""])
    ours = [Tokenizer(bert_tok.vocab, lower_case=lower_case) for _ in range(2)]
    theirs = tf_text.FastBertTokenizer(vocab=bert_tok.vocab, token_out_type=tf.int32,
                                       unknown_token="[UNK]",
                                       lower_case_nfd_strip_accents=lower_case)
    expected = [t.to_list() for t in theirs.tokenize_with_offsets(texts)]
    for tok in ours:
        assert [t.to_list() for t in tok.tokenize_with_offsets(texts)] == expected
    assert type(ours[0].vocab) is list and ours[0].vocab == bert_tok.vocab
    # Another vocab of the same casing shares the normaliser (built once per casing) and
    # still tokenizes as tensorflow-text's own build of that vocab.
    other = [t for t in bert_tok.vocab if not t.startswith("##")]
    theirs = tf_text.FastBertTokenizer(vocab=other, token_out_type=tf.int32,
                                       unknown_token="[UNK]",
                                       lower_case_nfd_strip_accents=lower_case)
    assert ([t.to_list() for t in Tokenizer(other, lower_case=lower_case)
             .tokenize_with_offsets(texts)]
            == [t.to_list() for t in theirs.tokenize_with_offsets(texts)])


def test_encoder_is_traced_once_and_packs_as_the_call(vocab):
    """`Tokenizer.encoder`: one trace however many datasets call it (sentences.make_dataset
    builds one per epoch and split), the same inputs as calling the tokenizer, and no
    trackable child of the tokenizer (a SavedModel holding it saves no extra function)."""
    from tinybert_tf.data import sentences
    from tinybert_tf.data.examples import Example

    tok = Tokenizer(vocab, max_seq_len=16)
    single, pair = tok.encoder(16), tok.encoder(16, pair=True)
    assert tok.encoder(16) is single and pair is not single
    texts = ["the movie was good", "hello world!", "un-affable café"]
    for batch in (texts, texts[:1]):
        got, want = single(tf.constant(batch)), tok(batch, max_seq_len=16)
        for key in want:
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)
    got = pair(tf.constant(texts), tf.constant(texts[::-1]))
    want = tok(texts, texts[::-1], max_seq_len=16)
    for key in want:
        np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)
    examples = [Example(guid=str(i), text_a=t, text_b=None, label=i % 2)
                for i, t in enumerate(texts)]
    for shuffle in (False, True):
        batch = next(iter(sentences.make_dataset(examples, tok, 16, 3, shuffle=shuffle)))
        assert batch[0]["input_word_ids"].shape == (3, 16)
    assert single.experimental_get_tracing_count() == 1
    assert pair.experimental_get_tracing_count() == 1
    assert "_encoders" not in tok._trackable_children()
