"""compare at equal compute (issue 10): --budget steps|flops|wall, --seeds N, time to target."""
import json
import math
import statistics

import pytest
import torch
import yaml

from accellib.drivers.budget import planned_flops, resolve, steps_for_flops
from accellib.compare import crossing, format_table, main as compare_main, run_arms, summarize
from accellib.core.options import ConfigError
from accellib.core.config import load_config, with_horizon
from accellib.data.tokens import load_token_data, ngram_references
from accellib.core.records import read_metrics
from accellib.core.trainer import Trainer

from conftest import tiny_overrides

PLD = ["--pld.enabled=true", "--pld.theta_bar=0.5", "--pld.gamma=0.3"]
LTD = ["--random_ltd.enabled=true", "--random_ltd.min_len=8"]


def _cfg(data, *extra, **kw):
    return load_config(None, tiny_overrides(data, **kw) + list(extra))


def test_with_horizon_stretches_schedules_but_not_warmup(tiny_data_dir):
    c = _cfg(tiny_data_dir, *PLD, "--random_ltd.enabled=true", "--random_ltd.ramp_steps=10",
             **{"train.steps": 20, "optim.warmup_steps": 4})
    d = with_horizon(c, 40)
    assert d.train.steps == 40 and d.optim.warmup_steps == 4
    assert d.techniques["random_ltd"].ramp_steps == 20
    assert d.techniques["pld"].gamma == pytest.approx(0.15)
    assert c.train.steps == 20 and c.techniques["pld"].gamma == 0.3   # a copy: the original is untouched
    auto = with_horizon(_cfg(tiny_data_dir, *LTD), 12)
    assert auto.techniques["random_ltd"].ramp_steps == 0                # 0 = automatic, stays automatic


@pytest.mark.parametrize("extra", [[], PLD, LTD, PLD + LTD], ids=["baseline", "pld", "random_ltd", "pld+ltd"])
def test_planned_flops_equal_what_training_counts(tiny_data_dir, extra):
    # PLD's gates and random-LTD's lengths depend only on (seed, step): the plan count is exact
    cfg = _cfg(tiny_data_dir, *extra)
    tr = Trainer(cfg)
    while not tr.finished():
        tr.train_step()
    assert planned_flops(cfg) == tr.state.flops


def test_sbld_profiling_is_charged_to_its_flops_and_its_budget(tiny_data_dir):
    # SBLD's profile (profile_batches x (L+1) forward passes) is real work: the run's FLOPs count it, and the
    # planner counts it too, so an equal-FLOPs budget and a time-to-target both pay for it (issue 33)
    from accellib.models.transformer import Plan
    sbld = ["--sbld.enabled=true", "--sbld.profile_step=2", "--sbld.profile_batches=3", "--sbld.gamma=0.3"]
    cfg = _cfg(tiny_data_dir, *sbld, **{"train.steps": 2})
    tr = Trainer(cfg)
    L, full = cfg.model.n_layer, tr.task.micro_flops(None)
    plans = [Plan.full(L) for _ in range(L + 1)]
    for k in range(L):
        plans[k + 1].blocks[k].run = False
    profile = 3 * sum(tr.task.micro_flops(p) for p in plans) / 3       # 3 batches, forward = 1/3 of a step
    sb = tr.techniques[0]
    assert sb.profiles_at(2) and not sb.profiles_at(1) and not sb.profiles_at(3)
    assert sb.extra_flops(2, tr.task) == pytest.approx(profile) and sb.extra_flops(1, tr.task) == 0
    while not tr.finished():   # steps 1 and 2 run every block (no dropping before the profile)
        tr.train_step()
    assert tr.state.flops == pytest.approx(2 * full + profile)
    assert planned_flops(cfg) == pytest.approx(2 * full + profile)


