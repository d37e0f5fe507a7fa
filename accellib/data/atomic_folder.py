"""Replace a folder's contents in one step, even against kill -9 and racing writers.

The complete new contents are staged in a hidden sibling, <parent>/.<name>.tmp-<pid>-<rand>, and then
swapped with the old folder (`swap_in`): atomically with Linux's renameat2(RENAME_EXCHANGE), elsewhere
with two renames whose one unsafe moment `recover` repairs. `recover` also deletes what dead writers
left behind; both prepare scripts run it first. `staged_folder` is the whole protocol, used by the token
datasets (tokenize_corpus.py) and the image folders (accellib/data/images.py); `StagedFile` writes one file.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not possible on some platforms (Windows); the data files were fsynced
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crash_point(point: str) -> None:
    """Called at each point of a rebuild where a crash leaves a different state on disk
    ("staged", "moved_aside", "swapped"). Does nothing; the crash tests replace it."""


def _load_renameat2():
    try:
        f = ctypes.CDLL(None, use_errno=True).renameat2  # Linux, glibc >= 2.28
    except (OSError, AttributeError):  # macOS, Windows, other C libraries: the fallback is used
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return f


_RENAMEAT2 = _load_renameat2()
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step; False where the OS or filesystem cannot."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # e.g. a filesystem without RENAME_EXCHANGE
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


class StagedFile:
    """One file of a staged dataset; hashes what it writes and fsyncs it on close."""

    def __init__(self, stage: Path, name: str):
        self.name, self.n_bytes, self.sha = name, 0, hashlib.sha256()
        self.f = open(stage / name, "xb")

    def write(self, data) -> None:
        data = memoryview(data).cast("B")  # numpy arrays and bytes alike
        self.f.write(data)
        self.sha.update(data)
        self.n_bytes += len(data)

    def close(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


def write_meta(stage: Path, meta: dict) -> None:
    """meta.json, the staged dataset's last file: a folder with a valid meta.json is complete."""
    f = StagedFile(stage, "meta.json")
    f.write((json.dumps(meta, indent=2) + "\n").encode())
    f.close()


@contextmanager
def staged_folder(out_dir: str | Path, known: set[str]) -> Iterator[Path]:
    """Yield an empty staging folder for `out_dir`; when the block ends normally, swap it in as the new
    `out_dir` (after fsync), and on any exception (or kill) delete it, leaving `out_dir` as it was.
    Leftovers of dead writers are recovered first; a folder holding files outside `known` is refused
    (the swap would delete them). A symlinked `out_dir` (a link to a data disk) stays a link."""
    given = Path(out_dir)
    out_dir = given.resolve() if given.is_symlink() else given
    recover(out_dir)
    check_target(out_dir, known)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = sibling(out_dir, "tmp")
    stage.mkdir()
    try:
        yield stage
        fsync_dir(stage)
        crash_point("staged")
        swap_in(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    fsync_dir(out_dir.parent)


def swap_in(stage: Path, out_dir: Path) -> None:
    """Put the complete dataset in `stage` at `out_dir` and delete what was there.

    With an atomic exchange, `out_dir` names the old or the new dataset at every instant. Without
    one, the old folder is first renamed to .<name>.old-<pid>-<rand>: a crash before the second
    rename leaves no dataset at `out_dir`, and `recover` puts the old one back. Several writers may
    race on one folder: each swaps in its own staged folder, and the last swap wins."""
    for _ in range(100):  # another round only when another writer moved `out_dir` at the same moment
        if not os.path.lexists(out_dir):
            try:
                os.rename(stage, out_dir)  # first build: nothing to swap with
            except OSError:
                if not os.path.lexists(out_dir):
                    raise
                continue  # another writer got there first: swap with theirs
            crash_point("swapped")
            return
        if _exchange(stage, out_dir):
            crash_point("swapped")
            shutil.rmtree(stage, ignore_errors=True)  # `stage` now holds the old dataset
            return
        old = sibling(out_dir, "old")
        try:
            os.rename(out_dir, old)
        except FileNotFoundError:
            continue
        try:
            crash_point("moved_aside")
            os.rename(stage, out_dir)
        except BaseException as e:
            if not os.path.lexists(out_dir):
                os.rename(old, out_dir)  # a real failure: put the old dataset back
                raise
            shutil.rmtree(old, ignore_errors=True)  # another writer's dataset arrived meanwhile
            if not isinstance(e, OSError):
                raise
            continue
        crash_point("swapped")
        shutil.rmtree(old, ignore_errors=True)
        return
    raise OSError(f"could not move the new dataset into {out_dir}: other writers keep replacing it")


def sibling(out_dir: Path, kind: str) -> Path:
    return out_dir.parent / f".{out_dir.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-[0-9a-f]{8}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # it exists, and belongs to another user
        return True
    return True


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def recover(out_dir: str | Path) -> None:
    """Tidy up after rebuilds of `out_dir` whose process died: delete their staging folders, and
    delete a moved-aside old dataset, or move it back when there is no dataset at `out_dir`."""
    out_dir = Path(out_dir)
    out_dir = out_dir.resolve() if out_dir.is_symlink() else out_dir
    try:
        entries = list(out_dir.parent.iterdir())
    except OSError:  # no parent folder yet: nothing to recover
        return
    dead = [p for p in entries if (m := _LEFTOVER.fullmatch(p.name)) and m["name"] == out_dir.name
            and not _alive(int(m["pid"]))]
    for p in sorted(dead, key=_mtime, reverse=True):  # newest old copy first
        if p.name.startswith(f".{out_dir.name}.old-") and not os.path.lexists(out_dir):
            try:
                os.rename(p, out_dir)
                continue
            except OSError:  # another process put a dataset there meanwhile
                pass
        shutil.rmtree(p, ignore_errors=True)
    for p in out_dir.iterdir() if out_dir.is_dir() else []:  # temp files of the older per-file writer
        if (m := _LEFTOVER.fullmatch(p.name)) and p.is_file() and not _alive(int(m["pid"])):
            p.unlink(missing_ok=True)


def check_target(out_dir: Path, known: set[str]) -> None:
    """Refuse to replace a folder that holds files other than `known`: the swap would delete them."""
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a folder: pass another --out")
    try:
        names = [p.name for p in out_dir.iterdir()]
    except (FileNotFoundError, NotADirectoryError):  # absent, or moved aside this instant by a racing rebuild
        return
    other = sorted(n for n in names if n not in known and not _LEFTOVER.fullmatch(n))
    if other:
        raise FileExistsError(f"{out_dir} holds files that are not part of the dataset ({', '.join(other[:3])}"
                              f"{', ...' if len(other) > 3 else ''}), which a rebuild would delete: "
                              f"move them away or pass another --out; nothing was changed")
