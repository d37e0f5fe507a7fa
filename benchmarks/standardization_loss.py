"""The standardization loss (Collins, Ballé & Shlens, "Accelerating Training of Deep Neural Networks with a
Standardization Loss", arXiv 1903.00925, 2019) on CPU: the paper's MNIST CNN protocol at the scale of
scikit-learn's 8x8 digits, and our transformer variant. Every run goes through the one trainer loop
(`accellib.train.training_function`), one process per run, `--jobs` at once; a run that produces
non-finite numbers (accellib.core.trainer.TrainingError) is recorded as "diverged".

Parts (configs/digits_cnn.yaml: arms baseline = no normalisation, sl = standardization loss, bn = batch
norm shift only; plain SGD, batch 128, weight decay 4e-5, 1000 steps, constant LR; eval every 25 steps):
  main        none vs SL (w = 1) vs BN at the paper's lr 1e-3, 10 seeds, next to the paper's MNIST numbers
  lr          the same three arms at lr 1e-2 (5 seeds): at lr 1e-3 every arm is still slow after 1000 steps
  long        none and SL for 5000 steps at lr 1e-3 (3 seeds): how long the no-norm net takes to catch up
              (the paper: "the baseline needs ~5000 steps to match")
  w_sweep     SL with w = 1e-3 ... 1e3 in decades at lr 1e-3 (3 seeds): where it collapses
  batch       per-process batch 2, 8, 32, 128 for the three arms at lr 1e-2 and at lr 1e-3 (3 seeds), the same
              1000 steps for every batch (so the small batches see fewer examples), LR not rescaled
  to_target   from main and lr: the first evaluation step at which each seed reaches a target accuracy
  timing      the paired step time of the three arms (the cost of the hooks and the moments)
  transformer our variant (not in the paper), configs/tutorial.yaml: LN (the tutorial baseline) vs no LN vs
              no LN + SL on each MLP's c_fc pre-activation; a 1-seed pilot over w picks the weight, then 3 seeds

    python benchmarks/standardization_loss.py --jobs 2     # 5.5 min on 2 idle cores (17 min on a busy box): results/standardization_loss_cpu.json
    python benchmarks/standardization_loss.py --quick      # smoke run (40 steps, 1-2 seeds): runs/standardization_loss_quick/
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from accellib.analysis.stats import mean_sd  # noqa: E402
from accellib.core.records import environment, table, write_json  # noqa: E402

DIGITS = ROOT / "configs" / "digits_cnn.yaml"
TUTORIAL = ROOT / "configs" / "tutorial.yaml"
SEED0 = 1337
ARMS = ("baseline", "sl", "bn")
LABEL = {"baseline": "none", "sl": "SL", "bn": "BN"}
PAPER = {"source": "Collins, Ballé & Shlens 2019 (arXiv 1903.00925), MNIST CNN, 1000 steps, 10 runs, val accuracy",
         "baseline": (0.246, 0.065), "sl": (0.752, 0.026), "bn": (0.856, 0.011)}
W_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)
BATCHES = (2, 8, 32, 128)
TF_PILOT_W = (1e-3, 1e-2, 1e-1)
IMAGE_KEYS = ("step", "train_loss", "val_loss", "val_acc", "std_loss")
LM_KEYS = ("step", "train_loss", "val_loss", "std_loss", "grad_norm", "lr")


def run_one(job: dict) -> dict:
    """One training run in this worker process (one torch thread): the final record and the evaluation
    records of its curve, or status "diverged" with the error's first line."""
    import torch
    torch.set_num_threads(1)
    import accellib.techniques  # noqa: F401  (registers the technique sections)
    from accellib.drivers.arms import arm_configs
    from accellib.core.records import read_metrics
    from accellib.train import training_function
    from accellib.core.trainer import TrainingError
    out = Path(job["out"])
    cfg = arm_configs(job["config"], [job["arm"]], ["--train.progress=false", "--train.threads=1",
                                                     f"--train.seed={job['seed']}", *job["overrides"]])[job["arm"]]
    t0 = time.perf_counter()
    try:
        final, status, error = training_function(cfg, out, overwrite=True), "ok", None
    except TrainingError as e:
        final, status, error = None, "diverged", str(e).split(";")[0]
    keys = LM_KEYS if job["kind"] == "lm" else IMAGE_KEYS
    curve = [{k: r[k] for k in keys if k in r} for r in read_metrics(out) if "val_loss" in r] if out.exists() else []
    return dict(job, status=status, error=error, final=final, curve=curve, seconds=round(time.perf_counter() - t0, 2))


