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

Gaps that are all exactly equal have SE = 0: the interval is the point itself, and a nonzero point is
judged by its sign (with no seed-to-seed spread there is nothing else to judge it by).

    d = paired([2.10, 2.12, 2.08], [2.15, 2.16, 2.14])   # arm vs control, same seeds in the same order
    d.verdict, d.text()    # 'wins', '-0.050 [-0.075, -0.025] (n=3): wins'
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

LEVEL = 0.95


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on t_cdf; exact to ~1e-10)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


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
    if n >= 2 and hi < 0:
        return "wins"
    if n >= 2 and lo > 0:
        return "loses"
    return f"not resolved at {n} seed{'s' if n != 1 else ''}"


def paired(a: list[float], b: list[float], level: float = LEVEL) -> Paired:
    """Arm a against arm b, paired by position (the same seed at the same index)."""
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs one value per seed on both sides, got {len(a)} and {len(b)}")
    return from_gaps([x - y for x, y in zip(a, b)], level)


def from_gaps(gaps: list[float], level: float = LEVEL) -> Paired:
    """The rule applied to per-seed gaps already computed."""
    n = len(gaps)
    if n == 0:
        raise ValueError("paired comparison of no seeds")
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
