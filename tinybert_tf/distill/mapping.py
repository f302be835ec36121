"""Student -> teacher layer mapping g(m) (TinyBERT paper, Sec. 3.1; the strategies of
Sec. 4.6 / Table 4).

Layers are numbered 0 = embeddings, 1..M = student transformer layers, 1..N =
teacher transformer layers. `layer_map` returns the list [g(0), g(1), ..., g(M)]
with g(0) = 0 always (embeddings learn from embeddings).

Strategies:
  uniform  g(m) = m * N / M (the paper's default). When N is not divisible by M
           we use the nearest teacher layer, g(m) = floor(m * N / M + 1/2)
           (halves round up), which keeps g strictly increasing and g(M) = N;
           e.g. N=6, M=4 -> [0, 2, 3, 5, 6].
  top      g(m) = m + N - M  (the last M teacher layers).
  bottom   g(m) = m          (the first M teacher layers).
  explicit a list (or comma string) of M teacher layers, 1-based, for student
           layers 1..M, e.g. "3,6,9,12"; any order, repeats allowed.
"""
from __future__ import annotations

import numbers
from typing import Sequence, Union

STRATEGIES = ("uniform", "top", "bottom")
_FLAG = "--layer_mapping"


def _parse_explicit(strategy: Union[str, Sequence[int]]) -> list[int]:
    if isinstance(strategy, str):
        parts = [p.strip() for p in strategy.split(",") if p.strip()]
        try:
            return [int(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"{_FLAG}={strategy!r}: use one of {', '.join(STRATEGIES)} or a comma "
                "list of 1-based teacher layers (one per student layer), e.g. 3,6,9,12."
            ) from None
    values = list(strategy)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"{_FLAG}={values!r}: entries must be integers (1-based teacher "
                             "layers).")
    return [int(v) for v in values]


def layer_map(strategy: Union[str, Sequence[int]], num_student_layers: int,
              num_teacher_layers: int) -> list[int]:
    """Teacher layer index for each student layer 0..M (0 = embeddings -> 0).

    Args:
      strategy: "uniform", "top", "bottom", or M explicit 1-based teacher layers
        (a sequence of ints or a comma-separated string).
      num_student_layers: M >= 1.
      num_teacher_layers: N >= 1.

    Returns:
      [0, g(1), ..., g(M)], each g(m) in 1..N.

    Raises:
      ValueError naming `--layer_mapping` for unknown strategies, wrong list
      lengths, out-of-range layers, or M > N for the built-in strategies.
    """
    m_layers, n_layers = int(num_student_layers), int(num_teacher_layers)
    if m_layers < 1 or n_layers < 1:
        raise ValueError(f"{_FLAG}: need at least one student and one teacher layer, got "
                         f"M={m_layers}, N={n_layers}.")
    if isinstance(strategy, str) and strategy.strip().lower() in STRATEGIES:
        name = strategy.strip().lower()
        if m_layers > n_layers:
            raise ValueError(
                f"{_FLAG}={name}: the student has more layers (M={m_layers}) than the "
                f"teacher (N={n_layers}); give an explicit list of {m_layers} teacher layers "
                "(repeats allowed) instead.")
        if name == "uniform":
            # Integer arithmetic for floor(m*N/M + 1/2): exact, no float ties.
            mapped = [(2 * m * n_layers + m_layers) // (2 * m_layers)
                      for m in range(1, m_layers + 1)]
        elif name == "top":
            mapped = [m + n_layers - m_layers for m in range(1, m_layers + 1)]
        else:
            mapped = list(range(1, m_layers + 1))
        return [0] + mapped
    mapped = _parse_explicit(strategy)
    if len(mapped) != m_layers:
        raise ValueError(
            f"{_FLAG}={','.join(map(str, mapped)) if mapped else strategy!r}: expected "
            f"{m_layers} teacher layers (one per student layer 1..{m_layers}), got "
            f"{len(mapped)}; or use one of {', '.join(STRATEGIES)}.")
    bad = [v for v in mapped if not 1 <= v <= n_layers]
    if bad:
        raise ValueError(
            f"{_FLAG}: teacher layers {bad} are out of range; explicit layers are 1-based "
            f"and must lie in 1..{n_layers} (0, the embeddings, is mapped implicitly).")
    return [0] + mapped
