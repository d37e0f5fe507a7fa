"""Each technique at fixed schedule points, in steady state: a point is one Trainer whose schedule stands still
for the whole measurement, so its step time is the technique's at that point and nothing else.

    baseline           the shipped config (GPT-2 small, train.compile=blocks)
    pld@θ              PLD with theta_bar = θ and gamma = 1000: θ(t) = θ from step 1 (step 0 is in the warm-up)
    sbld@θ             SBLD profiled at setup (profile_step=0), gamma = 1000; its profile is then run once more,
                       timed apart as one-off work, with the graphs it compiles counted
    random_ltd@f       random-LTD with min_len = step_len = f x seq_len and a ramp far longer than the run: the
                       kept length is f x seq_len at every step (f = 1/8, 1/4, 1/2, 3/4; f = 1 is the baseline)
    vcycle@level       each V-cycle stage model of configs/multilevel_gpt_base.yaml (untied head; level 1 = the
                       half-size model) as its stage's Trainer builds it; the transitions (coalesce, de-coalesce,
                       interpolate) timed apart as one-off work
    standardization_loss, lowp_fp8    no schedule: one point each (FP8: a GPU with torchao only)
    shapes:random_ltd  what a kept length this process has not run costs: a random-LTD trainer warmed up at one
                       length, then a new length every step, against the points' steady time at that length

Realized speed-up of a point: (1 - t / t_base) / (1 - F / F_base), t = mean seconds per step, F = the trainer's
FLOPs per step (its analytic count of the blocks and tokens that ran)."""
from __future__ import annotations

import time
from fractions import Fraction

from accellib.course.gpu_cell import realized  # noqa: F401  (shared with the notebooks' GPU cell)

from .base import Skip
from .timing import graphs, time_trainer

PLD_THETAS = (0.5, 0.75)
SBLD_THETAS = (0.5,)
LTD_FRACTIONS = (Fraction(1, 2), Fraction(1, 8), Fraction(1, 4), Fraction(3, 4))
VCYCLE = ["--multilevel.enabled=true", "--model.tie_head=false", "--multilevel.levels=2",
          "--multilevel.warm_frac=0.1", "--multilevel.small_frac=0.5", "--multilevel.final_frac=0.5"]


def ltd_len(f: Fraction, S: int) -> int:
    return max(1, int(f * S))


def point_specs(S: int) -> dict[str, dict]:
    """name -> (technique, schedule coordinate x, overrides). x is θ for PLD/SBLD, the kept length for random-LTD."""
    out = {"baseline": dict(tech="baseline", x=None, over=[])}
    for th in PLD_THETAS:
        out[f"pld@{th:g}"] = dict(tech="pld", x=th, over=["--pld.enabled=true", f"--pld.theta_bar={th}", "--pld.gamma=1000"])
    for th in SBLD_THETAS:
        out[f"sbld@{th:g}"] = dict(tech="sbld", x=th, over=["--sbld.enabled=true", f"--sbld.theta_bar={th}",
                                                             "--sbld.gamma=1000", "--sbld.profile_step=0"])
    for f in LTD_FRACTIONS:
        r = ltd_len(f, S)
        out[f"random_ltd@{f}"] = dict(tech="random_ltd", x=r, over=[
            "--random_ltd.enabled=true", f"--random_ltd.min_len={r}", f"--random_ltd.step_len={r}",
            "--random_ltd.ramp_steps=1000000000"])
    out["standardization_loss"] = dict(tech="standardization_loss", x=None, over=[
        "--standardization_loss.enabled=true", "--standardization_loss.weight=1e-4"])
    out["lowp_fp8"] = dict(tech="lowp_fp8", x=None, over=["--lowp.enabled=true", "--lowp.backend=torchao"])
    return out


def _steps(c) -> tuple[int, int, int]:
    return c.sc["warmup"], c.args.steps, c.sc["sync_steps"]


def part_point(c, name: str) -> dict:
    """One fixed schedule point: build (timed), warm up (compiles, timed apart), timed steps, then the sync count."""
    from accellib.core.trainer import Trainer
    spec = point_specs(c.sc["seq_len"])[name]
    if spec["tech"] == "lowp_fp8":
        env = c.rec.get("environment") or {}
        if c.device.type != "cuda":
            raise Skip("needs a CUDA GPU with FP8 tensor cores (torchao.float8)")
        if (env.get("torchao") or {}).get("reason"):
            raise Skip(env["torchao"]["reason"])
    warm, steps, sync = _steps(c)
    c.reset_compiler()
    cfg = c.config(spec["over"], steps=warm + steps + sync + 2)
    t0, g0 = time.perf_counter(), graphs()
    tr = Trainer(cfg)
    build = dict(seconds=round(time.perf_counter() - t0, 3), graphs=graphs() - g0)
    m = time_trainer(c, tr, warm, steps, sync)
    out = dict(technique=spec["tech"], x=spec["x"], overrides=spec["over"], build=build, **m)
    tech = next((t for t in tr.techniques if t.name == spec["tech"]), None)
    if spec["tech"] == "lowp_fp8":   # what converted: 0 Linears (no table for this GPU) is bf16 against bf16
        lowp = next(t for t in tr.techniques if t.name == "lowp")
        out["fp8"] = dict(lowp.fp8)
    if spec["tech"] in ("pld", "sbld"):
        out["theta_measured"] = round(tech.last["theta"], 6)     # the schedule stood still at x
        out["expected_blocks"] = round(sum(tech.last["probs"]), 4)
    if spec["tech"] == "sbld":
        c.sync()
        g0, t0 = graphs(), time.perf_counter()
        tech.profile(tr)   # the one-off work of a real run, timed apart from the steps
        c.sync()
        out["one_off"] = dict(profile_s=round(time.perf_counter() - t0, 4), profile_graphs=graphs() - g0,
                              profile_at_setup="in build.seconds (profile_step=0)")
    if spec["tech"] == "random_ltd":
        out["kept_len"] = tech.last_r
        c.lengths_run.add(tech.last_r)
        if c.features.get("random_ltd_attention"):
            out["attention"] = getattr(tech.cfg, "attention", None)
    base = c.rec.done("point:baseline")
    if base and name != "baseline":
        out["vs_baseline"] = realized(m, base)
    tr.accelerator.free_memory()
    del tr
    c.reset_compiler()
    return out


