"""accellib/analysis/trend.py: the scale-trend analysis of notebook 09 (paired gaps, log-linear fit on the per-size
seed means, zero crossing, the sweep's regime and frontier bracket)."""
import math
import random
from types import SimpleNamespace

import pytest

from accellib.models.transformer import ModelConfig, Transformer
from accellib.analysis.trend import (fit_log_trend, non_embedding_params, paired_gaps, size_overrides,
                                     sweep_frontier_edge, sweep_regime, trend_table)


def fake_result(gap_of, sizes=((4, 64), (6, 128), (12, 192)), base=(2.0, 2.1, 2.2)):
    """A results/scaling_trend.json-shaped record whose pld gap is gap_of(params, seed index)."""
    cells = []
    for L, d in sizes:
        n = non_embedding_params(L, d)
        rows = [dict(arm="baseline", val_losses=list(base)),
                dict(arm="pld", val_losses=[b + gap_of(n, i) for i, b in enumerate(base)])]
        cells.append(dict(n_layer=L, d_model=d, summary=dict(rows=rows)))
    return dict(cells=cells)


@pytest.mark.parametrize("L,d", [(4, 64), (6, 128), (12, 192)])
def test_non_embedding_params_counts_the_model(L, d):
    m = Transformer(ModelConfig(n_layer=L, d_model=d, n_head=d // 16, seq_len=64, tie_head=False))
    skip = ("transformer.wte", "transformer.wpe", "lm_head")
    assert non_embedding_params(L, d) == sum(p.numel() for k, p in m.named_parameters() if not k.startswith(skip))


def test_exact_line_is_recovered_with_its_crossover():
    # gap = 0.3 - 0.05 log10(N): zero at N = 10^6; seeds add +-0.01 symmetrically, so each size's mean is on the line
    res = fake_result(lambda n, i: 0.3 - 0.05 * math.log10(n) + (-0.01, 0.0, 0.01)[i])
    (row,) = trend_table(res)
    assert row["arm"] == "pld" and row["n_points"] == 3 and row["n_sizes"] == 3 and row["df"] == 1
    assert row["fit"] == "per-size seed means"
    assert row["slope"] == pytest.approx(-0.05, abs=1e-12) and row["intercept"] == pytest.approx(0.3, abs=1e-11)
    assert row["crossover_params"] == pytest.approx(1e6, rel=1e-9) and row["crossover"] == "inside"
    assert row["slope_se"] == pytest.approx(0, abs=1e-12) and row["r2"] == pytest.approx(1)


def noisy_rows(rng, slope, sizes=(1e5, 3e5, 1e6, 3e6), seeds=3, size_sd=0.02, seed_sd=0.01):
    """Rows of a sweep whose true gap is 0.3 + slope log10(N): each size has its own offset (shared by its seeds: e.g.
    its LR, tuned by a rule rather than per size) and each seed its own noise."""
    rows = []
    for n in sizes:
        off = rng.gauss(0, size_sd)
        rows.append(dict(params=n, gaps=[0.3 + slope * math.log10(n) + off + rng.gauss(0, seed_sd) for _ in range(seeds)]))
    return rows


def test_a_known_slope_is_recovered_with_the_t_interval_on_the_seed_means():
    from accellib.analysis.stats import t_quantile
    rows = noisy_rows(random.Random(1), -0.05)
    fit = fit_log_trend(rows)
    xs = [math.log10(r["params"]) for r in rows]
    ys = [sum(r["gaps"]) / len(r["gaps"]) for r in rows]
    mx, my = sum(xs) / 4, sum(ys) / 4
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    se = math.sqrt(sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / 2 / sxx)   # 4 sizes - 2 = 2 df
    assert fit["df"] == 2 and fit["slope"] == pytest.approx(b) and fit["slope_se"] == pytest.approx(se)
    assert fit["slope_lo"] == pytest.approx(b - t_quantile(0.975, 2) * se)
    assert fit["slope_lo"] < -0.05 < fit["slope_hi"]


def test_pooling_the_seeds_keeps_the_line_and_shrinks_the_interval_too_far():
    rows = noisy_rows(random.Random(2), -0.05)
    means, pooled = fit_log_trend(rows), fit_log_trend(rows, pooled=True)
    assert pooled["slope"] == pytest.approx(means["slope"])             # 3 seeds at every size: the same line
    assert (means["df"], pooled["df"]) == (2, 10) and pooled["fit"] == "pooled (size, seed) points"
    assert pooled["slope_hi"] - pooled["slope_lo"] < means["slope_hi"] - means["slope_lo"]
    # over many synthetic sweeps with a known slope, the seed-means interval covers it ~95% of the time; the pooled
    # one, which counts the seeds of a size as more sizes, far less often
    rng, cover, runs = random.Random(0), {False: 0, True: 0}, 1000
    for _ in range(runs):
        rows = noisy_rows(rng, -0.05)
        for p in (False, True):
            f = fit_log_trend(rows, pooled=p)
            cover[p] += f["slope_lo"] <= -0.05 <= f["slope_hi"]
    assert 0.93 < cover[False] / runs < 0.97 and cover[True] / runs < 0.8


def test_one_intercept_per_width_and_a_common_slope():
    # gap = c(d) + 0.2 log10(N): a different level at each width, the same depth trend
    rows = [dict(params=non_embedding_params(L, d), d_model=d, gaps=[{64: 0.1, 128: -0.3}[d] + 0.2 *
             math.log10(non_embedding_params(L, d)) + e for e in (-0.01, 0.0, 0.01)]) for L in (4, 6, 12) for d in (64, 128)]
    fit = fit_log_trend(rows, by="d_model")
    assert fit["df"] == 6 - 2 - 1 and fit["n_groups"] == 2 and fit["fit"] == "per-size seed means, one intercept per d_model"
    assert fit["slope"] == pytest.approx(0.2) and fit["intercepts"] == pytest.approx({64: 0.1, 128: -0.3})
    assert fit["crossover_params"] is None                              # no single line to extrapolate
    plain = fit_log_trend(rows)                                           # one line through both widths: another slope
    assert plain["slope"] != pytest.approx(0.2, abs=0.05)
    with pytest.raises(ValueError, match="3 sizes"):
        fit_log_trend(rows[:3], by="d_model")                            # 3 points, 2 intercepts and a slope: 0 df


def test_gaps_are_paired_by_seed():
    rows = paired_gaps(fake_result(lambda n, i: 0.1 * i))["pld"]
    assert [r["gaps"] for r in rows] == [pytest.approx([0.0, 0.1, 0.2])] * 3
    assert rows[0]["mean"] == pytest.approx(0.1) and rows[0]["sd"] == pytest.approx(0.1)
    assert [r["params"] for r in rows] == sorted(r["params"] for r in rows)


def test_flat_trend_has_no_crossover_and_too_few_sizes_are_refused():
    assert fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.02 * (i - 1)))["pld"])["crossover_params"] is None
    with pytest.raises(ValueError, match="3 sizes"):
        fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.1, sizes=((4, 64),)))["pld"])
    with pytest.raises(ValueError, match="3 sizes"):          # two sizes' means: a line through 2 points, 0 df
        fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.1, sizes=((4, 64), (6, 128))))["pld"])
    two = fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.1 * i, sizes=((4, 64), (6, 128))))["pld"], pooled=True)
    assert two["df"] == 4                                       # pooled, 6 points: allowed, and pseudo-replicated


