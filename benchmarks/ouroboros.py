"""Ouroboros (Yang et al., NeurIPS 2019, arXiv 1909.06695) on real gloo processes, measured vs its timeline.

Every arm trains through the one trainer (accellib.train.training_function in each process). Two CPU
cores cannot show a 3-process speed-up, so each block gets a fixed, known cost: its forward sleeps
block_ms and its backward 2 block_ms (sleeping uses no core; the tiny model's own compute is small).
For K = 3 (2 processes) and K = 4 (3 processes), all on the same K-1 processes:

    delayed   Ouroboros, the default balanced split (ouroboros.delayed=true)
    locked    the same split backward-locked: plain backprop through the K modules, the paper's baseline
    dp        data parallelism: the plain trainer with the batch split over the K-1 processes; the script
              patches in the same sleeping Function after the block loop (Transformer.head), with the L
              blocks' cost scaled by local batch / full batch: one sleep per forward and per backward, as
              the engine's stages sleep once per module (each wake-up on a loaded box costs a little)

Ideal step times come from the timeline (accellib.parallel.simulate.ouroboros_step_time; data parallel:
(t_f + t_b) L / (K-1)). Each arm is run again at block_ms = 0: its fixed framework overhead (the
model's compute: GPT, 6 blocks, d_model 16, 16 tokens, batch 12; gloo messages; Python), which the
ideal leaves out; `net` subtracts it. Per-step time is the difference of `wall` between consecutive
metrics records (log_every 1) on process 0, skipping the first K steps (the K-1 warm-up iterations
and the first step's start-up); median over steps and repetitions, the arms interleaved (A, B, C, A, B, C).

Convergence at equal steps: the single-process references (bitwise equal to the multi-process runs,
tests/test_ouroboros.py) of delayed K=3 and K=4 against the baseline, configs/tutorial.yaml, 300 steps.

    python benchmarks/ouroboros.py            # about 5 minutes on 2 cores; writes results/ouroboros_cpu.json
    python benchmarks/ouroboros.py --quick    # smoke test; writes runs/ouroboros_cpu_quick.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import accelerate  # noqa: E402
import torch  # noqa: E402

from accellib.drivers.arms import arm_configs  # noqa: E402
from accellib.core.config import load_config  # noqa: E402
from accellib.core.launch import launch_processes  # noqa: E402
from accellib.core.records import read_metrics, table, write_json  # noqa: E402
from accellib.parallel.ouroboros import default_split  # noqa: E402
from accellib.parallel.simulate import ouroboros_step_time  # noqa: E402

ARMS = ("delayed", "locked", "dp")
MODEL = {"model.n_layer": 6, "model.d_model": 16, "model.n_head": 2, "model.seq_len": 16, "model.tie_head": False}


def job_overrides(job: dict, data: Path) -> list[str]:
    k, arm = job["k"], job["arm"]
    kw = {**MODEL, "data.path": str(data), "train.steps": job["steps"], "train.batch_size": job["batch"],
          "train.log_every": 1, "train.eval_every": 0, "train.eval_windows": 8, "train.checkpoint_every": 0,
          "train.progress": False, "optim.warmup_steps": 2}
    if arm == "dp":
        kw["train.batch_size"] = job["batch"] // (k - 1)
    else:
        kw.update({"ouroboros.enabled": True, "ouroboros.modules": k, "ouroboros.delayed": arm == "delayed",
                   "ouroboros.block_ms": job["block_ms"]})
    return [f"--{a}={b}" for a, b in kw.items()]


def _worker(jobs: list[dict], data: Path, tmp: Path) -> None:
    """One process of the group: every job in order, through the trainer."""
    from accellib.models import transformer as M
    from accellib.parallel.engine import FixedCost
    from accellib.train import training_function
    plain = M.Transformer.head
    for n, job in enumerate(jobs):
        if job["arm"] == "dp" and job["block_ms"] > 0:
            # the L blocks' cost on local batch / full batch, in one sleep per forward and one per backward
            # after the last block, as the engine's Stage sleeps once per module
            s = job["block_ms"] / 1e3 * MODEL["model.n_layer"] / (job["k"] - 1)

            def costly(self, x, _s=s):
                return plain(self, FixedCost.apply(x, _s, 2 * _s))
            M.Transformer.head = costly
        try:
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):   # the per-step log lines
                training_function(load_config(None, job_overrides(job, data)), tmp / f"job{n}")
        finally:
            M.Transformer.head = plain


def step_times(run: Path, skip: int) -> list[float]:
    walls = [r["wall"] for r in read_metrics(run)]
    return [b - a for a, b in zip(walls[skip - 1:], walls[skip:])]   # steps skip+1, skip+2, ...


def ideal(arm: str, k: int, L: int, block_ms: float) -> float:
    t_f, t_b = block_ms / 1e3, 2 * block_ms / 1e3
    if arm == "dp":
        return (t_f + t_b) * L / (k - 1)
    return ouroboros_step_time(default_split(L, k), t_f, t_b, delayed=arm == "delayed")


def bench(k: int, block_ms: float, batch: int, steps: int, reps: int, data: Path) -> list[dict]:
    """All arms at block_ms and at 0, interleaved, in one group of K-1 processes."""
    jobs = [dict(k=k, arm=arm, block_ms=ms, batch=batch, steps=steps, rep=r)
            for r in range(reps) for ms in (block_ms, 0.0) for arm in ARMS]
    with tempfile.TemporaryDirectory() as d:
        launch_processes(_worker, (jobs, data, Path(d)), k - 1, timeout_s=590, start_method="spawn")
        times = [step_times(Path(d) / f"job{n}", skip=k) for n in range(len(jobs))]
    L = MODEL["model.n_layer"]
    rows = []
    for arm in ARMS:
        def med(ms):
            return statistics.median(x for j, ts in zip(jobs, times) if j["arm"] == arm and j["block_ms"] == ms
                                     for x in ts)
        t, o, want = med(block_ms), med(0.0), ideal(arm, k, L, block_ms)
        n = sum(len(ts) for j, ts in zip(jobs, times) if j["arm"] == arm and j["block_ms"] == block_ms)
        rows.append(dict(K=k, processes=k - 1, arm=arm, split=default_split(L, k) if arm != "dp" else None,
                         step_ms=round(t * 1e3, 1), ideal_ms=round(want * 1e3, 1), overhead_ms=round(o * 1e3, 1),
                         ratio=round(t / want, 3), ratio_net=round((t - o) / want, 3), samples=n))
    return rows


def convergence(steps: int, ks: list[int], data: Path) -> dict:
    """Single-process references at equal steps on the tutorial config: val loss and the gap to backprop."""
    from accelerate.state import AcceleratorState
    from accellib.train import training_function
    runs = {"baseline": []} | {f"ouroboros_K{k}": ["--ouroboros.enabled=true", f"--ouroboros.modules={k}"]
                               for k in ks}
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, extra in runs.items():
            over = [f"--data.path={data}", "--train.progress=false", f"--train.steps={steps}", *extra]
            t0 = time.perf_counter()
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                final = training_function(arm_configs(ROOT / "configs" / "tutorial.yaml", ["baseline"], over)
                                          ["baseline"], Path(d) / name)
            AcceleratorState._reset_state(reset_partial_state=True)
            curve = [{k: r[k] for k in ("step", "train_loss", "val_loss") if k in r}
                     for r in read_metrics(Path(d) / name)]
            out[name] = dict(val_loss=final["val_loss"], seconds=round(time.perf_counter() - t0, 1), curve=curve)
    base = out["baseline"]["val_loss"]
    for name in out:
        out[name]["gap_to_baseline"] = round(out[name]["val_loss"] - base, 5)
    res = dict(config="configs/tutorial.yaml", steps=steps, seed=1337, runs=out)
    cache = ROOT / "results" / "tutorial_steps.json"
    if steps == 300 and cache.exists():   # the same baseline run in the results cache (seed 1337)
        row = next(r for r in json.loads(cache.read_text())["summary"]["rows"] if r["arm"] == "baseline")
        res["baseline_in_tutorial_steps"] = row["val_losses"][0]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    data = ROOT / "data" / "shakespeare"
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    if a.quick:
        block_ms, batch, steps, reps, ks, conv_steps = 10.0, 12, 5, 1, [3], 10
    else:
        block_ms, batch, steps, reps, ks, conv_steps = 30.0, 12, 12, 5, [3, 4], 300
    rows = []
    for k in ks:
        rows += bench(k, block_ms, batch, steps, reps, data)
    by = {(r["K"], r["arm"]): r for r in rows}
    speed = [dict(K=k, vs_locked=round(by[k, "locked"]["step_ms"] / by[k, "delayed"]["step_ms"], 3),
                  vs_locked_ideal=round(by[k, "locked"]["ideal_ms"] / by[k, "delayed"]["ideal_ms"], 3),
                  vs_dp=round(by[k, "dp"]["step_ms"] / by[k, "delayed"]["step_ms"], 3),
                  vs_dp_ideal=round(by[k, "dp"]["ideal_ms"] / by[k, "delayed"]["ideal_ms"], 3)) for k in ks]
    conv = convergence(conv_steps, ks, data)
    wall = round(time.perf_counter() - t0, 1)

    print(f"step time per arm (block_ms={block_ms}: forward block_ms, backward 2 block_ms per block; "
          f"n_layer=6, batch {batch}; ratio = measured / ideal, net = after subtracting the block_ms=0 overhead):")
    print(table(rows, skip=("samples",)))
    print("\nspeed-up of Ouroboros (delayed) = other arm's step time / Ouroboros's (measured; ideal):")
    print(table(speed))
    print(f"\nconvergence at equal steps ({conv_steps} steps, configs/tutorial.yaml, seed 1337, "
          "single-process references):")
    for name, r in conv["runs"].items():
        print(f"  {name:>14}: val_loss {r['val_loss']:.4f}  gap {r['gap_to_baseline']:+.4f}  ({r['seconds']} s)")
    if "baseline_in_tutorial_steps" in conv:
        print("  (the same baseline in results/tutorial_steps.json, seed 1337: "
              f"{conv['baseline_in_tutorial_steps']:.4f})")
    print(f"\ntotal {wall} s")

    res = dict(name="ouroboros_cpu", quick=a.quick,
               command="python benchmarks/ouroboros.py" + (" --quick" if a.quick else ""),
               wall_seconds=wall, block_ms=block_ms, batch=batch, steps_per_run=steps, reps=reps,
               model={k.split(".")[1]: v for k, v in MODEL.items()}, step_times=rows, speedup=speed,
               convergence=conv,
               environment=dict(torch=torch.__version__, accelerate=accelerate.__version__,
                                python=platform.python_version(), cpus=os.cpu_count(),
                                omp_num_threads=os.environ.get("OMP_NUM_THREADS"), backend="gloo (CPU)",
                                load_average_1min=[round(load0, 2), round(os.getloadavg()[0], 2)]),
               definitions=dict(step_ms="median per-step time on process 0 (wall difference between metrics records)",
                                ideal_ms="the timeline's steady-state step (ouroboros_step_time; "
                                         "dp: (t_f + t_b) L / (K-1))",
                                overhead_ms="the same arm at block_ms=0", ratio="step_ms / ideal_ms",
                                ratio_net="(step_ms - overhead_ms) / ideal_ms",
                                vs_locked="locked step / delayed step", vs_dp="dp step / delayed step"))
    out = ROOT / ("runs/ouroboros_cpu_quick.json" if a.quick else "results/ouroboros_cpu.json")
    out.parent.mkdir(exist_ok=True)
    write_json(out, res)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
