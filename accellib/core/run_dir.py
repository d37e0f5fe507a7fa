"""A run folder's life cycle: what is written there, whether it holds a run, replacing and locking it.

A folder is accellib's only when its record says so: `.accellib.json` (and its second copy,
`.accellib.copy.json`, written after it, so a damaged one is never the only copy) names the kind of folder
("run" or "comparison"), the options a resume set, and every path accellib wrote there, as it writes them.
`--overwrite` deletes exactly those paths (`plan_clear`), never through a symlink, and refuses while anything
else is where the next run writes. Decisions about the folder are taken by the main process alone and shared
with the others (`main_decides`), so ranks never race on the file system; and one command at a time may
write to a folder (`lock_run`), so a second `--resume` of a running run cannot interleave its logs."""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

from .options import ConfigError

MARKER = ".accellib.json"  # accellib's record of the folder: {"kind": ..., "wrote": [...], ...}
COPY = ".accellib.copy.json"  # the same record, written after the marker
LOCK = ".accellib.lock"  # flock-ed by the process writing the run; holds its pid for the error message
RECORD = (MARKER, COPY)
_OWN_FILES = {MARKER, COPY, LOCK, ".run_token", "metrics.jsonl.tmp"}  # bookkeeping that is accellib's in any folder
# what a run writes at the top of its folder: an entry there that the record does not list blocks --overwrite
# (the new run would write over it); anything else of the user's beside a run is kept
NEXT_RUN = ("config.yaml", "metrics.jsonl", "metrics.jsonl.tmp", "record.json", "loss.png", "vcycle.json",
            "checkpoints", "tensorboard")
RUN_START = ("config.yaml", "metrics.jsonl")  # what every run writes when it starts, right after its marker
# the files of an export folder (accellib/export.py FILES)
EXPORT_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "accellib_export.json"}
ADOPT = "python -m accellib.train --adopt {out}"  # how a run written before accellib kept records becomes one


# ----------------------------------------------------------------------------- the record
def read_marker(out: Path) -> dict:
    """The folder's accellib record: the marker, or its copy when the marker is damaged ({} when neither reads)."""
    for name in RECORD:
        try:
            d = json.loads((Path(out) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("kind") in ("run", "comparison"):
            return d
    return {}


def _write_atomic(path: Path, obj) -> None:
    """Write JSON to a temp file, fsync it, rename it over `path`: a crash leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save(out: Path, d: dict) -> None:
    for name in RECORD:  # the marker first: read_marker reads it first
        _write_atomic(Path(out) / name, d)


def write_marker(out: Path, kind: str, **fields) -> None:
    """Mark `out` as accellib's (kind "run" or "comparison"), keeping what the record holds. A run's record
    always lists RUN_START: the trainer writes them right after it marks a new run."""
    d = read_marker(out)
    d.update(kind=kind, written_by="accellib", **fields)
    if kind == "run":
        d["wrote"] = sorted(set(d.get("wrote", [])) | set(RUN_START))
    _save(out, d)


def _rel(out: Path, p) -> str:
    p = Path(p)
    return (p.relative_to(out) if p.is_absolute() else p).as_posix()


def note_written(out: Path, paths=(), runs=()) -> None:
    """Add to the record of `out` the paths accellib writes there (before or after writing them; a folder ends
    with "/"; their parent folders are noted too), and `runs`: folders in it that are runs of their own (a
    V-cycle's stage_k, a comparison's arms), deleted by their own records."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    d = read_marker(out)
    wrote, subs = set(d.get("wrote", [])), set(d.get("runs", []))
    for p, is_run in [(p, False) for p in paths] + [(r, True) for r in runs]:
        rel = _rel(out, p)
        parts = rel.split("/")
        wrote.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))  # its parent folders
        if is_run:
            subs.add(rel)
        else:
            wrote.add(rel + ("/" if str(p).endswith("/") else ""))
    d.update(wrote=sorted(wrote), runs=sorted(subs))
    d.setdefault("kind", "run")
    _save(out, d)


