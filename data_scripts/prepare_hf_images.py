"""Prepare MNIST or CIFAR-10 from the HuggingFace Hub (needs network and `pip install -e .[data]`).

    python data_scripts/prepare_hf_images.py --dataset mnist     # -> data/mnist   (1x28x28, 60000/10000)
    python data_scripts/prepare_hf_images.py --dataset cifar10   # -> data/cifar10 (3x32x32, 50000/10000)
    python data_scripts/prepare_hf_images.py --parquet-train a.parquet --parquet-val b.parquet --out data/mine

mnist:   "ylecun/mnist", image column "image", label column "label".
cifar10: "uoft-cs/cifar10", image column "img", label column "label".
Both datasets' test split is the validation split here (there is no separate held-out split).
parquet: local files as the Hub stores image datasets (an image column of {"bytes": PNG/JPEG bytes,
"path": ...} and an integer label column; --image-column, --label-column), read through the same
`datasets.load_dataset` path, offline.

Images are decoded with PIL (datasets' Image feature) `--chunk` at a time into one uint8
(N, C, H, W) array: grayscale (PIL mode 1/L/LA) -> C=1, anything else -> RGB, C=3, decided by the
first train image; every image must have its size. The folder is written with
accellib.data.images.write_image_folder (format described there); re-running is a no-op while the
output verifies and was built by the same command (--force rebuilds).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `data_scripts` and `accellib` importable
    sys.path.insert(0, str(ROOT))
from accellib.data.images import describe_images, image_folder_verifies, write_image_folder  # noqa: E402
from data_scripts.tokenize_corpus import prepare_target, sha256_file  # noqa: E402

HUB = {  # name -> (hub path, image column, label column); splits train and test
    "mnist": ("ylecun/mnist", "image", "label"),
    "cifar10": ("uoft-cs/cifar10", "img", "label"),
}
GRAY = ("1", "L", "LA")
INSTALL = "pip install -c constraints.txt -e .[dev]"


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ModuleNotFoundError(f"the `datasets` package is missing: {INSTALL}") from None
    return datasets


def parquet_source(parquet: dict[str, str]) -> dict:
    """meta's "source" for local parquet files: each file's path and sha256."""
    return {"name": "local parquet files",
            "files": {k: {"path": v, "sha256": sha256_file(v)} for k, v in parquet.items()}}


def load_splits(dataset: str | None, parquet: dict[str, str] | None, image_column: str, label_column: str,
                cache_dir: str | None = None):
    """(train, val, source, image column, label column): two `datasets.Dataset`s whose image column
    decodes to PIL images."""
    datasets = _datasets()
    if parquet is not None:
        dd = datasets.load_dataset("parquet", data_files=parquet, cache_dir=cache_dir)
        train, val = dd["train"], dd["val"]
        source = parquet_source(parquet)
    else:
        path, image_column, label_column = HUB[dataset]
        train = datasets.load_dataset(path, split="train", cache_dir=cache_dir)
        val = datasets.load_dataset(path, split="test", cache_dir=cache_dir)
        source = {"name": path, "fingerprint": getattr(train, "_fingerprint", None)}
    for name, ds in (("train", train), ("val", val)):
        for col in (image_column, label_column):
            if col not in ds.column_names:
                raise ValueError(f"the {name} split has no column {col!r} (it has {ds.column_names})")
    if not isinstance(train.features[image_column], datasets.Image):  # e.g. a plain {"bytes", "path"} struct
        train = train.cast_column(image_column, datasets.Image())
        val = val.cast_column(image_column, datasets.Image())
    return train, val, source, image_column, label_column


def to_arrays(ds, image_column: str, label_column: str, mode: str, chunk: int = 1000
              ) -> tuple[np.ndarray, np.ndarray]:
    """Decode a split into x uint8 (N, C, H, W) (PIL `mode` "L" or "RGB") and y int64 (N,), `chunk`
    images at a time into one preallocated array."""
    n = len(ds)
    first = ds[0][image_column]
    w, h = first.size
    x = np.empty((n, 1 if mode == "L" else 3, h, w), dtype=np.uint8)
    y = np.empty(n, dtype=np.int64)
    start = 0
    for batch in ds.iter(batch_size=chunk):
        images, labels = batch[image_column], batch[label_column]
        for i, im in enumerate(images, start):
            if im.size != (w, h):
                raise ValueError(f"image {i} is {im.size[0]}x{im.size[1]}, the first is {w}x{h}")
            a = np.asarray(im.convert(mode), dtype=np.uint8)
            x[i] = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)  # (H, W) or (H, W, 3) -> (C, H, W)
        y[start:start + len(labels)] = labels
        start += len(labels)
    return x, y


def class_names(train, label_column: str, ys: list[np.ndarray]) -> list[str]:
    """The label feature's class names (datasets.ClassLabel), else "0".."max label"."""
    names = getattr(train.features[label_column], "names", None)
    return list(names) if names else [str(c) for c in range(int(max(y.max() for y in ys)) + 1)]


