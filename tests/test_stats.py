"""The one statistics rule (accellib.analysis.stats): paired gaps by seed, mean +- SE, a t-interval with n-1
degrees of freedom, and the verdict words, on cases whose answers are known exactly."""
import math
import statistics

import pytest

from accellib.analysis.stats import RESOLUTION, Ratio, from_gaps, mean_se, paired, t_quantile, to_target


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
    # equal gaps below the stored losses' rounding are rounding, not a result (issue 33: [-1e-12, -1e-12] "won")
    assert from_gaps([-1e-12] * 3).verdict == "not resolved at 3 seeds"
    assert from_gaps([RESOLUTION / 2] * 5).verdict == "not resolved at 5 seeds"
    assert from_gaps([-2 * RESOLUTION] * 3).verdict == "wins"


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


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nan_or_inf_gap_names_the_arm_and_seed(bad):
    # before: AttributeError: 'float' object has no attribute 'numerator' (statistics.stdev on a NaN)
    with pytest.raises(ValueError, match=r"^arm pld vs baseline: the gap at seed1338 is .*rerun that seed") as e:
        paired([2.1, bad, 2.0], [2.2, 2.2, 2.2], what="arm pld vs baseline", seeds=["seed1337", "seed1338", "seed1339"])
    assert "\n" not in str(e.value)


def test_time_to_target_is_the_rule_on_log_ratios():
    r = to_target([0.5, 0.6, 0.7], [1.0, 1.0, 1.0])
    logs = [math.log(v) for v in (0.5, 0.6, 0.7)]
    d = from_gaps(logs)
    assert r.ratio == pytest.approx(math.exp(statistics.fmean(logs))) and r.reached == 3
    assert (r.lo, r.hi) == (pytest.approx(math.exp(d.lo)), pytest.approx(math.exp(d.hi)))
    assert r.verdict == "wins" and r.text().endswith("(3/3 reached): wins")
    assert Ratio.from_dict(r.to_dict()) == r


def test_time_to_target_keeps_censored_seeds_at_their_budget():
    # a seed that never reaches the target enters at its whole run's ratio (a lower bound), never dropped;
    # the interval may still lie below 1x, but "wins" is withheld while any seed is censored
    r = to_target([0.60, 0.62, math.inf, 0.61], [1.0, 1.0, 0.9, 1.0])
    assert r.censored == (False, False, True, False) and r.ratios[2] == 0.9 and r.reached == 3
    assert r.hi < 1 and r.verdict == "not resolved (1 censored)" and r.text().startswith(">=")
    assert to_target([1.2, 1.25, 1.22, math.inf], [1.1] * 4).verdict == "loses"   # censoring only raises values
    with pytest.raises(ValueError, match="at seed2 is nan.*rerun"):
        to_target([0.5, math.inf], [1.0, math.nan], seeds=["seed1", "seed2"])


def test_mean_se():
    assert mean_se([1.0, 2.0, 3.0]) == (2.0, pytest.approx(1 / math.sqrt(3)))
    assert mean_se([4.0]) == (4.0, 0.0)


def test_student_t_is_scipys():
    # issue 36: the quantile came from a hand-written incomplete beta and a bisection (to ~1e-10); the one rule now
    # reads scipy.stats, so its intervals are scipy's to the last bit, at any df and level
    from scipy.stats import t as student_t
    from accellib.analysis import stats
    for df in (0.5, 1, 2, 4, 9, 30, 1000):
        for p in (1e-9, 0.025, 0.3, 0.5, 0.8, 0.975, 0.999999):
            assert stats.t_quantile(p, df) == student_t.ppf(p, df)
            assert stats.t_cdf(stats.t_quantile(p, df), df) == student_t.cdf(student_t.ppf(p, df), df)
    assert not hasattr(stats, "_betainc") and not hasattr(stats, "_betacf")
    d = paired([2.10, 2.12, 2.08], [2.15, 2.16, 2.14])
    half = student_t.ppf(0.975, 2) * d.se
    assert (d.lo, d.hi) == (d.mean - half, d.mean + half)
    for name in ("t_quantile", "t_cdf", "paired", "from_gaps", "to_target", "Paired", "Ratio", "RESOLUTION"):
        assert hasattr(stats, name)   # the module's interface is unchanged