def test_flops_budget_gives_each_arm_the_baselines_flops(tiny_data_dir):
    base = _cfg(tiny_data_dir, **{"train.steps": 10})
    pld = _cfg(tiny_data_dir, *PLD, **{"train.steps": 10})
    target = planned_flops(base)
    n = steps_for_flops(pld, target)
    assert n > 10                                                         # dropping blocks buys steps
    assert planned_flops(with_horizon(pld, n)) >= target > planned_flops(with_horizon(pld, n - 1))
    plan = resolve("flops", base, {"baseline": base, "pld": pld})
    assert plan["steps"] == {"baseline": 10, "pld": n} and plan["flops_budget"]["pld"] == target


def test_flops_budget_stops_the_trainer(tiny_data_dir):
    cfg = _cfg(tiny_data_dir, **{"train.steps": 10})
    one = planned_flops(_cfg(tiny_data_dir, **{"train.steps": 1}))
    cfg.train.flops_budget = 3.5 * one
    tr = Trainer(cfg)
    while not tr.finished():
        tr.train_step()
    assert tr.state.step == 4                                             # the first step at or past the budget


def test_wall_budget_refuses_a_vcycle(tiny_data_dir):
    base = _cfg(tiny_data_dir, **{"model.tie_head": False})
    ml = _cfg(tiny_data_dir, "--multilevel.enabled=true", **{"model.tie_head": False})
    with pytest.raises(ConfigError, match="--budget flops"):
        resolve("wall", base, {"baseline": base, "multilevel": ml})


def test_crossing_interpolates_and_says_not_reached():
    recs = [dict(step=1, val_loss=3.0, flops=10.0), dict(step=2, train_loss=1.0, flops=15.0),
            dict(step=3, val_loss=2.0, flops=20.0), dict(step=4, val_loss=1.0, flops=30.0, transition=True)]
    assert crossing(recs, 2.5, "flops") == 15.0
    assert crossing(recs, 3.0, "flops") == 10.0
    assert crossing(recs, 1.5, "flops") == math.inf                       # a transition record does not count


