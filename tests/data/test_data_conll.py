"""Token classification data: CoNLL / JSON-lines readers, IOB2 checks, tag sets, word-piece
alignment (tiny and real vocab) and entity scores checked against seqeval."""
import logging
import os
import random
import re

import numpy as np
import pytest
from seqeval import metrics as seqeval_metrics
from seqeval.scheme import IOB2

from tinybert_tf.data import conll, entities
from tinybert_tf.data.conll import IGNORE
from tinybert_tf.data.examples import DataError
from tinybert_tf.tokenizer import Tokenizer

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "own_data")
NER_TAGS = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]


def fixture(name):
    return os.path.join(FIX, name)


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return str(path)


def raises_at(path, line, *fix):
    """pytest.raises for a DataError whose message starts with `path:line:` and holds `fix`."""
    pattern = re.escape(f"{path}:{line}:") + "".join(f"(?s:.*){re.escape(f)}" for f in fix)
    return pytest.raises(DataError, match=pattern)


# ---------------------------------------------------------------------------
# CoNLL files.

def test_conll_sentences_skip_docstart_and_keep_first_lines():
    s = conll.load_sentences(fixture("ner_train.conll"))
    assert len(s) == 4 and s.source == fixture("ner_train.conll") and s.invalid_iob2 == 0
    assert s[0].words == ["EU", "rejects", "German", "call", "to", "boycott", "British",
                          "lamb", "."]
    assert s[0].tags == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]
    assert [x.line for x in s] == [3, 13, 16, 21]
    assert s[3].word_line(2) == 23  # "Commission"
    assert s[1].tags == ["B-PER", "I-PER"]


def test_tag_column_picks_another_column():
    chunks = conll.load_conll(fixture("ner_train.conll"), tag_column=2)  # IOB2 chunk tags
    assert chunks[0].tags[:4] == ["B-NP", "B-VP", "B-NP", "I-NP"]
    pos = conll.load_conll(fixture("ner_train.conll"), tag_column=1, scheme=None)
    assert pos[0].tags[:3] == ["NNP", "VBZ", "JJ"]
    assert conll.tag_set(pos)[:3] == [".", "CD", "DT"]
    assert conll.load_conll(fixture("ner_train.conll"), tag_column=-2)[0].tags == chunks[0].tags


def test_tab_separated_file_allows_words_with_spaces():
    s = conll.load_sentences(fixture("ner_wnut.tsv"))
    assert s[0].words == ["Going", "to", "New York", "next", "week"]
    assert s[1].tags[4] == "B-creative-work"
    assert conll.tag_set(s) == ["O", "B-creative-work", "B-location", "I-creative-work",
                                "I-location"]


def test_bom_crlf_and_extra_blank_lines_read_the_same(tmp_path):
    with open(fixture("ner_train.conll"), "rb") as f:
        plain = f.read()
    data = b"\xef\xbb\xbf" + plain.replace(b"\n\n", b"\n \n\n").replace(b"\n", b"\r\n")
    s = conll.load_conll(write(tmp_path, "train.txt", data))
    ref = conll.load_conll(fixture("ner_train.conll"))
    assert [(x.words, x.tags) for x in s] == [(x.words, x.tags) for x in ref]


def test_words_only_file_is_unlabelled_when_allowed(tmp_path):
    path = write(tmp_path, "test.conll", "Rome\nfell\n\nAgain\n")
    s = conll.load_conll(path, require_tags=False)
    assert [(x.words, x.tags) for x in s] == [(["Rome", "fell"], None), (["Again"], None)]
    with raises_at(path, 1, "one column (the word) and no tag"):
        conll.load_conll(path)
    assert conll.encode_tags(s, NER_TAGS) == [None, None]


def test_bad_column_count_names_the_line_and_the_first_line(tmp_path):
    path = write(tmp_path, "bad.conll", "-DOCSTART- O\n\nEU NNP B-ORG\nrejects VBZ O\n\n"
                 "German B-MISC\n")
    with raises_at(path, 6, "2 whitespace-separated columns", "first word line (3) has 3",
                   "blank line separates sentences"):
        conll.load_conll(path)


def test_tag_column_out_of_range(tmp_path):
    path = write(tmp_path, "t.conll", "EU B-ORG\n")
    with raises_at(path, 1, "tag_column=2", "use 1..1"):
        conll.load_conll(path, tag_column=2)
    with raises_at(path, 1, "tag_column=0"):
        conll.load_conll(path, tag_column=0)


