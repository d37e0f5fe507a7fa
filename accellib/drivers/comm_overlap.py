"""Exposed data-parallel communication, standard vs layered accumulation, measured on 2 gloo processes.

Exposed data-parallel communication, standard vs layered gradient accumulation, measured on
2 gloo processes over an emulated slow link (Lamy-Poirier 2021, §4.1: layered accumulation
lets each layer's reduction start as soon as its last micro-batch's backward is done, so only
the reduction of the *first* layers stays exposed).

The link is emulated inside `layered_accumulation` (reductions sleep bytes / bandwidth on one
communication thread), because loopback gloo is so fast that nothing would be exposed.
Used by notebook 05 and benchmarks/pipeline.py.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from ..analysis import planner


def _worker(data_dir: str, out_dir: str, mbps: float, reps: int, grad_accum: int) -> None:
    from ..core.config import load_config
    from ..core.trainer import Trainer
    from ..parallel.layered_accumulation import predicted_exposed
    out = {}
    for _ in range(reps):
        for order in ("standard", "layered"):   # interleaved, so load changes hit both alike
            cfg = load_config(None, [f"--data.path={data_dir}", "--model.n_layer=4", "--model.d_model=128",
                                     "--model.seq_len=64", "--train.batch_size=8", f"--train.grad_accum={grad_accum}",
                                     "--train.progress=false", "--layered_accumulation.enabled=true",
                                     "--train.device=cpu", "--train.precision=fp32",   # gloo CPU processes, on any machine
                                     f"--layered_accumulation.order={order}",
                                     f"--layered_accumulation.emulate_mbps={mbps}"])
            tr = Trainer(cfg)
            tech = tr.techniques[0]
            seg_bytes = [sum(p.numel() * p.element_size() for _, p in ps) for ps in tech.seg_params]
            tr.train_step()   # warm-up step, not measured
            tr.train_step()
            trace = tech.trace
            bwd = ([w for e, _, w in trace if e == "bwd_done"][-1]
                   - [w for e, _, w in trace if e == "bwd_start"][0])
            o = out.setdefault(order, dict(exposed=[], pred=[], bwd=[], t_dp=sum(seg_bytes) / (mbps * 1e6)))
            o["exposed"].append(tech.exposed_comm)
            o["pred"].append(predicted_exposed(trace, seg_bytes, mbps * 1e6))
            o["bwd"].append(bwd)
    if tr.accelerator.is_main_process:
        Path(out_dir, "lga.json").write_text(json.dumps(out))
    tr.accelerator.wait_for_everyone()


def measure_exposed_comm(data_dir: str | Path, mbps: float = 20.0, reps: int = 1, grad_accum: int = 4,
                         timeout_s: float = 300) -> list[dict]:
    """One row per order: reduction time t_dp, the backward window that can hide it, the measured
    exposed communication, and its predictions (serial link over the step's own trace, and the
    planner's closed form). Times in ms."""
    from ..core.launch import launch_processes
    with tempfile.TemporaryDirectory() as d:
        # spawn: a forked child cannot run backward once the parent has (the autograd engine's device threads on a
        # CUDA build; found running notebook 05 on an H200)
        launch_processes(_worker, (str(data_dir), d, mbps, reps, grad_accum), 2, timeout_s=timeout_s,
                         start_method="spawn")
        out = json.loads(Path(d, "lga.json").read_text())
    rows = []
    for order, o in out.items():
        t_dp, t_bwd = o["t_dp"], statistics.median(o["bwd"])
        layered = order == "layered"
        rows.append(dict(order=order, m=grad_accum, t_dp_ms=round(t_dp * 1e3, 1),
                         hiding_window_ms=round(t_bwd * 1e3, 1),
                         exposed_ms=round(statistics.median(o["exposed"]) * 1e3, 1),
                         pred_trace_ms=round(statistics.median(o["pred"]) * 1e3, 1),
                         pred_closed_form_ms=round(planner.exposed_dp_time(
                             t_dp, t_bwd * (1 if layered else grad_accum), grad_accum, 6, layered) * 1e3, 1)))
    return rows
