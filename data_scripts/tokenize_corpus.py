"""Turn text into the token files that `accellib.data.tokens` reads.

On disk, a token dataset is one folder:

    train.bin, val.bin   token ids, uint16, native byte order (numpy `tofile`), no header
    tokenizer.json       only for BPE-style tokenizers (HF `tokenizers` format)
    meta.json            written LAST: format_version, source, tokenizer, vocab_size, mask_id,
                         n_train, n_val, bytes_per_token, sha256 of every file, created_by

A rebuild never leaves a mix of old and new files, even when the process is killed: the complete
new dataset is staged in a hidden sibling folder, <parent>/.<name>.tmp-<pid>-<rand>, and then swapped
with the old folder in one step (see `atomic_folder.swap_in`). What a killed writer leaves behind is tidied up by
`recover`, which both prepare scripts run first (accellib/data/atomic_folder.py).

Tokenizers:
  byte  ids 0..255 are the UTF-8 bytes; id 256 is reserved for [MASK]  -> vocab_size 257
  bpe   small byte-level BPE trained here (ByteLevel pre-tokenizer/decoder, special [MASK])
  gpt2  (prepare_hf.py only) GPT-2's 50257 tokens; id 50257 is reserved for [MASK]
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from accellib.data.atomic_folder import StagedFile, check_target, recover, staged_folder, write_meta
from accellib.data.tokens import dataset_files

FORMAT_VERSION = 1
BYTE_VOCAB = 256  # byte ids 0..255; id 256 is [MASK]
MASK_TOKEN = "[MASK]"
SPLITS = ("train", "val")


# ----------------------------------------------------------------------------- text -> ids

def split_text(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """Deterministic split by character: the last `val_fraction` of the text is validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = len(text) - int(len(text) * val_fraction)
    return text[:cut], text[cut:]


# Chunk boundaries for BPE encoding: right after a newline that sits between two non-space
# characters ("x\ny"). There the GPT-2 pre-tokenizer regex splits the same way with or without
# the cut, so encoding chunk by chunk gives exactly the ids of encoding the whole text at once.
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def _text_chunks(text: str, chunk_chars: int) -> Iterable[str]:
    start = 0
    while start < len(text):
        m = _SAFE_CUT.search(text, start + chunk_chars) if start + chunk_chars < len(text) else None
        end = m.start() if m else len(text)
        yield text[start:end]
        start = end


