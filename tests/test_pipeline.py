"""Modular pipeline parallelism (torch.distributed.pipelining) as an engine of the one trainer: every
schedule on real gloo processes trains like the unpartitioned model; it checkpoints and resumes exactly;
the torchrun command of the README runs; placement; the clear errors."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.core.launch import launch_processes
from accellib.parallel.pipeline import PipelineError, check_config, placement, split_layers
from accellib.core.records import read_metrics
from accellib.core.trainer import Trainer
from conftest import tiny_overrides, train_run as _train
from accellib.core.records import TIMING_FIELDS

ROOT = Path(__file__).resolve().parents[1]
STEPS = {"train.steps": 4, "train.checkpoint_every": 2, "train.eval_every": 2}


def _close(ref: Path, run: Path, tol=2e-5):
    a, b = read_metrics(ref), read_metrics(run)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert abs(ra["train_loss"] - rb["train_loss"]) < tol, (ra, rb)
        assert abs(ra.get("val_loss", 0) - rb.get("val_loss", 0)) < tol, (ra, rb)
    sa, sb = (torch.load(d / "checkpoints" / "last" / "pytorch_model.bin") for d in (ref, run))
    assert max((sa[n] - sb[n]).abs().max().item() for n in sa) < tol


@pytest.mark.timeout(300)
def test_every_schedule_on_two_processes_trains_like_the_plain_model(tiny_data_dir, tmp_path):
    # AdamW, 4 steps, evaluation and checkpoints through the trainer; micro-batches only change the
    # order of the gradient sums, so the runs agree to float32 round-off (tied head: summed across ranks)
    _train(tiny_data_dir, tmp_path / "ref", STEPS)
    for sched in ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs"):
        _train_mp = (tiny_data_dir, tmp_path / sched, {**STEPS, "pipeline.schedule": sched})
        launch_processes(_train, _train_mp, 2, timeout_s=120, start_method="spawn")
        _close(tmp_path / "ref", tmp_path / sched)


@pytest.mark.timeout(300)
def test_four_processes_looped_and_data_parallel_pipelines(tiny_data_dir, tmp_path):
    eight = {**STEPS, "model.n_layer": 8}
    _train(tiny_data_dir, tmp_path / "ref8", eight)
    launch_processes(_train, (tiny_data_dir, tmp_path / "bfs4", {**eight, "pipeline.schedule": "looped_bfs"}),
                     4, timeout_s=150, start_method="spawn")
    _close(tmp_path / "ref8", tmp_path / "bfs4")
    # 2 pipelines x 2 ranks with 4 sequences each see the data of one process with 2 micro-batches of 4
    _train(tiny_data_dir, tmp_path / "ref_dp", {**STEPS, "train.batch_size": 4, "train.grad_accum": 2})
    launch_processes(_train, (tiny_data_dir, tmp_path / "dp2", {**STEPS, "train.batch_size": 4, "pipeline.dp": 2,
                                                                "pipeline.schedule": "1f1b", "pipeline.n_microbatches": 2}),
                     4, timeout_s=150, start_method="spawn")
    _close(tmp_path / "ref_dp", tmp_path / "dp2")


@pytest.mark.timeout(300)
def test_pipelined_run_resumes_exactly(tiny_data_dir, tmp_path):
    kw = {"pipeline.schedule": "looped_bfs", "train.steps": 6, "train.checkpoint_every": 2}
    launch_processes(_train, (tiny_data_dir, tmp_path / "full", kw), 2, timeout_s=120, start_method="spawn")
    with pytest.raises(Exception, match="crash"):
        launch_processes(_train, (tiny_data_dir, tmp_path / "part", kw, 3), 2, timeout_s=120, start_method="spawn")
    launch_processes(_train, (tiny_data_dir, tmp_path / "part", kw, None, True), 2, timeout_s=120,
                     start_method="spawn")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]
    assert strip(read_metrics(tmp_path / "full")) == strip(read_metrics(tmp_path / "part"))


@pytest.mark.timeout(300)
def test_torchrun_trainer_command_and_compare_arms(tiny_data_dir, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    from accellib.core.launch import _free_port  # torchrun's default port 29500 is shared by every concurrent test
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_free_port()}"]
    res = subprocess.run(torchrun + ["-m", "accellib.train", "--out", str(tmp_path / "run"), *tiny_overrides(
        tiny_data_dir, **{"train.steps": 3}), "--pipeline.schedule=looped_bfs"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "last" / "engine_rank1.pt").is_file()
    assert read_metrics(tmp_path / "run")[-1]["step"] == 3
    # compare: the data-parallel baseline beside a pipeline and an Ouroboros arm, on the same 2 processes
    # and the same 8 sequences per step
    import yaml
    from accellib.core.config import parse_overrides
    base = parse_overrides(tiny_overrides(tiny_data_dir, **{"train.steps": 3}))
    base["arms"] = dict(baseline=dict(train=dict(batch_size=4)), pipeline=dict(pipeline=dict(schedule="looped_bfs")),
                        ouroboros=dict(ouroboros=dict(enabled=True, modules=3)))
    (tmp_path / "arms.yaml").write_text(yaml.safe_dump(base))
    res = subprocess.run(torchrun + ["-m", "accellib.compare", "--config", str(tmp_path / "arms.yaml"),
                                     "--out", str(tmp_path / "cmp")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {ln.split()[0] for ln in res.stdout.splitlines() if ln[:1].isalpha()}
    assert {"baseline", "pipeline", "ouroboros"} <= rows, res.stdout
    toks = {a: read_metrics(tmp_path / "cmp" / a)[-1]["tokens"] for a in ("baseline", "pipeline", "ouroboros")}
    assert len(set(toks.values())) == 1, toks


def test_placement_partitions_layers():
    for P, v in [(2, 2), (4, 2), (3, 4), (1, 3)]:
        pl = placement(P * v, P)
        assert all(len(s) == v for s in pl)
        assert sorted(s for r in pl for s in r) == list(range(P * v))
        assert all(s % P == r for r, st in enumerate(pl) for s in st)       # stage s on rank s mod P
        cont = placement(P * v, P, "contiguous")
        assert cont[0] == list(range(v))
    layers = split_layers(8, 4)
    assert [list(r) for r in layers] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("args,msg", [
    (("gpipe", 2, 1, 3, 8, 8), "not divisible by n_microbatches"),
    (("1f1b", 4, 1, 2, 8, 8), "needs n_microbatches >= pipeline stages"),
    (("looped_bfs", 2, 2, 4, 8, 8, "contiguous"), "needs looped placement"),
    (("interleaved_1f1b", 2, 2, 4, 8, 8, "contiguous"), "needs looped placement"),
    (("interleaved_1f1b", 2, 2, 5, 10, 8), "interleaved_1f1b needs n_microbatches divisible"),
    (("gpipe", 2, 2, 4, 8, 8), "one stage per rank"),
    (("looped_bfs", 2, 2, 4, 8, 6), "not divisible by 4 stages"),
    (("gpipe", 2, 1, 16, 8, 8), "exceeds the batch size"),
])
def test_clear_errors(args, msg):
    with pytest.raises(PipelineError, match=msg):
        check_config(*args)


@pytest.mark.parametrize("kw,msg", [
    ({"pipeline.schedule": "zero_bubble"}, "is not allowed; choose one of"),
    ({"pipeline.schedule": "gpipe"}, "needs several processes: run it under torchrun"),
    ({"pipeline.schedule": "gpipe", "train.grad_accum": 2}, "set train.grad_accum=1"),
    ({"pipeline.schedule": "gpipe", "pipeline.dp": 2}, "pipeline.dp=2 does not divide the 1 processes"),
    ({"pipeline.schedule": "gpipe", "ouroboros.enabled": True}, "cannot be combined with"),
])
def test_engine_errors_are_one_line(tiny_data_dir, kw, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        Trainer(load_config(None, tiny_overrides(tiny_data_dir, **kw)))
    assert "\n" not in str(e.value)
