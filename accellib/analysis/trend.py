"""The scale trend: each technique's paired loss gap at equal FLOPs against model size, fitted log-linear.

The scale trend of results/scaling_trend.json (benchmarks/scaling.py, notebook 09): each technique's loss
gap to the baseline of the same size (or to the size's dense frontier) at equal FLOPs, against model size,
with a fitted log-linear trend.

    gap(arm, size, seed) = val_loss(arm, seed) - val_loss(baseline, seed)     (paired by seed: same data order)
    mean gap(arm, size) ~ a + b * log10(N)   least squares on the per-size seed means, N = non-embedding parameters

A negative gap means the technique beats the compute-matched control. Each size's gaps are judged by the
course's one rule (`accellib.analysis.stats.paired`: mean, 95% t-interval, wins / loses / not resolved). The
slope is fitted on one point per size (the seeds of a size are repeats of that size, not more sizes: fitting
every seed as its own point is pseudo-replication, which keeps the line and shrinks its interval), so its
interval is Student's t with sizes - 2 residual degrees of freedom (1 for three sizes), and its word says
per decade of N the gap "rises" (the technique falls behind as models grow), "falls" (it gains), or is
"flat within noise". The fit's zero crossing N* = 10^(-a/b) is where the line says the sign flips: an
extrapolation, never a measurement.

Where the sweep stands (`sweep_regime`): every size's tokens per parameter, counted on all parameters
(`accellib.analysis.regime`), like every other experiment of the course; and whether each size's dense frontier
is bracketed (`sweep_frontier_edge`, `accellib.analysis.frontier.frontier_edge`).
"""
from __future__ import annotations

import math
import statistics
from functools import lru_cache

from .frontier import frontier_edge, is_plain
from .regime import regime
from .stats import RESOLUTION, from_gaps, t_quantile


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


@lru_cache(maxsize=None)
def _t975(df: int) -> float:
    return t_quantile(0.975, df)      # the 95% interval's t (a bisection: cached, the fits are many in a simulation)


def fit_log_trend(rows: list[dict], pooled: bool = False, by: str | None = None) -> dict:
    """Least squares gap = a + b log10(N) on the per-size seed means: one point per size (the mean of its seeds'
    paired gaps), so the residual degrees of freedom are sizes - 2 and the slope's 95% interval is Student's t with
    those df (the one rule's machinery, `accellib.analysis.stats.t_quantile`). The seeds of one size are repeated
    measurements of that size, not more sizes: fitting every (size, seed) point as if independent (`pooled=True`,
    kept to show the difference) gives the same line when every size has as many seeds, but counts seeds x sizes - 2
    df and an interval that is too narrow (pseudo-replication). Unweighted: each size's mean counts once.

    `by` (e.g. "d_model"): one intercept per value of that key and one common slope (the within-group trend,
    e.g. depth at each width, assumed the same in every group); df = points - groups - 1; `intercepts` holds the
    groups' intercepts and `intercept` the first group's.

    Returns the line (intercept, slope), the slope's standard error, interval and word (judged like a gap: the
    interval must clear zero by `stats.RESOLUTION`), the df, the points, sizes and groups fitted, R^2 (of the
    points fitted), and for one group the zero crossing N* = 10^(-a/b) (None when b = 0 or with groups) and
    where it lies: "ahead" (above the largest N measured), "inside" the measured range, or "behind" (below the
    smallest N: as N grows the line moves away from zero). The crossing is an extrapolation, never a
    measurement."""
    sizes = sorted({r["params"] for r in rows})
    pts = [(r[by] if by else None, math.log10(r["params"]), g)
           for r in rows for g in (r["gaps"] if pooled else [statistics.fmean(r["gaps"])])]
    groups = sorted({k for k, _, _ in pts}, key=str)
    n = len(pts)
    df = n - len(groups) - 1
    if df < 1 or (not pooled and len(sizes) != n):
        raise ValueError(f"a trend needs >= 3 sizes (one row each; >= 3 points when pooled, and one more per extra "
                         f"group), got {n} point(s) at {len(sizes)} size(s) in {len(groups)} group(s)")
    mean_x = {k: statistics.fmean(x for g, x, _ in pts if g == k) for k in groups}
    mean_y = {k: statistics.fmean(y for g, _, y in pts if g == k) for k in groups}
    sxx = sum((x - mean_x[k]) ** 2 for k, x, _ in pts)
    if sxx == 0:
        raise ValueError("a trend needs >= 2 sizes within a group")
    b = sum((x - mean_x[k]) * (y - mean_y[k]) for k, x, y in pts) / sxx
    a = {k: mean_y[k] - b * mean_x[k] for k in groups}
    resid = [y - (a[k] + b * x) for k, x, y in pts]
    s2 = sum(e * e for e in resid) / df
    my = statistics.fmean(y for _, _, y in pts)
    ss_tot = sum((y - my) ** 2 for _, _, y in pts)
    se = math.sqrt(s2 / sxx)
    half = _t975(df) * se
    lo, hi = b - half, b + half
    # the gap (technique - control) per decade, judged like a gap: the interval must clear zero by the resolution
    trend = "rises" if lo > RESOLUTION else "falls" if hi < -RESOLUTION else "flat within noise"
    a0 = a[groups[0]]
    cross = -a0 / b if b != 0 and len(groups) == 1 else None   # log10 N*
    xs = [x for _, x, _ in pts]
    where = None if cross is None else "ahead" if cross > max(xs) else "behind" if cross < min(xs) else "inside"
    return dict(intercept=a0, intercepts=a if by else None, slope=b, slope_se=se, slope_lo=lo, slope_hi=hi,
                slope_verdict=trend, df=df, n_points=n, n_sizes=len(sizes), n_groups=len(groups),
                fit=("pooled (size, seed) points" if pooled else "per-size seed means")
                    + (f", one intercept per {by}" if by else ""),
                r2=1 - sum(e * e for e in resid) / ss_tot if ss_tot > 0 else 1.0,
                crossover_params=10 ** cross if cross is not None and cross < 300 else None, crossover=where)


