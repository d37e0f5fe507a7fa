"""The results cache that notebooks read: results/<name>.json written by `make results`
(benchmarks/reproduce.py), each the summary, the budget plan and every run's curves of one
multi-seed `accellib.compare` experiment, with its config, commit, versions and wall time.

    res = load_result("tutorial_flops")             # every arm at the baseline's FLOPs, 3 seeds
    row = arm_row(res, "pld")                       # mean/sd loss, ratios, time to target
    check_live(live_final, res, "pld")              # the notebook's live run against the cached one
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from . import REPO_ROOT
from .plotting import X_LABELS, arm_color, draw_references

RESULTS = REPO_ROOT / "results"


class ResultMissing(FileNotFoundError):
    """A results/<name>.json that `make results` has not written."""


def load_result(name: str, folder: Path = RESULTS) -> dict:
    p = Path(folder) / f"{name}.json"
    if not p.is_file():
        raise ResultMissing(f"{p} is missing; write it with: python benchmarks/reproduce.py --only {name}")
    return json.loads(p.read_text())


def arm_row(res: dict, arm: str) -> dict:
    rows = {r["arm"]: r for r in res["summary"]["rows"]}
    if arm not in rows:
        raise KeyError(f"{res['name']} has no arm {arm!r}; it has {', '.join(rows)}")
    return rows[arm]


def arm_runs(res: dict, arm: str) -> dict[str, list[dict]]:
    """{'arm/seed<k>': curve} of one arm's seeds."""
    return {k: v for k, v in res["curves"].items() if k.split("/")[0] == arm}


def seed_run(res: dict, arm: str, seed: int | None = None) -> list[dict]:
    """One seed's curve (the config's own seed by default: the run a notebook repeats live)."""
    seed = res["budget"]["seed0"] if seed is None else seed
    return res["curves"][f"{arm}/seed{seed}" if res["summary"]["seeds"] > 1 else arm]


def check_live(live_final: dict, res: dict, arm: str, tol: float = 0.02) -> float:
    """Assert that a notebook's live run (same config and seed as the cached run) ends within `tol` nats
    of the cached run's final validation loss; returns the difference. Same code and seed give the same
    loss up to the CPU's float rounding (1e-4 to 1e-3 nats between kernel paths); a changed technique,
    schedule or config moves it by far more than `tol`."""
    cached = [r for r in seed_run(res, arm) if "val_loss" in r][-1]
    diff = live_final["val_loss"] - cached["val_loss"]
    assert live_final["step"] == cached["step"], (live_final["step"], cached["step"])
    assert abs(diff) < tol, f"live {arm} run ends at {live_final['val_loss']:.4f}, the cache at {cached['val_loss']:.4f}"
    return diff


def fmt_to_target(x: float) -> str:
    return "not reached" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def plot_arms(res: dict, arms: list[str], xs=("flops", "wall"), references: dict | None = None, title=None):
    """Validation loss of each arm's seeds (thin) and their mean (thick, at the evaluation points all
    seeds share), against each x in `xs`; one colour per arm, unigram/bigram lines."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(xs), figsize=(5 * len(xs), 3.2), squeeze=False)
    for ax, x in zip(axes[0], xs):
        for arm in arms:
            c = arm_color(arm)
            curves = [[r for r in recs if "val_loss" in r and not r.get("transition")]
                      for recs in arm_runs(res, arm).values()]
            for recs in curves:
                ax.plot([r[x] for r in recs], [r["val_loss"] for r in recs], color=c, lw=0.7, alpha=0.4)
            n = min(len(v) for v in curves)
            mean_x = [sum(v[i][x] for v in curves) / len(curves) for i in range(n)]
            mean_y = [sum(v[i]["val_loss"] for v in curves) / len(curves) for i in range(n)]
            ax.plot(mean_x, mean_y, color=c, lw=2, label=f"{arm} (mean of {len(curves)} seeds)")
        draw_references(ax, references)
        ax.set_xlabel(X_LABELS.get(x, x))
        ax.set_ylabel("validation loss (nats/token)")
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