def test_summary_keeps_seeds_that_miss_the_target(tmp_path):
    # a seed that never reaches its baseline's final loss counts as infinitely slow: with 2 of 3 missing,
    # the median is "not reached" (before, the misses were dropped and 1 seed's 0.5 was the median)
    seeds, plan = (1, 2, 3), dict(baseline="baseline", seeds=3, seed0=1)
    curves = {"baseline": [3.0, 2.0, 1.0], "pld": {1: [3.0, 1.0, 0.9], 2: [3.0, 2.5, 2.2], 3: [3.0, 2.9, 2.5]}}
    results = {}
    for arm in ("baseline", "pld"):
        for s in seeds:
            d = tmp_path / arm / f"seed{s}"
            d.mkdir(parents=True)
            vals = curves[arm] if arm == "baseline" else curves[arm][s]
            recs = [dict(step=i + 1, val_loss=v, flops=10.0 * (i + 1), wall=float(i + 1), tokens=100 * (i + 1))
                    for i, v in enumerate(vals)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            results[f"{arm}/seed{s}"] = dict(recs[-1], step=3, val_bpb=1.0)
    rows = {r["arm"]: r for r in summarize(tmp_path, results, plan)}
    assert rows["pld"]["reached"] == 1 and rows["pld"]["to_target_flops"] == math.inf
    assert rows["baseline"]["reached"] == 3 and rows["baseline"]["to_target_flops"] == 1.0
    assert "not reached" in format_table(list(rows.values()))
    # the papers' metric: seeds 2 and 3 are censored at their budget (1.0x), never dropped, and no interval is made
    # with censored seeds; the sign test's tie is the reading's resolution (a third of the run here), and the censored
    # seeds, at a budget of 1x, count as above it
    tt = rows["pld"]["to_target"]["flops"]
    assert tt["censored"] == [False, True, True] and tt["ratios"] == pytest.approx([2 / 3, 1.0, 1.0])
    assert tt["lo"] is tt["hi"] is tt["ratio"] is None and tt["tie"] == pytest.approx(1 / 3)
    assert tt["above"] == 2 and tt["verdict"] == "not resolved at 3 seeds"
    assert rows["pld"]["to_target_resolution"] == pytest.approx(10.0 / 30.0)   # one evaluation every 10 FLOPs


def _yaml(tmp_path, data):
    base = {"model": {}, "train": {}, "optim": {}, "data": {}}
    for a in tiny_overrides(data, **{"train.steps": 6, "train.checkpoint_every": 3}):
        key, val = a[2:].split("=", 1)
        s, k = key.split(".", 1)
        base[s][k] = yaml.safe_load(val)
    base["arms"] = {"baseline": {}, "pld": {"pld": {"enabled": True, "theta_bar": 0.5, "gamma": 0.3}}}
    p = tmp_path / "cmp.yaml"
    p.write_text(yaml.safe_dump(base))
    return p


def test_compare_flops_budget_with_seeds_end_to_end(tiny_data_dir, tmp_path, capsys):
    cfg, out = _yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--budget", "flops", "--seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "equal flops, 2 seed(s)" in text and "±" in text
    s = json.loads((out / "summary.json").read_text())
    rows = {r["arm"]: r for r in s["rows"]}
    assert set(rows) == {"baseline", "pld"} and rows["pld"]["seeds"] == 2
    assert rows["pld"]["steps"] > rows["baseline"]["steps"]
    for seed in (1337, 1338):
        b = read_metrics(out / "baseline" / f"seed{seed}")[-1]
        p = read_metrics(out / "pld" / f"seed{seed}")[-1]
        assert b["flops"] <= p["flops"] < b["flops"] * 1.2                # spent the baseline's FLOPs, one step over at most
    assert rows["baseline"]["to_target_flops"] == pytest.approx(1.0)
    # the two seeds really differ, and the table's sd is theirs
    vals = rows["baseline"]["val_losses"]
    assert vals[0] != vals[1] and rows["baseline"]["val_loss_sd"] == pytest.approx(statistics.stdev(vals))
    # a finished comparison resumes to the same table without training
    assert compare_main(["--config", str(cfg), "--out", str(out), "--budget", "flops", "--seeds", "2", "--resume"]) == 0
    assert "finished before, kept" in capsys.readouterr().out
    # and refuses a different budget on resume
    assert compare_main(["--config", str(cfg), "--out", str(out), "--budget", "steps", "--seeds", "2", "--resume"]) == 2


def test_compare_arm_subset_plans_against_the_baseline(tiny_data_dir, tmp_path):
    # `--arms pld` alone (as make results runs arms in parallel) still gets the baseline's FLOPs
    cfg, out = _yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    res = run_arms(cfg, out, ["pld"], budget="flops")
    base_flops = planned_flops(_cfg(tiny_data_dir, **{"train.steps": 6, "train.checkpoint_every": 3}))
    assert res["pld"]["flops"] >= base_flops
    plan = json.loads((out / "budget.json").read_text())
    assert summarize(out, res, plan) == []                                # no baseline run yet: no table


def test_grad_norm_is_logged_and_unclipped_runs_are_unchanged(tiny_data_dir, tmp_path, monkeypatch):
    cfg = _cfg(tiny_data_dir, **{"optim.grad_clip": 0.0})
    measured = Trainer(cfg)
    measured.train_step()
    assert measured.last_grad_norm > 0
    # grad_clip=0 still measures the norm (Trainer.clip_grad_norm_ with max_norm=inf): the update must be
    # bitwise the one without any clipping call
    plain = Trainer(_cfg(tiny_data_dir, **{"optim.grad_clip": 0.0}))
    monkeypatch.setattr(plain, "clip_grad_norm_", lambda max_norm: torch.tensor(0.0))
    plain.train_step()
    for a, b in zip(measured.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    # metrics.jsonl carries the window's largest norm
    tr = Trainer(_cfg(tiny_data_dir, **{"train.log_every": 3}), tmp_path / "r")
    tr.fit()
    recs = read_metrics(tmp_path / "r")
    assert all(r["grad_norm"] > 0 for r in recs)


def test_ngram_references_match_a_direct_count(tiny_data_dir):
    import numpy as np
    d = load_token_data(tiny_data_dir)
    ref = ngram_references(d)
    tr, va, V = np.asarray(d.train, np.int64), np.asarray(d.val, np.int64), d.vocab_size
    uni = (np.bincount(tr, minlength=V) + 1) / (len(tr) + V)
    assert ref["unigram"] == pytest.approx(-np.log(uni[va[1:]]).mean(), rel=1e-12)
    assert ref["bigram"] < ref["unigram"]
    assert "bigram" not in ngram_references(d, max_vocab=100)
    small = ngram_references(d, chunk=997)        # chunk boundaries count every pair once
    assert small["bigram"] == pytest.approx(ref["bigram"], rel=1e-12)
    assert small["unigram"] == pytest.approx(ref["unigram"], rel=1e-12)


def test_arms_added_with_another_budget_are_refused(tiny_data_dir, tmp_path, capsys):
    # before: `--arms baseline --budget steps` after `--arms pld --budget flops` silently replaced budget.json,
    # losing pld's planned steps; a later --resume then blamed pld's config
    cfg, out = _yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "pld", "--budget", "flops"]) == 0
    before = (out / "budget.json").read_text()
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline", "--budget", "steps"]) == 2
    err = capsys.readouterr().err
    assert "compared with --budget flops --seeds 1" in err and err.count("\n") == 1
    assert (out / "budget.json").read_text() == before and not (out / "baseline").exists()
    # the same budget adds the arm and keeps pld's entry
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline", "--budget", "flops"]) == 0
    steps = json.loads((out / "budget.json").read_text())["per_seed"]["0"]["steps"]
    assert set(steps) == {"baseline", "pld"}


