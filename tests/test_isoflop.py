"""accellib.analysis.isoflop: minima read only when interior, and the fits recover known exponents (issue 35)."""
import math
import random

import pytest

from accellib.analysis.isoflop import (fit_loss_surface, optimum, parabola_min, power_law, profile, profiles,
                                       scaling, tokens_at)


def law(n, d, alpha, beta, e=1.5, a=40.0, b=60.0):
    return e + a / n ** alpha + b / d ** beta


def synthetic(alpha=0.34, beta=0.34, budgets=(1e9, 1e10, 1e11, 1e12), noise=0.0, seeds=3, sizes=None):
    """An isoflop result whose losses follow L(N, D) with D = C / (6 N), on 9 log-spaced sizes around the optimum
    of each budget (N_opt ∝ C^(β/(α+β)) for this law)."""
    rng = random.Random(0)
    cells = {}
    for c in budgets:
        a_exp = beta / (alpha + beta)   # Hoffmann et al. eq. 4: N_opt = G (C/6)^a, G = (αA / βB)^(1/(α+β))
        centre = (alpha * 40.0 / (beta * 60.0)) ** (1 / (alpha + beta)) * (c / 6) ** a_exp
        ns = sizes or [centre * 2 ** (k / 2) for k in range(-4, 5)]
        rows, regime = [], {}
        for k, n in enumerate(ns):
            arm = f"dense-L1-d{k}"
            d = c / (6 * n)
            rows.append(dict(arm=arm, seed_labels=[f"seed{s}" for s in range(seeds)],
                             val_losses=[law(n, d, alpha, beta) + rng.gauss(0, noise) for _ in range(seeds)]))
            regime[arm] = dict(params=round(n), tokens=d)
        rows.append(dict(arm="baseline", seed_labels=["seed0"], val_losses=[9.0]))   # not in the profile
        cells[f"C{c:g}"] = dict(flops=c, summary=dict(rows=rows), regime=regime)
    return dict(cells=cells)


def test_parabola_vertex_is_exact():
    f = lambda x: 3 * (x - 1.25) ** 2 + 2.0
    x, y = parabola_min([0.0, 1.0, 3.0], [f(0.0), f(1.0), f(3.0)])
    assert x == pytest.approx(1.25) and y == pytest.approx(2.0)
    with pytest.raises(ValueError, match="do not curve upwards"):
        parabola_min([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])


def test_power_law_recovers_an_exact_exponent_and_states_its_df():
    cs = [1e10, 1e11, 1e12, 1e13]
    fit = power_law(cs, [3.0 * c ** 0.7 for c in cs])
    assert fit.exponent == pytest.approx(0.7) and fit.coef == pytest.approx(3.0)
    assert fit.df == 2 and fit.lo == pytest.approx(0.7) and fit.hi == pytest.approx(0.7)
    assert "(2 residual df)" in fit.text()
    assert math.isinf(power_law(cs[:2], [1.0, 2.0]).hi)   # two points: no residual, no interval


def test_power_law_interval_uses_the_residual_df():
    cs, ys = [1.0, 10.0, 100.0], [1.0, 12.0, 90.0]
    fit = power_law(cs, ys)
    # by hand: slope and its standard error on (log10-free) natural logs, t(0.975, 1) = 12.706
    x = [math.log(c) for c in cs]
    y = [math.log(v) for v in ys]
    mx, my = sum(x) / 3, sum(y) / 3
    sxx = sum((a - mx) ** 2 for a in x)
    b = sum((a - mx) * (c - my) for a, c in zip(x, y)) / sxx
    se = math.sqrt(sum((c - my - b * (a - mx)) ** 2 for a, c in zip(x, y)) / 1 / sxx)
    assert fit.exponent == pytest.approx(b)
    assert fit.hi - fit.exponent == pytest.approx(12.7062047 * se, rel=1e-5)


@pytest.mark.parametrize("alpha,beta", [(0.34, 0.34), (0.5, 0.25), (0.25, 0.5)])
def test_scaling_recovers_the_known_exponent(alpha, beta):
    res = synthetic(alpha, beta)
    s = scaling(res)
    assert s["edges"] == {} and len(s["optima"]) == 4
    want = beta / (alpha + beta)
    assert s["n_law"].exponent == pytest.approx(want, abs=0.02)
    assert s["d_law"].exponent == pytest.approx(1 - want, abs=0.02)
    assert s["n_law"].df == 2


