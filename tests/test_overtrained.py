"""The over-trained regime's machinery (issue 44): short horizons with every schedule scaled, and where a baseline
stands against its own IsoFLOP profile."""
import copy
import sys

import pytest
import yaml

from accellib import REPO_ROOT
from accellib.analysis.regime import gaps_by_length, past_optimum
from accellib.analysis.results import load_result

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import overtrained  # noqa: E402  (benchmarks/overtrained.py)


def test_at_horizon_scales_every_schedule_with_the_run():
    raw = yaml.safe_load(overtrained.CONFIG.read_text())
    short = overtrained.at_horizon(raw, 1200)            # a tenth of the run
    assert short["train"]["steps"] == 1200 and short["optim"]["warmup_steps"] == 12
    assert short["train"]["eval_every"] == 24 and short["optim"]["lr"] == raw["optim"]["lr"]
    for arm in ("pld", "sbld"):
        assert short["arms"][arm][arm]["gamma"] == pytest.approx(raw["arms"][arm][arm]["gamma"] * 10)
    assert short["arms"]["sbld"]["sbld"]["profile_step"] == 120
    assert short["arms"]["multilevel"]["multilevel"]["rewarm_steps"] == 20
    assert short["arms"]["multilevel"]["multilevel"]["warm_frac"] == raw["arms"]["multilevel"]["multilevel"]["warm_frac"]
    assert raw == yaml.safe_load(overtrained.CONFIG.read_text())   # the input is not changed


def test_short_yaml_reads_the_asked_tokens_per_parameter(tmp_path):
    path, arms = overtrained.short_yaml(overtrained.LONG_CONFIG, tmp_path / "long_short", 1.8)
    raw = yaml.safe_load(path.read_text())
    assert path.parent == tmp_path and arms == list(yaml.safe_load(overtrained.LONG_CONFIG.read_text())["arms"])
    tokens = raw["train"]["steps"] * raw["train"]["batch_size"] * raw["model"]["seq_len"]
    assert tokens / 57264 == pytest.approx(1.8, rel=0.02)          # 6 x 24: 57,264 parameters


def test_profile_arms_follow_the_width_rule():
    raw = yaml.safe_load(overtrained.CONFIG.read_text())
    arms = overtrained.profile_arms(raw)
    assert arms["dense-L12"] == {"model": {"n_layer": 12, "d_model": 16}}          # the baseline's width: its LR
    assert arms["dense-L6-d32"]["optim"]["lr"] == pytest.approx(raw["optim"]["lr"] / 2)
    sizes = {(b, w) for b, w in overtrained.PROFILE}
    assert any(w == 16 and b < 6 for b, w in sizes) and any(w == 16 and b > 6 for b, w in sizes)
    assert {w for _, w in sizes} >= {16, 24, 32}


def test_the_near_optimal_config_is_not_past_its_optimum():
    # configs/fixed_size_long.yaml at 50 tokens per parameter: its own profile's best is a smaller model (3 blocks)
    p = past_optimum(load_result("long_flops"))
    assert p["optimum"] == "dense-L3" and p["bracketed"] and not p["larger_wins"]
    assert p["times"] < 1 and p["optimum_params"] < p["baseline_params"]


def test_past_optimum_needs_a_larger_model_that_wins():
    res = copy.deepcopy(load_result("long_flops"))
    reg = res["regime"]
    reg["dense-L3"]["params"] = 10 * reg["baseline"]["params"]           # pretend the winner were larger
    reg["dense-L3"]["tokens_per_param"] = reg["baseline"]["tokens_per_param"] / 8
    p = past_optimum(res)
    assert p["larger_wins"] and p["times"] == pytest.approx(8)
    res["summary"]["frontier"] = {}
    with pytest.raises(ValueError, match="no IsoFLOP profile"):
        past_optimum(res)


def test_gaps_by_length_orders_the_points():
    res = {n: load_result(n) for n in ("long_flops", "tutorial_flops")}
    g = gaps_by_length(res, ("pld", "random_ltd"))
    assert [p["experiment"] for p in g["pld"]] == ["tutorial_flops", "long_flops"]
    assert g["pld"][0]["tokens_per_param"] < 2 < 50 <= g["pld"][1]["tokens_per_param"]


