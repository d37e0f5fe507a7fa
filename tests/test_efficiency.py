"""The full-scale GPU path's efficiency properties, checked on a CPU: no host read inside a training
step, a bounded number of compiled graphs whatever the technique's plan, prefetching that changes
nothing, and MFU / grad-norm / peak memory in every log record."""
from __future__ import annotations

import math
import time
import traceback

import pytest
import torch
from torch._dynamo.utils import counters

from accellib.core.records import read_metrics
from accellib.train import training_function
from accellib.core.trainer import Trainer, TrainingError

# every way a tensor's value reaches Python: on a GPU each one waits for all the work queued before it
HOST_READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")
# reads of tensors that live on the host whatever the device, so they never wait for a GPU, as
# (file, function or "" for any): the data sampler's window starts (a CPU generator's draw that indexes
# the memory-mapped corpus), the layer-drop gates (a CPU draw: whether a block runs is Python control
# flow, decided before the step), SBLD's profiling (once, when its warm-up ends: the sensitivities
# decide the host-side plan from then on), and the optimizer's step counters (CPU scalars in torch's
# non-fused AdamW; the fused CUDA AdamW the trainer uses there reads none), and lowp's emulated rounding
HOST_SIDE = (("accellib/data/tokens.py", "sample_batch"), ("accellib/techniques/_layer_drop_common.py", "draw_gates"),
             ("accellib/techniques/sensitivity_layer_drop.py", "profile"), ("torch/optim/", ""),
             # lowp's exact software emulation (lowp.backend=emulate, a CPU study; a GPU runs lowp.backend=torchao):
             # its rounding tests for subnormals and NaNs, which decide whether stochastic rounding draws
             ("accellib/numerics/formats.py", "quantize"))

TECHNIQUES = {"baseline": {}, "pld": {"pld.enabled": True, "pld.gamma": 0.1},  # gamma: blocks drop within a few steps
              "sbld": {"sbld.enabled": True, "sbld.profile_batches": 2},
              "random_ltd": {"random_ltd.enabled": True, "random_ltd.min_len": 8}}
# every other technique and engine that runs on one process, for the host-read check (issue 27: the README
# says no step waits for the device; the standardization loss, the low-precision emulation and the engines'
# clip each read a number every step before)
HOST_READ_TECHNIQUES = {**TECHNIQUES,
                        "standardization_loss": {"standardization_loss.enabled": True, "model.norm": "none"},
                        "lowp": {"lowp.enabled": True, "model.n_layer": 2, "model.tie_head": False},
                        "layered_accumulation": {"layered_accumulation.enabled": True, "train.grad_accum": 2},
                        # an engine's clip (Engine.clip_grad_norm_, the pipeline's too), active: grad_clip 0.5
                        "ouroboros": {"ouroboros.enabled": True, "ouroboros.modules": 3, "optim.grad_clip": 0.5}}
# Not here: the pipeline needs several processes (its clip is the Engine's, checked through ouroboros), and
# the multi-level V-cycle trains a sequence of plain trainers (run_vcycle), each the baseline's step.


@pytest.fixture
def host_reads(monkeypatch):
    """A list that grows by (read, caller's file) per read of a tensor's value by Python code other
    than HOST_SIDE, while the test runs. On a CPU every tensor is a host tensor, so the caller tells
    which reads would wait for a GPU."""
    seen = []
    for name in HOST_READS:
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            frame = traceback.extract_stack(limit=2)[0]
            caller = frame.filename.replace("\\", "/")
            if not any(f in caller and fn in ("", frame.name) for f, fn in HOST_SIDE):
                seen.append((_name, caller, frame.name))
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return seen


def _counted_steps(tr: Trainer, host_reads: list, n: int) -> list[str]:
    start = len(host_reads)
    for _ in range(n):
        tr.train_step()
    return host_reads[start:]


@pytest.mark.parametrize("tech", list(HOST_READ_TECHNIQUES))
def test_a_training_step_reads_nothing_back_from_the_device(tiny_cfg, host_reads, tech):
    tr = Trainer(tiny_cfg(**{"train.steps": 12}, **HOST_READ_TECHNIQUES[tech]))
    assert _counted_steps(tr, host_reads, 12) == []
    if tech == "sbld":  # it profiled inside these steps (its warm-up is shorter than 12 steps), once
        assert len(tr.techniques[0].profiled_at) == 1 and 0 < tr.techniques[0].profiled_at[0] <= 12


