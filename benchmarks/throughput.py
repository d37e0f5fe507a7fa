"""Tokens/s of the accellib trainer vs a minimal plain-PyTorch loop of the same model, compile off and on.

Every loop does the same work per step: sample a batch, forward, backward, clip, set the LR, step the
optimizer (accellib.core.trainer.make_optimizer, fused on CUDA, in both), zero_grad; on CUDA both run bf16
autocast and TF32 (accellib.core.hardware.enable_fast_math). The loops:

    plain              the loop a careful user writes by hand
    accellib           Trainer.train_step
    plain+compile      the plain loop with each transformer block torch.compiled (accellib.core.trainer.compile_blocks)
    accellib+compile   the trainer with --train.compile=blocks

Each loop is warmed up first (compilation happens there, outside the timing), then they are timed in
interleaved blocks of a few steps, in one process, the order reversed every other round. A ratio is the
median over rounds of the per-round tokens/s ratio: the blocks of a round run back to back, so slow
drifts of a shared machine (seen here: 2x between minutes) cancel. The model's vocabulary size is the
one the trainer resolves (e.g. GPT-2's padded to a multiple of 64); the plain loop builds the same model.

    python benchmarks/throughput.py              # CPU, the tutorial model (4 layers, d=128), 1 thread
    python benchmarks/throughput.py --quick      # smoke run (writes nothing)
    python benchmarks/throughput.py --gpt2-small # GPU: GPT-2-small, bf16, GPT-2 vocabulary, with MFU

Target: accellib >= 0.97x the plain loop's tokens/s with compile off. Writes results/throughput_<device>.json.
--gpt2-small trains on a temporary folder of uniform random GPT-2 token ids: speed needs the vocabulary,
not the text.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accellib.core.config import load_config  # noqa: E402
from accellib.data.tokens import generator_for, sample_batch  # noqa: E402
from accellib.core.hardware import enable_fast_math, peak_flops  # noqa: E402
from accellib.models.transformer import Transformer  # noqa: E402
from accellib.core.records import environment, write_json  # noqa: E402
from accellib.core.trainer import Trainer, compile_blocks, make_optimizer  # noqa: E402
from data_scripts.tokenize_corpus import write_token_dataset  # noqa: E402

GPT2_IDS = 50257  # GPT-2's BPE ids are 0..50256; the data format adds one id for [MASK]
LOOPS = ("plain", "accellib", "plain+compile", "accellib+compile")
# (numerator, denominator) of the ratios reported, the first one the headline
PAIRS = (("accellib", "plain"), ("accellib+compile", "plain+compile"),
         ("accellib+compile", "accellib"), ("plain+compile", "plain"))
TARGET = 0.97


def write_gpt2_tokens(folder: str | Path, n_train: int, n_val: int, seed: int = 0) -> Path:
    """A token folder (accellib/data/tokens.py's format) of uniform random GPT-2 ids, meta tokenizer "gpt2"."""
    rng = np.random.default_rng(seed)
    ids = lambda n: rng.integers(0, GPT2_IDS, n, dtype=np.uint16)  # noqa: E731
    return write_token_dataset(folder, ids(n_train), ids(n_val), dict(
        tokenizer="gpt2", vocab_size=GPT2_IDS + 1, mask_id=GPT2_IDS,
        created_by="benchmarks/throughput.py (uniform random GPT-2 ids)", source=dict(name="synthetic")))


def plain_loop(cfg, data, device, compile_backend: str | None = None):
    """The minimal loop a careful user would write by hand. `cfg.model` is the trainer's resolved one."""
    torch.manual_seed(cfg.train.seed)
    model = Transformer(cfg.model).to(device)
    if compile_backend:
        compile_blocks(model, compile_backend)
    enable_fast_math(device)
    opt = make_optimizer(model.parameters(), cfg.optim, fused=device.type == "cuda")
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    step = 0

    def run(n):
        nonlocal step
        for _ in range(n):
            x, y = sample_batch(data.train, cfg.train.batch_size, cfg.model.seq_len,
                                generator_for(cfg.train.seed, step, 0))
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = plain_update(model, opt, x, y, cfg.optim, bf16)
            step += 1
        loss.item()  # one host read per block, as the trainer's logging
    return run


def plain_update(model, opt, x, y, o, bf16: bool = False) -> torch.Tensor:
    """One optimizer step as a careful user writes it: forward (bf16 autocast on request), backward, torch's
    clip_grad_norm_, the LR set, the optimizer's step, zero_grad. Returns the loss. Also benchmarks/host_time.py's."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
    for g in opt.param_groups:
        g["lr"] = o.lr
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def trainer_loop(tr: Trainer):
    def run(n):
        for _ in range(n):
            loss = tr.train_step()
        float(loss)  # one host read per block, as the plain loop
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


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def ratio(times: dict, a: str, b: str) -> float:
    """Median over rounds of tokens/s of `a` / tokens/s of `b` (equal tokens per block)."""
    return statistics.median(tb / ta for ta, tb in zip(times[a], times[b]))


def measure(cfg, names=LOOPS, reps: int = 20, steps: int = 5, warmup: int = 3,
            compile_backend: str = "inductor", before_timing=None) -> dict:
    """Warm up each loop of `names` (compilation happens there), then time them in `reps` interleaved rounds of
    `steps`-step blocks, the order reversed every other round. Returns the blocks' wall and CPU seconds, the
    median tokens/s per loop, the ratios of PAIRS, the graphs compiled during timing, the trainer and its
    device. `before_timing()`, when given, is called once between the warm-up and the timing (the GPU check
    reads its clock there). Also used by benchmarks/gpu_check.py."""
    ecfg = copy.deepcopy(cfg)
    ecfg.train.compile = "none"  # "accellib" is the trainer without compile, whatever the config says
    tr = Trainer(ecfg)  # resolves cfg.model (vocab_size from the data, padded as the trainer does)
    cfg.model = ecfg.model
    device, data = tr.accelerator.device, tr.data
    loops = {"plain": plain_loop(cfg, data, device), "accellib": trainer_loop(tr)}
    if "plain+compile" in names or "accellib+compile" in names:
        ccfg = copy.deepcopy(cfg)
        ccfg.train.compile = "blocks"
        loops["plain+compile"] = plain_loop(cfg, data, device, compile_backend)
        loops["accellib+compile"] = trainer_loop(Trainer(ccfg, data=data))
    for k in names:
        loops[k](warmup)
    if before_timing is not None:
        before_timing()
    graphs = graphs_compiled()
    times, cpu = {k: [] for k in names}, {k: [] for k in names}
    for r in range(reps):
        for k in (names if r % 2 == 0 else names[::-1]):
            w, c = timed(loops[k], steps, device)
            times[k].append(w)
            cpu[k].append(c)
    tokens = steps * cfg.train.batch_size * cfg.model.seq_len
    return dict(times=times, cpu=cpu, tps={k: tokens / statistics.median(v) for k, v in times.items()},
                ratios={f"{a} / {b}": ratio(times, a, b) for a, b in PAIRS if a in times and b in times},
                recompiled=graphs_compiled() - graphs, trainer=tr, device=device, tokens_per_block=tokens,
                flops_per_step=tr.task.micro_flops(None) * cfg.train.grad_accum)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny model, 3 rounds, writes nothing")
    ap.add_argument("--gpt2-small", action="store_true", help="12 layers, d=768, seq 1024, GPT-2 vocabulary (GPU)")
    ap.add_argument("--reps", type=int, default=20, help="rounds of interleaved timed blocks")
    ap.add_argument("--steps", type=int, default=5, help="steps per timed block")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per loop first (compilation happens here)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (train.threads), the same for all loops")
    ap.add_argument("--compile-backend", default="inductor", choices=["inductor", "aot_eager", "eager"])
    ap.add_argument("--no-compile", action="store_true", help="time plain and accellib only")
    ap.add_argument("--data", default=str(ROOT / "data" / "shakespeare"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.gpt2_small and device.type != "cuda":
        sys.exit("throughput.py --gpt2-small needs a CUDA GPU (torch.cuda.is_available() is False)")
    over = ["--train.progress=false", f"--train.threads={args.threads}",
            f"--train.compile_backend={args.compile_backend}"]
    tmp = tempfile.TemporaryDirectory() if args.gpt2_small else None
    if args.gpt2_small:
        config = ROOT / "configs" / "gpt2_small_owt.yaml"
        data_dir = write_gpt2_tokens(Path(tmp.name) / "gpt2_random", 2_000_000, 100_000)
        over += [f"--data.path={data_dir}", "--train.batch_size=16", "--train.grad_accum=1"]
    else:
        config = ROOT / "configs" / "tiny.yaml"
        over += [f"--data.path={args.data}"]
        if args.quick:
            over += ["--model.n_layer=2", "--model.d_model=64", "--model.seq_len=64", "--train.batch_size=16"]
            args.reps, args.steps = 3, 3
    cfg = load_config(config, over)
    res = measure(cfg, LOOPS[:2] if args.no_compile else LOOPS, args.reps, args.steps, args.warmup,
                  args.compile_backend)
    times, cpu, tps, ratios, recompiled = (res[k] for k in ("times", "cpu", "tps", "ratios", "recompiled"))
    tr, model_cfg, tokens = res["trainer"], cfg.model, res["tokens_per_block"]
    cpu_ratio = statistics.median(cpu["plain"]) / statistics.median(cpu["accellib"])
    m = model_cfg
    print(f"model L={m.n_layer} d={m.d_model} T={m.seq_len} V={m.vocab_size} B={cfg.train.batch_size} on {device}, "
          f"{torch.get_num_threads()} thread(s); {args.reps} rounds of {args.steps}-step blocks after "
          f"{args.warmup} warm-up steps; compile backend {args.compile_backend}")
    print(f"{'loop':<18}{'tokens/s (median)':>18}{'min..max':>22}")
    for k, v in times.items():
        print(f"{k:<18}{tps[k]:>18.0f}{tokens / max(v):>12.0f}..{tokens / min(v):<10.0f}")
    for i, (name, r) in enumerate(ratios.items()):
        print(f"ratio {name:<40} {r:.3f}" + (f"  (target >= {TARGET})" if i == 0 else ""))
    print(f"ratio {'accellib / plain, tokens per CPU-second':<40} {cpu_ratio:.3f}")
    print(f"graphs compiled during timing: {recompiled}")

    out = dict(device=str(device), threads=torch.get_num_threads(), compile_backend=args.compile_backend,
               model=dict(n_layer=m.n_layer, d_model=m.d_model, seq_len=m.seq_len, vocab_size=m.vocab_size,
                          batch=cfg.train.batch_size),
               reps=args.reps, steps_per_block=args.steps, warmup_steps=args.warmup,
               tokens_per_s=tps, ratio=ratios["accellib / plain"], target=TARGET, ratios=ratios,
               cpu_ratio=cpu_ratio, graphs_compiled_during_timing=recompiled,
               block_seconds=times, block_cpu_seconds=cpu, environment=environment())
    if device.type == "cuda":
        name, precision = torch.cuda.get_device_name(0), "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        peak = peak_flops(device, precision)
        flops_step = tr.task.micro_flops(None)  # the trainer's count (accellib/analysis/flops.py) of one step
        achieved = {k: flops_step * args.steps / statistics.median(v) for k, v in times.items()}
        out.update(gpu=name, precision=precision, peak_flops=peak, achieved_flops=achieved,
                   mfu={k: a / peak for k, a in achieved.items()} if peak else None)
        for k, a in achieved.items():
            print(f"MFU {k:<18} {a / peak:.1%} of {peak:.3g} FLOP/s ({precision}, {name})" if peak
                  else f"{k}: {a:.3e} FLOP/s ({name} has no peak in accellib.core.hardware.PEAK_FLOPS)")
    if not args.quick:
        (ROOT / "results").mkdir(exist_ok=True)
        write_json(ROOT / "results" / f"throughput_{device.type}.json", out)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
