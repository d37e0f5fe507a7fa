"""A run folder's life cycle: what accellib writes there, whether a folder holds a run, and how
one is replaced. Decisions about the folder are taken by the main process alone and shared with
the others (`main_decides`), so ranks never race on the file system."""
from __future__ import annotations

import shutil
from pathlib import Path

from .config import ConfigError

RUN_FILES = ("config.yaml", "metrics.jsonl", "record.json", "loss.png", "vcycle.json", "checkpoints")


def holds_run(out: Path) -> bool:
    """Does `out` hold (part of) a run written by accellib?"""
    return out.is_dir() and any((out / f).exists() for f in RUN_FILES)


def has_checkpoint(out: Path) -> bool:
    ck = out / "checkpoints"
    return (ck / "last").exists() or (ck / ".old").exists() or (out / "vcycle.json").exists()


def clear_run(out: Path) -> None:
    """Remove what accellib wrote in `out` (and nothing else the user keeps there)."""
    for f in RUN_FILES:
        p = out / f
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    for d in out.glob("stage_*"):  # V-cycle stages
        shutil.rmtree(d)


def check_out(out: Path, resume: bool, overwrite: bool) -> None:
    """The run folder can be used as asked (raises a one-line ConfigError otherwise)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the run")
    if resume and not holds_run(out):
        raise ConfigError(f"{out} holds no run to resume; start one with --config ... --out {out}")
    if not resume and not overwrite and holds_run(out):
        how = f"continue it with --resume {out}, or" if has_checkpoint(out) else "it has no checkpoint, so"
        raise ConfigError(f"{out} already holds a run; {how} replace it with --overwrite (or choose another --out)")


def main_decides(fn):
    """Run fn() on the main process only and give its result to every process (so ranks never
    race on the file system). Works before any Accelerator exists."""
    import torch.distributed as dist
    from accelerate.state import PartialState
    ps = PartialState()
    box = [fn() if ps.is_main_process else None]
    if ps.num_processes > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]
