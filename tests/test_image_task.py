"""The image task in the one trainer loop (issue 13): the standardization loss as a technique, resume,
2 processes, FLOPs, which techniques apply to which model kind, compare and the CLI on a vision config."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.data.tokens import DataError
from accellib.models.transformer import ModelConfig, Plan, PreAct, Transformer
from accellib.models.standardization import standardization_loss
from accellib.core.tasks import make_task
from accellib.techniques import REGISTRY
from accellib.core.trainer import Trainer
from conftest import crash_and_resume, image_overrides, tiny_overrides
from accellib.core.records import TIMING_FIELDS

ROOT = Path(__file__).resolve().parents[1]
SL = {"standardization_loss.enabled": "true"}


def image_cfg(data_dir, **kw):
    return load_config(None, image_overrides(data_dir, **kw))


def test_sl_adds_w_times_the_layers_losses_in_training_only(digits_dir):
    tr = Trainer(image_cfg(digits_dir, **SL, **{"standardization_loss.weight": 0.5}))
    model = tr.raw_model
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(o.detach())) for m in model.modules()
             if isinstance(m, PreAct)]
    x, y = tr.batches(0)[0]
    loss, total = tr.forward_loss(x, y, tr.plan(0, 0))
    assert len(seen) == 3                                     # the CNN's three conv pre-activations
    expected = sum(standardization_loss(o, channel_dim=1) for o in seen)  # (B, C, H, W): channels at dim 1
    torch.testing.assert_close(total - loss, 0.5 * expected)
    assert float(expected) > 0
    for h in hooks:
        h.remove()
    sl = next(t for t in tr.techniques if t.name == "standardization_loss")
    assert sl.terms == []                                     # consumed by extra_loss
    with torch.no_grad():                                     # no gradients: nothing recorded
        tr.model(x)
    model.eval()
    model(x)                                                  # eval mode: nothing recorded
    assert sl.terms == []


def test_sl_leaves_evaluation_unchanged(digits_dir):
    # a network trained with SL, evaluated with its hooks in place and as a plain network: the same numbers
    with_sl = Trainer(image_cfg(digits_dir, **SL))
    for _ in range(3):
        with_sl.train_step()
    plain = Trainer(image_cfg(digits_dir))
    plain.raw_model.load_state_dict(with_sl.raw_model.state_dict())
    sl = next(t for t in with_sl.techniques if t.name == "standardization_loss")
    sl.terms = []                                             # cleared: what the hooks record during evaluation
    assert plain.evaluate() == with_sl.evaluate() and sl.terms == []


def test_sl_loss_fn_routes_every_layer_through_another_function(digits_dir):
    # notebook 08 trains through its student's L_std: a replacement is called for every layer, and an equal one
    # trains to the same losses
    runs = {}
    for name in ("accellib", "replaced"):
        tr = Trainer(image_cfg(digits_dir, **SL))
        sl = next(t for t in tr.techniques if t.name == "standardization_loss")
        calls = []
        if name == "replaced":
            sl.loss_fn = lambda x, channel_dim=-1, eps=1e-5: calls.append(x.shape) or standardization_loss(x, channel_dim, eps)
        runs[name] = [float(tr.train_step()) for _ in range(3)]
        if name == "replaced":
            assert len(calls) == 3 * 3                        # 3 layers x 3 steps
    assert runs["accellib"] == runs["replaced"]


def test_a_stray_training_forward_does_not_leak_into_the_next_step(digits_dir):
    # a student's training-mode forward between steps (e.g. to look at the logits) records L_std terms;
    # the next step must not add them to its loss
    a, b = Trainer(image_cfg(digits_dir, **SL)), Trainer(image_cfg(digits_dir, **SL))
    x, _ = a.batches(0)[0]
    a.raw_model(x)
    assert a.train_step() == b.train_step()
    assert all(torch.equal(p, q) for p, q in zip(a.raw_model.parameters(), b.raw_model.parameters()))


def test_sl_on_the_transformer_hooks_the_mlp_pre_activation(tiny_cfg):
    cfg = tiny_cfg(**{"model.norm": "none", "standardization_loss.enabled": "true"})
    tr = Trainer(cfg)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in tr.raw_model.modules())   # norm=none removes all
    sl = next(t for t in tr.techniques if t.name == "standardization_loss")
    assert len(sl.handles) == cfg.model.n_layer               # one PreAct per block, before GELU
    x, y = tr.batches(0)[0]
    loss, total = tr.forward_loss(x, y, tr.plan(0, 0))
    assert float(total.detach()) > float(loss.detach())
    start = tr.evaluate()["val_loss"]
    assert tr.fit()["val_loss"] < start - 0.05                # it trains without any LayerNorm (6 steps)


def test_sl_layers_out_of_range_is_one_line(digits_dir):
    with pytest.raises(ConfigError, match=r"has 3 pre-activation\(s\)") as e:
        Trainer(image_cfg(digits_dir, **SL, **{"standardization_loss.layers": "[0, 5]"}))
    assert "\n" not in str(e.value)


def test_vision_resume_is_bitwise(digits_dir, tmp_path, monkeypatch):
    factory = lambda **kw: image_cfg(digits_dir, **SL, **{"train.steps": 8, "train.checkpoint_every": 2}, **kw)
    full, part, rf, rp = crash_and_resume(factory, {}, tmp_path, monkeypatch, crash_after=5)
    assert full == part
    assert rf["final"]["val_acc"] == rp["final"]["val_acc"] and rf["final"]["val_loss"] == rp["final"]["val_loss"]
    assert {"train_acc", "val_acc", "std_loss"} <= set(full[-1])


def _dump(data_dir, out_dir, extra):
    from accelerate.state import AcceleratorState
    tr = Trainer(image_cfg(data_dir, **extra))
    losses = [float(tr.train_step()) for _ in range(3)]
    ev = tr.evaluate()
    flat = torch.cat([p.detach().flatten() for p in tr.raw_model.parameters()])
    rank, world = tr.accelerator.process_index, tr.accelerator.num_processes
    Path(out_dir, f"rank{rank}_of{world}.json").write_text(json.dumps(dict(losses=losses, ev=ev, params=flat.tolist())))
    tr.accelerator.wait_for_everyone()
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.timeout(180)
def test_two_processes_equal_one_process_with_grad_accum_2(digits_dir, tmp_path):
    from accellib.core.launch import launch_processes
    kw = dict(SL, **{"train.batch_size": 8})                  # SL's moments are per process = per micro-batch
    launch_processes(_dump, (digits_dir, tmp_path, kw), 2, timeout_s=150)
    r0, r1 = (json.loads((tmp_path / f"rank{r}_of2.json").read_text()) for r in (0, 1))
    assert r0 == r1                                           # replicas and reduced metrics agree exactly
    _dump(digits_dir, tmp_path, dict(kw, **{"train.grad_accum": 2}))
    one = json.loads((tmp_path / "rank0_of1.json").read_text())
    torch.testing.assert_close(torch.tensor(one["losses"]), torch.tensor(r0["losses"]), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(one["params"]), torch.tensor(r0["params"]), rtol=0, atol=1e-5)
    assert abs(one["ev"]["val_acc"] - r0["ev"]["val_acc"]) <= 1 / 359  # at most one image flips


def test_vit_flops_follow_the_plan(digits_dir):
    from accellib.models.vision import forward_flops
    cfg = image_cfg(digits_dir, **{"model.kind": "vit", "model.patch": 2, "model.n_layer": 3,
                                   "model.d_model": 32, "model.n_head": 2})
    task = make_task(cfg)
    task.configure()
    assert cfg.model.seq_len == 17                            # (8 / 2)^2 patches + the class token
    x, _ = task.batch(0, 0)
    full = task.micro_flops(Plan.full(3))
    assert full == 3 * forward_flops(task.build_model(), x)   # analytic count = the hooks' count
    p = Plan.full(3)
    p.blocks[1].run = False
    assert task.micro_flops(p) < full
    assert task.micro_layer_tokens(p) == 2 * 17 * cfg.train.batch_size


ON = {"pipeline": {"pipeline.schedule": "gpipe"}}   # the pipeline is switched on by its schedule
VIT = {"model.kind": "vit", "model.patch": 2, "model.n_layer": 4, "model.d_model": 32, "model.n_head": 2,
       "train.steps": 2, "train.eval_every": 0, "random_ltd.min_len": 8, "sbld.profile_batches": 1}
APPLIES = {"vit": {"pld", "sbld", "random_ltd", "lowp", "standardization_loss", "multilevel"},
           "cnn": {"standardization_loss"},
           "mlp": {"lowp", "standardization_loss"}}


@pytest.mark.parametrize("kind", ["vit", "cnn", "mlp"])
def test_each_technique_runs_on_an_image_model_or_refuses_in_one_line(digits_dir, kind, tmp_path):
    from accellib.train import training_function
    ran = set()
    for name in REGISTRY:
        kw = dict(VIT, **{"model.kind": kind}, **ON.get(name, {f"{name}.enabled": "true"}))
        if kind != "vit":
            kw["optim.name"] = "adamw"
        try:  # the V-cycle trains several models, through the CLI's function; the rest one Trainer
            final = (training_function(image_cfg(digits_dir, **kw), tmp_path / name) if name == "multilevel"
                     else Trainer(image_cfg(digits_dir, **kw)).fit())
        except ConfigError as e:
            assert f"does not apply to model.kind={kind}" in str(e) and "\n" not in str(e), str(e)
            continue
        assert torch.isfinite(torch.tensor(final["val_loss"]))
        ran.add(name)
    assert ran == APPLIES[kind]


def test_vit_runs_pld_and_random_ltd_plans(digits_dir):
    tr = Trainer(image_cfg(digits_dir, **dict(VIT, **{"pld.enabled": "true", "random_ltd.enabled": "true",
                                                      "train.steps": 3})))
    plan = tr.plan(0, 0)
    assert plan.blocks[1].keep is not None and plan.blocks[1].keep.shape[1] < 17
    full_flops = make_task(tr.cfg).micro_flops(Plan.full(4))
    tr.fit()
    assert 0 < tr.state.flops < 3 * full_flops                # dropped blocks and tokens cost less


def test_wrong_data_for_the_model_kind_is_one_line(digits_dir, tiny_data_dir):
    with pytest.raises(DataError) as e:
        Trainer(image_cfg(tiny_data_dir))                     # a CNN on token data
    assert "\n" not in str(e.value)
    with pytest.raises(DataError) as e:
        Trainer(load_config(None, tiny_overrides(digits_dir)))  # a GPT on images
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="model.patch=3 does not divide"):
        Trainer(image_cfg(digits_dir, **{"model.kind": "vit", "model.patch": 3}))
    with pytest.raises(ConfigError, match="model.norm=batch is for model.kind=cnn or mlp"):
        load_config(None, ["--model.norm=batch"])


def test_transformer_norm_default_keeps_the_parameter_names():
    a, b = Transformer(ModelConfig()), Transformer(ModelConfig(norm="none"))
    assert {k for k in a.state_dict() if "ln_" in k}          # LayerNorm gains and biases
    assert set(b.state_dict()) == {k for k in a.state_dict() if "ln_" not in k}


def _cli(args, cwd):
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PATH": os.defpath}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.timeout(300)
def test_train_and_compare_on_the_digits_configs(digits_dir, tmp_path):
    short = [f"--data.path={digits_dir}", "--train.steps=30", "--train.eval_every=10", "--train.progress=false"]
    p = _cli(["accellib.train", "--config", str(ROOT / "configs/digits_cnn_sl.yaml"), "--out",
              str(tmp_path / "sl"), *short], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "accuracy" in p.stdout
    p = _cli(["accellib.compare", "--config", str(ROOT / "configs/digits_cnn.yaml"), "--out", str(tmp_path / "cmp"),
              "--seeds", "2", *short], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "val acc" in p.stdout and "bits/byte" not in p.stdout
    rows = {r["arm"]: r for r in json.loads((tmp_path / "cmp" / "summary.json").read_text())["rows"]}
    assert set(rows) == {"baseline", "sl", "bn"} and all(len(r["val_accs"]) == 2 for r in rows.values())


def test_multilevel_operators_map_a_vit(digits_dir):
    """Width de-coalescing preserves a ViT's function (as a GPT's), and coalescing undoes it exactly."""
    from accellib.techniques import multilevel as ml
    from accellib.models.vision import ViT
    large = ModelConfig(kind="vit", n_layer=4, n_head=4, d_model=32, patch=2, seq_len=17)
    width = ml.LevelMap(depth=False)
    small_cfg = ml.coalesced_config(large, width=True, depth=False)
    torch.manual_seed(0)
    small = ViT(small_cfg, 1, 8, 10, 2)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(0.1 * torch.randn_like(p))                # LayerNorms, biases, class token off their init
    big_sd = ml.decoalesce(small.state_dict(), large, width)
    big = ViT(large, 1, 8, 10, 2)
    big.load_state_dict(big_sd, strict=True)
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(big.eval()(x), small.eval()(x), rtol=0, atol=1e-5)
    back, cfg = ml.coalesce(big_sd, large, width)
    assert cfg == small_cfg and all(torch.allclose(back[k], v, atol=1e-7) for k, v in small.state_dict().items())


@pytest.mark.timeout(300)
def test_vcycle_trains_a_vit(digits_dir, tmp_path):
    from accellib.drivers.vcycle import plan_stages, stage_flops
    from accellib.train import training_function
    cfg = image_cfg(digits_dir, **dict(VIT, **{"model.n_head": 4, "optim.name": "adamw",
                                               "train.steps": 8, "train.eval_every": 4, "multilevel.enabled": "true",
                                               "multilevel.rewarm_steps": 1}))
    final = training_function(cfg, tmp_path / "v")
    assert 0.0 <= final["val_acc"] <= 1.0
    assert final["flops"] == pytest.approx(sum(stage_flops(cfg, plan_stages(cfg))))
    assert [d for d in (tmp_path / "v").iterdir() if d.name.startswith("stage_")]


@pytest.mark.timeout(300)
def test_kill9_mid_run_then_resume_matches_the_uninterrupted_run(digits_dir, tmp_path):
    from accellib.core.records import read_metrics
    from accellib.train import main
    from conftest import kill9_after
    kw = dict(SL, **{"train.steps": 400, "train.checkpoint_every": 10, "train.eval_every": 100})
    assert main(["--out", str(tmp_path / "full"), *image_overrides(digits_dir, **kw)]) == 0
    run = tmp_path / "part"
    kill9_after(["--out", str(run), *image_overrides(digits_dir, **kw)], run, 30, tmp_path)
    assert len(read_metrics(run)) < 400                       # killed before the end
    assert main(["--resume", str(run)]) == 0
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]
    assert strip(read_metrics(run)) == strip(read_metrics(tmp_path / "full"))


def test_pld_expected_flops_count_the_vit_outside_its_blocks(digits_dir):
    tr = Trainer(image_cfg(digits_dir, **dict(VIT, **{"pld.enabled": "true", "pld.theta_bar": 1.0, "pld.gamma": 0.0})))
    tr.fit()
    pld = next(t for t in tr.techniques if t.name == "pld")
    assert pld.metrics(tr.state)["expected_flops"] == tr.state.flops   # nothing dropped: expected = counted


def test_counting_flops_reads_only_the_meta(digits_dir, tmp_path):
    # compare's FLOPs budget counts plans many times over (a binary search on steps) and the V-cycle counts
    # every stage: that must not open or hash the images each time
    import shutil
    folder = tmp_path / "meta_only"
    folder.mkdir()
    shutil.copy(digits_dir / "meta.json", folder / "meta.json")
    cfg = image_cfg(folder, **{"model.kind": "vit", "model.patch": 2, "model.n_layer": 2, "model.seq_len": 17})
    full = make_task(load_config(None, image_overrides(digits_dir, **{"model.kind": "vit", "model.patch": 2,
                                                                       "model.n_layer": 2, "model.seq_len": 17})))
    assert make_task(cfg).micro_flops(Plan.full(2)) == full.micro_flops(Plan.full(2)) > 0
    with pytest.raises(DataError, match="is missing"):
        make_task(cfg).data                                     # training still opens (and checks) everything
