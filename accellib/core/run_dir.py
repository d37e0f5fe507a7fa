"""A run folder's life cycle: what is written there, whether it holds a run, replacing and locking it.

A run folder's life cycle: what accellib writes there, whether a folder holds a run, and how
one is replaced. Decisions about the folder are taken by the main process alone and shared with
the others (`main_decides`), so ranks never race on the file system; and one command at a time may
write to a folder (`lock_run`), so a second `--resume` of a running run cannot interleave its logs."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from .options import ConfigError

RUN_FILES = ("config.yaml", "metrics.jsonl", "record.json", "loss.png", "vcycle.json", "checkpoints",
             "hf", "tensorboard")  # hf: the export accellib.evaluate writes; tensorboard: log.trackers


def holds_run(out: Path) -> bool:
    """Does `out` hold (part of) a run written by accellib?"""
    return out.is_dir() and any((out / f).exists() for f in RUN_FILES)


def checkpoint_folder(out: Path) -> Path | None:
    """The run's whole checkpoint: checkpoints/last, or .old when a kill came between the two renames of
    Trainer.save (then .old is the previous last, renamed whole); None before the first checkpoint."""
    ck = out / "checkpoints"
    return next((p for p in (ck / "last", ck / ".old") if p.exists()), None)


# the model's file in a checkpoint folder, by the launch that wrote it (Accelerate's save_state names them)
LAYOUTS = {"model.safetensors": "data-parallel", "pytorch_model.bin": "data-parallel",
           "pytorch_model_fsdp.bin": "FSDP FULL_STATE_DICT", "pytorch_model_fsdp_0": "FSDP SHARDED_STATE_DICT"}


def checkpoint_layout(src: Path) -> tuple[str, Path] | None:
    """(which launch wrote the checkpoint folder `src`, its model file or folder); None when it has none. A
    data-parallel launch writes the whole state dict; an FSDP launch either one file gathered on the main process
    (FULL_STATE_DICT) or a torch.distributed.checkpoint folder with one file per process (SHARDED_STATE_DICT)."""
    for name, layout in LAYOUTS.items():
        if (src / name).exists():
            return layout, src / name
    return None


def has_checkpoint(out: Path) -> bool:
    return checkpoint_folder(out) is not None or (out / "vcycle.json").exists()


def clear_run(out: Path) -> None:
    """Remove what accellib wrote in `out` (and nothing else the user keeps there)."""
    for f in RUN_FILES:
        p = out / f
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    for d in out.glob("stage_*"):  # V-cycle stages
        shutil.rmtree(d)


LOCK = ".accellib.lock"  # flock-ed by the process writing the run; holds its pid for the error message
_HELD: dict[str, int] = {}  # lock file -> the descriptor this process holds it with


def lock_run(out: Path) -> str | None:
    """Take `out` for this process; returns None, or a one-line reason why not. An OS file lock
    (flock): the kernel releases it when its process ends, even by kill -9, so a dead holder never
    blocks the folder and two live processes can never both hold it. Release it with `unlock_run`."""
    import fcntl
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file; give a folder for the run"
    out.mkdir(parents=True, exist_ok=True)
    p = out / LOCK
    if str(p) in _HELD:
        return None
    for _ in range(3):
        fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="ignore").strip()
            os.close(fd)
            return (f"another process{f' (pid {pid})' if pid else ''} is writing to {out}; "
                    "wait for it to finish or stop it")
        try:
            same = os.fstat(fd).st_ino == os.stat(p).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder released and removed the file between our open and our lock: again
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        _HELD[str(p)] = fd
        return None
    return f"could not take {p} (other processes keep taking it); retry"


def unlock_run(out: Path) -> None:
    """Release `out` (if this process holds it); a folder left empty, e.g. by a refused run, is removed."""
    p = out / LOCK
    fd = _HELD.pop(str(p), None)
    if fd is not None:
        p.unlink(missing_ok=True)  # before the release: a process waiting on this file sees it is gone
        os.close(fd)               # releases the lock
    try:
        out.rmdir()  # only succeeds when empty
    except OSError:
        pass


@contextmanager
def file_lock(path: Path):
    """Hold an OS lock on `path` (created if missing) for a read-modify-write that several processes
    share, e.g. the budget.json of `compare --arms X` runs started in parallel."""
    import fcntl
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_out(out: Path, resume: bool, overwrite: bool) -> None:
    """The run folder can be used as asked (raises a one-line ConfigError otherwise)."""
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


def check_shared_run_dir(accelerator, out: Path) -> None:
    """Fail in one line unless every process sees the run folder the main process writes. Only the main
    process renames checkpoints/.tmp to last, and every process loads last on --resume, so a run on several
    machines needs `out` on a filesystem they all share. The main process writes a random token into `out`
    and every process reads it back; the ranks that read something else are named (a collective, so every
    process raises together instead of some waiting forever). The token file is removed afterwards."""
    import secrets

    import torch
    import torch.distributed as dist

    from .launch import LaunchError
    if accelerator.num_processes == 1:
        return
    box = [(secrets.token_hex(16), str(out)) if accelerator.is_main_process else None]
    dist.broadcast_object_list(box, src=0)
    token, main_out = box[0]
    f = Path(out) / ".run_token"
    if accelerator.is_main_process:
        f.write_text(token)
    accelerator.wait_for_everyone()
    try:
        seen = f.read_text() == token
    except OSError:
        seen = False
    flags = accelerator.gather(torch.tensor([float(seen)], device=accelerator.device)).tolist()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        f.unlink(missing_ok=True)
    blind = [r for r, ok in enumerate(flags) if not ok]
    if blind:
        raise LaunchError(f"process(es) {blind} of {accelerator.num_processes} do not see the run folder {main_out} that the "
                          "main process writes (checkpoints are renamed there by the main process and loaded by "
                          "every process on --resume); put --out on a filesystem shared by every node (NFS, Lustre)")
