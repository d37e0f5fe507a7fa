"""Layered gradient accumulation: bitwise equal to standard accumulation on one process, equal to
the global-batch gradient on 2 gloo ranks with one reduction per parameter in reverse layer order."""
import copy
import json
from pathlib import Path

import pytest
import torch
from accellib.core.launch import launch_processes

from accellib.core.config import load_config
from accellib.models.transformer import BlockPlan, Plan, Transformer
from accellib.parallel.layered_accumulation import segment_names
from accellib.core.trainer import Trainer
from conftest import tiny_overrides


def _grads_at_step(tr):
    """Run one trainer step and capture the gradients the optimizer would see."""
    got = {}

    def fake_step(*a, **k):
        got.update({n: p.grad.detach().clone() for n, p in tr.raw_model.named_parameters()
                    if p.grad is not None})
    tr.optimizer.step = fake_step
    tr.train_step()
    return got


def _pair(data_dir, dtype, **kw):
    over = {"optim.grad_clip": 0, "train.grad_accum": 3, "train.batch_size": 4, "model.vocab_size": 257, **kw}
    cfg_std = load_config(None, tiny_overrides(data_dir, **over))
    cfg_lga = load_config(None, tiny_overrides(data_dir, **over, **{"layered_accumulation.enabled": True}))
    torch.manual_seed(0)
    model = Transformer(cfg_std.model).to(dtype)
    return Trainer(cfg_std, model=copy.deepcopy(model)), Trainer(cfg_lga, model=copy.deepcopy(model))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tie,kind", [(True, "gpt"), (False, "gpt"), (True, "mlm")])
def test_bitwise_equal_to_standard_accumulation(tiny_data_dir, dtype, tie, kind):
    # mlm: both run the head on the masked positions only (LMTask.positions)
    std, lga = _pair(tiny_data_dir, dtype, **{"model.tie_head": tie, "model.kind": kind})
    assert [t.name for t in lga.techniques] == ["layered_accumulation"]
    g_std, g_lga = _grads_at_step(std), _grads_at_step(lga)
    assert g_std.keys() == g_lga.keys() and len(g_std) > 10
    for n in g_std:
        assert torch.equal(g_std[n], g_lga[n]), n
    # the engine's own micro-batch-major order gives the same bits too (optimizer step was faked)
    lga.techniques[0].cfg.order = "standard"
    lga.state.step = 0
    for n, g in _grads_at_step(lga).items():
        assert torch.equal(g, g_std[n]), n


def test_plans_with_skipped_and_scaled_blocks(tiny_data_dir):
    """Layer-dropping plans: a block skipped on one micro-batch, another on all, a scaled one."""
    std, lga = _pair(tiny_data_dir, torch.float64)
    batches = std.batches(0)
    plans = [Plan.full(4) for _ in batches]
    plans[0].blocks[1] = BlockPlan(run=False)
    for p in plans:
        p.blocks[2] = BlockPlan(run=False)
        p.blocks[3] = BlockPlan(scale=0.5)
    for m, ((x, y), plan) in enumerate(zip(batches, plans)):   # the trainer's standard loop
        loss, total = std.forward_loss(x, y, plan)
        std.accelerator.backward(total / len(batches))
    losses = lga.techniques[0].run_step(lga, lga.batches(0), plans)
    assert len(losses) == len(batches)
    for (n, p), (_, q) in zip(std.raw_model.named_parameters(), lga.raw_model.named_parameters()):
        if ".h.2." in n:
            assert p.grad is None and q.grad is None, n     # never ran: no gradient, no reduction
        else:
            assert torch.equal(p.grad, q.grad), n
    assert not any(".h.2." in n for n in lga.techniques[0].reductions)


def test_trace_order_one_process(tiny_data_dir):
    _, lga = _pair(tiny_data_dir, torch.float32)
    lga.train_step()
    tech = lga.techniques[0]
    done = [s for ev, s, _ in tech.trace if ev == "bwd_done"]
    assert done == list(range(5, -1, -1))   # head, h.3 .. h.0, embed
    assert segment_names(4)[done[0]] == "head"
    names = [n for n, _ in lga.raw_model.named_parameters()]
    assert sorted(tech.reductions) == sorted(names)   # exactly once each (1 process: no all_reduce)


def test_config_rejects_bad_order(tiny_data_dir):
    from accellib.core.options import ConfigError
    with pytest.raises(ConfigError, match="order"):
        load_config(None, tiny_overrides(tiny_data_dir, **{"layered_accumulation.order": "sideways"}))


def test_emulated_network_overlaps_in_layered_order(tiny_data_dir):
    """Slow emulated link: layered order launches the first reduction long before the backward
    ends; standard order launches everything during the last micro-batch's backward."""
    over = {"layered_accumulation.emulate_mbps": 20.0}
    _, lga = _pair(tiny_data_dir, torch.float32, **over)
    lga.train_step()
    tr = lga.techniques[0].trace
    first_launch = min(t for ev, _, t in tr if ev == "reduce_launch")
    bwd_end = max(t for ev, _, t in tr if ev == "bwd_done")
    assert first_launch < bwd_end
    assert sum(ev == "reduce_done" for ev, _, _ in tr) == 6


# ----------------------------------------------------------------------------- 2 gloo ranks
def _dp_worker(data_dir, out_dir):
    from accelerate.state import AcceleratorState
    cfg = load_config(None, tiny_overrides(data_dir, **{
        "optim.grad_clip": 0, "train.grad_accum": 2, "train.batch_size": 4,
        "layered_accumulation.enabled": True}))
    tr = Trainer(cfg)
    grads = _grads_at_step(tr)
    tech = tr.techniques[0]
    rank = tr.accelerator.process_index
    Path(out_dir, f"lga_rank{rank}.json").write_text(json.dumps(dict(
        grads={n: g.flatten().tolist() for n, g in grads.items()},
        trace=tech.trace, reductions=tech.reductions)))
    tr.accelerator.wait_for_everyone()
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.timeout(150)
def test_two_ranks_match_global_batch_and_reduce_in_reverse_layer_order(tiny_data_dir, tmp_path):
    launch_processes(_dp_worker, (tiny_data_dir, tmp_path), 2, timeout_s=150)
    r0, r1 = (json.loads((tmp_path / f"lga_rank{r}.json").read_text()) for r in (0, 1))
    # one process, 4 micro-batches = the global batch of 2 ranks x 2 micro-batches
    cfg = load_config(None, tiny_overrides(tiny_data_dir, **{
        "optim.grad_clip": 0, "train.grad_accum": 4, "train.batch_size": 4}))
    ref = _grads_at_step(Trainer(cfg))
    assert r0["grads"].keys() == ref.keys()
    for n, g in ref.items():
        for r in (r0, r1):
            torch.testing.assert_close(torch.tensor(r["grads"][n]), g.flatten(), rtol=0, atol=1e-6)
    names = list(ref)
    for r in (r0, r1):
        assert sorted(r["reductions"]) == sorted(names)          # exactly one per parameter
        ev = [(e, s) for e, s, _ in r["trace"]]
        launches = [s for e, s in ev if e == "reduce_launch"]
        assert launches == list(range(5, -1, -1))               # reverse layer order
        for s in launches[:-1]:                                 # launched before lower layers finish
            assert ev.index(("reduce_launch", s)) < ev.index(("bwd_done", s - 1))
        assert sorted(s for e, s in ev if e == "reduce_done") == list(range(6))
