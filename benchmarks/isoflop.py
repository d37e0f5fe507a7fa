"""IsoFLOP profiles in miniature (issue 35; Hoffmann et al. 2022, "Training Compute-Optimal Large Language
Models", section 3.2, approach 2): at each of four compute budgets spanning 10x, plain GPTs of one block and
widths 16-128 are each trained to exactly that budget, 3 seeds, so that every budget's best model has a
measured smaller and larger neighbour; `accellib.analysis.isoflop` then finds each budget's minimum, fits
N_opt(C) and D_opt(C) and draws the curves (notebook 00, section 7).

    python benchmarks/reproduce.py --only isoflop --jobs 2      # builds results/isoflop.json (resumable)

The budgets are the FLOPs of the scale trend's baselines (benchmarks/scaling.py: depth L x width 64, heads of
16 dimensions, batches of 16 windows of 64 tokens, eval every 50 steps), so notebook 09 can judge each technique
of results/scaling_trend.json against the compute-optimal plain model of its own budget, paired by seed:

    4x64 @ 80 steps   0.096x the tutorial budget   (the low end, so the span is >= 10x)
    4x64 @ 300        0.34x
    6x64 @ 300        0.50x
    12x64 @ 300       0.98x  (the tutorial budget: 6x64 at batch 32, 300 steps, within 2.3%)

Why one block: at these budgets depth costs more than it buys (tutorial_frontier: L1 beats L2 at equal width and
FLOPs by 0.09 nats; scaling_trend: L1 < L2 < L3 at every budget), so the profile that holds each budget's minimum
is the width profile of one-block models; the deeper plain models of scaling_trend (L2, L3 at width 64) are
drawn beside it as the depth points.

The LR rule (stated once, here): peak LR 7e-3 x 64 / d_model, the scale trend's rule anchored at the tutorial's
tuned LR at width 64, cosine to 0.1x at each run's own last step (its own horizon), warm-up min(60, 20% of the
run's steps) (the tutorial's 60 steps are 20% of its 300). Runs of >= 300 steps at width 64 are therefore the
same runs as scaling_trend's dense-L1 (a check that the two caches pair). Not tuned per point: after the grid,
each budget's best model is re-trained at 0.5x and 2x its LR (`lr_check`), which says whether the rule's LR is
interior at the minimum.
"""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "tutorial.yaml"
BASE_LR, BASE_WIDTH, HEAD_DIM, WARMUP, WARMUP_FRAC = 7e-3, 64, 16, 60, 0.2
# name: (baseline depth, baseline steps, widths of the one-block profile)
BUDGETS = {
    "4x64@80": (4, 80, (8, 16, 32, 48, 64, 96)),
    "4x64": (4, 300, (8, 16, 32, 48, 64, 96)),
    "6x64": (6, 300, (16, 32, 48, 64, 96, 128)),
    "12x64": (12, 300, (32, 48, 64, 96, 128)),
}
LR_CHECK = (0.5, 2.0)
LR_RULE = (f"peak {BASE_LR} * {BASE_WIDTH} / d_model; warm-up min({WARMUP}, {WARMUP_FRAC} x steps); cosine to 0.1x "
           "at each run's own last step")
CURVE_KEYS = ("step", "val_loss", "flops", "tokens")


def lr_of(width: int) -> float:
    return float(f"{BASE_LR * BASE_WIDTH / width:.6g}")


def warmup_of(steps: int) -> int:
    return max(1, min(WARMUP, round(WARMUP_FRAC * steps)))


def arm_name(width: int, lr_mult: float = 1.0) -> str:
    """`dense-L1-d32` (a plain arm: the frontier is chosen among these) or `lrx2-L1-d32` (an LR check: not plain)."""
    return f"dense-L1-d{width}" if lr_mult == 1.0 else f"lrx{lr_mult:g}-L1-d{width}"


