"""Token data for training: memory-mapped token files, batch sampling, MLM masking, seeds.

On disk (written by data_scripts/, see data_scripts/tokenize_corpus.py), one folder per dataset:

    train.bin, val.bin   token ids as uint16 (numpy `tofile`, no header), read here with np.memmap
    tokenizer.json       BPE tokenizers only
    meta.json            written last, so a folder with a valid meta.json is complete:
                         {"format_version": 1, "tokenizer": "byte"|"bpe"|"gpt2", "vocab_size": 257,
                          "mask_id": 256, "n_train": ..., "n_val": ..., "bytes_per_token": ...,
                          "sha256": {"train.bin": ..., ...}, "created_by": "<command that rebuilds it>", ...}
    .verified.json       written by load_token_data, not by the scripts: which files it has already
                         hashed (see `load_token_data`); deleting it only costs one more hashing pass

Randomness never comes from a global RNG: every draw takes a torch.Generator, and
`generator_for(seed, step, micro_step, rank)` makes one that any process (or a resumed run)
can rebuild from plain integers.
"""
from __future__ import annotations

import functools
import hashlib
import json
import operator
import os
import re
import shlex
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from .. import CHECKOUT  # the repo, where data/, configs/ and data_scripts/ live (None: installed elsewhere)

FORMAT_VERSION = 1


class DataError(RuntimeError):
    """Missing or broken data. The message is one line: what is wrong and the command that fixes it."""


@dataclass
class TokenData:
    train: np.ndarray  # np.memmap uint16, (n_train,)
    val: np.ndarray  # np.memmap uint16, (n_val,)
    meta: dict
    vocab_size: int  # from meta; every id is < vocab_size
    mask_id: int | None  # id reserved for [MASK] (masked-LM), None if the tokenizer has none


SCRIPTS = ("python data_scripts/prepare_shakespeare.py (Shakespeare) or python data_scripts/prepare_hf.py "
           "--dataset wikitext-103|openwebtext|text (full-scale corpora, your text files)")


def _default_command(name: str) -> str | None:
    """The data_scripts command whose default output folder is data/<name>, or None."""
    if m := re.fullmatch(r"shakespeare(?:_bpe(\d+))?", name):
        return "python data_scripts/prepare_shakespeare.py" + (f" --tokenizer bpe --vocab-size {m[1]}" if m[1] else "")
    if name == "debian_docs":
        return "python data_scripts/prepare_debian_docs.py"
    if m := re.fullmatch(r"(wikitext-103|openwebtext)_(?:(byte|gpt2)|bpe(\d+))", name):
        tok = m[2] or f"bpe --vocab-size {m[3]}"
        return f"python data_scripts/prepare_hf.py --dataset {m[1]} --tokenizer {tok}"
    return None


def _without_out(cmd: str) -> str | None:
    """`cmd` with its --out argument removed (None if it does not parse as a command line)."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return None
    keep = [w for i, w in enumerate(words)
            if w != "--out" and not w.startswith("--out=") and (i == 0 or words[i - 1] != "--out")]
    return shlex.join(keep)


def prepare_hint(data_dir: str | Path, created_by: str | None = None, force: bool = True) -> str:
    """The end of a one-line data error: how to (re)build exactly `data_dir`.

    `created_by` (from meta.json) is the command that built the folder, but maybe somewhere else:
    the folder may have been copied, or built with --out. So its --out is dropped, and added back
    naming `data_dir` unless `data_dir` is that command's default folder, <repo>/data/<name>."""
    data_dir = Path(data_dir)
    cmd = None
    if isinstance(created_by, str) and created_by.startswith("python data_scripts/"):
        cmd = _without_out(created_by)
    cmd = cmd or _default_command(data_dir.name)
    out = f"--out {shlex.quote(str(data_dir))}" + (" --force" if force else "")
    if cmd is None:  # not a folder name the scripts know: which corpus belongs here is the user's call
        return f"token data is built by {SCRIPTS}; pass {out}"
    at_default = (cmd == _default_command(data_dir.name) and CHECKOUT is not None
                  and data_dir.resolve() == (CHECKOUT / "data" / data_dir.name).resolve())
    return f"run `{cmd}{' --force' if force else ''}`" if at_default else f"run `{cmd} {out}`"


_READERS = {"images": "image data, which model.kind=vit, cnn or mlp reads",
            "tokens": "token data, which model.kind=gpt or mlm reads"}


