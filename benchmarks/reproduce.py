"""The results cache (`make results`): the longer, multi-seed experiments the notebooks plot, run with
`accellib.compare` and written to results/<name>.json with what made them (config, commit, versions,
machine, wall time of this invocation, and run_seconds: every run's own clock summed, which a resumed build keeps).

    python benchmarks/reproduce.py                       # every experiment, jobs = CPU cores
    python benchmarks/reproduce.py --only tutorial_flops --jobs 2
    python benchmarks/reproduce.py --quick               # smoke run: 2 seeds, 40 steps; its records go to
                                                         # runs/reproduce_quick/, nothing to results/
    python benchmarks/reproduce.py --reanalyse tutorial_steps   # re-judge a cached experiment's stored per-seed
                                                         # losses by today's summary code (paired gaps), no training

Experiments (all on configs/tutorial.yaml, the shared tutorial baseline; runs in runs/reproduce/<name>/):
  tutorial_lr_sweep  the baseline over peak LR x warm-up, 3 seeds (notebook 00's tuning)
  tutorial_steps     every arm at the baseline's optimizer steps (the papers' protocol), 5 seeds
  tutorial_flops     every arm at the baseline's FLOPs (compare --budget flops --control dense), 5 seeds, with
                     the plain models of 1-5 blocks trained to the same FLOPs (the dense frontier): the
                     compute-matched comparison every notebook reads
  tutorial_flops_lr  the LR check of that comparison: its best dense arm and its best technique arm (read from
                     results/tutorial_flops.json) at half and twice the tutorial LR, same FLOPs, 5 seeds
  tutorial_frontier  the plain models around tutorial_flops' best (narrower 1-block models, the 1-2-block ones
                     and the baseline again) at the same FLOPs and seeds, so the tutorial budget's frontier has
                     its minimum bracketed (analysis.results.joint_frontier pairs it with tutorial_flops' arms)
  tutorial_timing    seconds per step of every arm, paired and interleaved on one core (budget.paired_step_seconds):
                     the source of every wall-time claim (run alone, before the others, so nothing competes)
  tutorial_ouroboros the baseline vs Ouroboros delayed gradients with K = 2, 3, 4 modules at the baseline's steps,
                     3 seeds, single-process reference (configs/ouroboros.yaml: tutorial.yaml's base, its own arms;
                     notebook 06)
  tutorial_ouroboros_lr  the LR check of tutorial_ouroboros: the tuned baseline (the paired control), and the
                     baseline and Ouroboros K = 2, 3, 4 at lower peak LRs and longer warm-ups, same steps and
                     seeds (configs/ouroboros_lr.yaml: tutorial.yaml's base; notebook 06)

Near compute-optimal (configs/fixed_size_long.yaml: 6 blocks x width 24 at 50 tokens per parameter):
  long_lr_sweep      its peak LR and warm-up, 3 seeds, searched until the best LR is interior
                     (benchmarks/lr_tune.py); the config's optim section is set from it
  long_flops         every arm at the baseline's FLOPs, 5 seeds, with plain models smaller and larger
                     (LONG_DENSE) trained to the same FLOPs: the papers' metric (FLOPs and wall to reach the
                     same seed's baseline final loss), the same-size gap and the frontier, with its minimum
                     bracketed
  long_flops_lr      the LR check of long_flops: its best technique arm at the LR search's neighbours of the
                     tuned LR, with the baseline at the tuned LR, 5 seeds, same FLOPs
  long_timing        seconds per step of every arm of that config, paired and interleaved on one core (as
                     tutorial_timing): the wall-time ratios that do not depend on what else ran on the machine

The papers' regime (configs/overtrained.yaml: 6 blocks x width 16 at 849 tokens per parameter of fresh text;
benchmarks/overtrained.py says why and how):
  ot_lr_sweep        its peak LR at that horizon, 3 seeds, the ladder extended until the best LR is interior
  ot_lr_check        the tuned LR against 0.0625x-0.5x and 2x-4x it, 5 seeds (the sweep's 1.43x neighbours are
                     not resolved)
  ot_profile         the plain models of the same family (overtrained.PROFILE) trained to the baseline's FLOPs,
                     3 seeds: the IsoFLOP profile that shows whether the baseline is past its compute-optimum
  ot_flops           every arm at the baseline's FLOPs, 5 seeds, with the profile's best plain model: the
                     same-size gap and the gap to the frontier
  ot_flops_lr        the same at ot_lr_check's best peak LR (the 3-seed sweep's 0.02 is not the 5-seed optimum)
  ot_short           the same config at 50 tokens per parameter (every schedule scaled with the run), 5 seeds
  long_short         configs/fixed_size_long.yaml at 1.8 tokens per parameter (the tutorial's), 5 seeds: regime
                     apart from width

The compute-optimal picture (benchmarks/isoflop.py; notebooks 00 and 09):
  isoflop            IsoFLOP profiles: one-block plain models of widths 16-128 trained to each of four budgets
                     spanning 10x (the scale trend's baselines, the tutorial budget among them), 3 seeds, with
                     each budget's minimum bracketed
  isoflop_lr         the LR check of isoflop: each budget's best model re-trained at 0.5x and 2x the rule's LR

Each arm of an experiment is one `compare --arms <arm>` process (one torch thread); `--jobs` of them run
at once, then one `compare --resume` over all arms prints the table and writes summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from accellib.drivers.arms import DENSE, arm_configs, check_data, dense_arms, is_plain  # noqa: E402
from accellib.core.records import environment, read_metrics, write_json  # noqa: E402
from accellib.core.options import ConfigError  # noqa: E402
import isoflop  # noqa: E402  (benchmarks/isoflop.py)
import overtrained  # noqa: E402  (benchmarks/overtrained.py)

CONFIG = ROOT / "configs" / "tutorial.yaml"
OUROBOROS_CONFIG = ROOT / "configs" / "ouroboros.yaml"
OUROBOROS_LR_CONFIG = ROOT / "configs" / "ouroboros_lr.yaml"
LONG_CONFIG = ROOT / "configs" / "fixed_size_long.yaml"
LONG_LR_GRID = (5e-3, 7e-3, 1e-2, 1.4e-2, 2e-2)   # the first pass, at the config's warm-up
LONG_WARMUPS = (20, 150)                           # tried at the best LR besides the config's
# the plain models beside the 6-block x 24 baseline at its FLOPs: shallower, deeper and wider, so that the
# best plain model has a measured smaller and larger neighbour (compare warns when it does not). The first build
# had L3 as its smallest arm and found its minimum there (the edge), so L1 and L2 joined it.
# the tutorial budget's frontier, bracketed (issue 33): tutorial_flops found its minimum at its smallest arm,
# dense-L1 (width 64), so narrower 1-block models join it (and L1/L2 and the baseline are re-run as the pairing
# anchors: their losses must equal tutorial_flops' seed for seed)
TUTORIAL_FRONTIER = ("dense-L1", "dense-L2", "dense-L1-d48", "dense-L1-d32", "dense-L2-d48")
LONG_DENSE = ("dense-L1", "dense-L2", "dense-L3", "dense-L9", "dense-L12", "dense-L16", "dense-L6-d32")
SEEDS = 3          # the LR sweep and Ouroboros (tuning and a 4-arm study); headline comparisons use HEADLINE_SEEDS
HEADLINE_SEEDS = 5
LR_CHECK = (0.5, 2.0)  # the LR check's multiples of the tutorial LR
LR_GRID = (2e-3, 3e-3, 5e-3, 7e-3, 1e-2)
WARMUP_GRID = (20, 60)
CURVE_KEYS = ("step", "train_loss", "grad_norm", "lr", "val_loss", "flops", "wall", "tokens", "layer_tokens",
              "transition", "stage", "theta", "ltd_keep")


def sweep_arms() -> dict[str, tuple[float, int]]:
    """The grid's arms, without the tuned point itself (that is the `baseline` arm)."""
    o = yaml.safe_load(CONFIG.read_text())["optim"]
    return {f"lr{lr:g}_wu{wu}": (lr, wu) for lr in LR_GRID for wu in WARMUP_GRID
            if (lr, wu) != (o["lr"], o["warmup_steps"])}


