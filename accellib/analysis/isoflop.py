"""The compute-optimal frontier found, in miniature: IsoFLOP profiles, their minima, and N_opt(C), D_opt(C).

Hoffmann et al. (2022, "Training Compute-Optimal Large Language Models"), section 3.2 ("approach 2: IsoFLOP
profiles"): at a fixed budget C, train models of several sizes N, each for the tokens D the budget allows; the
final loss against log N is U-shaped, and a parabola through the points around its minimum places N_opt(C). Over
several budgets, N_opt ∝ C^a and D_opt ∝ C^b (a + b = 1 when C ∝ N D); they found a ≈ b ≈ 0.5, i.e. a roughly
constant ~20 tokens per parameter at the optimum. Section 3.3 ("approach 3") fits L(N, D) = E + A / N^α + B / D^β
to every run (Huber loss on log L, L-BFGS from a grid of starting points); then a = β / (α + β).

How accellib judges the parts (the numbers of notebook 00, section 7, and of the closing notes):
- **Interior or edge.** A profile's minimum (the lowest seed-mean loss) is interior only when a smaller and a
  larger model were measured and both are worse; otherwise `Profile.edge` says which side is missing and no
  optimum is read from it (`optimum` raises).
- **The minimum.** A parabola in x = ln N through the best point and its two neighbours (exact, 3 points), on
  each seed's losses at those three models: one N_opt per seed; D_opt is the tokens a model of that size reads
  at the budget (interpolated log-linearly between the measured runs' tokens, which the budget fixes).
- **The exponents.** The log-log slope of N_opt (and D_opt) against C by least squares over the budgets, on the
  seed-mean log optima (one point per budget: seeds are not independent points); its 95% interval is Student's
  t with the fit's residual degrees of freedom (budgets - 2), stated with it.
- **Tokens per parameter at the optimum.** Per budget, D_opt / N_opt per seed, summarised by the one rule
  (`stats.from_gaps`, on the logs: a geometric mean with a 95% t-interval over seeds).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .stats import from_gaps, t_quantile

PREFIX = "dense-L1-d"   # the profile's arms: one-block plain models of several widths (benchmarks/isoflop.py)


@dataclass
class Profile:
    """One budget's IsoFLOP profile: the arms sorted by parameters, each seed's final loss and the tokens read."""
    budget: str
    flops: float
    arms: list[str]
    params: list[int]
    tokens: list[float]
    losses: dict[str, dict[str, float]]   # arm -> seed label -> final validation loss

    @property
    def seeds(self) -> list[str]:
        return sorted(set.intersection(*(set(v) for v in self.losses.values())))

    @property
    def means(self) -> list[float]:
        return [statistics.fmean(self.losses[a][s] for s in self.seeds) for a in self.arms]

    @property
    def best(self) -> int:
        m = self.means
        return min(range(len(m)), key=m.__getitem__)

    @property
    def edge(self) -> str | None:
        """None when the minimum is interior; else which neighbour is missing ('smaller' / 'larger')."""
        if self.best == 0:
            return "smaller"
        if self.best == len(self.arms) - 1:
            return "larger"
        return None


def profile(cell: dict, name: str = "", prefix: str = PREFIX) -> Profile:
    """The profile of one budget of results/isoflop.json (`cell` = res["cells"][name]): its arms named
    `prefix`<width>, with all parameters and tokens from the cell's regime record."""
    rows = [r for r in cell["summary"]["rows"] if r["arm"].startswith(prefix)]
    if len(rows) < 3:
        raise ValueError(f"budget {name or '?'}: an IsoFLOP profile needs >= 3 model sizes, got {len(rows)}")
    rows.sort(key=lambda r: cell["regime"][r["arm"]]["params"])
    return Profile(budget=name, flops=float(cell["flops"]), arms=[r["arm"] for r in rows],
                   params=[cell["regime"][r["arm"]]["params"] for r in rows],
                   tokens=[float(cell["regime"][r["arm"]]["tokens"]) for r in rows],
                   losses={r["arm"]: dict(zip(r["seed_labels"], r["val_losses"])) for r in rows})


def profiles(res: dict) -> list[Profile]:
    """Every budget of results/isoflop.json, in increasing FLOPs."""
    return sorted((profile(c, k) for k, c in res["cells"].items()), key=lambda p: p.flops)