def test_a_resumed_flops_comparison_reuses_its_plan_and_replans_a_changed_arm(tiny_data_dir, tmp_path, monkeypatch):
    """Planning a FLOPs budget walks every step of every candidate horizon, for each seed (minutes per random-LTD arm
    at 12,000 steps): a resume reuses the steps stored in budget.json for the configs they were planned for, and plans
    again an arm whose config changed (its stored fingerprint differs)."""
    from accellib.drivers import arms as arms_mod
    from accellib.drivers.arms import arm_configs, plan_runs
    cfg = _yaml(tmp_path, tiny_data_dir)
    cfgs = arm_configs(cfg, None, [])
    runs, plan = plan_runs(cfgs, 2, "flops")
    stored = json.loads(json.dumps(plan))
    calls = []
    monkeypatch.setattr(arms_mod, "resolve", lambda *a, **k: calls.append(a) or resolve(*a, **k))
    again, plan2 = plan_runs(cfgs, 2, "flops", stored=stored)
    assert calls == [] and plan2["per_seed"] == stored["per_seed"]
    assert {k: c.train.steps for k, c in again.items()} == {k: c.train.steps for k, c in runs.items()}
    changed = arm_configs(cfg, None, [])
    arm = next(a for a in changed if a != "baseline")
    changed[arm].optim.lr *= 2                                            # another config for one arm: planned again
    plan_runs(changed, 2, "flops", stored=stored)
    assert len(calls) == 2 and all(set(c[2]) == {arm, "baseline"} for c in calls)
    base = arm_configs(cfg, None, [])
    base["baseline"].optim.lr *= 2            # the baseline's own config changed: its plan is made again, like any arm's
    calls.clear()
    _, plan3 = plan_runs(base, 2, "flops", stored=stored)
    assert len(calls) == 2 and all(set(c[2]) == {"baseline"} for c in calls)
    assert plan3["per_seed"]["0"]["fingerprint"]["baseline"] != stored["per_seed"]["0"]["fingerprint"]["baseline"]
