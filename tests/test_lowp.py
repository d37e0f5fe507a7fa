"""The emulated low-precision Linear (accellib/numerics/linear.py) and the `lowp` config section
(accellib/techniques/low_precision.py): exact GEMM composition, 23-bit equality with F.linear,
loss scaling, weights stored in the format, resume bitwise with stochastic rounding, two processes,
and one-line refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.core.launch import launch_processes
from accellib.numerics.accumulate import matmul
from accellib.numerics.formats import E5M2, E6M9, quantize
from accellib.numerics.linear import EmulatedLinear, LowpGemms, convert, emulated_linear
from accellib.core.records import read_metrics
from accellib.core.trainer import Trainer
from conftest import crash_and_resume, tiny_overrides, train_run

LOWP = {"lowp.enabled": True, "lowp.chunk": 8}


def _grads(fn, x, w, b, g):
    x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = fn(x, w, b)
    y.backward(g)
    return y.detach(), x.grad, w.grad, b.grad


def _data(seed=0, tokens=(3, 11), d_in=24, d_out=10):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*tokens, d_in, generator=g)
    w = torch.randn(d_out, d_in, generator=g) * 0.3
    b = torch.randn(d_out, generator=g)
    gy = torch.randn(*tokens, d_out, generator=g) * 1e-3
    return x, w, b, gy


@pytest.mark.parametrize("chunks", [(0, 0, 0), (8, 4, 5), (1, 1, 1)])
def test_fp32_formats_equal_f_linear(chunks):
    x, w, b, gy = _data()
    gemms = LowpGemms(chunk_fwd=chunks[0], chunk_bgrad=chunks[1], chunk_wgrad=chunks[2])
    got = _grads(lambda *a: emulated_linear(*a, gemms), x, w, b, gy)
    ref = _grads(F.linear, x, w, b, gy)
    for a, r in zip(got, ref):  # only the summation order differs
        assert torch.allclose(a, r, rtol=1e-5, atol=1e-6 * r.abs().max().item())


def test_each_gemm_uses_its_own_accumulation():
    """Forward K = d_in, input gradient K = d_out, weight gradient K = tokens, each chunked as configured."""
    x, w, b, gy = _data()
    s = 1024.0
    gemms = LowpGemms(E5M2, E6M9, chunk_fwd=8, chunk_bgrad=3, chunk_wgrad=0, loss_scale=s)
    y, gx, gw, gb = _grads(lambda *a: emulated_linear(*a, gemms), x, w, b, gy)
    x2, g2 = quantize(x.reshape(-1, 24), E5M2), quantize(gy.reshape(-1, 10) * s, E5M2)
    wq = quantize(w, E5M2)
    assert torch.equal(y.reshape(-1, 10), matmul(x2, wq.t(), E6M9, 8) + b)
    assert torch.equal(gx.reshape(-1, 24), matmul(g2, wq, E6M9, 3) / s)
    assert torch.equal(gw, matmul(g2.t(), x2, E6M9, 0) / s)
    assert torch.equal(gb, gy.reshape(-1, 10).sum(0))
    # and the chunk length matters: a naive weight-gradient sum differs from a chunked one here
    other = LowpGemms(E5M2, E6M9, chunk_fwd=8, chunk_bgrad=3, chunk_wgrad=4, loss_scale=s)
    assert not torch.equal(_grads(lambda *a: emulated_linear(*a, other), x, w, b, gy)[2], gw)


def _per_vector_sum(x, fmt, cl):
    """A plain per-vector chunked sum, as notebook 07's exercise asks for: each chunk in order, then the chunk sums."""
    total = torch.zeros(())
    for c0 in range(0, x.shape[0], cl):
        s = torch.zeros(())
        for t in x[c0:c0 + cl]:
            s = quantize(s + t, fmt)
        total = quantize(total + s, fmt)
    return total.item()


@pytest.mark.parametrize("fmt,chunk", [(E6M9, 0), (E6M9, 3), ("e6m4", 0), ("e6m4", 4)])
def test_matmul_by_a_per_vector_sum_is_matmul_bit_for_bit(fmt, chunk):
    from accellib.numerics.accumulate import matmul_by
    g = torch.Generator().manual_seed(3)
    a, b = quantize(torch.randn(5, 11, generator=g), E5M2), quantize(torch.randn(11, 4, generator=g), E5M2)
    assert torch.equal(matmul_by(_per_vector_sum, a, b, fmt, chunk), matmul(a, b, fmt, chunk))


