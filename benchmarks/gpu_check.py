"""The GPU record of issue 15 (run it through benchmarks/gpu_check.sh, which first checks CUDA and runs
benchmarks/throughput.py --gpt2-small): a GPT-2-small training run of --steps steps for the baseline and
each technique that runs on one GPU, each through `python -m accellib.train`, then one JSON of every arm's
final metrics.jsonl record (tokens/s, MFU, peak memory, losses) with the device and the git commit, and
the target check: the baseline's bf16 MFU >= 45% (PASS/FAIL, exit status 1 on FAIL or a failed arm).

    python benchmarks/gpu_check.py                      # 1000 steps per arm -> results/gpu_check_cuda.json
    python benchmarks/gpu_check.py --arms baseline,pld  # some arms only
    python benchmarks/gpu_check.py --smoke --out runs/gc_smoke.json   # CPU: tiny model, 3 steps, the same commands

The model: 12 layers, d=768, 12 heads, seq 1024 (configs/gpt2_small_owt.yaml), batch 16 x grad_accum 4 on
one GPU, bf16 (train.precision auto), train.compile=blocks as the shipped config sets it (only the run's length,
the batch, the data and the MFU's peak are overridden: ALLOWED), evaluated once at the end on 64 windows,
checkpointed once at the end. The data: uniform random GPT-2 ids (GPT-2's vocabulary, no text), written
to <runs>/data; so the losses say only that training ran (the best possible loss is ln 50257 = 10.8),
the speed and memory numbers are the record. Runs go to runs/gpu_check/<arm> (git-ignored).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from accellib.core.records import environment, git_commit, read_metrics, write_json  # noqa: E402
from throughput import write_gpt2_tokens  # noqa: E402

MFU_TARGET = 0.45
CONFIG = "configs/gpt2_small_owt.yaml"
# what is kept of each arm's last metrics.jsonl record (the ones present)
FIELDS = ("step", "tok_per_s", "mfu", "peak_mem_gb", "train_loss", "val_loss", "tokens", "flops", "wall",
          "blocks_per_micro_batch", "layer_tokens")


def arms(steps: int, seq_len: int, fp8: bool) -> dict[str, list[str]]:
    """Each arm's overrides on top of the shared command. PLD/SBLD's theta(t) decays at 5/steps, so the
    keep ratio is within 1% of theta_bar for the last ~20% of the run (the paper's 0.001 suits 100K steps)."""
    gamma = 5 / steps
    out = {
        "baseline": [],
        "pld": ["--pld.enabled=true", "--pld.theta_bar=0.5", f"--pld.gamma={gamma:g}"],
        "sbld": ["--sbld.enabled=true", "--sbld.theta_bar=0.5", f"--sbld.gamma={gamma:g}"],
        "random_ltd": ["--random_ltd.enabled=true", f"--random_ltd.min_len={max(1, seq_len // 8)}",
                       f"--random_ltd.step_len={max(1, seq_len // 64)}"],
        # the V-cycle coalesces an untied head: this arm's model has 38.6M more parameters than the baseline's
        "multilevel": ["--multilevel.enabled=true", "--model.tie_head=false"],
        "standardization_loss": ["--standardization_loss.enabled=true", "--standardization_loss.weight=1e-4"],
    }
    if fp8:  # real FP8 GEMMs (torchao.float8) need torchao and a GPU with FP8 tensor cores
        out["lowp_fp8"] = ["--lowp.enabled=true", "--lowp.backend=torchao"]
    return out


# what gpu_check may change in the shipped config: the data (random ids), the length of the run and what
# scales with it (warm-up, evaluation, checkpoints, log interval), the batch, and the MFU's peak. Never the
# model, the precision or train.compile: the run measured is the documented launch (tests/test_full_scale.py)
ALLOWED = ("data.path", "train.steps", "train.eval_every", "train.checkpoint_every", "train.progress",
           "optim.warmup_steps", "train.batch_size", "train.grad_accum", "train.eval_windows", "train.log_every",
           "train.peak_flops")


def base_overrides(args, data_dir: Path) -> list[str]:
    over = [f"--data.path={data_dir}", f"--train.steps={args.steps}", "--train.eval_every=0",
            "--train.checkpoint_every=0", "--train.progress=false",
            f"--optim.warmup_steps={max(1, args.steps // 10)}"]
    if args.peak_flops:
        over.append(f"--train.peak_flops={args.peak_flops:g}")
    if args.smoke:  # the CPU stand-in: a tiny model with GPT-2's vocabulary, the eager compile backend
        return over + ["--train.device=cpu", "--train.threads=1", "--model.n_layer=4", "--model.n_head=4",
                       "--model.d_model=64", "--model.seq_len=32", "--train.batch_size=4", "--train.grad_accum=2",
                       "--train.eval_windows=4", "--train.log_every=1", "--train.compile_backend=eager"]
    return over + ["--train.batch_size=16", "--train.grad_accum=4", "--train.eval_windows=64",
                   "--train.log_every=50"]


def rel(p: Path) -> Path:
    """`p` relative to the repository when inside it (the commands run there; records hold no machine paths)."""
    p = Path(p).resolve()
    return p.relative_to(ROOT) if p.is_relative_to(ROOT) else p


def run_arm(name: str, cmd: list[str], log: Path) -> int:
    """Run one training command, its output shown with an [arm] prefix and kept in `log`."""
    with open(log, "w") as f, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               text=True, bufsize=1) as p:
        for line in p.stdout:
            f.write(line)
            print(f"[{name}] {line}", end="", flush=True)
    return p.returncode


