"""Whole-run time of each full-scale config, predicted from the fixed schedule points, and the prediction checked
against a short real run.

A technique's schedule gives its coordinate at every step: θ(t) for PLD (pld_theta) and SBLD (1 until its profile
at step W, then PLD's θ of the steps since), the kept length r(t) for random-LTD (ReservedLength, until the
LayerToken budget ends the run), the stage's model for the V-cycle (plan_stages). The step time at a coordinate is
interpolated linearly between the measured points (the baseline is the point θ = 1, r = seq_len); the run's time
is the sum over its steps x grad_accum (a point is one micro-batch and its optimizer step, so the optimizer is
counted grad_accum times: an upper bound by its share), plus the measured one-off costs: each Trainer's compile
(a point's warm-up less its steady steps), SBLD's profile per profile, random-LTD's cost per kept length not run
before (shapes:random_ltd), the V-cycle's transitions. The points are measured on the check's model (GPT-2 small
at batch 16); a config of another model gets its own schedule on that model, and the record says so."""
from __future__ import annotations

import math
from collections import Counter

from .base import ROOT, Skip

# technique -> (config, overrides, the baseline's config and overrides): the full-scale configs predicted
FULL_SCALE = {
    "pld": ("configs/pld_gpt2_medium_owt.yaml", [], "configs/pld_gpt2_medium_owt.yaml", ["--pld.enabled=false"]),
    # SBLD as configs/pld_gpt2_medium_owt.yaml's header gives it
    "sbld": ("configs/pld_gpt2_medium_owt.yaml", ["--pld.enabled=false", "--sbld.enabled=true", "--sbld.theta_bar=0.5",
                                                   "--sbld.gamma=0.001"],
             "configs/pld_gpt2_medium_owt.yaml", ["--pld.enabled=false"]),
    # its baseline: configs/gpt2_small_owt.yaml (the header's), 100K steps
    "random_ltd": ("configs/random_ltd_gpt2_small_owt.yaml", [], "configs/gpt2_small_owt.yaml", []),
    "multilevel": ("configs/multilevel_gpt_base.yaml", [], "configs/multilevel_gpt_base.yaml",
                   ["--multilevel.enabled=false"]),
}
CHECK_TOL = 0.10


def interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through (x, y) points, extended linearly beyond the ends; one point: constant."""
    pts = sorted(points)
    if len(pts) == 1:
        return pts[0][1]
    i = next((i for i in range(len(pts) - 1) if x <= pts[i + 1][0]), len(pts) - 2)
    (x0, y0), (x1, y1) = pts[i], pts[i + 1]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def integrate(xs, points, fpoints=None) -> tuple[float, float | None]:
    """(sum of interp(points, x), the same over FLOPs points) over the steps' coordinates xs."""
    counts = Counter(xs)
    secs = sum(n * interp(points, x) for x, n in counts.items())
    flops = sum(n * interp(fpoints, x) for x, n in counts.items()) if fpoints else None
    return secs, flops


def _pts(rec, prefix: str, base_x: float, key: str = "mean_step_s", xkey: str = "x") -> list[tuple[float, float]]:
    parts, base = rec.data["parts"], rec.done("point:baseline")
    out = [(float(p[xkey]), p[key]) for n, p in parts.items()
           if n.startswith(prefix) and p.get("status") == "done" and p.get(key)]
    if base and base.get(key):
        out.append((float(base_x), base[key]))
    return out


def pld_points(rec, tech: str = "pld", key: str = "mean_step_s"):
    return _pts(rec, f"point:{tech}@", 1.0, key)


def ltd_points(rec, S: int, key: str = "mean_step_s"):
    return _pts(rec, "point:random_ltd@", S, key)


# ----------------------------------------------------------------------------- the schedules, step by step
def pld_schedule(cfg) -> list[float]:
    from accellib.techniques._layer_drop_common import pld_theta
    p = cfg.techniques["pld"]
    return [pld_theta(t, p.theta_bar, p.gamma) for t in range(cfg.train.steps)]


