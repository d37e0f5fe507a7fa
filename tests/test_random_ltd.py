"""Random-LTD (Yao et al. 2022): exact properties of the mechanism, the schedules, the
LayerToken bookkeeping, composition with PLD, 2 processes, and resume."""
import json
from pathlib import Path

import pytest
import torch
from accellib.core.launch import launch_processes

from accellib.analysis import flops as F
from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.data.tokens import generator_for, seed_for
from accellib.models.transformer import BlockPlan, ModelConfig, Plan, Transformer, run_block
from accellib.core.records import read_metrics
from accellib.core.schedules import WarmupCosine
from accellib.techniques import REGISTRY
from accellib.techniques.base import Technique, check_composition
from accellib.techniques.random_ltd import (LayerTokenLR, RandomLTD, ReservedLength, keep_indices,
                                            kept_key_mask)
from accellib.train import training_function
from accellib.core.trainer import Trainer
from conftest import crash_and_resume, tiny_overrides

LTD = {"random_ltd.enabled": True}


def params(tr):
    return torch.cat([p.detach().flatten() for p in tr.raw_model.parameters()])


# ----------------------------------------------------------------------------- schedule
def test_reserved_length_values_and_clamp():
    s = ReservedLength(min_len=8, full_len=32, step_len=8, ramp_steps=4)
    # r_min + t/4 * 24 = 8, 14, 20, 26, 32 -> floor to multiples of 8
    assert [s(t) for t in range(7)] == [8, 8, 16, 24, 32, 32, 32]
    # min 8 with q = 16 would round to 0 (DeepSpeed PR #8529): clamp to the first multiple >= min
    s = ReservedLength(min_len=8, full_len=64, step_len=16, ramp_steps=10)
    assert s(0) == 16 and min(s(t) for t in range(20)) == 16 and s(10) == 64
    # S not a multiple of q: 5 + 5t = 5, 10, 15, 20, 25 -> 8, 8, 8, 16, 24; then S itself (not 24)
    s = ReservedLength(min_len=5, full_len=30, step_len=8, ramp_steps=5)
    assert [s(t) for t in range(6)] == [8, 8, 8, 16, 24, 30]
    with pytest.raises(ConfigError, match="min_len=40"):
        ReservedLength(40, 32, 8, 4)


def test_layer_token_lr_equals_step_schedule_without_dropping_and_stretches_with_it():
    P = 1000
    lt = LayerTokenLR(1.0, warmup=10, total=110, min_ratio=0.1, lt_per_step=P)
    ws = WarmupCosine(1.0, warmup=10, total=110, min_ratio=0.1)
    for t in (0, 5, 9, 10, 37, 60, 110, 200):
        assert lt.at(t * P) == pytest.approx(ws.at(t), rel=0, abs=1e-15)
    # hand-computed: half the LayerTokens of 60 full steps is 30 equivalent steps
    # u = (30 - 10) / 100 = 0.2, lr = 0.1 + 0.9 * (1 + cos(0.2 pi)) / 2
    assert lt.at(30 * P) == pytest.approx(0.1 + 0.45 * (1 + 0.8090169943749475))
    assert lt.at(int(9.5 * P)) == 1.0  # warm-up never overshoots the peak between integer steps


