"""A run's regime, counted one way: tokens per parameter (all parameters) and epochs of the corpus.

Every comparison in accellib says where it stands on the one axis that decides what a training technique can
show: how long the model is trained for its size. Hoffmann et al. (2022, "Training Compute-Optimal Large
Language Models", section 3 and Table 3) count *all* parameters N and training tokens D, and find D/N ~ 20
compute-optimal at their scale; the papers whose techniques accellib teaches trained far past that (random-LTD's
GPT-3 1.3B read 300B tokens, ~230 per parameter). Below ~20 a model is under-trained for its size (a smaller
model that reads more tokens does better at the same FLOPs); above it, the size is a choice made for serving and
the fair control of a technique is the same-size model. The count here is the one the README, the notebooks and
the findings table use: `num_params` of the model (embeddings, position embeddings and head included).
"""
from __future__ import annotations

CHINCHILLA_TOKENS_PER_PARAM = 20.0   # Hoffmann et al. 2022: compute-optimal D/N at their scale


def params_of(cfg) -> int:
    """All parameters of the model `cfg` builds (the data must have set its vocabulary; see
    drivers.arms.check_data). Built on the meta device: nothing is allocated."""
    import torch

    from ..core.tasks import make_task
    from ..models.transformer import num_params
    with torch.device("meta"):
        return num_params(make_task(cfg).build_model())


def tokens_per_param(tokens: float, params: float) -> float:
    if params <= 0:
        raise ValueError(f"tokens per parameter needs a positive parameter count, got {params}")
    return tokens / params


def regime(tokens: float, params: float, train_tokens: float) -> dict:
    """{params, tokens, tokens_per_param, epochs, vs_compute_optimal}: the last is D/N over Hoffmann's 20."""
    tpp = tokens_per_param(tokens, params)
    return dict(params=int(params), tokens=int(tokens), tokens_per_param=tpp, epochs=tokens / train_tokens,
                vs_compute_optimal=tpp / CHINCHILLA_TOKENS_PER_PARAM)


def past_optimum(res: dict) -> dict:
    """How far past its compute-optimum an equal-FLOPs experiment's baseline is trained, read from its own IsoFLOP
    profile (the plain arms of the same family trained to the baseline's FLOPs; `reproduce.py` records `regime`
    and the frontier): {optimum: the frontier's arm (best plain arm, leave-one-seed-out), bracketed: whether a
    smaller and a larger plain arm were measured around it, optimum_tokens_per_param: its tokens per parameter,
    baseline_tokens_per_param, times: the baseline's over the optimum's (>= 5: the papers' regime, issue 44),
    larger_wins: the optimum has more parameters than the baseline and beats it at equal FLOPs by the paired rule
    (`vs_baseline` verdict "wins"), gap: that paired record}. Per-seed picks that differ are all listed."""
    summ, reg = res["summary"], res["regime"]
    front = summ.get("frontier") or {}
    picks = sorted(set(front.get("per_seed", {}).values()))
    if not picks:
        raise ValueError(f"{res.get('name', 'this experiment')} trained no plain arms of other sizes: it has no "
                         "IsoFLOP profile to place its baseline against")
    rows = {r["arm"]: r for r in summ["rows"]}
    best = min(picks, key=lambda a: rows[a]["val_loss"])
    base = reg["baseline"]["tokens_per_param"]
    gap = rows[best].get("vs_baseline")
    return dict(optimum=best, picks=picks, bracketed=front.get("bracketed"),
                optimum_params=reg[best]["params"], baseline_params=reg["baseline"]["params"],
                optimum_tokens_per_param=reg[best]["tokens_per_param"], baseline_tokens_per_param=base,
                times=base / reg[best]["tokens_per_param"],
                larger_wins=reg[best]["params"] > reg["baseline"]["params"] and (gap or {}).get("verdict") == "wins",
                gap=gap)


def regime_name(res: dict) -> str:
    """What the findings call an equal-FLOPs experiment's regime, by its own IsoFLOP profile (`past_optimum`):
    "papers' regime" where a larger plain model wins at the baseline's FLOPs and the baseline reads >= 5x the
    optimum's tokens per parameter (issue 44: trained well past its compute-optimum), else "near compute-optimal"."""
    p = past_optimum(res)
    return "papers' regime" if p["larger_wins"] and p["times"] >= 5 else "near compute-optimal"


def gaps_by_length(results: dict[str, dict], arms: tuple[str, ...]) -> dict[str, list[dict]]:
    """Each arm's same-size gap at equal FLOPs (`vs_baseline`, the paired rule) against how long its baseline
    trained: {arm: [{experiment, tokens_per_param (the baseline's), params, gap}]}, in increasing tokens per
    parameter, over the equal-FLOPs experiments `results` ({name: cached record}) that ran the arm."""
    out = {a: [] for a in arms}
    for name, res in results.items():
        rows = {r["arm"]: r for r in res["summary"]["rows"]}
        g = res["regime"]["baseline"]
        for a in arms:
            if a in rows and "vs_baseline" in rows[a]:
                out[a].append(dict(experiment=name, tokens_per_param=g["tokens_per_param"], params=g["params"],
                                   gap=rows[a]["vs_baseline"]))
    return {a: sorted(v, key=lambda p: p["tokens_per_param"]) for a, v in out.items()}
