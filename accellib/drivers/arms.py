"""The comparison's plan: which arms, their configs and data checks, every run's seed and steps under the budget.

What `python -m accellib.compare` trains: named arms, dense-L<n> controls, the command line's overrides.

The YAML holds a base config plus `arms:`, a mapping arm name -> overrides of the base. Plain arms of
other sizes are named, not written: `dense-L3` is the base with 3 blocks, `dense-L3-d96` also 96 wide;
`--control dense` adds `dense-L1` .. `dense-L<n-1>` (the base's depth is the baseline itself).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from ..core.config import RunConfig, apply_dict, load_config, parse_overrides, read_yaml, with_horizon
from ..core.options import ConfigError
from ..core.tasks import make_task
from ..techniques import build_techniques
from ..analysis.frontier import DENSE, is_dense, is_plain  # noqa: F401 (re-exported: compare, reproduce)
from .budget import resolve


def load_arms(path: str | Path) -> tuple[dict, dict]:
    p = Path(path)
    raw = read_yaml(p)
    if not isinstance(raw, dict):
        raise ConfigError(f"{p} must be a mapping of sections and `arms:`, got "
                          f"{'an empty file' if raw is None else 'a ' + type(raw).__name__}; see configs/tutorial.yaml")
    arms = raw.pop("arms", None) or {"baseline": {}}
    if not isinstance(arms, dict):
        raise ConfigError(f"`arms:` in {p} must map arm names to overrides, e.g. `pld: {{pld: {{enabled: true}}}}`")
    return raw, arms


CONTROLS = ("none", "dense")
FIXED_SIZE = ("cnn", "mlp")  # model kinds whose size no option changes (accellib/models/vision.py)


def dense_arms(base: RunConfig) -> list[str]:
    """The arms `--control dense` adds: every depth below the base's (its own depth is the baseline)."""
    return [f"dense-L{n}" for n in range(1, base.model.n_layer)]


def arm_configs(config: str | Path, arms: list[str] | None, overrides: list[str] | None,
                control: str = "none") -> dict[str, RunConfig]:
    """Every arm's config: the base, the arm's overrides, the command line's; validated. A `dense-L<n>[-d<w>]`
    arm is the base (with the command line's overrides) at n blocks (and width w); `control="dense"` adds
    the default dense arms (`dense_arms`) to the ones named."""
    if control not in CONTROLS:
        raise ConfigError(f"--control {control!r} is not one of {', '.join(CONTROLS)}")
    base, all_arms = load_arms(config)
    names = arms or list(all_arms)
    unknown = [a for a in names if a not in all_arms and not is_dense(a)]
    if unknown:
        raise ConfigError(f"unknown arm {unknown[0]!r}; {config} defines {', '.join(all_arms)} "
                          "(plain arms of other sizes are named dense-L<blocks> or dense-L<blocks>-d<width>)")
    cli = parse_overrides(overrides or [])
    plain = apply_dict(load_config(None, None, extra=base), cli)
    dense = [a for a in names if a not in all_arms and is_dense(a)]
    if (control == "dense" or dense) and plain.model.kind in FIXED_SIZE:
        what = "--control dense" if control == "dense" else f"arm {dense[0]}"
        raise ConfigError(f"{what} trains plain models of other depths and widths, but model.kind={plain.model.kind} "
                          "has a fixed size (it ignores model.n_layer and d_model), so every dense arm would be a copy "
                          f"of the baseline; compare {config} without dense arms")
    if control == "dense":
        names = names + [a for a in dense_arms(plain) if a not in names]
    cfgs = {}
    for name in names:
        cfg = load_config(None, None, extra=base)
        apply_dict(cfg, all_arms.get(name) or {})
        cfg = apply_dict(cfg, cli)
        if name not in all_arms:   # dense-L<n>[-d<w>]: the plain base at another size
            n, w = DENSE.match(name).groups()
            cfgs[name] = apply_dict(cfg, {"model": {"n_layer": int(n), **({"d_model": int(w)} if w else {})}})
        else:
            cfgs[name] = cfg
    return cfgs


def check_data(cfgs: dict[str, RunConfig]) -> None:
    """Open every arm's data (a DataError before anything is deleted) and fill in the model fields the
    data decides (vocab_size; a ViT's seq_len), so the configs compare equal to the ones stored in the
    arms' folders."""
    opened = {}
    for cfg in cfgs.values():
        task = make_task(cfg, opened.get((cfg.data.path, cfg.model.kind)), every_rank=True)  # every process
        opened[(cfg.data.path, cfg.model.kind)] = task.data
        task.configure()


def tokens_per_step(cfg: RunConfig, world: int) -> int:
    """Tokens one optimizer step of `cfg` trains on `world` processes: data-parallel replicas (every
    process for a plain run; an engine's own count, e.g. 1 for an Ouroboros ring) x batch x accumulation."""
    engine = next((t for t in build_techniques(cfg) if getattr(t, "splits_model", False)), None)
    dp = world if engine is None else engine.data_parallel(world)
    return dp * cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len