def test_crossover_is_placed_relative_to_the_measured_sizes():
    n_small, n_large = non_embedding_params(4, 64), non_embedding_params(12, 192)
    mid = math.sqrt(n_small * n_large)
    # a positive gap growing with N crossed zero below the smallest model: behind, the line moves away from 0
    assert fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.01 * math.log10(n)))["pld"])["crossover"] == "behind"
    # a shrinking positive gap crosses zero beyond the largest model: ahead
    ahead = fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.05 * math.log10(1e9 / n)))["pld"])
    assert ahead["crossover"] == "ahead" and ahead["crossover_params"] == pytest.approx(1e9, rel=1e-9)
    # a line through zero at the geometric middle of the sizes crosses inside the range
    inside = fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.05 * math.log10(n / mid)))["pld"])
    assert inside["crossover"] == "inside" and inside["crossover_params"] == pytest.approx(mid, rel=1e-9)


def test_every_gap_and_the_slope_use_the_one_rule():
    from accellib.analysis.stats import from_gaps
    res = fake_result(lambda n, i: 0.3 - 0.05 * math.log10(n) + (-0.01, 0.0, 0.01)[i] + 0.002 * (n > 1e6))
    rows = paired_gaps(res)["pld"]
    for r in rows:
        p = from_gaps(r["gaps"])
        assert (r["lo"], r["hi"], r["verdict"]) == (p.lo, p.hi, p.verdict)
    (row,) = trend_table(res)
    assert row["slope_verdict"] == "falls"                       # the technique gains as N grows
    noisy = fake_result(lambda n, i: (-0.2, 0.0, 0.2)[i] + (0.01, -0.01, 0.005)[[64, 128, 192].index(
        next(d for L, d in ((4, 64), (6, 128), (12, 192)) if non_embedding_params(L, d) == n))])
    assert trend_table(noisy)[0]["slope_verdict"] == "flat within noise"