def budget_yaml(out: Path, name: str, checks: dict[int, tuple[float, ...]] | None = None,
                only_checks: bool = False) -> tuple[Path, list[str], float]:
    """configs/tutorial.yaml's base at the budget's baseline (depth L x 64, batch 16, its steps) with one plain
    arm per width of the profile, each at the LR rule's peak LR and warm-up for the steps the budget gives it;
    `checks` {width: LR multiples} adds the LR-check arms (`only_checks`: those and the baseline only). Returns the YAML's path, its arms and the budget."""
    from accellib.drivers.arms import arm_configs, check_data
    from accellib.drivers.budget import planned_flops, steps_for_flops
    from accellib.core.config import apply_dict
    depth, steps, widths = BUDGETS[name]
    raw = yaml.safe_load(CONFIG.read_text())
    raw["model"].update(n_layer=depth, n_head=BASE_WIDTH // HEAD_DIM)
    raw["train"].update(steps=steps, batch_size=16, eval_every=50)
    raw["optim"].update(lr=lr_of(BASE_WIDTH), warmup_steps=warmup_of(steps))
    cfgs = arm_configs(CONFIG, ["baseline"], [])
    base = apply_dict(cfgs["baseline"], {k: raw[k] for k in ("model", "train", "optim")})
    check_data({"baseline": base})
    target = planned_flops(base)
    arms = {"baseline": {}}
    for w in widths:
        mults = (() if only_checks else (1.0,)) + tuple((checks or {}).get(w, ()))
        for mult in mults:
            model = dict(n_layer=1, d_model=w, n_head=max(1, w // HEAD_DIM))
            n = steps_for_flops(apply_dict(copy.deepcopy(base), {"model": model}), target)
            arms[arm_name(w, mult)] = {"model": model, "optim": {"lr": float(f"{lr_of(w) * mult:.6g}"),
                                                                "warmup_steps": warmup_of(n)}}
    raw["arms"] = arms
    out.parent.mkdir(parents=True, exist_ok=True)   # beside the comparison's folder, which holds only accellib's files
    p = out.parent / f"{out.name}.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p, list(arms), target


def best_width(summary: dict) -> int:
    """The profile's best width by mean loss over seeds (the plain one-block arms only)."""
    rows = [r for r in summary["rows"] if r["arm"].startswith("dense-L1-d")]
    return int(min(rows, key=lambda r: r["val_loss"])["arm"].rsplit("d", 1)[1])


def build(runs: Path, seeds: int, compare, regime, jobs: int, extra: list[str]) -> dict:
    """Every budget's profile (results/isoflop.json). `compare(config, out, arms, budget, seeds, extra, jobs)` and
    `regime(config, rows, curves)` are benchmarks/reproduce.py's (one process per arm, resumable; tokens per
    parameter counted on all parameters)."""
    cells = {}
    for name in BUDGETS:
        cfg, arms, flops = budget_yaml(runs / name, name)
        cells[name] = _cell(compare(cfg, runs / name, arms, "flops", seeds, extra, jobs), cfg, name, flops, regime)
    return dict(cells=cells, lr_rule=LR_RULE, head_dim=HEAD_DIM,
                budgets={k: dict(n_layer=v[0], steps=v[1], widths=list(v[2])) for k, v in BUDGETS.items()})


def build_lr_check(runs: Path, seeds: int, compare, regime, jobs: int, extra: list[str], grid: dict) -> dict:
    """results/isoflop_lr.json: each budget's best width of the grid `grid` (results/isoflop.json) re-trained at
    LR_CHECK x the rule's LR, same budget and seeds, beside the budget's baseline (the pairing anchor): is the rule's
    LR interior at the minimum? The rule's own run is the grid's (paired by seed label)."""
    cells = {}
    for name in BUDGETS:
        w = best_width(grid["cells"][name]["summary"])
        cfg, arms, flops = budget_yaml(runs / name, name, {w: LR_CHECK}, only_checks=True)
        cells[name] = _cell(compare(cfg, runs / name, arms, "flops", seeds, extra, jobs), cfg, name, flops, regime)
        cells[name]["lr_check"] = dict(width=w, rule_arm=arm_name(w), multiples=list(LR_CHECK),
                                       arms=[arm_name(w, m) for m in LR_CHECK])
    return dict(cells=cells, lr_rule=LR_RULE, multiples=list(LR_CHECK))


def _cell(res: dict, cfg: Path, name: str, flops: float, regime) -> dict:
    res["regime"] = regime(cfg, res["summary"]["rows"], res["curves"])
    depth, steps, widths = BUDGETS[name]
    res.update(n_layer=depth, d_model=BASE_WIDTH, steps=steps, widths=list(widths), flops=flops)
    res.pop("table", None)
    # the eval points only (the train-loss records would make the file ~10x larger)
    res["curves"] = {k: [{f: r[f] for f in CURVE_KEYS if f in r} for r in c if "val_loss" in r]
                     for k, c in res["curves"].items()}
    return res