def test_the_flops_comparison_adds_the_profiles_best_plain_model(tmp_path):
    rows = lambda best: {"summary": {"rows": [{"arm": "baseline", "val_loss": 2.1}, {"arm": "dense-L12", "val_loss": 2.2},
                                              {"arm": best, "val_loss": 2.0}]}}
    path, arms = overtrained.flops_yaml(tmp_path / "ot_flops", rows("dense-L6-d32"))
    raw = yaml.safe_load(path.read_text())
    techniques = [a for a in yaml.safe_load(overtrained.CONFIG.read_text())["arms"] if a != "baseline"]
    assert arms == ["baseline", "dense-L6-d32", *techniques]
    assert raw["arms"]["dense-L6-d32"] == overtrained.profile_arms(raw)["dense-L6-d32"]   # the profile's LR rule
    prof_path, prof_arms = overtrained.profile_yaml(tmp_path / "ot_profile")
    assert prof_arms == ["baseline", *overtrained.profile_arms(raw)] and len(prof_arms) == len(overtrained.PROFILE) + 1
    # a baseline that is its own family's best adds nothing
    base_best = {"summary": {"rows": [{"arm": "baseline", "val_loss": 1.9}, {"arm": "dense-L12", "val_loss": 2.2}]}}
    assert overtrained.flops_yaml(tmp_path / "x", base_best)[1] == ["baseline", *techniques]


def test_the_lr_check_reaches_16x_below_and_4x_above_the_tuned_lr(tmp_path):
    path, arms = overtrained.lr_check_yaml(tmp_path / "ot_lr_check")
    raw = yaml.safe_load(path.read_text())
    lr = raw["optim"]["lr"]
    assert arms == ["baseline", *(f"lr{lr * f:g}" for f in (0.0625, 0.125, 0.25, 0.5, 2, 4))]
    assert [raw["arms"][a]["optim"]["lr"] for a in arms[1:]] == [pytest.approx(lr * f) for f in (0.0625, 0.125, 0.25, 0.5, 2, 4)]


def test_the_profile_puts_the_baseline_past_its_optimum_as_the_config_says():
    """results/ot_profile.json (3 seeds, equal FLOPs): a larger plain model of the family wins by the paired rule,
    the minimum is bracketed, the baseline reads >= 5x the optimum's tokens per parameter on one pass of fresh
    text; configs/overtrained.yaml's header states these numbers."""
    res = load_result("ot_profile")
    p = past_optimum(res)
    assert p["larger_wins"] and p["bracketed"] and p["optimum_params"] > p["baseline_params"]
    assert p["times"] >= 5
    g = p["gap"]
    header = overtrained.CONFIG.read_text().split("model:")[0]
    said = (f"at {p['optimum'].removeprefix('dense-L').replace('-d', ' x ')} ({p['optimum_params']:,} parameters, "
            f"{p['optimum_tokens_per_param']:.0f} tokens")
    assert said in " ".join(header.replace("#", " ").split()), said
    assert f"{-g['mean']:.3f} nats [{-g['hi']:.3f}, {-g['lo']:.3f}]" in " ".join(header.replace("#", " ").split())
    assert f"= {p['times']:.1f}x the optimum's" in header
    rows = {r["arm"]: r for r in res["summary"]["rows"]}
    corpus = 100_713_478
    for arm, reg in res["regime"].items():
        if arm in rows:
            assert rows[arm]["steps"] * 32 * 64 <= corpus, arm   # every arm on fresh text: at most one epoch


def test_regime_name_follows_each_experiments_own_profile():
    """The findings' name for a regime is read from the experiment's own IsoFLOP profile: the over-trained profile
    (a larger model wins, 10x the optimum's tokens per parameter) is the papers' regime; long_flops (its baseline
    larger than optimal) is near compute-optimal, as the README's findings table says."""
    from accellib.analysis.regime import regime_name
    assert regime_name(load_result("ot_profile")) == "papers' regime"
    assert regime_name(load_result("long_flops")) == "near compute-optimal"


def test_regime_reading_states_where_the_baseline_stands_and_every_verdict():
    """Notebooks 01-04 quote this reading in their decision rules: the experiment's regime by its own profile, then
    the technique's gap to the same-size baseline, its FLOPs to target and its gap to the frontier, by the one rule."""
    from accellib.analysis.results import gap, regime_reading, to_target
    res = load_result("long_flops")
    text = regime_reading(res, "sbld", "SBLD")
    assert text.splitlines()[0].endswith(": near compute-optimal") and "(dense-L3, 147)" in text
    assert f"SBLD - same-size baseline at equal FLOPs: {gap(res, 'sbld', 'baseline').text()}" in text
    assert to_target(res, "sbld", "flops").text() in text and gap(res, "sbld", "frontier").text() in text
    short = regime_reading(load_result("ot_short"), "sbld", "SBLD")   # no plain arms of other sizes: no regime named
    assert short.splitlines()[0] == "ot_short, baseline at 50 tokens per parameter, peak LR 0.02" and "(None): —" in short


