"""Prepare the default offline image data: scikit-learn's bundled 8x8 handwritten digits.

    python data_scripts/prepare_digits.py            # -> data/digits

`sklearn.datasets.load_digits` ships inside scikit-learn (no download): 1797 grayscale images of
8x8 pixels with values 0..16 (per its DESCR: the test set of the UCI optdigits data, 32x32 bitmaps
reduced by counting the on pixels in 4x4 blocks), labels 0..9, stored unchanged as uint8
(1797, 1, 8, 8). The split is stratified and fixed: within each class, the images are ordered by
accellib.data.tokens.seed_for(SEED, index) (plain integer arithmetic, the same in every numpy version) and
the first round(20%) are validation, so every class is in both splits (359 val, 1438 train). Both
splits keep the original order.

Re-running is a no-op while the output verifies (use --force to rebuild). The file format is
described in accellib/data/images.py.
"""
from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `data_scripts` and `accellib` importable
    sys.path.insert(0, str(ROOT))
from accellib.data.tokens import seed_for  # noqa: E402
from accellib.data.images import describe_images, image_folder_verifies, write_image_folder  # noqa: E402
from data_scripts.tokenize_corpus import prepare_target, show_path  # noqa: E402

SEED = 0
VAL_FRACTION = 0.2
SPLIT = (f"stratified: within each class, images sorted by accellib.data.tokens.seed_for({SEED}, index); the first "
         f"round({VAL_FRACTION} * class size) are val, the rest train; both in original order")
INSTALL = "pip install -c constraints.txt -e .[dev]"


def load_digits_uint8() -> tuple[np.ndarray, np.ndarray, str]:
    """(x uint8 (1797, 1, 8, 8) with values 0..16, y int64 (1797,), scikit-learn's version)."""
    import sklearn
    from sklearn.datasets import load_digits

    d = load_digits()
    if not np.array_equal(d.images, np.round(d.images)) or d.images.min() < 0 or d.images.max() > 255:
        raise ValueError("load_digits returned pixels that are not integers in 0..255")
    return d.images.astype(np.uint8)[:, None], d.target.astype(np.int64), sklearn.__version__


def raw_sha256(x: np.ndarray, y: np.ndarray) -> str:
    """sha256 of the images' bytes then the labels' bytes (uint8 and int64, C order)."""
    return hashlib.sha256(np.ascontiguousarray(x).tobytes() + np.ascontiguousarray(y).tobytes()).hexdigest()


def stratified_split(y: np.ndarray, val_fraction: float = VAL_FRACTION, seed: int = SEED
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, val indices), each sorted: round(val_fraction * n_c) of each class to val."""
    val = []
    for c in np.unique(y):
        members = sorted(np.flatnonzero(y == c).tolist(), key=lambda i: seed_for(seed, i))
        val += members[:round(val_fraction * len(members))]
    is_val = np.zeros(len(y), dtype=bool)
    is_val[val] = True
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None, help="default: data/digits")
    p.add_argument("--force", action="store_true", help="rebuild even if the output verifies")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    default_out = ROOT / "data" / "digits"
    out = args.out or default_out
    cmd = "python data_scripts/prepare_digits.py"
    cmd += f" --out {shlex.quote(str(out))}" if out.resolve() != default_out.resolve() else ""
    try:
        x, y, version = load_digits_uint8()
    except ImportError:
        print(f"error: scikit-learn is missing (it holds the digits): {INSTALL}", file=sys.stderr)
        return 2
    if err := prepare_target(out):  # tidy up after killed runs, never replace a folder of other files
        print(err, file=sys.stderr)
        return 1
    source = {"name": "scikit-learn load_digits (UCI optdigits test set)", "sklearn_version": version}
    extra = {"source": source, "raw_sha256": raw_sha256(x, y), "split": SPLIT}
    if not args.force and image_folder_verifies(out, {**extra, "created_by": cmd}):
        print(f"{show_path(out)}: up to date ({time.perf_counter() - t0:.2f}s); use --force to rebuild")
        return 0

    train, val = stratified_split(y)
    meta = write_image_folder(out, {"train": (x[train], y[train]), "val": (x[val], y[val])},
                              {**extra, "classes": [str(c) for c in range(10)]}, created_by=cmd)
    print(f"{show_path(out)}: {describe_images(meta)} ({time.perf_counter() - t0:.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
