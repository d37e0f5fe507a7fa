"""PLD and SBLD: schedule values, the gate's expectation, 1/p unbiasedness, eval = plain model,
no update for skipped blocks, 2-process agreement, exact resume, SBLD's list edge cases."""
import json
import math
import re
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from accellib.core.launch import launch_processes

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.models.transformer import Plan, Transformer, run_block
from accellib.core.records import read_metrics
from accellib.techniques import REGISTRY
from accellib.techniques._layer_drop_common import (apply_gates, depth_keep_probs, draw_gates,
                                                    expected_executed, pld_theta)
from accellib.techniques.base import Technique, check_composition
from accellib.techniques.sensitivity_layer_drop import block_list, fit_pwegd, keep_prob_list, pwegd
from accellib.train import training_function
from accellib.core.trainer import Trainer
from conftest import crash_and_resume, tiny_overrides

PLD = {"pld.enabled": "true", "pld.gamma": 0.5, "pld.theta_bar": 0.5}
SBLD = {"sbld.enabled": "true", "sbld.profile_step": 2, "sbld.profile_batches": 2, "sbld.gamma": 0.5,
        "sbld.block_fraction": 0.25}


# ----------------------------------------------------------------------------- schedule and gates
def test_pld_schedule_golden_values():
    assert pld_theta(0, 0.5, 0.001) == 1.0
    assert pld_theta(1000, 0.5, 0.001) == pytest.approx(0.5 + 0.5 * math.exp(-1))
    assert pld_theta(10**7, 0.7, 0.001) == pytest.approx(0.7)
    assert depth_keep_probs(0.5, 4, "paper") == pytest.approx([0.875, 0.75, 0.625, 0.5])
    assert depth_keep_probs(0.5, 4, "code") == pytest.approx([1.0, 0.875, 0.75, 0.625])
    assert expected_executed(0.5, 12, "paper") == pytest.approx(8.75)
    assert expected_executed(0.5, 12, "code") == pytest.approx(9.25)
    for conv in ("paper", "code", "uniform"):
        assert sum(depth_keep_probs(0.6, 8, conv)) == pytest.approx(expected_executed(0.6, 8, conv))