def _id(p: Path) -> list[int]:
    st = os.stat(p)
    return [st.st_dev, st.st_ino]


def _tree(folder: Path) -> tuple[dict, list]:
    """{relative file: size}, [relative folders] under `folder`, not following symlinks."""
    files, dirs = {}, []
    for root, ds, fs in os.walk(folder):
        r = Path(root).relative_to(folder)
        dirs += [(r / x).as_posix() for x in ds if not os.path.islink(os.path.join(root, x))]
        for x in fs + [x for x in ds if os.path.islink(os.path.join(root, x))]:
            files[(r / x).as_posix()] = os.lstat(os.path.join(root, x)).st_size
    return files, sorted(dirs)


def note_checkpoint(out: Path, folder: Path, fresh: bool = False) -> None:
    """Record the checkpoint `folder` (under out/checkpoints) that accellib has just written whole: its files and
    their sizes, and the folder by its identity (device, inode), which its renames (.tmp -> last -> step_<k> or
    .old) keep. A recorded folder stays recorded; records of folders gone from checkpoints/ are dropped. `fresh`:
    the folder was written just now (Trainer.save), so an entry with its identity is an old folder's whose inode
    the file system gave again: replaced."""
    out, folder = Path(out), Path(folder)
    d = read_marker(out)
    ck = out / "checkpoints"
    here = [_id(p) for p in ck.iterdir() if p.is_dir()] if ck.is_dir() else []
    entries = [e for e in d.get("checkpoints", []) if e["id"] in here]
    if fresh and folder.is_dir():
        entries = [e for e in entries if e["id"] != _id(folder)]
    if not folder.is_dir() or _id(folder) in [e["id"] for e in entries]:
        return
    files, dirs = _tree(folder)
    entries.append(dict(id=_id(folder), files=files, dirs=dirs))
    d.update(checkpoints=entries, wrote=sorted(set(d.get("wrote", [])) | {"checkpoints/"}))
    d.setdefault("kind", "run")
    _save(out, d)


def _recorded(out: Path, folder: Path) -> dict | None:
    """The record of the checkpoint folder `folder` (found by its identity), or None: not accellib's."""
    if folder.is_symlink() or not folder.is_dir():
        return None
    return next((e for e in read_marker(out).get("checkpoints", []) if e["id"] == _id(folder)), None)


def recorded_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """kept_checkpoints(out) that accellib wrote (by their record): what train.keep_checkpoints counts and prunes."""
    return [(k, p) for k, p in kept_checkpoints(out) if _recorded(Path(out), p) is not None]


def remove_checkpoint(out: Path, folder: Path) -> None:
    """Delete a kept checkpoint accellib wrote (train.keep_checkpoints' pruning, Trainer.save): the files its record
    lists, then its folders once empty. Anything else inside (the user's) stays, and so does the folder holding
    it; a folder without a record (not accellib's, or written before records) is left whole; a link is never
    followed."""
    entry = _recorded(Path(out), Path(folder))
    if entry is None:
        return
    for f in entry["files"]:
        p = folder / f
        if os.path.islink(p) or p.is_file():
            p.unlink()
    ident = _id(folder)
    for d in sorted(entry["dirs"], key=lambda x: -x.count("/")) + [""]:  # the deepest first, the folder last
        try:
            (folder / d).rmdir()
        except OSError:  # not empty: something of the user's is in it
            pass
    if not folder.exists():  # gone: its entry goes too (a new folder may be given the same inode)
        rec = read_marker(out)
        rec["checkpoints"] = [e for e in rec.get("checkpoints", []) if e["id"] != ident]
        _save(out, rec)


def snapshot(out: Path, sub: str) -> set[str]:
    """The paths under out/sub now (not following symlinks): note_new(out, sub, before) records what appears."""
    top = Path(out) / sub
    if not top.is_dir() or top.is_symlink():
        return set()
    files, dirs = _tree(top)
    return {f"{sub}/{x}" for x in files} | {f"{sub}/{x}/" for x in dirs}


