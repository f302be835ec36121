"""SQuAD v1.1 / v2.0 question answering data: read the official files, make windows.

Two steps, each a public function, following the rules of BERT's
`run_squad.py` (the recipe TinyBERT's Appendix B uses for its SQuAD numbers):

1. `read_squad` reads the official JSON layout (data -> paragraphs -> context,
   qas -> id, question, answers, is_impossible) into `SquadExample`s. Malformed
   input raises one `DataError` naming the file, the question id or JSON path,
   and the fix. For training, a question whose answer text is not found at its
   `answer_start` (after BERT's whitespace normalisation) is skipped and
   counted, as run_squad does; more than `max_skipped_fraction` (1 %) of them
   means the offsets do not belong to these contexts, which is an error.
   Evaluation data keeps every question and every gold answer.
2. `make_features` packs `[CLS] question [SEP] context-window [SEP]`: the
   question cut to `max_query_len` pieces, the context cut into windows whose
   starts are `doc_stride` pieces apart (BERT's meaning of the stride: the
   step, not the overlap). Answer characters map to whitespace words and then
   to word pieces, narrowed by BERT's `_improve_answer_span`; a window that
   does not hold the whole answer, and an unanswerable question, point both
   positions at [CLS] (0). Each feature keeps, per piece, the character span
   it covers in the context and whether this window gives it the most context
   (BERT's `_check_is_max_context`).

The third step, logits of the windows -> answer texts, is `squad_answers.postprocess`.
Scoring (the official EM/F1) lives in `squad_metrics`, which needs no
TensorFlow; `gold_answers` gives it the gold texts of the examples.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data.examples import DataError, Examples
from tinybert_tf.data.squad_metrics import VERSIONS, squad_version
from tinybert_tf.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# run_squad's `is_whitespace`: the characters that separate context "words".
_WHITESPACE = (ord(" "), ord("\t"), ord("\r"), ord("\n"), 0x202F)

_LAYOUT = ("the official SQuAD layout is {\"version\": ..., \"data\": [{\"title\": ..., "
           "\"paragraphs\": [{\"context\": ..., \"qas\": [{\"id\": ..., \"question\": ..., "
           "\"answers\": [{\"text\": ..., \"answer_start\": ...}]%s}]}]}]}")
_REQUIRED = object()  # `_Reader.get` default: the key must be present
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "an integer",
               float: "a number", bool: "a boolean", type(None): "null"}


@dataclasses.dataclass
class SquadExample:
    """One question on one context.

    answers: every gold answer as (text, character offset in `context`); the
    first is the one training uses. Empty for an unanswerable (v2.0) question.
    """
    qas_id: str
    title: str
    question: str
    context: str
    answers: list[tuple[str, int]]
    is_impossible: bool = False

    # The fields every task example has (`data.examples.Example`), so code that
    # handles any task's examples (the export stage's dev texts) reads these too.
    @property
    def text_a(self) -> str:
        """The question."""
        return self.question

    @property
    def text_b(self) -> str:
        """The context."""
        return self.context

    @property
    def label(self) -> None:
        """None: answers are spans of the context, not labels (see `answers`)."""
        return None


@dataclasses.dataclass
class SquadFeature:
    """One window of one question: model inputs, labels and what post-processing needs.

    input_word_ids, input_mask, input_type_ids: int32 [max_seq_len].
    start_position, end_position: piece indices of the answer in this window;
      0 ([CLS]) when the window does not hold the whole answer or there is none.
    token_char_spans: int32 [max_seq_len, 2], the [start, end) character span
      of each context piece in the example's context; -1 for [CLS], question,
      [SEP] and padding positions.
    token_is_max_context: bool [max_seq_len], True for a context piece when no
      other window of the question gives it more surrounding context.
    """
    example_index: int
    qas_id: str
    window_index: int
    input_word_ids: np.ndarray
    input_mask: np.ndarray
    input_type_ids: np.ndarray
    start_position: int
    end_position: int
    token_char_spans: np.ndarray
    token_is_max_context: np.ndarray


# ---------------------------------------------------------------------------
# Reading.

def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


class _Reader:
    """Walks one SQuAD JSON document, raising `DataError` at the first bad node."""

    def __init__(self, path: str, version: str):
        self.path = path
        self.version = version
        self.layout = _LAYOUT % (", \"is_impossible\": ..." if version == "2.0" else "")

    def at(self, loc: str, qid: Optional[str] = None) -> str:
        if qid is None:
            return f"{self.path}: {loc}" if loc else self.path
        return f"{self.path}: question id {qid!r} ({loc})"

    def get(self, node: Any, key: str, kind: type, loc: str, qid: Optional[str] = None,
            default: Any = _REQUIRED) -> Any:
        if not isinstance(node, dict):
            raise DataError(f"{self.at(loc, qid)}: is {_json_type(node)}, expected an object; "
                            f"{self.layout}.")
        if key not in node:
            if default is not _REQUIRED:
                return default
            raise DataError(f"{self.at(loc, qid)}: missing key '{key}'; {self.layout}.")
        value = node[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise DataError(f"{self.at(loc, qid)}: '{key}' is {_json_type(value)}, expected "
                            f"{_JSON_TYPES[kind]}; {self.layout}.")
        return value

    def text(self, node: Any, key: str, loc: str, qid: Optional[str] = None) -> str:
        value = self.get(node, key, str, loc, qid)
        if not value.strip():
            raise DataError(f"{self.at(loc, qid)}: '{key}' is empty; give the "
                            f"{'paragraph text' if key == 'context' else key} or drop the "
                            f"{'paragraph' if key == 'context' else 'question'}.")
        return self.utf8(value, key, loc, qid)

    def utf8(self, value: str, key: str, loc: str, qid: Optional[str]) -> str:
        """`value`, unless it holds a lone surrogate (a bad \\u escape) the tokenizer can't take."""
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DataError(f"{self.at(loc, qid)}: '{key}' holds an unpaired surrogate escape "
                            f"at character {e.start}; fix the \\u escape in the file.") from None
        return value


