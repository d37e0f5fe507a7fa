"""The trainer's host cost per step against a plain PyTorch loop's, on a CPU proxy of GPT-2 small (issue 42).

GPT-2 small on a GPU is partly host-bound: 148 parameter tensors, 12 blocks, and every dispatched op costs the
host a few microseconds whatever its size. The proxy keeps that shape (12 blocks, 148 parameters, GPT-2's
parameter list with tiny widths) and makes the device's work negligible (width 16, 32 tokens), so what is
left is the host's cost per step: Python, the dispatcher, the optimizer's loop.

Two measurements, both of one `train_step` against the plain loop a careful user writes (forward, backward,
torch's clip_grad_norm_, the LR set, AdamW, zero_grad; benchmarks/throughput.py's plain loop):
    ops      aten ops dispatched per step, counted by a TorchDispatchMode: deterministic, so
             tests/test_step_cost.py asserts it (the trainer within 5% of the plain loop)
    host     process CPU seconds per step, timed in interleaved rounds (the order reversed every other round),
             the ratio plain / trainer as the median over rounds (target >= 0.97): a benchmark, never a test

    python benchmarks/host_time.py            # writes results/host_time_cpu.json
    python benchmarks/host_time.py --quick    # 3 rounds, writes nothing
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from accellib.core.config import load_config  # noqa: E402
from accellib.core.records import environment, write_json  # noqa: E402
from accellib.core.trainer import Trainer, make_optimizer  # noqa: E402
from throughput import plain_update  # noqa: E402  (benchmarks/ is on sys.path when this runs as a script)

TARGET = 0.97         # plain / trainer host seconds per step
OP_TOLERANCE = 0.05   # the trainer may dispatch at most 5% more ops per step than the plain loop
# GPT-2 small's parameter list (12 blocks x 12 tensors + wte, wpe, ln_f's 2 = 148, the head tied) at widths
# where the device does almost nothing
PROXY = {"model.n_layer": 12, "model.n_head": 2, "model.d_model": 16, "model.seq_len": 32,
         "train.batch_size": 2, "train.grad_accum": 1, "optim.grad_clip": 1.0, "train.progress": False,
         "train.threads": 1}


def proxy_config(data_dir: str | Path, **over):
    """The proxy's RunConfig on the token folder `data_dir` (any accellib token folder)."""
    kw = {**PROXY, "data.path": str(data_dir), **over}
    return load_config(ROOT / "configs" / "tiny.yaml", [f"--{k}={v}" for k, v in kw.items()])


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched while active (the top-level call: what the host dispatches)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def plain_step(tr: Trainer):
    """A plain loop's step over a trainer's model and batches (so both count the same data path), with a plain
    torch AdamW of its own (not Accelerate's wrapper, whose per-step cost is the trainer's): forward, backward, torch's
    clip, the LR, AdamW, zero_grad. Returns a function of no argument."""
    model, cfg = tr.raw_model, tr.cfg
    opt = make_optimizer(model.parameters(), cfg.optim)
    state = {"step": 0}

    def step():
        (x, y), = tr.batches(state["step"])
        loss = plain_update(model, opt, x, y, cfg.optim)
        state["step"] += 1
        return loss.detach()
    return step


def count_ops(fn, warmup: int = 2, steps: int = 3) -> tuple[float, Counter]:
    """Ops dispatched per call of fn, averaged over `steps` calls after `warmup` (AdamW's state is created at
    its first step), and the Counter of the last call."""
    for _ in range(warmup):
        fn()
    total = 0
    for _ in range(steps):
        with OpCounter() as c:
            fn()
        total += sum(c.ops.values())
    return total / steps, c.ops


def pair(data_dir) -> tuple:
    """(trainer step, plain step): two trainers built from the same config, so each loop has its own model."""
    a, b = Trainer(proxy_config(data_dir)), Trainer(proxy_config(data_dir))
    return a.train_step, plain_step(b)


def host_seconds(fns: dict, reps: int, steps: int) -> dict:
    """Process CPU seconds of `steps` calls, per name, in `reps` interleaved rounds."""
    out = {k: [] for k in fns}
    for r in range(reps):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            c0 = time.process_time()
            for _ in range(steps):
                fns[k]()
            out[k].append(time.process_time() - c0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 rounds, writes nothing")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--data", default=str(ROOT / "data" / "shakespeare"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.reps, args.steps = 3, 3
    trainer, plain = pair(args.data)
    ops_t, by_t = count_ops(trainer)
    ops_p, by_p = count_ops(plain)
    secs = host_seconds({"trainer": trainer, "plain": plain}, args.reps, args.steps)
    ratio = statistics.median(p / t for p, t in zip(secs["plain"], secs["trainer"]))
    extra = {k: by_t[k] - by_p.get(k, 0) for k in by_t if by_t[k] > by_p.get(k, 0)}
    print(f"proxy: {len(list(trainer.__self__.raw_model.parameters()))} parameter tensors, 12 blocks, 1 thread")
    print(f"ops per step: trainer {ops_t:.0f}, plain {ops_p:.0f} (x{ops_t / ops_p:.3f}; at most x{1 + OP_TOLERANCE})")
    print(f"trainer's extra ops: {dict(sorted(extra.items(), key=lambda kv: -kv[1]))}")
    print(f"host seconds per step: trainer {statistics.median(secs['trainer']) / args.steps * 1e3:.2f} ms, plain "
          f"{statistics.median(secs['plain']) / args.steps * 1e3:.2f} ms; plain / trainer {ratio:.3f} (target >= {TARGET})")
    if not args.quick:
        write_json(ROOT / "results" / "host_time_cpu.json", dict(
            what="process CPU seconds and aten ops per training step, trainer vs plain loop, GPT-2-small-shaped "
                 "proxy (benchmarks/host_time.py)", proxy=PROXY, reps=args.reps, steps_per_round=args.steps,
            ops_per_step=dict(trainer=ops_t, plain=ops_p, ratio=round(ops_t / ops_p, 4)),
            trainer_extra_ops=extra, host_ms_per_step={k: round(statistics.median(v) / args.steps * 1e3, 4)
                                                       for k, v in secs.items()},
            ratio=round(ratio, 4), target=TARGET, round_seconds=secs, environment=environment()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