def _kind_by_files(data_dir: Path) -> str | None:
    """What a folder holds by its data files alone (for a meta.json that cannot be read): image arrays
    (*.npy) or token files (train.bin / val.bin); None when neither or both."""
    images = any(data_dir.glob("*.npy"))
    tokens = (data_dir / "train.bin").exists() or (data_dir / "val.bin").exists()
    return "images" if images and not tokens else "tokens" if tokens and not images else None


def other_kind(data_dir: Path, meta, wanted: str) -> str | None:
    """A one-line reason when meta.json says `data_dir` holds another kind of data than `wanted`
    ("tokens" or "images"), else None. It never suggests rebuilding the folder: that would replace
    a dataset another config reads. It names the repo's configs that read the folder. When meta.json
    cannot be read, the folder's data files (image arrays or token files) decide."""
    if isinstance(meta, dict):
        kind = "images" if meta.get("kind") == "images" else "tokens" if "tokenizer" in meta else None
    else:
        kind = _kind_by_files(data_dir)
    if kind is None or kind == wanted:
        return None
    users = []
    for p in sorted((CHECKOUT / "configs").glob("*.yaml")) if CHECKOUT is not None else []:
        try:
            path = (yaml.safe_load(p.read_text()) or {}).get("data", {}).get("path")
            if path and (CHECKOUT / path).resolve() == data_dir.resolve():
                users.append(f"configs/{p.name}")
        except (OSError, ValueError, AttributeError, yaml.YAMLError):
            continue
    read_by = f" (read by {', '.join(users[:3])}{', ...' if len(users) > 3 else ''})" if users else ""
    return (f"{data_dir} holds {_READERS[kind]}{read_by}; point --data.path at a folder of "
            f"{_READERS[wanted].split(',')[0]} instead")