def test_bad_config_is_one_line(tiny_data_dir):
    for kw, msg in (({"random_ltd.min_len": 64}, "min_len=64"),
                    ({"model.n_layer": 2}, "n_layer >= 3"),
                    ({"random_ltd.budget_steps": 10}, "train.steps=6"),
                    ({"random_ltd.layers": "[1, 9]"}, "layers")):
        with pytest.raises(ConfigError, match=msg) as e:
            Trainer(load_config(None, tiny_overrides(tiny_data_dir, **LTD, **kw)))
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- mechanism
def test_kept_indices_sorted_unique_in_range_and_independent():
    cfg = load_config(None, ["--random_ltd.enabled=true", "--model.n_layer=6", "--model.seq_len=64",
                             "--train.batch_size=16", "--random_ltd.min_len=16"])
    t = RandomLTD(cfg.techniques["random_ltd"], cfg)
    plan = Plan.full(6)
    t.update_plan(plan, step=0, micro_step=0)
    assert plan.blocks[0].keep is None and plan.blocks[5].keep is None   # first and last see all
    keeps = [plan.blocks[i].keep for i in range(1, 5)]
    for k in keeps:
        assert k.shape == (16, 16) and k.dtype == torch.int64
        assert (k.diff(dim=1) > 0).all()                                # sorted, hence unique
        assert k.min() >= 0 and k.max() < 64
    assert all(not torch.equal(a, b) for a, b in zip(keeps, keeps[1:]))  # independent per layer
    assert not torch.equal(keeps[0][0], keeps[0][1])                     # ... and per sample
    again = Plan.full(6)
    t.update_plan(again, step=0, micro_step=0)
    assert all(torch.equal(a.keep, b.keep) for a, b in zip(plan.blocks[1:5], again.blocks[1:5]))
    other = Plan.full(6)
    t.update_plan(other, step=0, micro_step=1)
    assert not torch.equal(other.blocks[1].keep, plan.blocks[1].keep)   # fresh per micro-batch
    # uniform: every position is kept about r/S = 1/4 of the time
    g = generator_for(0)
    freq = torch.cat([keep_indices(64, 64, 16, g) for _ in range(50)]).flatten().bincount(minlength=64)
    assert (freq.float() / (50 * 64) - 0.25).abs().max() < 0.05


def test_cpu_draws_are_bitwise_the_earlier_host_draws():
    # the indices were drawn on the host and copied to the device; cached results of CPU runs
    # depend on these exact subsets, so on CPU the device draw must be that same draw, bit for bit
    cfg = load_config(None, ["--random_ltd.enabled=true", "--model.n_layer=6", "--model.seq_len=64",
                             "--train.batch_size=16", "--random_ltd.min_len=16", "--train.seed=7"])
    t = RandomLTD(cfg.techniques["random_ltd"], cfg)
    for step, micro in ((0, 0), (3, 1)):
        plan = Plan.full(6)
        t.update_plan(plan, step=step, micro_step=micro)
        for i in range(1, 5):  # the earlier formula, written out
            g = torch.Generator().manual_seed(seed_for(7, step, micro, 0x17D, i))
            old = torch.rand(16, 64, generator=g).topk(t.last_r, dim=1, largest=False).indices.sort(dim=1).values
            assert torch.equal(plan.blocks[i].keep, old)
    # and one subset printed by the earlier code (step 0, micro 0, block 1, sample 0), so a change
    # of seed_for or of the formula above shows too
    assert plan.blocks[1].keep[0].tolist() != [3, 4, 5, 6, 8, 14, 15, 16, 19, 35, 37, 40, 43, 47, 49, 53]
    first = Plan.full(6)
    t.update_plan(first, step=0, micro_step=0)
    assert first.blocks[1].keep[0].tolist() == [3, 4, 5, 6, 8, 14, 15, 16, 19, 35, 37, 40, 43, 47, 49, 53]


