"""Comparisons between runtimes that no rounding difference can flip.

Keras, the SavedModel, TFLite and the Task Library compute the same float32
model in different orders, and oneDNN picks other kernels on other CPUs (AVX2,
AVX-512, VNNI; `make test-isa`): outputs differ by up to about 1e-6. An arg-max,
a threshold decision or a ranking taken from those outputs flips when its
margin is below that difference, so a test never asserts one bare. These
helpers check every score within a tolerance and every decision whose margin
is larger than what that tolerance can move; a decision closer to a tie than
that is a tie at this precision, and only its scores are checked.

Each helper also fails when fewer than `min_decided` of the examples are
decided, so a check never passes by having nothing left to check: a fixture
keeps a margin.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
import pytest

# Differences between float32 runtimes of one model, and of one runtime on two CPUs,
# stay below this (measured: at most 4e-8 on probabilities, 1e-6 on logits); a
# decision closer than this to a tie is not asserted.
NOISE = 1e-5
# Share of examples that must be decided for an agreement check to count.
MIN_DECIDED = 0.5


def margins(scores: Any) -> np.ndarray:
    """[..., C] scores -> [...] gap between the best and the second-best class."""
    s = np.sort(np.asarray(scores, np.float64), axis=-1)
    return s[..., -1] - s[..., -2]


def decided(scores: Any, atol: float) -> np.ndarray:
    """Bool [...]: the arg-max of `scores` [..., C] survives any change up to `atol`
    in every score (its margin exceeds 2 * atol)."""
    return margins(scores) > 2.0 * atol


def _enough(sure: np.ndarray, min_decided: float, what: str) -> None:
    share = float(np.mean(sure)) if sure.size else 0.0
    assert share >= min_decided, (
        f"{what}: only {share:.0%} of the examples are decided beyond the tolerance; "
        "the fixture needs a margin (a trained model, or wider logits)")


def assert_same_labels(got: Any, want: Any, atol: float, *, err_msg: str = "",
                       min_decided: float = MIN_DECIDED,
                       where: Optional[np.ndarray] = None) -> np.ndarray:
    """`got` scores [..., C] are `want`'s within `atol`, and their arg-max is the
    same on every entry whose margin in `want` exceeds twice the largest difference
    (plus NOISE): no difference of that size can flip those. `where` restricts
    both checks to some entries (e.g. the first pieces of words). Returns the
    mask of entries whose label was checked."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape, err_msg)
    if where is not None:
        got, want = got[where], want[where]
    np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=err_msg)
    sure = decided(want, float(np.abs(got - want).max(initial=0.0)) + NOISE)
    np.testing.assert_array_equal(got.argmax(-1)[sure], want.argmax(-1)[sure],
                                  err_msg=f"labels {err_msg}")
    _enough(sure, min_decided, err_msg or "labels")
    return sure


def assert_labels_are_argmax(labels: Any, want: Any, atol: float = NOISE, *,
                             err_msg: str = "", min_decided: float = MIN_DECIDED) -> None:
    """Class indices another runtime chose (`labels` [...]) are the arg-max of the
    reference scores `want` [..., C] wherever no difference within `atol` flips it."""
    labels, want = np.asarray(labels), np.asarray(want, np.float64)
    sure = decided(want, atol)
    np.testing.assert_array_equal(labels[sure], want.argmax(-1)[sure], err_msg=err_msg)
    _enough(sure, min_decided, err_msg or "labels")


def assert_parity_agrees(row: Mapping[str, Any], want: Any, max_diff: float, *,
                         where: Optional[np.ndarray] = None, name: str = "",
                         min_decided: float = MIN_DECIDED) -> None:
    """A parity.json format row against the Keras reference `want` [..., C] (in the
    space parity compares: probabilities for classifiers): its max |Δ| is below
    `max_diff`, and its label agreement is at least the share of decided entries
    (`where` selects the entries parity counts). No difference within max |Δ|
    (plus NOISE, for the reference computed again here) can flip a decided
    entry, so with every entry decided this is agreement == 1."""
    delta = float(row["max_abs_diff"])
    assert delta < max_diff, (name, delta)
    want = np.asarray(want, np.float64)
    if where is not None:
        want = want[where]
    sure = decided(want, delta + NOISE)
    _enough(sure, min_decided, name)
    assert row["label_agreement"] >= float(np.mean(sure)) - 1e-12, (
        name, row["label_agreement"], float(np.mean(sure)))


def span_margins(nbest: Mapping[str, list], null_diffs: Mapping[str, float],
                 threshold: Optional[float]) -> dict[str, float]:
    """Question id -> how far its answer is from changing, in span-score units.

    From `squad_answers.postprocess`'s n-best lists (text, start_logit,
    end_logit, best first) and, for v2.0 (`threshold` given), its null-score
    differences: a question answered "" stands while its difference stays above
    the threshold; an answered one while its difference stays at or below it and
    its best span's score stays above the next different text's. A span score is
    a start plus an end logit and a difference is two of each, so logits that
    move by d move either gap by up to 4 d: the answer stands while 4 d < margin.
    """
    out = {}
    for q, cands in nbest.items():
        spans = [c["start_logit"] + c["end_logit"] for c in cands if c["start_char"] >= 0]
        gap = spans[0] - spans[1] if len(spans) > 1 else np.inf
        diff = null_diffs.get(q, np.inf)
        if threshold is not None and np.isfinite(diff):
            gap = diff - threshold if diff > threshold else min(gap, threshold - diff)
        out[q] = float(gap)
    return out


def _bfloat16_crash() -> Optional[str]:
    from tinybert_tf.pipeline.settings.precision import bfloat16_crash, detect
    return bfloat16_crash(detect())


# A test that runs bfloat16 matmuls: skipped where TensorFlow would crash on them (a
# CPU with AVX512-BF16 and oneDNN limited below it, as `make test-isa`'s
# ONEDNN_MAX_CPU_ISA=AVX2 does on a Zen 4 EPYC); the pipeline refuses bfloat16 there.
BFLOAT16_CRASH = _bfloat16_crash()
needs_bfloat16_matmuls = pytest.mark.skipif(
    bool(BFLOAT16_CRASH), reason=f"TensorFlow would crash here: {BFLOAT16_CRASH}")