def test_the_optimum_is_near_the_true_minimum_and_d_over_n_has_an_interval():
    res = synthetic(noise=0.002)
    p = profiles(res)[1]
    o = optimum(p)
    c = p.flops
    # the true optimum of L(N, C/(6N)) by a fine scan
    grid = [10 ** (k / 400) for k in range(400 * 2, 400 * 7)]
    n_true = min(grid, key=lambda n: law(n, c / (6 * n), 0.34, 0.34))
    assert abs(math.log(o["n_opt"] / n_true)) < 0.1
    assert o["tokens_per_param_lo"] < o["tokens_per_param"] < o["tokens_per_param_hi"] and o["n"] == 3
    assert tokens_at(p, o["n_opt"]) == pytest.approx(c / (6 * o["n_opt"]), rel=1e-4)   # D = C / 6N is log-linear


def test_a_minimum_at_the_edge_is_reported_and_never_read():
    res = synthetic(budgets=(1e10,), sizes=[1e6, 2e6, 4e6, 8e6])   # all far above the optimum: smallest is best
    p = profile(res["cells"]["C1e+10"], "C1e+10")
    assert p.edge == "smaller" and p.arms[p.best] == "dense-L1-d0"
    with pytest.raises(ValueError, match="smaller edge .*train a smaller model"):
        optimum(p)
    s = scaling(res)
    assert s["edges"] == {"C1e+10": "smaller"} and s["optima"] == [] and "n_law" not in s
    res2 = synthetic(budgets=(1e10,), sizes=[10.0, 20.0, 40.0])   # far below: the largest is best
    assert profile(res2["cells"]["C1e+10"]).edge == "larger"


def test_a_profile_needs_three_sizes():
    res = synthetic(budgets=(1e10,), sizes=[1e3, 2e3])
    with pytest.raises(ValueError, match=">= 3 model sizes"):
        profile(res["cells"]["C1e+10"], "C1e+10")


def test_loss_surface_fit_recovers_the_law():
    pts = []
    for c in (1e9, 1e10, 1e11, 1e12):
        for k in range(-3, 4):
            n = 0.3 * (c / 6) ** 0.5 * 2 ** (k / 2)
            pts.append((n, c / (6 * n), law(n, c / (6 * n), 0.34, 0.28)))
    fit = fit_loss_surface(pts)
    assert fit["rms"] < 1e-3
    assert fit["a"] == pytest.approx(0.28 / 0.62, abs=0.05)
    assert fit["E"] == pytest.approx(1.5, abs=0.1)


def _cell(rows, flops=1e12, regime=None):
    return dict(flops=flops, summary=dict(rows=[dict(arm=a, seed_labels=[f"seed{k}" for k in range(len(v))],
                                                     val_losses=list(v)) for a, v in rows.items()]),
                regime=regime or {})


def test_frontier_gaps_pair_the_trend_with_the_grid_and_refuse_other_baselines():
    from accellib.analysis.isoflop import frontier_gaps
    base = [2.50, 2.52, 2.49]
    grid = {"baseline": base, "dense-L1-d16": [2.30, 2.31, 2.32], "dense-L1-d32": [2.10, 2.12, 2.11],
            "dense-L1-d64": [2.20, 2.21, 2.19]}
    iso = dict(cells={"4x64": _cell(grid, regime={a: dict(params=p, tokens=1e12 / 6 / p) for a, p in
                                                 (("baseline", 4e5), ("dense-L1-d16", 1e4), ("dense-L1-d32", 3e4),
                                                  ("dense-L1-d64", 9e4))})})
    trend = dict(cells=[dict(n_layer=4, d_model=64, summary=dict(rows=_cell(
        {"baseline": base, "pld": [2.55, 2.50, 2.51], "dense-L2": [2.25, 2.26, 2.24]})["summary"]["rows"])),
        dict(n_layer=4, d_model=128, summary=dict(rows=[]))])      # a size the grid has no budget for: skipped
    out = frontier_gaps(iso, trend)
    assert list(out) == ["4x64"]
    f = out["4x64"]
    assert set(f["pick"].values()) == {"dense-L1-d32"} and f["bracketed"] and f["baseline_diff"] == 0
    want = [a - b for a, b in zip([2.55, 2.50, 2.51], [2.10, 2.12, 2.11])]
    assert f["gaps"]["pld"].gaps == pytest.approx(want) and f["gaps"]["pld"].verdict == "loses"
    assert "dense-L2" not in f["gaps"] and f["rows"]["pld"]["gaps"] == pytest.approx(want)
    iso["cells"]["4x64"]["summary"]["rows"][0]["val_losses"] = [2.6, 2.52, 2.49]   # another baseline run
    with pytest.raises(ValueError, match="do not share their baseline runs"):
        frontier_gaps(iso, trend)


