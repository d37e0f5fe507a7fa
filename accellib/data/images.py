"""Image-classification data for training: memory-mapped uint8 images, int64 labels, normalization.

On disk (written by data_scripts/prepare_digits.py and data_scripts/prepare_hf_images.py through
`write_image_folder`), one folder per dataset:

    train_x.npy, val_x.npy   images, uint8 (N, C, H, W) with H == W, pixel values as the source has them
                             (np.save; read here with np.load(mmap_mode="r"), so nothing is loaded up front)
    train_y.npy, val_y.npy   labels, int64 (N,), every one in [0, n_classes)
    meta.json                written last, so a folder with a valid meta.json is complete:
                             {"format_version": 1, "kind": "images", "channels": C, "image_size": H,
                              "n_classes": ..., "n_train": ..., "n_val": ..., "mean": [per channel],
                              "std": [per channel], "sha256": {"train_x.npy": ..., ...},
                              "created_by": "<command that rebuilds it>", "classes": [...], "source": ..., ...}

"mean" and "std" are per channel, in pixel units, over every pixel of the train split (population
std); `normalize` maps pixels to (x - mean) / std with them. A rebuild stages the new folder in a
hidden sibling and swaps it in as a whole (accellib/data/atomic_folder.py), as token folders are.

Like token data (accellib/data/tokens.py), every problem is a one-line `DataError` that names the command
which rebuilds the folder, and batch draws take a torch.Generator, never a global RNG.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import CHECKOUT
from . import atomic_folder as af
from .tokens import DataError, _scan, _without_out, dataset_files, other_kind

IMAGE_FORMAT_VERSION = 1
SPLITS = ("train", "val")
FILES = tuple(f"{s}_{a}.npy" for s in SPLITS for a in ("x", "y"))

# data/<name> -> the command that builds it there; any other folder name gets the digits command
DEFAULT_COMMANDS = {
    "digits": "python data_scripts/prepare_digits.py",
    "mnist": "python data_scripts/prepare_hf_images.py --dataset mnist",
    "cifar10": "python data_scripts/prepare_hf_images.py --dataset cifar10",
}
_COMPUTED = ("format_version", "kind", "channels", "image_size", "n_train", "n_val", "mean", "std",
             "sha256", "created_by")  # meta keys write_image_folder sets itself


@dataclass
class ImageData:
    train_x: np.ndarray  # uint8 (N, C, H, W), memory-mapped
    train_y: np.ndarray  # int64 (N,)
    val_x: np.ndarray
    val_y: np.ndarray
    meta: dict

    @property
    def channels(self) -> int:
        return int(self.meta["channels"])

    @property
    def image_size(self) -> int:
        return int(self.meta["image_size"])

    @property
    def n_classes(self) -> int:
        return int(self.meta["n_classes"])

    @property
    def mean(self) -> list[float]:
        return [float(m) for m in self.meta["mean"]]

    @property
    def std(self) -> list[float]:
        return [float(s) for s in self.meta["std"]]


def image_hint(data_dir: str | Path, created_by: str | None = None, force: bool = True) -> str:
    """The end of a one-line image-data error: how to (re)build exactly `data_dir` (what
    accellib.data.tokens.prepare_hint does for token folders: meta's command, its --out pointed here)."""
    data_dir = Path(data_dir)
    default = DEFAULT_COMMANDS.get(data_dir.name)
    cmd = None
    if isinstance(created_by, str) and created_by.startswith("python data_scripts/"):
        cmd = _without_out(created_by)
    cmd = cmd or default or DEFAULT_COMMANDS["digits"]
    at_default = (cmd == default and CHECKOUT is not None
                  and data_dir.resolve() == (CHECKOUT / "data" / data_dir.name).resolve())
    flag = " --force" if force else ""
    return f"run `{cmd}{flag}`" if at_default else f"run `{cmd} --out {shlex.quote(str(data_dir))}{flag}`"


def _read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_image_data(path: str | Path) -> bool:
    """True iff `path`/meta.json exists and says "kind": "images" (token folders have no kind)."""
    meta = _read_meta(Path(path))
    return meta is not None and meta.get("kind") == "images"


def _parse_meta(data_dir: Path) -> tuple[dict, str, dict[str, int], tuple[int, int, int]]:
    """meta.json, the fix command, {split: n}, and (C, H, n_classes); DataError if unusable."""
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        raise DataError(f"no image data in {data_dir}: {image_hint(data_dir, force=False)}")
    meta = _read_meta(data_dir)
    if why := other_kind(data_dir, meta, "images"):
        raise DataError(why)
    try:
        fix = image_hint(data_dir, meta.get("created_by"))
        if meta.get("kind") != "images":
            raise DataError(f"{data_dir} is not an image folder (meta.json has kind {meta.get('kind')!r}, "
                            f"expected 'images'): point at an image folder or {fix}")
        if meta.get("format_version") != IMAGE_FORMAT_VERSION:
            raise DataError(f"{meta_path} has format_version {meta.get('format_version')}, expected "
                            f"{IMAGE_FORMAT_VERSION}: {fix}")
        counts = {s: int(meta[f"n_{s}"]) for s in SPLITS}
        shape = int(meta["channels"]), int(meta["image_size"]), int(meta["n_classes"])
        if len(meta["mean"]) != shape[0] or len(meta["std"]) != shape[0]:
            raise ValueError(f"mean/std need {shape[0]} values, one per channel")
        np.asarray(meta["mean"] + meta["std"], dtype=np.float64)  # numbers, or ValueError/TypeError
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise DataError(f"unreadable {meta_path} ({type(e).__name__}: {e}): {image_hint(data_dir)}") from None
    return meta, fix, counts, shape


def describe_images(meta: dict) -> str:
    """An image folder's meta.json in one line, as the prepare scripts print it."""
    stats = " ".join(f"{m:.3f}/{s:.3f}" for m, s in zip(meta["mean"], meta["std"]))
    return (f"{meta['n_train']:,} train / {meta['n_val']:,} val images, {meta['channels']}x{meta['image_size']}x"
            f"{meta['image_size']}, {meta['n_classes']} classes, pixel mean/std per channel {stats}")


def image_shape(path: str | Path) -> tuple[int, int, int]:
    """(channels, image_size, n_classes) of an image folder from its meta.json alone (no array is opened or
    hashed): what building a model or counting its FLOPs needs. DataError if the meta is unusable."""
    return _parse_meta(Path(path))[3]


def _open(path: Path, dtype, shape: tuple, fix: str) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path} is missing: {fix}")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # bad header, or shorter than its header says
        raise DataError(f"{path} is unreadable ({type(e).__name__}: {e}): {fix}") from None
    if arr.dtype != dtype or arr.shape != shape:
        raise DataError(f"{path} holds {arr.dtype} {tuple(arr.shape)}, meta.json says {np.dtype(dtype)} "
                        f"{shape}: {fix}")
    return arr


