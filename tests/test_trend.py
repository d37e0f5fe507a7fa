"""accellib/analysis/trend.py: the scale-trend analysis of notebook 09 (paired gaps, log-linear fit, zero crossing)."""
import math

import pytest

from accellib.models.transformer import ModelConfig, Transformer
from accellib.analysis.trend import fit_log_trend, non_embedding_params, paired_gaps, trend_table


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
    # gap = 0.3 - 0.05 log10(N): zero at N = 10^6; seeds add +-0.01 symmetrically, so the line is unchanged
    res = fake_result(lambda n, i: 0.3 - 0.05 * math.log10(n) + (-0.01, 0.0, 0.01)[i])
    (row,) = trend_table(res)
    assert row["arm"] == "pld" and row["n_points"] == 9
    assert row["slope"] == pytest.approx(-0.05, abs=1e-12) and row["intercept"] == pytest.approx(0.3, abs=1e-11)
    assert row["crossover_params"] == pytest.approx(1e6, rel=1e-9) and row["crossover"] == "inside"
    assert row["slope_se"] > 0 and 0 < row["r2"] < 1


def test_gaps_are_paired_by_seed():
    rows = paired_gaps(fake_result(lambda n, i: 0.1 * i))["pld"]
    assert [r["gaps"] for r in rows] == [pytest.approx([0.0, 0.1, 0.2])] * 3
    assert rows[0]["mean"] == pytest.approx(0.1) and rows[0]["sd"] == pytest.approx(0.1)
    assert [r["params"] for r in rows] == sorted(r["params"] for r in rows)


def test_flat_trend_has_no_crossover_and_one_size_is_refused():
    assert fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.02 * (i - 1)))["pld"])["crossover_params"] is None
    with pytest.raises(ValueError, match="2 sizes"):
        fit_log_trend(paired_gaps(fake_result(lambda n, i: 0.1, sizes=((4, 64),)))["pld"])


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
    from accellib.analysis.stats import from_gaps, t_quantile
    res = fake_result(lambda n, i: 0.3 - 0.05 * math.log10(n) + (-0.01, 0.0, 0.01)[i])
    rows = paired_gaps(res)["pld"]
    for r in rows:
        p = from_gaps(r["gaps"])
        assert (r["lo"], r["hi"], r["verdict"]) == (p.lo, p.hi, p.verdict)
    (row,) = trend_table(res)
    half = t_quantile(0.975, 9 - 2) * row["slope_se"]
    assert row["slope_lo"] == pytest.approx(-0.05 - half) and row["slope_hi"] == pytest.approx(-0.05 + half)
    assert row["slope_verdict"] == "falls"                       # the technique gains as N grows
    noisy = fake_result(lambda n, i: (-0.2, 0.0, 0.2)[i])         # no trend, seed noise only
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
