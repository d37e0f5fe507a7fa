"""The scale trend (notebook 09): how each technique's loss gap, to the same-size baseline and to the dense
frontier (the best plain model for the same FLOPs), moves as the model grows, over the sizes a CPU can train.

    python benchmarks/scaling.py                 # the whole sweep, 2 processes -> results/scaling_trend.json
    python benchmarks/scaling.py --widths 64,128 # a sub-grid (the record says which sizes it holds)
    python benchmarks/scaling.py --quick         # smoke run: 2 sizes, 1 seed, 20 steps; writes nothing to results/
    python benchmarks/scaling.py --dense-only    # add the dense frontier's arms to results/scaling_trend.json

The grid: depth {4, 6, 12} x width {64, 128, 192} (heads of 16 dimensions), on configs/tutorial.yaml's base
and arms (baseline, pld, sbld, random_ltd, multilevel), every arm at the baseline's FLOPs of its size
(`compare --budget flops`, schedules stretched to each arm's horizon), 3 seeds. Depth 4 is the shallowest
every arm accepts: random-LTD needs a middle block and the
V-cycle merges pairs of blocks. Every size trains the tutorial's 300 steps and schedules on batches of 16
(not 32) windows of 64 tokens; eval every 50 steps. Cost: the two-width grid (--widths 64,128) is 90 runs and
1.34 core-hours of training (timed on a busy 2-core machine); width 192 adds about 1.5x that (step times
measured alone at batch 32: 1.6 s for the three width-192 sizes against 1.1 s for the six others).
The record's wall_seconds is the last invocation's: a resumed sweep counts only what it trained.

The dense frontier (issue 25): at each size, plain models of fewer blocks (`dense_depths`) trained to that
size's baseline FLOPs, so each technique is also judged against the best plain model for its budget
(`accellib.compare.frontier`), not only against the same-size baseline. `--dense-only` trains just these
arms and merges them into the committed results/scaling_trend.json (the techniques' runs are not repeated:
same config, seeds and code path; the record keeps both commands).

Learning rate: the tutorial's 7e-3 was tuned at d = 64 (notebook 00). Wider models get 7e-3 x 64 / d, a
plain 1/width scaling of the peak LR. This is *not* muP: muP (Yang et al. 2022, "Tensor Programs V") also
changes the initialisation and the output layer's multiplier, and scales the LR per parameter type; here
one LR scales for every parameter. It is not re-tuned per size, and every arm of a size shares it (dense
arms too), so the gap compares like with like; it does confound width with LR (see notebook 09).

Runs live in runs/scaling/<L>x<d>/ (resumable: a killed sweep picks up where it stopped); each
(size, arm) is one `compare --arms <arm> --resume` process with one torch thread, longest first.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from accellib.core.records import environment, read_metrics, write_json  # noqa: E402

CONFIG = ROOT / "configs" / "tutorial.yaml"
DEPTHS = (4, 6, 12)
WIDTHS = (64, 128, 192)
ARMS = ("baseline", "pld", "sbld", "random_ltd", "multilevel")
SEEDS = 3
BASE_LR, BASE_WIDTH, HEAD_DIM = 7e-3, 64, 16
CURVE_KEYS = ("step", "train_loss", "val_loss", "flops")


def dense_depths(depth: int) -> tuple[int, ...]:
    """The plain models of a size's frontier: 1, 2 and 3 blocks, and half the depth when that is deeper
    (the IsoFLOP profile of notebook 00 puts the tutorial budget's best plain model among the shallow ones)."""
    return tuple(sorted({1, 2, 3, depth // 2} - {depth}))


def size_arms(depth: int) -> list[str]:
    return [*ARMS, *(f"dense-L{n}" for n in dense_depths(depth))]


def size_overrides(depth: int, width: int) -> list[str]:
    return [f"--model.n_layer={depth}", f"--model.d_model={width}", f"--model.n_head={width // HEAD_DIM}",
            f"--optim.lr={BASE_LR * BASE_WIDTH / width:.6g}"]


def compare_command(runs: Path, L: int, d: int, arms: str, seeds: int, extra: list[str]) -> list[str]:
    """One `compare` process for some arms of size L x d (resuming once the size's comparison has started)."""
    out = runs / f"{L}x{d}"
    return [sys.executable, "-m", "accellib.compare", "--config", str(CONFIG), "--out", str(out),
            "--budget", "flops", "--seeds", str(seeds), "--train.threads=1", "--train.progress=false",
            "--arms", arms, *size_overrides(L, d), *extra,
            *(["--resume"] if (out / "budget.json").is_file() else [])]  # compare refuses --resume on a new folder


def run_job(command, job: tuple[int, int, str]) -> None:
    """Train one (L, d, arm) with one torch thread; a failure raises with the end of its stderr."""
    L, d, arm = job
    t0 = time.perf_counter()
    r = subprocess.run(command(L, d, arm), cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{L}x{d} {arm} failed:\n{r.stderr[-3000:]}")
    print(f"  {L}x{d} {arm} done in {time.perf_counter() - t0:.0f} s", flush=True)


def collect(runs: Path, sizes: list[tuple[int, int]]) -> list[dict]:
    """One record per size: its compare summary, budget plan and every run's curve."""
    cells = []
    for L, d in sizes:
        out = runs / f"{L}x{d}"
        curves = {str(p.parent.relative_to(out)): [{k: v for k, v in rec.items() if k in CURVE_KEYS}
                                                  for rec in read_metrics(p.parent)]
                  for p in sorted(out.rglob("record.json"))}
        cells.append(dict(n_layer=L, d_model=d, lr=BASE_LR * BASE_WIDTH / d,
                          summary=json.loads((out / "summary.json").read_text()),
                          budget=json.loads((out / "budget.json").read_text()), curves=curves))
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="compare processes at once (one core each)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 sizes, 1 seed, 20 steps; nothing written to results/")
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="comma-separated n_layer values")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="comma-separated d_model values")
    ap.add_argument("--dense-only", action="store_true",
                    help="train only the dense arms of the sizes in results/scaling_trend.json and merge them in")
    args = ap.parse_args()
    if args.dense_only:
        return dense_only(args.jobs, [int(d) for d in args.widths.split(",")])
    grid = [(int(L), int(d)) for L in args.depths.split(",") for d in args.widths.split(",")]
    sizes = [(4, 64), (4, 192)] if args.quick else grid
    seeds = 1 if args.quick else SEEDS
    extra = ["--train.steps=20", "--train.eval_every=10", "--optim.warmup_steps=4"] if args.quick else \
        ["--train.eval_every=50", "--train.batch_size=16"]
    runs = ROOT / "runs" / ("scaling_quick" if args.quick else "scaling")
    env = dict(os.environ, OMP_NUM_THREADS="1")

    command = lambda L, d, arms: compare_command(runs, L, d, arms, seeds, extra)
    one = lambda job: run_job(command, job)

    # the baseline of a size first (the flops budget is the baseline's), longest sizes first
    jobs = sorted(((L, d, a) for L, d in sizes for a in size_arms(L)),
                  key=lambda j: (j[2] != "baseline", -j[0] * j[1] ** 2))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, [j for j in jobs if j[2] == "baseline"]))
        list(pool.map(one, [j for j in jobs if j[2] != "baseline"]))
    for L, d in sizes:   # the table over all arms of a size (writes its summary.json)
        subprocess.run(command(L, d, ",".join(size_arms(L))), cwd=ROOT, env=env, capture_output=True, text=True,
                       check=True)
    cells = collect(runs, sizes)
    wall = round(time.perf_counter() - t0, 1)
    print(f"scaling sweep: {len(sizes)} sizes x {len(ARMS)} arms x {seeds} seeds in {wall:.0f} s with {args.jobs} jobs")
    if not args.quick:
        write_json(ROOT / "results" / "scaling_trend.json",
                   dict(name="scaling_trend", command="python benchmarks/scaling.py " + " ".join(sys.argv[1:]), config=CONFIG.name,
                        sizes=sizes, arms=list(ARMS), dense={f"{L}x{d}": size_arms(L)[len(ARMS):] for L, d in sizes},
                        seeds=seeds, head_dim=HEAD_DIM,
                        lr_rule=f"{BASE_LR} * {BASE_WIDTH} / d_model", extra=extra, wall_seconds=wall,
                        jobs=args.jobs, environment=environment(), cells=cells))
    return 0