def encode_text(text: str, tokenizer_kind: str, tokenizer_obj=None, chunk_chars: int = 1 << 16) -> np.ndarray:
    """Encode text to a uint16 array. "byte": UTF-8 bytes; "bpe"/"gpt2": `tokenizer_obj.encode`."""
    if tokenizer_kind == "byte":
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    if tokenizer_kind not in ("bpe", "gpt2"):
        raise ValueError(f"unknown tokenizer {tokenizer_kind!r}: use byte, bpe or gpt2")
    if tokenizer_obj is None:
        raise ValueError(f"tokenizer {tokenizer_kind!r} needs tokenizer_obj (a tokenizers.Tokenizer)")
    if tokenizer_obj.get_vocab_size() > 65536:
        raise ValueError(f"vocab of {tokenizer_obj.get_vocab_size()} does not fit uint16")
    chunks = list(_text_chunks(text, chunk_chars))
    parts = [np.asarray(e.ids, dtype=np.uint16)
             for i in range(0, len(chunks), 32)  # batches of chunks: encode_batch uses all cores
             for e in tokenizer_obj.encode_batch(chunks[i:i + 32], add_special_tokens=False)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def train_bpe(text: str | Iterable[str], vocab_size: int):
    """A small byte-level BPE (GPT-2 style) with a [MASK] special token, trained on `text`
    (a string, or an iterable of strings such as dataset rows, which is streamed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not BYTE_VOCAB + 1 < vocab_size <= 65536:
        raise ValueError(f"BPE vocab_size must be in ({BYTE_VOCAB + 1}, 65536] "
                         f"(256 bytes + [MASK] + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[MASK_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is ever unknown
        show_progress=False,
    )
    texts = _text_chunks(text, 1 << 16) if isinstance(text, str) else iter(text)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def mask_id_and_vocab(tokenizer_kind: str, tokenizer_obj=None) -> tuple[int, int]:
    """(mask_id, vocab_size) for the meta: the tokenizer's [MASK], or one extra id after its vocab."""
    if tokenizer_kind == "byte":
        return BYTE_VOCAB, BYTE_VOCAB + 1
    n = tokenizer_obj.get_vocab_size()
    mid = tokenizer_obj.token_to_id(MASK_TOKEN)
    return (mid, n) if mid is not None else (n, n + 1)


# ----------------------------------------------------------------------------- atomic writes

def show_path(path: Path) -> str:
    """`path` relative to the working directory when it is below it (for the scripts' messages)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def sha256_file(path: str | Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def write_token_streams(out_dir: str | Path, train_chunks: Iterable[np.ndarray], val_chunks: Iterable[np.ndarray],
                        meta_extra: dict | Callable[[int, int], dict],
                        extra_files: dict[str, bytes] | None = None) -> Path:
    """Stream uint16 id chunks into train.bin/val.bin (never all in memory), then write meta.json,
    all in a staging folder that then replaces `out_dir` as a whole (see the module docstring).

    `meta_extra` may be a callable meta_extra(n_train, n_val) -> dict, called once both streams are
    consumed (so it can report what was counted while streaming, e.g. characters per token)."""
    with staged_folder(out_dir, dataset_files(Path(out_dir))) as stage:
        counts, sha, top = {}, {}, -1
        for split, chunks in zip(SPLITS, (train_chunks, val_chunks)):
            s = StagedFile(stage, f"{split}.bin")
            for ids in chunks:
                ids = np.ascontiguousarray(ids)
                if ids.dtype != np.uint16:
                    raise TypeError(f"{split} ids must be uint16, got {ids.dtype}")
                s.write(ids)
                top = max(top, int(ids.max())) if ids.size else top
            s.close()
            counts[split], sha[s.name] = s.n_bytes // 2, s.sha.hexdigest()
        for name, data in (extra_files or {}).items():
            s = StagedFile(stage, name)
            s.write(data)
            s.close()
            sha[name] = s.sha.hexdigest()
        extra = meta_extra(counts["train"], counts["val"]) if callable(meta_extra) else dict(meta_extra)
        meta = {"format_version": FORMAT_VERSION, **extra, "dtype": "uint16",
                "n_train": counts["train"], "n_val": counts["val"], "sha256": sha}
        if meta.get("vocab_size", 0) > 65536:
            raise ValueError(f"vocab_size {meta['vocab_size']} does not fit uint16")
        if "vocab_size" in meta and top >= meta["vocab_size"]:
            raise ValueError(f"token id {top} is not below vocab_size {meta['vocab_size']}: "
                             f"the tokenizer and the meta disagree")
        write_meta(stage, meta)
    return Path(out_dir)


def write_token_dataset(out_dir: str | Path, train_ids: np.ndarray, val_ids: np.ndarray, meta_extra: dict,
                        extra_files: dict[str, bytes] | None = None) -> Path:
    """Atomically write train.bin, val.bin (uint16), optional extra files, then meta.json."""
    return write_token_streams(out_dir, [np.asarray(train_ids)], [np.asarray(val_ids)], meta_extra, extra_files)


def prepare_target(out_dir: Path) -> str | None:
    """What both prepare scripts do before any download: tidy up after killed runs, then check that
    `out_dir` may be replaced. Returns an error line, or None."""
    recover(out_dir)
    try:
        check_target(out_dir, dataset_files(out_dir))
    except FileExistsError as e:
        return f"error: {e}"
    return None


def describe(m: dict) -> str:
    """A token folder's meta.json in one line, as the prepare scripts print it."""
    return (f"{m['tokenizer']} vocab {m['vocab_size']} (mask id {m['mask_id']}), train {m['n_train']:,} tokens, "
            f"val {m['n_val']:,} tokens, {m['bytes_per_token']:.3f} chars/token")


def read_meta(out_dir: str | Path) -> dict | None:
    try:
        return json.loads((Path(out_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def is_up_to_date(out_dir: str | Path, expect: dict) -> bool:
    """True when meta.json has every `expect` key/value and every file's size and sha256 verify."""
    out_dir, meta = Path(out_dir), read_meta(out_dir)
    if not meta or meta.get("format_version") != FORMAT_VERSION:
        return False
    if any(meta.get(k) != v for k, v in expect.items()):
        return False
    try:
        for split in SPLITS:
            if (out_dir / f"{split}.bin").stat().st_size != 2 * meta[f"n_{split}"]:
                return False
        return all(sha256_file(out_dir / name) == h for name, h in meta["sha256"].items())
    except (OSError, KeyError, TypeError):
        return False


# ----------------------------------------------------------------------------- one call

def prepare(raw_text: str, out_dir: str | Path, tokenizer: str = "byte", vocab_size: int = 1024, *,
            force: bool = False, val_fraction: float = 0.1, source: dict | None = None,
            created_by: str | None = None) -> tuple[Path, bool]:
    """Split, (train BPE on train only,) encode and write `raw_text`. Returns (out_dir, written);
    written is False when the folder already holds exactly this dataset and `force` is False."""
    recover(out_dir)  # first: a killed earlier run may have left its old copy aside
    text_sha = hashlib.sha256(raw_text.encode("utf-8")).hexdigest()
    expect = {"tokenizer": tokenizer, "text_sha256": text_sha, "val_fraction": val_fraction,
              "requested_vocab_size": vocab_size if tokenizer == "bpe" else None}
    if not force and is_up_to_date(out_dir, expect):
        return Path(out_dir), False
    train_text, val_text = split_text(raw_text, val_fraction)
    tok, extra_files = None, None
    if tokenizer == "bpe":
        tok = train_bpe(train_text, vocab_size)
        extra_files = {"tokenizer.json": tok.to_str().encode("utf-8")}
    elif tokenizer != "byte":
        raise ValueError(f"unknown tokenizer {tokenizer!r}: use byte or bpe")
    train_ids, val_ids = encode_text(train_text, tokenizer, tok), encode_text(val_text, tokenizer, tok)
    mask_id, n_vocab = mask_id_and_vocab(tokenizer, tok)
    meta = {"source": source or {"name": "raw text", "sha256": None}, **expect,
            "vocab_size": n_vocab, "mask_id": mask_id,
            "bytes_per_token": len(val_text) / max(len(val_ids), 1),  # characters per token, val split
            "created_by": created_by or "data_scripts.tokenize_corpus.prepare(...)"}
    return write_token_dataset(out_dir, train_ids, val_ids, meta, extra_files), True