def load_image_data(path: str | Path, verify: bool = True) -> ImageData:
    """Open an image folder. Shapes, dtypes and label ranges are always checked (labels are small);
    verify=True also checks every file's sha256 (one read of every byte)."""
    data_dir = Path(path)
    meta, fix, counts, (C, S, n_classes) = _parse_meta(data_dir)
    arrays = {}
    for split, n in counts.items():
        if n == 0:
            raise DataError(f"{data_dir}: the {split} split is empty: {fix}")
        arrays[f"{split}_x"] = _open(data_dir / f"{split}_x.npy", np.uint8, (n, C, S, S), fix)
        arrays[f"{split}_y"] = _open(data_dir / f"{split}_y.npy", np.int64, (n,), fix)
    if verify:
        for name, expected in meta.get("sha256", {}).items():
            file = data_dir / name
            if not file.is_file() or _scan(file, ids=False)[0] != expected:
                raise DataError(f"{file} is corrupt (sha256 differs from meta.json): {fix}")
    for split in SPLITS:
        y = arrays[f"{split}_y"]
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= n_classes:
            raise DataError(f"{data_dir / f'{split}_y.npy'} holds label {lo if lo < 0 else hi} outside "
                            f"[0, n_classes={n_classes}): {fix}")
    return ImageData(meta=meta, **arrays)


