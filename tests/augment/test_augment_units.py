"""Algorithm 1 pieces: words, MLM candidates, word-vector neighbours, sampling."""
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.augment import (
    STOPWORDS,
    Augmenter,
    MLMCandidates,
    NeighbourIndex,
    WordSplitter,
    is_eligible,
    sample_variants,
)
from tinybert_tf.augment.candidates import whole_word_mask

from augment_helpers import VECTOR_WORDS, VOCAB, set_bias, tiny_mlm, tiny_vectors


@pytest.fixture(scope="module")
def model():
    return tiny_mlm()


# --- words ----------------------------------------------------------------------------

def test_basic_tokenisation_matches_bert():
    words = WordSplitter().split(["It's a Café, \"naïve\" (x2)!", ""])
    assert words == [["it", "'", "s", "a", "cafe", ",", "\"", "naive", "\"", "(", "x2", ")",
                      "!"], []]
    assert WordSplitter(lower_case=False).split(["Café!"]) == [["Café", "!"]]


def test_eligibility_is_the_references():
    assert len(STOPWORDS) == 173
    assert "the" in STOPWORDS and "wouldn't" in STOPWORDS and "'s" in STOPWORDS
    assert "what" not in STOPWORDS and "how" not in STOPWORDS  # absent from the reference list
    assert [is_eligible(w) for w in ["movie", "Movie", "the", "The", "x2", ",", "café", "what"]] \
        == [True, True, False, False, False, False, False, True]


# --- MLM candidates -------------------------------------------------------------------

def test_whole_word_mask():
    mask = whole_word_mask(VOCAB)
    for i, t in enumerate(VOCAB):
        assert mask[i] == (not t.startswith("##") and not (t.startswith("[") and t.endswith("]")))


def _naive_logits(model, pieces, target):
    """One forward for one word, written out independently: [CLS] masked [SEP] sent [SEP]."""
    cls, sep, msk = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[MASK]")
    flat = [p for ps in pieces for p in ps]
    start = sum(len(p) for p in pieces[:target])
    masked = list(flat)
    masked[start] = msk
    ids = [cls] + masked + [sep] + flat + [sep]
    types = [0] * (len(flat) + 2) + [1] * (len(flat) + 1)
    out = model({"input_word_ids": tf.constant([ids]),
                 "input_mask": tf.ones((1, len(ids)), tf.int32),
                 "input_type_ids": tf.constant([types])}, training=False)
    return out["logits"][0, start + 1].numpy()  # [V] at the masked position


def test_candidates_are_top_k_at_the_masked_position(model):
    mlm = MLMCandidates(model, num_candidates=5, batch_size=4)
    sentences = [["the", "movie", "was", "fun", "."], ["a", "dog", "sat", "on", "the", "mat"],
                 ["great", "plot", ",", "boring", "actor"]]
    allowed = whole_word_mask(VOCAB)
    rows, want = [], []
    for words in sentences:
        pieces = mlm.pieces(words)
        targets = [i for i, w in enumerate(words) if len(pieces[i]) == 1 and w.isalpha()]
        rows += mlm.make_rows(pieces, targets)
        for t in targets:
            logits = _naive_logits(model, pieces, t)
            ok = allowed.copy()
            ok[pieces[t][0]] = False
            logits = np.where(ok, logits, -np.inf)
            want.append(logits)
    got = mlm.candidates(rows)
    assert len(got) == len(want) == 14
    assert mlm.forward_calls == 4  # 14 rows, 4 per pass: batched, not one pass per word
    for cands, logits in zip(got, want):
        assert len(cands) == 5
        # Our top-5 must be the naive top-5 of that position (tolerance for float ties).
        top = np.sort(logits)[::-1][:5]
        np.testing.assert_allclose(logits[[VOCAB.index(c) for c in cands]], top, atol=1e-4)


def test_planted_preference_whole_words_only(model):
    # Specials and ## pieces get a huge bias; "film" a large one; they must not leak.
    old = set_bias(model, {"##s": 80.0, "[UNK]": 90.0, "[unused0]": 90.0, "[MASK]": 90.0,
                           "film": 60.0, "great": 50.0})
    try:
        mlm = MLMCandidates(model, num_candidates=15, batch_size=8)
        words = ["the", "film", "was", "awful"]
        pieces = mlm.pieces(words)
        got = mlm.candidates(mlm.make_rows(pieces, [1, 3]))
    finally:
        model.head.output_bias.assign(old)
    film, awful = got
    assert awful[0] == "film" and awful[1] == "great"
    assert film[0] == "great" and "film" not in film  # never the masked word itself
    for cands in got:
        assert len(cands) == 15
        assert not any(c.startswith("##") or c.startswith("[") for c in cands)