def _load_json(path: str) -> Any:
    if not tf.io.gfile.exists(path):
        raise DataError(f"{path}: file not found; give the SQuAD JSON file (such as "
                        f"train-v1.1.json or dev-v2.0.json).")
    if tf.io.gfile.isdir(path):
        raise DataError(f"{path}: is a directory; give the SQuAD JSON file inside it.")
    with tf.io.gfile.GFile(path, "rb") as f:
        raw = f.read()
    bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte-order mark: dropped
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = bom + e.start  # counted from the file's first byte
        raise DataError(f"{path}: invalid UTF-8 at byte {at} "
                        f"({raw[max(0, at - 10):at + 10]!r}); SQuAD files are UTF-8 "
                        f"JSON: {files.reencode_hint(raw)}.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); a SQuAD "
                        f"file is one JSON object with a 'data' array.") from None


def read_squad(path: str, version: Union[str, float], is_training: bool = False,
               max_skipped_fraction: float = 0.01) -> Examples:
    """`SquadExample`s of an official SQuAD v1.1 / v2.0 JSON file (any tf.io.gfile path).

    Args:
      path: the JSON file.
      version: "1.1" or "2.0" (see `squad_version` for accepted spellings).
        v1.1 questions must have answers; v2.0 questions are unanswerable when
        `is_impossible` is true (or, with no `is_impossible` key, when
        `answers` is empty).
      is_training: skip (and count) questions whose first answer's text is not
        at its `answer_start` after whitespace normalisation, as run_squad
        does. Evaluation (False) keeps every question and gold answer.
      max_skipped_fraction: more skipped training questions than this fraction
        of all raises `DataError`.
    Returns:
      `Examples` (a list of `SquadExample`, in file order) with `.source` and
      `.skipped` (the number of skipped training questions).
    """
    return parse_squad(_load_json(path), path, version, is_training, max_skipped_fraction)


