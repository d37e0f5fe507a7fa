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


# ------------------------------------------------------------------------------ backend=torchao: the FP8 table decides
from accellib.techniques.low_precision import LowPrecision, fp8_plan, read_table  # noqa: E402

GPT2 = [(f"h.{i}.{n}", k, o) for i in range(12) for n, k, o in
        (("attn.c_attn", 768, 2304), ("attn.c_proj", 768, 768), ("mlp.c_fc", 768, 3072), ("mlp.c_proj", 3072, 768))]
GPT2 += [("lm_head", 768, 50304)]


def _rows(speedups: dict, m=16384, recipe="tensorwise"):
    """A synthetic table: {(K, N): speed-up} at one M."""
    return [dict(name=f"{k}x{n}", shape=[m, k, n], bf16_ms=1.0, fp8_ms={recipe: 1.0 / s}, speedup={recipe: s})
            for (k, n), s in speedups.items()]


def test_fp8_plan_converts_nothing_where_no_shape_gains():
    rows = _rows({(768, 2304): 0.81, (768, 768): 0.55, (768, 3072): 0.84, (3072, 768): 0.83, (768, 50304): 0.97})
    plan = fp8_plan(rows, GPT2, 16384, "tensorwise")
    assert plan.convert == [] and len(plan.reasons) == len(GPT2)
    assert "\n" not in plan.line and "none converts" in plan.line
    assert "(16384, 768, 2304) 0.81x (12 Linears)" in plan.line and "(16384, 768, 50304) 0.97x (1 Linear)" in plan.line
    assert plan.reasons["lm_head"] == "(16384, 768, 50304): tensorwise 0.97x < 1"


def test_fp8_plan_converts_only_the_shapes_that_gain_the_head_included():
    rows = _rows({(768, 2304): 0.9, (768, 768): 0.6, (768, 3072): 1.02, (3072, 768): 1.05, (768, 50304): 1.3})
    plan = fp8_plan(rows, GPT2, 16384, "tensorwise")
    assert set(plan.convert) == {n for n, _, _ in GPT2 if n.endswith("mlp.c_fc") or n.endswith("mlp.c_proj")} | {"lm_head"}
    assert plan.convert[-1] == "lm_head" and "25/49 Linears" in plan.line
    assert fp8_plan(rows, GPT2, 16384, "tensorwise", min_speedup=1.1).convert == ["lm_head"]
    # the other recipe was not measured in this table: nothing converts with it, and each Linear says why
    other = fp8_plan(rows, GPT2, 16384, "rowwise")
    assert other.convert == [] and other.reasons["lm_head"] == "(16384, 768, 50304): rowwise not measured"


def test_fp8_plan_reads_the_row_of_the_nearest_m_and_the_same_k_n():
    rows = _rows({(768, 3072): 0.8}, m=4096) + _rows({(768, 3072): 1.2}, m=65536)
    lin = [("fc", 768, 3072), ("odd", 768, 1000), ("other", 1024, 1024)]
    assert fp8_plan(rows, lin, 8192, "tensorwise").convert == []        # 8192 is nearer 4096 than 65536 (ratio)
    plan = fp8_plan(rows, lin, 32768, "tensorwise")
    assert plan.convert == ["fc"] and plan.reasons["fc"].startswith("(65536, 768, 3072)")
    assert "multiples of 16" in plan.reasons["odd"] and "not in the table" in plan.reasons["other"]


def test_fp8_plan_without_a_table_converts_nothing_and_says_how_to_make_one():
    plan = fp8_plan(None, GPT2, 16384, "tensorwise", source="results/fp8_table_h200.json")
    assert plan.convert == [] and "\n" not in plan.line
    assert "results/fp8_table_h200.json" in plan.line and "python benchmarks/fp8_table.py" in plan.line
    assert "never slower than bf16 by default" in plan.line


@pytest.mark.parametrize("text, what", [
    ("{not json", "not JSON"),
    ('{"gpu": "x"}', "no list of measured rows under 'rows'"),
    ('{"rows": [{"shape": [16, 32], "speedup": {}}]}', "row 0: 'shape' is not [M, K, N]"),
    ('{"rows": [{"shape": [16, 32, 48], "speedup": 1.2}]}', "row 0: 'speedup' is not a mapping"),
    ('{"rows": [{"shape": [16, 32, 48], "speedup": {"tensorwise": "fast"}}]}', "speedup['tensorwise'] = 'fast'"),
])
def test_a_malformed_table_is_refused_in_one_line_naming_the_file(tmp_path, text, what):
    path = tmp_path / "fp8_table_x.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_table(path)
    assert str(path) in str(e.value) and what in str(e.value) and "\n" not in str(e.value)


def _tiny_model():
    m = nn.Module()
    m.up, m.down, m.lm_head = nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 128, bias=False)
    return m


def _setup_torchao(tiny_cfg, monkeypatch, table=None, **kw):
    """LowPrecision's torchao setup on a CPU, torchao.float8 replaced by a stand-in that records what it converts."""
    import sys
    import types
    from types import SimpleNamespace
    done = {}
    fake = types.ModuleType("torchao.float8")
    fake.Float8LinearConfig = SimpleNamespace(from_recipe_name=lambda r: ("config", r))
    fake.convert_to_float8_training = lambda model, config, module_filter_fn: done.update(
        config=config, names=[n for n, x in model.named_modules() if isinstance(x, nn.Linear) and module_filter_fn(x, n)])
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    cfg = tiny_cfg(**LOWP, **{"train.batch_size": 4, "model.seq_len": 16}, **kw,
                   **({"lowp.fp8_table": str(table)} if table else {}))
    tech = LowPrecision(cfg.techniques["lowp"], cfg)
    tech.cfg.backend = "torchao"   # past the constructor's CUDA refusal: only the selection and the record run here
    printed = []
    trainer = SimpleNamespace(raw_model=_tiny_model(), accelerator=SimpleNamespace(
        device=torch.device("cpu"), print=lambda s, **_: printed.append(s)))
    tech.setup(trainer)
    return tech, done, printed


def test_torchao_setup_converts_what_the_table_says_and_records_it(tiny_cfg, tmp_path, monkeypatch):
    import json
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"rows": _rows({(32, 64): 0.7, (64, 32): 0.9, (32, 128): 1.1}, m=64, recipe="rowwise")}))
    tech, done, printed = _setup_torchao(tiny_cfg, monkeypatch, table, **{"lowp.fp8_recipe": "rowwise"})
    assert done == {"config": ("config", "rowwise"), "names": ["lm_head"]}
    m = tech.metrics(None)
    assert m["fp8_layers"] == "1/3" and m["fp8_recipe"] == "rowwise" and m["fp8_reason"] == printed[0]
    assert tech.converted == ["lm_head"] and tech.kept == ["up", "down"]


def test_torchao_setup_without_a_table_for_this_gpu_converts_nothing(tiny_cfg, monkeypatch):
    tech, done, printed = _setup_torchao(tiny_cfg, monkeypatch)
    assert done == {} and tech.metrics(None)["fp8_layers"] == "0/3"
    assert len(printed) == 1 and "fp8_table_cpu.json" in printed[0] and "python benchmarks/fp8_table.py" in printed[0]


def test_a_named_fp8_table_must_exist(tiny_cfg, tmp_path):
    with pytest.raises(ConfigError, match="lowp.fp8_table=.*: no such file .*python benchmarks/fp8_table.py") as e:
        Trainer(tiny_cfg(**LOWP, **{"lowp.fp8_table": str(tmp_path / "none.json")}))
    assert "\n" not in str(e.value)
