"""Run records as JSON: what a run was and what it measured.

Run records: what a run was (config, code, environment) and what it measured, as JSON.
Notebooks and benchmarks read them back; full-scale records are committed under results/."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("torch", "accelerate", "numpy", "matplotlib", "tokenizers")
# the fields of a metrics.jsonl record that measure the machine, not the training: they differ between
# two runs of the same config (and between a run and its resumed copy); everything else is reproducible
TIMING_FIELDS = ("wall", "tok_per_s", "mfu", "peak_mem_gb", "exposed_comm_s")


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(accelerator=None) -> dict:
    """What ran: Python, platform, package versions, the git commit, the CPU kernels torch dispatches to
    (`cpu_capability`: AVX512, AVX2, or DEFAULT under ATEN_CPU_CAPABILITY=default; machines whose kernels differ
    give losses that differ in the last digits, which a long run carries further), and torch's build: its full version
    (`torch`, with the local tag, e.g. 2.11.0+cu130, which the package metadata in `versions` lacks) and,
    with a CUDA GPU, the CUDA runtime torch was built with, the NVIDIA driver and NCCL (None on a CPU); with the
    run's accelerator, its device, processes, mixed precision and distributed type (DDP or FSDP)."""
    env = dict(python=sys.version.split()[0], platform=platform.platform(),
               torch_threads=torch.get_num_threads(), cpu_capability=torch.backends.cpu.get_cpu_capability(),
               git_commit=git_commit(),
               versions={p: _version(p) for p in PACKAGES}, **torch_build())
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    if accelerator is not None:
        env.update(device=str(accelerator.device), num_processes=accelerator.num_processes,
                   mixed_precision=str(accelerator.mixed_precision),
                   distributed_type=accelerator.distributed_type.value)   # NO, MULTI_GPU (DDP), MULTI_CPU, FSDP
    return env


def torch_build() -> dict:
    """torch's full version string and, when a CUDA GPU is visible, the CUDA version torch was built with,
    the NVIDIA driver's version (from nvidia-smi) and NCCL's; None for each of the last three on a CPU."""
    cuda = torch.cuda.is_available()
    nccl = None
    if cuda:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # a build without NCCL
            nccl = None
    return dict(torch=torch.__version__, cuda=torch.version.cuda if cuda else None,
                driver=nvidia_driver() if cuda else None, nccl=nccl)


@lru_cache(maxsize=None)
def nvidia_driver() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (e.g. 580.65.06), None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def command_line(script: str, argv: list[str], root: Path) -> str:
    """How a benchmark was invoked, as its committed record keeps it: a path argument inside the checkout `root`
    relative to it, any other absolute path as <path> (a record holds no machine paths)."""
    def portable(a: str) -> str:
        if not a.startswith("/"):
            return a
        p = Path(a).resolve()
        return str(p.relative_to(root)) if p.is_relative_to(root) else "<path>"
    return " ".join(["python3", script, *map(portable, argv)])


def table(rows: list[dict], skip: tuple[str, ...] = ()) -> str:
    """Rows of a benchmark as a text table, one column per key of the first row (but `skip`)."""
    keys = [k for k in rows[0] if k not in skip]
    w = max(11, *(len(k) for k in keys))
    lines = [" | ".join(f"{k:>{w}}" for k in keys)]
    lines += [" | ".join(f"{str(r[k]):>{w}}" for k in keys) for r in rows]
    return "\n".join(lines)


def write_json(path: str | Path, obj) -> None:
    """Atomic JSON write (temp file + rename): a crash never leaves half a record."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per process: two writers never share a temp file
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)


def write_record(out_dir: str | Path, config: dict, final: dict, accelerator=None, **extra) -> dict:
    rec = dict(config=config, final=final, environment=environment(accelerator), **extra)
    write_json(Path(out_dir) / "record.json", rec)
    return rec


def read_record(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "record.json").read_text())


def read_metrics(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
