"""Prepare a full-scale dataset from the HuggingFace Hub (needs network and `pip install -e .[data]`).

    python data_scripts/prepare_hf.py --dataset wikitext-103 --tokenizer gpt2   # -> data/wikitext-103_gpt2
    python data_scripts/prepare_hf.py --dataset openwebtext --tokenizer gpt2    # -> data/openwebtext_gpt2
    python data_scripts/prepare_hf.py --dataset text --train-files a.txt --val-files b.txt --out data/mine

wikitext-103: "Salesforce/wikitext" / "wikitext-103-raw-v1", splits train and validation.
openwebtext:  "Skylion007/openwebtext", train only; every 200th document (0.5%) is validation.
text:         local text files through the same `datasets.load_dataset` path (works offline).

Tokenizers: byte (257 ids incl. [MASK]), bpe (trained here on the train split, --vocab-size),
gpt2 (GPT-2's 50257 tokens + a [MASK] id 50257; downloaded). Text is streamed document by
document into the token files, so even OpenWebText is never held in memory. The file format is
described in tokenize_corpus.py; re-running is a no-op while the output verifies (--force rebuilds).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `data_scripts` importable
    sys.path.insert(0, str(ROOT))
from data_scripts.tokenize_corpus import (  # noqa: E402
    describe, is_up_to_date, mask_id_and_vocab, prepare_target, read_meta, train_bpe, write_token_streams)

HUB = {  # name -> (hub path, config, train split, validation split or None for a holdout)
    "wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1", "train", "validation"),
    "openwebtext": ("Skylion007/openwebtext", None, "train", None),
}
HOLDOUT_EVERY = 200  # documents 199, 399, ... -> validation: a deterministic 0.5% holdout
DOC_SEP = {"openwebtext": "\n\n"}  # separates whole documents; wikitext/text rows are lines that keep their "\n"


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ModuleNotFoundError("the `datasets` package is missing: pip install -e .[data]") from None
    return datasets


class Texts:
    """A re-iterable column of texts (iterating twice: once to train BPE, once to encode)."""

    def __init__(self, ds, keep=lambda i: True, sep: str = "", column: str = "text"):
        self.ds, self.keep, self.sep, self.column = ds, keep, sep, column

    def __iter__(self) -> Iterator[str]:
        i = 0
        for batch in self.ds.iter(batch_size=1024):  # arrow-backed: read from disk batch by batch
            for t in batch[self.column]:
                if self.keep(i):
                    yield t + self.sep
                i += 1


class TextSplits(NamedTuple):
    train: Texts
    val: Texts
    source: dict


def load_text_dataset(name_or_files: str | dict, cache_dir: str | None = None) -> TextSplits:
    """`datasets.load_dataset` for a known Hub name, or for local text files given as
    {"train": path(s), "validation": path(s)} (read with line breaks kept, so rows concatenate
    back to the files)."""
    datasets = _datasets()
    if isinstance(name_or_files, dict):
        files = {k: [str(f) for f in ([v] if isinstance(v, (str, Path)) else v)] for k, v in name_or_files.items()}
        if set(files) != {"train", "validation"}:
            raise ValueError(f"data files need exactly the keys train and validation, got {sorted(files)}")
        dd = datasets.load_dataset("text", data_files=files, keep_linebreaks=True, cache_dir=cache_dir)
        source = {"name": "local text files", "sha256": None, "files": files}
        return TextSplits(Texts(dd["train"]), Texts(dd["validation"]), source)
    if name_or_files not in HUB:
        raise ValueError(f"unknown dataset {name_or_files!r}: use one of {sorted(HUB)} or a dict of text files")
    path, config, train_split, val_split = HUB[name_or_files]
    source = {"name": f"{path}" + (f":{config}" if config else ""), "sha256": None}
    sep = DOC_SEP.get(name_or_files, "")
    try:
        train = datasets.load_dataset(path, config, split=train_split, cache_dir=cache_dir)
    except RuntimeError as e:  # datasets>=4 runs no loading scripts (Skylion007/openwebtext had one):
        if "scripts are no longer supported" not in str(e):  # use the Hub's automatic parquet export
            raise
        train = datasets.load_dataset(path, config, split=train_split, cache_dir=cache_dir,
                                      revision="refs/convert/parquet")
        source["revision"] = "refs/convert/parquet"
    source["fingerprint"] = getattr(train, "_fingerprint", None)
    if val_split is not None:
        val = datasets.load_dataset(path, config, split=val_split, cache_dir=cache_dir)
        return TextSplits(Texts(train, sep=sep), Texts(val, sep=sep), source)
    source["holdout"] = f"documents i with i % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1} are validation"
    val = train.select(range(HOLDOUT_EVERY - 1, len(train), HOLDOUT_EVERY))
    return TextSplits(Texts(train, keep=lambda i: i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1, sep=sep),
                      Texts(val, sep=sep), source)


def _encode_stream(texts: Iterable[str], tokenizer, counter: dict, batch_chars: int) -> Iterator[np.ndarray]:
    """Yield uint16 ids, a batch of documents at a time; each document is encoded on its own."""
    def encode(docs: list[str]) -> np.ndarray:
        if isinstance(tokenizer, str):  # "byte": ids do not depend on document boundaries
            return np.frombuffer("".join(docs).encode("utf-8"), dtype=np.uint8).astype(np.uint16)
        encs = tokenizer.encode_batch(docs, add_special_tokens=False)
        return np.concatenate([np.asarray(e.ids, dtype=np.uint16) for e in encs])

    docs, size = [], 0
    for t in texts:
        docs.append(t)
        size += len(t)
        counter["chars"] += len(t)
        if size >= batch_chars:
            yield encode(docs)
            docs, size = [], 0
    if docs:
        yield encode(docs)


def prepare_from_dataset(ds_train_texts_iterable: Iterable[str], ds_val_texts_iterable: Iterable[str], tokenizer,
                         out_dir: str | Path, *, tokenizer_kind: str | None = None, source: dict | None = None,
                         created_by: str | None = None, requested_vocab_size: int | None = None,
                         batch_chars: int = 1 << 20) -> Path:
    """Encode two streams of texts into a token folder. `tokenizer` is "byte" or a
    tokenizers.Tokenizer (kind "bpe" unless `tokenizer_kind` says e.g. "gpt2")."""
    kind = "byte" if isinstance(tokenizer, str) else (tokenizer_kind or "bpe")
    if isinstance(tokenizer, str) and tokenizer != "byte":
        raise ValueError(f"tokenizer must be 'byte' or a tokenizers.Tokenizer, got {tokenizer!r}")
    tok = None if kind == "byte" else tokenizer
    mask_id, vocab_size = mask_id_and_vocab(kind, tok)
    if vocab_size > 65536:
        raise ValueError(f"vocab_size {vocab_size} does not fit uint16 token files")
    enc = "byte" if kind == "byte" else tok
    train_chars, val_chars = {"chars": 0}, {"chars": 0}  # filled in while streaming

    def meta(n_train: int, n_val: int) -> dict:  # called once both streams are written
        return {"source": source or {"name": "text iterables", "sha256": None}, "tokenizer": kind,
                "requested_vocab_size": requested_vocab_size, "vocab_size": vocab_size, "mask_id": mask_id,
                "n_chars_train": train_chars["chars"], "n_chars_val": val_chars["chars"],
                "bytes_per_token": val_chars["chars"] / max(n_val, 1),  # characters per val token
                "created_by": created_by or "data_scripts.prepare_hf.prepare_from_dataset(...)"}

    extra = {"tokenizer.json": tok.to_str().encode("utf-8")} if tok is not None else None
    return write_token_streams(out_dir, _encode_stream(ds_train_texts_iterable, enc, train_chars, batch_chars),
                               _encode_stream(ds_val_texts_iterable, enc, val_chars, batch_chars), meta, extra)


def make_tokenizer(kind: str, train_texts: Iterable[str], vocab_size: int):
    if kind == "byte":
        return "byte"
    if kind == "bpe":
        print(f"training a {vocab_size}-token byte-level BPE on the train split ...", flush=True)
        return train_bpe(train_texts, vocab_size)
    if kind == "gpt2":
        from tokenizers import Tokenizer
        return Tokenizer.from_pretrained("gpt2")  # downloads tokenizer.json from the Hub
    raise ValueError(f"unknown tokenizer {kind!r}: use byte, bpe or gpt2")


def default_out_dir(dataset: str, tokenizer: str, vocab_size: int = 1024) -> Path:
    """Where main() writes without --out: data/<dataset>_<tokenizer>, e.g. data/openwebtext_gpt2
    (the full-scale configs read these folders; tests/test_configs.py checks that they agree)."""
    return ROOT / "data" / f"{dataset}_{tokenizer}{vocab_size if tokenizer == 'bpe' else ''}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=[*HUB, "text"], required=True)
    p.add_argument("--train-files", nargs="+", help="--dataset text: training text files")
    p.add_argument("--val-files", nargs="+", help="--dataset text: validation text files")
    p.add_argument("--tokenizer", choices=["byte", "bpe", "gpt2"], default="gpt2")
    p.add_argument("--vocab-size", type=int, default=1024, help="bpe only: vocabulary incl. 256 bytes and [MASK]")
    p.add_argument("--out", type=Path, default=None, help="default: data/<dataset>_<tokenizer>")
    p.add_argument("--cache-dir", default=None, help="HF datasets cache (default ~/.cache/huggingface)")
    p.add_argument("--force", action="store_true", help="rebuild even if the output verifies")
    args = p.parse_args(argv)
    if args.dataset == "text" and not (args.train_files and args.val_files):
        p.error("--dataset text needs --train-files and --val-files")

    t0 = time.perf_counter()
    default_out = default_out_dir(args.dataset, args.tokenizer, args.vocab_size)
    out = args.out or default_out
    cmd = f"python data_scripts/prepare_hf.py --dataset {args.dataset} --tokenizer {args.tokenizer}"
    cmd += f" --vocab-size {args.vocab_size}" if args.tokenizer == "bpe" else ""
    if args.dataset == "text":
        cmd += (f" --train-files {' '.join(map(shlex.quote, args.train_files))}"
                f" --val-files {' '.join(map(shlex.quote, args.val_files))}")
    cmd += f" --out {shlex.quote(str(out))}" if out.resolve() != default_out.resolve() else ""
    requested = args.vocab_size if args.tokenizer == "bpe" else None
    if err := prepare_target(out):  # before any download: tidy up, never replace a folder of other files
        print(err, file=sys.stderr)
        return 1
    meta = read_meta(out)
    if (not args.force and meta and meta.get("created_by") == cmd
            and is_up_to_date(out, {"tokenizer": args.tokenizer, "requested_vocab_size": requested})):
        print(f"{out}: up to date ({time.perf_counter() - t0:.2f}s); use --force to rebuild")
        return 0
    try:
        what = {"train": args.train_files, "validation": args.val_files} if args.dataset == "text" else args.dataset
        train, val, source = load_text_dataset(what, cache_dir=args.cache_dir)
        tok = make_tokenizer(args.tokenizer, train, args.vocab_size)
    except ModuleNotFoundError as e:  # `datasets` is not installed
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # no network, Hub outage, renamed dataset, ...: one line, not a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"error: could not load {args.dataset} or the {args.tokenizer} tokenizer ({type(e).__name__}: {first}); "
              f"the HF Hub must be reachable (or its cache filled)", file=sys.stderr)
        return 1
    print(f"encoding into {out} ...", flush=True)
    prepare_from_dataset(train, val, tok, out, tokenizer_kind=args.tokenizer, source=source,
                         created_by=cmd, requested_vocab_size=requested)
    m = read_meta(out)
    print(f"{out}: {describe(m)} ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
