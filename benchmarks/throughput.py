"""Tokens/s of the accellib trainer vs a minimal plain-PyTorch loop of the same model.

Both do the same work per step (sample a batch, forward, backward, clip, set LR, AdamW step,
zero_grad); they are timed in interleaved blocks (plain, trainer, plain, trainer, ...) in one
process. The headline is the median over pairs of the per-pair tokens/s ratio: the two blocks of a
pair run back to back, so slow drifts of a shared VM (seen here: 2x between minutes) cancel. The
ratio of process CPU time per token is reported beside it.

    python benchmarks/throughput.py              # CPU, the tutorial model (4 layers, d=128)
    python benchmarks/throughput.py --quick      # smoke run
    python benchmarks/throughput.py --gpt2-small # on a GPU: GPT-2-small-sized bf16 run, with MFU

Target: trainer >= 0.95x the plain loop's tokens/s. Writes results/throughput_<device>.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accellib.config import load_config  # noqa: E402
from accellib.data import generator_for, load_token_data, sample_batch  # noqa: E402
from accellib.flops import train_step_flops  # noqa: E402
from accellib.model import Transformer  # noqa: E402
from accellib.records import environment, write_json  # noqa: E402
from accellib.trainer import Trainer, param_groups  # noqa: E402

# dense bf16 tensor-core peak, FLOP/s, for MFU
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def plain_loop(cfg, data, device):
    """The minimal loop a careful user would write by hand."""
    torch.manual_seed(cfg.train.seed)
    model = Transformer(cfg.model).to(device)
    opt = torch.optim.AdamW(param_groups(model.parameters(), cfg.optim.weight_decay), lr=cfg.optim.lr,
                            betas=(cfg.optim.beta1, cfg.optim.beta2), fused=device.type == "cuda")
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    step = 0

    def run(n):
        nonlocal step
        for _ in range(n):
            x, y = sample_batch(data.train, cfg.train.batch_size, cfg.model.seq_len,
                                generator_for(cfg.train.seed, step, 0))
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            for g in opt.param_groups:
                g["lr"] = cfg.optim.lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        loss.item()  # one sync per block, like the trainer's logging
    return run


def trainer_loop(cfg, data):
    tr = Trainer(cfg, data=data)

    def run(n):
        for _ in range(n):
            tr.train_step()
    return run


def timed(fn, n, device):
    """(wall seconds, process CPU seconds) of n steps."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    fn(n)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gpt2-small", action="store_true", help="12 layers, d=768, seq 1024 (GPU)")
    ap.add_argument("--reps", type=int, default=20, help="interleaved pairs of timed blocks")
    ap.add_argument("--steps", type=int, default=5, help="steps per timed block")
    ap.add_argument("--data", default=str(ROOT / "data" / "shakespeare"))
    args = ap.parse_args()
    over = ["--train.progress=false", f"--data.path={args.data}"]
    if args.gpt2_small:
        over += ["--model.n_layer=12", "--model.n_head=12", "--model.d_model=768", "--model.seq_len=1024",
                 "--train.batch_size=16"]
    elif args.quick:
        over += ["--model.n_layer=2", "--model.d_model=64", "--model.seq_len=64", "--train.batch_size=16"]
        args.reps, args.steps = 3, 3
    cfg = load_config(ROOT / "configs" / "tiny.yaml", over)
    data = load_token_data(cfg.data.path)
    cfg.model.vocab_size = data.vocab_size
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loops = {"plain": plain_loop(cfg, data, device), "accellib": trainer_loop(cfg, data)}
    for fn in loops.values():  # warm-up (allocator, kernels)
        fn(2)
    times, cpu = {k: [] for k in loops}, {k: [] for k in loops}
    for _ in range(args.reps):
        for k, fn in loops.items():
            w, c = timed(fn, args.steps, device)
            times[k].append(w)
            cpu[k].append(c)
    tokens = args.steps * cfg.train.batch_size * cfg.model.seq_len
    tps = {k: tokens / statistics.median(v) for k, v in times.items()}
    ratio = statistics.median(p / a for p, a in zip(times["plain"], times["accellib"]))  # per-pair tok/s ratio
    cpu_ratio = statistics.median(cpu["plain"]) / statistics.median(cpu["accellib"])
    flops_step = train_step_flops(cfg.model, cfg.train.batch_size, cfg.model.seq_len)
    print(f"model L={cfg.model.n_layer} d={cfg.model.d_model} T={cfg.model.seq_len} B={cfg.train.batch_size} "
          f"on {device}; {args.reps} interleaved blocks of {args.steps} steps")
    print(f"{'loop':<10}{'tokens/s (median)':>20}{'min..max':>22}")
    for k, v in times.items():
        print(f"{k:<10}{tps[k]:>20.0f}{tokens / max(v):>11.0f}..{tokens / min(v):<9.0f}")
    print(f"ratio accellib/plain, tokens/s, median of {args.reps} paired blocks = {ratio:.3f}  (target >= 0.95)")
    print(f"ratio accellib/plain, tokens per CPU-second = {cpu_ratio:.3f}")
    out = dict(device=str(device), model=dict(n_layer=cfg.model.n_layer, d_model=cfg.model.d_model,
               seq_len=cfg.model.seq_len, batch=cfg.train.batch_size), tokens_per_s=tps, ratio=ratio, cpu_ratio=cpu_ratio,
               block_seconds=times, block_cpu_seconds=cpu, environment=environment())
    if device.type == "cuda":
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        achieved = flops_step * args.steps / statistics.median(times["accellib"])
        out.update(gpu=name, achieved_flops=achieved, mfu=achieved / peak if peak else None)
        print(f"MFU (accellib, bf16, {name}) = {achieved / peak:.1%}" if peak else f"{achieved:.3e} FLOP/s")
    if not args.quick:
        (ROOT / "results").mkdir(exist_ok=True)
        write_json(ROOT / "results" / f"throughput_{device.type}.json", out)


if __name__ == "__main__":
    main()
