"""Layered accumulation inside the modular pipeline (pipeline.reduce=per_stage) on 4 gloo processes, 2
data-parallel pipelines x 2 ranks x 2 stages per rank: each stage's all-reduce starts right after its
last micro-batch, inside the schedule, and the gradients are bitwise those of the trainer's standard
micro-batch loop; the benchmark's smoke mode runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accellib.core.config import load_config
from accellib.core.launch import launch_processes
from accellib.parallel.pipeline import PipelineError, check_config
from accellib.core.trainer import Trainer
from conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
M, B = 4, 8   # micro-batches per pipeline, sequences per pipeline per step
ARMS = [("after_step", 0.0), ("per_stage", 0.0), ("per_stage", 500.0)]   # 500 MB/s: the emulated-link path


def _overrides(data_dir, tie, **kw):
    return tiny_overrides(data_dir, **{"optim.grad_clip": 0, "model.tie_head": tie, "train.batch_size": B, **kw})


def _worker(data_dir, out_dir):
    from accelerate.state import AcceleratorState
    out = {}
    for tie in (False, True):
        for reduce, mbps in ARMS:
            tr = Trainer(load_config(None, _overrides(data_dir, tie, **{
                "pipeline.schedule": "looped_bfs", "pipeline.dp": 2, "pipeline.n_microbatches": M,
                "pipeline.reduce": reduce, "pipeline.emulate_mbps": mbps})))
            grads = {}
            tr.optimizer.step = lambda *a, **k: grads.update(   # the gradients the optimizer would step with
                {n: p.grad.clone() for n, p in tr.raw_model.named_parameters() if p.grad is not None})
            (x, y), = tr.batches(0)
            loss = float(tr.train_step())
            out[(tie, reduce, mbps)] = dict(grads=grads, x=x, y=y, loss=loss, trace=tr.engine.pipe.trace,
                                            stages=tr.engine.pipe.stage_ids, dp_rank=tr.engine.dp_rank)
    torch.save(out, Path(out_dir, f"rank{tr.accelerator.process_index}.pt"))
    tr.accelerator.wait_for_everyone()
    AcceleratorState._reset_state(reset_partial_state=True)


def _standard_loop(data_dir, tie, replicas) -> dict:
    """The trainer's standard loop (one process) on each pipeline's micro-batches, then the data-parallel
    mean the all-reduce makes: (g_0 + g_1) / 2."""
    tr = Trainer(load_config(None, _overrides(data_dir, tie, **{"train.batch_size": B // M, "train.grad_accum": M})))
    out, losses = [], []
    for x, y in replicas:
        grads = {}
        tr.optimizer.step = lambda *a, **k: grads.update(
            {n: p.grad.clone() for n, p in tr.raw_model.named_parameters()})
        tr.batches = lambda step: list(zip(x.tensor_split(M), y.tensor_split(M)))   # torch's own split
        losses.append(float(tr.train_step()))
        out.append(grads)
    return {n: (out[0][n] + out[1][n]).div_(2) for n in out[0]}, sum(losses) / 2


@pytest.mark.timeout(300)
def test_per_stage_reduction_is_bitwise_the_standard_loop(tiny_data_dir, tmp_path):
    launch_processes(_worker, (tiny_data_dir, tmp_path), 4, timeout_s=240, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    for tie in (False, True):
        first = ranks[0][(tie, "after_step", 0.0)]
        replicas = [next(r[(tie, "after_step", 0.0)] for r in ranks if r[(tie, "after_step", 0.0)]["dp_rank"] == d)
                    for d in (0, 1)]
        ref, ref_loss = _standard_loop(tiny_data_dir, tie, [(r["x"], r["y"]) for r in replicas])
        for arm in ARMS:
            seen = set()
            for r in ranks:
                assert abs(r[(tie, *arm)]["loss"] - ref_loss) < 1e-6, arm   # the logged loss, on every process
                got = r[(tie, *arm)]["grads"]
                seen |= set(got)
                for n, g in got.items():
                    if tie:   # the tied matrix's halves are summed once per step, not per micro-batch
                        assert torch.equal(g, r[(tie, "after_step", 0.0)]["grads"][n]), (arm, n)
                        torch.testing.assert_close(g, ref[n], rtol=0, atol=1e-7)
                    else:
                        assert torch.equal(g, ref[n]), (arm, n)
            assert seen == set(ref), arm   # every parameter lives on some rank
        assert first["stages"] == [0, 2]
    for r in ranks:   # per_stage: a rank's later stage is reduced inside the schedule; after_step: after it
        for arm in ARMS:
            ev = r[(False, *arm)]["trace"]
            end = next(t for e, _, t in ev if e == "schedule_end")
            launches = [(s, t) for e, s, t in ev if e == "reduce_launch"]
            if arm[0] == "after_step":
                assert [s for s, _ in launches] == [-1] and launches[0][1] >= end
            else:
                later, earlier = r[(False, *arm)]["stages"][::-1]
                assert [s for s, _ in launches] == [later, earlier]   # in backward order, once each
                assert launches[0][1] < end
            assert sorted(s for e, s, _ in ev if e == "reduce_done") == sorted(s for s, _ in launches)


@pytest.mark.parametrize("kw,msg", [
    (dict(reduce="per_stage", dp=1), "needs pipeline.dp > 1"),
    (dict(reduce="per_stage", dp=2, schedule="1f1b", v=1), "needs several stages per rank"),
    (dict(reduce="sideways", dp=2), "unknown pipeline.reduce"),
    (dict(emulate_mbps=10.0, dp=1), "emulates the data-parallel link"),
])
def test_reduce_errors_are_one_line(kw, msg):
    a = dict(schedule="looped_bfs", pp=2, v=2, n_mb=4, batch=8, n_layer=4)
    a.update(kw)
    with pytest.raises(PipelineError, match=msg) as e:
        check_config(a.pop("schedule"), a.pop("pp"), a.pop("v"), a.pop("n_mb"), a.pop("batch"), a.pop("n_layer"), **a)
    assert "\n" not in str(e.value)


@pytest.mark.timeout(300)
def test_benchmark_quick(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = tmp_path / "lga.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lga_pipeline.py"), "--quick", "--out", str(out)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    d = json.loads(out.read_text())
    rows = {r["reduce"]: r for r in d["step"]}
    assert set(rows) == {"after_step", "per_stage"}
    assert all(r["step_ms"] > 0 and r["pred_sim_ms"] > 0 for r in rows.values())
    assert rows["per_stage"]["pred_sim_ms"] < rows["after_step"]["pred_sim_ms"]
    assert {r["order"] for r in d["zero_volume"]} == {"layered", "standard"}
