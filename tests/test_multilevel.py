"""Multi-level training (Zou et al., ICLR 2024): the exact properties of the operators, the V-cycle
driver's FLOPs ledger, a 2-process gloo V-cycle and resume across a stage boundary."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from accellib.core.launch import launch_processes

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.models.transformer import ModelConfig, Transformer
from accellib.core.records import read_metrics
from accellib.techniques import multilevel as ml
from accellib.drivers.vcycle import baseline_flops, plan_stages, run_vcycle, stage_flops
from accellib.core.trainer import Trainer
from conftest import tiny_overrides
from accellib.core.records import TIMING_FIELDS

CFG = ModelConfig(vocab_size=40, seq_len=12, n_layer=4, n_head=4, d_model=32, tie_head=False)


def generic_state(cfg=CFG, seed=0, dtype=torch.float32):
    """A random model whose LayerNorms and biases are not at their init values either."""
    torch.manual_seed(seed)
    m = Transformer(cfg).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.state_dict()


def model_from(sd, cfg, dtype=torch.float32):
    m = Transformer(cfg).to(dtype)
    m.load_state_dict(sd, strict=True)
    return m.eval()


def vcycle_overrides(data_dir, **kw):
    base = {"model.tie_head": False, "train.steps": 8, "train.eval_every": 2, "multilevel.enabled": True,
            "multilevel.warm_frac": 0.125, "multilevel.small_frac": 0.5, "multilevel.final_frac": 0.5,
            "multilevel.small_lr_mult": 2.0, "multilevel.rewarm_steps": 1, "multilevel.alpha": 0.5}
    base.update(kw)
    return tiny_overrides(data_dir, **base)


# ----------------------------------------------------------------------------- operators
@pytest.mark.parametrize("pairing", ["half", "adjacent"])
@pytest.mark.parametrize("factor", [2, 3])
def test_copy_and_averaging_matrices(pairing, factor):
    A, P = ml.copy_averaging(6, factor, pairing, chunk=4)
    assert A.shape == (24 // factor, 24) and P.shape == (24, 24 // factor)
    assert torch.equal(A @ P, torch.eye(24 // factor))                      # A P = I
    assert torch.allclose(A.sum(1), torch.ones(24 // factor))               # rows of A average
    assert torch.equal((P != 0).sum(1), torch.ones(24, dtype=torch.long))  # each large unit copies one
    assert set(P.unique().tolist()) == {0.0, 1.0}
    R, G = ml.depth_matrices(6, factor, pairing)
    assert torch.allclose(R @ G, torch.eye(6 // factor, dtype=torch.float64), atol=1e-15)


def test_pairing_is_head_aligned():
    # 'half' merges head h with head h + H/2: units of head 0 (0..7) pair with those of head 2 (16..23)
    A, _ = ml.copy_averaging(4, 2, "half", chunk=8)
    assert torch.equal(A[0].nonzero().flatten(), torch.tensor([0, 16]))
    A, _ = ml.copy_averaging(4, 2, "adjacent", chunk=8)
    assert torch.equal(A[0].nonzero().flatten(), torch.tensor([0, 8]))


def test_half_pairing_is_the_papers_width_matrix():
    # the paper's F_out = [I/2, I/2]^T averages unit j with unit j + d/2: our default `half` pairing,
    # for the residual width (head chunks) and for the FFN (chunks of mlp_ratio * head_dim) alike
    maps = ml._width_maps(CFG, 2, "half")
    for space, n in (("h", CFG.d_model), ("f", CFG.mlp_ratio * CFG.d_model)):
        A, P = maps[space]
        half = torch.eye(n // 2) / 2
        assert torch.equal(A, torch.cat([half, half], 1)) and torch.equal(P, 2 * torch.cat([half, half], 0))
    A_adj, _ = ml._width_maps(CFG, 2, "adjacent")["h"]
    assert not torch.equal(A_adj, maps["h"][0])             # `adjacent` (head 2h with 2h+1) is another matrix


def test_coalesced_config_shapes_and_param_count():
    small_sd, small = ml.coalesce(generic_state(), CFG)
    assert (small.n_layer, small.n_head, small.d_model, small.head_dim) == (2, 2, 16, CFG.head_dim)
    assert (small.vocab_size, small.seq_len, small.mlp_ratio) == (CFG.vocab_size, CFG.seq_len, CFG.mlp_ratio)
    m = model_from(small_sd, small)                              # loads strictly into a plain Transformer
    d, L, V, T, r = small.d_model, small.n_layer, small.vocab_size, small.seq_len, small.mlp_ratio
    per_block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (r * d * d + r * d) + (r * d * d + d)
    assert sum(p.numel() for p in m.parameters()) == V * d + T * d + L * per_block + 2 * d + V * d


@pytest.mark.parametrize("width_pairing,depth_pairing", [("half", "adjacent"), ("adjacent", "half")])
def test_decoalesce_then_coalesce_is_bitwise_identity(width_pairing, depth_pairing):
    m = ml.LevelMap(width_pairing=width_pairing, depth_pairing=depth_pairing)
    small_sd, small = ml.coalesce(generic_state(), CFG, m)
    small_sd = generic_state(small, seed=1)                     # a generic small model
    back, _ = ml.coalesce(ml.decoalesce(small_sd, CFG, m), CFG, m)
    assert all(torch.equal(back[k], small_sd[k]) for k in small_sd)


def test_groups_of_three_roundtrip_close():
    cfg = ModelConfig(vocab_size=30, seq_len=8, n_layer=3, n_head=6, d_model=48, tie_head=False)
    m = ml.LevelMap(factor=3)
    small = ml.coalesced_config(cfg, 3)
    sd = generic_state(small, seed=2)
    back, _ = ml.coalesce(ml.decoalesce(sd, cfg, m), cfg, m)
    assert all(torch.allclose(back[k], sd[k], atol=1e-6) for k in sd)


def test_coalesce_after_decoalesce_is_a_projection():
    sd = generic_state()
    c, _ = ml.coalesce(sd, CFG)
    dc = ml.decoalesce(c, CFG)
    assert not all(torch.equal(dc[k], sd[k]) for k in sd)      # D(C(theta)) != theta
    cdc, _ = ml.coalesce(dc, CFG)
    assert all(torch.equal(cdc[k], c[k]) for k in c)           # C(D(C(theta))) == C(theta)


def test_width_decoalescing_preserves_the_function_depth_does_not():
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len))
    width = ml.LevelMap(depth=False)
    for dtype, atol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        small_sd, small = ml.coalesce(generic_state(dtype=dtype), CFG, width)
        ys = model_from(small_sd, small, dtype)(x)[0]
        yl = model_from(ml.decoalesce(small_sd, CFG, width), CFG, dtype)(x)[0]
        torch.testing.assert_close(yl, ys, rtol=0, atol=atol)
    # depth: duplicated blocks are equal, but a block applied twice is another function
    depth = ml.LevelMap(width=False)
    small_sd, small = ml.coalesce(generic_state(), CFG, depth)
    big = ml.decoalesce(small_sd, CFG, depth)
    assert all(torch.equal(big[f"transformer.h.0.{k}"], big[f"transformer.h.1.{k}"])
               for k in ("attn.c_attn.weight", "mlp.c_fc.bias", "ln_2.weight"))
    gap = (model_from(big, CFG)(x)[0] - model_from(small_sd, small)(x)[0]).abs().max().item()
    assert gap > 1e-2, gap


def test_official_embedding_factors_break_our_pre_ln_gpt(capsys):
    """The official GPT-2 mapper's x0.5 on the embeddings after width de-coalescing (a side effect of
    GPT-2's tied head) starts our pre-LN residual stream at half scale: the logits change by O(1), while
    ours (embeddings copied, untied head halved) keep the small model's function."""
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=torch.Generator().manual_seed(0))
    width = ml.LevelMap(depth=False)
    small_sd, small = ml.coalesce(generic_state(), CFG, width)
    ys = model_from(small_sd, small)(x)[0]
    ours = ml.decoalesce(small_sd, CFG, width)
    official = ml.official_embedding_factor(ours, 0.5)
    err = {name: (model_from(sd, CFG)(x)[0] - ys).abs().max().item() for name, sd in
           (("ours", ours), ("official x0.5", official))}
    with capsys.disabled():
        print(f"\nwidth de-coalescing, max |logit diff| vs the small model (fp32, |logits| <= "
              f"{ys.abs().max().item():.2f}): ours {err['ours']:.1e}, official x0.5 {err['official x0.5']:.3f}")
    assert err["ours"] < 1e-5 and err["official x0.5"] > 0.1
    assert set(k for k in ours if not torch.equal(ours[k], official[k])) == {"transformer.wte.weight",
                                                                              "transformer.wpe.weight"}
    # the official pair of factors round-trips like ours: x2 after coalescing undoes x0.5
    back, _ = ml.coalesce(official, CFG, width)
    back = ml.official_embedding_factor(back, 2.0)
    assert all(torch.equal(back[k], small_sd[k]) for k in small_sd)