def parse_squad(doc: Any, path: str, version: Union[str, float], is_training: bool = False,
                max_skipped_fraction: float = 0.01) -> Examples:
    """`read_squad` of a document already parsed from JSON; `path` names it in errors."""
    version = squad_version(version)
    r = _Reader(path, version)
    if not isinstance(doc, dict):
        raise DataError(f"{path}: the top level is {_json_type(doc)}, expected an object; "
                        f"{r.layout}.")
    declared = str(doc.get("version", "")).lstrip("v")
    if declared in VERSIONS and declared != version:
        logger.warning("%s: the file says version %s, read as SQuAD %s.", path, declared, version)
    out: list[SquadExample] = []
    seen: dict[str, str] = {}
    skipped: list[str] = []
    for ai, article in enumerate(r.get(doc, "data", list, "the top level")):
        title = r.get(article, "title", str, f"data[{ai}]", default="")
        paragraphs = r.get(article, "paragraphs", list, f"data[{ai}]")
        for pi, para in enumerate(paragraphs):
            ploc = f"data[{ai}].paragraphs[{pi}]"
            context = r.text(para, "context", ploc)
            words = None
            for qi, qa in enumerate(r.get(para, "qas", list, ploc)):
                qloc = f"{ploc}.qas[{qi}]"
                ex = _read_question(r, qa, qloc, title, context)
                if ex.qas_id in seen:
                    raise DataError(f"{r.at(qloc, ex.qas_id)}: the id is used twice (first at "
                                    f"{seen[ex.qas_id]}); question ids must be unique because "
                                    f"predictions are keyed by id.")
                seen[ex.qas_id] = qloc
                if is_training and not ex.is_impossible:
                    words = words if words is not None else _split_words(context)
                    text, start = ex.answers[0]
                    if not _answer_matches(context, words, text, start):
                        skipped.append(ex.qas_id)
                        continue
                out.append(ex)
    total = len(seen)
    if not total:
        raise DataError(f"{path}: no questions; {r.layout}.")
    if skipped:
        first = ", ".join(repr(q) for q in skipped[:5])
        if len(skipped) > max_skipped_fraction * total:
            raise DataError(
                f"{path}: {len(skipped)} of {total} training questions "
                f"({100.0 * len(skipped) / total:.2f}%) have an answer text that is not at its "
                f"answer_start (after whitespace normalisation), more than the "
                f"{100.0 * max_skipped_fraction:g}% run_squad tolerates; first: {first}. The "
                f"answer_start values probably index another version of the contexts: fix "
                f"them (they count characters, not bytes, from 0).")
        logger.warning("%s: skipped %d of %d training questions whose answer text is not at "
                       "its answer_start; first: %s", path, len(skipped), total, first)
    return Examples(out, source=path, skipped=len(skipped))


def _read_question(r: _Reader, qa: Any, loc: str, title: str, context: str) -> SquadExample:
    raw_id = qa.get("id") if isinstance(qa, dict) else None
    # Some converted datasets use integer ids; they are written back as strings.
    qid = str(raw_id) if isinstance(raw_id, int) and not isinstance(raw_id, bool) \
        else r.get(qa, "id", str, loc)
    question = r.text(qa, "question", loc, qid)
    flag = r.get(qa, "is_impossible", bool, loc, qid, default=None)
    if r.version == "1.1" and flag:
        raise DataError(f"{r.at(loc, qid)}: is_impossible is true, but SQuAD 1.1 has no "
                        f"unanswerable questions; read the file as version 2.0.")
    answers_node = r.get(qa, "answers", list, loc, qid,
                         default=[] if (r.version == "2.0" and flag) else _REQUIRED)
    answers = []
    for k, ans in enumerate(answers_node):
        aloc = f"{loc}.answers[{k}]"
        text = r.utf8(r.get(ans, "text", str, aloc, qid), "text", aloc, qid)
        start = r.get(ans, "answer_start", int, aloc, qid)
        if not text.strip():
            raise DataError(f"{r.at(aloc, qid)}: the answer text is empty; give the answer "
                            f"or, in SQuAD 2.0, mark the question is_impossible with no answers.")
        if start < 0 or start + len(text) > len(context):
            raise DataError(
                f"{r.at(aloc, qid)}: the answer {text[:40]!r} at answer_start {start} "
                f"(ending at character {start + len(text)}) lies outside the "
                f"{len(context)}-character context; answer_start counts characters of the "
                f"context (not bytes) from 0: fix it.")
        answers.append((text, start))
    if r.version == "1.1":
        impossible = False
        if not answers:
            raise DataError(f"{r.at(loc, qid)}: no answers; every SQuAD 1.1 question needs one "
                            f"(read the file as version 2.0 for unanswerable questions).")
    else:
        impossible = (not answers) if flag is None else flag
        if impossible and answers:
            raise DataError(f"{r.at(loc, qid)}: is_impossible is true but the question has "
                            f"{len(answers)} answer(s); move them to 'plausible_answers' or "
                            f"set is_impossible to false.")
        if not impossible and not answers:
            raise DataError(f"{r.at(loc, qid)}: is_impossible is false but 'answers' is empty; "
                            f"add the answer or set is_impossible to true.")
    return SquadExample(qas_id=qid, title=title, question=question, context=context,
                        answers=answers, is_impossible=impossible)