def lr_sweep_yaml(out: Path) -> Path:
    """configs/tutorial.yaml's baseline with one arm per (LR, warm-up); `baseline` is the tuned setting."""
    raw = yaml.safe_load(CONFIG.read_text())
    raw["arms"] = {"baseline": {}}
    for name, (lr, wu) in sweep_arms().items():
        raw["arms"][name] = {"optim": {"lr": lr, "warmup_steps": wu}}
    out.parent.mkdir(parents=True, exist_ok=True)   # beside the comparison's folder, which holds only accellib's files
    p = out.parent / f"{out.name}.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


def best_arms(res: dict) -> tuple[str, str]:
    """The best dense arm (the frontier's most frequent pick) and the best technique arm (lowest mean loss)
    of a tutorial_flops result."""
    picks = list(res["summary"]["frontier"]["per_seed"].values())
    dense = max(sorted(set(picks)), key=picks.count)
    tech = min((r for r in res["summary"]["rows"] if not is_plain(r["arm"])), key=lambda r: r["val_loss"])
    return dense, tech["arm"]


def lr_check_yaml(out: Path, res: dict, config: Path = CONFIG, lrs: tuple[float, ...] | None = None,
                  dense: bool = True) -> tuple[Path, list[str]]:
    """`config`'s baseline plus the best dense (if `dense`) and best technique arm of an equal-FLOPs result `res`,
    each at the peak LRs `lrs` (default LR_CHECK x the config's LR; arms `<arm>@lr<value>`)."""
    raw = yaml.safe_load(config.read_text())
    lr = raw["optim"]["lr"]
    arms = {"baseline": {}}
    for arm in best_arms(res)[0 if dense else 1:]:
        over = raw["arms"].get(arm) or {"model": {"n_layer": int(DENSE.match(arm).group(1))}}
        for v in lrs or tuple(lr * f for f in LR_CHECK):
            arms[f"{arm}@lr{v:g}"] = {**over, "optim": {"lr": v}}
    raw["arms"] = arms
    out.parent.mkdir(parents=True, exist_ok=True)   # beside the comparison's folder, which holds only accellib's files
    p = out.parent / f"{out.name}.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p, [a for a in arms if a != "baseline"]


