"""The GPU check of issue 42: one call that leaves a record to trust within a deadline (default 7 minutes) on one GPU.

    bash benchmarks/gpu_check.sh                                # on the GPU box: python3 and the checkout, nothing installed
    bash benchmarks/gpu_check.sh --deadline 300 --out-dir /scratch/gc     (or GPU_CHECK_DEADLINE / GPU_CHECK_OUT)
    python3 benchmarks/gpu_check.py --smoke                     # every part at toy scale on a CPU (tests, the image check)

It needs no install: the repository root goes on sys.path, and wheels the machine lacks (torchao, for the FP8
point) are taken from .whl/ (benchmarks/gpu_wheels.sh fetches them) into a temporary folder. Before anything
else it says in one line, exit status 1, when python3 has no torch, when torch sees no CUDA GPU, or when Triton's
helper build would fail (no C compiler, no Python.h). After that it always exits 0: a missed target or a failed
part is a verdict in the JSON and on the console, not an exit status.

The parts (benchmarks/gpu/, one module each), most important first; the JSON (<out-dir>/gpu_check_<gpu>.json) is
rewritten atomically after every part, so a kill at any moment leaves a whole file (`finished: false`):
  environment          GPU, driver, torch, CUDA, Triton; whether a torch.compile'd function compiles and runs; which
                       of issue 42's library features this checkout has (the parts say when they fall back)
  point:baseline       configs/gpt2_small_owt.yaml (GPT-2 small, batch 16 x 1024, bf16, train.compile=blocks): per-step
                       CUDA-event times after a warm-up timed apart (compiles), graphs compiled in the warm-up and in
                       the timed steps, synchronizing calls per step (set_sync_debug_mode). Its times give the plan
  -- the plan is printed here: parts and estimated seconds (labelled as estimates), what does not fit --
  matmul_peak          the card's measured bf16 matmul peak (MFU is given against the data sheet and against it)
  trainer_vs_plain     the trainer and a plain loop, eager and compiled (and train.compile=model when present), each
                       in its own process; plus the host-time probe: the same loops at batch 1 x 64 tokens
  point:<tech>@<x>     each technique at a fixed schedule point in steady state (gpu/points.py): PLD and SBLD at
                       fixed theta, random-LTD at kept lengths 1/8, 1/4, 1/2, 3/4 of seq_len, the standardization
                       loss, FP8; realized speed-up against the baseline point; SBLD's profile timed apart
  vcycle               the V-cycle's stage models (configs/multilevel_gpt_base.yaml) as points, transitions timed apart
  profile              a windowed profile (torch.profiler.schedule): kernel time over CUDA-event time of the same steps
  shapes:random_ltd    what a kept length this process has not run costs (for the predictions)
  predict              each full-scale config's whole-run time (per process) integrated over its real schedule from
                       the points, plus compiles and one-off work (gpu/predict.py)
  check:pld, check:random_ltd   the prediction against a short real run whose schedule moves: predicted, measured,
                       ratio (target within 10%)
  fp8_table            benchmarks/fp8_table.py's per-Linear table on GPT-2 small's shapes, when the file exists
At the end every target of issue 42 (gpu/targets.py, one table) is given with its measured value; a --smoke run
measures the same things on a CPU and judges none of them. Stopping: every part is estimated before it starts and
skipped (printed, and listed in the JSON) when it does not fit before the deadline less a margin; timed steps stop
at the margin, and an alarm at half the margin stops any part. The trainers train on uniform random GPT-2 ids."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "benchmarks"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from gpu.base import T_START, Clock, Deadline, Record, Skip, make_plan, rel, run_part  # noqa: E402,F401
from gpu.check import ALLOWED, CONFIG, SCALE, Check, base_overrides  # noqa: E402,F401
from gpu.env import compiler, gpu_slug, part_environment, preflight, python_headers, setup_torchao  # noqa: E402,F401
from gpu.targets import CHECK, TARGETS, judge, summary  # noqa: E402

DEADLINE_S = 420.0         # 7 minutes: a 10-minute job limit with margin
SECONDARY = ("pld@0.75", "random_ltd@1/4", "random_ltd@3/4")   # points that refine the interpolation


def part_fp8_table(c) -> dict:
    """benchmarks/fp8_table.py's per-Linear table (bf16 against torchao's FP8 recipes, compiled forward and
    backward) on GPT-2 small's shapes at the check's batch, when the file exists in this checkout."""
    if not (ROOT / "benchmarks" / "fp8_table.py").is_file():
        raise Skip("benchmarks/fp8_table.py is not in this checkout yet")
    import fp8_table
    why = fp8_table.fp8_unavailable(c.device)
    if why:
        raise Skip(f"torchao's FP8 recipes cannot run here: {why}")
    shapes = fp8_table.gpt2_small_shapes(c.sc["batch"] * c.sc["seq_len"])
    return dict(rows=fp8_table.measure(c.device, shapes, compile_backend=c.backend))


def estimates(c, base: dict) -> list[tuple[str, float]]:
    """(part, estimated seconds) from the baseline point's build, warm-up and step time. Estimates, not measurements."""
    build, warm, step = base["build"]["seconds"], base["warmup_s"], base["mean_step_s"]
    sc, steps = c.sc, c.args.steps
    point = build + warm + (steps + sc["sync_steps"]) * step
    loop = c.import_s + 2 * (build + warm) + (sc["loop_warmup"] + sc["reps"] * sc["block"]) * step
    n_loops = 5 if c.features.get("compile_model") else 4
    out = [("matmul_peak", sc["peak_s"] + 1.0), ("trainer_vs_plain", n_loops * loop)]
    for name in c.order:
        if name.startswith("point:"):
            out.append((name, point))
        elif name == "vcycle":
            out.append((name, 2 * point))
        elif name == "profile":
            out.append((name, build + warm + sum(sc["profile"]) * step * 2))
        elif name == "shapes:random_ltd":
            out.append((name, build + warm + sc["shape_lengths"] * step * 2))
        elif name.startswith("check:"):
            out.append((name, build + warm + sc["check_steps"] * step))
        elif name == "predict":
            out.append((name, 2.0))
        elif name == "fp8_table":
            out.append((name, 30.0 if c.device.type == "cuda" else 0.0))
    return out