def part_vcycle(c) -> dict:
    """Each V-cycle stage's model (plan_stages of the check's config with configs/multilevel_gpt_base.yaml's
    V-cycle), timed as a point, and the transitions' one-off work (on the host, as the driver does them)."""
    from accellib.core.trainer import Trainer
    from accellib.drivers.vcycle import _cpu_state, plan_stages, stage_config
    from accellib.techniques.multilevel import coalesce, decoalesce, interpolate
    warm, steps, sync = _steps(c)
    cfg = c.config(VCYCLE, steps=1000)
    stages = plan_stages(cfg)
    levels, states = {}, {}
    for st in stages:
        if st.level in levels or c.clock.left() <= 0:
            continue
        scfg = stage_config(cfg, st)
        scfg.train.steps, scfg.optim.warmup_steps = warm + steps + sync + 2, 1
        c.reset_compiler()
        t0, g0 = time.perf_counter(), graphs()
        tr = Trainer(scfg)
        build = dict(seconds=round(time.perf_counter() - t0, 3), graphs=graphs() - g0)
        m = time_trainer(c, tr, warm, steps, sync)
        mc = scfg.model
        levels[st.level] = dict(model=dict(n_layer=mc.n_layer, d_model=mc.d_model, n_head=mc.n_head),
                                build=build, **m)
        states[st.level] = (_cpu_state(tr.raw_model), mc)
        tr.accelerator.free_memory()
        del tr
    c.reset_compiler()
    one_off = {}
    if 0 in states:
        ml = cfg.techniques["multilevel"].level_map()
        sd, large = states[0]
        t0 = time.perf_counter()
        small_sd, _ = coalesce(sd, large, ml)
        one_off["coalesce_s"] = round(time.perf_counter() - t0, 4)
        t0 = time.perf_counter()
        back = decoalesce(small_sd, large, ml)
        interpolate(sd, back, cfg.techniques["multilevel"].alpha)
        one_off["decoalesce_interpolate_s"] = round(time.perf_counter() - t0, 4)
    return dict(levels={str(k): v for k, v in levels.items()}, one_off=one_off, overrides=VCYCLE,
                stages=[dict(index=s.index, level=s.level, kind=s.kind, frac_of_steps=round(s.steps / 1000, 4))
                        for s in stages],
                note="level 0 = the untied-head target model, level 1 = the half-size model; transitions on the host")


class _NewLengths:
    """A kept-length schedule: `r0` for the warm-up, then lengths[i] at the i-th step after it."""

    def __init__(self, r0: int, warm: int, lengths: list[int]):
        self.r0, self.warm, self.lengths = r0, warm, lengths

    def __call__(self, step: int) -> int:
        i = step - self.warm
        return self.r0 if i < 0 else self.lengths[min(i, len(self.lengths) - 1)]

    def state_dict(self) -> dict:
        return {}


def probe_lengths(S: int, n: int, seen: set) -> list[int]:
    """n kept lengths this process has not run: multiples of S/64 (at least 1) just above S/2."""
    q = max(1, S // 64)
    out, r = [], S // 2 + q
    while len(out) < n and r < S:
        if r not in seen:
            out.append(r)
        r += q
    return out


def part_shapes(c) -> dict:
    """The cost of a kept length this process meets for the first time: steps at new lengths against the
    steady time the points give at those lengths (interpolated)."""
    from accellib.core.trainer import Trainer
    from .predict import interp, ltd_points
    pts = ltd_points(c.rec, c.sc["seq_len"])
    if len(pts) < 2:
        raise Skip("needs the baseline and at least one random_ltd point")
    S, warm, n = c.sc["seq_len"], c.sc["warmup"], c.sc["shape_lengths"]
    lengths = probe_lengths(S, n, c.lengths_run)
    r0 = ltd_len(Fraction(1, 2), S)
    c.reset_compiler()
    spec = point_specs(S)["random_ltd@1/2"]
    tr = Trainer(c.config(spec["over"], steps=warm + n + 2))
    tech = next(t for t in tr.techniques if t.name == "random_ltd")
    tech.schedule = _NewLengths(r0, warm, lengths)
    m = time_trainer(c, tr, warm, len(lengths))
    c.lengths_run.update(lengths)
    extra = [s - interp(pts, r) for s, r in zip(m["step_s"], lengths)]
    tr.accelerator.free_memory()
    del tr
    c.reset_compiler()
    return dict(lengths=lengths, step_s=m["step_s"], steady_s=[round(interp(pts, r), 6) for r in lengths],
                extra_s=[round(e, 6) for e in extra], per_new_length_s=round(max(0.0, sum(extra) / len(extra)), 6)
                if extra else None, graphs_timed=m["graphs"]["timed"],
                note="per_new_length_s = mean over the new lengths of (step time - the points' steady time there)")
