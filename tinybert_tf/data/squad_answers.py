"""SQuAD answers from a model's logits: BERT's n-best post-processing.

The third step after `squad.read_squad` and `squad.make_features`: `postprocess`
turns the start/end logits of all windows of each question into an n-best
list and the answer text, by the rules of BERT's `run_squad.py`. The text is a
character slice of the original context between the offsets of the start and
end pieces (offsets from tensorflow-text's `tokenize_with_offsets`, kept per
window in `SquadFeature.token_char_spans`), so it keeps the context's casing,
accents and punctuation; BERT's `get_final_text` re-aligns a detokenised
string to reach the same slice, which offsets make unnecessary.

For v2.0 each question also gets its null-score difference (score_null - best
non-null score), which the null threshold is compared with; scoring and the
threshold search live in `squad_metrics`, the chosen threshold in
`tasks.span`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence, Union

import numpy as np

from tinybert_tf.data.squad import SquadExample, SquadFeature
from tinybert_tf.data.squad_metrics import squad_version


@dataclasses.dataclass
class SquadPredictions:
    """What `postprocess` returns, each keyed by question id.

    predictions: the answer text, what predictions.json holds; "" = no answer
      (v2.0 over the threshold, or no valid span at all).
    best_non_null: the best non-empty span's text, before the v2.0 threshold
      (pass it, with `null_score_diff`, to the best-threshold search).
    null_score_diff: v2.0 only ({} for v1.1): score_null - best non-null
      score, the value compared with `null_threshold` (BERT's null_odds.json);
      +inf when no valid span exists.
    nbest: up to n_best_size candidates, best first, each {"text",
      "probability", "start_logit", "end_logit", "start_char", "end_char"}
      (characters of the context, end exclusive; -1 for the empty answer).
    """
    predictions: dict[str, str]
    best_non_null: dict[str, str]
    null_score_diff: dict[str, float]
    nbest: dict[str, list[dict[str, Any]]]


def _top(logits: np.ndarray, n: int) -> np.ndarray:
    return np.argsort(-logits, kind="stable")[:n]


def _softmax(scores: Sequence[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def postprocess(examples: Sequence[SquadExample], features: Sequence[SquadFeature],
                start_logits: np.ndarray, end_logits: np.ndarray, n_best_size: int = 20,
                max_answer_len: int = 30, version: Union[str, float] = "1.1",
                null_threshold: float = 0.0) -> SquadPredictions:
    """Answer text per question from the logits of all its windows (run_squad's rules).

    Args:
      examples, features: as given to / returned by `make_features`.
      start_logits, end_logits: float [num_features, max_seq_len], row i for features[i].
      n_best_size: start and end candidates per window, and n-best entries kept.
      max_answer_len: longest answer in pieces.
      version: "2.0" adds the empty answer, scored start_logit[0] + end_logit[0]
        at [CLS] (the lowest over the question's windows).
      null_threshold: v2.0 answers "" when score_null - best non-null score
        exceeds it.
    A span counts when both ends are context pieces, end >= start, it is at most
    `max_answer_len` pieces long and its window gives the start piece the most
    context. Only examples with features get a prediction.
    """
    version = squad_version(version)
    start_logits = np.asarray(start_logits, np.float64)
    end_logits = np.asarray(end_logits, np.float64)
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2 \
            or start_logits.shape[0] != len(features):
        raise ValueError(f"start_logits {start_logits.shape} and end_logits {end_logits.shape} "
                         f"must both be [num_features={len(features)}, max_seq_len].")
    if features and start_logits.shape[1] != features[0].input_word_ids.shape[0]:
        raise ValueError(f"logits have {start_logits.shape[1]} positions, features have "
                         f"{features[0].input_word_ids.shape[0]}: use the same max_seq_len.")
    by_example: dict[int, list[int]] = {}
    for fi, feat in enumerate(features):
        if not 0 <= feat.example_index < len(examples):
            raise ValueError(f"feature {fi} refers to example {feat.example_index}, but there "
                             f"are {len(examples)}: pass the examples the features came from.")
        by_example.setdefault(feat.example_index, []).append(fi)
    out = SquadPredictions({}, {}, {}, {})
    for ei in sorted(by_example):
        ex = examples[ei]
        nbest, score_null = _nbest(ex, [features[i] for i in by_example[ei]],
                                   start_logits[by_example[ei]], end_logits[by_example[ei]],
                                   n_best_size, max_answer_len, version == "2.0")
        best = next((c for c in nbest if c["start_char"] >= 0), None)
        best_text = best["text"] if best else ""
        out.nbest[ex.qas_id] = nbest
        out.best_non_null[ex.qas_id] = best_text
        if version == "2.0":
            diff = (score_null - best["start_logit"] - best["end_logit"]) if best else math.inf
            out.null_score_diff[ex.qas_id] = float(diff)
            out.predictions[ex.qas_id] = "" if diff > null_threshold else best_text
        else:
            out.predictions[ex.qas_id] = best_text
    return out


def _nbest(ex: SquadExample, feats: Sequence[SquadFeature], starts: np.ndarray,
           ends: np.ndarray, n_best_size: int, max_answer_len: int,
           with_null: bool) -> tuple[list[dict[str, Any]], float]:
    """The n-best list of one question (deduplicated by text, best first) and score_null."""
    cands = []  # (score, start_logit, end_logit, start_char, end_char); -1 chars = empty
    score_null, null_logits = math.inf, (0.0, 0.0)
    for feat, sl, el in zip(feats, starts, ends):
        if with_null and sl[0] + el[0] < score_null:
            score_null, null_logits = float(sl[0] + el[0]), (float(sl[0]), float(el[0]))
        spans, is_max = feat.token_char_spans, feat.token_is_max_context
        for s in _top(sl, n_best_size):
            if spans[s, 0] < 0 or not is_max[s]:
                continue
            for e in _top(el, n_best_size):
                if spans[e, 0] < 0 or e < s or e - s + 1 > max_answer_len:
                    continue
                cands.append((float(sl[s] + el[e]), float(sl[s]), float(el[e]),
                              int(spans[s, 0]), int(spans[e, 1])))
    null = (null_logits[0] + null_logits[1], null_logits[0], null_logits[1], -1, -1)
    if with_null:
        cands.append(null)
    cands.sort(key=lambda c: c[0], reverse=True)
    kept, seen = [], set()
    for c in cands:
        if len(kept) >= n_best_size:
            break
        text = ex.context[c[3]:c[4]] if c[3] >= 0 else ""
        if text not in seen:
            seen.add(text)
            kept.append((c, text))
    if with_null and "" not in seen:
        kept.append((null, ""))
    if not kept:  # v1.1 with no valid span: answer nothing rather than invent text
        kept.append(((0.0, 0.0, 0.0, -1, -1), ""))
    probs = _softmax([c[0] for c, _ in kept])
    nbest = [{"text": text, "probability": p, "start_logit": c[1], "end_logit": c[2],
              "start_char": c[3], "end_char": c[4]} for (c, text), p in zip(kept, probs)]
    return nbest, score_null