def summarize(results: list[dict], metric: str) -> dict:
    """Mean ± sd of the final `metric` over a group's seeds that finished (the spread of one arm, for display;
    comparisons are judged per seed by accellib.analysis.stats); diverged seeds are counted."""
    ok = [r["final"][metric] for r in results if r["status"] == "ok" and math.isfinite(r["final"][metric])]
    mean, sd = mean_sd(ok) if ok else (float("nan"), float("nan"))
    return {metric: round(mean, 4), f"{metric}_sd": round(sd, 4), f"{metric}s": [round(x, 4) for x in ok],
            "seeds": len(results), "diverged": sum(r["status"] != "ok" for r in results)}


def steps_to(curve: list[dict], target: float) -> float:
    return next((r["step"] for r in curve if r.get("val_acc", -1) >= target), math.inf)


def to_target(groups: dict[str, list[dict]], targets: dict[str, float]) -> dict:
    """Per target: each arm's per-seed first evaluation step with val_acc >= target, the median over seeds
    (inf = not reached by half or more), and the speedup = none's median / the arm's median."""
    out = {}
    for tname, target in targets.items():
        per = {a: [steps_to(r["curve"], target) for r in rs] for a, rs in groups.items()}
        med = {a: statistics.median(v) for a, v in per.items()}
        out[tname] = dict(target=round(target, 4), steps=per, median=med,
                          reached={a: sum(math.isfinite(s) for s in v) for a, v in per.items()},
                          speedup={a: (med["baseline"] / m if math.isfinite(m) and math.isfinite(med["baseline"])
                                       else (math.inf if math.isfinite(m) else None)) for a, m in med.items()})
    return out


