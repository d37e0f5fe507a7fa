"""What the device can do, for the MFU and memory columns of every log line.

MFU (model FLOPs utilisation, Chowdhery et al. 2022, PaLM App. B) = the model's analytic training
FLOPs per second (accellib/analysis/flops.py: 6 N per token plus attention, no recomputation counted) divided
by the peak FLOP/s of the devices. The peak is the vendor's dense tensor-core number for the precision
the run computes in (bf16 autocast, or TF32 for fp32 matmuls on CUDA), or `train.peak_flops` when set.
A CPU has no such table: its "peak" is measured once per process, as the FLOP/s of a 1024^3 fp32
matmul on the threads torch uses, so a CPU MFU reads "fraction of what this machine's GEMM reaches"
and is not comparable with a GPU's. `measure_matmul_flops` measures what a device's large GEMM reaches
(benchmarks/gpu_check.py reports a GPU's MFU against the data sheet's peak and against that).
"""
from __future__ import annotations

import resource
import sys
import time
from functools import lru_cache

import torch

# dense (not 2:4 sparse) peak FLOP/s from the vendors' data sheets, by a substring of the name torch reports
# (torch.cuda.get_device_name), tried in this order: the first match wins, so a variant is listed before its
# family. H100 data sheet: SXM 989 / PCIe 756 / NVL 835 TF/s bf16 (the sheet's 1979 / 1513 / 3341 are sparse,
# NVL's for a pair of cards); B200 (HGX data sheet): 2.25 PF/s dense bf16, 1.1 PF/s dense TF32 (its fp32 figure
# is not in the table: set train.peak_flops). A GPU or precision missing here gives no MFU: set train.peak_flops.
PEAK_FLOPS = {
    "H100 PCIe": dict(bf16=756e12, tf32=378e12, fp32=51e12),
    "H100 NVL": dict(bf16=835e12, tf32=418e12, fp32=60e12),
    "H200 NVL": dict(bf16=835e12, tf32=418e12, fp32=60e12),
    "H200": dict(bf16=989e12, tf32=494e12, fp32=67e12),   # SXM
    "H100": dict(bf16=989e12, tf32=494e12, fp32=67e12),   # SXM ("NVIDIA H100 80GB HBM3")
    "GB200": dict(bf16=2500e12, tf32=1250e12),  # per GPU of a GB200 NVL72 (its sheet: 180 / 90 PF dense for 72)
    "B200": dict(bf16=2250e12, tf32=1100e12),
    "A100": dict(bf16=312e12, tf32=156e12, fp32=19.5e12),
    "L40S": dict(bf16=362e12, tf32=183e12, fp32=91.6e12),
    "A10": dict(bf16=125e12, tf32=62.5e12, fp32=31.2e12),
    "4090": dict(bf16=165e12, tf32=82.6e12, fp32=82.6e12),
}


def table_peak(name: str, key: str) -> float | None:
    """The table's peak for a device called `name` computing in `key` (bf16, tf32, fp32); None if absent."""
    return next((v.get(key) for k, v in PEAK_FLOPS.items() if k in name), None)


@lru_cache(maxsize=None)
def measured_cpu_flops(n: int = 1024, reps: int = 5) -> float:
    """FLOP/s of the best of `reps` n x n x n fp32 matmuls on this process's torch threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def measure_matmul_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16, n: int = 8192,
                         seconds: float = 3.0, batch: int = 10) -> dict:
    """What this device's GEMM reaches: n x n x n matmuls in `dtype` (2 n^3 FLOPs each) run back to back for
    about `seconds`, timed in batches of `batch` (the device synchronised around each batch). Returns the best
    and the median batch's FLOP/s, and the matmuls timed. On a GPU this is the "measured peak" that an MFU can
    be reported against, beside the data sheet's."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):  # warm-up: the library picks its kernel here
        a @ b
    sync()
    rates, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end or not rates:
        t0 = time.perf_counter()
        for _ in range(batch):
            a @ b
        sync()
        rates.append(2 * n ** 3 * batch / (time.perf_counter() - t0))
    rates.sort()
    return dict(best=rates[-1], median=rates[len(rates) // 2], matmuls=batch * len(rates), n=n,
                dtype=str(dtype).removeprefix("torch."))


def peak_flops(device: torch.device, precision: str, override: float = 0.0) -> float | None:
    """Peak FLOP/s of one device computing in `precision` ("bf16" or "fp32"); None when unknown
    (a GPU missing from the table: set train.peak_flops)."""
    if override:
        return override
    if device.type == "cpu":
        return measured_cpu_flops()
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    key = "bf16" if precision == "bf16" else ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    return table_peak(name, key)


def peak_memory_gb(device: torch.device) -> float:
    """The most memory this process has held: CUDA's peak allocation on a GPU, else the process's
    peak resident set (Linux reports KiB, macOS bytes)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1e9 if sys.platform == "darwin" else rss * 1024 / 1e9


def enable_fast_math(device: torch.device) -> None:
    """On CUDA, fp32 matmuls and convolutions run on TF32 tensor cores (10-bit mantissa inputs,
    fp32 accumulation), as nanoGPT does; bf16 autocast regions are unaffected. Nothing on a CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