def same_base(config: Path) -> Path:
    """`config` if its base (everything but the arms) is tutorial.yaml's: a separate arms file must not drift."""
    strip = lambda p: {k: v for k, v in yaml.safe_load(p.read_text()).items() if k != "arms"}
    if strip(config) != strip(CONFIG):
        raise SystemExit(f"error: {config.relative_to(ROOT)} no longer has {CONFIG.relative_to(ROOT)}'s base config; "
                         "copy the base over (everything above `arms:`)")
    return config


def compare(config: Path, out: Path, arms: list[str], budget: str, seeds: int, extra: list[str], jobs: int,
            table_arms: list[str] | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    base = [sys.executable, "-m", "accellib.compare", "--config", str(config), "--out", str(out),
            "--budget", budget, "--seeds", str(seeds), "--train.threads=1", *extra]

    def one(arm: str) -> None:
        again = ["--resume"] if (out / "budget.json").is_file() else []  # compare --resume refuses a new folder
        r = subprocess.run(base + ["--arms", arm, *again], cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"arm {arm} failed:\n{r.stderr[-3000:]}")
        print(f"  {arm} done", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, arms))
    # the table over exactly these arms (a YAML may hold arms another experiment trains)
    r = subprocess.run(base + ["--arms", ",".join(table_arms or arms), "--resume"], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=True)
    print("\n".join(ln for ln in r.stdout.splitlines() if "finished before" not in ln))
    summary = json.loads((out / "summary.json").read_text())
    curves = {}
    for d in sorted(p.parent for p in out.rglob("record.json")):
        label = str(d.relative_to(out))
        curves[label] = [{k: v for k, v in rec.items() if k in CURVE_KEYS} for rec in read_metrics(d)]
    return dict(summary=summary, budget=json.loads((out / "budget.json").read_text()), curves=curves,
                table=r.stdout[r.stdout.index("budget:"):r.stdout.index("figure:")])


def timing(config: Path, quick: bool) -> dict:
    from accellib.drivers.budget import paired_step_seconds
    import torch
    torch.set_num_threads(1)
    cfgs = arm_configs(config, None, ["--train.threads=1"] + (["--train.steps=40"] if quick else []))
    check_data(cfgs)
    cfgs = {a: c for a, c in cfgs.items() if not c.techniques["multilevel"].enabled}  # a V-cycle is several models
    t = paired_step_seconds(cfgs, positions=6, rounds=3 if quick else 9)
    for a, ratio in t["ratio"].items():
        print(f"  {a:<16} {t['seconds'][a] * 1e3:7.1f} ms/step   {ratio:.3f} x baseline (median of {t['rounds']} rounds)")
    return dict(timing=t, note="multilevel is left out: its stages are different models (see notebook 04)")