def parabola_min(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """The vertex (x*, y*) of the parabola through three points; an error when it opens downwards or is flat
    (no minimum to read)."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    d1, d2 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    a = (d2 - d1) / (x2 - x0)
    if not a > 0:
        raise ValueError("the three points around the minimum do not curve upwards: no minimum to read")
    b = d1 - a * (x0 + x1)
    x = -b / (2 * a)
    return x, y0 + (x - x0) * (d1 + a * (x - x1))


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation (linear extrapolation beyond the ends)."""
    k = max(1, min(len(xs) - 1, sum(1 for v in xs if v < x)))
    t = (x - xs[k - 1]) / (xs[k] - xs[k - 1])
    return ys[k - 1] + t * (ys[k] - ys[k - 1])


def tokens_at(p: Profile, n: float) -> float:
    """Tokens a model of n parameters reads at the budget (log-linear between the measured sizes)."""
    return math.exp(_interp([math.log(v) for v in p.params], [math.log(v) for v in p.tokens], math.log(n)))


def optimum(p: Profile) -> dict:
    """The budget's optimum: per seed, the parabola in ln N through the seed's losses at the best model (by the
    seed mean) and its two neighbours -> N_opt, D_opt, the loss there and D/N; with their seed means (geometric for
    N, D and D/N) and the one rule's interval for D/N (on its logs)."""
    if p.edge:
        raise ValueError(f"budget {p.budget}: the profile's minimum is at its {p.edge} edge ({p.arms[p.best]}); "
                         f"train a {p.edge} model before reading an optimum from it")
    k = p.best
    xs = [math.log(v) for v in p.params[k - 1:k + 2]]
    per = {}
    for s in p.seeds:
        x, y = parabola_min(xs, [p.losses[a][s] for a in p.arms[k - 1:k + 2]])
        if not xs[0] <= x <= xs[2]:   # the vertex would be an extrapolation: this seed's minimum is not bracketed
            raise ValueError(f"budget {p.budget}: seed {s}'s parabola has its minimum outside the three models around "
                             f"the best ({p.arms[k - 1]} .. {p.arms[k + 1]}); measure the profile more finely there")
        n = math.exp(x)
        d = tokens_at(p, n)
        per[s] = dict(n_opt=n, d_opt=d, loss=y, tokens_per_param=d / n)
    logs = lambda key: [math.log(v[key]) for v in per.values()]
    ratio = from_gaps(logs("tokens_per_param"), what=f"budget {p.budget}: ln(D/N) at the optimum", seeds=list(per))
    return dict(budget=p.budget, flops=p.flops, best_arm=p.arms[k], per_seed=per,
                n_opt=math.exp(statistics.fmean(logs("n_opt"))), d_opt=math.exp(statistics.fmean(logs("d_opt"))),
                loss=statistics.fmean(v["loss"] for v in per.values()),
                tokens_per_param=math.exp(ratio.mean), tokens_per_param_lo=math.exp(ratio.lo),
                tokens_per_param_hi=math.exp(ratio.hi), n=ratio.n)


@dataclass
class PowerLaw:
    """y = coef * C^exponent, by least squares on (ln C, ln y), with a 95% t-interval on the exponent."""
    exponent: float
    lo: float
    hi: float
    coef: float
    df: int          # residual degrees of freedom: points - 2

    def __call__(self, c: float) -> float:
        return self.coef * c ** self.exponent

    def text(self) -> str:
        return f"{self.exponent:.2f} [{self.lo:.2f}, {self.hi:.2f}] ({self.df} residual df)"


def power_law(cs: list[float], ys: list[float], level: float = 0.95) -> PowerLaw:
    """The log-log least-squares line through (C, y); the interval from the slope's standard error and Student's t
    with len(cs) - 2 degrees of freedom (none with only two points: the interval is then infinite)."""
    if len(cs) < 2:
        raise ValueError("a power law needs at least two budgets")
    x, y = [math.log(c) for c in cs], [math.log(v) for v in ys]
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    df = len(x) - 2
    if df > 0:
        resid = sum((b - my - slope * (a - mx)) ** 2 for a, b in zip(x, y))
        half = t_quantile(0.5 + level / 2, df) * math.sqrt(resid / df / sxx)
    else:
        half = math.inf
    return PowerLaw(slope, slope - half, slope + half, math.exp(my - slope * mx), df)


def scaling(res: dict) -> dict:
    """Every budget's optimum and the fitted N_opt(C), D_opt(C): {"optima": [...], "n_law", "d_law",
    "interior": [budgets whose minimum is interior], "edges": {budget: side}}. The laws use the interior ones."""
    profs = profiles(res)
    edges = {p.budget: p.edge for p in profs if p.edge}
    optima = [optimum(p) for p in profs if not p.edge]
    out = dict(optima=optima, interior=[o["budget"] for o in optima], edges=edges)
    if len(optima) >= 2:
        cs = [o["flops"] for o in optima]
        out["n_law"] = power_law(cs, [o["n_opt"] for o in optima])
        out["d_law"] = power_law(cs, [o["d_opt"] for o in optima])
    return out


def fit_loss_surface(points: list[tuple[float, float, float]], delta: float = 1e-3) -> dict:
    """Approach 3: L(N, D) = E + A / N^α + B / D^β fitted to (N, D, loss) points by Hoffmann et al.'s recipe
    (section 3.3 and appendix D.2: the Huber loss, δ = 1e-3, between log L and the log-sum-exp form of the
    model, minimised by L-BFGS from a grid of starting points). Returns the parameters, a = β / (α + β), and the
    fit's quality: the RMS residual of the loss in nats and the number of points per parameter."""
    import numpy as np
    from scipy.optimize import minimize
    from scipy.special import huber, logsumexp
    n, d, loss = (np.array(v, dtype=float) for v in zip(*points))
    ln_n, ln_d, ln_l = np.log(n), np.log(d), np.log(loss)

    def objective(p):
        a, b, e, alpha, beta = p
        pred = logsumexp([a - alpha * ln_n, b - beta * ln_d, np.full_like(ln_n, e)], axis=0)
        return huber(delta, pred - ln_l).sum()
    best = None
    for a in (0.0, 10.0):            # a coarser grid than their 1,500 starts: 32 (5 parameters, ~30 points)
        for b in (0.0, 10.0):
            for e in (-1.0, 0.5):
                for alpha in (0.25, 1.0):
                    for beta in (0.25, 1.0):
                        r = minimize(objective, [a, b, e, alpha, beta], method="L-BFGS-B")
                        if best is None or r.fun < best.fun:
                            best = r
    a, b, e, alpha, beta = best.x
    pred = np.exp(a - alpha * ln_n) + np.exp(b - beta * ln_d) + np.exp(e)
    return dict(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=float(alpha), beta=float(beta),
                a=float(beta / (alpha + beta)) if alpha + beta > 0 else math.nan,
                rms=float(np.sqrt(np.mean((pred - loss) ** 2))), points=len(points), params=5)


def frontier_gaps(iso: dict, trend: dict, tol: float = 1e-3) -> dict[str, dict]:
    """Each technique of the scale trend (results/scaling_trend.json) against the compute-optimal plain model of its
    own budget, found by the IsoFLOP grid (results/isoflop.json, whose budgets are the trend's width-64 baselines):
    {"LxD": {"pick": {seed: arm}, "bracketed": bool, "baseline_diff": nats, "gaps": {arm: Paired}, "rows": {arm:
    row for accellib.analysis.trend.fit_log_trend}}}. The frontier is `accellib.analysis.frontier.joint_frontier` of
    the trend's size and the grid's budget (the plain models of both, the per-seed leave-one-out choice; the two must
    hold the same baseline runs, per seed within `tol`, or the budget is refused); "bracketed" says the chosen
    models are interior widths of the grid's profile."""
    from .frontier import is_plain, joint_frontier
    from .stats import Paired
    from .trend import non_embedding_params
    out = {}
    for cell in trend["cells"]:
        key = f"{cell['n_layer']}x{cell['d_model']}"
        if key not in iso["cells"]:
            continue
        try:
            joint = joint_frontier(dict(name=f"scaling_trend {key}", summary=cell["summary"]),
                                   dict(name=f"isoflop {key}", summary=iso["cells"][key]["summary"]), tol)
        except ValueError as e:
            raise ValueError(f"budget {key}: {e}") from None
        pick = joint["frontier"]["per_seed"]
        gaps = {r["arm"]: Paired.from_dict(r["vs_frontier"]) for r in joint["rows"] if not is_plain(r["arm"])}
        rows = {a: dict(n_layer=cell["n_layer"], d_model=cell["d_model"], gaps=list(p.gaps),
                        params=non_embedding_params(cell["n_layer"], cell["d_model"])) for a, p in gaps.items()}
        prof = profile(iso["cells"][key], key)
        out[key] = dict(pick=pick, baseline_diff=joint["baseline_diff"], gaps=gaps, rows=rows,
                        flops=float(iso["cells"][key]["flops"]),
                        bracketed=prof.edge is None and set(pick.values()) <= set(prof.arms[1:-1]))
    return out


def plot_isoflop(res: dict, marks: dict[str, tuple[float, float, float]] | None = None, scale=None):
    """The miniature of Hoffmann et al.'s Figure 3: (left) each budget's IsoFLOP profile, final loss against all
    parameters N (seed means ± SE, seeds as dots), its parabola and minimum; (middle) N_opt against C with the fitted
    power law; (right) D_opt against C likewise. `marks` {label: (C, N, D)} places other models on the middle and right
    panels (e.g. the tutorial baseline and the papers'-regime baseline); `scale` = scaling(res) if computed."""
    import matplotlib.pyplot as plt
    s = scale or scaling(res)
    profs = profiles(res)
    cmap = plt.get_cmap("viridis")
    colors = {p.budget: cmap(k / max(1, len(profs) - 1) * 0.85) for k, p in enumerate(profs)}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    opt = {o["budget"]: o for o in s["optima"]}
    for p in profs:
        c = colors[p.budget]
        se = [statistics.stdev([p.losses[a][k] for k in p.seeds]) / math.sqrt(len(p.seeds)) for a in p.arms]
        for a, n in zip(p.arms, p.params):
            ax.scatter([n] * len(p.seeds), [p.losses[a][k] for k in p.seeds], s=6, color=c, alpha=0.4)
        ax.errorbar(p.params, p.means, yerr=se, color=c, marker="o", ms=4, capsize=2, lw=1,
                    label=f"{p.flops / 1e12:.2f}e12 FLOPs ({p.budget})")
        if p.budget in opt:
            k = p.best
            xs = [math.log(v) for v in p.params[k - 1:k + 2]]
            ys = p.means[k - 1:k + 2]
            grid = [xs[0] + (xs[2] - xs[0]) * t / 40 for t in range(41)]
            lag = lambda x: sum(ys[i] * math.prod((x - xs[j]) / (xs[i] - xs[j]) for j in range(3) if j != i)
                                for i in range(3))
            ax.plot([math.exp(x) for x in grid], [lag(x) for x in grid], color=c, lw=2, alpha=0.5)
            ax.plot([opt[p.budget]["n_opt"]], [opt[p.budget]["loss"]], "D", color=c, mec="black", ms=6, zorder=5)
        else:
            ax.annotate(f"minimum at the {p.edge} edge", (p.params[p.best], p.means[p.best]), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("parameters N (all)")
    ax.set_ylabel("final val loss (nats/token)")
    ax.set_title("IsoFLOP profiles (one-block models)", fontsize=9)
    ax.legend(fontsize=7)
    for ax, key, law, ylabel in ((axes[1], "n_opt", "n_law", "N_opt (parameters, all)"),
                                 (axes[2], "d_opt", "d_law", "D_opt (tokens)")):
        cs = [o["flops"] for o in s["optima"]]
        ax.scatter(cs, [o[key] for o in s["optima"]], c=[colors[o["budget"]] for o in s["optima"]], marker="D",
                   edgecolors="black", zorder=5, label="each budget's minimum")
        for o in s["optima"]:
            vals = [v[key] for v in o["per_seed"].values()]
            ax.plot([o["flops"]] * len(vals), vals, ".", color="grey", ms=4)
        if law in s:
            ends = cs + [m[0] for m in (marks or {}).values()]
            xs = [min(ends) * (max(ends) / min(ends)) ** (t / 20) for t in range(21)]
            ax.plot(xs, [s[law](x) for x in xs], "k--", lw=1, label=f"fit: exponent {s[law].text()}")
        for k, (name, m) in enumerate((marks or {}).items()):
            ax.plot([m[0]], [m[1] if key == "n_opt" else m[2]], ["*", "P", "X"][k % 3], ms=11,
                    color=["#d62728", "#ff7f0e", "#9467bd"][k % 3], mec="white", label=name, zorder=6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.yaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("training FLOPs C")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    axes[1].set_title("compute-optimal size", fontsize=9)
    axes[2].set_title("compute-optimal tokens", fontsize=9)
    fig.tight_layout()
    return fig


def trend_rows(found: dict[str, dict]) -> dict[str, list[dict]]:
    """`frontier_gaps`' result in the shape of `accellib.analysis.trend.paired_gaps` ({arm: one row per size, by
    size}: n_layer, d_model, params (non-embedding), gaps, mean, lo, hi, verdict, text), so notebook 09's tables,
    figures and `fit_log_trend` take the gaps to the found frontier as they take the others."""
    out: dict[str, list[dict]] = {}
    for f in found.values():
        for arm, p in f["gaps"].items():
            out.setdefault(arm, []).append(dict(f["rows"][arm], mean=p.mean, se=p.se, lo=p.lo, hi=p.hi,
                                                verdict=p.verdict, text=p.text()))
    for rows in out.values():
        rows.sort(key=lambda r: r["params"])
    return out


def isoflop_table(res: dict) -> str:
    """docs/results.md's table of results/isoflop.json (tests/test_isoflop.py checks it is there verbatim): per
    budget its FLOPs, the best model measured and whether it is interior, the fitted optimum N_opt, D_opt and D/N
    with its interval over seeds; then the two power laws with their intervals and residual df."""
    s = scaling(res)
    opt = {o["budget"]: o for o in s["optima"]}
    lines = ["| budget | FLOPs | best model measured | N_opt (all params) | D_opt (tokens) | D/N at the optimum, 95% CI |",
             "|---|---|---|---|---|---|"]
    for p in profiles(res):
        o = opt.get(p.budget)
        where = "interior" if not p.edge else f"at the {p.edge} edge"
        cells = (f"{o['n_opt']:,.0f} | {o['d_opt']:,.0f} | {o['tokens_per_param']:.0f} "
                 f"[{o['tokens_per_param_lo']:.0f}, {o['tokens_per_param_hi']:.0f}] (n={o['n']})") if o else "— | — | —"
        lines.append(f"| {p.budget} | {p.flops:.2e} | {p.arms[p.best]} ({where}) | {cells} |")
    if "n_law" in s:
        lines += ["", f"N_opt ∝ C^a, a = {s['n_law'].text()}; D_opt ∝ C^b, b = {s['d_law'].text()} "
                      "(Hoffmann et al. 2022: a ≈ b ≈ 0.5)."]
    return "\n".join(lines)


def lr_check(iso: dict, check: dict, tol: float = 1e-3) -> dict[str, dict]:
    """Each budget's best model at other multiples of the rule's LR (results/isoflop_lr.json) against its run at the
    rule's LR in the grid (results/isoflop.json), paired by seed: {budget: {"width", "gaps": {multiple: Paired}
    (other LR minus the rule's), "interior": no other LR wins}}. Both caches must hold the same baseline runs."""
    out = {}
    for name, cell in check["cells"].items():
        grid = {r["arm"]: dict(zip(r["seed_labels"], r["val_losses"])) for r in iso["cells"][name]["summary"]["rows"]}
        rows = {r["arm"]: dict(zip(r["seed_labels"], r["val_losses"])) for r in cell["summary"]["rows"]}
        diff = max(abs(rows["baseline"][k] - grid["baseline"][k]) for k in rows["baseline"])
        if diff > tol:
            raise ValueError(f"budget {name}: the LR check and the IsoFLOP grid do not share their baseline runs "
                             f"(largest difference {diff:.2g} nats > {tol})")
        c = cell["lr_check"]
        rule = grid[c["rule_arm"]]
        gaps = {}
        for arm, m in zip(c["arms"], c["multiples"]):
            seeds = [k for k in rows[arm] if k in rule]
            gaps[m] = from_gaps([rows[arm][k] - rule[k] for k in seeds], what=f"{arm} at {name}", seeds=seeds)
        out[name] = dict(width=c["width"], gaps=gaps, interior=all(p.verdict != "wins" for p in gaps.values()))
    return out


def family_optimum(res: dict) -> dict:
    """The compute-optimum of the baseline's own family at an equal-FLOPs experiment's budget: its plain arms of the
    baseline's width (the baseline and `dense-L<n>`, not the `-d<w>` ones) as an IsoFLOP profile, the parabola in
    ln N through the best of them and its two neighbours, per seed (`accellib.analysis.isoflop.optimum`, Hoffmann
    et al.'s approach 2). Returns that optimum (per seed and geometric means: n_opt, d_opt, tokens_per_param with
    its interval) with `arms` (the profile, by size) and `baseline_over_opt`: the baseline's parameters over N_opt
    (> 1: larger than compute-optimal for its FLOPs, so a smaller model of the family does better)."""
    from .frontier import DENSE, is_dense
    rows = {r["arm"]: r for r in res["summary"]["rows"]}
    arms = sorted((a for a in rows if a == "baseline" or (is_dense(a) and DENSE.match(a).group(2) is None)),
                  key=lambda a: res["regime"][a]["params"])
    prof = Profile(budget=res.get("name", ""), flops=float(res["budget"]["per_seed"]["0"]["baseline_flops"]),
                   arms=arms, params=[res["regime"][a]["params"] for a in arms],
                   tokens=[float(res["regime"][a]["tokens"]) for a in arms],
                   losses={a: dict(zip(rows[a]["seed_labels"], rows[a]["val_losses"])) for a in arms})
    o = optimum(prof)
    return dict(o, arms=arms, baseline_over_opt=res["regime"]["baseline"]["params"] / o["n_opt"])