def note_new(out: Path, sub: str, before: set[str]) -> None:
    """Record what accellib's writer (e.g. the TensorBoard tracker in out/tensorboard) created there since `before`."""
    new = snapshot(out, sub) - before
    if new:
        note_written(out, sorted(new) + [f"{sub}/"])


def _recorded_run(rec: dict) -> bool:
    """Whether a marker carries the record of what accellib wrote (markers written before records carry none)."""
    return "wrote" in rec or "runs" in rec


def adopt_run(out: Path) -> str:
    """Make the folder of a run written before accellib kept records accellib's: what accellib's runs write there
    (config.yaml, metrics.jsonl, record.json, loss.png, vcycle.json, checkpoints/, tensorboard/, stage_k/) is
    recorded as written by accellib (so --resume continues it, and --overwrite deletes it); other files stay the user's. A folder whose marker has no
    record yet (a run or comparison of an earlier accellib) is adopted the same way; a comparison's arms with it."""
    out = Path(out)
    if not out.is_dir() or not any(out.iterdir()):
        raise ConfigError(f"{out} is not a folder with files; give the folder of a run to adopt")
    rec = read_marker(out)
    if _recorded_run(rec):
        raise ConfigError(f"{out} is already accellib's {rec.get('kind', 'run')}, with a record of its files; "
                          "nothing to adopt")
    if rec.get("kind") == "comparison":
        arms = [p for p in sorted(out.rglob(MARKER)) if p.parent != out]
        arms = [a.parent for a in arms if not any(b.parent in a.parents for b in arms if b.parent != a.parent)]
        for arm in arms:
            adopt_run(arm)
        inside = {f for a in arms for f in _tree(out)[0] if (out / f).is_relative_to(a)}
        files, dirs = _tree(out)
        write_marker(out, "comparison")
        note_written(out, [f for f in files if f not in _OWN_FILES and f not in inside],
                     runs=[a.relative_to(out).as_posix() for a in arms])
        return f"adopted {out}: the comparison and its {len(arms)} run(s) are now recorded as accellib's"
    if not (out / "config.yaml").is_file():
        raise ConfigError(f"{out} has no config.yaml, so it is no run of accellib's; nothing to adopt")
    # evidence that accellib wrote it: an earlier accellib's marker, or a checkpoint holding accellib's training state
    # (a folder of the user's with a config.yaml and files at accellib's names is not enough: issue 43's first case)
    cks = [p for p in (out / "checkpoints").iterdir() if p.is_dir() and not p.is_symlink() and "step" in
           checkpoint_state(p)] if (out / "checkpoints").is_dir() and not (out / "checkpoints").is_symlink() else []
    if not rec and not cks:
        raise ConfigError(f"{out} has no checkpoint holding accellib's training state (checkpoints/*/custom_checkpoint_0"
                          ".pkl) and no marker of an earlier accellib, so nothing says accellib wrote it; nothing adopted")
    # only what accellib's runs write (NEXT_RUN, a V-cycle's stage_k), and under checkpoints/ only accellib's
    # checkpoints (recorded by note_checkpoint): anything else stays the user's
    ours = lambda rel: ((rel.split("/")[0] in NEXT_RUN and rel.split("/")[0] != "checkpoints")  # noqa: E731
                        or re.fullmatch(r"stage_\d+", rel.split("/")[0]))
    files, dirs = _tree(out)
    files, dirs = [f for f in files if ours(f) and f not in _OWN_FILES], [x for x in dirs if ours(x)]
    write_marker(out, "run")
    note_written(out, files + [f"{x}/" for x in dirs])
    for p in cks:
        note_checkpoint(out, p)
    files += [f"{p.name}/{f}" for p in cks for f in _tree(p)[0]]
    return (f"adopted {out}: its {len(files)} files at accellib's names are now accellib's run (--resume continues it, "
            "--overwrite deletes them; other files stay yours)")


