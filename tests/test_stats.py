"""The one statistics rule (accellib.analysis.stats): paired gaps by seed, mean +- SE, a t-interval with n-1
degrees of freedom, and the verdict words, on cases whose answers are known exactly."""
import math
import statistics

import pytest

from accellib.analysis.stats import from_gaps, mean_se, paired, t_quantile


@pytest.mark.parametrize("df,t", [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (9, 2.2621572),
                                  (29, 2.0452296), (1000, 1.9623391)])
def test_t_quantile_matches_the_table(df, t):
    # two-sided 95% critical values of Student's t (any table; scipy.stats.t.ppf(0.975, df))
    assert t_quantile(0.975, df) == pytest.approx(t, abs=2e-7)
    assert t_quantile(0.025, df) == pytest.approx(-t, abs=2e-7)


def test_a_known_interval():
    # gaps -0.05, -0.04, -0.06: mean -0.05, sd 0.01, SE 0.01/sqrt(3), half width 4.3027 * SE = 0.024841
    d = paired([2.10, 2.12, 2.08], [2.15, 2.16, 2.14])
    assert d.n == 3 and d.mean == pytest.approx(-0.05)
    assert d.se == pytest.approx(0.01 / math.sqrt(3))
    assert (d.lo, d.hi) == (pytest.approx(-0.0748414, abs=1e-6), pytest.approx(-0.0251586, abs=1e-6))
    assert d.verdict == "wins"
    assert d.text() == "-0.050 [-0.075, -0.025] (n=3): wins"


def test_pairing_is_what_resolves_it():
    # the seeds move both arms together: unpaired sds of 0.1 swamp a 0.01 gap, the paired rule sees it
    base = [2.0, 2.1, 2.2, 2.3, 2.4]
    arm = [b + 0.01 + e for b, e in zip(base, [0.001, -0.001, 0.0, 0.002, -0.002])]
    assert statistics.stdev(base) > 0.1
    assert paired(arm, base).verdict == "loses"
    assert paired(base, arm).verdict == "wins"


def test_all_equal_gaps_and_ties():
    d = from_gaps([0.02, 0.02, 0.02])
    assert d.se == pytest.approx(0.0, abs=1e-15) and d.lo == pytest.approx(0.02) and d.verdict == "loses"
    assert from_gaps([0.0, 0.0, 0.0]).verdict == "not resolved at 3 seeds"


def test_an_interval_across_zero_is_not_resolved():
    d = from_gaps([-0.03, 0.01, -0.02, 0.02, -0.01])
    assert d.lo < 0 < d.hi and d.verdict == "not resolved at 5 seeds"


def test_two_seeds_use_one_degree_of_freedom():
    d = from_gaps([-0.01, -0.03])           # mean -0.02, sd 0.01414, SE 0.01, half width 12.706 * 0.01
    assert d.se == pytest.approx(0.01) and d.hi == pytest.approx(-0.02 + 0.127062, abs=1e-6)
    assert d.verdict == "not resolved at 2 seeds"


def test_one_seed_is_never_a_verdict():
    d = from_gaps([-0.5])
    assert d.verdict == "not resolved at 1 seed" and d.text() == "-0.500 (n=1): not resolved at 1 seed"


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="one value per seed"):
        paired([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="no seeds"):
        from_gaps([])


def test_mean_se():
    assert mean_se([1.0, 2.0, 3.0]) == (2.0, pytest.approx(1 / math.sqrt(3)))
    assert mean_se([4.0]) == (4.0, 0.0)
