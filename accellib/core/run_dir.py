"""A run folder's life cycle: what is written there, whether it holds a run, replacing and locking it.

A run folder's life cycle: what accellib writes there, whether a folder holds a run, and how
one is replaced. Decisions about the folder are taken by the main process alone and shared with
the others (`main_decides`), so ranks never race on the file system; and one command at a time may
write to a folder (`lock_run`), so a second `--resume` of a running run cannot interleave its logs."""
from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from .options import ConfigError

MARKER = ".accellib.json"  # written by accellib into every run and comparison folder it creates: {"kind": ...}
LOCK = ".accellib.lock"  # flock-ed by the process writing the run; holds its pid for the error message
# what accellib writes at the top of a run folder (hf: the export accellib.evaluate writes; tensorboard: log.trackers)
RUN_FILES = ("config.yaml", "metrics.jsonl", "record.json", "loss.png", "vcycle.json", "checkpoints",
             "hf", "tensorboard")
_OWN_FILES = {MARKER, LOCK, ".run_token", "metrics.jsonl.tmp"}  # bookkeeping that is accellib's in any folder
# the files of an export folder (accellib/export.py FILES)
EXPORT_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "accellib_export.json"}


def read_marker(out: Path) -> dict:
    """The folder's accellib marker ({} when it has none or it cannot be read)."""
    try:
        d = json.loads((Path(out) / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def write_marker(out: Path, kind: str, **fields) -> None:
    """Mark `out` as accellib's (kind "run" or "comparison"), keeping the fields already there."""
    from .records import write_json
    d = read_marker(out)
    d.update(kind=kind, written_by="accellib", **fields)
    write_json(Path(out) / MARKER, d)


def _legacy_run(out: Path) -> bool:
    """A run written before the marker existed: its config.yaml beside the metrics.jsonl (or a V-cycle's
    vcycle.json) accellib writes at the start, or a record.json of accellib's shape."""
    if (out / "config.yaml").is_file() and ((out / "metrics.jsonl").is_file() or (out / "vcycle.json").is_file()):
        return True
    try:
        rec = json.loads((out / "record.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and {"config", "final", "environment"} <= set(rec)


def holds_run(out: Path) -> bool:
    """Does `out` hold (part of) a run written by accellib? Only accellib's marker (or, for a run written before
    it existed, the files accellib writes first) says so: a folder of the user's own files named config.yaml
    or checkpoints/ is not a run."""
    out = Path(out)
    if not out.is_dir():
        return False
    return read_marker(out).get("kind") == "run" or _legacy_run(out)


def is_comparison(out: Path) -> bool:
    """Is `out` the folder of a comparison (python -m accellib.compare)? Its marker, or (written before the
    marker existed) its budget.json, or a comparison taking the folder now (.budget.lock)."""
    out = Path(out)
    return out.is_dir() and (read_marker(out).get("kind") == "comparison" or (out / "budget.json").is_file()
                             or (out / ".budget.lock").exists())


def _foreign(path: Path, name: str) -> list[str]:
    """What at `path` (one of RUN_FILES in a run folder) accellib did not write."""
    if not path.exists():
        return []
    if name == "checkpoints":     # last, .old, .tmp, step_<k>: each an Accelerate checkpoint folder
        if not path.is_dir():
            return [name]
        return [f"{name}/{p.name}" for p in sorted(path.iterdir())
                if not (p.is_dir() and (p.name in (".tmp", ".old", "last") or re.fullmatch(r"step_\d+", p.name)))]
    if name == "hf":              # an export: its provenance file and the files an export writes
        if not path.is_dir() or not (path / "accellib_export.json").is_file():
            return [name]
        return [f"hf/{p.name}" for p in sorted(path.iterdir()) if p.name not in EXPORT_FILES]
    if name == "tensorboard":     # <project>/[<time>/]events.out.tfevents.*, hparams.yml (Accelerate's TensorBoard tracker)
        if not path.is_dir():
            return [name]
        return [str(p.relative_to(path.parent)) for p in sorted(path.rglob("*"))
                if p.is_file() and not (p.name.startswith("events.out.tfevents.") or p.name == "hparams.yml")]
    return [name] if path.is_dir() else []


def foreign_files(out: Path) -> list[str]:
    """Entries of the run folder `out` that clear_run would delete but accellib did not write (e.g. a
    checkpoints/model_epoch9.pt of the user's): --overwrite refuses while there are any."""
    out = Path(out)
    bad = [f for name in RUN_FILES for f in _foreign(out / name, name)]
    for d in sorted(out.glob("stage_*")):  # V-cycle stages: each a run folder of its own
        if not (d.is_dir() and holds_run(d)):
            bad.append(d.name)
    return bad


def _stray(out: Path) -> list[str]:
    """What a folder that holds no run already holds (accellib's own bookkeeping aside)."""
    try:
        return sorted(p.name + ("/" if p.is_dir() else "") for p in Path(out).iterdir() if p.name not in _OWN_FILES)
    except OSError:
        return []


def _names(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def is_cwd(out: Path) -> bool:
    """Does `out` name the current folder (`.`, `""`, or its absolute path)?"""
    try:
        return Path(out).resolve() == Path.cwd().resolve()
    except OSError:
        return False


def make_folder(out: Path, what: str = "--out") -> None:
    """Create `out` (and its parents), or a one-line ConfigError saying why it cannot be."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{what} {out} is a file; give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what} {out} cannot be created ({e.strerror or type(e).__name__}); "
                          "give a folder you can write to") from None


def kept_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """The older checkpoints train.keep_checkpoints keeps, checkpoints/step_<k>, as (k, folder), oldest first."""
    found = [(int(m[1]), p) for p in (Path(out) / "checkpoints").glob("step_*")
             if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir()]
    return sorted(found)


def checkpoint_folder(out: Path) -> Path | None:
    """The run's whole checkpoint: checkpoints/last, or, when a kill came between the two renames of Trainer.save,
    the previous last renamed whole (.old, or the newest step_<k> when older checkpoints are kept); None before
    the first checkpoint."""
    ck = out / "checkpoints"
    kept = kept_checkpoints(out)
    return next((p for p in (ck / "last", ck / ".old", kept[-1][1] if kept else None) if p is not None and p.exists()),
                None)


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


def checkpoint_state(ck: Path) -> dict:
    """The training state (step, counters, resumes) in the checkpoint folder `ck`: the trainer registers its TrainState
    first, so Accelerate saves it as custom_checkpoint_0.pkl. {} when it cannot be read."""
    import torch
    try:
        d = torch.load(Path(ck) / "custom_checkpoint_0.pkl", map_location="cpu", weights_only=False)
    except Exception:  # missing or damaged: whoever loads the checkpoint says so
        return {}
    return d if isinstance(d, dict) else {}


def has_checkpoint(out: Path) -> bool:
    return checkpoint_folder(out) is not None or (out / "vcycle.json").exists()


def clear_run(out: Path) -> None:
    """Remove what accellib wrote in `out` (and nothing else the user keeps there); check_out refuses an
    --overwrite while foreign_files(out) names anything, so every path removed here is accellib's."""
    for f in RUN_FILES:
        p = out / f
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    for d in out.glob("stage_*"):  # V-cycle stages
        shutil.rmtree(d)
    (out / MARKER).unlink(missing_ok=True)


_HELD: dict[str, int] = {}  # lock file -> the descriptor this process holds it with


def lock_run(out: Path) -> str | None:
    """Take `out` for this process; returns None, or a one-line reason why not. An OS file lock
    (flock): the kernel releases it when its process ends, even by kill -9, so a dead holder never
    blocks the folder and two live processes can never both hold it. Release it with `unlock_run`."""
    import fcntl
    try:
        make_folder(out)
    except ConfigError as e:
        return str(e)
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
            if [q.name for q in out.iterdir()] == [MARKER]:  # a marker that marks nothing: a refused start
                (out / MARKER).unlink()
        except OSError:
            pass
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
    """The run folder can be used as asked (raises a one-line ConfigError otherwise). A new run needs a new
    or empty folder, or (with --overwrite) one that holds an accellib run and nothing under accellib's names
    that accellib did not write: what is not accellib's is never replaced."""
    out = Path(out)
    if is_cwd(out):
        raise ConfigError(f"--out {out} is the current folder; give the run a folder of its own, e.g. --out runs/tiny")
    if is_comparison(out):
        raise ConfigError(f"{out} is the folder of a comparison (python -m accellib.compare); train an arm of it "
                          "with compare --arms NAME --resume, or give this run a folder of its own with --out")
    if resume:
        if not holds_run(out):
            raise ConfigError(f"{out} holds no run to resume; start one with --config ... --out {out}")
        return
    if not holds_run(out):
        if stray := _stray(out):
            raise ConfigError(f"{out} holds files accellib did not write ({_names(stray)}); a run needs a new or "
                              "empty folder, and --overwrite replaces only a run accellib wrote: choose another --out")
        return
    if not overwrite:
        how = f"continue it with --resume {out}, or" if has_checkpoint(out) else "it has no checkpoint, so"
        raise ConfigError(f"{out} already holds a run; {how} replace it with --overwrite (or choose another --out)")
    if foreign := foreign_files(out):
        raise ConfigError(f"{out} holds a run and also {_names(foreign)}, which accellib did not write and "
                          "--overwrite would delete: move them out of the folder, or choose another --out")


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
