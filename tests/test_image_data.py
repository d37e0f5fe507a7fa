"""Image-classification folders (accellib/data/images.py) and the scripts that write them
(data_scripts/prepare_digits.py, data_scripts/prepare_hf_images.py): round trip, sampling,
normalization, one-line errors naming the fix, kill -9 safety, and the offline parquet path."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from accellib import REPO_ROOT
from accellib.data.tokens import DataError
from accellib.data.images import (ImageData, image_batch, image_hint, is_image_data, load_image_data, normalize,
                                 split_tensors, write_image_folder)
from accellib.data import atomic_folder as af
from data_scripts import prepare_digits, prepare_hf_images

DIGITS = "python data_scripts/prepare_digits.py"


def random_splits(seed=0, n=(40, 12), c=3, s=5, k=4):
    rng = np.random.default_rng(seed)
    return {split: (rng.integers(0, 256, (m, c, s, s), dtype=np.uint8), rng.integers(0, k, m))
            for split, m in zip(("train", "val"), n)}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def one_line_error(data_dir, verify=True) -> str:
    with pytest.raises(DataError) as e:
        load_image_data(data_dir, verify=verify)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_round_trip(tmp_path):
    splits = random_splits()
    meta = write_image_folder(tmp_path / "d", splits, {"classes": list("abcd"), "source": {"name": "rng"}}, "me")
    d = load_image_data(tmp_path / "d")
    assert d.meta == meta == json.loads((tmp_path / "d" / "meta.json").read_text())
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["meta.json", "train_x.npy", "train_y.npy",
                                                                  "val_x.npy", "val_y.npy"]
    for split, (x, y) in splits.items():
        dx, dy = getattr(d, f"{split}_x"), getattr(d, f"{split}_y")
        assert isinstance(dx, np.memmap) and dx.dtype == np.uint8 and dy.dtype == np.int64
        assert np.array_equal(dx, x) and np.array_equal(dy, y)
    x = splits["train"][0]
    assert (d.channels, d.image_size, d.n_classes, meta["n_train"], meta["n_val"]) == (3, 5, 4, 40, 12)
    assert (meta["kind"], meta["format_version"], meta["created_by"], meta["classes"]) == ("images", 1, "me", list("abcd"))
    assert np.allclose(d.mean, x.mean(axis=(0, 2, 3))) and np.allclose(d.std, x.std(axis=(0, 2, 3)))
    assert is_image_data(tmp_path / "d") and not is_image_data(tmp_path / "nothing")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "meta.json").write_text('{"format_version": 1, "tokenizer": "byte"}')
    assert not is_image_data(tmp_path / "tok")
    assert "holds token data" in one_line_error(tmp_path / "tok")   # (before issue 26: "is not an image folder")


@pytest.mark.parametrize("change,msg", [
    (lambda s: s["train"][0].astype(np.float32), "uint8"),
    (lambda s: s["train"][0][:, 0], "uint8"),
    (lambda s: s["train"][0][:, :, :4], "square"),
    (lambda s: s["train"][0][:0], "empty")])
def test_write_refuses_bad_images(tmp_path, change, msg):
    splits = random_splits()
    splits["train"] = (change(splits), splits["train"][1][:len(change(splits))])
    with pytest.raises(ValueError, match=msg):
        write_image_folder(tmp_path / "d", splits, {}, "me")
    assert list(tmp_path.iterdir()) == []


def test_write_refuses_bad_labels_and_meta(tmp_path):
    with pytest.raises(ValueError, match=r"in \[0, n_classes=3\)"):
        write_image_folder(tmp_path / "d", random_splits(k=4), {"n_classes": 3}, "me")
    with pytest.raises(ValueError, match="may not set"):
        write_image_folder(tmp_path / "d", random_splits(), {"sha256": {}}, "me")
    assert list(tmp_path.iterdir()) == []


def test_image_batch_is_seeded_and_normalized(tmp_path):
    write_image_folder(tmp_path / "d", random_splits(), {}, "me")
    d = load_image_data(tmp_path / "d")
    x, y = image_batch(d, 16, torch.Generator().manual_seed(1))
    assert x.shape == (16, 3, 5, 5) and x.dtype == torch.float32 and y.shape == (16,) and y.dtype == torch.int64
    x2, y2 = image_batch(d, 16, torch.Generator().manual_seed(1))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = image_batch(d, 16, torch.Generator().manual_seed(2))
    assert not torch.equal(x, x3)
    ix = torch.randint(40, (16,), generator=torch.Generator().manual_seed(1)).numpy()  # the documented draw
    assert torch.equal(x, normalize(torch.from_numpy(np.array(d.train_x[ix])), d))
    assert torch.equal(y, torch.from_numpy(np.array(d.train_y[ix])))


def test_split_tensors_are_standardized_per_channel(tmp_path):
    splits = random_splits(n=(60, 7))
    x = splits["train"][0]
    x[:, 1] //= 4  # channels with different statistics
    x[:, 2] = 255 - x[:, 2] // 16
    write_image_folder(tmp_path / "d", splits, {}, "me")
    d = load_image_data(tmp_path / "d")
    xt, yt = split_tensors(d, "train")
    assert xt.dtype == torch.float32 and xt.shape == (60, 3, 5, 5) and torch.equal(yt, torch.from_numpy(splits["train"][1]))
    assert torch.allclose(xt.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(xt.std(dim=(0, 2, 3), unbiased=False), torch.ones(3), atol=1e-5)
    xv, yv = split_tensors(d, "val")  # file order, same normalization as train
    assert torch.equal(xv, normalize(torch.from_numpy(splits["val"][0]), d)) and yv.tolist() == splits["val"][1].tolist()
    with pytest.raises(ValueError, match="split"):
        split_tensors(d, "test")


def test_prepare_digits(tmp_path, capsys):
    out = tmp_path / "digits"
    assert prepare_digits.main(["--out", str(out)]) == 0
    d = load_image_data(out)
    x, y, _ = prepare_digits.load_digits_uint8()
    assert (d.train_x.shape[1:], d.n_classes, len(d.train_y) + len(d.val_y)) == ((1, 8, 8), 10, 1797)
    assert d.val_x.max() == 16 and d.meta["classes"] == [str(c) for c in range(10)]
    assert d.meta["created_by"] == f"{DIGITS} --out {out}"
    # stratified: round(20%) of every class in val, and the two splits are exactly the dataset
    per_class, val_counts = np.bincount(y), np.bincount(d.val_y, minlength=10)
    assert val_counts.tolist() == [round(0.2 * n) for n in per_class] and val_counts.min() > 30
    assert len(d.val_y) == 359
    both = np.concatenate([d.train_x, d.val_x]).reshape(1797, -1)
    assert sorted(map(bytes, both)) == sorted(map(bytes, x.reshape(1797, -1)))
    # a second run is a no-op; a forced rebuild gives identical files
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    assert prepare_digits.main(["--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    assert prepare_digits.main(["--out", str(out), "--force"]) == 0
    assert load_image_data(out).meta == d.meta and leftovers(tmp_path) == []


def test_prepare_digits_without_scikit_learn(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn` raises ImportError
    assert prepare_digits.main(["--out", str(tmp_path / "digits")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and "pip install -c constraints.txt -e .[dev]" in err
    assert not (tmp_path / "digits").exists()


def _corrupt_pixel(d: Path):
    b = bytearray((d / "train_x.npy").read_bytes())
    b[-1] ^= 1
    (d / "train_x.npy").write_bytes(bytes(b))


def _edit_meta(d: Path, **kw):
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, **kw}))


@pytest.mark.parametrize("verify,damage,msg", [
    (True, _corrupt_pixel, "is corrupt"),
    (False, lambda d: (d / "val_x.npy").write_bytes((d / "val_x.npy").read_bytes()[:-3]), "is unreadable"),
    (False, lambda d: (d / "val_y.npy").unlink(), "is missing"),
    (False, lambda d: np.save(d / "val_y.npy", np.full(12, 7)), r"holds label 7 outside \[0, n_classes=4\)"),
    (False, lambda d: _edit_meta(d, n_train=41), r"holds uint8 \(40, 3, 5, 5\), meta.json says uint8 \(41"),
    (False, lambda d: _edit_meta(d, format_version=2), "format_version 2, expected 1"),
    (False, lambda d: (d / "meta.json").write_text("{"), "unreadable .*meta.json")])
def test_broken_folder_is_one_line_naming_the_fix(tmp_path, verify, damage, msg):
    out = tmp_path / "x" / "digits"  # a digits folder that is not the repo's: the fix names it with --out
    write_image_folder(out, random_splits(), {}, DIGITS)
    damage(out)
    err = one_line_error(out, verify)
    assert re.search(msg, err), err
    assert err.endswith(f"run `{DIGITS} --out {out} --force`"), err


def test_missing_folder_names_prepare_digits(tmp_path):
    err = one_line_error(tmp_path / "digits")
    assert err == f"no image data in {tmp_path / 'digits'}: run `{DIGITS} --out {tmp_path / 'digits'}`"
    assert image_hint(REPO_ROOT / "data" / "digits") == f"run `{DIGITS} --force`"  # the default place
    assert image_hint(REPO_ROOT / "data" / "cifar10", force=False) == \
        "run `python data_scripts/prepare_hf_images.py --dataset cifar10`"
    moved = "python data_scripts/prepare_hf_images.py --dataset mnist --out /elsewhere/mnist"
    assert image_hint(tmp_path / "m", moved) == \
        f"run `python data_scripts/prepare_hf_images.py --dataset mnist --out {tmp_path / 'm'} --force`"


@pytest.mark.parametrize("exchange,point", [(True, "staged"), (False, "moved_aside")])
def test_kill_9_mid_write_keeps_the_old_folder(tmp_path, exchange, point):
    out = tmp_path / "d"
    write_image_folder(out, random_splits(seed=0), {}, "old")
    new = random_splits(seed=1)
    np.savez(tmp_path / "new.npz", **{f"{k}_{i}": a for k, xy in new.items() for i, a in enumerate(xy)})
    script = (f"import os, signal, sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
              "import numpy as np\n"
              "from accellib.data import atomic_folder as af\n"
              "from accellib.data.images import write_image_folder\n"
              + ("" if exchange else "af._exchange = lambda a, b: False\n")
              + f"af.crash_point = lambda p: os.kill(os.getpid(), signal.SIGKILL) if p == {point!r} else None\n"
              f"a = np.load({str(tmp_path / 'new.npz')!r})\n"
              f"write_image_folder({str(out)!r}, {{s: (a[s + '_0'], a[s + '_1']) for s in ('train', 'val')}}, {{}}, 'new')\n")
    rc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode
    assert rc == -9
    assert leftovers(tmp_path) != []  # the dead writer's staging folder or moved-aside old folder
    af.recover(out)  # what the next write does first
    assert leftovers(tmp_path) == []
    d = load_image_data(out)
    assert d.meta["created_by"] == "old" and np.array_equal(d.train_x, random_splits(seed=0)["train"][0])


def _png(a: np.ndarray) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _parquet(path: Path, images: np.ndarray, labels: np.ndarray, image_column="image", label_column="label"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # how HF stores an Image column
    cells = pa.array([{"bytes": _png(a), "path": None} for a in images], type=struct)
    pq.write_table(pa.table({image_column: cells, label_column: pa.array(labels, pa.int64())}), path)


@pytest.mark.parametrize("shape,columns", [((28, 28), ("image", "label")), ((32, 32, 3), ("img", "fine"))])
def test_prepare_hf_images_from_parquet(tmp_path, capsys, shape, columns):
    rng = np.random.default_rng(0)
    data = {s: (rng.integers(0, 256, (n, *shape), dtype=np.uint8), rng.integers(0, 10, n)) for s, n in
            (("train", 12), ("val", 5))}
    data["train"][1][0] = 9  # n_classes is the largest label + 1 when the column has no class names
    for s, (x, y) in data.items():
        _parquet(tmp_path / f"{s}.parquet", x, y, *columns)
    out = tmp_path / "out"
    argv = ["--parquet-train", str(tmp_path / "train.parquet"), "--parquet-val", str(tmp_path / "val.parquet"),
            "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    if columns != ("image", "label"):
        argv += ["--image-column", columns[0], "--label-column", columns[1]]
    assert prepare_hf_images.main(argv) == 0
    d = load_image_data(out)
    c = 1 if len(shape) == 2 else 3
    assert (d.channels, d.image_size, d.n_classes, d.meta["classes"][-1]) == (c, shape[0], 10, "9")
    for s, (x, y) in data.items():
        want = x[:, None] if c == 1 else x.transpose(0, 3, 1, 2)
        assert np.array_equal(getattr(d, f"{s}_x"), want) and getattr(d, f"{s}_y").tolist() == y.tolist()
    assert d.meta["source"]["files"]["train"]["path"] == str(tmp_path / "train.parquet")
    assert "--parquet-train" in d.meta["created_by"] and f"--out {out}" in d.meta["created_by"]
    capsys.readouterr()
    assert prepare_hf_images.main(argv) == 0 and "up to date" in capsys.readouterr().out


def test_image_data_is_a_dataclass_of_the_documented_fields():
    assert list(ImageData.__dataclass_fields__) == ["train_x", "train_y", "val_x", "val_y", "meta"]