# ----------------------------------------------------------------------------- what --overwrite deletes
def _sub_runs(rec: dict) -> set[str]:
    return set(rec.get("runs", []))


def plan_clear(out: Path) -> tuple[list[Path], list[str]]:
    """What an --overwrite of the run in `out` deletes, in order (files and links before their folders), and what
    stops it: the entries that its record does not list, inside a folder accellib wrote or where the next run
    writes. Never follows a symlink: a link is deleted (when recorded) or kept, its target never looked into."""
    delete: list[Path] = []
    foreign: list[str] = []
    _plan(Path(out), Path(out), read_marker(Path(out)), delete, foreign, whole=False)
    return delete, foreign


def _plan(top: Path, out: Path, rec: dict, delete: list, foreign: list, whole: bool) -> None:
    """Plan the clearing of `out` (a run, or with `whole` a sub-run deleted entirely) by its record `rec`."""
    files = {p for p in rec.get("wrote", []) if not p.endswith("/")}
    dirs = {p[:-1] for p in rec.get("wrote", []) if p.endswith("/")}
    cks = {tuple(e["id"]): e for e in rec.get("checkpoints", [])}
    subs = _sub_runs(rec)

    def refuse(p: Path, is_dir: bool) -> None:
        foreign.append(p.relative_to(top).as_posix() + ("/" if is_dir else ""))

    def walk(d: Path, rel: str, ck: dict | None, ckrel: str) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            return refuse(d, True)
        for e in entries:
            r, p = rel + e.name, Path(e.path)
            if rel == "" and e.name in RECORD + (LOCK,):
                continue  # bookkeeping: clear_run removes the record last, unlock_run the lock
            link, is_dir = e.is_symlink(), e.is_dir(follow_symlinks=False)
            if ck is not None:
                own_f, own_d = (ckrel + e.name) in ck["files"], (ckrel + e.name) in ck["dirs"]
            else:
                own_f, own_d = r in files, r in dirs
            if ck is None and r in subs and is_dir:
                _plan(top, p, read_marker(p), delete, foreign, whole=True)
            elif link:
                delete.append(p) if (own_f or own_d or r in subs) else stray(p, r, rel, False)
            elif is_dir:
                entry = cks.get(tuple(_id(p))) if ck is None and rel == "checkpoints/" else None
                if entry is not None:
                    walk(p, r + "/", entry, "")
                    delete.append(p)
                elif own_d:
                    walk(p, r + "/", ck, ckrel + e.name + "/" if ck is not None else "")
                    delete.append(p)
                else:
                    stray(p, r, rel, True)
            elif own_f:
                delete.append(p)
            else:
                stray(p, r, rel, False)

    def stray(p: Path, r: str, rel: str, is_dir: bool) -> None:
        # beside a run (at its top, not under a name the next run writes) the user's files stay; anywhere else
        # (inside a folder accellib wrote, or in a sub-run that goes whole) they stop the overwrite
        if whole or rel or r in NEXT_RUN or re.fullmatch(r"stage_\d+", r):
            refuse(p, is_dir)

    walk(out, "", None, "")
    if whole:
        delete.extend(out / n for n in RECORD + (LOCK,) if os.path.lexists(out / n))
        delete.append(out)


def foreign_files(out: Path) -> list[str]:
    """What in the run folder `out` stops an --overwrite: entries its record does not list, where it would delete
    or write (e.g. a checkpoints/model_epoch9.pt, a checkpoints/last/notes.txt, a stage_0/notes.txt of the user's)."""
    return plan_clear(out)[1]


def clear_run(out: Path) -> None:
    """Delete what accellib wrote in `out` by its record, and nothing else (refused, deleting nothing, while
    foreign_files names anything). The record goes last, so an interrupted clearing can be run again."""
    out = Path(out)
    delete, foreign = plan_clear(out)
    if foreign:
        raise ConfigError(_refusal(out, foreign))
    for p in delete:
        try:
            p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        except OSError as e:
            raise ConfigError(f"--overwrite could not remove {p} ({e.strerror or type(e).__name__}); "
                              "remove what is in the way, then run it again") from None
    for name in RECORD:
        (out / name).unlink(missing_ok=True)


