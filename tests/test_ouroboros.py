"""Ouroboros (accellib/parallel/ouroboros.py): the exact properties of delayed-gradient model parallelism,
real gloo processes against the single-process reference, and exact resume of the stale gradients."""
import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.core.launch import launch_processes
from accellib.parallel.ouroboros import default_split, delays, placement
from accellib.core.records import read_metrics
from accellib.core.trainer import Trainer
from conftest import crash_and_resume, kill9_after, tiny_overrides, train_run as _train
from accellib.core.records import TIMING_FIELDS

ROOT = Path(__file__).resolve().parents[1]
STRIP = TIMING_FIELDS


def _trainer(data_dir, **kw):
    return Trainer(load_config(None, tiny_overrides(data_dir, **kw)))


def _steps(tr, n):
    return [tr.train_step() for _ in range(n)]


def _state(tr):
    return {k: v.clone() for k, v in tr.raw_model.state_dict().items()}


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("tied,accum", [(True, 1), (False, 2)])
@pytest.mark.parametrize("clip", [0, 0.05], ids=["no_clip", "clip_active"])
def test_backward_locked_is_bitwise_standard_training(tiny_data_dir, k, tied, accum, clip):
    # all delays 0: the module-by-module backward is plain backprop, with AdamW, the clip off or scaling
    # every step (the engine computes the global norm as the trainer does: the same bits)
    kw = {"model.tie_head": tied, "train.grad_accum": accum, "optim.grad_clip": clip}
    base = _trainer(tiny_data_dir, **kw)
    ouro = _trainer(tiny_data_dir, **kw, **{"ouroboros.enabled": True, "ouroboros.modules": k,
                                           "ouroboros.delayed": False})
    assert _steps(base, 4) == _steps(ouro, 4)
    a, b = _state(base), _state(ouro)
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("clip", [0, 0.05], ids=["no_clip", "clip_active"])
def test_one_module_is_backprop_even_when_delayed(tiny_data_dir, clip):
    # bitwise with the clip active too: the engine and the trainer compute the global norm the same way
    # (per-parameter sums of squares in float64, in the model's parameter order, one sqrt)
    base = _trainer(tiny_data_dir, **{"optim.grad_clip": clip})
    ouro = _trainer(tiny_data_dir, **{"ouroboros.enabled": True, "ouroboros.modules": 1, "optim.grad_clip": clip})
    assert delays(1) == [0]
    for _ in range(3):
        assert torch.equal(base.train_step(), ouro.train_step())
        assert torch.equal(base.last_grad_norm, ouro.last_grad_norm)
        assert not clip or base.last_grad_norm > clip          # the clip scaled every step's gradients
    a, b = _state(base), _state(ouro)
    assert all(torch.equal(a[n], b[n]) for n in a)


def _driven(tiny_data_dir, k, steps, lr, **kw):
    """Drive the engine by hand (the trainer's step without its zero_grad), recording every module's
    gradients per iteration and the batches."""
    tr = _trainer(tiny_data_dir, **{"ouroboros.enabled": True, "ouroboros.modules": k, "optim.lr": lr,
                                   "optim.grad_clip": 0, "optim.warmup_steps": 0, **kw})
    eng, grads, batches, before = tr.engine, [], [], []
    for t in range(steps):
        b = tr.batches(t)
        batches.append(b)
        before.append(_state(tr))
        eng.forward_backward(b)
        grads.append({n: (None if p.grad is None else p.grad.clone()) for n, p in tr.raw_model.named_parameters()})
        for g in tr.optimizer.param_groups:
            g["lr"] = lr
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
    return tr, grads, batches, before


def _true_grads(model, batch, untie=False):
    """Gradients of the plain model on one batch; with untie, the tied V's two sides separately."""
    m = copy.deepcopy(model)
    if untie:
        m.lm_head.weight = torch.nn.Parameter(m.transformer.wte.weight.detach().clone())
    m.zero_grad(set_to_none=True)
    for x, y in batch:
        _, loss = m(x, y)
        (loss / len(batch)).backward()
    return {n: p.grad for n, p in m.named_parameters()}, m


