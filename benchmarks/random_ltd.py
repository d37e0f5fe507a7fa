"""Random-LTD on CPU: how much of the FLOPs saving becomes time, and LayerTokens / wall time to a
target validation loss against the baseline (Yao et al. 2022, arXiv 2211.11586).

    python benchmarks/random_ltd.py            # ~5 minutes on 2 cores (parts 1-3)
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

Part 3, what a new kept length costs (issue 42, item 3): the part-1 model at a kept length the run has not met
yet, its first step against its steady steps, eagerly and with train.compile=blocks (inductor): the ratio
first / median(steady) per length, in wall and process time, and the graphs compiled after warm-up. On a GPU a
new shape may cost more (a hypothesis: cuDNN's attention builds one execution plan per shape); there
random_ltd.step_len bounds how often a run pays it: at most (S - r0)/q + 1 lengths.

    python benchmarks/random_ltd.py --new-length     # part 3 only (~2 minutes): adds "new_length" to the JSON
"""
from __future__ import annotations

import argparse
import json
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


def new_length_cost(compile: str, lengths: list[int], warm: int, steady: int) -> dict:
    """First step at each new kept length vs the steady steps after it (process and wall time), on the part-1
    model; `compile` is train.compile. The schedule is replaced by the list of lengths: warm-up at the first,
    then each next length met once, as a ramp meets it."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    ltd_kw = {"random_ltd.enabled": True, "random_ltd.min_len": lengths[0], "train.compile": compile}
    tr = Trainer(load_config(None, overrides(**{"train.steps": 10**6}, **ltd_kw)))
    tech = next(t for t in tr.techniques if t.name == "random_ltd")
    plan = [lengths[0]] * warm + [r for r in lengths[1:] for _ in range(1 + steady)]
    tech.schedule = lambda step: plan[min(step, len(plan) - 1)]
    rows, graphs = [], None
    for i, r in enumerate(plan):
        w0, c0 = time.perf_counter(), time.process_time()
        tr.train_step()
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if i == warm - 1:
            graphs = counters["stats"]["unique_graphs"]  # everything compiled during the warm-up
        if i >= warm:
            if (i - warm) % (1 + steady) == 0:
                rows.append(dict(r=r, first_s=w, first_cpu_s=c, steady_s=[], steady_cpu_s=[]))
            else:
                rows[-1]["steady_s"].append(w)
                rows[-1]["steady_cpu_s"].append(c)
    per = [dict(r=x["r"], wall_ratio=round(x["first_s"] / statistics.median(x["steady_s"]), 3),
                cpu_ratio=round(x["first_cpu_s"] / statistics.median(x["steady_cpu_s"]), 3),
                steady_s=round(statistics.median(x["steady_s"]), 4),
                steady_spread=round(max(x["steady_s"]) / min(x["steady_s"]), 3)) for x in rows]
    out = dict(compile=compile, warm_length=lengths[0], lengths=per,
               median_wall_ratio=round(statistics.median(p["wall_ratio"] for p in per), 3),
               median_cpu_ratio=round(statistics.median(p["cpu_ratio"] for p in per), 3),
               graphs_after_warmup=counters["stats"]["unique_graphs"] - graphs)
    torch._dynamo.reset()
    return out


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
            tr.save = lambda *a, **k: None  # no checkpoint: only the metrics matter
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
    ap.add_argument("--new-length", action="store_true",
                    help="part 3 only: add its table to the JSON as 'new_length', every other field kept as it is")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.new_length:
        return new_length_main(a)
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
    return new_length_main(a)


def new_length_main(a) -> int:
    """Part 3; its table goes into the JSON as "new_length", the other fields kept as they are."""
    t0 = time.time()
    lengths = [64, 72, 96, 128, 160, 200, 240] if not a.quick else [64, 96, 128]
    warm, steady = (3, 4) if not a.quick else (2, 2)
    runs = [new_length_cost(c, lengths, warm, steady) for c in ("none", "blocks")]
    print("First step at a new kept length / steady step at it (S=256, 8 blocks, 6 drop tokens, batch 8, d=128)")
    print(f"{'compile':>8}{'lengths':>9}{'wall (median)':>15}{'CPU (median)':>14}{'per length (CPU)':>18}  graphs after warm-up")
    for x in runs:
        each = " ".join(f"{p['cpu_ratio']:.2f}" for p in x["lengths"])
        print(f"{x['compile']:>8}{len(x['lengths']):>9}{x['median_wall_ratio']:>15.3f}{x['median_cpu_ratio']:>14.3f}  "
              f"{each:<16}  {x['graphs_after_warmup']}")
    print(f"[{time.time() - t0:.0f} s]")
    out = a.out or (None if a.quick else ROOT / "results" / "random_ltd_cpu.json")
    if out:
        rec = json.loads(Path(out).read_text()) if Path(out).exists() else dict(benchmark="random_ltd")
        rec["new_length"] = dict(runs=runs, threads=1, seconds=round(time.time() - t0, 1),
                                 note="first step at a kept length the run has not met / median of the steady "
                                      "steps after it; CPU only (a GPU's per-shape cost is not measured here)")
        write_json(out, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
