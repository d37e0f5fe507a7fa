"""The dense frontier (issue 25): plain arms of other sizes at the baseline's FLOPs, the frontier chosen
without looking at the seed it is judged on, and every arm's paired gap to it."""
import json

import pytest

from accellib.drivers.budget import planned_flops, resolve
from accellib.drivers.arms import arm_configs, dense_arms, is_dense
from accellib.compare import format_gaps, frontier, main as compare_main, paired_gaps
from accellib.core.options import ConfigError
from accellib.core.config import with_horizon

from test_compare_budget import _yaml


def test_dense_arms_are_the_plain_base_at_another_size(tiny_data_dir, tmp_path):
    cfg = _yaml(tmp_path, tiny_data_dir)
    cfgs = arm_configs(cfg, ["baseline", "dense-L2", "dense-L3-d16"], ["--model.n_head=2"])
    assert cfgs["dense-L2"].model.n_layer == 2 and cfgs["dense-L2"].model.d_model == 32
    assert (cfgs["dense-L3-d16"].model.n_layer, cfgs["dense-L3-d16"].model.d_model) == (3, 16)
    assert not any(t.enabled for t in cfgs["dense-L2"].techniques.values())
    # everything but the shape is the baseline's
    strip = lambda c: {k: v for k, v in c.to_dict().items() if k != "model"}
    assert strip(cfgs["dense-L2"]) == strip(cfgs["baseline"])
    added = arm_configs(cfg, ["pld"], [], control="dense")
    assert list(added) == ["pld", "dense-L1", "dense-L2", "dense-L3"]   # every depth below the base's 4
    assert dense_arms(cfgs["baseline"]) == ["dense-L1", "dense-L2", "dense-L3"]
    assert is_dense("dense-L12-d256") and not is_dense("dense-Lx") and not is_dense("baseline")
    with pytest.raises(ConfigError, match="dense-L<blocks>"):
        arm_configs(cfg, ["shallow"], [])
    with pytest.raises(ConfigError, match="--control"):
        arm_configs(cfg, None, [], control="wide")


def test_dense_arms_spend_the_baselines_flops_within_one_step(tiny_data_dir, tmp_path):
    cfgs = arm_configs(_yaml(tmp_path, tiny_data_dir), None, [], control="dense")
    base = cfgs["baseline"]
    plan = resolve("flops", base, cfgs)
    target = planned_flops(base)
    for arm in ("dense-L1", "dense-L2", "dense-L3"):
        n, c = plan["steps"][arm], cfgs[arm]
        assert n > base.train.steps                      # a smaller model gets more steps ...
        assert planned_flops(with_horizon(c, n)) >= target > planned_flops(with_horizon(c, n - 1))  # ... to the FLOP
        assert plan["flops_budget"][arm] == target
    assert plan["steps"]["dense-L1"] > plan["steps"]["dense-L2"] > plan["steps"]["dense-L3"]


def test_frontier_is_chosen_on_the_other_seeds():
    # dense-L2 is best on average, but seed 3 alone would pick dense-L3 (its one lucky seed)
    losses = {"baseline": {"1": 2.30, "2": 2.31, "3": 2.29},
              "dense-L2": {"1": 2.10, "2": 2.11, "3": 2.12},
              "dense-L3": {"1": 2.20, "2": 2.21, "3": 2.05}}
    assert frontier(losses) == {"1": "dense-L2", "2": "dense-L2", "3": "dense-L2"}
    # a seed missing in one arm is left out: with seeds 1 and 3 only, seed 1 is judged by the arm seed 3
    # picks (L3's lucky 2.05), and seed 3 by seed 1's pick (L2)
    losses["dense-L3"].pop("2")
    assert frontier(losses) == {"1": "dense-L3", "3": "dense-L2"}
    assert frontier({"baseline": {"7": 2.0}, "dense-L1": {"7": 1.9}}) == {"7": "dense-L1"}   # one seed: chosen on it