def print_plan(c, ests: list[tuple[str, float]]) -> dict:
    budget = c.clock.left()
    planned, left_out = make_plan(ests, budget)
    print(f"\ngpu_check plan: deadline {c.clock.deadline:.0f} s, {c.clock.elapsed():.0f} s used, {c.clock.margin:.0f} s "
          f"margin, {budget:.0f} s to plan. The seconds are ESTIMATES from the baseline point's build, warm-up and step")
    for n, s, cum in planned:
        print(f"  {n:<28}{s:>10.1f}{cum:>12.1f}")
    for n, s in left_out:
        print(f"  {n:<28}{s:>10.1f}{'does not fit':>14}")
    total = planned[-1][2] if planned else 0.0
    print(f"  planned: {total:.0f} s (estimated) of {budget:.0f} s\n", flush=True)
    return dict(note="estimated seconds (not measurements), from the baseline point's build, warm-up and step time",
                budget_s=round(budget, 1), elapsed_at_plan_s=round(c.clock.elapsed(), 1),
                parts=[dict(part=n, estimated_s=round(s, 1), cumulative_s=round(cum, 1)) for n, s, cum in planned],
                left_out=[dict(part=n, estimated_s=round(s, 1)) for n, s in left_out], planned_total_s=round(total, 1))


def part_fn(c, name: str):
    from gpu import loops, points, predict, profile, verify
    if name.startswith("point:"):
        return lambda: points.part_point(c, name[6:])
    return {"matmul_peak": lambda: profile.part_matmul_peak(c), "trainer_vs_plain": lambda: loops.part_trainer_vs_plain(c),
            "vcycle": lambda: points.part_vcycle(c), "profile": lambda: profile.part_profile(c),
            "shapes:random_ltd": lambda: points.part_shapes(c), "predict": lambda: predict.part_predict(c),
            "check:pld": lambda: verify.part_check(c, "pld"), "check:random_ltd": lambda: verify.part_check(c, "random_ltd"),
            "fp8_table": lambda: part_fp8_table(c)}[name]