def test_with_lr_zero_module_k_gets_the_gradient_of_batch_t_minus_dk(tiny_data_dir):
    K, T = 3, 5
    tr, grads, batches, _ = _driven(tiny_data_dir, K, T, lr=0.0, **{"model.n_layer": 3, "train.grad_accum": 2})
    d = delays(K)
    names = dict(tr.raw_model.named_parameters())
    module_of = {}
    for i, s in enumerate(tr.engine.stages):
        for p in s.parameters():
            module_of.setdefault(id(p), i)
    true = [_true_grads(tr.raw_model, b)[0] for b in batches]
    checked = 0
    for t in range(T):
        for n, p in names.items():
            i = module_of[id(p)]
            if n == "transformer.wte.weight":
                continue   # the tied V sums two delays: next test
            if t < d[i]:
                assert grads[t][n] is None, (t, n)
            else:
                assert torch.equal(grads[t][n], true[t - d[i]][n]), (t, n)
                checked += 1
    assert checked > 20


def test_tied_gradient_is_output_side_at_t_plus_input_side_at_t_minus_k_plus_1(tiny_data_dir):
    K, T = 3, 4
    tr, grads, batches, _ = _driven(tiny_data_dir, K, T, lr=0.0, **{"model.n_layer": 3})
    assert tr.raw_model.cfg.tie_head
    for t in range(T):
        out_side = _true_grads(tr.raw_model, batches[t], untie=True)[0]["lm_head.weight"]
        want = out_side
        if t >= K - 1:
            want = out_side + _true_grads(tr.raw_model, batches[t - (K - 1)], untie=True)[0]["transformer.wte.weight"]
        assert torch.equal(grads[t]["transformer.wte.weight"], want), t


def test_no_update_before_step_dk(tiny_data_dir):
    K = 4
    tr, _, _, before = _driven(tiny_data_dir, K, 5, lr=1e-2, **{"model.n_layer": 4, "model.tie_head": False})
    d = delays(K)
    after = before[1:] + [_state(tr)]
    for i, s in enumerate(tr.engine.stages):
        names = [n for n, p in tr.raw_model.named_parameters() if any(p is q for q in s.parameters())]
        for t in range(5):
            same = all(torch.equal(before[t][n], after[t][n]) for n in names)
            assert same == (t < d[i]), (i, t)


def test_split_and_placement():
    assert default_split(6, 3) == [1, 3, 2] and default_split(6, 4) == [1, 2, 2, 1]
    assert default_split(6, 2) == [3, 3] and default_split(6, 1) == [6]
    assert placement(4, 3) == [0, 1, 2, 0] and placement(5, 1) == [0] * 5
    assert delays(4) == [3, 2, 1, 0] and delays(4, delayed=False) == [0, 0, 0, 0]
    with pytest.raises(ConfigError, match="nproc_per_node 2"):
        placement(3, 4)


def test_bad_configs_are_one_line(tiny_data_dir):
    with pytest.raises(ConfigError, match="sums to 5 but model.n_layer=4"):
        _trainer(tiny_data_dir, **{"ouroboros.enabled": True, "ouroboros.split": "[2,2,1]"})
    with pytest.raises(ConfigError, match="split has 2 entries but modules=3"):
        _trainer(tiny_data_dir, **{"ouroboros.enabled": True, "ouroboros.split": "[2,2]"})
    with pytest.raises(ConfigError, match="cannot be combined with pld"):
        _trainer(tiny_data_dir, **{"ouroboros.enabled": True, "pld.enabled": True})


def _same_run(a: Path, b: Path):
    strip = lambda rs: [{k: v for k, v in r.items() if k not in STRIP} for r in rs]
    assert strip(read_metrics(a)) == strip(read_metrics(b))
    sa, sb = (torch.load(d / "checkpoints" / "last" / "pytorch_model.bin") for d in (a, b))
    assert all(torch.equal(sa[n], sb[n]) for n in sa)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", [3, 4])