def test_empty_files_have_no_sentences(tmp_path):
    for content in ("", "\n\n", "-DOCSTART- -X- -X- O\n\n"):
        path = write(tmp_path, "e.conll", content)
        with pytest.raises(DataError, match=re.escape(path) + ": no sentences"):
            conll.load_conll(path)
    path = write(tmp_path, "e.jsonl", "\n")
    with pytest.raises(DataError, match="no sentences"):
        conll.load_sentences(path)


def test_non_iob2_tag_is_an_error_naming_word_and_line(tmp_path):
    path = write(tmp_path, "iobes.conll", "Peter B-PER\nBlackburn E-PER\n\nParis S-LOC\n")
    with raises_at(path, 2, "'E-PER' (word 'Blackburn') is not IOB2", "scheme=None"):
        conll.load_conll(path)
    assert conll.load_conll(path, scheme=None)[1].tags == ["S-LOC"]


def test_a_pos_column_taken_for_tags_names_the_tag_column_flag(tmp_path):
    path = write(tmp_path, "conll2003.txt", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n"
                                             "rejects VBZ B-VP O\n\n")
    assert conll.load_conll(path)[0].tags == ["B-ORG", "O"]  # the last column by default
    with raises_at(path, 3, "'NNP' (word 'EU') is not IOB2", "part-of-speech or chunk columns",
                   "--tag_column"):
        conll.load_conll(path, tag_column=1)


def test_a_pos_column_is_a_token_classification_task_scored_by_token_accuracy(tmp_path):
    """--task=token_classification --tag_column=1 on CoNLL-2003: part-of-speech tags,
    read as plain tags (docs/data.md: token accuracy), not refused."""
    from tinybert_tf.tasks import TaskConfig, resolve_task
    task = resolve_task(TaskConfig(task="token_classification", tag_column=1,
                                   train_file=fixture("ner_train.conll"),
                                   validation_file=fixture("ner_dev.conll")))
    assert not task.type.is_iob2 and task.type.metric_names == ("accuracy",)
    assert task.type.label_names[:3] == (".", "CD", "DT")
    assert task.source.describe()["scheme"] is None
    assert [e.label for e in task.examples("train")][1] == [
        task.type.label_names.index("NNP")] * 2  # Peter Blackburn
    # IOB2 tags keep entity scores under the same reader.
    ner = resolve_task(TaskConfig(task="token_classification",
                                  train_file=fixture("ner_train.conll"),
                                  validation_file=fixture("ner_dev.conll")))
    assert ner.type.is_iob2 and ner.source.describe()["scheme"] == "iob2"
    assert ner.type.metric_names[0] == "f1"


def test_span_tags_of_another_scheme_are_refused_naming_the_flag_not_python(tmp_path):
    path = write(tmp_path, "iobes.conll", "Peter B-PER\nBlackburn E-PER\n\nParis S-LOC\n")
    with raises_at(path, 2, "'E-PER' (word 'Blackburn') is not IOB2", "--tag_column",
                   "convert IOBES/BILOU tags to IOB2", "read as plain tags") as err:
        conll.load_conll(path, scheme="auto")
    assert "scheme=None" not in str(err.value)
    assert conll.decide_scheme(conll.load_conll(path, scheme=None)) == "iob2"
    assert conll.decide_scheme(conll.load_conll(fixture("ner_train.conll"), tag_column=1,
                                                scheme=None)) is None