def test_indices_are_made_on_the_trainers_device_without_a_copy(tiny_cfg, monkeypatch):
    tr = Trainer(tiny_cfg(**LTD, **{"random_ltd.min_len": 8}))
    monkeypatch.setattr(torch.Tensor, "to", lambda *a, **k: pytest.fail("keep indices were copied"))
    plan = tr.plan(0, 0)
    monkeypatch.undo()
    for i in (1, 2):
        assert plan.blocks[i].keep.device == tr.accelerator.device and plan.blocks[i].keep.shape == (8, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_draws_are_reproducible_and_uniform():
    a = keep_indices(64, 64, 16, generator_for(5, 1, 0, device="cuda"))
    b = keep_indices(64, 64, 16, generator_for(5, 1, 0, device="cuda"))
    assert a.is_cuda and torch.equal(a, b)                     # same integers, same draw: resume is exact
    assert not torch.equal(a.cpu(), keep_indices(64, 64, 16, generator_for(5, 1, 0)))  # Philox, not the CPU's
    g = generator_for(0, device="cuda")
    freq = torch.cat([keep_indices(64, 64, 16, g) for _ in range(50)]).flatten().bincount(minlength=64)
    assert (freq.float() / (50 * 64) - 0.25).abs().max() < 0.05


def _model(kind="gpt"):
    torch.manual_seed(0)
    cfg = ModelConfig(kind=kind, vocab_size=50, seq_len=16, n_layer=4, n_head=2, d_model=16)
    return Transformer(cfg), cfg


def test_gather_block_scatter_semantics():
    m, cfg = _model()
    x = torch.randn(3, 16, 16)
    keep = keep_indices(3, 16, 6, generator_for(1))
    blk = m.blocks[1]
    y = run_block(blk, x, BlockPlan(keep=keep))
    dropped = torch.ones(3, 16, dtype=torch.bool).scatter_(1, keep, False)
    assert torch.equal(y[dropped], x[dropped])                            # dropped tokens pass unchanged
    for b in range(3):                                                    # kept = block on the subsequence
        torch.testing.assert_close(y[b, keep[b]], blk(x[b:b + 1, keep[b]])[0], rtol=0, atol=1e-6)
    ident = torch.nn.Identity()                                           # gather, identity, scatter = identity
    assert torch.equal(run_block(lambda h, s=1.0: ident(h), x, BlockPlan(keep=keep)), x)


@pytest.mark.parametrize("sort, leaks", [(True, False), (False, True)])
def test_no_information_from_later_tokens_under_dropping(sort, leaks):
    """d output[t] / d input[j] == 0 for every j > t with sorted kept indices; an unsorted subset
    would break causality (the test can fail)."""
    m, cfg = _model()
    m.eval()
    g = generator_for(3)
    plan = Plan.full(4)
    for i in (1, 2):
        k = keep_indices(2, 16, 8, g)
        plan.blocks[i].keep = k if sort else k.flip(1)
    x = torch.randint(0, 50, (2, 16))
    emb = {}
    h = m.transformer.wte.register_forward_hook(lambda mod, i, o: emb.update(e=o))
    logits, _ = m(x, plan=plan)
    h.remove()
    e = emb["e"]
    leaked = False
    for t in range(15):
        (gr,) = torch.autograd.grad(logits[:, t].sum(), e, retain_graph=True)
        assert gr[:, t].abs().sum() > 0
        leaked |= bool(gr[:, t + 1:].abs().sum() > 0)
    assert leaked == leaks


def test_full_keep_length_reproduces_plain_training_bitwise(tiny_cfg):
    base = Trainer(tiny_cfg())
    ltd = Trainer(tiny_cfg(**LTD, **{"random_ltd.min_len": 32, "random_ltd.layer_token_lr": True}))
    a = [base.train_step() for _ in range(4)]
    b = [ltd.train_step() for _ in range(4)]
    assert a == b and torch.equal(params(base), params(ltd))
    assert base.evaluate() == ltd.evaluate() and ltd.state.layer_tokens == base.state.layer_tokens


def test_padding_mask_of_kept_tokens():
    pad = torch.tensor([[True] * 6 + [False] * 2, [True] * 8])
    keep = torch.tensor([[0, 3, 6, 7], [1, 2, 4, 5]])
    km = kept_key_mask(pad, keep)
    assert km.shape == (2, 1, 1, 4)
    assert km[0, 0, 0].tolist() == [True, True, False, False] and km[1].all()


# ----------------------------------------------------------------------------- accounting
def test_layer_token_accounting_hand_computed(tiny_cfg):
    # L=4 (blocks 1, 2 drop), S=32, B=8, grad_accum 2, r(t) = 8, 8, 16, 24, 32
    tr = Trainer(tiny_cfg(**LTD, **{"random_ltd.min_len": 8, "random_ltd.step_len": 8,
                                    "random_ltd.ramp_steps": 4, "train.grad_accum": 2}))
    seen = []
    for _ in range(5):
        tr.train_step()
        seen.append((tr.state.layer_tokens, tr.techniques[0].metrics(tr.state)["ltd_keep"]))
    # per micro-batch: B * (2 * S + 2 * r) = 8 * (64 + 2r): 640, 640, 768, 896, 1024
    cum, expect = 0, []
    for r in (8, 8, 16, 24, 32):
        cum += 2 * 8 * (64 + 2 * r)
        expect.append((cum, r))
    assert seen == expect
    # FLOPs through the same plans: block FLOPs at r tokens in the 2 middle blocks
    mc = tr.cfg.model
    flops = sum(2 * 8 * 3 * (2 * F.block_forward_flops(mc, 32) + 2 * F.block_forward_flops(mc, r)
                             + F.head_forward_flops(mc, 32)) for r in (8, 8, 16, 24, 32))
    assert tr.state.flops == flops


def test_budget_stop_and_layer_token_lr_in_a_run(tiny_cfg, tmp_path):
    kw = {**LTD, "random_ltd.min_len": 8, "random_ltd.layer_token_lr": True,
          "random_ltd.budget_steps": 6, "train.steps": 20, "train.eval_every": 0}
    final = training_function(tiny_cfg(**kw), tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    P = 8 * 32 * 4
    assert recs[-1]["layer_tokens"] >= 6 * P > recs[-2]["layer_tokens"]   # stops at the first step past the budget
    assert 6 < final["step"] < 20                                        # more steps than the baseline's 6
    assert recs[-1]["ltd_equiv_steps"] == recs[-1]["layer_tokens"] / P
    # the LR recorded at step t was computed from the LayerTokens consumed before it
    lr = LayerTokenLR(5e-3, 2, 6, 0.1, P)
    for prev, r in zip([dict(layer_tokens=0)] + recs, recs):
        assert r["lr"] == pytest.approx(lr.at(prev["layer_tokens"]))


# ----------------------------------------------------------------------------- composition
class _SkipBlock2(Technique):
    name = "skip_block_2"
    plan_fields = ("run",)

    def update_plan(self, plan, step, micro_step):
        plan.blocks[2].run = False


def test_composes_with_layer_dropping(tiny_cfg):
    tr = Trainer(tiny_cfg(**LTD, **{"random_ltd.min_len": 8}))
    tr.techniques.append(_SkipBlock2(None, tr.cfg))
    check_composition(tr.techniques)                      # 'keep' and 'run' do not clash
    plan = tr.plan(0, 0)
    assert not plan.blocks[2].run and plan.blocks[1].keep.shape == (8, 8)
    tr.train_step()
    assert tr.state.layer_tokens == 8 * (32 + 8 + 0 + 32)  # the skipped block counts 0
    assert all(p.grad is None for p in tr.raw_model.blocks[2].parameters())
    # and with the real PLD technique, through the config
    assert "pld" in REGISTRY
    tr = Trainer(tiny_cfg(**LTD, **{"pld.enabled": True, "pld.gamma": 1.0, "random_ltd.min_len": 8}))
    assert sorted(t.name for t in tr.techniques) == ["pld", "random_ltd"]
    losses = [tr.train_step() for _ in range(3)]
    plans = [tr.plan(s, 0) for s in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert any(not b.run for p in plans for b in p.blocks)         # PLD dropped some block
    assert all(p.blocks[1].keep is not None for p in plans)       # random-LTD still writes keep


# ----------------------------------------------------------------------------- distributed + resume
def _train_and_dump(data_dir, out_dir, extra):
    from accelerate.state import AcceleratorState
    cfg = load_config(None, tiny_overrides(data_dir, **extra))
    tr = Trainer(cfg)
    keep = [tr.plan(0, m).blocks[1].keep.tolist() for m in range(cfg.train.grad_accum)]  # before training
    losses = [tr.train_step() for _ in range(3)]
    rank, world = tr.accelerator.process_index, tr.accelerator.num_processes
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(dict(
        losses=[float(x) for x in losses], val=tr.evaluate()["val_loss"], params=params(tr).tolist(),
        lt=tr.state.layer_tokens, ddp=tr.techniques[0].ddp_kwargs(), keep=keep)))
    tr.accelerator.wait_for_everyone()
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("draws", ["per_rank", "shared"])
def test_two_processes_gloo(tiny_data_dir, tmp_path, draws):
    extra = {**LTD, "random_ltd.min_len": 8, "train.batch_size": 4, "random_ltd.draws": draws}
    launch_processes(_train_and_dump, (tiny_data_dir, tmp_path, extra), 2, timeout_s=150)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["ddp"] == {}                                 # every parameter is used: no find_unused_parameters
    assert r0["losses"] == r1["losses"] and r0["val"] == r1["val"] and r0["params"] == r1["params"]
    # 2 processes x 4 sequences; r = 8, 8, 16 in blocks 1 and 2 (ramp 60% of 6 steps = 4)
    assert r0["lt"] == 2 * 4 * sum(64 + 2 * r for r in (8, 8, 16))
    # one process with 2 micro-batches of the same 4 sequences each: the same global batch
    one = Trainer(load_config(None, tiny_overrides(tiny_data_dir, **extra, **{"train.grad_accum": 2})))
    m0, m1 = (one.plan(0, m).blocks[1].keep.tolist() for m in (0, 1))
    assert m0 == r0["keep"][0]                             # rank 0's draw is the 1-process draw of micro-batch 0
    if draws == "shared":
        assert r1["keep"] == r0["keep"] and m1 != m0       # every rank drops the same positions
    else:   # rank r draws like global micro-batch r: the draws do not depend on the processes/accumulation split
        assert r1["keep"] != r0["keep"] and r1["keep"][0] == m1


def test_draws_option_on_one_process_and_on_resume(tiny_cfg):
    # one process: per_rank and shared draw bitwise the same subsets (cached single-process results hold)
    a, b = (Trainer(tiny_cfg(**LTD, **{"random_ltd.min_len": 8, "random_ltd.draws": d, "train.grad_accum": 2}))
            for d in ("per_rank", "shared"))
    assert all(torch.equal(a.plan(s, m).blocks[1].keep, b.plan(s, m).blocks[1].keep) for s in (0, 3) for m in (0, 1))
    assert a.techniques[0].cfg.draws == "per_rank"         # the default
    # a multi-process resume under the other mode is refused in one line; an old checkpoint (no key) was shared
    t = a.techniques[0]
    state = t.state_dict()
    t.world = 2
    for saved in ({**state, "draws": "shared"}, {k: v for k, v in state.items() if k != "draws"}):
        with pytest.raises(ConfigError, match="draws=shared") as e:
            t.load_state_dict(saved)
        assert "\n" not in str(e.value)
    t.load_state_dict(state)                                # the same mode resumes
    t.world = 1
    t.load_state_dict({**state, "draws": "shared"})         # one process: the same subsets, accepted


def test_padded_data_is_refused_in_one_line(tiny_data_dir, tmp_path):
    import shutil
    padded = tmp_path / "padded"
    shutil.copytree(tiny_data_dir, padded)
    meta = json.loads((padded / "meta.json").read_text())
    (padded / "meta.json").write_text(json.dumps({**meta, "pad_id": 0}))
    cfg = load_config(None, tiny_overrides(str(padded), **LTD))
    with pytest.raises(ConfigError, match="pad_id=0") as e:
        Trainer(cfg)
    assert "\n" not in str(e.value)
    Trainer(load_config(None, tiny_overrides(str(padded))))   # without random-LTD the same data trains


@pytest.mark.parametrize("draws", ["per_rank", "shared"])
def test_resume_is_exact(tiny_cfg, tmp_path, monkeypatch, draws):
    kw = {**LTD, "random_ltd.min_len": 8, "random_ltd.layer_token_lr": True, "random_ltd.draws": draws,
          "train.steps": 8, "train.grad_accum": 2, "train.checkpoint_every": 5}
    full, part, rec_full, rec_part = crash_and_resume(tiny_cfg, kw, tmp_path, monkeypatch, crash_after=6)
    assert part == full
    assert rec_full["final"]["val_loss"] == rec_part["final"]["val_loss"]


# ----------------------------------------------------------------------------- the layer hook (notebook 03)
def _hook_losses(cfg, fn, steps=3):
    """Losses and final parameters of `steps` training steps with RandomLTD.layer_fn = fn."""
    tr = Trainer(cfg)
    next(t for t in tr.techniques if t.name == "random_ltd").layer_fn = fn
    return [float(tr.train_step()) for _ in range(steps)], params(tr)


@pytest.mark.parametrize("pld", [False, True], ids=["alone", "with_pld"])
def test_layer_fn_hook_with_accellibs_own_layer_is_bitwise_and_a_wrong_layer_changes_the_loss(tiny_cfg, pld):
    """layer_fn = None is run_block's gather -> block -> scatter; accellib's own layer through the hook gives the
    same bits (with PLD the block arrives with its 1/p scale bound), is called for every dropping block of every
    micro-batch, and a layer that lets the block see every token trains differently (the hook is really used)."""
    kw = dict(LTD, **{"random_ltd.min_len": 8})
    if pld:
        kw.update({"pld.enabled": True, "pld.gamma": 1.0})
    calls = []

    def accellib_layer(x, keep, block):
        calls.append(tuple(keep.shape) + (isinstance(block, torch.nn.Module),))   # False: PLD's scale bound
        return run_block(block, x, BlockPlan(keep=keep))

    ref, p_ref = _hook_losses(tiny_cfg(**kw), None)
    same, p_same = _hook_losses(tiny_cfg(**kw), accellib_layer)
    assert same == ref and torch.equal(p_same, p_ref)
    if not pld:  # every middle block (1 and 2 of 4) of each of the 3 steps; with PLD some are skipped
        assert len(calls) == 6 and all(b == 8 and r < 32 and plain for b, r, plain in calls)
    else:        # some dropping block ran with PLD's 1/p scale, through run_block's own call blk(h, s) as well
        assert not all(plain for *_, plain in calls)
    wrong, _ = _hook_losses(tiny_cfg(**kw), lambda x, keep, block: block(x))   # no token dropped
    assert max(abs(a - b) for a, b in zip(wrong, ref)) > 1e-4


def test_layer_fn_hook_is_not_called_at_full_length(tiny_cfg):
    def never(x, keep, block):
        raise AssertionError("called with r = S")
    plain = Trainer(tiny_cfg())
    base = [float(plain.train_step()) for _ in range(3)]
    full, _ = _hook_losses(tiny_cfg(**LTD, **{"random_ltd.min_len": 32}), never)
    assert full == base


def test_notebook_03s_reference_and_solution_keep_the_hooks_contract(tiny_cfg):
    """The check cell's reference (`run_block_kept`, what the notebook routes while the exercise is empty) gives
    bitwise the losses of layer_fn = None; the solution's answer stays within the notebook's 1e-5."""
    from test_exercises import solved
    ns = solved("03_random_ltd.ipynb")
    cfg = lambda: tiny_cfg(**LTD, **{"random_ltd.min_len": 8})
    ref, p_ref = _hook_losses(cfg(), None)
    routed, p_routed = _hook_losses(cfg(), ns["run_block_kept"])
    assert routed == ref and torch.equal(p_routed, p_ref)
    yours, _ = _hook_losses(cfg(), ns["my_random_ltd_layer"])
    assert max(abs(a - b) for a, b in zip(yours, ref)) <= 1e-5