def test_ot_flops_measures_every_technique_in_the_papers_regime():
    """results/ot_flops.json (issue 44, item 3): every arm of configs/overtrained.yaml at the baseline's FLOPs, 5 seeds,
    paired; its baseline runs are ot_profile's again (the same config and seeds give the same losses); the frontier is
    the profile's bracketed optimum, which beats the baseline by the paired rule; the baseline reads >= 5x that
    optimum's tokens per parameter, so the experiment names itself the papers' regime; every arm reads fresh text."""
    from accellib.analysis.frontier import joint_frontier
    from accellib.analysis.regime import regime_name
    from accellib.analysis.results import frontier_arm
    res, prof = load_result("ot_flops"), load_result("ot_profile")
    rows = {r["arm"]: r for r in res["summary"]["rows"]}
    assert set(yaml.safe_load(overtrained.CONFIG.read_text())["arms"]) <= set(rows)
    assert res["summary"]["seeds"] == 5 and all(r["seeds"] == 5 for r in rows.values())
    assert joint_frontier(res, prof)["baseline_diff"] <= 1e-3          # the same baseline runs as the profile's
    best = past_optimum(prof)
    assert frontier_arm(res) == best["optimum"] and best["bracketed"] and regime_name(res) == "papers' regime"
    assert rows[best["optimum"]]["vs_baseline"]["verdict"] == "wins" and past_optimum(res)["times"] >= 5
    for arm, r in rows.items():
        assert res["regime"][arm]["epochs"] <= 1, arm                    # no token read twice
        assert len(r["to_target"]["flops"]["ratios"]) == 5               # censored seeds kept
        if not arm.startswith("dense-L"):   # the papers' metric's arms: read to 2% of the budget
            assert r["to_target_resolution"] <= 0.02, arm


def test_a_records_run_seconds_sum_every_runs_own_clock_across_resumes():
    """A resumed build's wall_seconds is only its last invocation; run_seconds sums each run's own clock (a mean
    per arm x its seeds), so the cost survives resumes; a row without a clock gives no total rather than a low one."""
    import reproduce
    rows = [dict(arm="baseline", seeds=5, wall_s=300.0), dict(arm="pld", seeds=5, wall_s=250.5)]
    assert reproduce.run_seconds(dict(summary=dict(rows=rows))) == 2752.5
    assert reproduce.run_seconds(dict(summary=dict(rows=[*rows, dict(arm="x", seeds=1)]))) is None
    assert reproduce.run_seconds(dict(timing={})) is None


def test_the_flops_comparison_at_the_checked_lr_moves_every_arm_and_refuses_an_edge(tmp_path):
    """ot_flops_lr: ot_flops's arms at ot_lr_check's best LR (lowest mean), the wider plain model by the profile's
    1/width rule from it; a best LR at the end of the range measured is refused with what to do."""
    lr = yaml.safe_load(overtrained.CONFIG.read_text())["optim"]["lr"]
    rows = lambda losses: dict(config=dict(optim=dict(lr=lr)), summary=dict(rows=[
        dict(arm=a, val_loss=v) for a, v in losses.items()]))
    check = rows({"baseline": 2.10, "lr0.0025": 2.09, "lr0.005": 2.08, "lr0.01": 2.11, "lr0.04": 2.14})
    assert overtrained.checked_lr(check) == 0.005
    with pytest.raises(overtrained.NotLocated, match="end of its range; add a multiple beyond it to LR_CHECK"):
        overtrained.checked_lr(rows({"baseline": 2.10, "lr0.0025": 2.07, "lr0.005": 2.08}))
    with pytest.raises(overtrained.NotLocated):
        overtrained.checked_lr(rows({"baseline": 2.10, "lr0.01": 2.11, "lr0.04": 2.09}))
    prof = dict(summary=dict(rows=[dict(arm="baseline", val_loss=2.1), dict(arm="dense-L6-d32", val_loss=1.9)]))
    path, arms = overtrained.flops_yaml(tmp_path / "ot_flops_lr", prof, 0.005)
    raw = yaml.safe_load(path.read_text())
    assert raw["optim"]["lr"] == 0.005 and raw["arms"]["dense-L6-d32"]["optim"]["lr"] == pytest.approx(0.0025)
    assert arms == overtrained.flops_yaml(tmp_path / "ot_flops", prof)[1]       # the same arms as ot_flops
    assert all("lr" not in (v or {}).get("optim", {}) for a, v in raw["arms"].items() if a != "dense-L6-d32")


