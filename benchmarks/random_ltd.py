"""Random-LTD on CPU: how much of the FLOPs saving becomes time, and LayerTokens / wall time to a
target validation loss against the baseline (Yao et al. 2022, arXiv 2211.11586).

    python benchmarks/random_ltd.py            # ~4 minutes on 2 cores
    python benchmarks/random_ltd.py --quick                                  # smoke test, ~30 s

Part 1, equal steps: one baseline trainer and one random-LTD trainer at a fixed kept length r
(S=256, 8 blocks of which 6 drop tokens, so the middle blocks dominate the step), train steps
interleaved A, B, A, B, ...; the median step-time ratio is set beside the analytic FLOPs ratio.
"realised" = (1 - time ratio) / (1 - FLOPs ratio): the share of the FLOPs saving seen as time.

Part 2, to a target: baseline (step LR, T steps) vs random-LTD (MSLG + LayerToken LR, stopping at
the baseline's LayerTokens), 3 seeds. Targets per seed: the baseline's final validation loss and
its loss at 80% of its run. Reported: LayerTokens and training wall time (eval excluded) at the
first evaluation at or below the target, as ratios to the baseline's.
Writes the table to results/random_ltd_cpu.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from accellib.analysis import flops as F  # noqa: E402
from accellib.core.config import load_config  # noqa: E402
from accellib.core.records import read_metrics, write_json  # noqa: E402
from accellib.core.trainer import Trainer  # noqa: E402

DATA = ROOT / "data" / "shakespeare"


def overrides(seed=1337, **kw):
    base = {"data.path": str(DATA), "model.kind": "gpt", "model.n_layer": 8, "model.d_model": 128,
            "model.n_head": 4, "model.seq_len": 256, "train.batch_size": 8, "train.seed": seed,
            "train.progress": False, "train.eval_windows": 16, "optim.lr": 3e-3, "optim.warmup_steps": 10}
    base.update(kw)
    return [f"--{k}={v}" for k, v in base.items()]


def equal_steps(r: int, pairs: int, warm: int) -> dict:
    """Median per-step wall and process time of baseline vs random-LTD at kept length r."""
    ltd_kw = {"random_ltd.enabled": True, "random_ltd.min_len": r, "random_ltd.ramp_steps": 10**9}
    arms = {"base": Trainer(load_config(None, overrides(**{"train.steps": 10**6}))),
            "ltd": Trainer(load_config(None, overrides(**{"train.steps": 10**6}, **ltd_kw)))}
    times = {k: [] for k in arms}
    cpu = {k: [] for k in arms}
    for i in range(warm + pairs):
        for k, tr in arms.items():  # interleaved A, B, A, B
            w0, c0 = time.perf_counter(), time.process_time()
            tr.train_step()
            if i >= warm:
                times[k].append(time.perf_counter() - w0)
                cpu[k].append(time.process_time() - c0)
    mc, B, S = arms["base"].cfg.model, 8, 256
    fl = {k: F.train_step_flops(mc, B, S, tr.plan(0, 0)) for k, tr in arms.items()}
    fr = fl["ltd"] / fl["base"]
    tr_ = statistics.median(times["ltd"]) / statistics.median(times["base"])
    cr = statistics.median(cpu["ltd"]) / statistics.median(cpu["base"])
    return dict(r=r, flops_ratio=round(fr, 4), time_ratio=round(tr_, 4), cpu_time_ratio=round(cr, 4),
                realised=round((1 - tr_) / (1 - fr), 3), base_step_s=round(statistics.median(times["base"]), 4),
                ltd_step_s=round(statistics.median(times["ltd"]), 4))


def first_below(recs: list[dict], target: float):
    for rec in recs:
        if "val_loss" in rec and rec["val_loss"] <= target:
            return rec
    return None


def to_target(seed: int, steps: int) -> list[dict]:
    common = {"train.steps": steps, "train.eval_every": max(1, steps // 10), "model.n_layer": 6, "model.d_model": 64}
    ltd = {"random_ltd.enabled": True, "random_ltd.min_len": 32, "random_ltd.layer_token_lr": True,
           "random_ltd.budget_steps": steps, "random_ltd.ramp_steps": round(0.6 * steps)}
    runs = {}
    with tempfile.TemporaryDirectory() as d:
        for name, kw in (("base", {}), ("ltd", {**ltd, "train.steps": 2 * steps})):
            tr = Trainer(load_config(None, overrides(seed, **{**common, **kw})), Path(d) / name)
            tr.save = lambda: None  # no checkpoint: only the metrics matter
            tr.fit()
            runs[name] = read_metrics(Path(d) / name)
    base_evals = [r for r in runs["base"] if "val_loss" in r]
    rows = []
    for tname, target in (("final", base_evals[-1]["val_loss"]),
                          ("80%", next(r for r in base_evals if r["step"] >= 0.8 * steps)["val_loss"])):
        b, l = first_below(runs["base"], target), first_below(runs["ltd"], target)
        rows.append(dict(seed=seed, target=tname, target_loss=round(target, 4),
                         base_final=round(base_evals[-1]["val_loss"], 4),
                         ltd_final=round([r for r in runs["ltd"] if "val_loss" in r][-1]["val_loss"], 4),
                         lt_ratio=None if l is None else round(l["layer_tokens"] / b["layer_tokens"], 4),
                         wall_ratio=None if l is None else round(l["wall"] / b["wall"], 4)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: few steps, one seed")
    ap.add_argument("--out", help="JSON table (default results/random_ltd_cpu.json; --quick writes none)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    pairs, warm, steps, seeds = (3, 1, 20, [1337]) if a.quick else (15, 3, 100, [1337, 1338, 1339])
    t0 = time.time()
    eq = [equal_steps(r, pairs, warm) for r in (64, 128)]
    print("Equal steps (S=256, 8 blocks, 6 drop tokens at fixed r, batch 8, d=128; medians of interleaved steps)")
    print(f"{'r':>5}{'FLOPs ratio':>13}{'time ratio':>12}{'CPU ratio':>11}{'realised':>10}{'base s/step':>13}{'LTD s/step':>12}")
    for e in eq:
        print(f"{e['r']:>5}{e['flops_ratio']:>13.3f}{e['time_ratio']:>12.3f}{e['cpu_time_ratio']:>11.3f}"
              f"{e['realised']:>10.2f}{e['base_step_s']:>13.4f}{e['ltd_step_s']:>12.4f}")
    tt = [row for s in seeds for row in to_target(s, steps)]
    print(f"\nTo a target val loss (S=256, 6 blocks, d=64; baseline {steps} steps vs random-LTD at equal LayerTokens)")
    print(f"{'seed':>5}{'target':>8}{'loss':>8}{'base end':>10}{'LTD end':>9}{'LT ratio':>10}{'wall ratio':>12}")
    fmt = lambda v: "n/r" if v is None else f"{v:.3f}"  # n/r = random-LTD never reached the target
    for r in tt:
        print(f"{r['seed']:>5}{r['target']:>8}{r['target_loss']:>8.3f}{r['base_final']:>10.3f}{r['ltd_final']:>9.3f}"
              f"{fmt(r['lt_ratio']):>10}{fmt(r['wall_ratio']):>12}")
    print(f"\n(n/r: not reached within the LayerToken budget; ratios < 1 favour random-LTD) [{time.time() - t0:.0f} s]")
    out = a.out or (None if a.quick else ROOT / "results" / "random_ltd_cpu.json")
    if out:
        write_json(out, dict(benchmark="random_ltd", quick=a.quick, equal_steps=eq, to_target=tt,
                             threads=1, seconds=round(time.time() - t0, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