def run_check(c) -> None:
    """The environment whatever the clock says, then the alarm, the baseline point, the plan, and each further part
    when its estimate fits in what is left."""
    rec, clock = c.rec, c.clock
    env = run_part("environment", 0.0, lambda: part_environment(c), rec, clock, force=True) or {}
    c.features = env.get("features") or {}
    clock.arm_alarm()
    c.order = ["point:pld@0.5", "point:sbld@0.5", "point:random_ltd@1/2", "point:random_ltd@1/8",
               "point:standardization_loss", "vcycle", "point:lowp_fp8", "profile",
               *(f"point:{p}" for p in SECONDARY), "shapes:random_ltd", "predict", "check:pld", "check:random_ltd",
               "fp8_table"]
    names = ["matmul_peak", "trainer_vs_plain", *c.order]
    for name in c.skip:
        rec.skip(name, "left out by --skip (measured in another call)")
    names = [n for n in names if n not in c.skip]
    if not (env.get("compile_probe") or {}).get("ok", False):
        for name in ["point:baseline", *names]:
            rec.skip(name, "train.compile=blocks cannot run: the compile probe failed (environment.compile_probe)")
        return
    base = run_part("point:baseline", 0.0, part_fn(c, "point:baseline"), rec, clock)
    if base is None:
        for name in names:
            rec.skip(name, "the baseline point did not run (see above); nothing to plan or compare with")
        return
    est = dict(estimates(c, base))
    rec.data["plan"] = print_plan(c, list(est.items()))
    rec.save()
    for name in names:
        run_part(name, est[name], part_fn(c, name), rec, clock)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU stand-in: a tiny model, a few steps, every part")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_CHECK_DEADLINE", DEADLINE_S)),
                    help=f"seconds of wall for the whole check (default $GPU_CHECK_DEADLINE, else {DEADLINE_S:.0f})")
    ap.add_argument("--margin", type=float, default=None, help="seconds kept free before the deadline (default 15; --smoke 2)")
    ap.add_argument("--out-dir", default=os.environ.get("GPU_CHECK_OUT"),
                    help="folder of the JSON (default $GPU_CHECK_OUT, else results/; --smoke: runs/gpu_check_smoke/)")
    ap.add_argument("--out", default=None, help="the JSON's path (overrides --out-dir)")
    ap.add_argument("--runs", default=None, help="scratch folder: token data, the loops' results, wheels (default "
                                                 "runs/gpu_check, beside the JSON with --smoke)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per point after its warm-up (default 30; --smoke 4)")
    ap.add_argument("--peak-flops", type=float, default=0.0,
                    help="the data-sheet peak bf16 FLOP/s of the GPU for the MFU (passed as --train.peak_flops); "
                         "default: the table in accellib/core/hardware.py, which needs it for a GPU it does not list")
    ap.add_argument("--compile-backend", default=None, choices=["inductor", "aot_eager", "eager"],
                    help="--smoke only: train.compile's backend (default eager; inductor needs a C compiler)")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out, e.g. trainer_vs_plain when a "
                                               "device budget measures it in another call (listed as skipped)")
    ap.add_argument("--loop-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    if args.loop_worker:
        from gpu.loops import loop_worker
        return loop_worker(json.loads(args.loop_worker))
    skip = [p for p in args.skip.split(",") if p]
    known = {"matmul_peak", "trainer_vs_plain", "vcycle", "profile", "shapes:random_ltd", "predict", "check:pld",
             "check:random_ltd", "fp8_table"}
    bad = [p for p in skip if p not in known and not p.startswith("point:")]
    if bad or "point:baseline" in skip:
        ap.error(f"--skip {','.join(bad) or 'point:baseline'}: not a part that can be left out; give some of "
                 f"{', '.join(sorted(known))} or point:<technique>@<x> (the baseline point is always run)")
    if args.compile_backend and not args.smoke:
        ap.error("--compile-backend is for --smoke; the GPU check measures the shipped config's inductor")
    problem = preflight(args.smoke)
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 1
    import torch
    sc = SCALE["smoke" if args.smoke else "gpu"]
    args.steps = args.steps or sc["steps"]
    args.margin = sc["margin"] if args.margin is None else args.margin
    if args.smoke:
        torch.set_num_threads(1)
    gpu = "cpu" if args.smoke else torch.cuda.get_device_name(0)
    out_dir = Path(args.out_dir or (ROOT / "runs" / "gpu_check_smoke" if args.smoke else ROOT / "results"))
    out = Path(args.out) if args.out else out_dir / (f"gpu_check_smoke_{gpu}.json" if args.smoke else f"gpu_check_{gpu_slug(gpu)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    args.runs = args.runs or str(out.with_name(out.stem + "_runs") if args.smoke else ROOT / "runs" / "gpu_check")
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    clock = Clock(args.deadline, args.margin)
    from accellib.core.records import command_line, git_commit
    model = dict(kind="gpt", n_layer=4 if args.smoke else 12, d_model=64 if args.smoke else 768, seq_len=sc["seq_len"])
    rec = Record(out, dict(check=CHECK, device=gpu, smoke=args.smoke, deadline_s=args.deadline, margin_s=args.margin,
                           started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), git_commit=git_commit(),
                           command=command_line("benchmarks/gpu_check.py", sys.argv[1:] if argv is None else argv, ROOT),
                           config=CONFIG, check_model=model, batch=sc["batch"],
                           targets=[dict(key=t[0], what=t[1], target=f"{t[2]} {t[3]}") for t in TARGETS],
                           data="uniform random GPT-2 ids (no text): losses only show that training ran"))
    print(f"gpu_check: {gpu}, torch {torch.__version__}; deadline {args.deadline:.0f} s; writing {out} after every part",
          flush=True)
    c = Check(args, rec, clock)
    c.skip = skip
    c.import_s = clock.elapsed()
    run_check(c)
    clock.disarm()
    rec.data["verdicts"] = judge(rec.data)
    rec.data["finished"] = True
    rec.save()
    summary(rec.data, rec.path)
    if clock.expired:  # a part was cut mid-way: compile workers may still hold the interpreter; the record is written
        sys.stdout.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