def command(args, out: Path, default_out: Path | None) -> str:
    """The command line that rebuilds `out` (meta's created_by)."""
    cmd = "python data_scripts/prepare_hf_images.py"
    if args.dataset:
        cmd += f" --dataset {args.dataset}"
    else:
        cmd += f" --parquet-train {shlex.quote(str(args.parquet_train))} --parquet-val {shlex.quote(str(args.parquet_val))}"
        cmd += f" --image-column {shlex.quote(args.image_column)}" if args.image_column != "image" else ""
        cmd += f" --label-column {shlex.quote(args.label_column)}" if args.label_column != "label" else ""
    at_default = default_out is not None and out.resolve() == default_out.resolve()
    return cmd if at_default else f"{cmd} --out {shlex.quote(str(out))}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=sorted(HUB))
    p.add_argument("--parquet-train", type=Path, help="instead of --dataset: a local train parquet file")
    p.add_argument("--parquet-val", type=Path, help="with --parquet-train: the validation parquet file")
    p.add_argument("--image-column", default="image", help="parquet only (default: image)")
    p.add_argument("--label-column", default="label", help="parquet only (default: label)")
    p.add_argument("--out", type=Path, default=None, help="default: data/<dataset>; required with parquet")
    p.add_argument("--cache-dir", default=None, help="HF datasets cache (default ~/.cache/huggingface)")
    p.add_argument("--chunk", type=int, default=1000, help="images decoded at a time")
    p.add_argument("--force", action="store_true", help="rebuild even if the output verifies")
    args = p.parse_args(argv)
    parquet = None
    if args.dataset is None:
        if not (args.parquet_train and args.parquet_val and args.out):
            p.error("give --dataset, or --parquet-train, --parquet-val and --out")
        parquet = {"train": str(args.parquet_train), "val": str(args.parquet_val)}
    elif args.parquet_train or args.parquet_val:
        p.error("give --dataset or --parquet-train/--parquet-val, not both")

    t0 = time.perf_counter()
    default_out = ROOT / "data" / args.dataset if args.dataset else None
    out = args.out or default_out
    cmd = command(args, out, default_out)
    if err := prepare_target(out):  # before any download: tidy up, never replace a folder of other files
        print(err, file=sys.stderr)
        return 1
    expect = {"created_by": cmd}
    if parquet:  # local files may change under the same command: their hashes must match too
        expect["source"] = parquet_source(parquet)
    if not args.force and image_folder_verifies(out, expect):
        print(f"{out}: up to date ({time.perf_counter() - t0:.2f}s); use --force to rebuild")
        return 0
    what = args.dataset or f"{args.parquet_train} / {args.parquet_val}"
    try:
        train, val, source, img_col, lab_col = load_splits(args.dataset, parquet, args.image_column,
                                                            args.label_column, args.cache_dir)
    except ModuleNotFoundError as e:  # `datasets` is not installed
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # no network, Hub outage, renamed dataset, bad parquet: one line, not a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        hint = "the HF Hub must be reachable (or its cache filled)" if args.dataset else "check the files and columns"
        print(f"error: could not load {what} ({type(e).__name__}: {first}); {hint}", file=sys.stderr)
        return 1
    mode = "L" if train[0][img_col].mode in GRAY else "RGB"
    print(f"decoding {len(train):,} + {len(val):,} images ({mode}) into {out} ...", flush=True)
    try:
        (xt, yt), (xv, yv) = (to_arrays(ds, img_col, lab_col, mode, args.chunk) for ds in (train, val))
        extra = {"source": source, "classes": class_names(train, lab_col, [yt, yv]),
                 "split": ("train: the dataset's train split; val: its test split" if args.dataset
                           else "train: --parquet-train; val: --parquet-val")}
        meta = write_image_folder(out, {"train": (xt, yt), "val": (xv, yv)}, extra, created_by=cmd)
    except ValueError as e:  # images of mixed sizes, labels out of range, val size differs from train
        print(f"error: {what}: {e}", file=sys.stderr)
        return 1
    print(f"{out}: {describe_images(meta)} ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