def test_the_lr_check_locates_the_optimum_and_the_config_says_so():
    """results/ot_lr_check.json (issue 44, item 2): the config's LR and 1/16x-4x it, 5 seeds each at equal steps,
    paired. The lowest mean is interior (checked_lr refuses an end), resolved losses lie on both sides of it, and
    configs/overtrained.yaml's header states every LR's paired gap to it as the one rule gives it."""
    from accellib.analysis.stats import paired
    res = load_result("ot_lr_check")
    lr0 = float(res["config"]["optim"]["lr"])
    rows = {overtrained.lr_of(r["arm"], lr0): r for r in res["summary"]["rows"]}
    assert sorted(rows) == sorted([lr0, *(lr0 * f for f in overtrained.LR_CHECK)])
    assert all(r["seeds"] == 5 and r["steps"] == 12000 for r in rows.values())
    best = overtrained.checked_lr(res)
    header = " ".join(overtrained.CONFIG.read_text().split("model:")[0].replace("#", " ").split())
    assert f"the lowest mean is at {best:g} ({rows[best]['val_loss']:.3f} +- {rows[best]['val_loss_sd']:.3f})" in header
    gaps = {lr: paired(r["val_losses"], rows[best]["val_losses"]) for lr, r in rows.items() if lr != best}
    for lr, g in gaps.items():
        word = g.verdict.replace("not resolved at 5 seeds", "n.r.")
        assert f"{lr:g} {g.mean:+.3f} [{g.lo:+.3f}, {g.hi:+.3f}] {word}" in header, lr
    assert any(g.verdict == "loses" for lr, g in gaps.items() if lr < best)
    assert any(g.verdict == "loses" for lr, g in gaps.items() if lr > best)
    assert f"ot_flops_lr measures every arm at {best:g}" in header


def test_ot_flops_lr_measures_every_technique_at_the_checked_lr():
    """results/ot_flops_lr.json (issue 44, items 2-3): ot_flops's arms again, 5 seeds, paired, every arm at
    ot_lr_check's best peak LR (the wider plain model at the profile's 1/width rule from it). Its baseline runs are
    the check's runs at that LR again (the same config and seeds; the losses agree to machine kernels, not bitwise);
    at that LR the profile's optimum, 6 x 32, still beats the baseline, which still reads >= 5x its tokens per
    parameter, so the experiment is the papers' regime; every arm reads fresh text."""
    from accellib.analysis.regime import regime_name
    from accellib.analysis.results import frontier_arm, peak_lr
    res, check, flops = load_result("ot_flops_lr"), load_result("ot_lr_check"), load_result("ot_flops")
    best = overtrained.checked_lr(check)
    assert peak_lr(res) == best and peak_lr(flops) != best
    rows = {r["arm"]: r for r in res["summary"]["rows"]}
    assert set(rows) == {r["arm"] for r in flops["summary"]["rows"]}            # the same arms as ot_flops
    assert res["summary"]["seeds"] == 5 and all(r["seeds"] == 5 for r in rows.values())
    wide = res["generated_config"]["arms"]["dense-L6-d32"]["optim"]["lr"]
    assert wide == pytest.approx(best * 16 / 32)                                 # the 1/width rule from the checked LR
    at_best = next(r for r in check["summary"]["rows"] if r["arm"] == f"lr{best:g}")
    assert rows["baseline"]["seed_labels"] == at_best["seed_labels"]
    assert rows["baseline"]["val_losses"] == pytest.approx(at_best["val_losses"], abs=0.01)
    assert frontier_arm(res) == "dense-L6-d32" and rows["dense-L6-d32"]["vs_baseline"]["verdict"] == "wins"
    assert regime_name(res) == "papers' regime" and past_optimum(res)["times"] >= 5
    for arm, r in rows.items():
        assert res["regime"][arm]["epochs"] <= 1, arm                            # no token read twice
        assert len(r["to_target"]["flops"]["ratios"]) == 5, arm                  # censored seeds kept
    header = " ".join(overtrained.CONFIG.read_text().split("model:")[0].replace("#", " ").split())
    for arm in ("dense-L6-d32", "multilevel"):                                   # the config's header quotes them
        g = rows[arm]["vs_baseline"]
        assert f"({g['mean']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}])" in header, arm
    techs = [a for a in rows if a != "baseline" and not a.startswith("dense-L")]
    losing = [a for a in techs if rows[a]["vs_baseline"]["verdict"] == "loses"]
    assert losing == ["pld", "sbld", "random_ltd", "pld+random_ltd", "sbld+random_ltd"]
