"""Low-precision training numerics (Wang et al., NeurIPS 2018; Sakr et al., ICLR 2019): what the exact
emulation costs, and what FP8 operands, narrow accumulation and the weight-update rounding do to training.

1. overhead   the emulated Linear (FP8 operands, (1,6,9) accumulation; forward + both backward GEMMs)
              against F.linear on the layer shapes of configs/lowp.yaml (1024 tokens), one thread,
              paired and interleaved, median of rounds; and the training step of the fp8_chunk64 arm
              against the fp32 baseline (accellib.drivers.budget.paired_step_seconds)
2. training   every arm of configs/lowp.yaml at equal steps through `accellib.compare` (the one trainer
              loop): fp32, FP8 operands only, + naive (1,6,9) accumulation, + chunked (CL 64), and RNE
              instead of SR weight updates, 3 seeds; val-loss gaps to the baseline and between arms (naive -
              chunked, RNE - SR), paired by seed and judged by accellib.analysis.stats
3. sweep      the accumulator-mantissa arms (acc_m*), 1 seed, next to the m_acc that the variance
              retention ratio predicts for each GEMM (accellib.numerics.vrr)

    python benchmarks/low_precision.py --jobs 2     # about 50 minutes on 2 cores: results/low_precision_cpu.json
    python benchmarks/low_precision.py --quick      # smoke run (20 steps, 1 seed): runs/low_precision_quick/
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

from accellib.analysis import stats  # noqa: E402
from accellib.drivers.arms import arm_configs  # noqa: E402
from accellib.numerics.formats import E5M2, E6M9  # noqa: E402
from accellib.numerics.linear import LowpGemms, emulated_linear  # noqa: E402
from accellib.core.records import environment, table, write_json  # noqa: E402
from reproduce import compare  # noqa: E402

CONFIG = ROOT / "configs" / "lowp.yaml"
MAIN = ["baseline", "fp8_fp32acc", "fp8_naive", "fp8_chunk64", "fp8_chunk64_rne"]
SHAPES = [(1024, 64, 192), (1024, 64, 64), (1024, 64, 256), (1024, 256, 64)]   # tokens, d_in, d_out


def _fwd_bwd(fn, x, w, b, g) -> float:
    x, w, b = (t.detach().requires_grad_(True) for t in (x, w, b))
    t0 = time.perf_counter()
    fn(x, w, b).backward(g)
    return time.perf_counter() - t0


def linear_overhead(rounds: int) -> list[dict]:
    torch.set_num_threads(1)
    rows = []
    for tokens, d_in, d_out in SHAPES:
        x, w, b = torch.randn(tokens, d_in), torch.randn(d_out, d_in) * 0.1, torch.zeros(d_out)
        g = torch.randn(tokens, d_out) * 1e-4
        fns = {"f_linear": F.linear}
        for chunk in (0, 64):
            gm = LowpGemms(E5M2, E6M9, chunk, chunk, chunk, loss_scale=1024.0)
            fns[f"chunk{chunk}"] = lambda x, w, b, gm=gm: emulated_linear(x, w, b, gm)
        per = {k: [] for k in fns}
        for _ in range(rounds):
            for k, fn in fns.items():
                per[k].append(_fwd_bwd(fn, x, w, b, g))
        base = statistics.median(per["f_linear"])
        row = dict(tokens=tokens, d_in=d_in, d_out=d_out, f_linear_ms=round(base * 1e3, 3))
        for k in ("chunk0", "chunk64"):
            row[f"{k}_ms"] = round(statistics.median(per[k]) * 1e3, 1)
            row[f"{k}_ratio"] = round(statistics.median(a / c for a, c in zip(per[k], per["f_linear"])), 1)
        rows.append(row)
    return rows


def step_overhead(rounds: int) -> dict:
    from accellib.drivers.budget import paired_step_seconds
    cfgs = arm_configs(CONFIG, ["baseline", "fp8_chunk64"], ["--train.threads=1"])
    return paired_step_seconds(cfgs, positions=2, rounds=rounds)


def gaps(summary: dict, seeds: int) -> dict:
    """Each arm's val loss minus the baseline's, and naive - chunked, RNE - SR, paired by seed: the course's one
    rule (accellib.analysis.stats: mean, 95% t-interval, verdict wins / loses / not resolved at n seeds)."""
    rows = {r["arm"]: r for r in summary["rows"]}
    per = {a: r["val_losses"] for a, r in rows.items()}

    def paired(a: str, b: str) -> dict:
        return stats.paired(per[a], per[b]).to_dict()
    out = {a: paired(a, "baseline") for a in per if a != "baseline"}
    if {"fp8_naive", "fp8_chunk64", "fp8_chunk64_rne"} <= set(per):
        out["naive_minus_chunked"] = paired("fp8_naive", "fp8_chunk64")
        out["rne_minus_sr"] = paired("fp8_chunk64_rne", "fp8_chunk64")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    seeds, extra = (1, ["--train.steps=20", "--train.eval_every=10"]) if args.quick else (3, [])
    runs = ROOT / "runs" / ("low_precision_quick" if args.quick else "low_precision")
    arms = list(yaml.safe_load(CONFIG.read_text())["arms"])
    sweep = ["baseline"] + [a for a in arms if a.startswith("acc_m")]
    t0 = time.perf_counter()
    print("== overhead of the emulated Linear (forward + backward, one thread)")
    lin = linear_overhead(3 if args.quick else 7)
    print(table(lin))
    step = step_overhead(1 if args.quick else 3)
    print(f"   training step: fp8_chunk64 {step['ratio']['fp8_chunk64']:.1f} x the fp32 baseline "
          f"({step['seconds']['fp8_chunk64']:.2f} s vs {step['seconds']['baseline']:.3f} s)")
    print("== training, equal steps", flush=True)
    train = compare(CONFIG, runs / "train", MAIN, "steps", seeds, extra, args.jobs)
    print("== accumulator-mantissa sweep, one seed", flush=True)
    sw = compare(CONFIG, runs / "sweep", sweep, "steps", 1, extra, args.jobs)
    from accellib.numerics.vrr import predict_table
    from accellib.data.tokens import load_token_data
    base = arm_configs(CONFIG, ["baseline"], [])["baseline"]
    base.model.vocab_size = load_token_data(ROOT / base.data.path).vocab_size  # the head's K in the backward pass
    rec = dict(name="low_precision_cpu", command="python benchmarks/low_precision.py --jobs 2",
               config=yaml.safe_load(CONFIG.read_text()), seeds=seeds, jobs=args.jobs,
               wall_seconds=round(time.perf_counter() - t0, 1), environment=environment(),
               # runs kept from an earlier call (compare --resume) are not in wall_seconds: their own training time
               runs_train_seconds=round(sum(c[-1]["wall"] for r in (train, sw) for c in r["curves"].values()), 1),
               linear_overhead=lin, step_overhead=step, training=train, gaps=gaps(train["summary"], seeds),
               sweep=sw, vrr_prediction={f"chunk{c}": predict_table(base.model, base.train.batch_size, c)
                                         for c in (0, 32, 64)})
    for k, v in rec["gaps"].items():
        print(f"   {k:<22} {stats.Paired(**{**v, 'gaps': tuple(v['gaps'])}).text('.4f')}  "
              f"per seed {[round(x, 4) for x in v['gaps']]}")
    out = runs / "low_precision_cpu.json" if args.quick else ROOT / "results" / "low_precision_cpu.json"
    write_json(out, rec)
    print(f"wrote {out.relative_to(ROOT)} ({rec['wall_seconds']:.0f} s; the runs trained for "
          f"{rec['runs_train_seconds']:.0f} s in all, excluding evaluation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