def test_lowp_gemms_route_every_gemm_through_sum_fn():
    g = torch.Generator().manual_seed(4)
    x, w, b, gy = torch.randn(6, 8, generator=g), torch.randn(5, 8, generator=g), torch.zeros(5), torch.randn(6, 5, generator=g)
    out = {}
    for fn in (None, _per_vector_sum):
        gm = LowpGemms(E5M2, E6M9, 4, 2, 3, loss_scale=1024.0, sum_fn=fn)
        xx, ww = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = emulated_linear(xx, ww, b, gm)
        y.backward(gy)
        out[fn] = (y.detach(), xx.grad, ww.grad)
    assert all(torch.equal(p, q) for p, q in zip(out[None], out[_per_vector_sum]))
    with pytest.raises(ValueError, match="round to nearest"):
        LowpGemms(E5M2, E6M9, rounding="stochastic", sum_fn=_per_vector_sum).mm(x, w.t(), 0)


def test_loss_scaling_keeps_small_errors_out_of_fp8_underflow():
    x, w, b, gy = _data()
    gy = gy * 1e-3  # errors ~1e-6: below e5m2's smallest subnormal (2^-16 = 1.5e-5)
    ref = _grads(F.linear, x, w, b, gy)[2]
    unscaled = _grads(lambda *a: emulated_linear(*a, LowpGemms(E5M2, E6M9, loss_scale=1.0)), x, w, b, gy)[2]
    scaled = _grads(lambda *a: emulated_linear(*a, LowpGemms(E5M2, E6M9, loss_scale=2.0 ** 16)), x, w, b, gy)[2]
    assert unscaled.abs().max() < 0.05 * ref.abs().max()          # mostly flushed to zero
    assert torch.nn.functional.cosine_similarity(scaled.flatten(), ref.flatten(), dim=0) > 0.95


def test_convert_keeps_parameters_and_names():
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    done = convert(m, LowpGemms(E5M2, E6M9), keep=("0",))
    assert done == ["2", "3"] and type(m[0]) is nn.Linear and isinstance(m[2], EmulatedLinear)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 2)).load_state_dict(m.state_dict())


# ------------------------------------------------------------------------------ the lowp section
def test_training_stores_weights_in_the_format_and_keeps_first_last_fp32(tiny_cfg):
    t = Trainer(tiny_cfg(**LOWP, **{"train.steps": 3}))
    t.fit()
    tech = next(x for x in t.techniques if x.name == "lowp")
    assert tech.kept == ["transformer.h.0.attn.c_attn", "lm_head"]
    assert len(tech.converted) == 4 * 4 - 1
    assert type(t.raw_model.transformer.h[0].attn.c_attn) is nn.Linear
    for p in tech.params:  # no fp32 master copy: weights and AdamW moments are (1,6,9) numbers
        assert torch.equal(quantize(p.detach(), E6M9), p.detach())
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(quantize(t.optimizer.state[p][k], E6M9), t.optimizer.state[p][k])
    kept = t.raw_model.transformer.h[0].attn.c_attn.weight.detach()
    assert not torch.equal(quantize(kept, E6M9), kept)  # the kept layer is a plain fp32 layer


def test_fp32_everything_matches_the_plain_model(tiny_cfg):
    """With 23-bit formats the emulated model computes the plain model's step up to float32 round-off."""
    fp32 = {"lowp.operand": "fp32", "lowp.acc": "fp32", "lowp.weights": "fp32", "lowp.loss_scale": 1.0,
            "lowp.keep_first_last": False}
    a = Trainer(tiny_cfg(**{"train.steps": 1}))
    b = Trainer(tiny_cfg(**LOWP, **fp32, **{"train.steps": 1}))
    la, lb = a.train_step(), b.train_step()
    assert abs(la - lb) < 1e-5
    for (n, p), q in zip(a.raw_model.named_parameters(), b.raw_model.parameters()):
        assert torch.allclose(p, q, atol=1e-5), n


