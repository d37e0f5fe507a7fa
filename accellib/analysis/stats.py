"""The one statistics rule (paired gaps by seed, a 95% t-interval), and the sign test for time to target.

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

Time to target (the papers' metric, `to_target`) is judged differently, because it is censored data. Per seed it
is the ratio of what an arm spent (FLOPs or wall) to first reach the same seed's baseline final loss to what that
baseline spent. A seed that never reaches the target within its budget is *censored*: all that is known is that
its ratio exceeds its budget (the ratio of its whole run). It is never dropped, but it has no value to average: the
t-rule needs a number per seed, and any number put in its place (the budget, say) makes the centre a lower bound
and the ends nothing at all (raising a censored value widens the spread and can *lower* the lower end). A reading
is also only as fine as the evaluations: the crossing is interpolated between evaluations, and the baseline itself,
whose final loss is the target, "reaches" it at 0.98x on a seed whose last evaluations fluctuate. So:

- **The sign test decides** (exact, two-sided; it assumes nothing about the ratios' distribution). Each seed is
  *clearly below* 1x (a reached ratio < 1 - tie), *clearly above* (a reached ratio > 1 + tie, or censored at a
  budget >= 1 - tie: it did not reach the baseline's loss with the baseline's spend), a *tie* (within tie of 1x),
  or *unknown* (censored at a budget < 1 - tie: it may land on either side). `tie` is the reading's resolution,
  the experiment's largest evaluation spacing as a fraction of the baseline's budget (a summary row's
  `to_target_resolution`). Ties and unknown seeds drop out, as in the standard sign test; p is the probability of
  a split at least as uneven as the one seen if each seed were equally likely to fall on either side of 1x.
  **wins** / **loses**: p < 0.05 with most seeds below / above; otherwise **not resolved at n seeds**.
  With 5 seeds that is always the answer: 5 of 5 on one side gives p = 2 / 2^5 = 0.0625. Six seeds all on one
  side (p = 0.03125) are the fewest that can resolve time to target; the final-loss gap at equal FLOPs (the paired
  t-rule above) is the course's test, and time to target is reported beside it.
- **An interval only where it is one.** When every seed reached the target and the ratios differ, the t-rule on
  the log ratios gives a ratio interval (exp of the log one; its centre is the geometric mean): a 95% interval for
  the typical ratio, assuming roughly normal log ratios. It describes; the sign test decides. With any seed
  censored no interval is printed, only the k of n seeds that reached, their ratios, and the others' budgets. A set
  with no spread (every seed read at the same ratio, say 1.0003x: the step that overshot the baseline's FLOPs) has
  no interval, and its seeds, within the resolution of 1x, are ties that decide nothing.

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


def sign_test_p(below: int, above: int) -> float:
    """The exact two-sided sign test: P(a split at least as uneven as below : above) when each seed is equally
    likely to fall on either side of 1x, i.e. min(1, 2 P(X <= min(below, above))) for X ~ Binomial(below + above,
    1/2). No seeds on either side: 1.0. With every one of n seeds on one side it is 2 / 2^n: 0.0625 at 5 seeds,
    0.03125 at 6, so 6 is the fewest seeds that can resolve anything."""
    m = below + above
    if m == 0:
        return 1.0
    k = min(below, above)
    return min(1.0, 2.0 * sum(math.comb(m, i) for i in range(k + 1)) / 2.0 ** m)


@dataclass(frozen=True)
class Ratio:
    """Time to target over n seeds (see the module docstring). `ratios[k]`: seed k's ratio (arm's cost / the same
    seed's baseline's cost to reach that baseline's final loss); where `censored[k]` the seed never reached it and
    `ratios[k]` is its budget (its whole run's ratio; the true ratio is larger). `tie`: the reading's resolution as a
    fraction of the baseline's budget (the experiment's evaluation spacing, rows' `to_target_resolution`). The sign
    test: `below` seeds clearly under 1x (a reached ratio < 1 - tie), `above` clearly over (a reached ratio > 1 + tie,
    or censored at a budget >= 1 - tie); ties (within 1 +- tie) drop out, and so do `unknown` seeds (censored at a
    budget < 1 - tie: they may land on either side); `p` its exact two-sided p-value; `verdict` wins / loses only
    when p < 0.05. `ratio`, `lo`, `hi`: the geometric mean and 95% interval of the t-rule on the log ratios, given
    only when every seed reached the target and the ratios have spread (otherwise None)."""
    n: int
    reached: int
    ratios: tuple[float, ...]
    censored: tuple[bool, ...]
    tie: float
    below: int
    above: int
    unknown: int
    p: float
    verdict: str
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None

    @property
    def ties(self) -> int:
        return self.n - self.below - self.above - self.unknown

    @property
    def reached_ratios(self) -> tuple[float, ...]:
        return tuple(v for v, c in zip(self.ratios, self.censored) if not c)

    @property
    def budgets(self) -> tuple[float, ...]:
        """The censored seeds' budgets: a lower bound on each one's ratio, and all that is known of it."""
        return tuple(v for v, c in zip(self.ratios, self.censored) if c)

    @property
    def median(self) -> float | None:
        """The median of the reached seeds' ratios (None when none reached): a description, not an estimate of
        the arm's ratio (the censored seeds, whose ratios are larger, are not in it)."""
        r = self.reached_ratios
        return statistics.median(r) if r else None

    @property
    def interval(self) -> bool:
        return self.lo is not None

    def sign_text(self) -> str:
        """'sign test 3 below, 2 above (p=1)', naming the ties and the seeds of unknown side when there are any."""
        extra = ([f", {self.ties} within {self.tie:.1%} of 1x"] if self.ties else []) + (
            [f", {self.unknown} censored under 1x (side unknown)"] if self.unknown else [])
        return f"sign test {self.below} below, {self.above} above{''.join(extra)} (p={self.p:.2g})"

    def _bound(self, fmt: str, span: bool = False) -> str:
        """The censored seeds' budgets: '1.00x' when they agree, else each in increasing order ('0.99x, 1.04x') or,
        with `span`, their range ('0.99–1.08x')."""
        b = [format(v, fmt) for v in sorted(self.budgets)]
        if len(set(b)) == 1:
            return b[0] + "x"
        return f"{b[0]}–{b[-1]}x" if span else ", ".join(x + "x" for x in b)

    def text(self, fmt: str = ".2f") -> str:
        """All reached, with spread: '0.63x [0.59, 0.66] (5/5 reached); sign test 5 below, 0 above (p=0.062): not
        resolved at 5 seeds'. Otherwise the reached ratios and the censored seeds' budgets, never an interval:
        '3/5 reached: 0.81x, 0.85x, 0.92x; 2 not within 1.00x; sign test 3 below, 2 above (p=1): not resolved at
        5 seeds'."""
        tail = f"; {self.sign_text()}: {self.verdict}"
        if self.interval:
            return f"{self.ratio:{fmt}}x [{self.lo:{fmt}}, {self.hi:{fmt}}] ({self.reached}/{self.n} reached){tail}"
        head = f"{self.reached}/{self.n} reached"
        if self.reached:
            head += ": " + ", ".join(f"{v:{fmt}}x" for v in self.reached_ratios)
        if self.reached < self.n:
            head += (f"; {self.n - self.reached} not within {self._bound(fmt)}" if self.reached
                     else f" (not within {self._bound(fmt)})")
        return head + tail

    def short(self) -> str:
        """One table cell: '0.63x [0.59, 0.66] 5/5; sign p=0.062 n.r.' or '2/5 reached, 0.99x median of reached;
        sign p=0.62 n.r.' or '0/5 reached in 1.00x; sign p=0.062 n.r.'."""
        word = "n.r." if self.verdict.startswith("not resolved") else self.verdict
        sign = f"sign p={self.p:.2g} {word}"
        if self.interval:
            return f"{self.ratio:.2f}x [{self.lo:.2f}, {self.hi:.2f}] {self.reached}/{self.n}; {sign}"
        if self.reached == 0:
            return f"0/{self.n} reached in {self._bound('.2f', span=True)}; {sign}"
        return f"{self.reached}/{self.n} reached, {self.median:.2f}x median of reached; {sign}"

    @classmethod
    def from_dict(cls, d: dict, tie: float | None = None) -> "Ratio":
        """The stored record (a summary.json's or results/*.json's `to_target[x]`), judged again by today's rule
        from its per-seed ratios and censored flags: the stored numbers stay the numbers. Records written before
        the sign test (n, reached, ratio, lo, hi, verdict, ratios, censored) carry no tie: pass the row's
        `to_target_resolution`."""
        t = d.get("tie", tie)
        if t is None:
            raise ValueError("this time-to-target record predates the sign test and stores no tie: pass the row's "
                             "to_target_resolution as tie")
        return judge(list(d["ratios"]), list(d["censored"]), t)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratios"], d["censored"] = list(self.ratios), list(self.censored)
        return d


def judge(values: list[float], censored: list[bool], tie: float, level: float = LEVEL, what: str = "",
          seeds: list[str] | None = None) -> Ratio:
    """The judgement of per-seed ratios (a reached seed's ratio, or a censored seed's budget) at resolution `tie`:
    the sign test, its verdict, and the t-interval where one exists (every seed reached, with spread)."""
    if len(values) != len(censored) or not values:
        raise ValueError(f"time to target needs a censored flag per seed, got {len(values)} values and "
                         f"{len(censored)} flags")
    if not (math.isfinite(tie) and tie >= 0):
        raise ValueError(f"{what or 'time to target'}: the tie (resolution) must be >= 0, got {tie}")
    bad = [k for k, v in enumerate(values) if not (math.isfinite(v) and v > 0)]
    if bad:
        k = bad[0]
        raise ValueError(f"{what or 'time to target'}: the ratio at {seeds[k] if seeds else f'seed index {k}'} is "
                         f"{values[k]} (a budget of zero or a broken record); rerun that seed")
    censored = tuple(bool(c) for c in censored)
    below = sum(1 for v, c in zip(values, censored) if not c and v < 1 - tie)
    above = sum(1 for v, c in zip(values, censored) if (v > 1 + tie if not c else v >= 1 - tie))
    unknown = sum(1 for v, c in zip(values, censored) if c and v < 1 - tie)
    p = sign_test_p(below, above)
    n = len(values)
    word = ("wins" if below > above else "loses") if p < 1 - level else \
        f"not resolved at {n} seed{'s' if n != 1 else ''}"
    ratio = lo = hi = None
    logs = [math.log(v) for v in values]
    if not any(censored) and n >= 2 and max(logs) - min(logs) > RESOLUTION:
        g = from_gaps(logs, level, what, seeds)
        ratio, lo, hi = math.exp(g.mean), math.exp(g.lo), math.exp(g.hi)
    return Ratio(n, n - sum(censored), tuple(float(v) for v in values), censored, float(tie), below, above, unknown,
                 p, word, ratio, lo, hi)


def to_target(hits: list[float], budgets: list[float], tie: float = 0.0, level: float = LEVEL, what: str = "",
              seeds: list[str] | None = None) -> Ratio:
    """The papers' metric, judged by the sign test (module docstring). hits[k]: seed k's ratio to reach the target
    (inf if it never did); budgets[k]: the ratio of seed k's whole run, where a censored seed is known to lie
    beyond; tie: the reading's resolution as a fraction of the baseline's budget (the evaluation spacing, a row's
    `to_target_resolution`; 0 counts every seed off exactly 1x). wins = clearly less than the baseline spent on
    enough seeds for the exact two-sided sign test to give p < 0.05; loses = clearly more; at 5 seeds that is never
    (5 of 5 on one side gives p = 0.0625): the honest answer of 5 seeds to a question about censored data."""
    if len(hits) != len(budgets):
        raise ValueError(f"to_target needs a budget per seed, got {len(hits)} hits and {len(budgets)} budgets")
    censored = [not math.isfinite(h) for h in hits]
    return judge([b if c else h for h, b, c in zip(hits, budgets, censored)], censored, tie, level, what, seeds)


def crossing(recs: list[dict], target: float, x: str) -> float:
    """x (e.g. "flops", "wall") at which the validation loss first reaches `target`, linearly
    interpolated between evaluations; inf when it never does."""
    prev = None
    for r in recs:
        if "val_loss" not in r or r.get("transition"):  # a V-cycle's mid-transition check is not a model it trains on
            continue
        if r["val_loss"] <= target:
            if prev is None or prev["val_loss"] == r["val_loss"]:
                return float(r[x])
            f = (prev["val_loss"] - target) / (prev["val_loss"] - r["val_loss"])
            return float(prev[x] + f * (r[x] - prev[x]))
        prev = r
    return math.inf


def eval_spacing(recs: list[dict]) -> float:
    """The largest FLOPs between two consecutive evaluations in the second half of a run (by FLOPs): the
    resolution of a time to target read from its curve (between evaluations it is interpolated). The target
    is a baseline's *final* loss, so it is crossed late; a one-off cost early in the run (SBLD's profile,
    charged at its step) widens an early interval that no crossing of the target falls in."""
    xs = [0.0] + [float(r["flops"]) for r in recs if "val_loss" in r and not r.get("transition")]
    half = xs[-1] / 2
    return max((b - a for a, b in zip(xs, xs[1:]) if b > half), default=math.inf)