def gold_answers(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
    """qas_id -> gold answer texts ([] for unanswerable): the input of `squad_metrics`."""
    return {ex.qas_id: [text for text, _ in ex.answers] for ex in examples}


# ---------------------------------------------------------------------------
# Characters -> whitespace words -> word pieces.

@dataclasses.dataclass(frozen=True)
class _Words:
    """The whitespace-separated words of a context (run_squad's doc_tokens).

    starts, ends: int64 [W], each word's [start, end) characters.
    char_to_word: int64 [C], the word holding each character; -1 on whitespace.
    """
    starts: np.ndarray
    ends: np.ndarray
    char_to_word: np.ndarray


def _split_words(context: str) -> _Words:
    codes = np.frombuffer(context.encode("utf-32-le"), dtype="<u4")
    space = np.isin(codes, _WHITESPACE)
    prev_space = np.concatenate([[True], space[:-1]])
    next_space = np.concatenate([space[1:], [True]])
    starts = np.flatnonzero(~space & prev_space)
    ends = np.flatnonzero(~space & next_space) + 1
    char_to_word = np.cumsum(~space & prev_space) - 1
    char_to_word[space] = -1
    return _Words(starts, ends, char_to_word)


def _answer_words(words: _Words, text: str, start: int) -> Optional[tuple[int, int]]:
    """First and last word of the answer's characters (whitespace at its ends ignored)."""
    first, last = start, start + len(text) - 1
    c2w = words.char_to_word
    if first < 0 or last >= c2w.size:
        return None
    while first <= last and c2w[first] < 0:
        first += 1
    while last >= first and c2w[last] < 0:
        last -= 1
    if first > last:
        return None
    return int(c2w[first]), int(c2w[last])


def _answer_matches(context: str, words: _Words, text: str, start: int) -> bool:
    """run_squad's training check: the answer's words, joined by single spaces, hold the
    answer text with its whitespace collapsed the same way."""
    span = _answer_words(words, text, start)
    if span is None:
        return False
    actual = " ".join(context[words.starts[w]:words.ends[w]] for w in range(span[0], span[1] + 1))
    return " ".join(text.split()) in actual


@dataclasses.dataclass(frozen=True)
class _ContextPieces:
    """A context's word pieces.

    ids: int32 [P]; char_starts, char_ends: int64 [P] ([start, end) characters);
    piece_to_word: int64 [P]; word_to_piece: int64 [W + 1], the first piece of
    each word (a word without pieces points at the next word's first piece).
    """
    words: _Words
    ids: np.ndarray
    char_starts: np.ndarray
    char_ends: np.ndarray
    piece_to_word: np.ndarray
    word_to_piece: np.ndarray


def _byte_to_char(text: str) -> np.ndarray:
    """int64 [bytes + 1]: the character index of each UTF-8 byte; the last entry = len(text)."""
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    lead = (raw & 0xC0) != 0x80  # not a continuation byte: a character starts here
    return np.concatenate([np.cumsum(lead) - 1, [len(text)]]).astype(np.int64)


def _ragged_rows(ragged: tf.RaggedTensor) -> list[np.ndarray]:
    values, splits = ragged.flat_values.numpy(), ragged.row_splits.numpy()
    return [values[a:b] for a, b in zip(splits[:-1], splits[1:])]


def _piece_ids(tokenizer: Tokenizer, texts: Sequence[str], batch_size: int) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for i in range(0, len(texts), batch_size):
        out.extend(_ragged_rows(tokenizer.tokenize(list(texts[i:i + batch_size]))))
    return out


def _context_pieces(tokenizer: Tokenizer, contexts: Sequence[str],
                    batch_size: int) -> list[_ContextPieces]:
    out: list[_ContextPieces] = []
    for i in range(0, len(contexts), batch_size):
        chunk = list(contexts[i:i + batch_size])
        ids, starts, ends = (_ragged_rows(t) for t in tokenizer.tokenize_with_offsets(chunk))
        for context, row_ids, b0, b1 in zip(chunk, ids, starts, ends):
            b2c = _byte_to_char(context)
            words = _split_words(context)
            c0, c1 = b2c[b0], b2c[b1]
            p2w = words.char_to_word[c0] if c0.size else np.zeros(0, np.int64)
            if p2w.size and p2w.min() < 0:  # a piece starting on run_squad whitespace
                p2w = np.maximum.accumulate(np.maximum(p2w, 0))
            w2p = np.searchsorted(p2w, np.arange(words.starts.size + 1), side="left")
            out.append(_ContextPieces(words, row_ids.astype(np.int32), c0, c1, p2w, w2p))
    return out


def _improve_answer_span(doc_ids: np.ndarray, first: int, last: int,
                         answer_ids: np.ndarray) -> tuple[int, int]:
    """run_squad's `_improve_answer_span`: the first sub-span of [first, last] whose pieces
    equal the answer text's own pieces (e.g. "1895" inside the word "(1895-1943)")."""
    target = answer_ids.tolist()
    n = len(target)
    if n == 0:
        return first, last
    window = doc_ids[first:last + 1].tolist()
    for s in range(0, len(window) - n + 1):
        if window[s:s + n] == target:
            return first + s, first + s + n - 1
    return first, last


def _answer_pieces(ex: SquadExample, cp: _ContextPieces,
                   answer_ids: Optional[np.ndarray]) -> Optional[tuple[int, int]]:
    """First and last context piece of the example's training answer, or None."""
    if ex.is_impossible or not ex.answers:
        return None
    text, start = ex.answers[0]
    span = _answer_words(cp.words, text, start)
    if span is None:
        if start < 0 or start + len(text) > len(ex.context):
            raise ValueError(f"question {ex.qas_id!r}: answer_start {start} of {text[:40]!r} "
                             f"lies outside its {len(ex.context)}-character context.")
        return None
    first = int(cp.word_to_piece[span[0]])
    last = int(cp.word_to_piece[span[1] + 1]) - 1
    if last < first:  # the answer's words have no pieces (control characters only)
        return None
    return _improve_answer_span(cp.ids, first, last, answer_ids)


def _doc_windows(n_pieces: int, max_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window; starts `doc_stride` apart, the last reaches the end.

    A context with no pieces still gets one empty window, so every question
    has a feature (and a prediction).
    """
    spans, start = [], 0
    while True:
        length = min(n_pieces - start, max_doc)
        spans.append((start, length))
        if start + length >= n_pieces:
            return spans
        start += min(length, doc_stride)


def _max_context_window(spans: Sequence[tuple[int, int]], n_pieces: int) -> np.ndarray:
    """int64 [P]: for each piece, the window where it has the most context.

    run_squad's `_check_is_max_context`: score = min(pieces left, pieces right)
    + 0.01 * window length; the earliest window wins ties.
    """
    pos = np.arange(n_pieces)
    best = np.full(n_pieces, -1, np.int64)
    best_score = np.full(n_pieces, -np.inf)
    for k, (start, length) in enumerate(spans):
        inside = (pos >= start) & (pos < start + length)
        score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
        better = inside & (score > best_score)
        best[better] = k
        best_score[better] = score[better]
    return best


def make_features(examples: Sequence[SquadExample], tokenizer: Tokenizer,
                  max_seq_len: int = 384, doc_stride: int = 128, max_query_len: int = 64,
                  batch_size: int = 256) -> list[SquadFeature]:
    """BERT's SQuAD features: one per (question, context window), in example order.

    Args:
      examples: from `read_squad` (or built by hand).
      tokenizer: the model's `Tokenizer` (its vocab and lower_case).
      max_seq_len: packed length L of every feature.
      doc_stride: pieces between the starts of consecutive windows (run_squad's
        meaning); an answer is whole in some window when it is at most
        max_doc - doc_stride + 1 pieces long, max_doc = L - 3 - question pieces.
      max_query_len: question pieces kept (the first ones).
      batch_size: strings per tokenizer call.
    Returns:
      `SquadFeature`s; `feature_arrays` stacks them for the model. Positions
      come from the first gold answer whenever there is one, so evaluation
      features carry them too (for a dev loss); postprocess ignores them.
    """
    max_seq_len, doc_stride, max_query_len = int(max_seq_len), int(doc_stride), int(max_query_len)
    if max_query_len < 1 or doc_stride < 1:
        raise ValueError(f"max_query_len ({max_query_len}) and doc_stride ({doc_stride}) must "
                         f"be >= 1.")
    contexts = list(dict.fromkeys(ex.context for ex in examples))
    pieces = dict(zip(contexts, _context_pieces(tokenizer, contexts, batch_size)))
    questions = _piece_ids(tokenizer, [ex.question for ex in examples], batch_size)
    trained = [i for i, ex in enumerate(examples) if ex.answers and not ex.is_impossible]
    answer_ids = dict(zip(trained, _piece_ids(
        tokenizer, [examples[i].answers[0][0] for i in trained], batch_size)))
    features: list[SquadFeature] = []
    for i, ex in enumerate(examples):
        cp = pieces[ex.context]
        answer = _answer_pieces(ex, cp, answer_ids.get(i))
        query = questions[i][:max_query_len]
        if max_seq_len - len(query) - 3 < 1:
            raise ValueError(
                f"question {ex.qas_id!r}: max_seq_len={max_seq_len} leaves no room for context "
                f"after its {len(query)} question pieces (max_query_len={max_query_len}), "
                f"[CLS] and two [SEP]; lower max_query_len or raise max_seq_len "
                f"(BERT: 64 and 384).")
        features.extend(_example_features(i, ex, query, cp, answer, tokenizer, max_seq_len,
                                          doc_stride))
    return features


def _example_features(index: int, ex: SquadExample, query: np.ndarray, cp: _ContextPieces,
                      answer: Optional[tuple[int, int]], tokenizer: Tokenizer,
                      max_seq_len: int, doc_stride: int) -> list[SquadFeature]:
    offset = len(query) + 2  # [CLS] question [SEP]
    spans = _doc_windows(cp.ids.size, max_seq_len - offset - 1, doc_stride)
    best = _max_context_window(spans, cp.ids.size)
    out = []
    for k, (start, length) in enumerate(spans):
        end = offset + length  # the final [SEP]
        ids = np.full(max_seq_len, tokenizer.pad_id, np.int32)
        ids[0], ids[1:offset - 1], ids[offset - 1] = tokenizer.cls_id, query, tokenizer.sep_id
        ids[offset:end], ids[end] = cp.ids[start:start + length], tokenizer.sep_id
        mask = np.zeros(max_seq_len, np.int32)
        mask[:end + 1] = 1
        type_ids = np.zeros(max_seq_len, np.int32)
        type_ids[offset:end + 1] = 1
        char_spans = np.full((max_seq_len, 2), -1, np.int32)
        char_spans[offset:end, 0] = cp.char_starts[start:start + length]
        char_spans[offset:end, 1] = cp.char_ends[start:start + length]
        is_max = np.zeros(max_seq_len, bool)
        is_max[offset:end] = best[start:start + length] == k
        s_pos = e_pos = 0
        if answer is not None and answer[0] >= start and answer[1] < start + length:
            s_pos, e_pos = answer[0] - start + offset, answer[1] - start + offset
        out.append(SquadFeature(
            example_index=index, qas_id=ex.qas_id, window_index=k, input_word_ids=ids,
            input_mask=mask, input_type_ids=type_ids, start_position=s_pos, end_position=e_pos,
            token_char_spans=char_spans, token_is_max_context=is_max))
    return out


def feature_arrays(features: Sequence[SquadFeature]) -> dict[str, np.ndarray]:
    """Stacked model inputs and labels for `tf.data` / `Model.fit`.

    Returns `input_word_ids`, `input_mask`, `input_type_ids` (int32 [N, L]) and
    `start_positions`, `end_positions`, `example_index` (int32 [N]).
    """
    if not features:
        raise ValueError("no features to stack: the example list was empty.")
    return {
        "input_word_ids": np.stack([f.input_word_ids for f in features]),
        "input_mask": np.stack([f.input_mask for f in features]),
        "input_type_ids": np.stack([f.input_type_ids for f in features]),
        "start_positions": np.array([f.start_position for f in features], np.int32),
        "end_positions": np.array([f.end_position for f in features], np.int32),
        "example_index": np.array([f.example_index for f in features], np.int32),
    }