def normalize(x_uint8: torch.Tensor, data: ImageData) -> torch.Tensor:
    """float32 (x - mean_c) / std_c for images (..., C, H, W); a constant channel (std 0) maps to 0."""
    mean = torch.tensor(data.mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(data.std, dtype=torch.float32).clamp_min(1e-12).view(-1, 1, 1)
    return (x_uint8.to(torch.float32) - mean) / std


def _tensors(data: ImageData, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    # np.array copies out of the read-only memmap (torch wants writable memory)
    return normalize(torch.from_numpy(np.array(x)), data), torch.from_numpy(np.array(y, dtype=np.int64))


def image_batch(data: ImageData, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """B train images drawn with replacement (torch.randint(N, (B,), generator=generator)):
    normalized float32 x (B, C, H, W) and int64 labels y (B,)."""
    ix = torch.randint(len(data.train_y), (batch_size,), generator=generator).numpy()
    return _tensors(data, data.train_x[ix], data.train_y[ix])


def split_tensors(data: ImageData, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split ("train" or "val") in file order: normalized float32 x, int64 y."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return _tensors(data, getattr(data, f"{split}_x"), getattr(data, f"{split}_y"))


# ----------------------------------------------------------------------------- writing

def channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and population std of uint8 images (N, C, H, W), exact: from a 256-bin
    histogram per channel, counted `chunk` images at a time (no float copy of the split)."""
    counts = np.zeros((x.shape[1], 256), dtype=np.int64)
    for i in range(0, len(x), chunk):
        for c in range(x.shape[1]):
            counts[c] += np.bincount(x[i:i + chunk, c].ravel(), minlength=256)
    v = np.arange(256, dtype=np.float64)
    n = counts.sum(1)
    mean = counts @ v / n
    var = (counts * (v[None, :] - mean[:, None]) ** 2).sum(1) / n
    return mean.tolist(), np.sqrt(var).tolist()


def _n_classes(meta_extra: dict, ys: list[np.ndarray]) -> int:
    if "n_classes" in meta_extra:
        return int(meta_extra["n_classes"])
    if "classes" in meta_extra:
        return len(meta_extra["classes"])
    return int(max(y.max() for y in ys)) + 1


def _check_splits(splits: dict, meta_extra: dict) -> tuple[dict[str, np.ndarray], int]:
    """{file name: array} to write, and n_classes; ValueError on anything a loader would refuse."""
    if set(splits) != set(SPLITS):
        raise ValueError(f"splits needs exactly the keys train and val, got {sorted(splits)}")
    if clash := sorted(set(meta_extra) & set(_COMPUTED)):
        raise ValueError(f"meta_extra may not set {clash}: write_image_folder computes them")
    out, shape = {}, None
    for split in SPLITS:
        x, y = (np.ascontiguousarray(a) for a in splits[split])
        if x.dtype != np.uint8 or x.ndim != 4:
            raise ValueError(f"{split} images must be uint8 (N, C, H, W), got {x.dtype} {x.shape}")
        if x.shape[2] != x.shape[3]:
            raise ValueError(f"{split} images must be square, got H={x.shape[2]} W={x.shape[3]}")
        if len(x) == 0:
            raise ValueError(f"the {split} split is empty")
        if shape is not None and x.shape[1:] != shape:
            raise ValueError(f"val images are {x.shape[1:]} but train images are {shape} (C, H, W)")
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{split} labels must be integers of shape ({len(x)},), got {y.dtype} {y.shape}")
        shape = x.shape[1:]
        out[f"{split}_x.npy"], out[f"{split}_y.npy"] = x, y.astype(np.int64)
    n_classes = _n_classes(meta_extra, [out["train_y.npy"], out["val_y.npy"]])
    for split in SPLITS:
        y = out[f"{split}_y.npy"]
        if y.min() < 0 or y.max() >= n_classes:
            raise ValueError(f"{split} labels must be in [0, n_classes={n_classes}), got {y.min()}..{y.max()}")
    return out, n_classes


def write_image_folder(out_dir: str | Path, splits: dict[str, tuple[np.ndarray, np.ndarray]], meta_extra: dict,
                       created_by: str) -> dict:
    """Write an image folder (format above) from {"train": (x, y), "val": (x, y)}: the four .npy
    files, then meta.json, into a hidden staging sibling that then replaces `out_dir` as a whole, so
    a kill -9 at any moment leaves the old complete folder or the new one. n_classes comes from
    meta_extra["n_classes"], else len(meta_extra["classes"]), else the largest label + 1. Returns meta."""
    files, n_classes = _check_splits(splits, meta_extra)
    x = files["train_x.npy"]
    mean, std = channel_stats(x)
    with af.staged_folder(out_dir, dataset_files(Path(out_dir)) | set(FILES)) as stage:
        sha = {}
        for name, arr in files.items():
            f = af.StagedFile(stage, name)  # hashes what it writes, fsyncs on close
            np.save(f, arr, allow_pickle=False)
            f.close()
            sha[name] = f.sha.hexdigest()
        meta = {"format_version": IMAGE_FORMAT_VERSION, "kind": "images", "channels": x.shape[1],
                "image_size": x.shape[2], "n_classes": n_classes, "n_train": len(x),
                "n_val": len(files["val_x.npy"]), "mean": mean, "std": std, "sha256": sha,
                "created_by": created_by, **meta_extra}
        af.write_meta(stage, meta)
    return meta


def image_folder_verifies(path: str | Path, expect: dict | None = None) -> bool:
    """True when `path` loads with every sha256 verified and meta.json has every `expect` key/value
    (the prepare scripts' "up to date, nothing to do" test)."""
    try:
        meta = load_image_data(path, verify=True).meta
    except DataError:
        return False
    return all(meta.get(k) == v for k, v in (expect or {}).items())
