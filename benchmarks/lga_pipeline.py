"""Layered gradient accumulation inside the modular pipeline, measured against its prediction.

Lamy-Poirier 2021 (arXiv 2106.02679) §4-§5 and BFPP (arXiv 2211.05953) §3: in a looped, breadth-first
pipeline each stage's data-parallel gradient reduction can start right after the stage's last
micro-batch and overlap the backward of the rank's earlier stages (pipeline.reduce=per_stage),
instead of waiting for the end of the schedule (after_step).

1. Step time, 4 gloo processes through the trainer: 2 data-parallel pipelines x P = 2 ranks, v = 4
   stages per rank of one block each (the paper's modular pipeline, v = n_layer / P), m = 4
   micro-batches. Two CPU cores cannot show the schedule's real compute, so every block costs a fixed
   t_f (sleep; backward 2 t_f) and each process's data-parallel link is emulated (pipeline.emulate_mbps:
   one all-reduce at a time, bytes / bandwidth each). Arms, interleaved repetitions, medians:
       looped_bfs        after_step   every all-reduce after the schedule
       looped_bfs        per_stage    layered accumulation in the pipeline
       interleaved_1f1b  per_stage    depth first: the stages finish close together, less is hidden
   Predictions for the same configuration (t_red[s] = stage s's gradient bytes / bandwidth):
       simulated    accellib.parallel.simulate.simulate_dp: the schedule plus each stage's reduction
                    on the device's serial link
       closed form  m v 3 t_f (1 + planner.bubble(P, v, m)) + exposed, with exposed = t_dp (after_step)
                    or planner.exposed_dp_time(t_dp, m v 2 t_f, m, v, layered=True) (per_stage),
                    t_dp = the rank's total reduction time, the worst rank
   Each arm also runs at zero cost (no sleep, real loopback link): the framework's own overhead (gloo
   messages, Python, the trainer's clip and AdamW), which neither prediction models; err_sim compares
   the raw step time with the simulation, err_net the step time less that overhead.
2. The ZeRO half (layered_accumulation.shard=true) on the same 4 processes: bytes each process
   all-gathers and reduce-scatters per step, counted by the engine, beside
   zero_layered.closed_form_volume; layered order (2 gathers per layer) vs standard (2 m).

    python benchmarks/lga_pipeline.py            # about 4 minutes
    python benchmarks/lga_pipeline.py --quick    # smoke test (tests/test_lga_pipeline.py)
writes results/lga_pipeline_cpu.json (--out to write elsewhere).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accellib.analysis import planner  # noqa: E402
from accellib.parallel.engine import Stage  # noqa: E402
from accellib.drivers.timing import time_on_processes
from accellib.parallel.comm import ring_factor  # noqa: E402
from accellib.parallel.pipeline import split_layers  # noqa: E402
from accellib.parallel.simulate import exposed_comm, simulate_dp, step_time  # noqa: E402
from accellib.parallel.zero_layered import closed_form_volume, layer_params  # noqa: E402
from accellib.core.records import table, write_json  # noqa: E402

P, DP, V, M, N_LAYER = 2, 2, 4, 4, 8
MODEL = {"model.n_layer": N_LAYER, "model.d_model": 64, "model.n_head": 2, "model.seq_len": 16,
         "model.tie_head": False}
ARMS = [("looped_bfs", "after_step"), ("looped_bfs", "per_stage"), ("interleaved_1f1b", "per_stage")]


def _model(**extra):
    """The benchmark's model as the trainer builds it (the vocabulary from the data's meta.json)."""
    from accellib.core.config import load_config
    from accellib.models.transformer import Transformer
    from accellib.core.tasks import make_task
    over = {"data.path": ROOT / "data" / "shakespeare", **MODEL, **extra}
    cfg = load_config(None, [f"--{k}={v}" for k, v in over.items()])
    make_task(cfg).configure()
    return Transformer(cfg.model)


def stage_bytes() -> list[int]:
    """Gradient bytes of each of the P v stages (the first with the embedding, the last with the head)."""
    model, S = _model(), P * V
    return [sum(p.numel() * p.element_size() for p in Stage(model, r, s == 0, s == S - 1).parameters())
            for s, r in enumerate(split_layers(N_LAYER, S))]


def predict(schedule: str, reduce: str, t_f: float, t_red: list[float]) -> dict:
    bpb = N_LAYER // (P * V)   # blocks per stage
    tasks = simulate_dp(schedule, P, V, M, bpb * t_f, 2 * bpb * t_f, t_red, reduce)
    work = M * V * 3 * bpb * t_f
    closed = 0.0
    for d in range(P):
        t_dp = sum(t_red[s] for s in range(d, P * V, P))
        exp = t_dp if reduce == "after_step" else planner.exposed_dp_time(t_dp, M * V * 2 * bpb * t_f, M, V, True)
        closed = max(closed, work * (1 + planner.bubble(P, V, M)) + exp)
    return dict(sim=step_time(tasks), closed=closed, exposed=max(exposed_comm(tasks, d) for d in range(P)))


def step_jobs(t_f: float, mbps: float, reps: int, steps: int, arms, overhead: bool = True):
    """Trainer overrides of every pipeline run, interleaved (A, B, C, A, B, C, ...), and their keys."""
    base = {"data.path": str(ROOT / "data" / "shakespeare"), **MODEL, "train.batch_size": M, "train.steps": steps,
            "train.progress": False, "train.log_every": steps, "pipeline.n_microbatches": M, "pipeline.dp": DP,
            "pipeline.stages_per_rank": V}
    jobs, keys = [], []
    for _ in range(reps):
        for sched, red in arms:
            for costed in (True, False) if overhead else (True,):
                kw = dict(base, **{"pipeline.schedule": sched, "pipeline.reduce": red,
                                   "pipeline.block_ms": t_f * 1e3 if costed else 0.0,
                                   "pipeline.emulate_mbps": mbps if costed else 0.0})
                jobs.append([f"--{k}={v}" for k, v in kw.items()])
                keys.append((sched, red, costed))
    return jobs, keys


def step_rows(res: list, keys: list, t_f: float, mbps: float, arms, overhead: bool) -> list[dict]:
    link = [ring_factor("all_reduce", DP) * b / (mbps * 1e6) for b in stage_bytes()]
    rows = []
    for sched, red in arms:
        def med(costed: bool, field: str) -> float:
            # a step ends when the slowest process ends: max over ranks, then the median over steps and reps
            # (the first step of each run is a warm-up)
            vals = []
            for r, key in zip(res, keys):
                if key == (sched, red, costed):
                    for k in range(1, len(r["times"][0])):
                        vals.append(max(t[k] for t in r["times"]) if field == "time"
                                    else max(mr[k]["exposed_comm_s"] for mr in r["metrics"]))
            return statistics.median(vals)
        t, e = med(True, "time"), med(True, "exposed")
        o = med(False, "time") if overhead else None
        pr = predict(sched, red, t_f, link)
        rows.append(dict(schedule=sched, reduce=red, step_ms=round(t * 1e3, 1), pred_sim_ms=round(pr["sim"] * 1e3, 1),
                         # the closed form assumes breadth-first order (stages finish m micro-batches apart)
                         pred_closed_ms=round(pr["closed"] * 1e3, 1) if sched == "looped_bfs" else None,
                         err_sim=round(t / pr["sim"] - 1, 3), overhead_ms=None if o is None else round(o * 1e3, 1),
                         err_net=None if o is None else round((t - o) / pr["sim"] - 1, 3),
                         exposed_ms=round(e * 1e3, 1), pred_exposed_ms=round(pr["exposed"] * 1e3, 1)))
    return rows


ZERO = {"model.vocab_size": 260}   # every dimension divisible by the 4 processes: no padded shard
ORDERS = ("layered", "standard")


def zero_jobs(steps: int) -> list:
    """Sharded layered accumulation over the 4 processes (n = 4), in layered and in standard order."""
    base = {"data.path": str(ROOT / "data" / "shakespeare"), **MODEL, **ZERO, "train.batch_size": 1,
            "train.grad_accum": M, "train.steps": steps, "train.progress": False, "train.log_every": steps,
            "layered_accumulation.enabled": True, "layered_accumulation.shard": True}
    return [[f"--{k}={v}" for k, v in dict(base, **{"layered_accumulation.order": o}).items()] for o in ORDERS]


def zero_rows(res: list) -> list[dict]:
    """Bytes each process sent in the last step (counted by the engine) vs closed_form_volume."""
    n = P * DP
    layers, n_params = layer_params(_model(**ZERO))
    rows = []
    for o, r in zip(ORDERS, res):
        want = closed_form_volume(layers, n_params, n, M, o == "layered", beta=4)
        got = [mr[-1] for mr in r["metrics"]]   # every process, last step
        rows.append(dict(order=o, processes=n, m=M, params=n_params,
                         all_gather_mb=max(g["all_gather_mb"] for g in got),
                         closed_all_gather_mb=round(want["all_gather"] / 1e6, 6),
                         reduce_scatter_mb=max(g["reduce_scatter_mb"] for g in got),
                         closed_reduce_scatter_mb=round(want["reduce_scatter"] / 1e6, 6),
                         allreduce_mb_unsharded=round(ring_factor("all_reduce", n) * 4 * n_params / 1e6, 6)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results" / "lga_pipeline_cpu.json"))
    a = ap.parse_args()
    # the link: a stage's reduction takes about 6 t_f, between the gap of interleaved 1F1B's stage
    # finishes (P x 2 t_f) and breadth-first's (m x 2 t_f), so the two orders hide different amounts
    t_f = 0.004 if a.quick else 0.04
    mbps = round(max(stage_bytes()[1:-1]) / (6 * t_f) / 1e6, 3)
    arms, overhead = (ARMS[:2], False) if a.quick else (ARMS, True)
    jobs, keys = step_jobs(t_f, mbps, reps=1 if a.quick else 3, steps=2 if a.quick else 4, arms=arms, overhead=overhead)
    res = time_on_processes(jobs + zero_jobs(1 if a.quick else 2), P * DP, timeout_s=900)   # one launch
    rows = step_rows(res[:len(jobs)], keys, t_f, mbps, arms, overhead)
    vol = zero_rows(res[len(jobs):])
    print(f"layered accumulation in the pipeline: {DP} x {P} gloo processes, v={V}, m={M}, {t_f * 1e3:g} ms "
          f"per block forward, emulated link {mbps} MB/s; ms, medians")
    print(table(rows))
    print("\nZeRO half: MB each process sends per step (counted) vs the closed form")
    print(table(vol))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, dict(quick=a.quick, config=dict(P=P, dp=DP, v=V, m=M, n_layer=N_LAYER, block_ms=t_f * 1e3,
                                                   link_mbps=mbps, stage_kb=[round(b / 1e3, 1) for b in stage_bytes()]),
                         step=rows, zero_volume=vol))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
