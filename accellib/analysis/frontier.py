"""The dense frontier: the best plain model at a budget, chosen without looking at the seed it is judged on.

What every equal-compute comparison is judged against besides the same-size baseline (the free-size framing of
Kaddour et al., NeurIPS 2023, and Hoffmann et al. 2022): among the plain arms (the baseline and `dense-L<n>[-d<w>]`
models of other sizes trained to the same budget), per seed the one with the lowest mean loss over the other
seeds; whether that minimum is bracketed by a smaller and a larger plain model; and every arm's paired gaps to
the baseline and to it (the one rule of `accellib.analysis.stats`). `joint_frontier` judges one cached
experiment's arms against the plain arms of two experiments that share their baseline runs.
"""
from __future__ import annotations

import re
import statistics

from .stats import paired

DENSE = re.compile(r"^dense-L(\d+)(?:-d(\d+))?$")


def is_dense(arm: str) -> bool:
    """A plain arm of another size (`dense-L3`, `dense-L3-d96`): no technique, only the model's shape."""
    return DENSE.match(arm) is not None


def is_plain(arm: str) -> bool:
    """An arm the dense frontier is chosen from: the baseline and the dense arms."""
    return arm == "baseline" or is_dense(arm)


def frontier(losses: dict[str, dict[str, float]]) -> dict[str, str]:
    """The dense frontier's arm for each seed: {seed: plain arm}. `losses` = {plain arm: {seed: final val
    loss}}. Picking the arm with the lowest loss *on the seed it is judged on* would be biased low (the
    minimum of noisy values), flattering the control; so the arm for seed k is the one with the lowest mean
    over the *other* seeds (leave one seed out), and is judged on seed k. With one seed there is nothing
    else to choose on: the arm is chosen on that seed, and the gap is biased towards the frontier.
    Only seeds every plain arm finished are used."""
    seeds = sorted(set.intersection(*(set(v) for v in losses.values()))) if losses else []
    pick = {}
    for k in seeds:
        others = [s for s in seeds if s != k] or [k]
        pick[k] = min(sorted(losses), key=lambda a: statistics.fmean(losses[a][s] for s in others))
    return pick


def paired_gaps(rows: list[dict], base: str) -> dict:
    """Every arm's paired gaps (arm - control, per seed, `accellib.analysis.stats.paired`) to the same-size
    baseline and, when plain arms of other sizes ran, to the dense frontier; written into the rows as
    `vs_baseline` / `vs_frontier` (Paired dicts) and returned as the frontier's record."""
    by = {r["arm"]: dict(zip(r["seed_labels"], r["val_losses"])) for r in rows}
    plain = {a: v for a, v in by.items() if is_plain(a) or a == base}
    pick = frontier(plain) if any(is_dense(a) for a in plain) else {}
    front = {k: plain[a][k] for k, a in pick.items()}
    for r in rows:
        mine = by[r["arm"]]
        for key, ctrl in (("vs_baseline", by.get(base, {})), ("vs_frontier", front)):
            common = [k for k in mine if k in ctrl]
            if ctrl and common and not (key == "vs_baseline" and r["arm"] == base):
                r[key] = paired([mine[k] for k in common], [ctrl[k] for k in common],
                                what=f"arm {r['arm']} {key.replace('_', ' ')}", seeds=common).to_dict()
    if not pick:
        return {}
    return dict(per_seed=pick, val_losses=front, **frontier_edge(rows, set(pick.values()), base),
                rule="per seed, the plain arm (baseline or dense-*) with the lowest mean final validation loss "
                     "over the other seeds (leave one seed out), judged on this seed")


def frontier_edge(rows: list[dict], picks: set[str], base: str) -> dict:
    """Whether the frontier's minimum is bracketed: every picked plain arm has a plain arm with fewer and one
    with more parameters (all parameters) among those measured. Otherwise the best size may lie outside the
    arms tried, and the frontier is only an upper bound on the best plain model's loss."""
    sizes = {r["arm"]: r["params"] for r in rows if (is_plain(r["arm"]) or r["arm"] == base) and r.get("params")}
    if not sizes or not picks <= set(sizes):
        return dict(bracketed=None, sizes=sizes)
    lo, hi = min(sizes.values()), max(sizes.values())
    edge = sorted(a for a in picks if sizes[a] in (lo, hi))
    return dict(bracketed=not edge, sizes=sizes, edge=edge)


def joint_frontier(res: dict, more: dict, tol: float = 1e-3) -> dict:
    """Judge `res`'s arms against the plain arms of `res` and `more` together (e.g. tutorial_flops and the
    tutorial_frontier that brackets its minimum): both must hold the same baseline runs (per-seed final losses
    within `tol`: the same config, seed and code give the same run up to the CPU's float rounding), and an arm in
    both is taken from `more`. Returns {"rows": res's rows with vs_frontier recomputed (copies), "frontier":
    the record paired_gaps returns, "baseline_diff": the largest per-seed difference of the two baselines}."""
    import copy
    rows = {r["arm"]: copy.deepcopy(r) for r in res["summary"]["rows"]}
    other = {r["arm"]: copy.deepcopy(r) for r in more["summary"]["rows"]}
    b0 = dict(zip(rows["baseline"]["seed_labels"], rows["baseline"]["val_losses"]))
    b1 = dict(zip(other["baseline"]["seed_labels"], other["baseline"]["val_losses"]))
    shared = [k for k in b0 if k in b1]
    diff = max((abs(b0[k] - b1[k]) for k in shared), default=float("inf"))
    if not shared or diff > tol:
        raise ValueError(f"{res.get('name')} and {more.get('name')} do not share their baseline runs (seeds "
                         f"{shared or 'none in common'}, largest difference {diff:.2g} nats > {tol}); rebuild one of them "
                         "with the same config and seeds")
    for a, r in other.items():
        if is_plain(a) and a != "baseline":
            rows[a] = r
    joint = list(rows.values())
    for r in joint:
        r.pop("vs_frontier", None)
    return dict(rows=joint, frontier=paired_gaps(joint, "baseline"), baseline_diff=diff)