@pytest.mark.parametrize("conv", ["paper", "code"])
def test_monte_carlo_expected_executed_blocks(conv):
    L, theta, n = 8, 0.5, 6000
    probs = depth_keep_probs(theta, L, conv)
    counts = torch.tensor([[float(g) for g in draw_gates(probs, 7, s, m)] for s in range(n // 2) for m in range(2)])
    mean, sd = counts.sum(1).mean().item(), counts.sum(1).std().item()
    assert abs(mean - expected_executed(theta, L, conv)) < 4 * sd / math.sqrt(n)     # E[sum G] = sum p
    torch.testing.assert_close(counts.mean(0), torch.tensor(probs), atol=0.03, rtol=0)  # each block's rate
    # draws are a function of (seed, step, micro_step) only
    assert draw_gates(probs, 7, 5, 1) == draw_gates(probs, 7, 5, 1)
    assert any(draw_gates(probs, 7, 5, 0) != draw_gates(probs, 7, s, 0) for s in range(6, 12))


def test_never_all_blocks_dropped():
    probs = [0.02, 0.05, 0.01]
    for s in range(300):
        g = draw_gates(probs, 0, s, 0)
        assert any(g)
    assert draw_gates([1e-9, 1e-9], 0, 0, 0) == [True, False]  # ties: the lower block runs


class LinearBlock(nn.Module):
    """y = x + scale * W x: a block whose residual branch is linear, so E[y] is computable."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Linear(d, d, bias=False)

    def forward(self, x, scale=1.0):
        return x + scale * self.w(x)


def test_inverse_p_scaling_is_unbiased_on_linear_blocks():
    import itertools
    torch.manual_seed(0)
    blocks = [LinearBlock(6) for _ in range(3)]
    x = torch.randn(2, 5, 6)

    def run(gates, probs, scale=True):
        p, h = Plan.full(3), x
        apply_gates(p, gates, probs, scale)
        for b, bp in zip(blocks, p.blocks):
            h = run_block(b, h, bp)
        return h
    with torch.no_grad():
        full = run([True] * 3, [1.0] * 3)
        # exact: sum over all 2^3 gate patterns weighted by their probability, E[prod (I + G/p W)] = prod (I + W)
        probs = depth_keep_probs(0.4, 3, "paper")
        exact = sum(math.prod(p if g else 1 - p for g, p in zip(gs, probs)) * run(list(gs), probs)
                    for gs in itertools.product([False, True], repeat=3))
        torch.testing.assert_close(exact, full, atol=1e-5, rtol=0)
        # Monte Carlo through the real gate sampler (theta high enough that "never all dropped",
        # probability 0.1*0.2*0.3, is lost in the noise): within 5 standard errors; without 1/p: biased
        probs = depth_keep_probs(0.7, 3, "paper")
        outs = torch.stack([run(draw_gates(probs, 3, s, 0), probs) for s in range(3000)])
        outs_u = torch.stack([run(draw_gates(probs, 3, s, 0), probs, scale=False) for s in range(3000)])
    se = outs.std(0) / math.sqrt(len(outs))
    assert ((outs.mean(0) - full).abs() < 5 * se + 1e-6).all()
    assert ((outs_u.mean(0) - full).abs() > 5 * se).float().mean() > 0.5


# ----------------------------------------------------------------------------- training behaviour
def test_no_drop_is_bitwise_baseline_and_eval_is_plain_model(tiny_cfg):
    base = Trainer(tiny_cfg())
    pld1 = Trainer(tiny_cfg(**{"pld.enabled": "true", "pld.theta_bar": 1.0}))
    assert [base.train_step() for _ in range(3)] == [pld1.train_step() for _ in range(3)]
    # a dropping run's weights load into the plain model and eval equals it exactly
    tr = Trainer(tiny_cfg(**PLD))
    for _ in range(4):
        tr.train_step()
    plain = Transformer(tr.cfg.model)
    plain.load_state_dict(tr.raw_model.state_dict())
    plain.eval()
    x = torch.randint(0, 256, (3, tr.cfg.model.seq_len))
    tr.model.eval()
    with torch.no_grad():
        assert torch.equal(tr.model(x)[0], plain(x)[0])
    assert tr.evaluate() == tr.evaluate()


@pytest.mark.parametrize("zero_fill", [False, True])
def test_skipped_block_gets_no_update_unless_zero_fill(tiny_cfg, zero_fill):
    tr = Trainer(tiny_cfg(**PLD, **{"pld.zero_fill": str(zero_fill).lower(), "train.steps": 40}))
    tech, checked = tr.techniques[0], 0
    for _ in range(40):
        step = tr.state.step
        gates = draw_gates(tech.keep_probs(step), tr.cfg.train.seed, step, 0)
        before = [torch.cat([p.detach().flatten() for p in b.parameters()]).clone() for b in tr.raw_model.blocks]
        tr.train_step()
        for i, b in enumerate(tr.raw_model.blocks):
            after = torch.cat([p.detach().flatten() for p in b.parameters()])
            if gates[i]:
                assert not torch.equal(after, before[i])
            elif step > 0:  # AdamW has momentum from earlier steps
                checked += 1
                assert torch.equal(after, before[i]) != zero_fill
    assert checked >= 3


def test_metrics_report_expected_and_realised_blocks(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**PLD, **{"train.steps": 30, "train.grad_accum": 2})
    training_function(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    last = recs[-1]
    L = cfg.model.n_layer
    assert last["theta"] == pytest.approx(pld_theta(29, 0.5, 0.5), abs=1e-5)
    assert last["expected_blocks"] == pytest.approx(expected_executed(last["theta"], L), abs=1e-3)
    assert sum(last["keep_probs"]) == pytest.approx(last["expected_blocks"], abs=1e-3)
    # cumulative expected vs realised blocks per micro-batch (60 micro-batches)
    assert abs(last["expected_blocks_per_micro_batch"] - last["blocks_per_micro_batch"]) < 0.35
    assert last["blocks_per_micro_batch"] < L - 0.5                        # it really drops
    assert last["flops"] / last["expected_flops"] == pytest.approx(1.0, abs=0.1)
    assert all(0 < r["realised_blocks"] <= L for r in recs)


def test_bad_config_and_composition():
    with pytest.raises(ConfigError, match="pld.theta_bar"):
        load_config(None, ["--pld.theta_bar=0"])
    with pytest.raises(ConfigError, match="pld.convention"):
        load_config(None, ["--pld.convention=deep"])
    with pytest.raises(ConfigError, match="variance_params"):
        load_config(None, ["--sbld.enabled=true", "--sbld.schedule=variance"])
    cfg = load_config(None, ["--pld.enabled=true", "--sbld.enabled=true"])
    pld, sbld = (REGISTRY[n](cfg.techniques[n], cfg) for n in ("pld", "sbld"))
    with pytest.raises(ValueError, match="both decide the plan's 'run'"):
        check_composition([pld, sbld])

    class KeepWriter(Technique):  # stands for random-LTD, which writes only 'keep'
        name, plan_fields = "keep_writer", ("keep",)
    check_composition([pld, KeepWriter(None, cfg)])


# ----------------------------------------------------------------------------- 2 processes
def _two_proc(data_dir, out_dir):
    from accelerate.state import AcceleratorState
    for name, extra in (("pld", PLD), ("sbld", SBLD)):
        cfg = load_config(None, tiny_overrides(data_dir, **extra, **{"train.batch_size": 4, "train.grad_accum": 2}))
        tr = Trainer(cfg)
        gates = []
        for _ in range(5):
            gates.append([[bp.run for bp in tr.plan(tr.state.step, m).blocks] for m in range(2)])
            tr.train_step()
        flat = torch.cat([p.detach().flatten() for p in tr.raw_model.parameters()])
        rank = tr.accelerator.process_index
        Path(out_dir, f"{name}_rank{rank}.json").write_text(json.dumps(dict(
            gates=gates, params=flat.tolist(), sens=getattr(tr.techniques[0], "sensitivity", None),
            ddp=tr.model.find_unused_parameters)))
        tr.accelerator.wait_for_everyone()
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.timeout(240)
def test_two_processes_same_gates_params_in_sync(tiny_data_dir, tmp_path):
    launch_processes(_two_proc, (tiny_data_dir, tmp_path), 2, timeout_s=150)
    for name in ("pld", "sbld"):
        r0, r1 = (json.loads((tmp_path / f"{name}_rank{r}.json").read_text()) for r in (0, 1))
        assert r0["ddp"] and r1["ddp"]                       # find_unused_parameters=True
        assert r0["gates"] == r1["gates"]
        assert not all(all(m) for s in r0["gates"] for m in s), "no block was ever skipped"
        assert r0["params"] == r1["params"]
        assert r0["sens"] == r1["sens"]                      # SBLD: profiled lists agree (reduced)


# ----------------------------------------------------------------------------- resume
@pytest.mark.parametrize("extra", [PLD, dict(SBLD, **{"sbld.reprofile_every": 3})], ids=["pld", "sbld"])
def test_resume_mid_schedule_is_exact(tiny_cfg, tmp_path, monkeypatch, extra):
    kw = dict(extra, **{"train.steps": 9, "train.checkpoint_every": 4, "pld.gamma": 0.2, "sbld.gamma": 0.2})
    full, part, rec_full, rec_part = crash_and_resume(tiny_cfg, kw, tmp_path, monkeypatch, crash_after=6)
    assert part == full
    assert 0.3 < full[5]["theta"] < 0.99                     # the crash was mid-schedule
    assert rec_part["final"]["val_loss"] == rec_full["final"]["val_loss"]

# ----------------------------------------------------------------------------- SBLD lists
def test_sbld_budget_below_block_list_clamps_and_warns():
    sens = [0.9, 0.8, 0.1, 0.05]
    block = block_list(sens, 0.5)
    assert block == [0, 1]
    with pytest.warns(UserWarning, match="cannot cover the Block list"):
        p = keep_prob_list(0.4, sens, block, p_min=0.1)        # budget 1.6 < |Block| = 2
    assert p == [1.0, 1.0, 0.1, 0.1]


def test_sbld_budget_and_water_filling():
    sens = [0.5, 0.01, 0.2, 0.03, 0.02, 0.3]
    block = block_list(sens, 0.25)
    assert block == [0, 5]
    for theta in (0.5, 0.7, 0.9, 0.95):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            p = keep_prob_list(theta, sens, block, p_min=0.1)
        assert sum(p) == pytest.approx(theta * 6, abs=1e-9)   # sum_l p_l = theta L
        assert p[0] == p[5] == 1.0 and all(0.1 <= v <= 1.0 for v in p)
        # less sensitive -> dropped more: order of p follows order of sensitivity in the Allow list
        allow = sorted([1, 2, 3, 4], key=lambda l: sens[l])
        assert [p[l] for l in allow] == sorted(p[l] for l in allow)
    assert min(keep_prob_list(0.5, sens, block, p_min=0.1)) == 0.1   # the clip was active


def test_sbld_ties_break_by_depth():
    sens = [0.2, 0.2, 0.2, 0.2]
    assert block_list(sens, 0.25) == [0]                       # lower block goes on the Block list
    p = keep_prob_list(0.6, sens, [0], p_min=0.05)
    assert p[0] == 1.0 and p[1] > p[2] > p[3]                  # lower blocks kept more
    assert sum(p) == pytest.approx(2.4)
    assert block_list([0.1, 0.3, 0.3, 0.0], 0.0, threshold=0.5) == [1, 2]


def test_sbld_all_zero_sensitivity_uses_depth_prior():
    assert block_list([0.0] * 4, 0.25) == []
    with pytest.warns(UserWarning, match="depth-linear"):
        p = keep_prob_list(0.5, [0.0] * 4, [], p_min=0.1)
    assert p == pytest.approx(depth_keep_probs(0.5, 4, "paper"))


def test_sbld_profiles_after_warmup_and_variance_schedule(tiny_cfg):
    tr = Trainer(tiny_cfg(**SBLD))
    tech = tr.techniques[0]
    assert tech.sensitivity is None and tech.keep_probs(0) == [1.0] * 4
    for _ in range(3):
        tr.train_step()
    assert tech.profiled_at == [2] and len(tech.sensitivity) == 4 and max(tech.sensitivity) > 0
    assert tr.model.training                                   # profiling restored train mode
    assert sum(tech.keep_probs(2)) == pytest.approx(4.0)       # theta(0 steps after profiling) = 1
    assert sum(tech.keep_probs(100)) == pytest.approx(2.0, abs=1e-6)
    # the PWEGD fit recovers a curve it can represent, and drives theta in [theta_bar, 1]
    t = torch.arange(0, 200.0).numpy()
    truth = [0.0, 0.02, 0.0, 2.0, 40.0]
    fit = fit_pwegd(t, pwegd(t, truth), ks=(1.0, 2.0), betas=[20.0, 40.0])
    assert fit[4] == 40.0 and abs(pwegd(t, fit) - pwegd(t, truth)).max() < 1e-6 * pwegd(t, truth).max()
    cfg = tiny_cfg(**SBLD, **{"sbld.schedule": "variance", "sbld.variance_params": json.dumps(truth)})
    tv = Trainer(cfg).techniques[0]
    tv.sensitivity, tv.block = [0.3, 0.1, 0.2, 0.0], [0]
    thetas = [tv.theta(s) for s in range(2, 7)]
    assert all(0.5 <= v <= 1.0 for v in thetas) and max(thetas) > min(thetas)



# s_l of the tiny config (40 steps, 2 profiling batches, profiled after step 8), computed before issue 42 moved the
# profile out of the step: bitwise on the machine they came from; the tolerance allows for other CPU kernels
SBLD_SENSITIVITY = [float.fromhex(h) for h in ("0x1.acf18p-6", "0x1.3ap-9", "0x1.c163p-7", "0x1.ab2acp-5")]


def test_sbld_profile_is_one_off_work_run_eagerly(tiny_cfg, tmp_path, monkeypatch):
    """The profile runs between two steps through Trainer.one_off (its seconds in one_off_s, none in the steps'
    wall; its FLOPs still charged), and its forwards run the compiled blocks' eager code: a compiled run's
    sensitivities are an eager run's, bit for bit, and today's values."""
    over = {"train.steps": 40, "sbld.enabled": True, "sbld.profile_batches": 2}
    sens = {}
    for compile_ in ("none", "blocks"):
        torch._dynamo.reset()
        tr = Trainer(tiny_cfg(**over, **{"train.compile": compile_, "train.compile_backend": "aot_eager"}))
        for _ in range(9):
            tr.train_step()
        sens[compile_] = tr.techniques[0].sensitivity
        assert tr.techniques[0].profiled_at == [8] and "sbld_profile" in tr.state.one_off
    torch._dynamo.reset()
    assert sens["blocks"] == sens["none"] == pytest.approx(SBLD_SENSITIVITY, rel=1e-4, abs=1e-6)
    # a slow profile (0.5 s more) is outside the run's wall, which the profile's FLOPs still count in
    profile = REGISTRY["sbld"].profile
    monkeypatch.setattr(REGISTRY["sbld"], "profile", lambda self, t: (time.sleep(0.5), profile(self, t))[1])
    cfg = tiny_cfg(**SBLD, **{"train.steps": 4, "train.log_every": 4, "train.eval_every": 0,
                              "train.checkpoint_every": 0})
    tr = Trainer(cfg, tmp_path / "run")
    tr.fit()
    sb = tr.techniques[0]
    assert sb.profiled_at == [2] and tr.state.one_off["sbld_profile"] >= 0.5 > tr.state.wall
    steps = sum(tr.task.micro_flops(p) for p in [Plan.full(4)] * 2)  # 2 steps at the full model before dropping
    assert tr.state.flops > steps + sb.extra_flops(2, tr.task) > steps

# ----------------------------------------------------------------------------- the your-turn hooks (notebooks 01, 02)
def _solution(stem: str, name: str):
    """The reference answer of a notebook's your-turn (notebooks/solutions/<stem>_solutions.md, '## Your turn')."""
    md = (Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / f"{stem}_solutions.md").read_text()
    ns: dict = {}
    exec(re.search(r"^## Your turn.*?```python\n(.*?)```", md, re.S | re.M).group(1), ns)
    return ns[name]


def _routed(cfg, name: str, attr: str, fn, steps: int = 5):
    """Training losses and blocks run of `steps` steps with technique `name`'s hook `attr` set to fn."""
    tr = Trainer(cfg)
    setattr(next(t for t in tr.techniques if t.name == name), attr, fn)
    return [tr.train_step().item() for _ in range(steps)], tr.state.blocks_run


def test_pld_keep_probs_fn_routes_the_keep_probabilities(tiny_cfg):
    cfg = tiny_cfg(**PLD)
    chain = lambda step, theta_bar, gamma, L: depth_keep_probs(pld_theta(step, theta_bar, gamma), L)  # notebook 01's reference
    base = _routed(cfg, "pld", "keep_probs_fn", None)
    assert base[1] < 5 * 4, "no block was skipped: the hook would not matter"
    assert _routed(cfg, "pld", "keep_probs_fn", chain) == base                      # accellib's own: bitwise
    assert _routed(cfg, "pld", "keep_probs_fn", _solution("01_progressive_layer_dropping", "my_pld_keep_probs")) == base
    # a wrong answer (blocks counted from 0: DeepSpeedExamples' convention) is really used
    wrong = lambda step, theta_bar, gamma, L: depth_keep_probs(pld_theta(step, theta_bar, gamma), L, "code")
    assert _routed(cfg, "pld", "keep_probs_fn", wrong)[0] != base[0]
    seen = []
    _routed(cfg, "pld", "keep_probs_fn", lambda *a: seen.append(a) or chain(*a), steps=2)
    assert sorted(set(seen)) == [(0, 0.5, 0.5, 4), (1, 0.5, 0.5, 4)]                 # the your-turn's signature
    with pytest.raises(ValueError, match="pld.convention=paper"):
        _routed(tiny_cfg(**PLD, **{"pld.convention": "code"}), "pld", "keep_probs_fn", chain)
    with pytest.raises(ValueError, match="3 keep probabilities for 4 blocks"):
        _routed(cfg, "pld", "keep_probs_fn", lambda *a: chain(*a)[:3])


def test_sbld_keep_prob_list_fn_routes_algorithm_1(tiny_cfg):
    cfg = tiny_cfg(**SBLD)
    base = _routed(cfg, "sbld", "keep_prob_list_fn", None)
    assert base[1] < 5 * 4, "no block was skipped: the hook would not matter"
    assert _routed(cfg, "sbld", "keep_prob_list_fn", keep_prob_list) == base        # notebook 02's reference: bitwise
    assert _routed(cfg, "sbld", "keep_prob_list_fn",
                   _solution("02_sensitivity_based_layer_dropping", "my_keep_prob_list")) == base
    # a wrong answer (theta for every block: no Block list, no ranking) is really used
    assert _routed(cfg, "sbld", "keep_prob_list_fn", lambda theta, sens, block, p_min: [theta] * len(sens))[0] != base[0]
    seen = []
    def spy(theta, sens, block, p_min):
        seen.append((theta, sens, block, p_min))
        sens.append(9.9)                                    # the technique passes copies: its profile is safe
        return keep_prob_list(theta, sens[:-1], block, p_min)
    tr = Trainer(cfg)
    tech = tr.techniques[0]
    tech.keep_prob_list_fn = spy
    for _ in range(4):
        tr.train_step()
    assert seen and seen[0][2] == tech.block and len(tech.sensitivity) == 4 and seen[0][3] == 0.1
    # keep_prob_list's fallbacks stay accellib's: the function is called exactly where the water-filling runs
    def never(*a):
        raise AssertionError("called on a fallback")
    tech.keep_prob_list_fn, tech._cache = never, {}
    tech.sensitivity = [0.0] * 4
    assert tech.keep_probs(50) == pytest.approx(depth_keep_probs(tech.theta(50), 4))
    tech.sensitivity, tech.block, tech._cache = [0.3, 0.2, 0.1, 0.05], [0, 1, 2], {}
    assert tech.keep_probs(50)[3] == 0.1                      # budget 2 < 3 + p_min: clamped
    with pytest.raises(ValueError, match="2 keep probabilities for 4 blocks"):
        _routed(cfg, "sbld", "keep_prob_list_fn", lambda *a: [1.0, 1.0])