def test_invalid_iob2_sequences_are_counted_and_warned_once(tmp_path, caplog):
    path = write(tmp_path, "iob1.conll", "The O\nEuropean I-ORG\nUnion I-ORG\n\n"
                 "Peter B-PER\nSmith I-LOC\nsaid O\n\nin O\nBonn I-LOC\n")
    with caplog.at_level(logging.WARNING, logger="tinybert_tf.data.conll"):
        s = conll.load_conll(path)
    assert s.invalid_iob2 == 3
    warnings = [r for r in caplog.records if "invalid IOB2" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert path in message and "3 I- tag(s)" in message and "line 2" in message
    assert s[0].tags == ["O", "I-ORG", "I-ORG"]  # kept as written


# ---------------------------------------------------------------------------
# JSON lines.

def test_jsonl_sentences():
    s = conll.load_sentences(fixture("ner_train.jsonl"))
    assert [x.line for x in s] == [1, 2, 3]
    assert s[2].words[1:4] == ["Tour", "de", "France"]
    assert s[2].word_line(3) == 3 and s[2].tags[3] == "I-MISC"


def test_jsonl_tokens_and_tags_of_different_length(tmp_path):
    path = write(tmp_path, "d.jsonl", '{"tokens": ["Oslo", "is", "cold"], "tags": ["B-LOC", "O", '
                 '"O"]}\n{"tokens": ["Kofi", "Annan", "spoke"], "tags": ["B-PER", "I-PER"]}\n')
    with raises_at(path, 2, "3 tokens but 2 tags", "one tag per token"):
        conll.load_sentences(path)


def test_jsonl_tag_ids_need_names(tmp_path):
    path = write(tmp_path, "ids.jsonl", '{"words": ["Kofi", "Annan"], "ner_tags": [4, 8]}\n'
                 '{"words": [], "ner_tags": []}\n')
    s = conll.load_sentences(path, tokens_key="words", tags_key="ner_tags", tag_names=NER_TAGS)
    assert s[0].tags == ["B-PER", "I-PER"] and s.skipped == 1 and len(s) == 1
    with raises_at(path, 1, "tag 4 is an id", "tag_names="):
        conll.load_sentences(path, tokens_key="words", tags_key="ner_tags")
    with raises_at(path, 1, "tag id 8 is outside tag_names"):
        conll.load_sentences(path, tokens_key="words", tags_key="ner_tags",
                             tag_names=NER_TAGS[:5])


def test_jsonl_bad_lines(tmp_path):
    path = write(tmp_path, "a.jsonl", '{"text": "EU rejects", "tags": ["B-ORG", "O"]}\n')
    with raises_at(path, 1, "no key 'tokens'", "['tags', 'text']"):
        conll.load_sentences(path)
    path = write(tmp_path, "b.jsonl", '{"tokens": "EU rejects", "tags": ["B-ORG", "O"]}\n')
    with raises_at(path, 1, "'tokens' is a JSON string", "list of strings"):
        conll.load_sentences(path)
    path = write(tmp_path, "c.jsonl", '["EU", "rejects"]\n')
    with raises_at(path, 1, "a JSON array, expected an object"):
        conll.load_sentences(path)
    path = write(tmp_path, "d.jsonl", '{"tokens": ["EU"]}\n')
    with raises_at(path, 1, "no key 'tags'"):
        conll.load_sentences(path)
    assert conll.load_sentences(path, require_tags=False)[0].tags is None


# ---------------------------------------------------------------------------
# Tag sets and ids.

def test_tag_set_puts_o_first_and_completes_b_and_i():
    train = conll.load_sentences(fixture("ner_train.conll"))
    assert conll.tag_set(train) == NER_TAGS  # I-LOC and I-MISC never occur in training
    dev = conll.load_sentences(fixture("ner_dev.conll"))
    ids = conll.encode_tags(dev, NER_TAGS)
    assert ids[2][:5] == [2, 6, 0, 4, 8]  # West/B-MISC Indian/I-MISC all-rounder/O Phil Simmons


def test_iob2_in_lower_case_is_refused_not_scored_as_plain_tags(tmp_path):
    """"b-per"/"o" was read as plain tags: token accuracy only, no entity scores."""
    path = write(tmp_path, "lower.conll", "Peter b-per\nBlackburn i-per\nsaid o\n")
    with raises_at(path, 1, "tag 'b-per' (word 'Peter') is IOB2 in lower case",
                   "write the file's O, B- and I- so (here 'B-per')"):
        conll.load_conll(path, scheme="auto")
    # Lower-case plain tags (no B-/I-) stay plain tags.
    path = write(tmp_path, "pos.conll", "Peter nnp\nsaid vbd\nso o\n")
    assert conll.load_conll(path, scheme="auto").scheme is None


def test_a_tag_set_of_one_tag_or_of_types_differing_in_case_is_refused(tmp_path):
    """Every word 'O' was a ValueError of the task type (no file, no fix); 'PER' and
    'Per' were two entity types, each with part of the names."""
    path = write(tmp_path, "o.conll", "a O\nb O\n\nc O\n")
    with pytest.raises(DataError, match=re.escape(
            f"{path}: every word is tagged 'O'; a tagger needs at least two tags (list them "
            "with --labels")):
        conll.tag_set(conll.load_conll(path, scheme="auto"))
    assert conll.tag_set(conll.load_conll(path, scheme="auto"), "O,B-PER,I-PER")[1] == "B-PER"
    path = write(tmp_path, "case.conll", "Peter B-PER\nsaid O\n\nAnna B-Per\n")
    with raises_at(path, 4, "tag 'B-Per' and tag 'B-PER' (" + path + ":1) name entity types "
                   "that differ only in case", "--labels"):
        conll.tag_set(conll.load_conll(path))
    assert conll.tag_set(conll.load_conll(path), "O,B-PER,I-PER,B-Per,I-Per")[3] == "B-Per"


def test_explicit_tag_order(tmp_path):
    train = conll.load_sentences(fixture("ner_train.jsonl"))
    order = "O,B-PER,I-PER,B-ORG,I-ORG,B-LOC,I-LOC,B-MISC,I-MISC"
    assert conll.tag_set(train, order) == order.split(",")
    with raises_at(fixture("ner_train.jsonl"), 1, "tag 'B-PER' is not in --labels"):
        conll.tag_set(train, "O,B-LOC,B-ORG,I-ORG,B-MISC,I-MISC")


def test_unknown_validation_tag_names_word_and_line(tmp_path):
    path = write(tmp_path, "dev.conll", "Olympics B-EVENT\nopen O\n")
    with raises_at(path, 1, "tag 'B-EVENT' (word 'Olympics')", "--labels=O,B-LOC"):
        conll.encode_tags(conll.load_conll(path), NER_TAGS)


# ---------------------------------------------------------------------------
# Word-piece alignment.

@pytest.fixture(scope="module")
def tiny_tok(tiny_vocab):
    return Tokenizer(list(dict.fromkeys(tiny_vocab)), max_seq_len=12)


@pytest.fixture(scope="module")
def bert_tok(minilm_dir):
    return Tokenizer(os.path.join(minilm_dir, "vocab.txt"), max_seq_len=32)


def test_first_piece_carries_the_tag_on_the_tiny_vocab(tiny_tok):
    v = tiny_tok.vocab
    out = conll.align_words(tiny_tok, [["The", "cats", "played", "on", "the", "mat"]],
                            [[0, 4, 8, 0, 1, 5]])
    ids = out.inputs["input_word_ids"][0]
    assert [v[i] for i in ids] == ["[CLS]", "the", "cat", "##s", "play", "##ed", "on", "the",
                                   "mat", "[SEP]", "[PAD]", "[PAD]"]
    assert out.labels[0].tolist() == [-1, 0, 4, -1, 8, -1, 0, 1, 5, -1, -1, -1]
    assert out.word_index[0].tolist() == [-1, 0, 1, -1, 2, -1, 3, 4, 5, -1, -1, -1]
    assert out.inputs["input_mask"][0].tolist() == [1] * 10 + [0, 0]
    assert out.inputs["input_type_ids"].sum() == 0
    for name in ("input_word_ids", "input_mask", "input_type_ids"):
        assert out.inputs[name].dtype == np.int32 and out.inputs[name].shape == (1, 12)
    assert out.labels.dtype == out.word_index.dtype == np.int32
    assert out.num_words.tolist() == [6] and out.dropped.tolist() == [0]


def test_word_with_no_piece_gets_unk(tiny_tok):
    v = tiny_tok.vocab
    # A lone combining accent is stripped by the uncased normaliser: no piece at all.
    out = conll.align_words(tiny_tok, [["cat", "\u0301", " ", "dog"]], [[1, 2, 3, 4]])
    ids = out.inputs["input_word_ids"][0]
    assert [v[i] for i in ids[:6]] == ["[CLS]", "cat", "[UNK]", "[UNK]", "dog", "[SEP]"]
    assert out.labels[0, :6].tolist() == [-1, 1, 2, 3, 4, -1]


def test_words_that_do_not_fit_are_dropped_and_counted(tiny_tok, caplog):
    words = [["unaffable", "cats", "played", "on", "the", "mat", "with", "a", "dog"],
             ["the", "cat"]]
    with caplog.at_level(logging.WARNING, logger="tinybert_tf.data.conll"):
        out = conll.align_words(tiny_tok, words, [list(range(9)), [3, 4]], max_seq_len=8)
    v = tiny_tok.vocab
    # 6 pieces fit: un ##aff ##able cat ##s play | ##ed cut: "played" keeps its first piece.
    assert [v[i] for i in out.inputs["input_word_ids"][0]] == [
        "[CLS]", "un", "##aff", "##able", "cat", "##s", "play", "[SEP]"]
    assert out.labels[0].tolist() == [-1, 0, -1, -1, 1, -1, 2, -1]
    assert out.dropped.tolist() == [6, 0] and out.num_words.tolist() == [9, 2]
    assert any("6 word(s) in 1 of 2 sentence(s)" in r.getMessage() for r in caplog.records)


def test_batches_give_the_same_result_as_one_call(tiny_tok):
    words = [["the", "dog", "ran"], [], ["unaffable"], ["cats", "sat", "on", "mats"]] * 3
    tags = [[1, 2, 3], [], [4], [5, 6, 7, 8]] * 3
    whole = conll.align_words(tiny_tok, words, tags)
    parts = conll.align_words(tiny_tok, words, tags, batch_size=3)
    for name in whole.inputs:
        np.testing.assert_array_equal(whole.inputs[name], parts.inputs[name])
    np.testing.assert_array_equal(whole.labels, parts.labels)
    np.testing.assert_array_equal(whole.word_index, parts.word_index)
    unlabelled = conll.align_words(tiny_tok, words)
    assert (unlabelled.labels == IGNORE).all()
    np.testing.assert_array_equal(unlabelled.word_index, whole.word_index)


def test_predictions_map_back_to_words(tiny_tok):
    words = [["unaffable", "cats", "played", "on", "the", "mat", "with", "a", "dog"],
             ["the", "cat"]]
    tags = [[1, 2, 3, 4, 5, 6, 7, 8, 1], [3, 4]]
    out = conll.align_words(tiny_tok, words, tags, max_seq_len=8)
    back = conll.word_predictions(out.labels, out.word_index, out.num_words, fill=0)
    assert [b.tolist() for b in back] == [[1, 2, 3, 0, 0, 0, 0, 0, 0], [3, 4]]
    logits = np.eye(9)[np.maximum(out.labels, 0)]  # [N, L, C]
    assert [b.tolist() for b in conll.word_predictions(logits, out.word_index,
                                                       out.num_words)] == [b.tolist()
                                                                           for b in back]


def test_alignment_on_the_real_bert_vocab(bert_tok):
    train = conll.load_sentences(fixture("ner_train.conll"))
    names = conll.tag_set(train)
    tag_ids = conll.encode_tags(train, names)
    out = conll.align_words(bert_tok, [s.words for s in train], tag_ids)
    assert out.dropped.sum() == 0
    ids = out.inputs["input_word_ids"]
    assert (ids[:, 0] == 101).all()  # [CLS] of bert-base-uncased
    v = bert_tok.vocab
    # "1996-08-22" is five pieces; only the first is labelled.
    date = np.flatnonzero(out.word_index[2] == 1)[0]
    assert [v[i] for i in ids[2, date:date + 6]] == ["1996", "-", "08", "-", "22", "[SEP]"]
    assert out.labels[2, date:date + 5].tolist() == [0, -1, -1, -1, -1]
    for s, (words, tags) in enumerate(zip([x.words for x in train], tag_ids)):
        starts = np.flatnonzero(out.word_index[s] >= 0)
        assert out.word_index[s, starts].tolist() == list(range(len(words)))
        assert out.labels[s, starts].tolist() == tags
        # The pieces between word starts are exactly each word tokenised alone.
        end = int(out.inputs["input_mask"][s].sum()) - 1  # the [SEP]
        bounds = list(starts) + [end]
        for w, word in enumerate(words):
            alone = bert_tok.tokenize([word]).flat_values.numpy().tolist()
            assert ids[s, bounds[w]:bounds[w + 1]].tolist() == alone, word
        assert ids[s, end] == 102


# ---------------------------------------------------------------------------
# Entities and scores.

def test_strict_and_lenient_entities_by_hand():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-ORG", "I-PER", "B-ORG", "B-ORG",
            "I-ORG"]
    assert entities.extract_entities(tags) == [(0, 2, "PER"), (5, 6, "ORG"), (7, 8, "ORG"),
                                               (8, 10, "ORG")]
    assert entities.extract_entities(tags, strict=False) == [
        (0, 2, "PER"), (3, 5, "LOC"), (5, 6, "ORG"), (6, 7, "PER"), (7, 8, "ORG"),
        (8, 10, "ORG")]
    assert entities.invalid_iob2(tags) == [3, 6]
    assert entities.iob1_to_iob2(["I-LOC", "I-LOC", "B-LOC", "O", "I-PER"]) == [
        "B-LOC", "I-LOC", "B-LOC", "O", "B-PER"]
    with pytest.raises(ValueError, match="'S-PER' is not IOB2"):
        entities.extract_entities(["S-PER"])


