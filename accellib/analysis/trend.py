"""The scale trend: each technique's paired loss gap at equal FLOPs against model size, fitted log-linear.

The scale trend of results/scaling_trend.json (benchmarks/scaling.py, notebook 09): each technique's loss
gap to the baseline of the same size at equal FLOPs, against model size, with a fitted log-linear trend.

    gap(arm, size, seed) = val_loss(arm, seed) - val_loss(baseline, seed)     (paired by seed: same data order)
    gap ~ a + b * log10(N)      least squares over every (size, seed) point, N = non-embedding parameters

A negative gap means the technique beats the compute-matched baseline. Each size's gaps are judged by the
course's one rule (`accellib.analysis.stats.paired`: mean, 95% t-interval, wins / loses / not resolved). The slope
gets the same kind of interval (t with n - 2 degrees of freedom) and a word: per decade of N the gap
"rises" (the technique falls behind as models grow), "falls" (it gains), or is "flat within noise". The fit's zero crossing N* = 10^(-a/b) is where the line says
the sign flips; with R^2 of a few percent it says very little, so it is reported only beside R^2, and it
is an extrapolation, never a measurement.
"""
from __future__ import annotations

import math
import statistics

from .stats import from_gaps, t_quantile


def non_embedding_params(n_layer: int, d_model: int, mlp_ratio: int = 4) -> int:
    """Parameters of the blocks and the final LayerNorm (Kaplan et al. 2020's N): per block the attention's
    4 d^2 + 4 d, the MLP's 2 r d^2 + (r + 1) d and two LayerNorms' 4 d; the embeddings and head are left out."""
    d, r = d_model, mlp_ratio
    per_block = 4 * d * d + 4 * d + 2 * r * d * d + (r + 1) * d + 4 * d
    return n_layer * per_block + 2 * d


def paired_gaps(res: dict, control: str = "baseline") -> dict[str, list[dict]]:
    """{arm: [one row per size: n_layer, d_model, params, gaps (per seed), mean, sd, se, lo, hi, verdict]} for
    every technique arm; mean/se/lo/hi/verdict are `accellib.analysis.stats`' paired rule over the seeds. `control`:
    "baseline" (the same-size baseline) or "frontier" (the size's dense frontier, when the sweep has dense
    arms: the per-seed gaps compare computed, `accellib.compare.paired_gaps`)."""
    if control not in ("baseline", "frontier"):
        raise ValueError(f"control must be 'baseline' or 'frontier', got {control!r}")
    out: dict[str, list[dict]] = {}
    if control == "frontier" and not any(cell["summary"].get("frontier") for cell in res["cells"]):
        raise ValueError("this sweep has no dense arms: run python benchmarks/scaling.py --dense-only")
    for cell in res["cells"]:
        if control == "frontier" and not cell["summary"].get("frontier"):
            continue                       # a size without dense arms has no frontier
        rows = {r["arm"]: r for r in cell["summary"]["rows"]}
        base = rows["baseline"]["val_losses"]
        for arm, row in rows.items():
            if arm == "baseline" or arm.startswith("dense-"):
                continue
            if control == "frontier":
                gaps = row["vs_frontier"]["gaps"]
            else:
                gaps = [a - b for a, b in zip(row["val_losses"], base, strict=True)]
            p = from_gaps(gaps)
            out.setdefault(arm, []).append(dict(
                n_layer=cell["n_layer"], d_model=cell["d_model"],
                params=non_embedding_params(cell["n_layer"], cell["d_model"]), gaps=gaps,
                mean=p.mean, sd=statistics.stdev(gaps) if len(gaps) > 1 else 0.0, se=p.se, lo=p.lo, hi=p.hi,
                verdict=p.verdict, text=p.text(), baseline=statistics.fmean(base)))
    for rows in out.values():
        rows.sort(key=lambda r: r["params"])
    return out


def fit_log_trend(rows: list[dict]) -> dict:
    """Least-squares gap = a + b log10(N) over every (size, seed) point; the slope's standard error; the
    zero crossing N* = 10^(-a/b) (None when b = 0) and where it lies: "ahead" (above the largest N measured:
    the trend says the sign flips at a larger model), "inside" the measured range, or "behind" (below the
    smallest N: as N grows the line moves away from zero)."""
    xs = [math.log10(r["params"]) for r in rows for _ in r["gaps"]]
    ys = [g for r in rows for g in r["gaps"]]
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        raise ValueError(f"a trend needs points at >= 2 sizes and >= 3 in all, got {n} at {len(set(xs))} sizes")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    resid = [y - (a + b * x) for x, y in zip(xs, ys)]
    s2 = sum(e * e for e in resid) / (n - 2)
    ss_tot = sum((y - my) ** 2 for y in ys)
    cross = -a / b if b != 0 else None   # log10 N*
    where = None if cross is None else "ahead" if cross > max(xs) else "behind" if cross < min(xs) else "inside"
    se = math.sqrt(s2 / sxx)
    half = t_quantile(0.975, n - 2) * se
    lo, hi = b - half, b + half
    trend = "rises" if lo > 0 else "falls" if hi < 0 else "flat within noise"   # the gap (technique - control) per decade
    return dict(intercept=a, slope=b, slope_se=se, slope_lo=lo, slope_hi=hi, slope_verdict=trend, n_points=n,
                r2=1 - sum(e * e for e in resid) / ss_tot if ss_tot > 0 else 1.0,
                crossover_params=10 ** cross if cross is not None and cross < 300 else None, crossover=where)


def trend_table(res: dict, control: str = "baseline") -> list[dict]:
    """One row per technique: its gap (to `control`) at the smallest and the largest model, the fitted slope
    per decade of N with its standard error and interval, and the extrapolated zero crossing."""
    table = []
    for arm, rows in paired_gaps(res, control).items():
        fit = fit_log_trend(rows)
        table.append(dict(arm=arm, small=rows[0], large=rows[-1], **fit))
    return table
