"""SQuAD v1.1 / v2.0: reading the official JSON (and every bad-input error), BERT's
windows and answer positions, post-processing of logits back to the original text,
and the official EM/F1 checked against an independent implementation written here."""
import json
import math
import os
import re
import string

import numpy as np
import pytest

from tinybert_tf.data import squad, squad_answers, squad_metrics
from tinybert_tf.data.examples import DataError
from tinybert_tf.data.squad import SquadExample
from tinybert_tf.tokenizer import Tokenizer

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "squad")
V1 = os.path.join(FIX, "dev-v1.1.json")
V2 = os.path.join(FIX, "dev-v2.0.json")


@pytest.fixture(scope="module")
def tiny_tok(tiny_vocab):
    return Tokenizer(list(dict.fromkeys(tiny_vocab)), lower_case=True)


@pytest.fixture(scope="module")
def bert_tok(minilm_dir):
    return Tokenizer(os.path.join(minilm_dir, "vocab.txt"), lower_case=True)


def _pieces(tok, feature):
    return tok.ids_to_tokens(feature.input_word_ids[feature.input_mask == 1])


def _answer_text(ex, feature):
    spans = feature.token_char_spans
    return ex.context[spans[feature.start_position, 0]:spans[feature.end_position, 1]]


# ---------------------------------------------------------------------------
# Tokenizer.tokenize_with_offsets (the one addition to tokenizer.py).

def test_tokenize_with_offsets_gives_byte_spans_of_the_original_text(bert_tok, tiny_tok):
    text = "CAFÉ Tōkyō (東京), naïve!"
    ids, starts, ends = bert_tok.tokenize_with_offsets([text])
    assert ids.dtype.name == "int32"
    assert ids[0].numpy().tolist() == bert_tok.tokenize([text])[0].numpy().tolist()
    raw = text.encode("utf-8")
    spans = [raw[a:b].decode("utf-8") for a, b in zip(starts[0].numpy(), ends[0].numpy())]
    # Pieces are lower-cased and accent-stripped; their offsets point at the original bytes.
    assert "".join(spans) == "".join(text.split())
    assert spans[0] == "CAFÉ" and "東" in spans and "京" in spans and spans[-1] == "!"
    tiny_ids, tiny_starts, tiny_ends = tiny_tok.tokenize_with_offsets(["Hello, World"])
    assert tiny_tok.ids_to_tokens(tiny_ids[0].numpy()) == ["hello", ",", "world"]
    assert tiny_starts[0].numpy().tolist() == [0, 5, 7]
    assert tiny_ends[0].numpy().tolist() == [5, 6, 12]


# ---------------------------------------------------------------------------
# Reading.

def test_read_v1_keeps_every_question_and_gold_answer():
    examples = squad.read_squad(V1, "1.1")
    assert [e.qas_id for e in examples] == ["eiffel-1", "eiffel-2", "eiffel-3", "eiffel-4",
                                            "eiffel-5", "cafe-1", "cafe-2", "cafe-3", "cafe-4"]
    assert examples.source == V1 and examples.skipped == 0
    first = examples[0]
    assert first.title == "Eiffel_Tower" and first.question == "Who is the tower named after?"
    assert first.answers == [("Gustave Eiffel", 141), ("Gustave Eiffel", 141),
                             ("the engineer Gustave Eiffel", 128)]
    assert not any(e.is_impossible for e in examples)
    assert examples[5].title == "Café_culture"
    for ex in examples:
        for text, start in ex.answers:
            assert ex.context[start:start + len(text)] == text


def test_read_v2_marks_unanswerable_questions():
    examples = squad.read_squad(V2, "v2.0")
    impossible = {e.qas_id for e in examples if e.is_impossible}
    assert impossible == {"norm-3", "norm-4", "norm-7"}
    assert all(e.answers == [] for e in examples if e.is_impossible)
    assert squad.gold_answers(examples)["norm-2"] == ["10th and 11th centuries",
                                                      "in the 10th and 11th centuries"]
    assert squad.gold_answers(examples)["norm-3"] == []


def test_version_spellings():
    assert {squad.squad_version(v) for v in ("1.1", 1.1, "v1.1", "squad1.1", "1")} == {"1.1"}
    assert {squad.squad_version(v) for v in ("2.0", 2.0, "v2.0", "SQuAD2.0", 2)} == {"2.0"}
    with pytest.raises(ValueError, match="unknown SQuAD version '3'"):
        squad.squad_version("3")