def run_seconds(res: dict) -> float | None:
    """The build's cost: every run's own training clock (its final record's wall, summed over arms and seeds, runs
    kept from an earlier invocation included). wall_seconds is only the last invocation's, which a resumed build
    undercounts; neither is a speed measurement (runs share the machine, --jobs at a time), and a run paused
    (SIGSTOP) counts its pause."""
    rows = res.get("summary", {}).get("rows")
    return round(sum(r["wall_s"] * r["seeds"] for r in rows), 1) if rows and all("wall_s" in r for r in rows) else None


def regime_record(config: Path, rows: list[dict], curves: dict) -> dict:
    """{arm: {params, tokens, tokens_per_param, epochs, vs_compute_optimal}} of an experiment's arms, counted one
    way (accellib.analysis.regime: all parameters; tokens = the mean over seeds of what each run read). A V-cycle
    is counted at its full size (the model it delivers), with the tokens of all its stages."""
    from accellib.analysis.regime import params_of, regime
    from accellib.data.tokens import load_token_data
    out = {}
    for r in rows:
        try:
            cfg = arm_configs(config, [r["arm"]], [])[r["arm"]]
        except ConfigError:   # an arm of a generated YAML (an LR sweep's lr<x>_wu<n>): the baseline's model
            cfg = arm_configs(config, ["baseline"], [])["baseline"]
        check_data({r["arm"]: cfg})
        runs = [c for k, c in curves.items() if k.split("/")[0] == r["arm"]]
        tokens = sum(max(x.get("tokens", 0) for x in c) for c in runs) / len(runs)
        n_train = len(load_token_data(cfg.data.path).train)
        out[r["arm"]] = regime(tokens, params_of(cfg), n_train)
    return out


CONFIG_OF = {"ot_lr_sweep": "overtrained.yaml", "ot_lr_check": "overtrained.yaml", "ot_profile": "overtrained.yaml", "ot_flops": "overtrained.yaml",
             "ot_flops_lr": "overtrained.yaml",
             "ot_short": "overtrained.yaml",
             "long_short": "fixed_size_long.yaml", "long_lr_sweep": "fixed_size_long.yaml", "long_flops": "fixed_size_long.yaml",
             "long_flops_lr": "fixed_size_long.yaml",
             "tutorial_ouroboros": "ouroboros.yaml", "tutorial_ouroboros_lr": "ouroboros_lr.yaml"}