def _scan(path: Path, ids: bool) -> tuple[str, int]:
    """(sha256, largest uint16 id or -1) of a file in one read; the max costs little beside the hash."""
    h, top = hashlib.sha256(), -1
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):  # an even size: chunks of a uint16 file split between ids
            h.update(chunk)
            if ids and len(chunk) > 1:
                top = max(top, int(np.frombuffer(chunk, np.uint16, len(chunk) // 2).max()))
    return h.hexdigest(), top


VERIFIED = ".verified.json"  # the checksum cache in a token folder; data_scripts' rebuilds allow it
_RECENT_NS = 2_000_000_000  # files modified less than 2 s ago are hashed but not cached (see below)


def _read_verified(data_dir: Path) -> dict:
    """The folder's checksum cache, or {} when it is missing or unreadable (never an error)."""
    try:
        cache = json.loads((data_dir / VERIFIED).read_text())
    except (OSError, ValueError):  # ValueError: not JSON, not UTF-8
        return {}
    return cache if isinstance(cache, dict) else {}


def _write_verified(data_dir: Path, cache: dict) -> None:
    """Replace the cache in one step: written under a name of this process's own, then renamed, so
    ranks racing on a first start never leave a torn file (the last rename wins; every version is
    whole). The temp name has the form accellib/data/atomic_folder.py tidies up after dead writers.
    A folder we may not write to (read-only data) just means hashing again next time."""
    tmp = data_dir / f"{VERIFIED}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(json.dumps(cache, indent=1) + "\n")
        os.replace(tmp, data_dir / VERIFIED)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def load_token_data(data_dir: str | Path, verify: bool | str = "cached", every_rank: bool = False) -> TokenData:
    """Open a token folder. The cheap checks (meta.json, file sizes) always run; `verify` adds:

      "full"    hash every file in meta.json's sha256 and check every token id is below its
                vocab_size: one read of every byte, about 1 s per GB (18 GB for OpenWebText)
      "cached"  the same, but a file hashed before is trusted while its size, mtime, inode, change
                time (ctime) and meta.json's sha256 for it are unchanged: the start-up cost is paid
                once per folder
      True      = "full" (what True meant before the cache existed); False: no hashing at all

    The cache is <data_dir>/.verified.json, {file: {size, mtime_ns, ino, ctime_ns, sha256, max_id}},
    written only after every file passed (a failure is never cached). Any write to a file, and any
    setting of its mtime (cp -p, rsync -t, os.utime), changes its ctime, which no user tool sets back;
    a copied or replaced file has another inode; a changed meta.json changes the expected sha256: all
    are hashed again. The cached max_id is still checked against the current vocab_size. A file
    modified less than 2 s ago is hashed but not cached yet, as its mtime might still repeat. What the
    cache cannot see: bytes that change without the file system knowing (bit rot, a failing disk, a
    write to the raw device). Use verify="full" (--data.verify=full) when that may have happened.

    `every_rank=True` says that every process of the launch calls this function at this point (the trainer's
    and the commands' start): under a process group the checks then run on one process per machine and the
    verdict is shared (`_shared_verdict`, a collective). Leave it False where only some processes open the
    folder (the main process drawing a figure's reference lines, or scoring): each caller then checks for itself,
    as a collective that the other processes never join would wait for them, or fail when they exit. The token
    ids are checked even when meta.json has no sha256 for a token file."""
    if verify is True:
        verify = "full"
    if verify not in (False, "cached", "full"):
        raise ValueError(f"verify must be 'cached', 'full', True (= 'full') or False, got {verify!r}")
    data_dir = Path(data_dir)
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        raise DataError(f"no token data in {data_dir}: {prepare_hint(data_dir, force=False)}")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as e:  # unreadable: the data files say whether a rebuild may be suggested
        why = other_kind(data_dir, None, "tokens")
        raise DataError(f"unreadable {meta_path} ({type(e).__name__}: {e}): "
                        f"{why or prepare_hint(data_dir)}") from None
    if why := other_kind(data_dir, meta, "tokens"):
        raise DataError(why)
    try:
        fix = prepare_hint(data_dir, meta.get("created_by"))
        counts = {split: int(meta[f"n_{split}"]) for split in ("train", "val")}
        vocab_size = int(meta["vocab_size"])
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise DataError(f"unreadable {meta_path} ({type(e).__name__}: {e}): {prepare_hint(data_dir)}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{meta_path} has format_version {meta.get('format_version')}, expected "
                        f"{FORMAT_VERSION}: {fix}")
    splits = {}
    for split, n in counts.items():
        path = data_dir / f"{split}.bin"
        if not path.is_file():
            raise DataError(f"{path} is missing: {fix}")
        if (size := path.stat().st_size) != 2 * n:  # 2 bytes per uint16 token
            raise DataError(f"{path} has {size} bytes, meta.json says {n} tokens = {2 * n} bytes: {fix}")
        if n == 0:
            raise DataError(f"{path} is empty: rebuild it from more text, e.g. {fix}")
        splits[split] = np.memmap(path, dtype=np.uint16, mode="r")
    if verify:
        check = lambda: _verify(data_dir, meta, vocab_size, verify, fix)  # noqa: E731
        err = _shared_verdict(check) if every_rank else check()
        if err:
            raise DataError(err)
    return TokenData(splits["train"], splits["val"], meta, vocab_size, meta.get("mask_id"))


def _verify(data_dir: Path, meta: dict, vocab_size: int, verify: str, fix: str) -> str | None:
    """The checks of load_token_data's `verify` (checksums, token ids, the cache); a one-line reason, or None."""
    cache = _read_verified(data_dir) if verify == "cached" else {}
    checked, hashed = {}, False
    sha = meta.get("sha256") if isinstance(meta.get("sha256"), dict) else {}
    # the token files are checked for their ids even when meta.json has no checksum for them (written by hand or by
    # an older script): an id >= vocab_size would otherwise end in an IndexError deep in the embedding
    for name in {**{"train.bin": None, "val.bin": None}, **sha}:
        expected = sha.get(name)
        path = data_dir / name
        try:
            st = path.stat()  # before reading: a write during the hash leaves a newer mtime
        except OSError:
            return f"{path} is missing (meta.json lists its sha256): {fix}"
        stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns,
                 "sha256": expected}
        entry = cache.get(name)
        if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()) \
                and type(entry.get("max_id")) is int:
            top = entry["max_id"]  # hashed before, unchanged since: trusted
        else:
            try:
                digest, top = _scan(path, ids=name in ("train.bin", "val.bin"))
            except OSError as e:
                return f"{path} cannot be read ({e.strerror or type(e).__name__}): {fix}"
            hashed = True
            if expected is not None and digest != expected:
                return f"{path} is corrupt (sha256 differs from meta.json): {fix}"
        if top >= vocab_size:
            return (f"{path} holds token id {top} but meta.json's vocab_size is {vocab_size} "
                    f"(every id must be below it): {fix}")
        # mtimes tick coarsely (a few ms, or 1-2 s on some filesystems): a file written within
        # the last _RECENT_NS could be rewritten without its mtime changing, so it is not cached
        if time.time_ns() - st.st_mtime_ns >= _RECENT_NS:
            checked[name] = {**stamp, "max_id": top}
    if hashed and checked:  # every file passed: remember them (also after a "full" check)
        _write_verified(data_dir, checked)
    return None


def _shared_verdict(check) -> str | None:
    """check() on one process per machine (local rank 0), its verdict given to every process: under a multi-process
    launch (a process group is up) the other processes never read the files, so an 8-GPU job hashes its token
    files once per machine, not 8 times. Without a process group, check() itself. A collective: every process of
    the group must call it (load_token_data calls it only when told so, every_rank=True)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return check()
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    mine = check() if local == 0 else None
    verdicts: list = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, mine)
    return next((v for v in verdicts if v), None)


def _check_len(tokens: np.ndarray, seq_len: int) -> int:
    return _check_len_n(len(tokens), seq_len)


def _check_len_n(n: int, seq_len: int) -> int:
    if n < seq_len + 2:
        raise DataError(f"split has {n} tokens but seq_len={seq_len} needs at least {seq_len + 2}: "
                        f"lower seq_len or use a bigger dataset")
    return n


def sample_batch(tokens: np.ndarray, batch_size: int, seq_len: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """B random windows of T+1 tokens -> inputs x (B, T) and next-token targets y (B, T), int64."""
    n = _check_len(tokens, seq_len)
    # a window starting at i needs tokens[i : i+T+1], so i <= n-T-1
    ix = torch.randint(n - seq_len, (batch_size,), generator=generator).tolist()
    x = torch.from_numpy(np.stack([tokens[i:i + seq_len] for i in ix]).astype(np.int64))
    y = torch.from_numpy(np.stack([tokens[i + 1:i + 1 + seq_len] for i in ix]).astype(np.int64))
    return x, y


_SLOT_TAG = 0x5107   # seed_for(seed, epoch, _SLOT_TAG): the order of one epoch's disjoint windows


@functools.lru_cache(maxsize=8)
def _slot_order(n_slots: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng(seed_for(seed, epoch, _SLOT_TAG)).permutation(n_slots)


def disjoint_windows(n_tokens: int, seq_len: int) -> int:
    """How many disjoint windows of T+1 tokens a split of n tokens holds: window s reads tokens
    [sT, sT+T+1), so consecutive windows share one token (the last target of one is the first input of the
    next) and every token is predicted once per epoch."""
    return (_check_len_n(n_tokens, seq_len) - 1) // seq_len


def disjoint_batch(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int,
                   first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows first .. first+B-1 of the run's reading order (data.windows=disjoint): every epoch is a seeded
    permutation of the split's disjoint windows, so no token is read twice until all have been read once (fresh
    data, as in the papers' single pass over a large corpus). The order depends on (seed, epoch) only, so any
    process or resumed run rebuilds it; window k of a run is window k whatever the micro-batching."""
    n_slots = disjoint_windows(len(tokens), seq_len)
    k = np.arange(first, first + batch_size)
    starts = [int(_slot_order(n_slots, seed, int(e))[p]) * seq_len for e, p in zip(*np.divmod(k, n_slots))]
    w = np.stack([tokens[i:i + seq_len + 1] for i in starts]).astype(np.int64)
    return torch.from_numpy(w[:, :-1].copy()), torch.from_numpy(w[:, 1:].copy())


def eval_windows(tokens: np.ndarray, seq_len: int, n: int) -> torch.Tensor:
    """n evenly spaced windows (n, T+1) int64, from the split's start to its end; no randomness,
    so every evaluation of every run sees the same tokens. x = w[:, :-1], y = w[:, 1:]."""
    if n < 1:
        raise ValueError(f"eval_windows needs n >= 1, got {n}")
    last = _check_len(tokens, seq_len) - seq_len - 1  # last valid start
    starts = [k * last // max(n - 1, 1) for k in range(n)]
    return torch.from_numpy(np.stack([tokens[i:i + seq_len + 1] for i in starts]).astype(np.int64))


def mask_tokens(x: torch.Tensor, mask_id: int, vocab_size: int, generator: torch.Generator,
                prob: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of x (B, T): choose k = max(1, round(prob*T)) positions per row; of those
    80% -> mask_id, 10% -> a random id != mask_id, 10% unchanged. Returns (inputs, labels);
    labels hold the original id at chosen positions and -100 (ignored by cross_entropy) elsewhere."""
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id {mask_id} is not in [0, vocab_size={vocab_size})")
    B, T = x.shape
    k = max(1, round(prob * T))
    # the k positions with the smallest random scores: exactly k per row, at least one
    chosen_idx = torch.rand(B, T, generator=generator).argsort(dim=1)[:, :k]
    chosen = torch.zeros(B, T, dtype=torch.bool).scatter_(1, chosen_idx, True)
    action = torch.rand(B, T, generator=generator)  # < 0.8 mask, < 0.9 random, else keep
    # random ids in [0, V-1), shifted past mask_id: uniform over the V-1 ids != mask_id
    rand_ids = torch.randint(vocab_size - 1, (B, T), generator=generator)
    rand_ids = rand_ids + (rand_ids >= mask_id).long()
    inputs = x.clone()
    inputs[chosen & (action < 0.8)] = mask_id
    swap = chosen & (action >= 0.8) & (action < 0.9)
    inputs[swap] = rand_ids[swap].to(x.dtype)
    labels = torch.where(chosen, x, torch.full_like(x, -100))
    return inputs, labels


_M64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    # splitmix64 finaliser (Steele et al. 2014): a fixed bijection on 64-bit ints that mixes every bit
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def seed_for(*parts: int) -> int:
    """Mix integers (seed, step, micro_step, rank, ...) into one 63-bit seed; order matters.
    Plain arithmetic, so it is the same in every process, run and Python (unlike hash())."""
    h = _splitmix64(len(parts))  # so (1,) and (1, 0) differ
    for p in parts:
        h = _splitmix64(h ^ (operator.index(p) & _M64))  # index(): ints only, no silent float truncation
    return h >> 1  # 63 bits: a valid non-negative seed everywhere


def generator_for(*parts: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator on `device` seeded with seed_for(*parts). Same integers, same draws: bitwise on
    CPU, and on a CUDA device from its own (Philox) stream, which differs from the CPU's."""
    return torch.Generator(device=device).manual_seed(seed_for(*parts))


def ngram_references(data: TokenData, seq_len: int = 0, n_windows: int = 0, max_vocab: int = 4096,
                     chunk: int = 1 << 24) -> dict[str, float]:
    """Validation loss (nats/token) of two counting models, the floor any trained LM must clear:
    a unigram and a bigram table counted on the train split with add-one smoothing. Scored on the
    validation windows the trainer evaluates (`eval_windows(val, seq_len, n_windows)`, every target
    after its input token), or on the whole split when n_windows is 0. The bigram table is V x V, so
    it is left out above `max_vocab` ids (a 50k-id BPE vocabulary would need a 20 GB float64 table, and as much again while counting)."""
    V, tr = data.vocab_size, data.train
    uni = np.zeros(V)
    bi = np.zeros(V * V) if V <= max_vocab else None
    for i in range(0, len(tr), chunk):  # chunks of the memmap: a 9B-token split never sits in memory as int64
        c = np.asarray(tr[i:i + chunk + 1], dtype=np.int64)  # one token of overlap: every pair counted once
        uni += np.bincount(c[:chunk], minlength=V)
        if bi is not None:
            bi += np.bincount(c[:-1] * V + c[1:], minlength=V * V)
    if n_windows:
        w = eval_windows(data.val, seq_len, n_windows).numpy()
        prev, nxt = w[:, :-1].ravel(), w[:, 1:].ravel()
    else:
        va = np.asarray(data.val, dtype=np.int64)
        prev, nxt = va[:-1], va[1:]
    uni = (uni + 1.0) / (len(tr) + V)
    out = dict(unigram=float(-np.log(uni[nxt]).mean()))
    if bi is not None:
        bi = bi.reshape(V, V) + 1.0
        bi /= bi.sum(1, keepdims=True)
        out["bigram"] = float(-np.log(bi[prev, nxt]).mean())
    return out


def dataset_files(out_dir: Path) -> set[str]:
    """The names a token folder may hold (a rebuild replaces the folder, so anything else is refused);
    .verified.json is this module's checksum cache (VERIFIED), which a rebuild may drop (it is re-made)."""
    return ({"train.bin", "val.bin", "meta.json", "tokenizer.json", ".verified.json"}
            | set(_meta_sha256(out_dir)))


def _meta_sha256(out_dir: Path) -> dict:
    try:
        meta = json.loads((Path(out_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return (meta.get("sha256") if isinstance(meta, dict) else None) or {}
