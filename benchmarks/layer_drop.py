"""PLD and SBLD against the baseline on CPU, in one run (issue 3's benchmark).

(a) Equal steps: total step wall and CPU time of PLD / SBLD (theta already at its floor) over the baseline's,
    24 steps each interleaved A, B, C, A, B, C, ..., next to the FLOPs ratio of the same steps. Target: the realised
    time saving is >= 80% of the FLOPs saving.
(b) To a target: FLOPs and training wall time until the validation loss first reaches the same
    seed's baseline final loss (x-axes: FLOPs and process CPU time, which is less disturbed than
    wall time by other jobs on a shared machine), for PLD and SBLD at theta_bar in {0.5, 0.7, 0.9}, 3 seeds, runs
    interleaved by seed. An arm that never reaches it is reported with its final gap, its loss gain
    at equal FLOPs, and its gain over a compute-matched baseline (the baseline trained with its own
    schedule for the arm's FLOPs: the fair control).

    python benchmarks/layer_drop.py          # ~12 min on 1 core
    python benchmarks/layer_drop.py --quick                              # smoke run, ~1 min
Writes results/layer_drop_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from accellib.core.config import load_config  # noqa: E402
from accellib.core.records import write_json  # noqa: E402
from accellib.analysis.stats import Paired, from_gaps  # noqa: E402
from accellib.core.trainer import Trainer  # noqa: E402

# (a) times the brief's model; (b) needs 21 runs of 400 steps, so it uses a narrower, shorter-context one
MODEL_A = {"model.n_layer": 8, "model.d_model": 128, "model.n_head": 4, "model.seq_len": 128}
MODEL_B = {"model.n_layer": 8, "model.d_model": 64, "model.n_head": 4, "model.seq_len": 64}


def make(arm: str, theta: float, seed: int, steps: int, quick: bool, model=MODEL_B) -> Trainer:
    kw = dict(model, **{"data.path": str(ROOT / "data/shakespeare"), "train.steps": steps,
                        "train.batch_size": 16, "train.seed": seed, "train.progress": False,
                        "train.eval_windows": 16 if quick else 32, "train.threads": 1,
                        "optim.warmup_steps": max(2, steps // 10)})
    gamma = 6.0 / steps  # theta - theta_bar falls to 5% at half the run
    if arm == "pld":
        kw.update({"pld.enabled": True, "pld.theta_bar": theta, "pld.gamma": gamma})
    elif arm == "sbld":
        kw.update({"sbld.enabled": True, "sbld.theta_bar": theta, "sbld.gamma": gamma,
                   "sbld.profile_step": max(2, steps // 8), "sbld.profile_batches": 4})
    return Trainer(load_config(None, [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in kw.items()]))


def equal_steps(reps: int) -> list[dict]:
    """(a): the technique's schedule moved to its floor, then interleaved timed steps."""
    arms = {a: make(a, 0.5, 0, 1000, False, MODEL_A) for a in ("baseline", "pld", "sbld")}
    for tr in arms.values():  # warm-up; SBLD profiles at step 125, so jump past it
        for tech in tr.techniques:
            if tech.name == "sbld":
                tech.W = 2
        for _ in range(3):
            tr.train_step()
        tr.state.step = 900   # theta(900) = theta_bar + 0.5 * exp(-5.4): at the floor
    times, cpu, flops = ({a: [] for a in arms} for _ in range(3))
    for _ in range(reps):
        for a, tr in arms.items():
            f0 = tr.state.flops
            t0, c0 = time.perf_counter(), time.process_time()
            tr.train_step()
            times[a].append(time.perf_counter() - t0)
            cpu[a].append(time.process_time() - c0)
            flops[a].append(tr.state.flops - f0)
    # totals over the same interleaved steps: PLD's per-step cost is multimodal (each step draws its
    # own number of blocks), so a median time beside a mean FLOP count would compare different things
    tot = lambda xs: sum(xs)
    base_t, base_c, base_f = tot(times["baseline"]), tot(cpu["baseline"]), tot(flops["baseline"])
    rows = []
    for a in arms:
        t_ratio = tot(times[a]) / base_t
        f_ratio = tot(flops[a]) / base_f
        rows.append(dict(arm=a, step_ms=1000 * tot(times[a]) / len(times[a]), time_ratio=t_ratio,
                         cpu_ratio=tot(cpu[a]) / base_c, flops_ratio=f_ratio,
                         saving_realised=(1 - t_ratio) / (1 - f_ratio) if f_ratio < 1 else None))
    return rows