def step_timing(quick: bool) -> dict:
    """Paired step time of the three digits arms (accellib.drivers.budget.paired_step_seconds: steps spread over the run,
    interleaved rounds, ratios taken within each round), one thread, after the pool has finished."""
    import torch
    from accellib.drivers.budget import paired_step_seconds
    from accellib.drivers.arms import arm_configs
    torch.set_num_threads(1)
    cfgs = arm_configs(DIGITS, list(ARMS), ["--train.progress=false", "--train.checkpoint_every=0"])
    r = paired_step_seconds(cfgs, positions=4 if quick else 20, rounds=2 if quick else 7)
    return dict(note="optimizer-step time of configs/digits_cnn.yaml's arms, median over interleaved rounds; ratio "
                     "to the none arm", ms={a: round(1e3 * v, 3) for a, v in r["seconds"].items()},
                ratio={a: round(v, 3) for a, v in r["ratio"].items()}, rounds=r["rounds"], positions=r["positions"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke run: 40 steps, 1-2 seeds; writes nothing to results/")
    ap.add_argument("--seeds", type=int, default=10, help="seeds of the main comparison")
    args = ap.parse_args()
    q = args.quick
    runs = ROOT / "runs" / ("standardization_loss_quick" if q else "standardization_loss")
    steps = ["--train.steps=40", "--train.eval_every=10"] if q else ["--train.eval_every=25"]
    n_main, n_lr, n_small = (2, 1, 1) if q else (args.seeds, 5, 3)
    tf_steps = ["--train.steps=20", "--train.eval_every=10"] if q else []
    img = ["--train.checkpoint_every=0"]
    jobs: dict[str, list[dict]] = {}

    def add(group: str, arm: str, seeds: int, overrides: list[str], config=DIGITS, kind="image", first=0):
        for k in range(first, first + seeds):
            jobs.setdefault(group, []).append(dict(
                group=group, arm=arm, seed=SEED0 + k, config=str(config), kind=kind, overrides=overrides,
                out=str(runs / group / arm / f"seed{SEED0 + k}")))

    # the transformer first (the longest runs), its pilot before anything else
    sl_tf = ["--model.norm=none", "--standardization_loss.enabled=true"]
    for w in TF_PILOT_W:
        add(f"tf_pilot_w{w:g}", "baseline", 1, tf_steps + sl_tf + [f"--standardization_loss.weight={w}"], TUTORIAL, "lm")
    add("tf_ln", "baseline", n_small, tf_steps, TUTORIAL, "lm")
    add("tf_noln", "baseline", n_small, tf_steps + ["--model.norm=none"], TUTORIAL, "lm")
    for a in ARMS:
        add("main", a, n_main, steps + img)
        add("lr1e-2", a, n_lr, steps + img + ["--optim.lr=1e-2"])
    for a in ("baseline", "sl"):
        add("long", a, n_small, (steps if q else ["--train.steps=5000", "--train.eval_every=100"]) + img)
    for w in W_GRID:
        add(f"w{w:g}", "sl", n_small, steps + img + [f"--standardization_loss.weight={w}"])
    for lr in ("1e-2", "1e-3"):
        for b in BATCHES:
            if b == 128:
                continue     # batch 128: the main and lr1e-2 groups' first seeds
            for a in ARMS:
                add(f"batch{b}_lr{lr}", a, n_small, steps + img + [f"--train.batch_size={b}", f"--optim.lr={lr}"])

    t0 = time.perf_counter()
    done: dict[str, list[dict]] = {}
    n_runs = sum(map(len, jobs.values()))
    print(f"{n_runs} runs (+{max(n_small - 1, 0)} after the transformer pilot), {args.jobs} at once", flush=True)

    def collect(futs):
        for f in futs:
            r = f.result()
            done.setdefault(r["group"], []).append(r)

    with ProcessPoolExecutor(args.jobs) as pool:
        futs = {g: [pool.submit(run_one, j) for j in js] for g, js in jobs.items()}
        pilot = [f for g, fs in futs.items() if g.startswith("tf_pilot") for f in fs]
        wait(pilot)
        scores = {w: f.result() for w, f in zip(TF_PILOT_W, pilot)}
        ok = {w: r["final"]["val_loss"] for w, r in scores.items() if r["status"] == "ok"}
        w_tf = min(ok, key=ok.get) if ok else TF_PILOT_W[0]
        print(f"transformer pilot (1 seed): {ok}; chosen w = {w_tf:g}", flush=True)
        jobs = {}                                   # the second wave: `add` fills it
        add("tf_noln_sl", "baseline", n_small - 1, tf_steps + sl_tf + [f"--standardization_loss.weight={w_tf}"],
            TUTORIAL, "lm", first=1)
        futs2 = [pool.submit(run_one, j) for js in jobs.values() for j in js]
        collect(f for fs in futs.values() for f in fs)
        collect(futs2)
    for g in done:
        done[g].sort(key=lambda r: (r["arm"], r["seed"]))
    done.setdefault("tf_noln_sl", []).insert(0, scores[w_tf])   # the pilot's seed is the chosen arm's first seed
    wall = time.perf_counter() - t0
    timing = step_timing(q)

    def strip(r: dict) -> dict:
        return dict(status=r["status"], error=r["error"], final=r["final"], seconds=r["seconds"])

    def part(groups: dict[str, list[dict]], metric: str, overrides: list[str], note: str) -> dict:
        return dict(note=note, overrides=overrides,
                    rows=[dict(arm=a, **summarize(rs, metric)) for a, rs in groups.items()],
                    runs={f"{a}/seed{r['seed']}": strip(r) for a, rs in groups.items() for r in rs},
                    curves={f"{a}/seed{r['seed']}": r["curve"] for a, rs in groups.items() for r in rs})

    by_arm = lambda g: {a: [r for r in done[g] if r["arm"] == a] for a in ARMS if any(r["arm"] == a for r in done[g])}
    main_g, lr_g = by_arm("main"), by_arm("lr1e-2")
    rec = dict(name="standardization_loss_cpu",
               command="python benchmarks/standardization_loss.py --jobs 2" + (" --quick" if q else ""),
               config=yaml.safe_load(DIGITS.read_text()), tutorial_config=yaml.safe_load(TUTORIAL.read_text()),
               seed0=SEED0, jobs=args.jobs, runs=n_runs + max(n_small - 1, 0), wall_seconds=round(wall, 1),
               environment=environment(), paper=PAPER,
               note="each run is one process with one torch thread; --jobs runs at once on a shared 2-core machine, "
                    "so per-run seconds are not timing measurements")
    rec["timing"] = timing
    rec["main"] = part(main_g, "val_acc", steps + img, f"lr 1e-3 (the paper's protocol), {n_main} seeds")
    rec["lr1e-2"] = part(lr_g, "val_acc", steps + img + ["--optim.lr=1e-2"], f"lr 1e-2, {n_lr} seeds")
    rec["long"] = part(by_arm("long"), "val_acc", ["--train.steps=5000", "--train.eval_every=100"],
                       f"lr 1e-3, 5000 steps, {n_small} seeds")
    rec["w_sweep"] = dict(note=f"SL at lr 1e-3 over w, {n_small} seeds; w = 0 is the none arm of main (its first "
                          f"{n_small} seeds)",
                          rows=[dict(w=w, **summarize(done[f"w{w:g}"], "val_acc"),
                                     std_loss=round(statistics.fmean(r["curve"][-1].get("std_loss", math.nan)
                                                                     for r in done[f"w{w:g}"] if r["status"] == "ok"
                                                                     and r["curve"]), 5)
                                     if any(r["status"] == "ok" for r in done[f"w{w:g}"]) else None,
                                     errors=sorted({r["error"] for r in done[f"w{w:g}"] if r["error"]}))
                                for w in W_GRID],
                          curves={f"w{w:g}/seed{r['seed']}": r["curve"] for w in W_GRID for r in done[f"w{w:g}"]})
    brows = []
    for lr, ref in (("1e-2", lr_g), ("1e-3", main_g)):
        for b in BATCHES:
            for a in ARMS:
                rs = ref[a][:n_small] if b == 128 else [r for r in done[f"batch{b}_lr{lr}"] if r["arm"] == a]
                brows.append(dict(lr=float(lr), batch=b, arm=a, **summarize(rs, "val_acc")))
    rec["batch"] = dict(note=f"{n_small} seeds; every batch size trains the same number of steps "
                        f"({'40' if q else '1000'}), LR not rescaled; batch 128 = the first {n_small} seeds of "
                        "main / lr1e-2", rows=brows)
    final_mean = lambda rs: statistics.fmean(r["final"]["val_acc"] for r in rs if r["status"] == "ok")
    targets_lr3 = {"none_final_mean": final_mean(main_g["baseline"]), "sl_final_mean": final_mean(main_g["sl"]),
                   "fixed_0.5": 0.5}
    targets_lr2 = {"none_final_mean": final_mean(lr_g["baseline"]), "sl_final_mean": final_mean(lr_g["sl"]),
                   "fixed_0.5": 0.5}
    rec["to_target"] = dict(note="first evaluation step (every 25 steps) with val_acc >= target, per seed; median "
                            "over seeds (inf = not reached by at least half); speedup = none's median / the arm's",
                            lr1e_3=to_target(main_g, targets_lr3), lr1e_2=to_target(lr_g, targets_lr2),
                            # how long none takes to reach SL's (and BN's) mean accuracy after 1000 steps
                            long=to_target(by_arm("long"), {"sl_1000_step_mean": targets_lr3["sl_final_mean"],
                                                            "bn_1000_step_mean": final_mean(main_g["bn"])}))
    tf = {"ln": done["tf_ln"], "noln": done["tf_noln"], "noln_sl": done["tf_noln_sl"]}
    rec["transformer"] = dict(
        note="ours, not in the paper: configs/tutorial.yaml (baseline arm) with every LayerNorm (ln) or none "
             "(noln, --model.norm=none), and noln + SL on each MLP's c_fc pre-activation; "
             f"{n_small} seeds; the weight from a 1-seed pilot",
        pilot={f"{w:g}": strip(scores[w]) for w in TF_PILOT_W}, weight=w_tf,
        rows=[dict(arm=a, **summarize(rs, "val_loss")) for a, rs in tf.items()],
        runs={f"{a}/seed{r['seed']}": strip(r) for a, rs in tf.items() for r in rs},
        curves={f"{a}/seed{r['seed']}": r["curve"] for a, rs in tf.items() for r in rs},
        pilot_curves={f"{w:g}": scores[w]["curve"] for w in TF_PILOT_W})

    # the tables
    fmt = lambda m, s: f"{m:.3f} ± {s:.3f}"
    lines = ["== none vs SL vs BN, 1000 steps (val accuracy, mean ± sd over seeds)"]
    rows = [dict(arm=LABEL[a], lr_1e_3=fmt(r["val_acc"], r["val_acc_sd"]), seeds=r["seeds"],
                 lr_1e_2=fmt(*(lambda x: (x["val_acc"], x["val_acc_sd"]))(rec["lr1e-2"]["rows"][i])),
                 paper_mnist=fmt(*PAPER[a])) for i, (a, r) in enumerate(zip(ARMS, rec["main"]["rows"]))]
    lines.append(table(rows))
    lines.append("== 5000 steps at lr 1e-3")
    lines.append(table([dict(arm=LABEL[r["arm"]], val_acc=fmt(r["val_acc"], r["val_acc_sd"]), seeds=r["seeds"])
                        for r in rec["long"]["rows"]]))
    lines.append("== w sweep (SL, lr 1e-3)")
    lines.append(table([dict(w=f"{r['w']:g}", val_acc=fmt(r["val_acc"], r["val_acc_sd"]),
                             diverged=f"{r['diverged']}/{r['seeds']}", final_std_loss=r["std_loss"])
                        for r in rec["w_sweep"]["rows"]]))
    lines.append("== batch size (1000 steps each)")
    lines.append(table([dict(lr=f"{r['lr']:g}", batch=r["batch"], arm=LABEL[r["arm"]],
                             val_acc=fmt(r["val_acc"], r["val_acc_sd"]), diverged=r["diverged"]) for r in brows]))
    for k, tt in rec["to_target"].items():
        if k == "note":
            continue
        for tname, t in tt.items():
            lines.append(f"== steps to val_acc >= {t['target']:.3f} ({k}, {tname}): median "
                         + ", ".join(f"{LABEL[a]} {m:g} ({t['reached'][a]}/{len(t['steps'][a])} reached, "
                                     f"speedup {t['speedup'][a]})" for a, m in t["median"].items()))
    lines.append(f"== transformer (ours), w = {w_tf:g}; pilot {ok}")
    lines.append(table([dict(arm=r["arm"], val_loss=fmt(r["val_loss"], r["val_loss_sd"]),
                             seeds=r["seeds"], diverged=r["diverged"]) for r in rec["transformer"]["rows"]]))
    lines.append(f"== step time (paired, {timing['rounds']} rounds): "
                 + ", ".join(f"{LABEL[a]} {timing['ms'][a]:.2f} ms ({timing['ratio'][a]:.2f}x)" for a in ARMS))
    rec["table"] = "\n".join(lines)
    print(rec["table"])
    out = runs / "standardization_loss_cpu.json" if q else ROOT / "results" / "standardization_loss_cpu.json"
    write_json(out, rec)
    print(f"wrote {out.relative_to(ROOT)} ({wall:.0f} s, {rec['runs']} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