def test_gloo_processes_equal_the_single_process_reference(tiny_data_dir, tmp_path, k):
    # K modules on K-1 real processes (2 and 3), the clip active: metrics and weights bitwise the reference's
    extra = {"ouroboros.enabled": True, "ouroboros.modules": k, "train.steps": 5, "train.checkpoint_every": 2,
             "train.grad_accum": 2}
    _train(tiny_data_dir, tmp_path / "ref", extra)
    launch_processes(_train, (tiny_data_dir, tmp_path / "mp", extra), k - 1, timeout_s=240, start_method="spawn")
    _same_run(tmp_path / "ref", tmp_path / "mp")
    assert len(list((tmp_path / "mp" / "checkpoints" / "last").glob("engine_rank*.pt"))) == k - 1
    if k == 3:  # crash after step 3 (checkpoint at step 2 holds batches in flight on both processes), resume
        with pytest.raises(Exception, match="crash"):
            launch_processes(_train, (tiny_data_dir, tmp_path / "part", extra, 3), 2, timeout_s=240,
                             start_method="spawn")
        launch_processes(_train, (tiny_data_dir, tmp_path / "part", extra, None, True), 2, timeout_s=240,
                         start_method="spawn")
        _same_run(tmp_path / "ref", tmp_path / "part")


def test_resume_is_bitwise_with_batches_in_flight(tiny_cfg, tmp_path, monkeypatch):
    # the step-3 checkpoint holds module 1's two in-flight batches and module 2's error signal
    kw = {"ouroboros.enabled": True, "ouroboros.modules": 3, "train.steps": 7, "train.checkpoint_every": 3}
    full, part, rec_full, rec_part = crash_and_resume(tiny_cfg, kw, tmp_path, monkeypatch, crash_after=4)
    assert part == full and rec_part["final"]["val_loss"] == rec_full["final"]["val_loss"]


def test_kill9_then_resume_is_bitwise(tiny_data_dir, tmp_path):
    kw = {"ouroboros.enabled": True, "ouroboros.modules": 4, "train.steps": 150, "train.checkpoint_every": 2,
          "train.eval_every": 50}
    _train(tiny_data_dir, tmp_path / "full", kw)
    run = tmp_path / "part"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    killed_at = kill9_after(["--out", str(run)] + tiny_overrides(tiny_data_dir, **kw), run, 7, tmp_path)
    res = subprocess.run([sys.executable, "-m", "accellib.train", "--resume", str(run)], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert killed_at < 150
    _same_run(tmp_path / "full", run)


def test_resume_on_another_process_count_is_one_line(tiny_data_dir, tmp_path, capsys):
    from accellib.train import main
    run = tmp_path / "run"
    _train(tiny_data_dir, run, {"ouroboros.enabled": True, "ouroboros.modules": 3, "train.steps": 2})
    ck = run / "checkpoints" / "last"
    (ck / "engine_rank0.pt").rename(ck / "engine_rank1.pt")
    torch.save(dict(world=2), ck / "engine_rank0.pt")
    assert main(["--resume", str(run), "--train.steps=4"]) == 2
    assert "written by 2 process(es) of ouroboros" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["--ouroboros.enabled=false", "--ouroboros.modules=2", "--pld.enabled=true"])
def test_a_resume_cannot_change_the_split_or_the_techniques(tiny_data_dir, tmp_path, capsys, override):
    # before: "--ouroboros.enabled=false" said the checkpoint "cannot be read" (restore from a backup),
    # "--ouroboros.modules=2" died with a KeyError traceback
    from accellib.train import main
    run = tmp_path / "run"
    _train(tiny_data_dir, run, {"ouroboros.enabled": True, "train.steps": 2})
    before = (run / "checkpoints" / "last" / "engine_rank0.pt").read_bytes()
    assert main(["--resume", str(run), "--train.steps=4", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "start a new run with --out" in err
    assert (run / "checkpoints" / "last" / "engine_rank0.pt").read_bytes() == before
    assert main(["--resume", str(run), "--train.steps=4"]) == 0