def train_curve(tr: Trainer, steps: int, every: int) -> list[dict]:
    out, cpu = [], 0.0
    while tr.state.step < steps:
        c0 = time.process_time()
        tr.train_step()   # SBLD's profiling runs inside (step_end), so its cost is counted
        cpu += time.process_time() - c0
        if tr.state.step % every == 0 or tr.state.step == steps:
            out.append(dict(step=tr.state.step, flops=tr.state.flops, wall=cpu, **tr.evaluate()))
    return out


def reach(curve: list[dict], target: float):
    """First (flops, CPU time) where val_loss <= target, linearly interpolated between evaluations."""
    prev = None
    for c in curve:
        if c["val_loss"] <= target:
            if prev is None:
                return c["flops"], c["wall"]
            a = (prev["val_loss"] - target) / (prev["val_loss"] - c["val_loss"])
            return (prev["flops"] + a * (c["flops"] - prev["flops"]), prev["wall"] + a * (c["wall"] - prev["wall"]))
        prev = c
    return None


def at_flops(curve: list[dict], flops: float) -> float:
    """The curve's val loss when it had used `flops`, linearly interpolated between evaluations."""
    prev = None
    for c in curve:
        if c["flops"] >= flops:
            if prev is None:
                return c["val_loss"]
            a = (flops - prev["flops"]) / (c["flops"] - prev["flops"])
            return prev["val_loss"] + a * (c["val_loss"] - prev["val_loss"])
        prev = c
    return curve[-1]["val_loss"]


def to_target(seeds: list[int], thetas: list[float], steps: int, every: int, quick: bool) -> list[dict]:
    arms = [("baseline", 1.0)] + [(a, th) for a in ("pld", "sbld") for th in thetas]
    curves = {}
    for seed in seeds:  # interleaved: every arm once per seed
        for a, th in arms:
            curves[(a, th, seed)] = train_curve(make(a, th, seed, steps, quick), steps, every)
    # compute-matched baselines: the baseline with its own full LR schedule, shortened to the arm's
    # FLOPs (the fair control: reading the long baseline mid-run, before its LR has annealed,
    # flatters every arm that uses fewer FLOPs)
    matched = {}
    for seed in seeds:
        base_flops = curves[("baseline", 1.0, seed)][-1]["flops"]
        for a, th in arms[1:]:
            n = max(every, round(steps * curves[(a, th, seed)][-1]["flops"] / base_flops))
            if (n, seed) not in matched:
                matched[(n, seed)] = train_curve(make("baseline", 1.0, seed, n, quick), n, every)[-1]["val_loss"]
            curves[(a, th, seed, "matched")] = matched[(n, seed)]
    rows = []
    for a, th in arms:
        per = []
        for seed in seeds:
            base = curves[("baseline", 1.0, seed)]
            c = curves[(a, th, seed)]
            target = base[-1]["val_loss"]
            r, b = reach(c, target), reach(base, target)
            per.append(dict(final=c[-1]["val_loss"], gap=c[-1]["val_loss"] - target,
                            gain_at_flops=at_flops(base, c[-1]["flops"]) - c[-1]["val_loss"],
                            gain_vs_matched=curves.get((a, th, seed, "matched"), c[-1]["val_loss"]) - c[-1]["val_loss"],
                            flops_ratio=r[0] / b[0] if r else None, wall_ratio=r[1] / b[1] if r else None,
                            final_flops_ratio=c[-1]["flops"] / base[-1]["flops"],
                            final_wall_ratio=c[-1]["wall"] / base[-1]["wall"]))
        reached = [p for p in per if p["flops_ratio"] is not None]
        med = lambda k, ps: statistics.median(p[k] for p in ps) if ps else None
        rows.append(dict(arm=a, theta_bar=th, reached=f"{len(reached)}/{len(seeds)}",
                         final_val=med("final", per), gap=med("gap", per),
                         gain_at_equal_flops=med("gain_at_flops", per),
                         gain_vs_matched_baseline=med("gain_vs_matched", per),
                         flops_to_target=med("flops_ratio", reached), wall_to_target=med("wall_ratio", reached),
                         flops_equal_steps=med("final_flops_ratio", per), wall_equal_steps=med("final_wall_ratio", per),
                         # the one rule (accellib.analysis.stats): arm - compute-matched baseline, paired by seed
                         vs_matched=None if a == "baseline" else
                         from_gaps([-p["gain_vs_matched"] for p in per]).to_dict()))
    return rows


