"""gpuscope's Welch t-test against scipy.stats: the same p-values and confidence intervals."""

import numpy as np
import pytest

from gpuscope._util.stats import _betainc, welch

stats = pytest.importorskip("scipy.stats")

RNG = np.random.default_rng(7)
# (base, new): small and large samples, equal and unequal spreads, no change and clear changes, tiny p-values
CASES = [
    (RNG.normal(10, 1, 5), RNG.normal(10, 1, 5)),
    (RNG.normal(10, 1, 2), RNG.normal(11, 3, 3)),
    (RNG.normal(588.5, 0.2, 5), RNG.normal(589.0, 0.4, 7)),
    (RNG.normal(0.3, 0.01, 40), RNG.normal(0.31, 0.05, 1000)),
    (RNG.normal(1.0, 1e-3, 12), RNG.normal(2.0, 1e-3, 12)),  # p far below 1e-20
    (np.array([1.0, 1.0, 1.0]), np.array([1.0, 2.0, 3.0])),  # one sample without spread
    (RNG.exponential(5, 30), RNG.exponential(6, 9)),
]


@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")  # scipy, on the sample without spread
@pytest.mark.parametrize("a, b", CASES)
@pytest.mark.parametrize("confidence", [0.95, 0.99, 0.5])
def test_welch_matches_scipy(a, b, confidence):
    res = stats.ttest_ind(b, a, equal_var=False)
    ci = res.confidence_interval(confidence)
    p, lo, hi = welch(a, b, confidence)
    assert p == pytest.approx(float(res.pvalue), rel=1e-9, abs=1e-300)
    assert (lo, hi) == pytest.approx((float(ci.low), float(ci.high)), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("a, b", [(0.5, 0.5), (3.5, 0.5), (0.5, 40.0), (2000.0, 0.5), (1.2, 7.3)])
def test_incomplete_beta_matches_scipy(a, b):
    special = pytest.importorskip("scipy.special")
    x = np.linspace(0, 1, 101)
    np.testing.assert_allclose([_betainc(a, b, v) for v in x], special.betainc(a, b, x), rtol=1e-11, atol=1e-300)