def _refusal(out: Path, foreign: list[str]) -> str:
    if not _recorded_run(read_marker(out)):  # an earlier accellib's run: its marker has no record of its files yet
        return (f"{out} holds a run of an earlier accellib, which did not record the files it wrote ({_names(foreign)}); "
                f"if all of them are the run's, adopt it first with {ADOPT.format(out=out)}, then --overwrite")
    return (f"{out} holds a run and also {_names(foreign)}, which accellib did not write and --overwrite would "
            "delete or write over: move them out of the folder, or choose another --out")


# ----------------------------------------------------------------------------- what a folder holds
def holds_run(out: Path) -> bool:
    """Does `out` hold (part of) a run written by accellib? Only its record says so: a folder without one is never
    accellib's, whatever its files are named (a run written before accellib kept records: ADOPT)."""
    out = Path(out)
    return out.is_dir() and read_marker(out).get("kind") == "run"


def is_comparison(out: Path) -> bool:
    """Is `out` the folder of a comparison (python -m accellib.compare)? Its record says so."""
    out = Path(out)
    return out.is_dir() and read_marker(out).get("kind") == "comparison"


def arm_of(out: Path) -> tuple[Path, str] | None:
    """(the comparison, the arm's label) when the run folder `out` is an arm of a comparison: its record says so,
    or (an arm written before records named it) it is a run directly in a comparison's folder, or in an arm's."""
    out = Path(out)
    if not holds_run(out):
        return None
    if label := read_marker(out).get("arm"):
        return out.parents[label.count("/")], label
    if is_comparison(out.parent):
        return out.parent, out.name
    if re.fullmatch(r"seed\d+", out.name) and is_comparison(out.parent.parent):
        return out.parent.parent, f"{out.parent.name}/{out.name}"
    return None


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


# ----------------------------------------------------------------------------- checkpoints
def kept_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """The older checkpoints train.keep_checkpoints keeps, checkpoints/step_<k>, as (k, folder), oldest first."""
    found = [(int(m[1]), p) for p in (Path(out) / "checkpoints").glob("step_*")
             if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir()]
    return sorted(found)


def damage(ck: Path, rec: dict | None = None) -> str | None:
    """Why the checkpoint folder `ck` cannot be resumed from, found cheaply; None when it looks intact. A folder
    recorded at save time (note_checkpoint) needs every file it had, at its size; another needs its model file and
    no empty file. Either needs its training state (custom_checkpoint_0.pkl) to load."""
    ck = Path(ck)
    rec = read_marker(ck.parent.parent) if rec is None else rec
    try:
        entry = next((e for e in rec.get("checkpoints", []) if e["id"] == _id(ck)), None)
    except OSError:
        return "it is missing"
    if entry is not None:
        for f, size in sorted(entry["files"].items()):
            try:
                now = os.stat(ck / f).st_size
            except OSError:
                return f"{f} is missing"
            if now != size:
                return f"{f} has {now} bytes, {size} when it was saved"
    else:
        if checkpoint_layout(ck) is None:
            return "it has no model file"
        if empty := sorted(str(p.relative_to(ck)) for p in ck.rglob("*") if p.is_file() and p.stat().st_size == 0):
            return f"{empty[0]} is empty"
    if not checkpoint_state(ck):
        return "its training state (custom_checkpoint_0.pkl) does not load"
    return None


def _candidates(out: Path) -> list[Path]:
    ck = Path(out) / "checkpoints"
    return [p for p in (ck / "last", ck / ".old", *[p for _, p in reversed(kept_checkpoints(out))]) if p.exists()]


