"""Shared fixtures: a tiny synthetic corpus written through the real data-prep code, and a
tiny config that trains in a fraction of a second per step."""
from __future__ import annotations

import random

import pytest
import torch

from accellib.core.config import load_config
from accellib.core.records import TIMING_FIELDS

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each test starts without Accelerate's process-wide singleton state, so a later
    launch_processes/notebook_launcher in the same pytest worker can start processes."""
    yield
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(reset_partial_state=True)


def synthetic_text(n_chars: int = 60_000, seed: int = 0) -> str:
    """Pseudo-English with learnable structure (a few hundred words, Zipf-ish frequencies)."""
    rng = random.Random(seed)
    syll = ["the", "and", "to", "of", "a", "in", "my", "is", "that", "lord", "king", "love", "thou",
            "me", "what", "be", "with", "not", "his", "your", "shall", "sir", "good", "come"]
    words = [rng.choice(syll) + rng.choice(["", "s", "ed", "eth", "ly"]) for _ in range(300)]
    out, n = [], 0
    while n < n_chars:
        line = " ".join(words[min(int(rng.paretovariate(1.2)) - 1, 299)] for _ in range(rng.randint(4, 10)))
        line = line.capitalize() + rng.choice([".", ",", "!", "?"]) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out)[:n_chars]


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory):
    from data_scripts.tokenize_corpus import encode_text, split_text, write_token_dataset
    text = synthetic_text()
    train, val = split_text(text)
    out = tmp_path_factory.mktemp("data") / "tiny"
    write_token_dataset(out, encode_text(train, "byte"), encode_text(val, "byte"),
                        dict(tokenizer="byte", vocab_size=257, mask_id=256,
                             bytes_per_token=1.0, created_by="python data_scripts/prepare_shakespeare.py",
                             source=dict(name="synthetic")))
    return out


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """scikit-learn's 8x8 digits written by data_scripts/prepare_digits.py (about a second)."""
    from data_scripts import prepare_digits
    out = tmp_path_factory.mktemp("images") / "digits"
    assert prepare_digits.main(["--out", str(out)]) == 0
    return out


def image_overrides(data_dir, **kw) -> list[str]:
    """The digits CNN at test size: SGD with momentum (so the optimizer has state to checkpoint)."""
    base = {"data.path": str(data_dir), "model.kind": "cnn", "model.norm": "none", "optim.name": "sgd",
            "optim.momentum": 0.9, "optim.lr": 0.01, "optim.warmup_steps": 2, "train.batch_size": 16,
            "train.steps": 6, "train.eval_every": 3, "train.log_every": 1, "train.progress": False}
    base.update(kw)
    return [f"--{k}={v}" for k, v in base.items()]


def tiny_overrides(data_dir, **kw) -> list[str]:
    base = {"data.path": str(data_dir), "model.n_layer": 4, "model.d_model": 32, "model.n_head": 2,
            "model.seq_len": 32, "train.batch_size": 8, "train.steps": 6, "train.eval_every": 3,
            "train.eval_windows": 8, "train.log_every": 1, "train.progress": False,
            "optim.warmup_steps": 2}
    base.update(kw)
    return [f"--{k}={v}" for k, v in base.items()]


@pytest.fixture
def tiny_cfg(tiny_data_dir):
    def make(**kw):
        return load_config(None, tiny_overrides(tiny_data_dir, **kw))
    return make


def crash_and_resume(cfg_factory, kw: dict, tmp_path, monkeypatch, crash_after: int):
    """Train `cfg_factory(**kw)` uninterrupted into full/, then again into part/ crashing after
    `crash_after` optimizer steps, resume part/ from the command line, and return both runs'
    metrics (timing fields removed) and final records: (full, part, full_record, part_record)."""
    from accellib.core.records import read_metrics, read_record
    from accellib.train import main, training_function
    from accellib.core.trainer import Trainer

    training_function(cfg_factory(**kw), tmp_path / "full")
    orig = Trainer.train_step

    def crash(self):
        if self.state.step == crash_after:
            raise KeyboardInterrupt
        return orig(self)
    monkeypatch.setattr(Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        training_function(cfg_factory(**kw), tmp_path / "part")
    monkeypatch.setattr(Trainer, "train_step", orig)
    assert main(["--resume", str(tmp_path / "part")]) == 0
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]
    return (strip(read_metrics(tmp_path / "full")), strip(read_metrics(tmp_path / "part")),
            read_record(tmp_path / "full"), read_record(tmp_path / "part"))


def kill9_after(argv: list[str], run, lines: int, cwd, timeout_s: float = 120) -> int:
    """Start `python -m accellib.train ARGV` (argv includes --out run), SIGKILL it once its metrics.jsonl has
    `lines` lines, and return how many lines it had written when it died."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.Popen([sys.executable, "-m", "accellib.train", *argv], env=env, cwd=cwd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = Path(run) / "metrics.jsonl", time.monotonic() + timeout_s
    while not (metrics.exists() and metrics.read_text().count("\n") >= lines):
        assert time.monotonic() < deadline and p.poll() is None, "the run ended or hung before it was killed"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    return len(metrics.read_text().splitlines())


def train_run(data_dir, out, extra: dict, crash_after=None, resume: bool = False):
    """Train the tiny config (+ `extra`) into `out` through the CLI's training_function; usable as the
    function of accellib.core.launch.launch_processes (one call per process). `crash_after`: raise after that
    many optimizer steps (a RuntimeError: torch's process launcher swallows KeyboardInterrupt)."""
    from accelerate.state import AcceleratorState
    from accellib.train import training_function
    from accellib.core.trainer import Trainer
    if crash_after is not None:
        orig = Trainer.train_step

        def crash(self):
            if self.state.step == crash_after:
                raise RuntimeError("crash")
            return orig(self)
        Trainer.train_step = crash
    try:
        training_function(load_config(None, tiny_overrides(data_dir, **extra)), out, resume=resume)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
