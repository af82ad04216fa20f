"""Welch's t-test and its confidence interval, from Student's t distribution (no scipy).

``gpuscope.compare`` needs one two-sample test per (kernel, quantity): a p-value and a confidence interval of the
difference of means. Both come from the t distribution's tail, ``P(|T| > t) = I_x(df/2, 1/2)`` with
``x = df / (df + t**2)``, where ``I`` is the regularized incomplete beta function (Abramowitz and Stegun 26.5.27),
evaluated by its continued fraction (26.5.8, Lentz's method). The results match ``scipy.stats.ttest_ind(...,
equal_var=False)`` to about 1e-12 (tests/unit/test_stats.py); scipy itself would add 113 MB to every install.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["welch"]

_TINY = 1e-300  # keeps Lentz's method away from division by zero
_EPS = 1e-15


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (A&S 26.5.8), converging for ``x < (a + 1) / (a + b + 2)``."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(a * math.log(x) + b * math.log1p(-x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b  # I_x(a, b) = 1 - I_{1-x}(b, a)


def _two_sided_p(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with *df* degrees of freedom (any real df > 0)."""
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def _critical(p: float, df: float) -> float:
    """The ``t > 0`` with ``P(|T| >= t) = p``: bisection on ``x = df / (df + t**2)``, where the tail grows with x."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        if _betainc(df / 2.0, 0.5, mid) < p:
            lo = mid
        else:
            hi = mid
    x = (lo + hi) / 2.0
    return math.sqrt(df * (1.0 - x) / x)


def welch(a: np.ndarray, b: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Welch's two-sided t-test of ``mean(b) - mean(a)``: (p-value, confidence interval low, high).

    As ``scipy.stats.ttest_ind(b, a, equal_var=False)`` and its ``confidence_interval(confidence)``. Each sample
    needs at least two values and one of them a spread; callers handle the other cases.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    diff = float(b.mean() - a.mean())
    half = _critical(1.0 - confidence, df) * se
    return _two_sided_p(diff / se, df), diff - half, diff + half