def checkpoint_folder(out: Path) -> Path | None:
    """The checkpoint a resume loads: the first intact one of checkpoints/last, .old (a kill came between the two
    renames of Trainer.save) and the kept step_<k>, newest first (train.keep_checkpoints: a damaged last falls back
    to them); when none is intact, the first there (its loader says what is wrong); None before the first."""
    found = _candidates(Path(out))
    rec = read_marker(out)
    return next((p for p in found if damage(p, rec) is None), found[0] if found else None)


def fall_back(out: Path) -> str | None:
    """When checkpoints/last is damaged and an intact checkpoint is kept, move last aside (to last.damaged, kept
    for inspection) so the next save starts afresh, and say in one line which checkpoint the resume loads."""
    out = Path(out)
    last, src = out / "checkpoints" / "last", checkpoint_folder(out)
    if src is None or src == last or not last.exists():
        return None
    why = damage(last)
    aside, n = last.with_name("last.damaged"), 1
    while aside.exists():
        aside, n = last.with_name(f"last.damaged.{n}"), n + 1
    last.rename(aside)
    return (f"warning: checkpoints/last of {out} is damaged ({why}); resuming from checkpoints/{src.name} "
            f"(step {checkpoint_state(src).get('step')}), the newest intact checkpoint; the damaged one is kept as "
            f"checkpoints/{aside.name}")


def unreadable_advice(out: Path, src: Path) -> str:
    """The end of the line that says the checkpoint `src` cannot be read: how to go on without deleting an intact
    checkpoint (one that is kept is named; --overwrite only when none is)."""
    others = [p for p in _candidates(Path(out)) if p != Path(src) and damage(p) is None]
    if others:
        return (f"move {src} out of the run folder and --resume again: it continues from {others[0]}, the newest "
                "other intact checkpoint")
    return "restore the folder from a backup, or start the run again with --overwrite"


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
            if {q.name for q in out.iterdir()} <= set(RECORD):  # a record of nothing: a refused start
                for name in RECORD:
                    (out / name).unlink(missing_ok=True)
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


def check_out(out: Path, resume: bool, overwrite: bool, arm: str | None = None) -> None:
    """The run folder can be used as asked (raises a one-line ConfigError otherwise). A new run needs a new or
    empty folder, or (with --overwrite) one that holds an accellib run and nothing where the overwrite would delete
    or write that its record does not list: what is not accellib's is never replaced. An arm of a comparison is
    started or replaced by its comparison only (`arm`: the label it trains under there)."""
    out = Path(out)
    if is_cwd(out):
        raise ConfigError(f"--out {out} is the current folder; give the run a folder of its own, e.g. --out runs/tiny")
    if is_comparison(out):
        raise ConfigError(f"{out} is the folder of a comparison (python -m accellib.compare); train an arm of it "
                          "with compare --arms NAME --resume, or give this run a folder of its own with --out")
    if resume:
        if not holds_run(out):
            adopt = (f" (a run written before accellib kept records in its folders: adopt it first with "
                     f"{ADOPT.format(out=out)})" if _stray(out) else "")
            raise ConfigError(f"{out} holds no run to resume; start one with --config ... --out {out}{adopt}")
        return
    if not holds_run(out):
        if stray := _stray(out):
            raise ConfigError(f"{out} holds files accellib did not write ({_names(stray)}); a run needs a new or "
                              "empty folder, and --overwrite replaces only a run accellib wrote: choose another --out")
        return
    owner = arm_of(out)
    if owner is not None and arm is None:
        raise ConfigError(f"{out} is arm {owner[1]} of the comparison in {owner[0]}; train it with python -m "
                          f"accellib.compare --out {owner[0]} --arms {owner[1].split('/')[0]} (--resume or --overwrite), "
                          "or give this run a folder of its own with --out")
    if not overwrite:
        how = (f"continue it with --resume {out}, or choose another --out" if has_checkpoint(out) else
               "it has no checkpoint, so replace it with --overwrite (or choose another --out)")
        raise ConfigError(f"{out} already holds a run; {how}")
    if foreign := foreign_files(out):
        raise ConfigError(_refusal(out, foreign))


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
