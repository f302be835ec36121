"""GLUE metrics in NumPy: accuracy, F1, Matthews correlation, Pearson, Spearman.

Written in NumPy so that evaluation needs neither scikit-learn nor SciPy at
run time (both are test-only dependencies; the tests compare against them).
Every function takes 1-D arrays of equal length and returns a Python float.

An undefined value is NaN, as SciPy gives it, never a number that looks like a
score: Pearson and Spearman of fewer than two examples, or of a constant
series (no variance), are undefined. `is_defined` tells them apart; the
pipeline reports such a metric as undefined (null in JSON, with a note) and
never selects a checkpoint by it. F1 and Matthews keep scikit-learn's 0.0
conventions (`zero_division=0`), which define them.
"""
from __future__ import annotations

import numpy as np


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"predictions ({p.shape[0]}) and labels ({y.shape[0]}) differ in length.")
    if p.size == 0:
        raise ValueError("no examples to score: predictions and labels are empty.")
    return p, y


def accuracy(predictions, labels) -> float:
    """Fraction of exact matches; predictions and labels are class ids [N]."""
    p, y = _pair(predictions, labels)
    return float(np.mean(p == y))


def f1(predictions, labels, positive: int = 1) -> float:
    """Binary F1 of class `positive` (MRPC, QQP use positive=1): 2TP / (2TP + FP + FN).

    0.0 when there is no true and no predicted positive (scikit-learn's
    `zero_division=0` convention).
    """
    p, y = _pair(predictions, labels)
    tp = float(np.sum((p == positive) & (y == positive)))
    fp = float(np.sum((p == positive) & (y != positive)))
    fn = float(np.sum((p != positive) & (y == positive)))
    denom = 2.0 * tp + fp + fn
    return 0.0 if denom == 0 else 2.0 * tp / denom


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation (multi-class form, Gorodkin 2004), CoLA's metric.

    With confusion matrix C, t_k = row sums (true), p_k = column sums (pred),
    c = trace, s = N: MCC = (c*s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)); 0.0 when
    a denominator factor is 0 (as scikit-learn).
    """
    p, y = _pair(predictions, labels)
    classes, inv = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = classes.size
    yi, pi = inv[: y.size], inv[y.size:]
    conf = np.zeros((k, k), dtype=np.float64)
    np.add.at(conf, (yi, pi), 1.0)
    t, q = conf.sum(axis=1), conf.sum(axis=0)
    c, s = np.trace(conf), conf.sum()
    cov_ytyp = c * s - np.dot(t, q)
    cov_ypyp = s * s - np.dot(q, q)
    cov_ytyt = s * s - np.dot(t, t)
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


UNDEFINED = float("nan")


def is_defined(value) -> bool:
    """False for an undefined metric (NaN, None, +-inf)."""
    try:
        return bool(np.isfinite(float(value)))
    except (TypeError, ValueError):
        return False


def pearson(predictions, labels) -> float:
    """Pearson's r between float predictions and labels [N]; undefined (NaN) for
    fewer than two examples or when either series is constant."""
    p, y = _pair(predictions, labels)
    p, y = p.astype(np.float64), y.astype(np.float64)
    dp, dy = p - p.mean(), y - y.mean()
    denom = np.sqrt(np.sum(dp * dp) * np.sum(dy * dy))
    return UNDEFINED if p.size < 2 or denom == 0 else float(np.sum(dp * dy) / denom)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (SciPy's 'average')."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Start of each run of equal values in sorted order.
    new_run = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
    run_id = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    ends = np.concatenate([starts[1:], [x.size]])  # exclusive
    avg = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = avg[run_id]
    return ranks


def spearman(predictions, labels) -> float:
    """Spearman's rho: Pearson's r of the average ranks (ties averaged)."""
    p, y = _pair(predictions, labels)
    return pearson(_average_ranks(p.astype(np.float64)), _average_ranks(y.astype(np.float64)))


def per_class_f1(predictions, labels, num_classes: int) -> list[float]:
    """One-vs-rest F1 of every class 0..num_classes-1 (0.0 for a class never
    predicted nor present, as scikit-learn's zero_division=0)."""
    p, y = _pair(predictions, labels)
    return [f1(p, y, positive=c) for c in range(int(num_classes))]


def macro_f1(predictions, labels, num_classes: int) -> float:
    """Unweighted mean of the per-class F1 over all `num_classes` classes."""
    return float(np.mean(per_class_f1(predictions, labels, num_classes)))
