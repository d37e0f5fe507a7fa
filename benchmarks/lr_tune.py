"""Tune a config's peak LR and warm-up until the best LR is interior (used by `reproduce.py --only long_lr_sweep`).

A grid is only a tuning if its best point has a measured, worse neighbour on both sides: a best at the edge
says "go further", not "here". The search is a coordinate descent on (LR, warm-up) over seeds:

1. every LR of the grid at the config's warm-up;
2. the best point so far (lowest mean final validation loss over the seeds) gets its two LR neighbours on the
   ladder at its warm-up (the ladder is extended by the grid's end ratio when the best is at an end) and
   every warm-up of `warmups` at its LR;
3. repeat 2 until nothing new is asked for (at most `rounds` times), then one table over every arm.

Arms are named `lr<value>_wu<steps>`; the config's own point is its `baseline` arm. Every arm is one
`accellib.compare --budget steps` run per seed, so the search resumes where it stopped.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable

import yaml


def arm_name(lr: float, wu: int) -> str:
    return f"lr{lr:g}_wu{wu}"


def ladder_neighbours(ladder: list[float], lr: float) -> tuple[float, float]:
    """The LRs just below and above `lr` on the ladder, extending it geometrically past an end."""
    lad = sorted(ladder)
    i = lad.index(lr)
    lo = lad[i - 1] if i > 0 else round(lad[0] / (lad[1] / lad[0]), 12)
    hi = lad[i + 1] if i + 1 < len(lad) else round(lad[-1] * (lad[-1] / lad[-2]), 12)
    return lo, hi


def best_point(losses: dict[tuple[float, int], list[float]]) -> tuple[float, int]:
    """The (LR, warm-up) with the lowest mean loss (ties: the smaller LR, then the shorter warm-up)."""
    return min(sorted(losses), key=lambda p: statistics.fmean(losses[p]))


def interior(losses: dict[tuple[float, int], list[float]]) -> dict:
    """Whether the best point's LR has a measured neighbour on both sides (at its warm-up), each with a
    higher mean loss; with the neighbours' means."""
    lr, wu = best_point(losses)
    lrs = sorted(l for l, w in losses if w == wu)
    i = lrs.index(lr)
    mean = lambda p: statistics.fmean(losses[p])
    below = lrs[i - 1] if i > 0 else None
    above = lrs[i + 1] if i + 1 < len(lrs) else None
    return dict(best_lr=lr, best_warmup=wu, best_mean=mean((lr, wu)),
                below=None if below is None else dict(lr=below, mean=mean((below, wu))),
                above=None if above is None else dict(lr=above, mean=mean((above, wu))),
                interior=below is not None and above is not None
                and mean((below, wu)) > mean((lr, wu)) < mean((above, wu)))


def tune(config: Path, out: Path, grid: tuple[float, ...], warmups: tuple[int, ...],
         run: Callable[[Path, list[str]], dict], rounds: int = 6) -> dict:
    """Run the search (see the module docstring). `run(yaml_path, arms)` trains the named arms and returns the
    comparison's record (reproduce.compare's: summary with rows of arm and val_losses, curves, table).
    Returns that record of the last table over every arm, with "points", "search" and "best" added."""
    raw = yaml.safe_load(config.read_text())
    lr0, wu0 = float(raw["optim"]["lr"]), int(raw["optim"]["warmup_steps"])
    points: dict[str, tuple[float, int]] = {"baseline": (lr0, wu0)}
    losses: dict[tuple[float, int], list[float]] = {}
    ladder = sorted(set(grid) | {lr0})
    rounds_log = []

    def train(new: list[tuple[float, int]]) -> None:
        for p in new:
            if p not in points.values():
                points[arm_name(*p)] = p
        arms = [a for a, p in points.items() if p in new]
        body = dict(raw, arms={a: ({} if a == "baseline" else {"optim": {"lr": p[0], "warmup_steps": p[1]}})
                               for a, p in points.items()})
        cfg = out.parent / f"{out.name}.yaml"     # beside the comparison's folder, which holds only accellib's files
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(yaml.safe_dump(body, sort_keys=False))
        for r in run(cfg, arms)["summary"]["rows"]:
            losses[points[r["arm"]]] = r["val_losses"]
        rounds_log.append([arm_name(*p) for p in new])

    train([(lr, wu0) for lr in ladder])
    for _ in range(rounds):
        lr, wu = best_point(losses)
        lo, hi = ladder_neighbours(ladder, lr)
        ladder = sorted(set(ladder) | {lo, hi})
        want = [(lo, wu), (hi, wu)] + [(lr, w) for w in sorted({wu0, *warmups})]
        new = [p for p in dict.fromkeys(want) if p not in losses]
        if not new:
            break
        train(new)
    final = run(out.parent / f"{out.name}.yaml", list(points))   # one table over every arm
    return dict(final, points=[dict(arm=a, lr=p[0], warmup=p[1], val_losses=losses[p],
                             mean=statistics.fmean(losses[p])) for a, p in points.items()],
                search=rounds_log, best=interior(losses))


if __name__ == "__main__":   # the ladder and the interior check on a toy profile (no training)
    toy = {(lr, 50): [abs(lr - 0.01) * 10 + 1] for lr in (0.005, 0.007, 0.01, 0.014, 0.02)}
    print(json.dumps(interior(toy)), ladder_neighbours([0.005, 0.01, 0.02], 0.02))
