"""Multi-level V-cycle vs the baseline on CPU: FLOPs and wall time to reach the baseline's final
validation loss, and the loss at equal FLOPs; 3 seeds x 2 model sizes, runs interleaved
(baseline, V-cycle, baseline, V-cycle, ...), medians reported.

    python benchmarks/multilevel.py          (~6 min on 2 cores)
    python benchmarks/multilevel.py --quick  (smoke, ~30 s)

Writes results/multilevel_cpu.json. Not a test: wall times depend on the machine.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accellib.core.config import load_config  # noqa: E402
from accellib.core.records import read_metrics, write_json  # noqa: E402
from accellib.drivers.vcycle import run_vcycle  # noqa: E402
from accellib.train import training_function  # noqa: E402

SIZES = {  # name -> (n_layer, d_model, n_head, seq_len, batch)
    "4L-d64": (4, 64, 4, 64, 16),
    "4L-d128": (4, 128, 4, 128, 16),
}
ML = ["--multilevel.enabled=true", "--multilevel.warm_frac=0.05", "--multilevel.small_frac=0.5",
      "--multilevel.final_frac=0.8", "--multilevel.small_lr_mult=2", "--multilevel.rewarm_steps=5",
      "--multilevel.alpha=0.25"]


def overrides(size: str, steps: int, seed: int) -> list[str]:
    L, d, H, T, B = SIZES[size]
    return [f"--data.path={ROOT / 'data' / 'shakespeare'}", f"--model.n_layer={L}", f"--model.d_model={d}",
            f"--model.n_head={H}", f"--model.seq_len={T}", "--model.tie_head=false", f"--train.batch_size={B}",
            f"--train.steps={steps}", f"--train.eval_every={max(1, steps // 8)}", "--train.eval_windows=32",
            "--train.progress=false", "--train.threads=1", "--optim.lr=3e-3", "--optim.warmup_steps=10",
            f"--train.seed={seed}"]


def at_target(recs: list[dict], target: float) -> tuple[float, float]:
    """(FLOPs, wall) of the first evaluation at or below target; nan if never reached."""
    for r in recs:
        if "val_loss" in r and not r.get("transition") and r["val_loss"] <= target + 1e-9:
            return r["flops"], r["wall"]
    return math.nan, math.nan


def loss_at(recs: list[dict], flops: float) -> float:
    pts = [(r["flops"], r["val_loss"]) for r in recs if "val_loss" in r and not r.get("transition")]
    for (f1, l1), (f2, l2) in zip(pts, pts[1:]):
        if f1 <= flops <= f2:
            return l1 + (l2 - l1) * (flops - f1) / (f2 - f1)
    return pts[-1][1] if flops >= pts[-1][0] else math.nan


def _median(xs: list[float]) -> float:
    """Median over every seed; a seed that never reached the target counts as infinitely slow (it is
    not dropped), so the median is nan ("not reached") when half or more of the seeds miss."""
    m = statistics.median(math.inf if math.isnan(x) else x for x in xs)
    return m if math.isfinite(m) else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, the smaller size, 40 steps")
    args = ap.parse_args()
    sizes, seeds, steps = (["4L-d64"], [0], 40) if args.quick else (list(SIZES), [0, 1, 2], 200)
    tmp = Path(tempfile.mkdtemp(prefix="bench_ml_"))
    rows = []
    for size in sizes:
        per_seed = []
        for seed in seeds:  # interleaved: baseline then V-cycle for each seed
            ov = overrides(size, steps, seed)
            training_function(load_config(None, ov), tmp / f"{size}_{seed}_base")
            run_vcycle(load_config(None, ov + ML), tmp / f"{size}_{seed}_ml")
            b, v = read_metrics(tmp / f"{size}_{seed}_base"), read_metrics(tmp / f"{size}_{seed}_ml")
            bv = [r for r in b if "val_loss" in r]
            vv = [r for r in v if "val_loss" in r and not r.get("transition")]
            target, bf, bw = bv[-1]["val_loss"], bv[-1]["flops"], bv[-1]["wall"]
            vf, vw = at_target(v, target)
            small = [r for r in vv if r["stage"] == 1][-1]
            per_seed.append(dict(
                seed=seed, target=target, flops_to_target=vf / bf, wall_to_target=vw / bw,
                cycle_flops=vv[-1]["flops"] / bf, cycle_wall=vv[-1]["wall"] / bw,
                ml_final=vv[-1]["val_loss"], base_at_equal_flops=loss_at(b, vv[-1]["flops"]),
                small_end=small["val_loss"], small_end_flops=small["flops"] / bf,
                base_at_small_end=loss_at(b, small["flops"])))
        med = {k: _median([r[k] for r in per_seed]) for k in per_seed[0] if k != "seed"}
        reached = sum(not math.isnan(r["flops_to_target"]) for r in per_seed)
        rows.append(dict(size=size, steps=steps, seeds=seeds, reached=reached, median=med, per_seed=per_seed))

    head = (f"{'size':<9}{'target':>7}{'reached':>8}{'FLOPs→tgt':>10}{'wall→tgt':>9}{'cycle FLOPs':>12}"
            f"{'cycle wall':>11}{'ML loss':>8}{'base@=F':>8}{'small end':>10}{'base@=F':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        m = r["median"]
        print(f"{r['size']:<9}{m['target']:>7.3f}{r['reached']:>5}/{len(r['seeds'])}{m['flops_to_target']:>10.3f}"
              f"{m['wall_to_target']:>9.3f}{m['cycle_flops']:>12.3f}{m['cycle_wall']:>11.3f}{m['ml_final']:>8.3f}"
              f"{m['base_at_equal_flops']:>8.3f}{m['small_end']:>10.3f}{m['base_at_small_end']:>8.3f}")
    print("FLOPs/wall columns are ratios to the baseline's full run (medians over seeds; nan = target not "
          "reached within the cycle); base@=F = the baseline's loss at the same FLOPs.")
    if not args.quick:
        write_json(ROOT / "results" / "multilevel_cpu.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