def dense_only(jobs: int, widths: list[int]) -> int:
    """Train the dense arms of every size of results/scaling_trend.json into runs/scaling_dense/<L>x<d>/
    (same config, overrides, seeds and FLOPs budget as the sweep) and merge their rows, and every arm's paired
    gaps to the baseline and the frontier (`accellib.compare.paired_gaps`), into the record. `widths`: only the
    sizes of these widths (the record says which sizes have a frontier)."""
    from accellib.compare import paired_gaps
    path = ROOT / "results" / "scaling_trend.json"
    res = json.loads(path.read_text())
    runs = ROOT / "runs" / "scaling_dense"
    extra, seeds = res["extra"], res["seeds"]

    command = lambda L, d, arms: compare_command(runs, L, d, arms, seeds, extra)
    one = lambda job: run_job(command, job)

    sizes = [tuple(s) for s in res["sizes"] if s[1] in widths]
    todo = sorted(((L, d, a) for L, d in sizes for a in size_arms(L)[len(ARMS):]), key=lambda j: -j[0] * j[1] ** 2)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, todo))
    for cell in res["cells"]:
        L, d = cell["n_layer"], cell["d_model"]
        if (L, d) not in sizes:
            continue
        out = runs / f"{L}x{d}"
        rows = [r for r in cell["summary"]["rows"] if not r["arm"].startswith("dense-")]
        for arm in size_arms(L)[len(ARMS):]:
            labels = [f"seed{cell['budget']['seed0'] + k}" for k in range(seeds)]
            recs = {lb: json.loads((out / arm / lb / "record.json").read_text())["final"] for lb in labels}
            rows.append(dict(arm=arm, seeds=seeds, steps=statistics.fmean(r["step"] for r in recs.values()),
                             val_losses=[recs[lb]["val_loss"] for lb in labels], seed_labels=labels,
                             val_loss=statistics.fmean(recs[lb]["val_loss"] for lb in labels),
                             val_loss_sd=statistics.stdev(recs[lb]["val_loss"] for lb in labels),
                             flops=statistics.fmean(r["flops"] for r in recs.values()),
                             wall_s=statistics.fmean(r["wall"] for r in recs.values())))
            cell["curves"].update({f"{arm}/{lb}": [{k: v for k, v in rec.items() if k in CURVE_KEYS}
                                                   for rec in read_metrics(out / arm / lb)] for lb in labels})
        for r in rows:
            r.setdefault("seed_labels", [f"seed{cell['budget']['seed0'] + k}" for k in range(len(r["val_losses"]))])
            r.pop("vs_baseline", None), r.pop("vs_frontier", None)
        cell["summary"]["rows"] = rows
        cell["summary"]["frontier"] = paired_gaps(rows, "baseline")
    res["dense"] = {f"{L}x{d}": size_arms(L)[len(ARMS):] for L, d in sizes}
    res["dense_command"] = "python benchmarks/scaling.py --dense-only --widths " + ",".join(map(str, widths))
    res["dense_wall_seconds"] = round(time.perf_counter() - t0, 1)
    res["dense_environment"] = environment()
    write_json(path, res)
    print(f"dense arms of {len(sizes)} sizes merged into {path.relative_to(ROOT)} in {res['dense_wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