def final_record(run_dir: Path) -> dict:
    recs = read_metrics(run_dir)
    return {k: recs[-1][k] for k in FIELDS if k in recs[-1]} if recs else {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per arm (default 1000; --smoke 3)")
    ap.add_argument("--arms", default="", help="comma-separated subset of the arms (default: all)")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny model, 3 steps, no target check")
    ap.add_argument("--out", default=None, help="the JSON written (default results/gpu_check_cuda.json; "
                                                "required with --smoke)")
    ap.add_argument("--peak-flops", type=float, default=0.0,
                    help="peak bf16 FLOP/s of the GPU for the MFU (passed as --train.peak_flops); default: the table "
                         "in accellib/core/hardware.py, which needs it for a GPU it does not list")
    ap.add_argument("--runs", default=None, help="folder of the runs (default runs/gpu_check; --smoke: beside --out)")
    args = ap.parse_args(argv)
    if args.smoke and not args.out:
        ap.error("--smoke writes only to --out PATH (never to results/)")
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is visible to torch (torch.cuda.is_available() is False); "
              "run it on a machine with an NVIDIA GPU, or use --smoke", file=sys.stderr)
        return 1
    args.steps = args.steps or (3 if args.smoke else 1000)
    out = Path(args.out or ROOT / "results" / "gpu_check_cuda.json")
    runs = Path(args.runs or (out.with_name(out.stem + "_runs") if args.smoke else ROOT / "runs" / "gpu_check"))
    runs.mkdir(parents=True, exist_ok=True)
    seq_len = 32 if args.smoke else 1024
    fp8 = not args.smoke and importlib.util.find_spec("torchao") is not None
    table = arms(args.steps, seq_len, fp8)
    chosen = [a for a in args.arms.split(",") if a] or list(table)
    if unknown := [a for a in chosen if a not in table]:
        ap.error(f"unknown arm(s) {unknown}; the arms here: {', '.join(table)}")
    if not fp8 and not args.smoke:
        print("gpu_check: lowp_fp8 left out: it needs the torchao package (pip install torchao)")

    n_train, n_val = (100_000, 10_000) if args.smoke else (20_000_000, 1_000_000)
    data_dir = write_gpt2_tokens(runs / "data", n_train, n_val)
    base = [sys.executable, "-m", "accellib.train", "--config", CONFIG] + base_overrides(args, rel(data_dir))
    device = "cpu" if args.smoke else torch.cuda.get_device_name(0)
    record = dict(device=device, git_commit=git_commit(), steps=args.steps, smoke=args.smoke,
                  command=" ".join(["python"] + base[1:]), arms={}, failed={})
    for name in chosen:
        cmd = base + table[name] + ["--out", str(rel(runs / name)), "--overwrite"]
        t0 = time.perf_counter()
        rc = run_arm(name, cmd, runs / f"{name}.log")
        if rc != 0:
            record["failed"][name] = f"exit status {rc}, see {rel(runs / (name + '.log'))}"
            print(f"gpu_check: {name} FAILED (exit status {rc}); its output is in {runs / (name + '.log')}")
            continue
        record["arms"][name] = dict(overrides=table[name], seconds=round(time.perf_counter() - t0, 1),
                                    final=final_record(runs / name))
    print(f"\n{'arm':<22}{'tok/s':>12}{'MFU':>8}{'peak GB':>9}{'val_loss':>10}")
    for name, a in record["arms"].items():
        f = a["final"]
        cell = lambda k, fmt: format(f[k], fmt) if f.get(k) is not None else "-"  # noqa: E731
        print(f"{name:<22}{cell('tok_per_s', ',.0f'):>12}{cell('mfu', '.1%'):>8}"
              f"{cell('peak_mem_gb', '.2f'):>9}{cell('val_loss', '.4f'):>10}")

    ok = not record["failed"]
    if not args.smoke and "baseline" in chosen:
        mfu = record["arms"].get("baseline", {}).get("final", {}).get("mfu")
        passed = mfu is not None and math.isfinite(mfu) and mfu >= MFU_TARGET
        record["target"] = dict(what="baseline MFU, bf16", min=MFU_TARGET, measured=mfu, passed=passed)
        print(f"{'PASS' if passed else 'FAIL'}: baseline MFU "
              f"{'not measured' if mfu is None else format(mfu, '.1%')} (target >= {MFU_TARGET:.0%}) on {device}")
        ok = ok and passed
    record["environment"] = environment()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, record)
    print(f"wrote {out}" + ("" if ok else f"; failed arms: {', '.join(record['failed']) or 'none'}"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