def test_gaps_to_the_frontier_come_from_the_sweeps_rows():
    from accellib.compare import paired_gaps as compare_gaps
    res = fake_result(lambda n, i: 0.05)
    for cell in res["cells"]:
        rows = cell["summary"]["rows"]
        for r in rows:
            r["seed_labels"] = ["seed1", "seed2", "seed3"]
        rows.append(dict(arm="dense-L2", seed_labels=["seed1", "seed2", "seed3"],
                         val_losses=[v - 0.1 for v in rows[0]["val_losses"]]))
        cell["summary"]["frontier"] = compare_gaps(rows, "baseline")
    base = paired_gaps(res)["pld"]
    front = paired_gaps(res, "frontier")
    assert set(front) == {"pld"}                                    # dense arms are controls, not techniques
    assert [r["gaps"] for r in base] == [pytest.approx([0.05] * 3)] * 3
    assert [r["gaps"] for r in front["pld"]] == [pytest.approx([0.15] * 3)] * 3
    with pytest.raises(ValueError, match="--dense-only"):
        paired_gaps(fake_result(lambda n, i: 0.0), "frontier")


def test_the_sweeps_regime_counts_all_parameters_and_each_arms_tokens():
    res = fake_result(lambda n, i: 0.0, sizes=((4, 64), (6, 64)))
    res.update(head_dim=16, extra=["--train.batch_size=16"])
    for cell, lr in zip(res["cells"], (7e-3, 7e-3)):
        cell["lr"] = lr
        for r, steps in zip(cell["summary"]["rows"], (300, 410)):
            r["steps"] = steps
    assert size_overrides(res, res["cells"][1]) == ["--model.n_layer=6", "--model.d_model=64", "--model.n_head=4",
                                                     "--optim.lr=0.007", "--train.batch_size=16"]
    cfg_of = lambda cell, arm: SimpleNamespace(train=SimpleNamespace(batch_size=16, grad_accum=1),
                                               model=SimpleNamespace(seq_len=64, n_layer=cell["n_layer"]))
    params = lambda cfg: 1000 * cfg.model.n_layer             # a stand-in for regime.params_of (all parameters)
    reg = sweep_regime(res, cfg_of, train_tokens=4_551_479, params=params)
    assert reg[(6, 64)]["baseline"] == dict(params=6000, tokens=300 * 16 * 64, tokens_per_param=300 * 16 * 64 / 6000,
                                            epochs=300 * 16 * 64 / 4_551_479,
                                            vs_compute_optimal=300 * 16 * 64 / 6000 / 20)
    assert reg[(4, 64)]["pld"]["tokens"] == 410 * 16 * 64


def test_the_sweeps_frontier_at_its_smallest_model_is_an_edge():
    res = fake_result(lambda n, i: 0.0, sizes=((4, 64), (6, 64)))
    for cell in res["cells"]:
        cell["summary"]["rows"] += [dict(arm="dense-L1"), dict(arm="dense-L2")]
    res["cells"][0]["summary"]["frontier"] = dict(per_seed={"seed1": "dense-L1", "seed2": "dense-L1"})
    res["cells"][1]["summary"]["frontier"] = dict(per_seed={"seed1": "dense-L2", "seed2": "dense-L2"})
    reg = {(L, 64): {"baseline": dict(params=L * 10), "pld": dict(params=L * 10), "dense-L1": dict(params=10),
                     "dense-L2": dict(params=20)} for L in (4, 6)}
    edges = sweep_frontier_edge(res, reg)
    assert edges[(4, 64)]["bracketed"] is False and edges[(4, 64)]["edge"] == ["dense-L1"]
    assert edges[(6, 64)]["bracketed"] is True                  # dense-L2: dense-L1 below it, the baseline above
    assert "pld" not in edges[(4, 64)]["sizes"]                  # techniques are not plain models
