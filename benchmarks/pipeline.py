"""Pipeline bubble and exposed data-parallel communication, measured vs predicted.

1. GPipe vs Interleaved1F1B vs LoopedBFS (torch.distributed.pipelining, 4 gloo processes). Two CPU
   cores cannot show a 4-way speed-up, so every layer gets a fixed, known cost (forward sleeps
   t_f, backward 2 t_f; compute of the tiny model is negligible). The same total work (n_layer
   layers) is cut into P stages (GPipe) or v P stages (looped): measured bubble
       rho = step time / (work per rank) - 1,  work per rank = m (n_layer / P) 3 t_f
   next to planner.bubble(P, v, m). The same schedule at zero stage cost measures its fixed
   framework overhead (gloo messages, Python), which the closed form leaves out; `bubble_net`
   subtracts it.
2. Standard vs layered accumulation on 2 gloo processes with an emulated slow link (each layer's
   reduction takes bytes / bandwidth on one communication thread, the real transfer included): exposed communication (time from the end of
   the backward to the last reduction) vs the serial-link prediction from the step's own trace.

    python benchmarks/pipeline.py          # a few minutes
    python benchmarks/pipeline.py --quick                                # smoke test
Interleaved repetitions (A, B, C, A, B, C, ...), medians; writes results/pipeline_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accellib import planner  # noqa: E402
from accellib.parallel.comm_overlap import measure_exposed_comm  # noqa: E402
from accellib.parallel.pipeline import spawn  # noqa: E402


def pipeline_bench(P: int, m: int, v: int, n_layer: int, t_layer: float, reps: int, steps: int):
    """Each schedule twice per repetition: with the fixed stage cost, and with zero cost. The
    zero-cost run measures the schedule's own framework overhead o (gloo messages, Python), which
    the closed form does not model; the bubble is reported raw and net of it."""
    arms = [("gpipe", 1), ("interleaved_1f1b", v), ("looped_bfs", v)]
    jobs = []
    for _ in range(reps):
        for sched, vv in arms:
            per_stage = t_layer * n_layer / (P * vv)
            for cost in ((per_stage, 2 * per_stage), (0.0, 0.0)):
                jobs.append(dict(schedule=sched, v=vv, n_mb=m, batch=m, steps=steps, n_layer=n_layer,
                                 d_model=16, seq_len=8, cost=cost))
    with tempfile.TemporaryDirectory() as d:
        res = spawn(jobs, P, d, timeout_s=500)
    work = m * n_layer / P * 3 * t_layer
    rows = []
    for sched, vv in arms:
        def step_time(costed: bool) -> float:
            # a step ends when the slowest rank ends: max over ranks, then median over steps and reps
            return statistics.median(max(res[r][j]["times"][k] for r in range(P))
                                     for j, job in enumerate(jobs)
                                     if job["schedule"] == sched and (job["cost"][0] > 0) == costed
                                     for k in range(1, steps))
        t, o = step_time(True), step_time(False)
        pred = planner.bubble(P, vv, m, "looped" if vv > 1 else "contiguous")
        rows.append(dict(schedule=sched, P=P, v=vv, m=m, step_ms=round(t * 1e3, 1),
                         pred_step_ms=round(work * (1 + pred) * 1e3, 1), overhead_ms=round(o * 1e3, 1),
                         bubble=round(t / work - 1, 3), bubble_net=round((t - o) / work - 1, 3),
                         pred_bubble=round(pred, 3)))
    return rows


def table(rows):
    keys = list(rows[0])
    lines = [" | ".join(f"{k:>14}" for k in keys)]
    lines += [" | ".join(f"{str(r[k]):>14}" for k in keys) for r in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        pipe = pipeline_bench(P=4, m=4, v=2, n_layer=8, t_layer=0.004, reps=1, steps=3)
        lga = measure_exposed_comm(ROOT / "data" / "shakespeare", mbps=20.0, reps=1, grad_accum=4)
    else:
        pipe = pipeline_bench(P=4, m=4, v=2, n_layer=8, t_layer=0.025, reps=3, steps=4)
        pipe += pipeline_bench(P=4, m=8, v=2, n_layer=8, t_layer=0.025, reps=3, steps=4)
        lga = measure_exposed_comm(ROOT / "data" / "shakespeare", mbps=20.0, reps=5, grad_accum=4, timeout_s=600)
    print("pipeline (4 gloo processes, fixed stage cost; overhead = the same schedule at zero cost;"
          " bubble_net = bubble after subtracting it):")
    print(table(pipe))
    print("\ndata-parallel reduction (2 gloo processes, emulated link 20 MB/s):")
    print(table(lga))
    out = ROOT / "results" / ("pipeline_cpu_quick.json" if a.quick else "pipeline_cpu.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(quick=a.quick, pipeline=pipe, layered_accumulation=lga), indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