def test_scores_by_hand():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["I-ORG", "O"]]
    strict = entities.entity_report(true, pred)
    assert (strict["num_true"], strict["num_pred"], strict["num_correct"]) == (3, 2, 1)
    assert strict["precision"] == pytest.approx(0.5) and strict["recall"] == pytest.approx(1 / 3)
    assert strict["f1"] == pytest.approx(0.4) and strict["accuracy"] == pytest.approx(4 / 6)
    assert strict["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                         "support": 1}
    lenient = entities.compute_metrics(true, pred, strict=False)  # I-ORG starts an entity
    assert lenient["precision"] == pytest.approx(2 / 3)
    assert lenient["recall"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="sentence 1: 2 true and 1 predicted"):
        entities.entity_report(true, [pred[0], ["O"]])


def _random_tags(rng, n, types=("PER", "LOC", "ORG")):
    """Tag sequences that mix valid IOB2 with I- tags continuing nothing."""
    out = []
    for _ in range(n):
        seq = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            kind = rng.choice(types)
            if r < 0.45:
                seq.append("O")
            elif r < 0.7:
                seq.append("B-" + kind)
            elif seq and seq[-1] != "O" and r < 0.9:
                seq.append("I-" + seq[-1][2:])  # a valid continuation
            else:
                seq.append("I-" + kind)  # often invalid
        out.append(seq)
    return out


def _seqeval(true, pred, strict):
    kw = {"mode": "strict", "scheme": IOB2} if strict else {}
    report = seqeval_metrics.classification_report(true, pred, output_dict=True,
                                                   zero_division=0, **kw)
    micro = report.pop("micro avg")
    per_type = {k: v for k, v in report.items() if "avg" not in k}
    return micro, per_type


def _assert_matches_seqeval(true, pred, strict):
    ours = entities.entity_report(true, pred, strict=strict)
    micro, per_type = _seqeval(true, pred, strict)
    kw = {"mode": "strict", "scheme": IOB2} if strict else {}
    assert ours["f1"] == pytest.approx(seqeval_metrics.f1_score(true, pred, **kw))
    for key, theirs in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
        assert ours[key] == pytest.approx(micro[theirs]), key
        for kind, figures in per_type.items():
            assert ours["per_type"][kind][key] == pytest.approx(figures[theirs]), (kind, key)
    assert ours["num_true"] == micro["support"]
    assert set(ours["per_type"]) == set(per_type)
    for kind, figures in per_type.items():
        assert ours["per_type"][kind]["support"] == figures["support"]
    assert ours["accuracy"] == pytest.approx(seqeval_metrics.accuracy_score(true, pred))


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_entity_scores_equal_seqeval_on_random_sequences(strict):
    rng = random.Random(1909)
    for _ in range(20):
        true = _random_tags(rng, 30)
        # Predictions: the truth with some tags replaced, so that scores are not trivial.
        pred = [[t if rng.random() < 0.7 else rng.choice(NER_TAGS[:4] + ["I-PER", "I-LOC"])
                 for t in seq] for seq in true]
        if sum(map(len, true)) == 0:
            continue
        _assert_matches_seqeval(true, pred, strict)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_entity_scores_equal_seqeval_on_hand_made_sequences(strict):
    true = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC"],
            ["O", "B-ORG", "B-ORG", "I-ORG", "O"],
            ["B-MISC", "I-MISC", "O", "O", "B-PER"]]
    pred = [["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "I-LOC"],
            ["O", "B-ORG", "I-ORG", "I-ORG", "O"],
            ["B-MISC", "I-PER", "O", "I-PER", "B-PER"]]
    _assert_matches_seqeval(true, pred, strict)
