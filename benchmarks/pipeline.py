"""Pipeline bubble and exposed data-parallel communication, measured vs predicted.

1. GPipe vs Interleaved1F1B vs LoopedBFS (torch.distributed.pipelining, 4 gloo processes, through the trainer). Two CPU
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
    python benchmarks/pipeline.py --only pipeline      # re-measure one part, keep the other part of the JSON
Interleaved repetitions (A, B, C, A, B, C, ...), medians; writes results/pipeline_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accellib.analysis import planner  # noqa: E402
from accellib.drivers.comm_overlap import measure_exposed_comm  # noqa: E402
from accellib.drivers.timing import time_on_processes  # noqa: E402
from accellib.core.records import table, write_json  # noqa: E402


def pipeline_bench(P: int, m: int, v: int, n_layer: int, t_layer: float, reps: int, steps: int):
    """Each schedule twice per repetition, through the one trainer (accellib.drivers.timing.time_on_processes):
    with the fixed per-block cost, and with zero cost. The zero-cost run measures the schedule's own
    overhead o (gloo messages, Python, the trainer's clip and AdamW step), which the closed form does not
    model; the bubble is reported raw and net of it."""
    arms = [("gpipe", 1), ("interleaved_1f1b", v), ("looped_bfs", v)]
    base = {"data.path": str(ROOT / "data" / "shakespeare"), "model.n_layer": n_layer, "model.d_model": 16,
            "model.n_head": 2, "model.seq_len": 8, "train.batch_size": m, "train.steps": steps,
            "train.progress": False, "train.log_every": steps, "pipeline.n_microbatches": m}
    jobs, keys = [], []
    for _ in range(reps):
        for sched, vv in arms:
            for ms in (t_layer * 1e3, 0.0):
                kw = dict(base, **{"pipeline.schedule": sched, "pipeline.stages_per_rank": vv, "pipeline.block_ms": ms})
                jobs.append([f"--{k}={val}" for k, val in kw.items()])
                keys.append((sched, ms > 0))
    res = time_on_processes(jobs, P, timeout_s=900)
    work = m * n_layer / P * 3 * t_layer
    rows = []
    for sched, vv in arms:
        def step_time(costed: bool) -> float:
            # a step ends when the slowest rank ends: max over ranks, then median over steps and reps
            return statistics.median(max(t[k] for t in r["times"]) for r, key in zip(res, keys)
                                     if key == (sched, costed) for k in range(1, steps))
        t, o = step_time(True), step_time(False)
        pred = planner.bubble(P, vv, m, "looped" if vv > 1 else "contiguous")
        rows.append(dict(schedule=sched, P=P, v=vv, m=m, step_ms=round(t * 1e3, 1),
                         pred_step_ms=round(work * (1 + pred) * 1e3, 1), overhead_ms=round(o * 1e3, 1),
                         bubble=round(t / work - 1, 3), bubble_net=round((t - o) / work - 1, 3),
                         pred_bubble=round(pred, 3)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["pipeline", "layered_accumulation"],
                    help="measure one part and keep the other part of the committed JSON as it is")
    a = ap.parse_args()
    out = ROOT / "results" / ("pipeline_cpu_quick.json" if a.quick else "pipeline_cpu.json")
    kept = json.loads(out.read_text()) if a.only and out.is_file() else {}
    if a.only == "pipeline":
        pipe = pipeline_bench(P=4, m=4, v=2, n_layer=8, t_layer=0.025, reps=3, steps=4)
        pipe += pipeline_bench(P=4, m=8, v=2, n_layer=8, t_layer=0.025, reps=3, steps=4)
        lga = kept["layered_accumulation"]
    elif a.only == "layered_accumulation":
        pipe = kept["pipeline"]
        lga = measure_exposed_comm(ROOT / "data" / "shakespeare", mbps=20.0, reps=5, grad_accum=4, timeout_s=600)
    elif a.quick:
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
    out.parent.mkdir(exist_ok=True)
    write_json(out, dict(quick=a.quick, pipeline=pipe, layered_accumulation=lga))
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