def test_the_log_window_is_read_once_per_log_step(tiny_cfg, tmp_path, host_reads, monkeypatch):
    reads_per_flush = []
    orig = Trainer._flush

    def counted(self):
        before = len(host_reads)
        orig(self)
        reads_per_flush.append(len(host_reads) - before)
    monkeypatch.setattr(Trainer, "_flush", counted)
    cfg = tiny_cfg(**{"train.steps": 12, "train.log_every": 4, "train.eval_every": 0, "train.checkpoint_every": 0})
    training_function(cfg, tmp_path / "run")
    # three log steps read the window in one tolist() each; the final checkpoint finds it empty
    assert reads_per_flush == [1, 1, 1, 0]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [4, 8, 12]


def test_a_nan_between_log_steps_stops_the_run_at_the_next_log_step(tiny_cfg, tmp_path, monkeypatch):
    orig = Trainer.forward_loss

    def bad(self, x, y, plan):  # step 6 (0-based step 5) produces a NaN loss
        loss, total = orig(self, x, y, plan)
        return (loss * float("nan"), total) if self.state.step == 5 else (loss, total)
    monkeypatch.setattr(Trainer, "forward_loss", bad)
    cfg = tiny_cfg(**{"train.steps": 12, "train.log_every": 4, "train.eval_every": 0, "train.checkpoint_every": 4})
    with pytest.raises(TrainingError, match=r"training loss is nan in steps 5-8; .* checkpoint \(step 4\) is kept"):
        training_function(cfg, tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [4]


def test_the_nan_check_runs_before_a_checkpoint_between_log_steps(tiny_cfg, tmp_path, monkeypatch):
    orig = Trainer.forward_loss
    monkeypatch.setattr(Trainer, "forward_loss", lambda self, x, y, plan: (
        lambda lt: (lt[0] * float("nan"), lt[1]) if self.state.step == 2 else lt)(orig(self, x, y, plan)))
    cfg = tiny_cfg(**{"train.steps": 12, "train.log_every": 10, "train.eval_every": 0, "train.checkpoint_every": 2})
    with pytest.raises(TrainingError, match=r"training loss is nan in steps 3-4; .* checkpoint \(step 2\) is kept"):
        training_function(cfg, tmp_path / "run")
    state = torch.load(tmp_path / "run" / "checkpoints" / "last" / "custom_checkpoint_0.pkl", weights_only=False)
    assert state["step"] == 2


MAX_GRAPHS = 5  # what train.compile=blocks may compile for a whole run of any plan


@pytest.mark.parametrize("tech", ["pld", "sbld", "random_ltd"])
def test_compiled_blocks_need_a_few_graphs_for_any_plan(tiny_cfg, tech):
    """40 steps of a technique whose plan changes every step (PLD: new scales and skipped blocks; SBLD:
    skipped blocks; random-LTD: a kept length that grows) compile a small constant number of graphs.
    A whole-model compile made 8 graphs in 20 PLD steps and hit torch's recompile limit. The eager
    backend counts graphs exactly as inductor would (Dynamo's capture is the same), without compiling C++."""
    torch._dynamo.reset()
    counters.clear()
    over = {"train.steps": 40, "train.compile": "blocks", "train.compile_backend": "eager", **TECHNIQUES[tech]}
    if tech == "random_ltd":
        over["random_ltd.ramp_steps"] = 30  # the kept length changes over the 40 steps, then reaches the full 32
    tr = Trainer(tiny_cfg(**over))
    plain = Trainer(tiny_cfg(**{k: v for k, v in over.items() if not k.startswith("train.compile")}))
    for _ in range(40):
        assert torch.equal(tr.train_step(), plain.train_step())  # the eager backend runs the same kernels
    # at most 3 graphs for the blocks (plain, scaled, a dynamic token count) and 1 for the compiled head + loss, with
    # one to spare; SBLD's profile runs eagerly and compiles none (tests/test_compile_graphs.py: each one's count)
    assert counters["stats"]["unique_graphs"] <= MAX_GRAPHS, dict(counters["stats"])
    # the compiled blocks keep their parameter names: checkpoints and exports are unchanged
    assert list(tr.raw_model.state_dict()) == list(plain.raw_model.state_dict())


def test_a_whole_model_compile_is_what_needs_many_graphs(tiny_cfg):
    """The contrast that makes the count above mean something: compiling the whole model, PLD's changing
    plan is part of the compiled program, and 20 steps already need more graphs than blocks need in 40."""
    torch._dynamo.reset()
    counters.clear()
    tr = Trainer(tiny_cfg(**{"train.steps": 40, **TECHNIQUES["pld"]}))
    tr.raw_model.compile(backend="eager")
    for _ in range(20):
        tr.train_step()
    assert counters["stats"]["unique_graphs"] > MAX_GRAPHS, dict(counters["stats"])
    torch._dynamo.reset()


def test_compile_refuses_a_model_without_blocks():
    from accellib.core.options import ConfigError
    from accellib.core.config import load_config
    with pytest.raises(ConfigError, match="train.compile=blocks .* model.kind=cnn has none; use train.compile=none"):
        load_config(None, ["--model.kind=cnn", "--train.compile=blocks"])


def test_prefetching_changes_no_number(tiny_cfg):
    a, b = Trainer(tiny_cfg()), Trainer(tiny_cfg())
    b.prefetch = True  # what the trainer does on CUDA
    for _ in range(4):
        assert torch.equal(a.train_step(), b.train_step())
        assert b._prefetched is not None and b._prefetched[0] == b.state.step


def test_every_log_record_has_mfu_grad_norm_and_peak_memory(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"train.steps": 12, "train.log_every": 6, "train.peak_flops": 1e9})
    training_function(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    for r in recs:
        assert 0 < r["mfu"] and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 and r["peak_mem_gb"] > 0
    # with a configured peak, MFU is the window's FLOPs per second over it: check the arithmetic (the
    # records' wall is rounded to 0.1 ms, hence the tolerance)
    second = recs[1]
    window_flops = second["flops"] - recs[0]["flops"]
    window_wall = second["wall"] - recs[0]["wall"]
    assert second["mfu"] == pytest.approx(window_flops / window_wall / 1e9, rel=0.02)


def test_mixed_precision_keeps_the_logits_in_bf16(tiny_cfg):
    """Accelerate's prepare() would return every output in fp32 (a full fp32 copy of the logits); the
    trainer removes that wrapper, so the logits stay bf16 and only the loss is fp32 (accellib/models/losses.py)."""
    tr = Trainer(tiny_cfg(**{"train.precision": "bf16"}))
    x, y = tr.batches(0)[0]
    with tr.accelerator.autocast():
        logits, loss = tr.model(x, y)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert math.isfinite(float(tr.train_step()))


def test_a_resume_inside_a_log_window_logs_what_the_uninterrupted_run_logs(tiny_cfg, tmp_path, monkeypatch):
    """The window's sums live on the device between log steps; a checkpoint between two log steps stores
    them (float64), and the resumed run adds the rest: the log lines equal the uninterrupted run's."""
    from conftest import crash_and_resume
    kw = {"train.steps": 12, "train.log_every": 5, "train.checkpoint_every": 3, "train.eval_every": 0}
    full, part, _, _ = crash_and_resume(tiny_cfg, kw, tmp_path, monkeypatch, crash_after=7)
    assert [r["step"] for r in full] == [5, 10, 12] and "val_loss" in full[-1]
    assert part == full  # train_loss, grad_norm, lr, counters, val_loss: every reproducible field


def test_the_window_time_includes_the_wait_at_the_log_step_read(tiny_cfg, tmp_path, monkeypatch):
    """On a GPU the steps only queue work; the log step's read (_flush) waits until it is done. A 0.3 s wait
    put into that read (the queued work of an asynchronous device) must be in the window's time, so tok/s
    and MFU cannot be overstated: each window of 4 steps lasts at least the wait. Before issue 27 the time
    stopped at the end of each step's host code and the wait was in no window."""
    orig = Trainer._flush

    def waits(self):
        if self._window:
            time.sleep(0.3)
        orig(self)
    monkeypatch.setattr(Trainer, "_flush", waits)
    cfg = tiny_cfg(**{"train.steps": 8, "train.log_every": 4, "train.eval_every": 0, "train.checkpoint_every": 0,
                      "train.peak_flops": 1e9})
    training_function(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [4, 8]
    walls = [recs[0]["wall"], recs[1]["wall"] - recs[0]["wall"]]
    for r, w in zip(recs, walls):
        assert w >= 0.3
        assert r["tok_per_s"] <= 4 * 8 * 32 / 0.3          # 4 steps x batch 8 x 32 tokens in at least 0.3 s
        assert r["mfu"] <= (r["flops"] - (recs[0]["flops"] if r is recs[1] else 0)) / 0.3 / 1e9


def test_evaluation_and_checkpoints_are_not_training_time(tiny_cfg, tmp_path, monkeypatch):
    """A slow evaluation or save (0.5 s each here) is outside every window: the run's wall stays below it."""
    monkeypatch.setattr(Trainer, "evaluate", lambda self, *a, _o=Trainer.evaluate, **k: (time.sleep(0.5), _o(self, *a, **k))[1])
    monkeypatch.setattr(Trainer, "save", lambda self, *a, _o=Trainer.save, **k: (_o(self, *a, **k), time.sleep(0.5))[0])
    cfg = tiny_cfg(**{"train.steps": 4, "train.log_every": 1, "train.eval_every": 1, "train.checkpoint_every": 1})
    training_function(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert len(recs) == 4 and 0 < recs[-1]["wall"] < 0.5 * 7   # 4 evaluations + 4 saves took >= 4 s
