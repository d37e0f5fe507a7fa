"""The prediction checked against a short real run: a Trainer whose schedule moves during the run (PLD's θ from 1
towards 0.5, random-LTD's kept length ramping over the run), its steps after the warm-up timed one by one, against
the sum the points predict for the same steps (plus the measured cost of each kept length new to this process).
The record gives predicted, measured and their ratio; within 10% passes."""
from __future__ import annotations

from .base import Skip
from .points import ltd_len
from .predict import CHECK_TOL, interp, ltd_points, pld_points
from .timing import time_trainer


def short_run(c, tech: str) -> tuple[list[str], object]:
    """(overrides, schedule t -> coordinate) of the short real run of `tech` over check_steps steps."""
    from fractions import Fraction

    from accellib.techniques._layer_drop_common import pld_theta
    from accellib.techniques.random_ltd import ReservedLength
    N, S = c.sc["check_steps"], c.sc["seq_len"]
    if tech == "pld":
        g = 5 / N
        return (["--pld.enabled=true", "--pld.theta_bar=0.5", f"--pld.gamma={g:g}"],
                lambda t: pld_theta(t, 0.5, float(f"{g:g}")))
    lo, q = ltd_len(Fraction(1, 8), S), max(1, S // 16)
    sched = ReservedLength(lo, S, q, N)
    return ([f"--random_ltd.enabled=true", f"--random_ltd.min_len={lo}", f"--random_ltd.step_len={q}",
             f"--random_ltd.ramp_steps={N}"], sched)


def predicted_steps(c, tech: str, xs: list, seen: set) -> tuple[list[float], int]:
    """The points' steady time at each step's coordinate, plus (random-LTD) the per-length cost for each length not
    in `seen`; returns (seconds per step, new lengths met)."""
    if tech == "pld":
        pts = pld_points(c.rec)
        if len(pts) < 2:
            raise Skip("needs the baseline and a pld point")
        return [interp(pts, x) for x in xs], 0
    pts = ltd_points(c.rec, c.sc["seq_len"])
    if len(pts) < 2:
        raise Skip("needs the baseline and a random_ltd point")
    per = (c.rec.done("shapes:random_ltd") or {}).get("per_new_length_s") or 0.0
    out, new, seen = [], 0, set(seen)
    for r in xs:
        extra = 0.0
        if r not in seen and r < c.sc["seq_len"]:
            extra, new = per, new + 1
            seen.add(r)
        out.append(interp(pts, r) + extra)
    return out, new


def part_check(c, tech: str) -> dict:
    from accellib.core.trainer import Trainer
    N, w = c.sc["check_steps"], c.sc["check_warmup"]
    over, sched = short_run(c, tech)
    xs_all = [sched(t) for t in range(N)]
    # what the process has run before the timed steps: earlier parts, and this run's warm-up
    seen = set(c.lengths_run) | (set(xs_all[:w]) if tech == "random_ltd" else set())
    pred_steps, new = predicted_steps(c, tech, xs_all[w:], seen)   # raises Skip before building anything
    c.reset_compiler()
    tr = Trainer(c.config(over, steps=N))
    m = time_trainer(c, tr, w, N - w)
    if tech == "random_ltd":
        c.lengths_run.update(xs_all)
    tr.accelerator.free_memory()
    del tr
    c.reset_compiler()
    done = m["timed_steps"]
    pred, meas = sum(pred_steps[:done]), sum(m["step_s"])
    ratio = meas / pred if pred > 0 else None
    return dict(technique=tech, overrides=over, steps=N, warmup_steps=w, timed_steps=done,
                coordinates=[round(x, 5) if isinstance(x, float) else x for x in xs_all[w:w + done]],
                predicted_s=round(pred, 5), measured_s=round(meas, 5), ratio=round(ratio, 4) if ratio else None,
                within=None if c.args.smoke or ratio is None else abs(ratio - 1) <= CHECK_TOL, tolerance=CHECK_TOL,
                new_lengths=new if tech == "random_ltd" else None, graphs_timed=m["graphs"]["timed"],
                predicted_step_s=[round(s, 6) for s in pred_steps[:done]], measured_step_s=m["step_s"])