def test_rows_beyond_max_len_are_skipped(model):
    mlm = MLMCandidates(model, num_candidates=3, max_len=8)
    pieces = mlm.pieces(["the", "movie", "was", "very", "good", "fun", "plot"])
    rows = mlm.make_rows(pieces, [1, 6])
    assert rows[1] is None  # 7th piece: only 6 fit between [CLS] and [SEP]
    ids = [VOCAB.index(t) for t in ["[CLS]", "the", "[MASK]", "was", "very", "good", "fun",
                                    "[SEP]"]]
    assert rows[0].ids == ids and rows[0].position == 2  # no room left for the 2nd segment
    assert mlm.candidates([rows[0]])[0]  # and it still scores


# --- word vectors ---------------------------------------------------------------------

def test_neighbours_are_cosine_top_k():
    kv = tiny_vectors()
    index = NeighbourIndex(kv, num_candidates=3, vocab_limit=0)
    keys = list(VECTOR_WORDS)
    vec = np.array(list(VECTOR_WORDS.values()))
    unit = vec / np.linalg.norm(vec, axis=1, keepdims=True)
    for word in ["unaffable", "cat", "movie"]:
        sims = unit @ unit[keys.index(word)]
        order = [keys[j] for j in np.argsort(-sims, kind="stable") if keys[j] != word]
        want = []
        for w in order:  # lower-cased, distinct, not the word
            if w.lower() not in want and w.lower() != word:
                want.append(w.lower())
        assert index.neighbours([word])[word] == want[:3]
    assert index.neighbours(["unaffable"])["unaffable"] == ["awful", "dull", "boring"]
    assert index.neighbours(["nonexistent"]) == {"nonexistent": []}
    # Batch-independent: a word alone or among others gets the same list.
    alone = NeighbourIndex(kv, 3, 0).neighbours(["good"])["good"]
    assert NeighbourIndex(kv, 3, 0).neighbours(keys)["good"] == alone
    # "Great" and "great" collapse into one lower-cased neighbour.
    assert index.neighbours(["good"])["good"].count("great") == 1


def test_vocab_limit_restricts_search():
    index = NeighbourIndex(tiny_vectors(), num_candidates=10, vocab_limit=3)
    assert index.neighbours(["unaffable"])["unaffable"] == ["awful", "dull"]
    assert index.neighbours(["cat"])["cat"] == []  # beyond the limit: not looked up


# --- sampling -------------------------------------------------------------------------

def test_sampling_p0_p1_and_duplicates():
    words = ["the", "movie", "was", "good"]
    cands = [(1, ["film", "story"]), (3, ["great"])]
    rng = np.random.default_rng(0)
    assert sample_variants(words, cands, 20, 0.0, rng, {"the movie was good"}) == []
    out = sample_variants(words, cands, 20, 1.0, np.random.default_rng(0), set())
    assert sorted(out) == ["the film was great", "the story was great"]  # deduplicated
    # The draws are the documented ones: [N_a, n] candidate indices, then [N_a, n] uniforms.
    many = [(1, ["w%d" % i for i in range(50)]), (3, ["x", "y"])]
    got = sample_variants(words, many, 30, 0.4, np.random.default_rng(3), set())
    rng = np.random.default_rng(3)
    choice = rng.integers(0, [50, 2], size=(30, 2))
    u = rng.random((30, 2))
    want = []
    for t in range(30):
        new = list(words)
        for j, (pos, c) in enumerate(many):
            if u[t, j] < 0.4:
                new[pos] = c[choice[t, j]]
        if " ".join(new) not in want:
            want.append(" ".join(new))
    assert got == want
    # p_t is a per-word probability: ~40% of 4000 tries replace the word.
    wide = [(1, ["w%d" % i for i in range(10 ** 6)])]
    n = len(sample_variants(words, wide, 4000, 0.4, np.random.default_rng(5),
                            {"the movie was good"}))
    assert abs(n - 1600) < 4 * np.sqrt(4000 * 0.4 * 0.6)


def test_p1_replaces_every_eligible_word(model):
    aug = Augmenter(NeighbourIndex(tiny_vectors(), 3, 0), MLMCandidates(model, 4), num_aug=5,
                    replace_prob=1.0, seed=1)
    texts = ["The movie was unaffable, not a fun plot!", "a cat sat on the mat"]
    words, cands, stats = aug.word_candidates(texts)
    assert words[0][3] == "unaffable"
    by_pos = dict(cands[0])
    assert by_pos[3] == ["awful", "dull", "boring"]  # 3 pieces -> word vectors
    assert set(by_pos) == {1, 3, 7, 8}  # movie, unaffable, fun, plot: "not"/"a" are stopwords
    assert stats.mlm_words == 6 and stats.vector_words == 1 and stats.skipped == 0
    variants, _ = aug.augment_fields([(0, texts)])
    for field, (ws, cs) in enumerate(zip(words, cands)):
        eligible = dict(cs)
        assert variants[0][field]
        for text in variants[0][field]:
            new = text.split(" ")
            assert len(new) == len(ws)
            for i, (old, w) in enumerate(zip(ws, new)):
                if i in eligible:
                    assert w != old and w in eligible[i]
                else:
                    assert w == old
