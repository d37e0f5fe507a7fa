"""Timing harness: train jobs through the one trainer on fresh CPU processes and time every optimizer step.

For the notebooks and benchmarks that time an engine's schedule (gloo, one process per rank)."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from ..core.config import load_config
from ..core.launch import launch_processes
from ..core.trainer import Trainer

def _timed_jobs(jobs: list[list[str]], out_dir: str) -> None:
    """One process of `time_on_processes`: train every job through the trainer (no run folder), timing
    each optimizer step between barriers."""
    res = []
    for overrides in jobs:
        tr = Trainer(load_config(None, overrides))
        times, losses, metrics = [], [], []
        for _ in range(tr.cfg.train.steps):
            tr.accelerator.wait_for_everyone()
            t0 = time.perf_counter()
            losses.append(float(tr.train_step()))
            times.append(time.perf_counter() - t0)
            metrics.append({k: v for x in tr.techniques for k, v in x.metrics(tr.state).items()})
        res.append(dict(times=times, losses=losses, metrics=metrics))
    Path(out_dir, f"rank{dist.get_rank() if dist.is_initialized() else 0}.json").write_text(json.dumps(res))


def time_on_processes(jobs: list[list[str]], world: int, timeout_s: float = 300) -> list[dict]:
    """Train each job (a list of `--section.key=value` overrides) for train.steps steps on `world` fresh
    CPU processes (gloo) through the one trainer, and return per job the step times of every process
    (`times[rank][step]`; a step ends when the slowest process ends: take the max over ranks) and the
    losses, and the techniques' metrics of every step of every process (`metrics[rank][step]`, e.g. a
    pipeline's exposed_comm_s). For notebooks and benchmarks that time an engine's schedule, e.g. with
    pipeline.block_ms."""
    with tempfile.TemporaryDirectory() as d:
        launch_processes(_timed_jobs, (jobs, d), world, timeout_s=timeout_s, start_method="spawn")
        ranks = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(world)]
    return [dict(times=[ranks[r][j]["times"] for r in range(world)], losses=ranks[0][j]["losses"],
                 metrics=[ranks[r][j]["metrics"] for r in range(world)]) for j in range(len(jobs))]