def check_same_data(cfgs: dict[str, RunConfig], world: int) -> None:
    """Arms compared step for step must train on as many tokens per step. Under several processes an engine
    arm (Ouroboros, a pipeline) splits the processes otherwise than a data-parallel arm: refused in one line."""
    seen = {a: tokens_per_step(c, world) for a, c in cfgs.items()}
    first = next(iter(seen))
    for a, n in seen.items():
        if n != seen[first]:
            raise ConfigError(f"on {world} processes arm {a} sees {n:,} tokens per step and arm {first} "
                              f"{seen[first]:,} (they split the processes differently), so the table would compare "
                              "unequal data; run the comparison on one process (python -m accellib.compare ...), "
                              "or compare arms of one kind under torchrun")


def seed_labels(arms: list[str], seed: int, seeds: int) -> dict[tuple[str, int], str]:
    """(arm, seed) -> the run's folder under --out: `<arm>` for one seed, `<arm>/seed<k>` for several."""
    return {(a, seed + k): a if seeds == 1 else f"{a}/seed{seed + k}" for a in arms for k in range(seeds)}


def baseline_arm(names: list[str]) -> str:
    return "baseline" if "baseline" in names else names[0]


def fingerprint(cfg: RunConfig) -> str:
    """A short hash of an arm's config as given (before its budget sets the steps): budget.json stores it beside
    each planned arm, so a resumed comparison reuses a plan only for the config it was made for."""
    import hashlib
    return hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def plan_runs(cfgs: dict[str, RunConfig], seeds: int, budget: str, world: int = 1,
              stored: dict | None = None, base_cfg: RunConfig | None = None) -> tuple[dict[str, RunConfig], dict]:
    """Every run's config: each arm at each seed, with the steps (and FLOPs cap) its budget gives it.
    `stored`: the budget.json of the comparison being resumed. A wall budget is measured, so the steps
    stored for an arm are reused (measuring again would give a slightly different horizon). A FLOPs budget's
    steps are reused too: planning them again gives the same steps, but a long run's plan walks every step of
    every candidate horizon (minutes per random-LTD arm at 12,000 steps, for each seed). A plan is reused
    only for the config it was made for (its `fingerprint`; a budget.json written before fingerprints has
    none, and its plans are reused), and every started run is checked against its folder's stored config
    (compare.arm_states). A steps budget has nothing to plan. `base_cfg`: the baseline's config when the
    baseline is not among `cfgs` (e.g. `--arms pld`), named "baseline"."""
    base = baseline_arm(list(cfgs)) if base_cfg is None else "baseline"
    seed0 = (base_cfg or cfgs[base]).train.seed
    if stored is not None and (stored.get("budget"), stored.get("seeds")) != (budget, seeds):
        raise ConfigError(f"the comparison was run with --budget {stored.get('budget')} --seeds {stored.get('seeds')}; "
                          "resume it with the same, or give the new comparison another --out (its finished arms stay)")
    kept = (stored or {}).get("per_seed", {}) if budget in ("wall", "flops") else {}
    plans, runs = {}, {}
    for k in range(seeds):
        seeded = {a: copy.deepcopy(c) for a, c in cfgs.items()}
        base_k = seeded[base] if base_cfg is None else copy.deepcopy(base_cfg)
        for c in [*seeded.values(), base_k]:
            c.train.seed = seed0 + k
        was = kept.get(str(k), {})
        fp = {a: fingerprint(c) for a, c in seeded.items()}
        old = {a: n for a, n in was.get("steps", {}).items()    # a plan made for another config is made again
               if budget == "wall" or was.get("fingerprint", {}).get(a, fp.get(a)) == fp.get(a)}
        todo = {a: c for a, c in seeded.items() if a not in old}
        if budget == "wall" and k > 0:
            plans[k] = dict(plans[0])   # a copy: each seed stores its own fingerprints
        elif todo:
            plans[k] = resolve(budget, base_k, todo | {base: base_k}, world)
            for field in ("steps", "flops_budget"):
                plans[k][field] = {**{a: v for a, v in was.get(field, {}).items() if a in old}, **plans[k][field]}
        else:
            plans[k] = dict(was)
        plans[k]["fingerprint"] = {**was.get("fingerprint", {}), **fp}
        for a, c in seeded.items():
            n, cap = plans[k]["steps"][a], plans[k]["flops_budget"][a]
            c = with_horizon(c, n) if n != c.train.steps else c
            c.train.flops_budget = cap
            runs[seed_labels([a], seed0 + k, seeds)[(a, seed0 + k)]] = c
    return runs, dict(budget=budget, seeds=seeds, seed0=seed0, baseline=base,
                      per_seed={str(k): p for k, p in plans.items()})