def trend_table(res: dict, control: str = "baseline", width: int | None = None, pooled: bool = False,
                by: str | None = None) -> list[dict]:
    """One row per technique: its gap (to `control`) at the smallest and the largest model, the fitted slope
    per decade of N (`fit_log_trend`: on the per-size seed means unless `pooled`; one intercept per `by`) with its
    standard error, interval and df, and the extrapolated zero crossing; `width`: only the sizes of that d_model
    (a depth-only trend)."""
    table = []
    for arm, rows in paired_gaps(res, control).items():
        rows = [r for r in rows if width is None or r["d_model"] == width]
        fit = fit_log_trend(rows, pooled=pooled, by=by)
        table.append(dict(arm=arm, small=rows[0], large=rows[-1], **fit))
    return table


def size_overrides(res: dict, cell: dict) -> list[str]:
    """The command-line overrides of configs/<res["config"]> that built one size (`cell`) of the sweep, as
    benchmarks/scaling.py passes them to `compare`: depth, width, heads of res["head_dim"], the size's LR, and the
    sweep's extra overrides (batch, evaluation)."""
    d = cell["d_model"]
    return [f"--model.n_layer={cell['n_layer']}", f"--model.d_model={d}", f"--model.n_head={d // res['head_dim']}",
            f"--optim.lr={cell['lr']:.6g}", *res["extra"]]


def sweep_regime(res: dict, cfg_of, train_tokens: int, params=None) -> dict[tuple[int, int], dict[str, dict]]:
    """Where every arm of every size stands: {(n_layer, d_model): {arm: accellib.analysis.regime.regime(...)}}
    (all parameters, tokens, tokens per parameter, epochs, D/N over the compute-optimal ~20). `cfg_of(cell, arm)`
    returns the arm's RunConfig at that size (e.g. `drivers.arms.arm_configs` with `size_overrides`; its data
    opened so the vocabulary is set); `params(cfg)` counts its parameters (default `regime.params_of`: all of
    them). Tokens are the arm's mean steps over seeds x the tokens one step of its config reads (one process); a
    V-cycle counts at its full size, as benchmarks/reproduce.py counts it."""
    if params is None:
        from .regime import params_of as params
    out: dict[tuple[int, int], dict[str, dict]] = {}
    for cell in res["cells"]:
        here = out[(cell["n_layer"], cell["d_model"])] = {}
        for row in cell["summary"]["rows"]:
            cfg = cfg_of(cell, row["arm"])
            per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len
            here[row["arm"]] = regime(row["steps"] * per_step, params(cfg), train_tokens)
    return out


def sweep_frontier_edge(res: dict, regimes: dict[tuple[int, int], dict[str, dict]]) -> dict[tuple[int, int], dict]:
    """Per size with dense arms, `accellib.analysis.frontier.frontier_edge` of its frontier: {bracketed, sizes,
    edge}. bracketed=False: the plain arm the frontier picked is the smallest (or largest) plain model tried, so the
    best plain model may lie beyond the arms tried and the frontier's loss is only an upper bound on it (a
    technique's gap to it, a lower bound on its gap to the best plain model)."""
    out = {}
    for cell in res["cells"]:
        front = cell["summary"].get("frontier")
        if not front:
            continue
        key = (cell["n_layer"], cell["d_model"])
        rows = [dict(arm=r["arm"], params=regimes[key][r["arm"]]["params"])
                for r in cell["summary"]["rows"] if is_plain(r["arm"])]
        out[key] = frontier_edge(rows, set(front["per_seed"].values()), "baseline")
    return out