def test_width_and_depth_commute():
    sd = generic_state(dtype=torch.float64)
    a = ml.coalesce_depth(ml.coalesce_width(sd, CFG), CFG.n_layer)
    b = ml.coalesce_width(ml.coalesce_depth(sd, CFG.n_layer), CFG)
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-14) for k in a)


def test_interpolation_endpoints_and_linearity():
    saved = generic_state(seed=3)
    small_sd, small = ml.coalesce(generic_state(seed=4), CFG)
    dec = ml.decoalesce(small_sd, CFG)
    at0, at1 = ml.interpolate(saved, dec, 0.0), ml.interpolate(saved, dec, 1.0)
    assert all(torch.equal(at0[k], saved[k]) and torch.equal(at1[k], dec[k]) for k in saved)
    mid = ml.interpolate(saved, dec, 0.25)
    assert all(torch.allclose(mid[k], 0.75 * saved[k] + 0.25 * dec[k]) for k in saved)
    with pytest.raises(ml.MultiLevelError, match="same parameters"):
        ml.interpolate(saved, {k: v for k, v in dec.items() if "ln_f" not in k}, 0.5)


def _paired_gap(sd, cfg):
    """Largest difference between paired (head h, head h + H/2) Q rows and FFN rows of block 0."""
    hd, d, Hs = cfg.head_dim, cfg.d_model, cfg.n_head // 2
    q = sd["transformer.h.0.attn.c_attn.weight"][:d]
    fc = sd["transformer.h.0.mlp.c_fc.weight"]
    half_f = fc.shape[0] // 2
    return max((q[:Hs * hd] - q[Hs * hd:]).abs().max().item(), (fc[:half_f] - fc[half_f:]).abs().max().item())


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_symmetry_survives_training_only_without_interpolation(alpha):
    saved = generic_state(seed=5)
    small_sd, small = ml.coalesce(generic_state(seed=6), CFG)
    model = model_from(ml.interpolate(saved, ml.decoalesce(small_sd, CFG), alpha), CFG).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randint(0, CFG.vocab_size, (4, CFG.seq_len), generator=g)
        model(x[:, :-1], x[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad()
    gap = _paired_gap(model.state_dict(), CFG)
    if alpha == 1.0:
        assert gap == 0.0          # duplicated units get identical gradients: the model stays small
    else:
        assert gap > 1e-3          # interpolation with the saved model breaks the symmetry


def test_bad_input_is_reported():
    with pytest.raises(ml.MultiLevelError, match="tie_head=false"):
        ml.coalesce(Transformer(ModelConfig(vocab_size=20, n_layer=2, n_head=2, d_model=16)).state_dict(),
                    ModelConfig(vocab_size=20, n_layer=2, n_head=2, d_model=16))
    with pytest.raises(ml.MultiLevelError, match="n_head=3"):
        ml.coalesced_config(ModelConfig(n_head=3, d_model=48, tie_head=False))
    with pytest.raises(ConfigError, match="multilevel.alpha"):
        load_config(None, ["--multilevel.alpha=1.5"])
    with pytest.raises(ConfigError, match="tie_head=false"):
        plan_stages(load_config(None, ["--multilevel.enabled=true", "--model.n_layer=4"]))
    with pytest.raises(ConfigError, match="cannot be combined"):
        from accellib.techniques import REGISTRY
        other = next(n for n in REGISTRY if n != "multilevel")
        plan_stages(load_config(None, ["--multilevel.enabled=true", "--model.tie_head=false",
                                       f"--{other}.enabled=true"]))


# ----------------------------------------------------------------------------- the V-cycle
def test_stage_plan_and_official_example_flops():
    # the official GPT-2 example : 12L/768 at 512 tokens, 5% + 50% small (6L/384) + 50% large
    cfg = load_config(None, ["--multilevel.enabled=true", "--model.tie_head=false", "--model.n_layer=12",
                             "--model.n_head=12", "--model.d_model=768", "--model.seq_len=512",
                             "--model.vocab_size=50257", "--train.steps=100000", "--optim.warmup_steps=5000",
                             "--multilevel.warm_frac=0.05", "--multilevel.small_frac=0.5",
                             "--multilevel.final_frac=0.5", "--multilevel.levels=2"])
    stages = plan_stages(cfg)
    assert [(s.kind, s.level, s.steps, s.model.n_layer, s.model.d_model) for s in stages] == [
        ("down", 0, 5000, 12, 768), ("bottom", 1, 50000, 6, 384), ("up", 0, 50000, 12, 768)]
    ratio = sum(stage_flops(cfg, stages)) / baseline_flops(cfg)
    assert ratio == pytest.approx(0.67, abs=0.01)              # the official example: 0.671 of the baseline
    cfg3 = load_config(None, ["--multilevel.enabled=true", "--model.tie_head=false", "--multilevel.levels=3",
                              "--model.n_layer=8", "--model.n_head=4", "--model.d_model=64"])
    assert [(s.kind, s.level) for s in plan_stages(cfg3)] == [
        ("down", 0), ("down", 1), ("bottom", 2), ("up", 1), ("up", 0)]


def test_vcycle_flops_ledger_and_transitions(tiny_data_dir, tmp_path):
    cfg = load_config(None, vcycle_overrides(tiny_data_dir))
    final = run_vcycle(cfg, tmp_path / "run")
    stages = plan_stages(cfg)
    per_stage = stage_flops(cfg, stages)
    recs = read_metrics(tmp_path / "run")
    for s, cum in zip(stages, torch.tensor(per_stage).cumsum(0).tolist()):
        last = [r for r in recs if r["stage"] == s.index and not r.get("transition")][-1]
        assert last["flops"] == pytest.approx(cum, rel=1e-12)   # cumulative FLOPs at each stage end
        assert last["step"] == sum(x.steps for x in stages[: s.index + 1])
    assert final["flops"] == pytest.approx(sum(per_stage)) and final["step"] == 9
    assert sum(per_stage) < baseline_flops(cfg)
    # the small stage's steps are cheaper; transitions logged with their val loss
    assert [r["stage"] for r in recs if r.get("transition")] == [1, 2]
    rec = json.loads((tmp_path / "run" / "record.json").read_text())
    assert rec["stage_flops"] == pytest.approx(per_stage)
    with pytest.raises(ConfigError, match="already holds"):
        run_vcycle(cfg, tmp_path / "run")


def _metrics_wo_time(run):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(run)]


@pytest.mark.parametrize("crash_call", [3, 5, 6])  # stage 1 before its first checkpoint, stage 1 after it, stage 2 step 0
def test_resume_across_stage_boundary_is_exact(tiny_data_dir, tmp_path, monkeypatch, crash_call):
    kw = {"train.checkpoint_every": 2}
    full = run_vcycle(load_config(None, vcycle_overrides(tiny_data_dir, **kw)), tmp_path / "full")
    orig, calls = Trainer.train_step, [0]

    def crash(self):
        calls[0] += 1
        if calls[0] == crash_call:
            raise KeyboardInterrupt
        return orig(self)
    monkeypatch.setattr(Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        run_vcycle(load_config(None, vcycle_overrides(tiny_data_dir, **kw)), tmp_path / "part")
    monkeypatch.setattr(Trainer, "train_step", orig)
    from accellib.train import main
    assert main(["--resume", str(tmp_path / "part")]) == 0
    assert _metrics_wo_time(tmp_path / "part") == _metrics_wo_time(tmp_path / "full")
    final = json.loads((tmp_path / "part" / "record.json").read_text())["final"]
    assert final["val_loss"] == full["val_loss"] and final["flops"] == full["flops"]


def _vcycle_and_dump(data_dir, out_dir, extra):
    from accelerate.state import AcceleratorState
    from accellib.core.launch import process_state
    cfg = load_config(None, vcycle_overrides(data_dir, **extra))
    ps = process_state()               # cpu=True as make_accelerator does, so gloo is picked up
    world = ps.num_processes
    final = run_vcycle(cfg, Path(out_dir) / f"run{world}")
    sd = torch.load(Path(out_dir) / f"run{world}" / "stage_2" / "final_model.pt", weights_only=True)
    flat = torch.cat([v.flatten() for v in sd.values()])
    Path(out_dir, f"rank{ps.process_index}_of{world}.json").write_text(json.dumps(
        dict(val=final["val_loss"], flops=final["flops"], params=flat.tolist())))
    ps.wait_for_everyone()
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.timeout(240)
def test_two_process_vcycle_matches_one_process(tiny_data_dir, tmp_path):
    launch_processes(_vcycle_and_dump, (tiny_data_dir, tmp_path, {"train.batch_size": 4}), 2, timeout_s=150)
    r0, r1 = (json.loads((tmp_path / f"rank{r}_of2.json").read_text()) for r in (0, 1))
    assert r0["val"] == r1["val"] and r0["flops"] == r1["flops"]
    _vcycle_and_dump(tiny_data_dir, tmp_path, {"train.batch_size": 4, "train.grad_accum": 2})
    one = json.loads((tmp_path / "rank0_of1.json").read_text())
    assert one["flops"] == r0["flops"]                       # same global batch: same FLOPs ledger
    torch.testing.assert_close(torch.tensor(one["params"]), torch.tensor(r0["params"]), rtol=0, atol=1e-5)
    assert abs(one["val"] - r0["val"]) < 1e-4


def test_train_cli_runs_and_resumes_the_vcycle(tiny_data_dir, tmp_path):
    from accellib.core.records import read_record
    from accellib.train import main
    out = tmp_path / "cli"
    assert main(["--out", str(out)] + vcycle_overrides(tiny_data_dir)) == 0
    steps = sum(s["steps"] for s in json.loads((out / "vcycle.json").read_text())["stages"])
    assert read_record(out)["final"]["step"] == steps == 9   # warm 1 + small 4 + final 4
    assert main(["--resume", str(out)]) == 0          # a finished cycle resumes as a no-op
    assert read_record(out)["final"]["step"] == steps


def test_three_level_vcycle_runs_end_to_end(tiny_data_dir, tmp_path):
    """K = 3: two coalescings down (4 layers/4 heads/d32 -> 2/2/16 -> 1/1/8) and two up."""
    cfg = load_config(None, vcycle_overrides(tiny_data_dir, **{"multilevel.levels": 3, "model.n_head": 4,
                                                               "train.steps": 12}))
    with pytest.raises(ConfigError, match="vocab_size is 0"):   # before the data is loaded
        stage_flops(cfg, plan_stages(cfg))
    final = run_vcycle(cfg, tmp_path / "k3")
    stages = plan_stages(cfg)
    assert [s.model.n_layer for s in stages] == [4, 2, 1, 2, 4]
    assert final["step"] == sum(s.steps for s in stages)
    assert final["flops"] == pytest.approx(sum(stage_flops(cfg, stages)))
    sd = torch.load(tmp_path / "k3" / f"stage_{len(stages) - 1}" / "final_model.pt", weights_only=True)
    assert sd["transformer.h.3.mlp.c_fc.weight"].shape == (4 * 32, 32)   # back at full size
    assert 0 < final["val_loss"] < 6


def test_vcycle_builds_one_accelerator_per_process_for_all_its_stages(tiny_data_dir, tmp_path, monkeypatch):
    """Accelerate's model is one Accelerator per process; each stage used to build its own (issue 27)."""
    import accelerate
    made = []
    orig = accelerate.Accelerator.__init__
    monkeypatch.setattr(accelerate.Accelerator, "__init__", lambda self, *a, **k: (made.append(1), orig(self, *a, **k))[1])
    cfg = load_config(None, vcycle_overrides(tiny_data_dir))
    run_vcycle(cfg, tmp_path / "run")
    assert len(plan_stages(cfg)) == 3 and len(made) == 1


# ----------------------------------------------------------------------------- the coalesce hook (notebook 04)
def _accellib_linear(layer, n_head, W, b):
    """accellib's coalesce_width on a state_dict of this one Linear (as notebook 04's check cell)."""
    cfg = ModelConfig(d_model=min(W.shape), n_head=n_head, mlp_ratio=max(W.shape) // min(W.shape), tie_head=False)
    name = f"transformer.h.0.{layer}"
    small = ml.coalesce_width({f"{name}.weight": W, f"{name}.bias": b}, cfg)
    return small[f"{name}.weight"], small[f"{name}.bias"]


@pytest.mark.parametrize("bias", [True, False])
def test_coalesce_linear_hook_with_accellibs_own_function_is_bitwise(bias):
    cfg = ModelConfig(vocab_size=40, seq_len=12, n_layer=4, n_head=4, d_model=32, tie_head=False, bias=bias)
    sd = generic_state(cfg)
    calls = []

    def own(layer, n_head, W, b):
        calls.append(layer)
        return _accellib_linear(layer, n_head, W, b)

    ref, small = ml.coalesce(sd, cfg)
    routed, small2 = ml.coalesce(sd, cfg, ml.LevelMap(coalesce_linear=own))
    assert small2 == small and list(routed) == list(ref)
    assert all(torch.equal(routed[k], ref[k]) for k in ref)
    assert sorted(calls) == sorted(ml.BLOCK_LINEARS * cfg.n_layer)          # every Linear of every block, once
    model_from(routed, small)                                                 # loads strictly


def _small_stage_losses(tiny_data_dir, fn, steps=3):
    """The V-cycle's coalesce step with LevelMap.coalesce_linear = fn, then `steps` steps of its small stage."""
    from accellib.drivers.vcycle import stage_config
    cfg = load_config(None, vcycle_overrides(tiny_data_dir))
    cfg.model.vocab_size = 257
    down, bottom = plan_stages(cfg)[:2]
    torch.manual_seed(cfg.train.seed)
    large_sd = Transformer(down.model).state_dict()
    m = dataclasses.replace(cfg.techniques["multilevel"].level_map(), coalesce_linear=fn)
    sd, small_cfg = ml.coalesce(large_sd, down.model, m)
    small = Transformer(small_cfg)
    small.load_state_dict(sd, strict=True)
    tr = Trainer(stage_config(cfg, bottom), model=small, data_offset=down.steps)
    return [float(tr.train_step()) for _ in range(steps)]


def test_coalesce_linear_hook_in_training_and_a_wrong_function_changes_the_loss(tiny_data_dir):
    ref = _small_stage_losses(tiny_data_dir, None)
    assert _small_stage_losses(tiny_data_dir, _accellib_linear) == ref

    def averages_inputs(layer, n_head, W, b):   # the usual slip: the pair's input weights averaged, not summed
        Ws, bs = _accellib_linear(layer, n_head, W, b)
        return Ws / 2, bs
    wrong = _small_stage_losses(tiny_data_dir, averages_inputs)
    assert max(abs(a - b) for a, b in zip(wrong, ref)) > 1e-4


def test_coalesce_linear_hook_refuses_what_its_signature_cannot_express():
    sd = generic_state()
    for m in (ml.LevelMap(coalesce_linear=_accellib_linear, width_pairing="adjacent"),
              ml.LevelMap(coalesce_linear=_accellib_linear, factor=4)):
        with pytest.raises(ml.MultiLevelError, match="half pairing"):
            ml.coalesce(sd, CFG, m)
    with pytest.raises(ml.MultiLevelError, match="expected"):
        ml.coalesce(sd, CFG, ml.LevelMap(coalesce_linear=lambda layer, n_head, W, b: (W, b)))


def test_notebook_04s_reference_and_solution_keep_the_hooks_contract(tiny_data_dir):
    """The check cell's reference (`coalesce_width`, what the notebook routes while the exercise is empty) gives
    bitwise the losses of coalesce_linear = None; the solution's answer stays within the notebook's 1e-5."""
    from test_exercises import solved
    ns = solved("04_multilevel_vcycle.ipynb")
    ref = _small_stage_losses(tiny_data_dir, None)
    assert _small_stage_losses(tiny_data_dir, ns["coalesce_width"]) == ref
    yours = _small_stage_losses(tiny_data_dir, ns["my_coalesce_linear"])
    assert max(abs(a - b) for a, b in zip(yours, ref)) <= 1e-5
