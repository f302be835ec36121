"""SQuAD v1.1 / v2.0 scoring, by the rules of the official evaluation scripts.

Plain Python (no TensorFlow, no NumPy), so tools that only score a
predictions.json load it in milliseconds.

- An answer is normalised by lower-casing, removing every ASCII punctuation
  character (`string.punctuation`), removing the words a/an/the, and
  collapsing whitespace.
- Exact match: normalised strings equal. F1: over normalised whitespace
  tokens, counted with multiplicity. Both take the max over gold answers.
- v2.0: gold answers that normalise to "" are dropped; a question with none
  left (unanswerable) is scored against "". F1 of an empty side is 1 when
  both are empty, else 0. v1.1 keeps every gold answer and gives F1 0 when
  no token is shared, even when both are empty -- the one place the two
  scripts differ.
- Totals are on the 0-100 scale. A question without a prediction scores 0
  (the v1.1 script's rule; the v2.0 script would fail on it).
- v2.0 with no-answer scores (`na_probs`: a probability, or BERT's null-score
  difference): `best_exact`/`best_f1` and their thresholds, by the v2.0
  script's search over the raw scores of the given predictions.
"""
from __future__ import annotations

import collections
import logging
import re
import string
from typing import Mapping, Optional, Sequence, Union

from tinybert_tf.files import write_json_atomic

logger = logging.getLogger(__name__)

VERSIONS = ("1.1", "2.0")
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def squad_version(version: Union[str, float]) -> str:
    """'1.1' or '2.0' from the spellings users write: 1.1, '2', 'v2.0', 'squad2.0', ..."""
    key = str(version).strip().lower().replace("squad", "").lstrip("v_-")
    key = {"1": "1.1", "2": "2.0"}.get(key, key)
    if key not in VERSIONS:
        raise ValueError(f"unknown SQuAD version {version!r}; use '1.1' or '2.0' "
                         f"(2.0 has unanswerable questions).")
    return key


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles (a/an/the), single spaces (the official rule)."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, gold: str) -> float:
    """1.0 when the normalised answers are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, version: Union[str, float] = "2.0") -> float:
    """Token F1 of the normalised answers (see the module doc for empty answers)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if squad_version(version) == "2.0" and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2.0 * precision * recall / (precision + recall)


def best_scores(prediction: str, golds: Sequence[str],
                version: Union[str, float] = "2.0") -> tuple[float, float]:
    """(exact match, F1) of one prediction: the max over its gold answers."""
    version = squad_version(version)
    if version == "2.0":
        golds = [g for g in golds if normalize_answer(g)] or [""]
    elif not golds:
        raise ValueError("a SQuAD 1.1 question needs at least one gold answer; score "
                         "unanswerable questions with version='2.0'.")
    return (max(exact_match_score(prediction, g) for g in golds),
            max(f1_score(prediction, g, version) for g in golds))


def find_best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float],
                        na_probs: Mapping[str, float],
                        has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """(best total on the 0-100 scale, its threshold): the official v2.0 search.

    Start from answering no question (every unanswerable one right); take the
    questions in increasing `na_probs` order and answer each in turn: an
    answerable one adds its raw score, an unanswerable one with a non-empty
    prediction loses 1. The threshold is the `na_probs` value of the question
    after which the running total peaked (first peak wins; 0.0 when answering
    nothing is best). Questions absent from `scores` are passed over.
    """
    if not scores:
        raise ValueError("no scores: nothing to search a threshold on.")
    current = best = sum(1 for q in scores if not has_answer[q])
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions.get(qid):
            current -= 1
        if current > best:
            best, threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), float(threshold)


def evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
             version: Union[str, float], na_probs: Optional[Mapping[str, float]] = None,
             na_prob_thresh: Optional[float] = None) -> dict[str, float]:
    """The official SQuAD totals.

    Args:
      gold: question id -> gold answer texts ([] = unanswerable, v2.0); see
        `tinybert_tf.data.squad.gold_answers`.
      predictions: question id -> answer text ("" = no answer); ids not in
        `gold` are ignored, gold ids without one score 0.
      version: "1.1" or "2.0".
      na_probs: v2.0, question id -> no-answer score (higher = more likely
        unanswerable), covering every gold id: adds the best-threshold search.
      na_prob_thresh: v2.0, answer "" where na_probs exceeds it before scoring
        (the official script's --na-prob-thresh, default 1.0 there); None
        scores the predictions as given.
    Returns:
      v1.1: `exact_match`, `f1`. v2.0: also `total`, `HasAns_exact`,
      `HasAns_f1`, `HasAns_total` (when any question is answerable),
      `NoAns_exact`, `NoAns_f1`, `NoAns_total` (when any is not), and with
      na_probs `best_exact`, `best_exact_thresh`, `best_f1`, `best_f1_thresh`.
      Scores are on the 0-100 scale, totals are counts.
    """
    version = squad_version(version)
    if not gold:
        raise ValueError("no gold questions to score.")
    missing = [q for q in gold if q not in predictions]
    if missing:
        logger.warning("%d of %d questions have no prediction and score 0; first: %s",
                       len(missing), len(gold), missing[:5])
    has_answer = {q: bool(golds) for q, golds in gold.items()}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for qid, golds in gold.items():
        if qid in predictions:
            exact_raw[qid], f1_raw[qid] = best_scores(predictions[qid], golds, version)
        else:
            exact_raw[qid] = f1_raw[qid] = 0.0
    if version == "1.1":
        return _totals(exact_raw, f1_raw, list(gold), "exact_match", "f1")
    if na_probs is not None:
        lacking = [q for q in gold if q not in na_probs]
        if lacking:
            raise ValueError(f"na_probs lacks {len(lacking)} of {len(gold)} questions (first: "
                             f"{lacking[:5]}); give a no-answer score for every question.")
    exact, f1 = exact_raw, f1_raw
    if na_probs is not None and na_prob_thresh is not None:
        exact, f1 = (_apply_threshold(s, na_probs, has_answer, na_prob_thresh)
                     for s in (exact_raw, f1_raw))
    out = _totals(exact, f1, list(gold), "exact_match", "f1")
    out["total"] = len(gold)
    for prefix, ids in (("HasAns", [q for q in gold if has_answer[q]]),
                        ("NoAns", [q for q in gold if not has_answer[q]])):
        if ids:
            out.update(_totals(exact, f1, ids, f"{prefix}_exact", f"{prefix}_f1"))
            out[f"{prefix}_total"] = len(ids)
    if na_probs is not None:
        preds = {q: predictions.get(q, "") for q in gold}
        out["best_exact"], out["best_exact_thresh"] = find_best_threshold(
            preds, exact_raw, na_probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = find_best_threshold(
            preds, f1_raw, na_probs, has_answer)
    return out


def _totals(exact: Mapping[str, float], f1: Mapping[str, float], ids: Sequence[str],
            exact_key: str, f1_key: str) -> dict[str, float]:
    return {exact_key: 100.0 * sum(exact[q] for q in ids) / len(ids),
            f1_key: 100.0 * sum(f1[q] for q in ids) / len(ids)}


def _apply_threshold(scores: Mapping[str, float], na_probs: Mapping[str, float],
                     has_answer: Mapping[str, bool], threshold: float) -> dict[str, float]:
    """Where na_probs > threshold the answer is "": 1 for unanswerable questions, else 0."""
    return {q: (float(not has_answer[q]) if na_probs[q] > threshold else s)
            for q, s in scores.items()}


def write_predictions(path: str, predictions: Mapping[str, str]) -> None:
    """predictions.json as the official scripts read it: {question id: answer text}.

    "" means no answer. Written atomically (a reader never sees half a file).
    """
    bad = [(q, a) for q, a in predictions.items() if not isinstance(q, str)
           or not isinstance(a, str)]
    if bad:
        raise ValueError(f"{path}: predictions must map string ids to answer strings; got "
                         f"{bad[:3]!r}.")
    write_json_atomic(path, dict(predictions))