def test_round_to_nearest_stalls_updates_that_stochastic_rounding_keeps(tiny_cfg):
    """A tiny learning rate: an AdamW step (about lr = 1e-6) is below half a (1,6,9) quantum of every weight
    above 2^-9 * 2e-6 * 2 ~ 0.001 in magnitude, so round-to-nearest leaves those exactly unchanged, while
    stochastic rounding moves a weight with probability step / quantum."""
    kw = {**LOWP, "train.steps": 2, "optim.lr": 1e-6, "optim.warmup_steps": 0}
    frozen = {}
    for upd in ("nearest", "stochastic"):
        t = Trainer(tiny_cfg(**kw, **{"lowp.update": upd}))
        t.fit()
        frozen[upd] = next(x for x in t.techniques if x.name == "lowp").frozen
    assert frozen["nearest"] > 0.9 and frozen["stochastic"] < frozen["nearest"] - 0.02, frozen


def test_resume_is_bitwise_with_stochastic_rounding(tiny_cfg, tmp_path, monkeypatch):
    kw = {**LOWP, "lowp.acc_rounding": "stochastic", "train.steps": 6, "train.checkpoint_every": 2}
    full, part, rec_full, rec_part = crash_and_resume(tiny_cfg, kw, tmp_path, monkeypatch, crash_after=3)
    assert part == full and rec_part["final"]["val_loss"] == rec_full["final"]["val_loss"]
    assert "lowp_frozen" in full[-1]


def _train_and_gather_weights(data_dir, out, extra):
    """One process of a data-parallel lowp run: train, then save every process's weights (rank 0 writes)."""
    from accelerate.state import AcceleratorState
    t = Trainer(load_config(None, tiny_overrides(data_dir, **extra)), out)
    t.fit()
    flat = torch.cat([p.detach().flatten() for p in t.raw_model.parameters()])
    gathered = t.accelerator.gather(flat[None])           # (world, n)
    if t.is_main:
        torch.save(gathered, out / "replicas.pt")
    AcceleratorState._reset_state(reset_partial_state=True)


def test_two_processes_keep_identical_replicas(tiny_data_dir, tmp_path):
    """Data parallel: every process rounds its replica (weights, accumulator) with the same draws, so the
    replicas stay bitwise identical, and the run equals one process with two micro-batches up to the
    order of the gradient sum."""
    extra = {**LOWP, "train.steps": 3, "lowp.acc_rounding": "stochastic"}
    launch_processes(_train_and_gather_weights, (tiny_data_dir, tmp_path / "mp", extra), 2, timeout_s=240,
                     start_method="spawn")
    replicas = torch.load(tmp_path / "mp" / "replicas.pt")
    assert replicas.shape[0] == 2 and torch.equal(replicas[0], replicas[1])
    train_run(tiny_data_dir, tmp_path / "ref", {**extra, "train.grad_accum": 2})
    mp, ref = read_metrics(tmp_path / "mp"), read_metrics(tmp_path / "ref")
    assert [r["step"] for r in mp] == [1, 2, 3]
    for a, b in zip(mp, ref):
        assert abs(a["train_loss"] - b["train_loss"]) < 0.02
    assert abs(mp[-1]["val_loss"] - ref[-1]["val_loss"]) < 0.02


@pytest.mark.parametrize("kw, match", [
    ({"lowp.loss_scale": 1000.0}, "not a power of two"),
    ({"lowp.operand": "e9m2"}, "lowp.operand"),
    ({"lowp.acc": "fp12"}, "lowp.acc: unknown number format"),
])
def test_bad_settings_are_refused_in_one_line(tiny_cfg, kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        Trainer(tiny_cfg(**LOWP, **kw))
    assert "\n" not in str(e.value)


def test_torchao_backend_is_refused_without_cuda_or_torchao(tiny_data_dir, monkeypatch):
    import importlib.util
    cfg = load_config(None, tiny_overrides(tiny_data_dir, **LOWP, **{"lowp.backend": "torchao"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU.*use lowp.backend=emulate") as e:
        Trainer(cfg)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "torchao" else real(n, *a))
    with pytest.raises(ConfigError, match="needs the torchao package: pip install torchao"):
        Trainer(cfg)
