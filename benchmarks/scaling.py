"""The scale trend (notebook 09): does each technique's loss gap to a compute-matched baseline shrink as
the model grows toward the papers' regime, and where would it start to pay off?

    python benchmarks/scaling.py                 # the whole sweep, 2 processes -> results/scaling_trend.json
    python benchmarks/scaling.py --widths 64,128 # a sub-grid (the record says which sizes it holds)
    python benchmarks/scaling.py --quick         # smoke run: 2 sizes, 1 seed, 20 steps; writes nothing to results/

The grid: depth {4, 6, 12} x width {64, 128, 192} (heads of 16 dimensions), on configs/tutorial.yaml's base
and arms (baseline, pld, sbld, random_ltd, multilevel), every arm at the baseline's FLOPs of its size
(`compare --budget flops`, schedules stretched to each arm's horizon), 3 seeds. Depth 4 is the shallowest
every arm accepts: random-LTD needs a middle block and the
V-cycle merges pairs of blocks. Every size trains the tutorial's 300 steps and schedules on batches of 16
(not 32) windows of 64 tokens; eval every 50 steps. Cost: the two-width grid (--widths 64,128) is 90 runs and
1.34 core-hours of training (timed on a busy 2-core machine); width 192 adds about 1.5x that (step times
measured alone at batch 32: 1.6 s for the three width-192 sizes against 1.1 s for the six others).
The record's wall_seconds is the last invocation's: a resumed sweep counts only what it trained.

Learning rate: the tutorial's 7e-3 was tuned at d = 64 (notebook 00). Wider models get 7e-3 x 64 / d, the
1/width rule of muP for Adam's hidden-layer updates (Yang et al. 2022, "Tensor Programs V", Table 3); it is
not re-tuned per size, and every arm of a size shares it, so the gap compares like with like.

Runs live in runs/scaling/<L>x<d>/ (resumable: a killed sweep picks up where it stopped); each
(size, arm) is one `compare --arms <arm> --resume` process with one torch thread, longest first.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from accellib.records import environment, read_metrics, write_json  # noqa: E402

CONFIG = ROOT / "configs" / "tutorial.yaml"
DEPTHS = (4, 6, 12)
WIDTHS = (64, 128, 192)
ARMS = ("baseline", "pld", "sbld", "random_ltd", "multilevel")
SEEDS = 3
BASE_LR, BASE_WIDTH, HEAD_DIM = 7e-3, 64, 16
CURVE_KEYS = ("step", "train_loss", "val_loss", "flops")


def size_overrides(depth: int, width: int) -> list[str]:
    return [f"--model.n_layer={depth}", f"--model.d_model={width}", f"--model.n_head={width // HEAD_DIM}",
            f"--optim.lr={BASE_LR * BASE_WIDTH / width:.6g}"]


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
    args = ap.parse_args()
    grid = [(int(L), int(d)) for L in args.depths.split(",") for d in args.widths.split(",")]
    sizes = [(4, 64), (4, 192)] if args.quick else grid
    seeds = 1 if args.quick else SEEDS
    extra = ["--train.steps=20", "--train.eval_every=10", "--optim.warmup_steps=4"] if args.quick else \
        ["--train.eval_every=50", "--train.batch_size=16"]
    runs = ROOT / "runs" / ("scaling_quick" if args.quick else "scaling")
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def command(L: int, d: int, arms: str) -> list[str]:
        return [sys.executable, "-m", "accellib.compare", "--config", str(CONFIG), "--out", str(runs / f"{L}x{d}"),
                "--budget", "flops", "--seeds", str(seeds), "--train.threads=1", "--train.progress=false",
                "--arms", arms, *size_overrides(L, d), *extra,
                *(["--resume"] if (runs / f"{L}x{d}" / "budget.json").is_file() else [])]  # it refuses a new folder

    def one(job: tuple[int, int, str]) -> None:
        L, d, arm = job
        t0 = time.perf_counter()
        r = subprocess.run(command(L, d, arm), cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"{L}x{d} {arm} failed:\n{r.stderr[-3000:]}")
        print(f"  {L}x{d} {arm} done in {time.perf_counter() - t0:.0f} s", flush=True)

    # the baseline of a size first (the flops budget is the baseline's), longest sizes first
    jobs = sorted(((L, d, a) for L, d in sizes for a in ARMS), key=lambda j: (j[2] != "baseline", -j[0] * j[1] ** 2))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, [j for j in jobs if j[2] == "baseline"]))
        list(pool.map(one, [j for j in jobs if j[2] != "baseline"]))
    for L, d in sizes:   # the table over all arms of a size (writes its summary.json)
        subprocess.run(command(L, d, ",".join(ARMS)), cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    cells = collect(runs, sizes)
    wall = round(time.perf_counter() - t0, 1)
    print(f"scaling sweep: {len(sizes)} sizes x {len(ARMS)} arms x {seeds} seeds in {wall:.0f} s with {args.jobs} jobs")
    if not args.quick:
        write_json(ROOT / "results" / "scaling_trend.json",
                   dict(name="scaling_trend", command="python benchmarks/scaling.py " + " ".join(sys.argv[1:]), config=CONFIG.name,
                        sizes=sizes, arms=list(ARMS), seeds=seeds, head_dim=HEAD_DIM,
                        lr_rule=f"{BASE_LR} * {BASE_WIDTH} / d_model", extra=extra, wall_seconds=wall,
                        jobs=args.jobs, environment=environment(), cells=cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
