"""IOB2 tags: validation, entity extraction and entity-level precision / recall / F1.

A tag is "O" or "B-TYPE" / "I-TYPE". Two readings of a tag sequence:
- strict (default; seqeval's mode="strict" with the IOB2 scheme): an entity
  starts only at B-X and continues over the I-X that follow it; an I-X that
  does not continue an entity of type X (after O, after another type, or at the
  start of a sentence) belongs to no entity. A model that emits such a tag gets
  no credit for it.
- lenient (`strict=False`; what conlleval and seqeval's default mode report):
  such an I-X starts an entity of type X, as if it were B-X.
On valid IOB2 both agree. Scores are micro-averaged over the set of
(sentence, start, end, type) entities: precision = correct / predicted, recall =
correct / true, F1 their harmonic mean, 0.0 where a denominator is 0 (seqeval's
convention); all on the 0-1 scale like `metrics.py`. Token accuracy counts
matching tags over all words. NumPy-free: plain Python over tag strings.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

OUTSIDE = "O"


def split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'), 'I-PER' -> ('I', 'PER'), 'O' -> ('O', '').

    Anything else (IOBES 'S-PER', a bare 'PER', 'B-') is a ValueError.
    """
    if tag == OUTSIDE:
        return OUTSIDE, ""
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BI":
        return tag[0], tag[2:]
    raise ValueError(f"tag {tag!r} is not IOB2: expected O, B-TYPE or I-TYPE.")


def is_iob2_tag(tag: str) -> bool:
    """True for 'O', 'B-TYPE' and 'I-TYPE'."""
    return tag == OUTSIDE or (len(tag) > 2 and tag[1] == "-" and tag[0] in "BI")


def invalid_iob2(tags: Sequence[str]) -> list[int]:
    """Positions of the I-X tags that do not continue an entity of type X.

    Such a tag after O, after a tag of another type, or first in the sentence is
    not valid IOB2 (it is valid IOB1); conlleval reads it as a start.
    """
    bad, prev = [], OUTSIDE
    for i, tag in enumerate(tags):
        prefix, kind = split_tag(tag)
        if prefix == "I" and (prev == OUTSIDE or split_tag(prev)[1] != kind):
            bad.append(i)
        prev = tag
    return bad


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 tags (I-X starts an entity unless it follows X) -> IOB2 (B-X starts every one)."""
    out = list(tags)
    for i in invalid_iob2(out):
        out[i] = "B-" + out[i][2:]
    return out


def extract_entities(tags: Sequence[str], strict: bool = True) -> list[tuple[int, int, str]]:
    """Entities of one sentence as (start, end, type), end exclusive, in order.

    strict: only B-X starts an entity (see the module doc); False: also an I-X
    that does not continue one (conlleval).
    """
    parsed = [split_tag(t) for t in tags]
    out, i, n = [], 0, len(parsed)
    while i < n:
        prefix, kind = parsed[i]
        if prefix == "B" or (prefix == "I" and not strict):
            # A continuing I-X never reaches here: the inner loop consumes it.
            j = i + 1
            while j < n and parsed[j] == ("I", kind):
                j += 1
            out.append((i, j, kind))
            i = j
        else:
            i += 1
    return out


def _check_pairs(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]
                 ) -> None:
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} true and {len(pred_tags)} predicted sentences; "
                         f"score the same sentences.")
    for s, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {s}: {len(t)} true and {len(p)} predicted tags; give one "
                             f"prediction per word (fill words cut by truncation with 'O').")


def _ratio(a: int, b: int) -> float:
    return 0.0 if b == 0 else a / b


def _prf(correct: int, n_pred: int, n_true: int) -> dict[str, float]:
    p, r = _ratio(correct, n_pred), _ratio(correct, n_true)
    return {"precision": p, "recall": r, "f1": 0.0 if p + r == 0 else 2 * p * r / (p + r)}


def token_accuracy(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]
                   ) -> float:
    """Fraction of words whose predicted tag equals the true tag, over all sentences."""
    _check_pairs(true_tags, pred_tags)
    total = sum(len(t) for t in true_tags)
    if total == 0:
        raise ValueError("no words to score: every sentence is empty.")
    same = sum(a == b for t, p in zip(true_tags, pred_tags) for a, b in zip(t, p))
    return same / total


def entity_report(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]],
                  strict: bool = True) -> dict:
    """Entity-level scores of predicted against true tag sequences (one list per sentence).

    Returns {"precision", "recall", "f1", "accuracy" (token accuracy): float,
    "num_true", "num_pred", "num_correct": int, "per_type": {TYPE: {"precision",
    "recall", "f1": float, "support": int (true entities)}}}; per_type covers
    every type that is true or predicted, sorted by name.
    """
    accuracy = token_accuracy(true_tags, pred_tags)
    true_set, pred_set = set(), set()
    for s, (t, p) in enumerate(zip(true_tags, pred_tags)):
        true_set.update((s, a, b, k) for a, b, k in extract_entities(t, strict))
        pred_set.update((s, a, b, k) for a, b, k in extract_entities(p, strict))
    correct = true_set & pred_set
    out = dict(_prf(len(correct), len(pred_set), len(true_set)), accuracy=accuracy,
               num_true=len(true_set), num_pred=len(pred_set), num_correct=len(correct))
    n_true, n_pred = Counter(e[3] for e in true_set), Counter(e[3] for e in pred_set)
    n_ok = Counter(e[3] for e in correct)
    per_type = {kind: dict(_prf(n_ok[kind], n_pred[kind], n_true[kind]), support=n_true[kind])
                for kind in sorted(set(n_true) | set(n_pred))}
    out["per_type"] = per_type
    return out


def compute_metrics(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]],
                    strict: bool = True) -> dict[str, float]:
    """The headline figures: entity precision, recall, f1 (micro) and token accuracy."""
    report = entity_report(true_tags, pred_tags, strict)
    return {k: report[k] for k in ("precision", "recall", "f1", "accuracy")}