def reanalyse(name: str) -> int:
    """Add what today's summary adds (seed labels, paired gaps to the baseline and the dense frontier) to a
    cached experiment, from the per-seed final losses it stores: the numbers are the stored runs', only the
    judgement of them is recomputed. The record says when and by which command."""
    from accellib.compare import paired_gaps
    path = ROOT / "results" / f"{name}.json"
    res = json.loads(path.read_text())
    summ = res["summary"]
    seed0 = res["budget"]["seed0"]
    for r in summ["rows"]:
        r["seed_labels"] = [f"seed{seed0 + k}" for k in range(len(r["val_losses"]))]
        r.pop("vs_baseline", None), r.pop("vs_frontier", None)
    res["regime"] = regime_record(ROOT / "configs" / CONFIG_OF.get(name, "tutorial.yaml"), summ["rows"], res["curves"])
    from accellib.compare import eval_spacing
    base_flops = res["budget"]["per_seed"]["0"].get("baseline_flops")
    for r in summ["rows"]:   # all parameters, for the frontier's bracket check (older caches recorded none)
        r["params"] = res["regime"][r["arm"]]["params"]
        runs = [c for k, c in res["curves"].items() if k.split("/")[0] == r["arm"]]
        if base_flops and "to_target_resolution" in r:   # today's definition, from the stored curves
            r["to_target_resolution"] = max(eval_spacing(c) for c in runs) / base_flops
    summ["frontier"] = paired_gaps(summ["rows"], res["budget"]["baseline"])
    res["reanalysed"] = dict(command=f"python benchmarks/reproduce.py --reanalyse {name}", environment=environment())
    write_json(path, res)
    print(f"{path.relative_to(ROOT)}: paired gaps recomputed for {len(summ['rows'])} arms")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated experiment names")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compare processes at once")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, 40 steps; writes nothing to results/")
    ap.add_argument("--reanalyse", metavar="NAME", help="recompute the paired gaps (and frontier) of results/NAME.json "
                    "from its stored per-seed losses with today's summary code; trains nothing")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the runs train; cuda runs in fp32 (train.precision=fp32), so its losses match the CPU's "
                         "up to float rounding, and many small runs share the GPU")
    args = ap.parse_args()
    if args.reanalyse:
        return reanalyse(args.reanalyse)
    seeds, extra = (2, ["--train.steps=40", "--train.eval_every=10"]) if args.quick else (SEEDS, [])
    headline = 2 if args.quick else HEADLINE_SEEDS
    extra = extra + [f"--train.device={args.device}"] + (["--train.precision=fp32"] if args.device == "cuda" else [])
    runs = ROOT / "runs" / ("reproduce_quick" if args.quick else "reproduce")
    arms = list(yaml.safe_load(CONFIG.read_text())["arms"])
    done: dict[str, dict] = {}   # this invocation's results (the LR check reads tutorial_flops's)
    dense = dense_arms(arm_configs(CONFIG, ["baseline"], [])["baseline"])

    def lr_check():
        flops = done.get("tutorial_flops") or json.loads((ROOT / "results" / "tutorial_flops.json").read_text())
        cfg, lr_arms = lr_check_yaml(runs / "tutorial_flops_lr", flops)
        return compare(cfg, runs / "tutorial_flops_lr", lr_arms, "flops", headline, extra, args.jobs,
                       table_arms=["baseline", *lr_arms])
    def long_lr_check():
        """The best technique arm of long_flops at the LR search's neighbours of the tuned LR (the baseline at the
        tuned LR beside it): does the verdict hinge on using the baseline's LR?"""
        flops = done.get("long_flops") or json.loads((ROOT / "results" / "long_flops.json").read_text())
        best = json.loads((ROOT / "results" / "long_lr_sweep.json").read_text())["best"]
        cfg, lr_arms = lr_check_yaml(runs / "long_flops_lr", flops, LONG_CONFIG,
                                     (best["below"]["lr"], best["above"]["lr"]), dense=False)
        return compare(cfg, runs / "long_flops_lr", ["baseline", *lr_arms], "flops", headline, extra, args.jobs)

    def long_sweep():
        from lr_tune import tune
        return tune(LONG_CONFIG, runs / "long_lr_sweep", (2e-3, 1e-2) if args.quick else LONG_LR_GRID, LONG_WARMUPS,
                    lambda cfg, arms: compare(cfg, runs / "long_lr_sweep", arms, "steps", seeds, extra, args.jobs),
                    rounds=1 if args.quick else 6)
    def ot_sweep():
        from lr_tune import tune
        out = runs / "ot_lr_sweep"
        return tune(overtrained.CONFIG, out, (0.01, 0.02) if args.quick else overtrained.LR_GRID, (),
                    lambda cfg, arms: compare(cfg, out, arms, "steps", seeds, extra, args.jobs),
                    rounds=1 if args.quick else 6)

    def ot_lr_check():
        cfg, arms_ = overtrained.lr_check_yaml(runs / "ot_lr_check")
        return compare(cfg, runs / "ot_lr_check", arms_, "steps", headline, extra, args.jobs)

    def generated(name: str, made: tuple[Path, list[str]], n_seeds: int | None = None) -> dict:
        """An equal-FLOPs comparison over a YAML this script wrote (beside its folder), stored in the record."""
        cfg, arms_ = made
        return dict(compare(cfg, runs / name, arms_, "flops", n_seeds or headline, extra, args.jobs),
                    generated_config=yaml.safe_load(cfg.read_text()))
    cached = lambda name: done.get(name) or json.loads((ROOT / "results" / f"{name}.json").read_text())
    long_arms = list(yaml.safe_load(LONG_CONFIG.read_text())["arms"])
    experiments = {
        "ot_lr_sweep": ot_sweep,
        "ot_lr_check": ot_lr_check,
        "ot_profile": lambda: generated("ot_profile", overtrained.profile_yaml(runs / "ot_profile"),
                                        2 if args.quick else overtrained.PROFILE_SEEDS),
        "ot_flops": lambda: generated("ot_flops", overtrained.flops_yaml(runs / "ot_flops", cached("ot_profile"))),
        "ot_flops_lr": lambda: generated("ot_flops_lr", overtrained.flops_yaml(
            runs / "ot_flops_lr", cached("ot_profile"), overtrained.checked_lr(cached("ot_lr_check")))),
        "ot_short": lambda: generated("ot_short", overtrained.short_yaml(
            overtrained.CONFIG, runs / "ot_short", overtrained.SHORT_TOKENS_PER_PARAM)),
        "long_short": lambda: generated("long_short", overtrained.short_yaml(
            LONG_CONFIG, runs / "long_short", overtrained.LONG_SHORT_TOKENS_PER_PARAM)),
        "long_lr_sweep": long_sweep,
        "long_flops": lambda: compare(LONG_CONFIG, runs / "long_flops", long_arms + list(LONG_DENSE), "flops",
                                      headline, extra, args.jobs),
        "long_timing": lambda: timing(LONG_CONFIG, args.quick),
        "long_flops_lr": long_lr_check,
        "tutorial_frontier": lambda: compare(CONFIG, runs / "tutorial_frontier", ["baseline", *TUTORIAL_FRONTIER],
                                             "flops", headline, extra, args.jobs),
        "tutorial_timing": lambda: timing(CONFIG, args.quick),
        "isoflop": lambda: isoflop.build(runs / "isoflop", seeds, compare, regime_record, args.jobs, extra),
        "isoflop_lr": lambda: isoflop.build_lr_check(runs / "isoflop_lr", seeds, compare, regime_record, args.jobs, extra,
                                                     done.get("isoflop") or json.loads((ROOT / "results" / "isoflop.json").read_text())),
        "tutorial_lr_sweep": lambda: compare(lr_sweep_yaml(runs / "tutorial_lr_sweep"), runs / "tutorial_lr_sweep",
                                             ["baseline", *sweep_arms()], "steps", seeds, extra, args.jobs),
        "tutorial_steps": lambda: compare(CONFIG, runs / "tutorial_steps", arms, "steps", headline, extra, args.jobs),
        "tutorial_flops": lambda: compare(CONFIG, runs / "tutorial_flops", arms + dense, "flops", headline, extra,
                                          args.jobs),
        "tutorial_flops_lr": lr_check,
        "tutorial_ouroboros": lambda: compare(same_base(OUROBOROS_CONFIG), runs / "tutorial_ouroboros",
                                              list(yaml.safe_load(OUROBOROS_CONFIG.read_text())["arms"]), "steps",
                                              seeds, extra, args.jobs),
        "tutorial_ouroboros_lr": lambda: compare(same_base(OUROBOROS_LR_CONFIG), runs / "tutorial_ouroboros_lr",
                                                 list(yaml.safe_load(OUROBOROS_LR_CONFIG.read_text())["arms"]),
                                                 "steps", seeds, extra, args.jobs),
    }
    configs = {"ot_lr_sweep": overtrained.CONFIG, "ot_lr_check": overtrained.CONFIG, "ot_profile": overtrained.CONFIG, "ot_flops": overtrained.CONFIG,
               "ot_flops_lr": overtrained.CONFIG,
               "ot_short": overtrained.CONFIG,
               "long_short": LONG_CONFIG, "long_lr_sweep": LONG_CONFIG, "long_flops": LONG_CONFIG, "long_timing": LONG_CONFIG,
               "long_flops_lr": LONG_CONFIG,
               "tutorial_ouroboros": OUROBOROS_CONFIG,   # the file whose config a record stores (default tutorial.yaml)
               "tutorial_ouroboros_lr": OUROBOROS_LR_CONFIG}
    names = args.only.split(",") if args.only else list(experiments)
    unknown = [n for n in names if n not in experiments]
    if unknown:
        print(f"error: unknown experiment {unknown[0]!r}; choose from {', '.join(experiments)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            res = done[name] = experiments[name]()
        except overtrained.NotLocated as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if "summary" in res and "curves" in res:   # where each arm stands: tokens per parameter, epochs
            res["regime"] = regime_record(configs.get(name, CONFIG), res["summary"]["rows"], res["curves"])
        rec = dict(name=name, command=f"python benchmarks/reproduce.py --only {name} --device {args.device}",
                   config=yaml.safe_load(configs.get(name, CONFIG).read_text()),
                   seeds=res["summary"]["seeds"] if "summary" in res else seeds,
                   wall_seconds=round(time.perf_counter() - t0, 1), jobs=args.jobs,
                   run_seconds=run_seconds(res),
                   threads_per_run=1,      # every run gets --train.threads=1 (above)
                   environment=environment(), **res)
        print(f"   {name}: {rec['wall_seconds']:.0f} s with {args.jobs} job(s)")
        # a smoke run's record goes beside its runs (runs/reproduce_quick/<name>.json), never into results/
        dest = runs if args.quick else ROOT / "results"
        dest.mkdir(parents=True, exist_ok=True)   # a timing-only smoke run has made no runs/ folder yet
        write_json(dest / f"{name}.json", rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
