"""The one statistics rule: paired gaps by seed, a 95% t-interval, wins / loses / not resolved.

The course's one statistics rule: how every comparison in accellib, its notebooks, benchmarks and
README decides whether an arm beats another.

Runs of two arms with the same seed share their data order and initialisation, so they are compared
as *pairs*: the per-seed differences d_k = a_k - b_k (lower is better for a loss), their mean, its
standard error SE = sd(d) / sqrt(n), and a two-sided 95% Student-t interval mean +- t_{0.975, n-1} SE
(Student, *Biometrika* 1908). The verdict:

    wins                       the whole interval is below zero   (a is better than b)
    loses                      the whole interval is above zero   (a is worse than b)
    not resolved at n seeds    the interval contains zero, or n < 2 (no spread to judge by)

An interval must clear zero by more than RESOLUTION (1e-5, the rounding of the stored losses: records keep
5 decimals) to give a verdict: gaps that are all equal have SE = 0 and an interval that is the point itself,
which is judged so (a -1e-12 gap is rounding, not a win). A gap that is NaN or inf (a diverged run) is a
one-line error naming the arm and the seed, not a number to average.

Time to target (the papers' metric, `to_target`): per seed, the ratio of what an arm spent (FLOPs or wall) to
first reach the same seed's baseline final loss to what the baseline spent; the rule is applied to the log
ratios (so the interval is a ratio interval, exp of the log one, and the centre a geometric mean). A seed
that never reaches the target within its budget is *censored*: it enters at its budget (the ratio of its
whole run), never dropped. Its true ratio is larger, so with censored seeds the centre and both ends are
lower bounds: "loses" stays valid, "wins" is withheld (not resolved, k censored).

    d = paired([2.10, 2.12, 2.08], [2.15, 2.16, 2.14])   # arm vs control, same seeds in the same order
    d.verdict, d.text()    # 'wins', '-0.050 [-0.075, -0.025] (n=3): wins'
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

LEVEL = 0.95
RESOLUTION = 1e-5   # nats (or log-ratio units): an interval must clear zero by more than this for a verdict


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (scipy.stats.t)."""
    from scipy.stats import t as student_t
    return float(student_t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (scipy.stats.t's inverse CDF)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    from scipy.stats import t as student_t
    return float(student_t.ppf(p, df))


@dataclass(frozen=True)
class Paired:
    """A paired comparison of arm a against arm b over n seeds (gaps = a - b, lower is better)."""
    n: int
    mean: float
    se: float
    lo: float
    hi: float
    verdict: str
    gaps: tuple[float, ...]

    def text(self, fmt: str = ".3f") -> str:
        """'-0.050 [-0.075, -0.025] (n=3): wins' -- mean, 95% interval, seeds, verdict."""
        if self.n < 2:
            return f"{self.mean:+{fmt}} (n={self.n}): {self.verdict}"
        return f"{self.mean:+{fmt}} [{self.lo:+{fmt}}, {self.hi:+{fmt}}] (n={self.n}): {self.verdict}"

    @classmethod
    def from_dict(cls, d: dict) -> "Paired":
        """The inverse of to_dict (a summary.json's `vs_baseline` / `vs_frontier`)."""
        return cls(**{**d, "gaps": tuple(d["gaps"])})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gaps"] = list(self.gaps)
        return d


def verdict(lo: float, hi: float, n: int) -> str:
    if n >= 2 and hi < -RESOLUTION:
        return "wins"
    if n >= 2 and lo > RESOLUTION:
        return "loses"
    return f"not resolved at {n} seed{'s' if n != 1 else ''}"


def paired(a: list[float], b: list[float], level: float = LEVEL, what: str = "",
           seeds: list[str] | None = None) -> Paired:
    """Arm a against arm b, paired by position (the same seed at the same index). `what` and `seeds` name
    the comparison and its seeds in the error a NaN or inf value raises."""
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs one value per seed on both sides, got {len(a)} and {len(b)}")
    return from_gaps([x - y for x, y in zip(a, b)], level, what, seeds)


def from_gaps(gaps: list[float], level: float = LEVEL, what: str = "", seeds: list[str] | None = None) -> Paired:
    """The rule applied to per-seed gaps already computed."""
    n = len(gaps)
    if n == 0:
        raise ValueError("paired comparison of no seeds")
    bad = [k for k, g in enumerate(gaps) if not math.isfinite(g)]
    if bad:
        k = bad[0]
        raise ValueError(f"{what or 'paired comparison'}: the gap at {seeds[k] if seeds else f'seed index {k}'} is "
                         f"{gaps[k]} (a diverged or unfinished run); rerun that seed, or leave it out on both sides")
    m = statistics.fmean(gaps)
    if n < 2:
        return Paired(1, m, math.nan, -math.inf, math.inf, verdict(-math.inf, math.inf, 1), tuple(gaps))
    se = statistics.stdev(gaps) / math.sqrt(n)
    half = t_quantile(0.5 + level / 2.0, n - 1) * se
    return Paired(n, m, se, m - half, m + half, verdict(m - half, m + half, n), tuple(gaps))


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of one arm's values over seeds (SE 0 for a single seed)."""
    return statistics.fmean(values), (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (sd 0 for a single seed): the spread of one arm,
    shown in tables; the paired rule above, never this, decides a comparison."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


@dataclass(frozen=True)
class Ratio:
    """Time to target over n seeds: per-seed ratios (arm's cost / baseline's cost to reach the baseline's
    final loss), their geometric mean and 95% interval from the rule on the log ratios; `censored[k]` is True
    where seed k never reached the target and enters at its budget (a lower bound)."""
    n: int
    reached: int
    ratio: float
    lo: float
    hi: float
    verdict: str
    ratios: tuple[float, ...]
    censored: tuple[bool, ...]

    def text(self, fmt: str = ".2f") -> str:
        """'0.68x [0.62, 0.75] (5/5 reached): wins' -- a censored seed's ratio is a lower bound ('>=')."""
        if self.reached == 0:   # every seed censored: only a lower bound, its whole budget, is known
            return f"not reached within {min(self.ratios):{fmt}}x (0/{self.n} seeds): {self.verdict}"
        c = "" if self.reached == self.n else ">="
        if self.n < 2:
            return f"{c}{self.ratio:{fmt}}x ({self.reached}/{self.n} reached): {self.verdict}"
        return (f"{c}{self.ratio:{fmt}}x [{c}{self.lo:{fmt}}, {c}{self.hi:{fmt}}] ({self.reached}/{self.n} reached): "
                f"{self.verdict}")

    @classmethod
    def from_dict(cls, d: dict) -> "Ratio":
        return cls(**{**d, "ratios": tuple(d["ratios"]), "censored": tuple(d["censored"])})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratios"], d["censored"] = list(self.ratios), list(self.censored)
        return d


def to_target(hits: list[float], budgets: list[float], level: float = LEVEL, what: str = "",
              seeds: list[str] | None = None) -> Ratio:
    """The papers' metric by the one rule. hits[k]: seed k's ratio to reach the target (inf if it never did);
    budgets[k]: the ratio of seed k's whole run, where a censored seed enters. wins = less than the baseline
    spent (the interval below 1x); loses = more; with censored seeds "wins" is withheld."""
    if len(hits) != len(budgets):
        raise ValueError(f"to_target needs a budget per seed, got {len(hits)} hits and {len(budgets)} budgets")
    censored = tuple(not math.isfinite(h) for h in hits)
    vals = [b if c else h for h, b, c in zip(hits, budgets, censored)]
    bad = [k for k, v in enumerate(vals) if not (math.isfinite(v) and v > 0)]
    if bad:
        k = bad[0]
        raise ValueError(f"{what or 'time to target'}: the ratio at {seeds[k] if seeds else f'seed index {k}'} is "
                         f"{vals[k]} (a budget of zero or a broken record); rerun that seed")
    p = from_gaps([math.log(v) for v in vals], level, what, seeds)
    word = p.verdict
    if any(censored) and word == "wins":
        word = f"not resolved ({sum(censored)} censored)"
    return Ratio(p.n, len(vals) - sum(censored), math.exp(p.mean), math.exp(p.lo), math.exp(p.hi), word,
                 tuple(vals), censored)
