"""The check's sizes, the shipped config it measures and what it may change there, and what the parts share
(Check): the device, the data, the configs, a fresh compiler between trainers, the MFU's peaks."""
from __future__ import annotations

from pathlib import Path

from .base import ROOT, free_memory, rel

CONFIG = "configs/gpt2_small_owt.yaml"
# what gpu_check may change in the shipped config: the data (random ids), the length of the run and what
# scales with it (warm-up, evaluation, checkpoints, log interval), the batch, and the MFU's peak. Never the
# model, the precision or train.compile: the run measured is the documented launch (tests/test_full_scale.py)
ALLOWED = ("data.path", "train.steps", "train.eval_every", "train.checkpoint_every", "train.progress",
           "optim.warmup_steps", "train.batch_size", "train.grad_accum", "train.eval_windows", "train.log_every",
           "train.peak_flops")
# the check's sizes: on the GPU, and the CPU smoke run's (a tiny model with GPT-2's vocabulary, the eager backend)
SCALE = dict(
    gpu=dict(batch=16, seq_len=1024, warmup=4, steps=30, sync_steps=3, reps=5, block=4, loop_warmup=3,
             host_batch=1, host_seq=64, host_steps=20, peak_n=8192, peak_s=2.0, profile=(1, 1, 3),
             check_steps=40, check_warmup=4, shape_lengths=4, margin=15.0, n_train=4_000_000, n_val=200_000),
    smoke=dict(batch=4, seq_len=32, warmup=2, steps=4, sync_steps=1, reps=2, block=2, loop_warmup=1,
               host_batch=1, host_seq=16, host_steps=4, peak_n=128, peak_s=0.2, profile=(1, 1, 2),
               check_steps=8, check_warmup=2, shape_lengths=2, margin=2.0, n_train=50_000, n_val=5_000))
SMOKE_MODEL = ["--train.device=cpu", "--train.threads=1", "--model.n_layer=4", "--model.n_head=4",
               "--model.d_model=64", "--model.seq_len=32"]


def base_overrides(args, data_dir: Path, steps: int | None = None) -> list[str]:
    """The overrides of configs/gpt2_small_owt.yaml every trainer of the check runs with (ALLOWED keys only,
    and the smoke run's tiny CPU model): train.steps = `steps` (default warm-up + args.steps)."""
    sc = SCALE["smoke" if args.smoke else "gpu"]
    total = steps or (sc["warmup"] + args.steps)
    over = [f"--data.path={data_dir}", f"--train.steps={total}", "--train.eval_every=0",
            "--train.checkpoint_every=0", "--train.progress=false", f"--optim.warmup_steps={max(1, total // 10)}",
            f"--train.batch_size={sc['batch']}", "--train.grad_accum=1", f"--train.eval_windows={sc['batch']}",
            f"--train.log_every={total}"]
    if args.peak_flops:
        over.append(f"--train.peak_flops={args.peak_flops:g}")
    if args.smoke:
        over += SMOKE_MODEL + [f"--train.compile_backend={getattr(args, 'compile_backend', None) or 'eager'}"]
    return over


class Check:
    """What the parts share: the arguments, the device, the data, the record, the clock, the measured peak."""

    def __init__(self, args, rec, clock):
        import torch
        self.args, self.rec, self.clock, self.torch = args, rec, clock, torch
        self.sc = SCALE["smoke" if args.smoke else "gpu"]
        self.device = torch.device("cpu" if args.smoke else "cuda")
        self.gpu = "cpu" if args.smoke else torch.cuda.get_device_name(0)
        self.backend = (args.compile_backend or "eager") if args.smoke else "inductor"
        self.runs = Path(args.runs)
        self.data_dir = None
        self.peak_measured = None
        self.features: dict = {}
        self.lengths_run: set = set()   # random-LTD kept lengths this process has run (shape costs are per new one)

    def data(self) -> Path:
        if self.data_dir is None:
            from throughput import write_gpt2_tokens
            self.data_dir = write_gpt2_tokens(self.runs / "data", self.sc["n_train"], self.sc["n_val"])
        return self.data_dir

    def config(self, extra: list[str] = (), steps: int | None = None, path: str = CONFIG):
        from accellib.core.config import load_config
        over = base_overrides(self.args, rel(self.data()), steps) + list(extra)
        return load_config(ROOT / path, over)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def peaks(self) -> dict:
        """The peaks an MFU is given against: the data sheet's (None on a CPU or an unlisted GPU) and the
        measured matmul's (None until matmul_peak ran; the smoke run's fp32)."""
        from accellib.core.hardware import table_peak
        sheet = self.args.peak_flops or (None if self.args.smoke else table_peak(self.gpu, "bf16"))
        return dict(datasheet=sheet, measured=self.peak_measured)

    def mfu(self, flops: float, seconds: float) -> dict:
        rate = flops / seconds if seconds > 0 else float("nan")
        return {k: (round(rate / p, 5) if p else None) for k, p in self.peaks().items()}

    def reset_compiler(self) -> None:
        """A fresh dynamo for the next trainer: its graph counts are its own, and no earlier trainer's cache
        entries count against torch's recompile limit (inductor's on-disk caches stay warm)."""
        import torch._dynamo
        from torch._dynamo.utils import counters
        torch._dynamo.reset()
        counters.clear()
        free_memory()
        if self.device.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats()