def _doc(context="the cat sat on the mat .", answers=None, version="1.1", **qa_extra):
    qa = {"id": "q1", "question": "who sat ?",
          "answers": [{"text": "the cat", "answer_start": 0}] if answers is None else answers}
    qa.update(qa_extra)
    return {"version": version,
            "data": [{"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]}


def _without(doc, *keys):
    """The document with the key at the end of the path `keys` removed."""
    node = doc
    for k in keys[:-1]:
        node = node[k]
    del node[keys[-1]]
    return doc


QA = r"question id 'q1' \(data\[0\]\.paragraphs\[0\]\.qas\[0\]"
BAD_INPUTS = {
    "not_json": ('{"data": [\n  {"title": "x",, }]}', "1.1",
                 r"bad\.json:2:17: not valid JSON \(Expecting property name"),
    "top_level_array": ([], "1.1", r"bad\.json: the top level is an array, expected an object"),
    "no_data": (_without(_doc(), "data"), "1.1",
                r"bad\.json: the top level: missing key 'data'; the official SQuAD layout"),
    "data_not_array": ({"data": {"title": "T"}}, "1.1",
                       r"bad\.json: the top level: 'data' is an object, expected an array"),
    "no_paragraphs": (_without(_doc(), "data", 0, "paragraphs"), "1.1",
                      r"bad\.json: data\[0\]: missing key 'paragraphs'"),
    "no_qas": (_without(_doc(), "data", 0, "paragraphs", 0, "qas"), "1.1",
               r"bad\.json: data\[0\]\.paragraphs\[0\]: missing key 'qas'"),
    "no_context": (_without(_doc(), "data", 0, "paragraphs", 0, "context"), "1.1",
                   r"bad\.json: data\[0\]\.paragraphs\[0\]: missing key 'context'"),
    "empty_context": (_doc(context=" \n "), "1.1",
                      r"data\[0\]\.paragraphs\[0\]: 'context' is empty; give the paragraph text"),
    "lone_surrogate": (_doc(context="the cat \ud800 sat"), "1.1",
                       r"data\[0\]\.paragraphs\[0\]: 'context' holds an unpaired surrogate "
                       r"escape at character 8; fix the \\u escape"),
    "no_id": (_without(_doc(), "data", 0, "paragraphs", 0, "qas", 0, "id"), "1.1",
              r"data\[0\]\.paragraphs\[0\]\.qas\[0\]: missing key 'id'"),
    "no_answers_key": (_without(_doc(), "data", 0, "paragraphs", 0, "qas", 0, "answers"),
                       "1.1", QA + r"\): missing key 'answers'"),
    "answer_past_end": (_doc(answers=[{"text": "mat .", "answer_start": 21}]), "1.1",
                        QA + r"\.answers\[0\]\): the answer 'mat \.' at answer_start 21 \(ending "
                        r"at character 26\) lies outside the 24-character context"),
    "answer_negative": (_doc(answers=[{"text": "the", "answer_start": -1}]), "1.1",
                        QA + r"\.answers\[0\]\): the answer 'the' at answer_start -1"),
    "answer_start_string": (_doc(answers=[{"text": "the", "answer_start": "0"}]), "1.1",
                            QA + r"\.answers\[0\]\): 'answer_start' is a string, expected an "
                            r"integer"),
    "empty_answer": (_doc(answers=[{"text": " ", "answer_start": 3}]), "1.1",
                     QA + r"\.answers\[0\]\): the answer text is empty"),
    "v1_without_answers": (_doc(answers=[]), "1.1",
                           QA + r"\): no answers; every SQuAD 1.1 question needs one"),
    "v1_impossible": (_doc(answers=[], is_impossible=True), "1.1",
                      QA + r"\): is_impossible is true, but SQuAD 1.1 has no unanswerable "
                      r"questions; read the file as version 2.0"),
    "v2_impossible_with_answers": (_doc(is_impossible=True, version="v2.0"), "2.0",
                                   QA + r"\): is_impossible is true but the question has 1 "
                                   r"answer\(s\); move them to 'plausible_answers'"),
    "v2_possible_without_answers": (_doc(answers=[], is_impossible=False), "2.0",
                                    QA + r"\): is_impossible is false but 'answers' is empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_one_error_naming_file_and_question(tmp_path, case):
    doc, version, pattern = BAD_INPUTS[case]
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    with pytest.raises(DataError, match=pattern) as err:
        squad.read_squad(str(path), version)
    assert str(err.value).startswith(str(path))


def test_duplicate_ids_missing_files_and_bad_utf8(tmp_path):
    doc = _doc()
    paragraph = doc["data"][0]["paragraphs"][0]
    paragraph["qas"].append(dict(paragraph["qas"][0]))
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(DataError, match=r"dup\.json: question id 'q1' \(data\[0\]\.paragraphs"
                                        r"\[0\]\.qas\[1\]\): the id is used twice \(first at "
                                        r"data\[0\]\.paragraphs\[0\]\.qas\[0\]\)"):
        squad.read_squad(str(path), "1.1")
    with pytest.raises(DataError, match=r"nope\.json: file not found; give the SQuAD JSON"):
        squad.read_squad(str(tmp_path / "nope.json"), "1.1")
    # Through the task, a missing file is named by its flag (a config may have set it).
    from tinybert_tf.tasks import TaskConfig, resolve_task
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_doc()), encoding="utf-8")
    task = resolve_task(TaskConfig(task="squad1.1", train_file=str(tmp_path / "gone.json"),
                                   validation_file=str(good)))
    with pytest.raises(DataError, match=r"^--train_file=.*gone\.json: file not found; give "
                       r"the SQuAD v1\.1 JSON file \(such as train-v1\.1\.json\)\.$"):
        task.examples("train")
    # Flags of other tasks' files were ignored without a word.
    files = dict(train_file=str(good), validation_file=str(good))
    with pytest.raises(DataError, match=r"^--text_column=question: describes your own files "
                       r".*--task=squad1\.1 reads SQuAD JSON, whose fields are fixed"):
        resolve_task(TaskConfig(task="squad1.1", text_column="question", **files))
    with pytest.raises(DataError, match=r"^--data_dir=.* is for GLUE tasks; --task=squad2\.0 "
                       r"reads --train_file and --validation_file"):
        resolve_task(TaskConfig(task="squad2.0", data_dir=str(tmp_path), **files))
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(json.dumps(_doc(context="café au lait"), ensure_ascii=False)
                       .encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.json: invalid UTF-8 at byte \d+.*LATIN1"):
        squad.read_squad(str(latin1), "1.1")
    # After a UTF-8 byte-order mark the byte is counted from the file's start.
    text = json.dumps(_doc(context="café au lait"), ensure_ascii=False)
    latin1.write_bytes(b"\xef\xbb\xbf" + text.encode("latin-1"))
    at = 3 + text.index("é")
    with pytest.raises(DataError, match=rf"latin1\.json: invalid UTF-8 at byte {at} "
                       r"\(b'.{0,40}caf\\xe9 au l"):
        squad.read_squad(str(latin1), "1.1")
    utf16 = tmp_path / "utf16.json"
    utf16.write_bytes(json.dumps(_doc()).encode("utf-16"))
    with pytest.raises(DataError, match=r"utf16\.json: invalid UTF-8 at byte 0 .*the file is "
                       r"UTF-16 \(its byte-order mark"):
        squad.read_squad(str(utf16), "1.1")


def _many_questions(n, bad_ids):
    context = "the cat sat on the mat . the dog ran ."
    qas = [{"id": f"q{i}", "question": "who sat ?",
            "answers": [{"text": "the dog" if i in bad_ids else "the cat", "answer_start": 0}]}
           for i in range(n)]
    return {"version": "1.1",
            "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


def test_training_skips_and_counts_answers_not_at_their_offset(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(_many_questions(150, {7})), encoding="utf-8")
    train = squad.read_squad(str(path), "1.1", is_training=True)
    assert len(train) == 149 and train.skipped == 1
    assert "q7" not in {e.qas_id for e in train}
    dev = squad.read_squad(str(path), "1.1")  # evaluation keeps every question
    assert len(dev) == 150 and dev.skipped == 0


def test_training_with_over_one_percent_skipped_is_an_error(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(_many_questions(100, {7, 42})), encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.json: 2 of 100 training questions \(2\.00%\) "
                                        r"have an answer text that is not at its answer_start.*"
                                        r"more than the 1% .*first: 'q7', 'q42'"):
        squad.read_squad(str(path), "1.1", is_training=True)
    assert len(squad.read_squad(str(path), "1.1", is_training=True,
                                max_skipped_fraction=0.05)) == 98


def test_training_check_normalises_whitespace_as_run_squad(tmp_path):
    context = "the cat\tsat  on\nthe mat ."
    answers = [{"text": "cat sat on the", "answer_start": 4},   # whitespace differs
               {"text": " cat", "answer_start": 3}]              # starts on a space
    doc = _doc(context=context, answers=answers[:1])
    doc["data"][0]["paragraphs"][0]["qas"].append(
        {"id": "q2", "question": "who ?", "answers": answers[1:]})
    path = tmp_path / "train.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    train = squad.read_squad(str(path), "1.1", is_training=True)
    assert [e.qas_id for e in train] == ["q1", "q2"] and train.skipped == 0


# ---------------------------------------------------------------------------
# Features.

def test_feature_layout_is_cls_question_sep_context_sep(tiny_tok):
    context = "The cat sat on the mat."
    ex = SquadExample("q1", "", "Who sat?", context, [("cat sat", 4)])
    (feat,) = squad.make_features([ex], tiny_tok, max_seq_len=16, doc_stride=4,
                                  max_query_len=8)
    assert _pieces(tiny_tok, feat) == ["[CLS]", "w", "##h", "##o", "sat", "?", "[SEP]", "the",
                                       "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert feat.input_word_ids[15] == tiny_tok.pad_id
    assert feat.input_mask.tolist() == [1] * 15 + [0]
    assert feat.input_type_ids.tolist() == [0] * 7 + [1] * 8 + [0]
    for name in ("input_word_ids", "input_mask", "input_type_ids"):
        assert getattr(feat, name).dtype == np.int32 and getattr(feat, name).shape == (16,)
    assert (feat.start_position, feat.end_position) == (8, 9)
    assert _answer_text(ex, feat) == "cat sat"
    spans = feat.token_char_spans
    assert spans.shape == (16, 2) and spans.dtype == np.int32
    assert (spans[:7] == -1).all() and (spans[14:] == -1).all()
    assert [context[a:b] for a, b in spans[7:14]] == ["The", "cat", "sat", "on", "the", "mat",
                                                       "."]
    assert feat.token_is_max_context.tolist() == [False] * 7 + [True] * 7 + [False] * 2
    arrays = squad.feature_arrays([feat, feat])
    assert sorted(arrays) == ["end_positions", "example_index", "input_mask", "input_type_ids",
                              "input_word_ids", "start_positions"]
    assert arrays["input_word_ids"].shape == (2, 16)
    assert arrays["start_positions"].tolist() == [8, 8]
    assert all(a.dtype == np.int32 for a in arrays.values())


WINDOW_CONTEXT = ("the cat sat on the mat . the dog ran . a good movie is fun . the plot was "
                  "very boring . hello world .")


def test_answer_crossing_a_window_boundary_is_whole_only_in_a_later_window(tiny_tok):
    # 26 one-piece words; question "who sat ?" = 5 pieces, so 20 - 7 - 1 = 12 context
    # pieces per window, windows start 4 apart: [0,12) [4,16) [8,20) [12,24) [16,26).
    answer = "a good movie is fun"  # pieces 11..15: cut by the end of the first window
    ex = SquadExample("q1", "", "who sat ?", WINDOW_CONTEXT,
                      [(answer, WINDOW_CONTEXT.index(answer))])
    feats = squad.make_features([ex], tiny_tok, max_seq_len=20, doc_stride=4, max_query_len=8)
    assert [f.window_index for f in feats] == [0, 1, 2, 3, 4]
    assert [int(f.input_mask.sum()) - 8 for f in feats] == [12, 12, 12, 12, 10]
    positions = [(f.start_position, f.end_position) for f in feats]
    assert positions == [(0, 0), (7 + 11 - 4, 7 + 15 - 4), (7 + 11 - 8, 7 + 15 - 8), (0, 0),
                         (0, 0)]
    assert _answer_text(ex, feats[1]) == _answer_text(ex, feats[2]) == answer
    # Every context piece has its maximum context in exactly one window.
    owner = np.zeros(26, int)
    for f in feats:
        doc_pos = np.flatnonzero(f.token_char_spans[:, 0] >= 0)
        first = 4 * f.window_index
        owner[first + np.arange(doc_pos.size)] += f.token_is_max_context[doc_pos]
    assert owner.tolist() == [1] * 26
    # run_squad's rule, piece 13 ("is"): min(left, right) + 0.01 * 12 is 2 in window 1
    # (left 9, right 2), 5 in window 2 (left 5, right 6), 1 in window 3: window 2 wins.
    assert [bool(f.token_is_max_context[7 + 13 - 4 * f.window_index])
            for f in feats[1:4]] == [False, True, False]


def test_question_is_cut_to_max_query_len(tiny_tok):
    ex = SquadExample("q1", "", "the cat sat on the mat the dog ran", "a good movie .",
                      [("good movie", 2)])
    (feat,) = squad.make_features([ex], tiny_tok, max_seq_len=16, max_query_len=3)
    assert _pieces(tiny_tok, feat) == ["[CLS]", "the", "cat", "sat", "[SEP]", "a", "good",
                                       "movie", ".", "[SEP]"]
    assert (feat.start_position, feat.end_position) == (6, 7)
    with pytest.raises(ValueError, match=r"question 'q1': max_seq_len=8 leaves no room for "
                                         r"context after its 5 question pieces"):
        squad.make_features([ex], tiny_tok, max_seq_len=8, max_query_len=5)


def test_unanswerable_questions_point_every_window_at_cls(tiny_tok):
    impossible = SquadExample("q1", "", "who sat ?", WINDOW_CONTEXT, [], is_impossible=True)
    possible = SquadExample("q2", "", "who sat ?", WINDOW_CONTEXT,
                            [("hello world", WINDOW_CONTEXT.index("hello world"))])
    feats = squad.make_features([impossible, possible], tiny_tok, max_seq_len=20, doc_stride=4)
    assert {(f.start_position, f.end_position) for f in feats if f.example_index == 0} == {(0, 0)}
    last = [f for f in feats if f.example_index == 1][-1]
    assert last.start_position > 0 and _answer_text(possible, last) == "hello world"


def test_improve_answer_span_narrows_to_the_answer_pieces(bert_tok):
    # The word "(1887–1889)" holds the answer "1887": run_squad's word mapping gives the
    # whole word, _improve_answer_span narrows it to the answer's own pieces.
    context = "The tower was built (1887–1889) in Paris."
    ex = SquadExample("q1", "", "When?", context, [("1887", context.index("1887"))])
    (feat,) = squad.make_features([ex], bert_tok, max_seq_len=32)
    assert feat.start_position == feat.end_position
    assert _answer_text(ex, feat) == "1887"


@pytest.mark.parametrize("path,version", [(V1, "1.1"), (V2, "2.0")])
def test_every_fixture_answer_is_recoverable_from_some_window(bert_tok, path, version):
    examples = squad.read_squad(path, version, is_training=True)
    feats = squad.make_features(examples, bert_tok, max_seq_len=40, doc_stride=8,
                                max_query_len=16)
    assert len(feats) > 2 * len(examples)  # the contexts really are windowed
    for i, ex in enumerate(examples):
        mine = [f for f in feats if f.example_index == i]
        assert [f.window_index for f in mine] == list(range(len(mine)))
        if ex.is_impossible:
            assert all(f.start_position == f.end_position == 0 for f in mine)
            continue
        found = [_answer_text(ex, f) for f in mine if f.start_position > 0]
        assert found and set(found) == {ex.answers[0][0]}, ex.qas_id


def test_unicode_context_pieces_span_the_original_characters(bert_tok):
    context = "In Tōkyō (東京), the café «Le Petit Pain» opened — ¥500–¥800."
    ex = SquadExample("q1", "", "Where?", context, [("Tōkyō", 3)])
    (feat,) = squad.make_features([ex], bert_tok, max_seq_len=64)
    spans = feat.token_char_spans
    texts = [context[a:b] for a, b in spans if a >= 0]
    assert texts[:6] == ["In", "Tōkyō", "(", "東", "京", ")"]
    assert "«" in texts and "—" in texts and "¥" in texts
    assert _answer_text(ex, feat) == "Tōkyō"
    assert _pieces(bert_tok, feat)[feat.start_position] == "tokyo"


# ---------------------------------------------------------------------------
# Post-processing.

def _start_piece(feat, char):
    """Position of the context piece whose character span starts at `char`."""
    hits = np.flatnonzero(feat.token_char_spans[:, 0] == char)
    assert hits.size == 1, char
    return int(hits[0])


def _end_piece(feat, char):
    """Position of the context piece whose character span ends at `char`."""
    hits = np.flatnonzero(feat.token_char_spans[:, 1] == char)
    assert hits.size == 1, char
    return int(hits[0])


NEARBY = ("Built by Gustave Eiffel's company, the Tower stands in Paris, France, on the "
          "Champ de Mars; the café «Le Petit Pain» is nearby.")


@pytest.fixture(scope="module")
def nearby(bert_tok):
    """One question, its windows, and the window where "Paris" has its maximum context."""
    ex = SquadExample("q1", "", "Where does the Tower stand?", NEARBY,
                      [("Paris", NEARBY.index("Paris"))])
    feats = squad.make_features([ex], bert_tok, max_seq_len=32, doc_stride=6, max_query_len=16)
    paris = NEARBY.index("Paris")
    holding = [k for k, f in enumerate(feats) if paris in f.token_char_spans[:, 0]]
    owner = next(k for k in holding if feats[k].token_is_max_context[_start_piece(feats[k],
                                                                                  paris)])
    other = next(k for k in holding if k != owner)
    return ex, feats, owner, other


def _distract(feats, owner, other, how):
    """Logits scoring "Paris, France" 10 in the owner window, plus one higher-scoring
    distractor span that run_squad's rules must reject (or, for "control", accept)."""
    starts, ends = np.zeros((len(feats), 32)), np.zeros((len(feats), 32))
    own = feats[owner]
    starts[owner, _start_piece(own, NEARBY.index("Paris"))] = 5.0
    ends[owner, _end_piece(own, NEARBY.index("France") + 6)] = 5.0
    if how == "question":  # both ends on question pieces
        starts[owner, 2], ends[owner, 3] = 9.0, 9.0
    elif how == "end_before_start":  # ", on" .. "Tower": end before start
        starts[owner, _start_piece(own, NEARBY.index(", on"))] = 6.0
        ends[owner, _end_piece(own, NEARBY.index("Tower") + 5)] = 6.0
    elif how == "too_long":  # "Built ... Mars": over max_answer_len pieces
        starts[owner, _start_piece(own, 0)] = 6.0
        ends[owner, _end_piece(own, NEARBY.index("Mars") + 4)] = 6.0
    elif how in ("not_max_context", "control"):  # "Paris" alone, scored 16
        k = other if how == "not_max_context" else owner
        p = _start_piece(feats[k], NEARBY.index("Paris"))
        starts[k, p], ends[k, p] = 8.0, 8.0
    return starts, ends


@pytest.mark.parametrize("how", ["question", "end_before_start", "too_long", "not_max_context"])
def test_postprocess_rejects_spans_run_squad_rules_out(nearby, how):
    ex, feats, owner, other = nearby
    out = squad_answers.postprocess([ex], feats, *_distract(feats, owner, other, how),
                                    n_best_size=5, max_answer_len=6)
    assert out.predictions == {"q1": "Paris, France"}
    best = out.nbest["q1"][0]
    assert best["text"] == "Paris, France" and best["start_logit"] == best["end_logit"] == 5.0
    assert (best["start_char"], best["end_char"]) == (NEARBY.index("Paris"),
                                                      NEARBY.index("France") + 6)
    assert out.null_score_diff == {}


def test_postprocess_takes_the_best_span_and_keeps_original_casing(nearby):
    ex, feats, owner, other = nearby
    out = squad_answers.postprocess([ex], feats, *_distract(feats, owner, other, "control"),
                                    n_best_size=5)
    assert out.predictions == {"q1": "Paris"}
    texts = [c["text"] for c in out.nbest["q1"]]
    assert texts[:2] == ["Paris", "Paris, France"]
    assert len(set(texts)) == len(texts) <= 5
    assert math.isclose(sum(c["probability"] for c in out.nbest["q1"]), 1.0)
    starts, ends = _distract(feats, owner, other, "question")
    short = squad_answers.postprocess([ex], feats, starts, ends, max_answer_len=2)
    assert short.predictions["q1"] != "Paris, France"  # 4 pieces: over max_answer_len


def test_postprocess_answer_is_a_slice_of_the_original_context(bert_tok):
    ex = SquadExample("q1", "", "What is nearby?", NEARBY, [])
    (feat,) = squad.make_features([ex], bert_tok, max_seq_len=64)
    starts, ends = np.zeros((1, 64)), np.zeros((1, 64))
    starts[0, _start_piece(feat, NEARBY.index("café"))] = 3.0
    ends[0, _end_piece(feat, NEARBY.index("»") + 1)] = 3.0
    pieces = _pieces(bert_tok, feat)
    assert "cafe" in pieces and "«" in pieces  # lower-cased, accent-stripped pieces ...
    out = squad_answers.postprocess([ex], [feat], starts, ends)
    assert out.predictions == {"q1": "café «Le Petit Pain»"}  # ... original text


def test_postprocess_v2_null_score_difference_and_threshold(bert_tok):
    context = "The café «Le Petit Pain» opened on 3 May 1998."
    answerable = SquadExample("a", "", "When did it open?", context, [("3 May 1998", 35)])
    unanswerable = SquadExample("b", "", "Who closed it?", context, [], is_impossible=True)
    feats = squad.make_features([answerable, unanswerable], bert_tok, max_seq_len=48)
    assert len(feats) == 2
    starts, ends = np.zeros((2, 48)), np.zeros((2, 48))
    for k in (0, 1):
        starts[k, _start_piece(feats[k], context.index("3 May"))] = 4.0
        ends[k, _end_piece(feats[k], context.index("1998") + 4)] = 3.0
    starts[0, 0], ends[0, 0] = 1.0, 1.0   # null 2 < best 7: answer
    starts[1, 0], ends[1, 0] = 6.0, 5.0   # null 11 > best 7: no answer
    out = squad_answers.postprocess([answerable, unanswerable], feats, starts, ends, version="2.0")
    assert out.predictions == {"a": "3 May 1998", "b": ""}
    assert out.best_non_null == {"a": "3 May 1998", "b": "3 May 1998"}
    assert out.null_score_diff == {"a": pytest.approx(2.0 - 7.0), "b": pytest.approx(11.0 - 7.0)}
    assert "" in [c["text"] for c in out.nbest["a"]]
    lenient = squad_answers.postprocess([answerable, unanswerable], feats, starts, ends,
                                        version="2.0", null_threshold=5.0)
    assert lenient.predictions == {"a": "3 May 1998", "b": "3 May 1998"}


def test_postprocess_checks_logit_shapes(tiny_tok):
    ex = SquadExample("q1", "", "who ?", "the cat .", [("cat", 4)])
    feats = squad.make_features([ex], tiny_tok, max_seq_len=16)
    with pytest.raises(ValueError, match=r"must both be \[num_features=1, max_seq_len\]"):
        squad_answers.postprocess([ex], feats, np.zeros((2, 16)), np.zeros((2, 16)))
    with pytest.raises(ValueError, match="logits have 8 positions, features have 16"):
        squad_answers.postprocess([ex], feats, np.zeros((1, 8)), np.zeros((1, 8)))


def _oracle_logits(examples, feats, length):
    """Logits that point every window at the first gold answer (or [CLS] when none)."""
    starts, ends = np.zeros((len(feats), length)), np.zeros((len(feats), length))
    for k, f in enumerate(feats):
        ex = examples[f.example_index]
        if ex.is_impossible:
            starts[k, 0] = ends[k, 0] = 10.0
            continue
        text, char = ex.answers[0]
        starts[k, f.token_char_spans[:, 0] == char] = 10.0
        ends[k, f.token_char_spans[:, 1] == char + len(text)] = 10.0
    return starts, ends


@pytest.mark.parametrize("path,version", [(V1, "1.1"), (V2, "2.0")])
def test_oracle_logits_score_100_end_to_end(bert_tok, tmp_path, path, version):
    examples = squad.read_squad(path, version)
    feats = squad.make_features(examples, bert_tok, max_seq_len=48, doc_stride=12,
                                max_query_len=16)
    out = squad_answers.postprocess(examples, feats, *_oracle_logits(examples, feats, 48),
                                    version=version)
    assert set(out.predictions) == {e.qas_id for e in examples}
    result = squad_metrics.evaluate(squad.gold_answers(examples), out.predictions, version)
    assert result["exact_match"] == result["f1"] == 100.0
    squad_metrics.write_predictions(str(tmp_path / "predictions.json"), out.predictions)
    with open(tmp_path / "predictions.json", encoding="utf-8") as f:
        assert json.load(f) == out.predictions


# ---------------------------------------------------------------------------
# Metrics, against an independent implementation of the official scripts' rules.

def ref_normalize(text):
    """Lower, drop ASCII punctuation, drop the words a/an/the, single spaces.

    Written as a character scan: a word is a run of alphanumeric characters
    (or '_'), the same characters the official regex's \\b sees as a word.
    """
    kept = [c for c in text.lower()
            if not (33 <= ord(c) <= 126 and not c.isalnum())]  # ASCII punctuation
    out, run = [], []
    for c in kept + [" "]:
        if c.isalnum() or c == "_":
            run.append(c)
            continue
        word = "".join(run)
        out.append(" " if word in ("a", "an", "the") else word)
        run = []
        out.append(c)
    return " ".join("".join(out).split())


def ref_f1(pred, gold, v2=True):
    p, g = ref_normalize(pred).split(), ref_normalize(gold).split()
    if v2 and (not p or not g):
        return 1.0 if p == g else 0.0
    remaining = {}
    for t in g:
        remaining[t] = remaining.get(t, 0) + 1
    same = 0
    for t in p:
        if remaining.get(t, 0) > 0:
            remaining[t] -= 1
            same += 1
    return 0.0 if same == 0 else 2.0 * same / (len(p) + len(g))


def ref_scores(pred, golds, v2=True):
    if v2:
        golds = [g for g in golds if ref_normalize(g)] or [""]
    return (max(float(ref_normalize(pred) == ref_normalize(g)) for g in golds),
            max(ref_f1(pred, g, v2) for g in golds))


METRIC_CASES = [
    ("Gustave Eiffel", ["Gustave Eiffel", "the engineer Gustave Eiffel"]),
    ("the engineer", ["Gustave Eiffel", "the engineer Gustave Eiffel"]),
    ("«Le Petit Pain»", ["Le Petit Pain"]),
    ("Paris, France.", ["on the Champ de Mars in Paris, France", "Paris"]),
    ("An apple a day", ["the apple, a day!"]),
    ("¥500–¥800", ["¥500 – ¥800", "500 800"]),
    ("a–b an_the theatre", ["–b theatre", "a b"]),
    ("CAFÉ  naïve\tdécor", ["café naïve décor"]),
    ("dog dog dog", ["dog cat dog"]),
    ("", ["France"]),
    ("France", [""]),
    ("", ["", "the"]),
    ("the", ["a"]),
    ("x", []),
    ("", []),
]


def test_normalize_answer_matches_the_independent_rules():
    for pred, golds in METRIC_CASES:
        for text in [pred] + golds:
            assert squad_metrics.normalize_answer(text) == ref_normalize(text), text
    assert squad_metrics.normalize_answer("The  Cat's (big) hat!") == "cats big hat"
    assert ref_normalize(string.punctuation + "a b") == "b"


@pytest.mark.parametrize("pred,golds", METRIC_CASES)
def test_exact_match_and_f1_match_the_independent_rules(pred, golds):
    assert squad_metrics.best_scores(pred, golds, "2.0") == pytest.approx(ref_scores(pred, golds))
    if golds:
        assert squad_metrics.best_scores(pred, golds, "1.1") == pytest.approx(
            ref_scores(pred, golds, v2=False))


def test_v1_and_v2_differ_only_on_empty_answers():
    assert squad_metrics.f1_score("the", "a", "2.0") == 1.0   # both normalise to ""
    assert squad_metrics.f1_score("the", "a", "1.1") == 0.0
    assert squad_metrics.exact_match_score("the", "a") == 1.0
    with pytest.raises(ValueError, match="needs at least one gold answer"):
        squad_metrics.best_scores("x", [], "1.1")


def test_evaluate_v1_totals_on_the_fixture():
    gold = squad.gold_answers(squad.read_squad(V1, "1.1"))
    preds = {"eiffel-1": "Gustave Eiffel", "eiffel-2": "Paris, France", "eiffel-3": "1887",
             "eiffel-4": "La Dame de Fer", "eiffel-5": "the Chrysler", "cafe-1": "Le Petit",
             "cafe-2": "3 May 1998", "cafe-3": "red", "extra-id": "ignored"}  # cafe-4 missing
    result = squad_metrics.evaluate(gold, preds, "1.1")
    assert sorted(result) == ["exact_match", "f1"]
    scores = [ref_scores(preds[q], g, v2=False) if q in preds else (0.0, 0.0)
              for q, g in gold.items()]
    assert result["exact_match"] == pytest.approx(100 * sum(s[0] for s in scores) / 9)
    assert result["f1"] == pytest.approx(100 * sum(s[1] for s in scores) / 9)
    assert result["exact_match"] == pytest.approx(300 / 9)


def test_evaluate_v2_splits_has_answer_and_no_answer():
    gold = squad.gold_answers(squad.read_squad(V2, "2.0"))
    preds = {"norm-1": "France", "norm-2": "the 10th century", "norm-3": "", "norm-4": "Normandy",
             "norm-5": "Denmark, Iceland and Norway", "norm-6": "timber", "norm-7": ""}
    result = squad_metrics.evaluate(gold, preds, "2.0")
    assert sorted(result) == sorted(["exact_match", "f1", "total", "HasAns_exact", "HasAns_f1",
                                     "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total"])
    scores = {q: ref_scores(preds[q], g) for q, g in gold.items()}
    has = [q for q in gold if gold[q]]
    assert result["total"] == 7 and result["HasAns_total"] == 4 and result["NoAns_total"] == 3
    assert result["exact_match"] == pytest.approx(100 * sum(s[0] for s in scores.values()) / 7)
    assert result["f1"] == pytest.approx(100 * sum(s[1] for s in scores.values()) / 7)
    assert result["HasAns_f1"] == pytest.approx(100 * sum(scores[q][1] for q in has) / 4)
    assert result["NoAns_exact"] == pytest.approx(200 / 3)


def test_best_threshold_search_on_a_hand_made_case():
    gold = {"q1": ["Paris"], "q2": [], "q3": ["1887"], "q4": []}
    preds = {"q1": "Paris", "q2": "Lyon", "q3": "1900", "q4": "Nice"}
    na = {"q1": -3.0, "q2": -1.0, "q3": 0.5, "q4": 2.0}
    # Answer nothing: q2, q4 right = 2. Answer in increasing na order: q1 +1 -> 3 (best, at
    # -3.0), q2 -1 -> 2, q3 +0 -> 2, q4 -1 -> 1.
    result = squad_metrics.evaluate(gold, preds, "2.0", na_probs=na)
    assert result["best_exact"] == 75.0 and result["best_exact_thresh"] == -3.0
    assert result["best_f1"] == 75.0 and result["best_f1_thresh"] == -3.0
    assert result["exact_match"] == 25.0  # the predictions as given
    # The official --na-prob-thresh: q3, q4 (na > 0) become "", which is right for q4.
    thresholded = squad_metrics.evaluate(gold, preds, "2.0", na_probs=na, na_prob_thresh=0.0)
    assert thresholded["exact_match"] == 50.0 and thresholded["NoAns_exact"] == 50.0
    # When answering nothing is best, the threshold is 0.0.
    wrong = {q: "wrong" for q in gold}
    assert squad_metrics.find_best_threshold(
        wrong, {"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 0.0}, na,
        {q: bool(g) for q, g in gold.items()}) == (50.0, 0.0)
    with pytest.raises(ValueError, match=r"na_probs lacks 1 of 4 questions \(first: \['q4'\]\)"):
        squad_metrics.evaluate(gold, preds, "2.0", na_probs={k: na[k] for k in ("q1", "q2", "q3")})


def test_postprocess_null_differences_drive_the_threshold_search(bert_tok):
    examples = squad.read_squad(V2, "2.0")
    feats = squad.make_features(examples, bert_tok, max_seq_len=64, doc_stride=16)
    starts, ends = _oracle_logits(examples, feats, 64)
    # A model that leans to "no answer": score_null is 25 for answerable questions (best
    # span 20: difference 5) and 45 for unanswerable ones (best span 0: difference 45).
    starts[:, 0] += 25.0
    out = squad_answers.postprocess(examples, feats, starts, ends, version="2.0")
    gold = squad.gold_answers(examples)
    assert set(out.predictions.values()) == {""}
    assert out.null_score_diff == {q: 5.0 if gold[q] else 45.0 for q in gold}
    result = squad_metrics.evaluate(gold, out.best_non_null, "2.0",
                                    na_probs=out.null_score_diff)
    # The best spans, no threshold: right on the 4 answerable questions, and on norm-3 and
    # norm-4, whose best span "The" normalises to "" (the official rule scores it as empty).
    assert out.best_non_null["norm-3"] == out.best_non_null["norm-4"] == "The"
    assert result["exact_match"] == pytest.approx(600 / 7)
    assert result["best_exact"] == result["best_f1"] == 100.0
    assert result["best_exact_thresh"] == result["best_f1_thresh"] == 5.0
    rerun = squad_answers.postprocess(examples, feats, starts, ends, version="2.0",
                                      null_threshold=result["best_f1_thresh"])
    assert squad_metrics.evaluate(gold, rerun.predictions, "2.0")["exact_match"] == 100.0


def test_write_predictions_is_what_the_official_script_reads(tmp_path):
    path = tmp_path / "out" / "predictions.json"
    preds = {"q1": "Tōkyō «Le Petit Pain»", "q2": ""}
    squad_metrics.write_predictions(str(path), preds)
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == preds
    assert os.listdir(path.parent) == ["predictions.json"]  # no temporary file left behind
    with pytest.raises(ValueError, match=re.escape("must map string ids to answer strings")):
        squad_metrics.write_predictions(str(path), {"q1": None})
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == preds  # a failed write leaves the old file
