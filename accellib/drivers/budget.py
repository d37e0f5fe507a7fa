"""Equal-compute budgets for `accellib.compare --budget flops|wall`: each arm's steps at the baseline's cost.

Equal-compute budgets for `accellib.compare --budget flops|wall`: how many optimizer steps an arm
gets so that it spends what the baseline spends, with its schedules stretched to that horizon
(`config.with_horizon`).

* flops: an arm's FLOPs over a horizon of n steps are counted from the plans its techniques will draw
  (`planned_flops`, no training). PLD's gates and random-LTD's kept lengths depend only on (seed, step),
  so the count is exact; SBLD's trained profile is replaced by equal sensitivities, which keep the same
  budget sum_l p_l = theta(t) L but not the same FLOPs: the trained profile keeps some blocks more than
  others, and in results/tutorial_flops.json the real runs spent the baseline's FLOPs 1-6% before the
  planned horizon (sbld 497 of 504 steps, sbld+random_ltd 596-607 of 635-637), so `train.flops_budget`
  stopped them with their cosine LR slightly above its floor. A V-cycle's stages are counted in closed
  form. The arm gets the fewest steps whose plan reaches the baseline's FLOPs, and `train.flops_budget`
  stops it once it has spent them.
* wall: the arm's and the baseline's step times are measured in interleaved rounds (the paired timing of
  `benchmarks/`), at steps spread over each schedule; the arm gets baseline steps x (baseline step time /
  arm step time), with the median ratio of the rounds. One noisy run decides nothing. SBLD's one-off
  profiling is not in the timed steps (a stand-in profile is used): one profile of the tutorial model took
  1.0 s, about 13 baseline steps, so a wall budget gives SBLD arms a few percent too many steps.
"""
from __future__ import annotations

import statistics
import time

from ..core.options import ConfigError
from ..core.config import RunConfig, with_horizon
from ..models.transformer import Plan

BUDGETS = ("steps", "flops", "wall")


def _vcycle(cfg: RunConfig) -> bool:
    ml = cfg.techniques.get("multilevel")
    return ml is not None and ml.enabled


def planned_flops(cfg: RunConfig) -> float:
    """Training FLOPs of one process over cfg's run (train.steps, or a technique's earlier stop)."""
    if _vcycle(cfg):
        from .vcycle import plan_stages, stage_flops
        return float(sum(stage_flops(cfg, plan_stages(cfg))))
    from ..core.tasks import make_task
    from ..techniques import build_techniques
    from ..core.trainer import TrainState
    techs = build_techniques(cfg)
    for tech in techs:
        tech.preview()
    task, t = make_task(cfg), cfg.train
    st = TrainState()
    while st.step < t.steps and not any(x.should_stop(st) for x in techs):
        for micro in range(t.grad_accum):
            p = Plan.full(task.n_blocks)
            for tech in techs:
                tech.update_plan(p, st.step, micro)
            st.flops += task.micro_flops(p)
            st.layer_tokens += task.micro_layer_tokens(p)
        st.step += 1
        st.flops += sum(tech.extra_flops(st.step, task) for tech in techs)   # e.g. SBLD's profiling
    return st.flops


def steps_for_flops(cfg: RunConfig, target: float, max_factor: int = 64) -> int:
    """The fewest steps n such that `with_horizon(cfg, n)` plans at least `target` FLOPs."""
    hi = cfg.train.steps
    while planned_flops(with_horizon(cfg, hi)) < target:
        if hi > max_factor * cfg.train.steps:
            raise ConfigError(f"an arm would need over {max_factor}x the baseline's steps to spend its FLOPs; "
                              "check the arm's settings (e.g. random_ltd.budget_steps stops it early)")
        hi *= 2
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if planned_flops(with_horizon(cfg, mid)) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _step_trainer(cfg: RunConfig, data, positions: int):
    from ..core.trainer import Trainer
    tr = Trainer(cfg, data=data)
    for tech in tr.techniques:
        tech.preview()
    n = cfg.train.steps
    return tr, [min(n - 1, int((k + 0.5) * n / positions)) for k in range(positions)]


def paired_step_seconds(cfgs: dict[str, RunConfig], data=None, positions: int = 6, rounds: int = 5) -> dict:
    """Seconds per optimizer step of each config, averaged over `positions` steps spread over its
    schedule, measured in `rounds` interleaved rounds (arm order rotates each round). Returns
    {"seconds": {name: median over rounds}, "ratio": {name: median over rounds of its time / the first
    config's}}: the ratio of each round is taken within the round, so load that comes and goes is shared."""
    names = list(cfgs)
    trainers = {n: _step_trainer(c, data, positions) for n, c in cfgs.items()}
    for tr, pos in trainers.values():  # warm-up: allocator, first-call overheads
        for s in pos[:2]:
            tr.state.step = s
            tr.train_step()
    per_round: list[dict[str, float]] = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        sec = {n: 0.0 for n in names}
        for k in range(positions):
            for n in order:
                tr, pos = trainers[n]
                tr.state.step = pos[k]
                t0 = time.perf_counter()
                tr.train_step()
                sec[n] += time.perf_counter() - t0
        per_round.append({n: v / positions for n, v in sec.items()})
    first = names[0]
    return dict(seconds={n: statistics.median(r[n] for r in per_round) for n in names},
                ratio={n: statistics.median(r[n] / r[first] for r in per_round) for n in names},
                rounds=rounds, positions=positions)


def resolve(budget: str, base: RunConfig, arms: dict[str, RunConfig], world: int = 1, data=None) -> dict:
    """Each arm's steps (and FLOPs cap) under `budget`, given the baseline's config `base`.
    Returns {"budget", "steps": {arm: n}, "flops_budget": {arm: FLOPs or 0}, and what decided it}."""
    if budget not in BUDGETS:
        raise ConfigError(f"--budget {budget!r} is not one of {', '.join(BUDGETS)}")
    n0 = base.train.steps
    out = dict(budget=budget, baseline_steps=n0, steps={}, flops_budget={})
    if budget == "steps":
        out["steps"] = {a: c.train.steps for a, c in arms.items()}
        out["flops_budget"] = {a: 0.0 for a in arms}
        return out
    if budget == "flops":
        target = planned_flops(base)
        out["baseline_flops"] = target * world
        for a, c in arms.items():
            out["steps"][a] = n0 if c is base else steps_for_flops(c, target)
            out["flops_budget"][a] = 0.0 if _vcycle(c) or c is base else target * world
        return out
    vc = [a for a, c in arms.items() if _vcycle(c)]
    if vc:
        raise ConfigError(f"--budget wall times the steps of one model, and arm {vc[0]} is a V-cycle of several; "
                          "compare it with --budget flops or steps")
    timing = paired_step_seconds({"_baseline": base, **{a: c for a, c in arms.items() if c is not base}}, data)
    out["timing"] = timing
    for a, c in arms.items():
        ratio = 1.0 if c is base else timing["ratio"][a]
        out["steps"][a] = max(1, round(n0 / ratio))
        out["flops_budget"][a] = 0.0
    return out