def sbld_schedule(cfg) -> tuple[list[float], int]:
    """(θ per step, profiles run): θ = 1 before the profile at the end of step W, then PLD's θ(t - W)."""
    from accellib.techniques._layer_drop_common import pld_theta
    s, T = cfg.techniques["sbld"], cfg.train.steps
    if s.schedule != "pld":
        raise Skip("sbld.schedule=variance is not predicted (PLD's θ only)")
    W = s.profile_step if s.profile_step >= 0 else max(math.ceil(0.02 * T), min(100, T // 5))
    R = s.reprofile_every
    profiles = 1 + (len(range(W + R, T + 1, R)) if R else 0)
    return [1.0 if t < W else pld_theta(t - W, s.theta_bar, s.gamma) for t in range(T)], profiles


def ltd_schedule(cfg) -> list[int]:
    """The kept length per step until the LayerToken budget (random_ltd.budget_steps) or train.steps ends the run."""
    from accellib.techniques.random_ltd import ReservedLength
    r, m, T = cfg.techniques["random_ltd"], cfg.model, cfg.train.steps
    horizon = r.budget_steps or T
    sched = ReservedLength(r.min_len, m.seq_len, r.step_len, r.ramp_steps or max(1, round(0.6 * horizon)))
    n_drop = len(r.layers) if r.layers else m.n_layer - 2
    full = m.n_layer * m.seq_len                       # LayerTokens per sequence at full length
    budget, used, out = r.budget_steps * full, 0, []
    for t in range(T):
        k = sched(t)
        out.append(k)
        used += (m.n_layer - n_drop) * m.seq_len + n_drop * k
        if budget and used >= budget:
            break
    return out


def model_of(cfg) -> dict:
    m = cfg.model
    return dict(kind=m.kind, n_layer=m.n_layer, d_model=m.d_model, seq_len=m.seq_len)


def predict_config(rec, tech: str, S: int) -> dict:
    """One full-scale config's whole-run seconds per process and its baseline's, from the record's points."""
    from accellib.core.config import load_config
    path, over, bpath, bover = FULL_SCALE[tech]
    cfg, bcfg = load_config(ROOT / path, over), load_config(ROOT / bpath, bover)
    base = rec.done("point:baseline")
    if not base:
        raise Skip("the baseline point did not run")
    acc, bacc = cfg.train.grad_accum, bcfg.train.grad_accum
    one_off, notes = {}, []
    if tech in ("pld", "sbld"):
        pts, fpts = pld_points(rec, tech), pld_points(rec, tech, "flops_per_step")
        if len(pts) < 2:
            raise Skip(f"needs at least one {tech} point")
        if tech == "pld":
            xs = pld_schedule(cfg)
        else:
            xs, n_prof = sbld_schedule(cfg)
            p = rec.done(f"point:sbld@{cfg.techniques['sbld'].theta_bar:g}") or {}
            prof = (p.get("one_off") or {}).get("profile_s")
            if prof is None:
                raise Skip("the SBLD point with the config's theta_bar did not run (its profile's cost)")
            # a profile is profile_batches x (L + 1) forward passes per process at any batch: the check's 8 batches
            one_off["profiles"] = round(n_prof * prof, 3)
        secs, flops = integrate(xs, pts, fpts)
        compile_s = max(rec.done(f"point:{tech}@{x:g}").get("compile_s") or 0.0 for x, _ in pts if x < 1.0) \
            if any(x < 1.0 for x, _ in pts) else 0.0
        one_off["compile"] = compile_s
        steps = len(xs)
    elif tech == "random_ltd":
        pts, fpts = ltd_points(rec, S), ltd_points(rec, S, "flops_per_step")
        if len(pts) < 2:
            raise Skip("needs at least one random_ltd point")
        xs = ltd_schedule(cfg)
        scale = S / cfg.model.seq_len                  # the config's lengths on the measured model's seq_len
        xs_m = [round(k * scale) for k in xs]
        secs, flops = integrate(xs_m, pts, fpts)
        shapes = rec.done("shapes:random_ltd") or {}
        per = shapes.get("per_new_length_s")
        one_off["compile"] = max(rec.done(n).get("compile_s") or 0.0 for n in rec.data["parts"]
                                 if n.startswith("point:random_ltd@") and rec.done(n))
        one_off["new_lengths"] = round(len(set(xs)) * per, 3) if per is not None else None
        if per is None:
            notes.append("the per-length cost was not measured (shapes:random_ltd did not run): not included")
        steps = len(xs)
    elif tech == "multilevel":
        from accellib.drivers.vcycle import plan_stages
        v = rec.done("vcycle")
        if not v:
            raise Skip("the V-cycle's stage points did not run")
        lv = v["levels"]
        stages = plan_stages(cfg)
        if any(str(s.level) not in lv for s in stages):
            raise Skip("a V-cycle level was not measured")
        secs = sum(s.steps * lv[str(s.level)]["mean_step_s"] for s in stages)
        flops = sum(s.steps * lv[str(s.level)]["flops_per_step"] for s in stages)
        one_off["compile"] = round(sum(lv[str(s.level)].get("compile_s") or 0.0 for s in stages), 3)
        one_off["transitions"] = round(sum(v["one_off"].values()), 4) if v["one_off"] else None
        steps = sum(s.steps for s in stages)
        # its baseline is the level-0 model (untied head) for train.steps
        base = dict(mean_step_s=lv["0"]["mean_step_s"], flops_per_step=lv["0"]["flops_per_step"],
                    compile_s=lv["0"].get("compile_s"))
    else:
        raise ValueError(tech)
    pred = secs * acc + sum(v for v in one_off.values() if v)
    bsteps = bcfg.train.steps
    bsecs = bsteps * bacc * base["mean_step_s"] + (base.get("compile_s") or 0.0)
    f_saving = 1 - (flops * acc) / (bsteps * bacc * base["flops_per_step"]) if flops else None
    t_saving = 1 - pred / bsecs
    if model_of(cfg) != rec.data.get("check_model"):
        notes.append(f"the config's model {model_of(cfg)} is not the measured one: its schedule on the measured model")
    return dict(config=path, overrides=over, baseline=f"{bpath} {' '.join(bover)}".strip(), steps=steps,
                baseline_steps=bsteps, grad_accum=acc, predicted_s=round(pred, 1), baseline_s=round(bsecs, 1),
                one_off_s=one_off, time_saving=round(t_saving, 4),
                flops_saving=round(f_saving, 4) if f_saving is not None else None,
                realized=round(t_saving / f_saving, 4) if f_saving and f_saving > 1e-6 else None,
                model_of_config=model_of(cfg), notes=notes)


def part_predict(c) -> dict:
    out, failed = {}, {}
    for tech in FULL_SCALE:
        try:
            out[tech] = predict_config(c.rec, tech, c.sc["seq_len"])
        except Skip as e:
            failed[tech] = str(e)
    if not out:
        raise Skip("no config could be predicted: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return dict(configs=out, not_predicted=failed, method=__doc__.split("\n\n")[1].replace("\n", " "),
                unit="seconds per process (each process runs the same steps under data parallelism)")
