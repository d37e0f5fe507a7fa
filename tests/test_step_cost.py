"""What a training step costs the host, counted deterministically (issue 42): the trainer's step dispatches
about the ops a plain PyTorch loop dispatches, one-off work is timed apart from training, and
train.compile=model compiles the whole model once for a run whose plan never changes. Speed itself is a
benchmark's business (benchmarks/host_time.py), never a timed test."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from accellib.core.records import read_metrics, read_record
from accellib.core.trainer import Trainer
from accellib.train import training_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_one_off_work_is_timed_apart_from_training(tiny_cfg, tmp_path, monkeypatch):
    """0.4 s of one-off work at step 2 lands in state.one_off and record.json's one_off_s, not in the run's
    training wall; the function's result comes back."""
    orig = Trainer.train_step
    got = []

    def step_with_one_off(self):
        loss = orig(self)
        if self.state.step == 2:
            got.append(self.one_off("probe", lambda: (time.sleep(0.4), 7)[1]))
        return loss
    monkeypatch.setattr(Trainer, "train_step", step_with_one_off)
    cfg = tiny_cfg(**{"train.steps": 4, "train.log_every": 4, "train.eval_every": 0, "train.checkpoint_every": 0})
    training_function(cfg, tmp_path / "run")
    rec = read_record(tmp_path / "run")
    assert got == [7]
    assert 0.4 <= rec["one_off_s"]["probe"] < 5
    assert read_metrics(tmp_path / "run")[-1]["wall"] < rec["one_off_s"]["probe"]


def test_one_off_outside_fit_just_runs(tiny_cfg):
    tr = Trainer(tiny_cfg())
    assert tr.one_off("x", lambda: 3) == 3 and "x" in tr.state.one_off and tr.state.wall == 0.0


def test_the_trainer_step_dispatches_what_a_plain_loop_dispatches(tiny_data_dir):
    """GPT-2 small's parameter list (148 tensors, 12 blocks) at toy widths: the trainer's step dispatches at most
    5% more aten ops than a plain loop's (forward, backward, torch's clip, AdamW, zero_grad) over the same model.
    Before issue 42 the float64 per-parameter gradient norm alone added ~600 (x1.23)."""
    import host_time as h
    trainer, plain = h.pair(tiny_data_dir)
    assert len(list(trainer.__self__.raw_model.parameters())) == 148
    ops_t, by_t = h.count_ops(trainer)
    ops_p, by_p = h.count_ops(plain)
    assert h.count_ops(trainer)[0] == ops_t and h.count_ops(plain)[0] == ops_p   # deterministic: counted again
    assert ops_t <= (1 + h.OP_TOLERANCE) * ops_p, {k: by_t[k] - by_p.get(k, 0) for k in by_t if by_t[k] != by_p.get(k, 0)}
    # what the trainer adds is a handful of ops (the log window's sums, the norm's float32 result), not per parameter
    assert ops_t - ops_p < 20


def _float64_sums_norm(grads):
    """The norm as global_grad_norm computed it before issue 42: per-parameter float64 sums of squares."""
    return torch.stack([g.double().square().sum() for g in grads]).sum().sqrt().float()


def test_the_foreach_norm_gives_the_bits_of_the_float64_sums():
    """global_grad_norm through one _foreach_norm(dtype=float64) gives the float32 bits the per-parameter float64
    sums of squares gave (cached runs clipped with them), over many gradient sets of GPT-2-like shapes and scales;
    a slot missing (a skipped block) adds nothing. (Shards: tests/test_zero_layered.py.)"""
    from accellib.parallel.engine import global_grad_norm
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 16), (16,), (16, 48), (48,), (16, 16), (16,), (64, 16), (64,), (16, 64)]
    for trial in range(200):
        scale = 10.0 ** (trial % 9 - 4)
        grads = [torch.randn(s, generator=g) * scale for s in shapes]
        ref = _float64_sums_norm(grads)
        assert torch.equal(global_grad_norm(list(enumerate(grads)), len(grads), "cpu"), ref)
        missing = list(enumerate(grads))
        missing[3] = (3, None)
        assert torch.equal(global_grad_norm(missing, len(grads), "cpu"), _float64_sums_norm(grads[:3] + grads[4:]))


def test_compile_model_runs_one_training_graph_with_the_eager_losses(tiny_cfg):
    """train.compile=model (aot_eager: dynamo's decisions are inductor's, without compiling C++) compiles the whole
    model once for training: 12 steps and an evaluation make 2 graphs in all, none after the first step, and the
    losses are the eager run's (to float round-off: aot_eager runs the traced graph's decomposed ops)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    over = {"train.steps": 12, "train.compile_backend": "aot_eager"}
    tr, plain = Trainer(tiny_cfg(**over, **{"train.compile": "model"})), Trainer(tiny_cfg(**over))
    first = None
    for step in range(12):
        a, b = tr.train_step(), plain.train_step()
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (step, float(a), float(b))
        first = counters["stats"]["unique_graphs"] if first is None else first
        assert counters["stats"]["unique_graphs"] == first == 1
    tr.evaluate()
    tr.train_step()
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])   # + the evaluation's graph, once
    assert list(tr.raw_model.state_dict()) == list(plain.raw_model.state_dict())
    torch._dynamo.reset()


def test_compile_model_refuses_a_technique_that_changes_the_plan(tiny_cfg):
    import pytest
    from accellib.core.options import ConfigError
    with pytest.raises(ConfigError, match=r"^train.compile=model compiles one fixed program, and pld changes the "
                                          r"block plan .*; use train.compile=blocks$"):
        Trainer(tiny_cfg(**{"train.compile": "model", "pld.enabled": True}))


def test_compile_model_takes_the_standardization_loss_in_its_one_graph(tiny_cfg):
    """The standardization loss keeps its terms on the model's PreAct markers (set by hooks inside the compiled
    program), so a whole-model compile traces them: one training graph, and the eager run's losses."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    over = {"train.steps": 8, "train.compile_backend": "aot_eager", "standardization_loss.enabled": True,
            "model.norm": "none"}
    tr, plain = Trainer(tiny_cfg(**over, **{"train.compile": "model"})), Trainer(tiny_cfg(**over))
    for _ in range(8):
        a, b = tr.train_step(), plain.train_step()
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (float(a), float(b))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch._dynamo.reset()
