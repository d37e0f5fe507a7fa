"""What a training step costs the host, counted deterministically (issue 42): the trainer's step dispatches
about the ops a plain PyTorch loop dispatches, one-off work is timed apart from training, and
train.compile=model compiles the whole model once for a run whose plan never changes. Speed itself is a
benchmark's business (benchmarks/host_time.py), never a timed test."""
from __future__ import annotations

import time

import torch

from accellib.core.records import read_metrics, read_record
from accellib.core.trainer import Trainer
from accellib.train import training_function


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