def test_paired_gaps_to_baseline_and_frontier():
    rows = [dict(arm="baseline", seed_labels=["seed1", "seed2", "seed3"], val_losses=[2.30, 2.32, 2.28]),
            dict(arm="pld", seed_labels=["seed1", "seed2", "seed3"], val_losses=[2.25, 2.28, 2.22]),
            dict(arm="dense-L3", seed_labels=["seed1", "seed2", "seed3"], val_losses=[2.10, 2.11, 2.12])]
    front = paired_gaps(rows, "baseline")
    by = {r["arm"]: r for r in rows}
    assert front["per_seed"] == {"seed1": "dense-L3", "seed2": "dense-L3", "seed3": "dense-L3"}
    assert by["pld"]["vs_baseline"]["gaps"] == pytest.approx([-0.05, -0.04, -0.06])
    assert by["pld"]["vs_baseline"]["verdict"] == "wins"
    assert by["pld"]["vs_frontier"]["gaps"] == pytest.approx([0.15, 0.17, 0.10])
    assert by["pld"]["vs_frontier"]["verdict"] == "loses"
    assert "vs_baseline" not in by["baseline"] and by["baseline"]["vs_frontier"]["verdict"] == "loses"
    # without dense arms there is no frontier, only the baseline comparison
    rows2 = [{k: r[k] for k in ("arm", "seed_labels", "val_losses")} for r in rows[:2]]
    assert paired_gaps(rows2, "baseline") == {} and "vs_frontier" not in rows2[1]


def test_frontier_minimum_at_the_edge_is_said():
    # the frontier is only the best plain model if a smaller and a larger plain model were measured and lost
    def rows(best):
        out = []
        for arm, n in (("dense-L2", 10), ("dense-L4", 20), ("baseline", 30), ("dense-L9", 40)):
            loss = 2.0 if arm == best else 2.3
            out.append(dict(arm=arm, params=n, seed_labels=["s1", "s2", "s3"], val_losses=[loss, loss + 0.01, loss - 0.01]))
        return out
    for best, bracketed in (("dense-L4", True), ("dense-L2", False), ("dense-L9", False)):
        r = rows(best)
        front = paired_gaps(r, "baseline")
        assert front["bracketed"] is bracketed and front["edge"] == ([] if bracketed else [best])
        text = format_gaps(r, front)
        assert ("frontier's minimum is at the edge of the arms tried" in text) is not bracketed


def test_compare_control_dense_end_to_end(tiny_data_dir, tmp_path, capsys):
    cfg, out = _yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    args = ["--config", str(cfg), "--out", str(out), "--budget", "flops", "--seeds", "2", "--control", "dense",
            "--model.n_layer=3"]
    assert compare_main(args) == 0
    text = capsys.readouterr().out
    assert "vs dense frontier" in text and "frontier: dense-L" in text
    s = json.loads((out / "summary.json").read_text())
    rows = {r["arm"]: r for r in s["rows"]}
    assert set(rows) == {"baseline", "pld", "dense-L1", "dense-L2"}
    assert set(s["frontier"]["per_seed"]) == {"seed1337", "seed1338"}
    assert rows["pld"]["vs_frontier"]["n"] == 2 and rows["pld"]["vs_baseline"]["n"] == 2
    for arm in ("dense-L1", "dense-L2"):
        assert rows[arm]["flops_ratio"] == pytest.approx(1.0, abs=0.35)   # one step of a tiny run over at most


def test_joint_frontier_pairs_two_experiments_through_their_shared_baseline():
    from accellib.analysis.frontier import joint_frontier
    seeds = ["seed1", "seed2", "seed3"]
    row = lambda arm, v, n=None: dict(arm=arm, seed_labels=seeds, val_losses=v, params=n)
    res = dict(name="a", summary=dict(rows=[row("baseline", [2.3, 2.32, 2.28], 30), row("pld", [2.2, 2.21, 2.19]),
                                            row("dense-L1", [2.0, 2.02, 1.98], 10)]))
    more = dict(name="b", summary=dict(rows=[row("baseline", [2.3, 2.32, 2.28], 30), row("dense-L1", [2.0, 2.02, 1.98], 10),
                                             row("dense-L1-d32", [1.9, 1.91, 1.89], 5), row("dense-L1-d16", [1.95, 1.97, 1.93], 2)]))
    j = joint_frontier(res, more)
    by = {r["arm"]: r for r in j["rows"]}
    assert j["frontier"]["per_seed"] == dict.fromkeys(seeds, "dense-L1-d32") and j["frontier"]["bracketed"] is True
    assert by["pld"]["vs_frontier"]["gaps"] == pytest.approx([0.3, 0.3, 0.3])
    assert "vs_frontier" not in res["summary"]["rows"][1]          # the cached rows are not touched
    more["summary"]["rows"][0]["val_losses"] = [2.3, 2.33, 2.28]   # another baseline: not the same runs
    with pytest.raises(ValueError, match="do not share their baseline runs"):
        joint_frontier(res, more)