def test_the_docs_table_and_the_readme_line_are_the_caches():
    """docs/results.md holds isoflop_table(results/isoflop.json) verbatim, and the README states its exponents."""
    from accellib import REPO_ROOT
    from accellib.analysis.isoflop import isoflop_table
    from accellib.analysis.results import load_result
    res = load_result("isoflop")
    table = isoflop_table(res)
    assert table in (REPO_ROOT / "docs" / "results.md").read_text(), (
        "docs/results.md: the IsoFLOP table differs from the cache; paste the output of python -c 'from "
        "accellib.analysis.isoflop import isoflop_table; from accellib.analysis.results import load_result; "
        "print(isoflop_table(load_result(\"isoflop\")))'")
    s = scaling(res)
    assert all(p.edge is None for p in profiles(res)) and len(s["optima"]) >= 3
    assert max(o["flops"] for o in s["optima"]) / min(o["flops"] for o in s["optima"]) >= 10
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"a = {s['n_law'].text()}" in readme and f"b = {s['d_law'].text()}" in readme
    tpp = [o["tokens_per_param"] for o in s["optima"]]
    said = f"{round(min(tpp))}–{round(max(tpp))} tokens per parameter"    # the ratio at the optimum, as both pages say
    assert said in readme and said in (REPO_ROOT / "docs" / "results.md").read_text().replace("\n", " ")


def test_generated_yamls_stay_out_of_the_comparisons_folder(tmp_path):
    """A comparison's folder holds only accellib's files (issue 36 refuses any other), so every YAML that
    benchmarks/ generates for a comparison is written beside its folder, never into it."""
    import sys
    from accellib import REPO_ROOT
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import isoflop
    import reproduce
    out = tmp_path / "runs" / "cmp"
    for p in (reproduce.lr_sweep_yaml(out), isoflop.budget_yaml(out, "4x64@80")[0]):
        assert p.parent == out.parent and p.is_file() and not out.exists()
    arms = isoflop.budget_yaml(out, "4x64@80", {32: (0.5, 2.0)}, only_checks=True)[1]
    assert arms == ["baseline", "lrx0.5-L1-d32", "lrx2-L1-d32"]


def test_lr_check_pairs_with_the_grid_and_says_whether_the_rule_is_interior():
    from accellib.analysis.isoflop import lr_check
    iso = dict(cells={"B": _cell({"baseline": [3.0, 3.1, 3.2], "dense-L1-d32": [2.0, 2.1, 2.2]})})
    chk = dict(cells={"B": dict(_cell({"baseline": [3.0, 3.1, 3.2], "lrx0.5-L1-d32": [2.05, 2.16, 2.24],
                                         "lrx2-L1-d32": [1.90, 2.0, 2.11]}),
                                lr_check=dict(width=32, rule_arm="dense-L1-d32", multiples=[0.5, 2.0],
                                              arms=["lrx0.5-L1-d32", "lrx2-L1-d32"]))})
    out = lr_check(iso, chk)["B"]
    assert out["gaps"][0.5].verdict == "loses" and out["gaps"][2.0].verdict == "wins" and out["interior"] is False
    assert out["gaps"][2.0].gaps == pytest.approx((-0.1, -0.1, -0.09))
    chk["cells"]["B"]["summary"]["rows"][0]["val_losses"] = [3.5, 3.1, 3.2]
    with pytest.raises(ValueError, match="do not share their baseline runs"):
        lr_check(iso, chk)


def test_a_seed_whose_minimum_lies_beyond_the_three_points_is_refused():
    # by the seed mean the second model is best (interior), but seed 1's three points keep falling: its parabola's
    # vertex lies beyond the third model, an extrapolation the optimum must not report
    rows = {f"dense-L1-d{k}": v for k, v in enumerate(zip([2.0, 1.0, 1.5, 3.0], [2.0, 1.2, 0.9, 3.0]))}
    cell = _cell(rows, regime={a: dict(params=10 ** (3 + k), tokens=1e6 / 10 ** k) for k, a in enumerate(rows)})
    p = profile(cell, "B")
    assert p.edge is None and p.arms[p.best] == "dense-L1-d1"
    with pytest.raises(ValueError, match="seed seed1's parabola has its minimum outside"):
        optimum(p)