def fmt(v, spec):
    return format(v, spec) if v is not None else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    q = args.quick
    t0 = time.time()
    a = equal_steps(3 if q else 24)
    print("(a) equal steps, theta at its floor (theta_bar=0.5), 8 layers d=128 seq 128 batch 16, 1 thread")
    print(f"{'arm':<10}{'step ms':>9}{'xwall':>8}{'xCPU':>8}{'xFLOPs':>8}{'wall saving / FLOP saving':>27}")
    for r in a:
        print(f"{r['arm']:<10}{r['step_ms']:>9.1f}{r['time_ratio']:>8.3f}{r['cpu_ratio']:>8.3f}{r['flops_ratio']:>8.3f}"
              f"{fmt(r['saving_realised'], '>27.2f')}")
    seeds, thetas = ([0], [0.5]) if q else ([0, 1, 2], [0.5, 0.7, 0.9])
    steps, every = (30, 10) if q else (400, 40)
    b = to_target(seeds, thetas, steps, every, q)
    print(f"\n(b) 8 layers d=64 seq 64 batch 16, {steps} steps; target = the same seed's baseline final val loss;"
          f" medians over {len(seeds)} seeds; time = process CPU time")
    print(f"{'arm':<10}{'theta':>6}{'reached':>8}{'val':>8}{'gap':>8}{'gain@=F':>9}{'gain/m':>8}{'xFLOPs->tgt':>12}{'xCPU->tgt':>11}"
          f"{'xFLOPs@T':>10}{'xCPU@T':>9}")
    for r in b:
        print(f"{r['arm']:<10}{r['theta_bar']:>6.1f}{r['reached']:>8}{r['final_val']:>8.3f}{r['gap']:>8.3f}"
              f"{r['gain_at_equal_flops']:>9.3f}{r['gain_vs_matched_baseline']:>8.3f}"
              f"{fmt(r['flops_to_target'], '>12.3f')}{fmt(r['wall_to_target'], '>11.3f')}"
              f"{r['flops_equal_steps']:>10.3f}{r['wall_equal_steps']:>9.3f}")
    print("gap = final val - the same seed's baseline final (equal steps); gain@=F = the baseline's val loss "
          "at the arm's total FLOPs - the arm's final val;\ngain/m = the final val of a baseline trained with its own "
          "schedule for the arm's FLOPs - the arm's final val (the fair control); medians over seeds, shown, not judged")
    print("\nthe verdict (accellib.analysis.stats: arm - its compute-matched baseline, paired by seed, 95% t-interval):")
    for r in b:
        if r["vs_matched"] is not None:
            print(f"  {r['arm']:<6} theta {r['theta_bar']:.1f}: {Paired.from_dict(r['vs_matched']).text()}")
    print(f"\ntotal {time.time() - t0:.0f} s")
    out = ROOT / "results" / "layer_drop_cpu.json"
    if not q:
        out.parent.mkdir(exist_ok=True)
        write_json(out, dict(equal_steps=a, to_target=b, steps=steps, seeds=seeds, model_a=MODEL_A,
                             model_b=MODEL_B, threads=1, batch_size=16, torch=torch.__version__))
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
