"""data_scripts/prepare_debian_docs.py on fake .deb files: stripping rules, determinism, split, carried form, refusals.

Offline and fast: the packages are tiny .deb files built here (an `ar` archive around a data.tar.xz), pinned by
monkeypatching the script's SOURCES table; no apt, no network.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # data_scripts/ is not installed with the package
    sys.path.insert(0, str(ROOT))

from data_scripts import prepare_debian_docs as pdd  # noqa: E402

# ----------------------------------------------------------------------------- the stripping rules, exactly

RST = """.. SPDX-License-Identifier: GPL-2.0
   a comment's second line

=====
Title
=====

.. note:: Keep this note.

.. code-block:: python
   :linenos:
   :caption: x

   print("hi")

.. _label:

Use :func:`~json.dumps` and :ref:`the guide <guide-label>`, ``x < y``,
`Python <https://example.org/>`_ and `target`_.

Example::

    code

::

    more code

Section
-------
Text after.
"""
RST_TEXT = """Title

Keep this note.

   print("hi")

Use json.dumps and the guide, x < y,
Python and target.

Example:

    code

    more code

Section
Text after.
"""

POD = """#!/usr/bin/perl
code before the first command

=pod

=encoding utf8

=head1 NAME
X<foo>

foo - does B<bold> and I<it>, C<< $a <=> $b >>, L<the docs|perlfunc/open>,
L<perlop>, E<lt>tagE<gt>, B<nested C<code>>.

=over 4

=item * First

=item 2. Second

=back

    verbatim B<stays> here

=begin html

<p>html only</p>

=end html

=for comment not this

=cut

sub code { }
"""
POD_TEXT = """NAME

foo - does bold and it, $a <=> $b, the docs,
perlop, <tag>, nested code.

First

Second

    verbatim B<stays> here
"""

HTML = """<html><head><title>T</title><style>p{}</style></head><body>
<div class="navheader"><a>Prev</a> <a>Next</a></div>
<h1>Heading<a class="headerlink" href="#">\u00b6</a></h1>
<p>Some   <b>bold</b>
text &amp; more.</p><script>var x = "<p>no</p>";</script>
<pre>
  code  line
</pre>
<ul><li>one</li><li>two</li></ul>
<table><tr><td>a</td> <td>b</td></tr></table>
<div id="sidebar"><div>side</div><p>x</p></div>
<p>End</p>
</body></html>
"""
HTML_TEXT = "Heading\n\nSome bold text & more.\n\n  code  line\n\none\ntwo\n\na b\n\nEnd\n"

GCIDE = """Affear \\Af*fear"\\, v. t.
   To frighten. [Obs.] --Spenser.
   [1913 Webster]

Word \\Word\\, n.
   [Obs.]
   A word.
      [WordNet 1.5 +PJC]
"""
GCIDE_TEXT = ('Affear \\Af*fear"\\, v. t.\n   To frighten. [Obs.] --Spenser.\n\n'
              'Word \\Word\\, n.\n   [Obs.]\n   A word.\n')

ADOC = """git-foo(1)
==========

NAME
----
git-foo - Do foo

[verse]
'git foo' [--bar]

include::options.txt[]

See linkgit:git-config[1] and use {litdd}all.
+
--
Text in block.
--
////
comment
////
// line comment
[core]
"""
ADOC_TEXT = ("git-foo(1)\n\nNAME\ngit-foo - Do foo\n\n'git foo' [--bar]\n\n"
             "See git-config(1) and use --all.\nText in block.\n[core]\n")


@pytest.mark.parametrize("strip,src,text", [
    (pdd.strip_rst, RST, RST_TEXT), (pdd.strip_pod, POD, POD_TEXT), (pdd.strip_html, HTML, HTML_TEXT),
    (pdd.strip_gcide, GCIDE, GCIDE_TEXT), (pdd.strip_asciidoc, ADOC, ADOC_TEXT)],
    ids=["rst", "pod", "html", "gcide", "asciidoc"])
def test_stripping_rules_give_exactly_this_text(strip, src, text):
    assert pdd.normalise(strip(src)) == text


def test_normalise_and_decoding():
    # BOM, CRLF, control characters, trailing spaces, > 2 blank lines, blank ends; tabs stay
    assert pdd.normalise("\ufeffa  \r\nb\x0c\x00\r\n\n\n\n\n\tc\n\n") == "a\nb\n\n\n\tc\n"
    assert pdd.normalise(" \n\n\t\n") == ""
    assert pdd.to_text("café".encode()) == "café"
    assert pdd.to_text(b"caf\xe9 \x92s") == "café \u2019s"  # not UTF-8: Windows-1252 (GCIDE has three such bytes)


def test_gcide_is_cut_at_blank_lines():
    text = "".join(f"entry {i}\n  def {i}\n\n" for i in range(10))
    pieces = pdd.split_paragraphs(text, 40)
    assert "".join(pieces) == text
    assert all(len(p) >= 40 and p.endswith("\n\n") for p in pieces[:-1])
    assert all(p.startswith("entry ") for p in pieces)


# ----------------------------------------------------------------------------- fake packages

def ar_member(name: str, data: bytes) -> bytes:
    head = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}".encode("ascii") + b"`\n"
    return head + data + (b"\n" if len(data) % 2 else b"")


def tar_bytes(members: dict[str, bytes], mode: str = "w:xz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.GNU_FORMAT) as tf:
        d = tarfile.TarInfo("./usr/share/doc")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        for name, data in members.items():
            ti = tarfile.TarInfo("./" + name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        link = tarfile.TarInfo("./usr/share/doc/fake/link.rst.gz")  # a symlink is not a document
        link.type, link.linkname = tarfile.SYMTYPE, "doc000.rst.gz"
        tf.addfile(link)
    return buf.getvalue()


def make_deb(path: Path, members: dict[str, bytes], data_name: str = "data.tar.xz") -> Path:
    data = tar_bytes(members, "w:gz" if data_name.endswith(".gz") else "w:xz") if data_name != "data.tar.zst" \
        else b"\x28\xb5\x2f\xfd not really zstd"
    path.write_bytes(b"!<arch>\n" + ar_member("debian-binary", b"2.0\n")
                     + ar_member("control.tar.xz", tar_bytes({})) + ar_member(data_name, data))
    return path


def gz(text: str) -> bytes:
    return gzip.compress(text.encode("utf-8"), mtime=0)


N_RST = 150
PACKAGES = {
    "fake-rst": ("1.0-1", r"usr/share/doc/fake/.+\.rst\.gz", "rst",
                 {**{f"usr/share/doc/fake/doc{i:03d}.rst.gz": gz(f"Doc {i}\n=====\n\nSee :ref:`part {i} <p{i}>`.\n")
                     for i in range(N_RST)},
                  "usr/share/doc/fake/skip.yaml.gz": gz("key: value\n"),
                  "usr/share/doc/fake/rules.rst.gz": gz(RST)}),
    "fake-pod": ("2:0.5", r"usr/share/fake/.+\.pod", "pod", {"usr/share/fake/a.pod": POD.encode()}),
    "fake-html": ("1.0", r"usr/share/doc/fake-html/.+\.html", "html",
                  {"usr/share/doc/fake-html/b.html": HTML.encode(), "usr/share/doc/fake-html/a.html":
                   b"<p>First page, caf\xc3\xa9.</p>", "usr/share/doc/fake-html/style.css": b"p {}"}),
    "fake-dict": ("0.1", r"usr/share/dictd/fake\.dict\.dz", "gcide",
                  {"usr/share/dictd/fake.dict.dz": gz("\n".join([GCIDE] * 12)),
                   "usr/share/dictd/fake.index": b"x\t0\t1\n"}),
}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Four fake packages as cached .deb files in <tmp>/raw/debian, pinned in SOURCES; no apt."""
    debs = tmp_path / "debs"
    debs.mkdir()
    sources = []
    for name, (version, members, fmt, files) in PACKAGES.items():
        deb = make_deb(debs / f"{name}.deb", files)
        sources.append(pdd.Source(name, version, hashlib.sha256(deb.read_bytes()).hexdigest(), members, fmt))
    monkeypatch.setattr(pdd, "SOURCES", sources)
    monkeypatch.setattr(pdd, "TEXT_SHA256", None)
    monkeypatch.setattr(pdd, "CARRIED_SHA256", None)
    monkeypatch.setattr(pdd, "GCIDE_DOC_CHARS", 200)
    monkeypatch.setattr(pdd, "APT_GET", str(tmp_path / "no-apt-get-here"))
    return tmp_path


def raw_with_debs(fake: Path, name: str) -> Path:
    raw = fake / name
    (raw / "debian").mkdir(parents=True)
    for s in pdd.SOURCES:
        shutil.copy(fake / "debs" / f"{s.package}.deb", raw / "debian" / s.deb_name)
    return raw


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = pdd.main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def carried_docs(path: Path) -> tuple[dict, list[dict]]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == ""
    return json.loads(lines[0]), [json.loads(ln) for ln in lines[1:-1]]


def val_by_rule(package: str, path: str) -> bool:  # the documented rule, written out again
    return int(hashlib.sha256(f"{package}/{path}".encode()).hexdigest(), 16) % 100 == 0


# ----------------------------------------------------------------------------- the pipeline

def test_the_deb_reader_takes_the_matching_regular_files_in_order(fake):
    deb = fake / "debs" / "fake-rst.deb"
    got = pdd.read_members(deb, r"usr/share/doc/fake/.+\.gz")
    names = [n for n, _ in got]
    assert names == sorted(names) and "usr/share/doc/fake/link.rst.gz" not in names  # the symlink is skipped
    assert "usr/share/doc/fake/skip.yaml.gz" in names and len(names) == N_RST + 2
    assert dict(got)["usr/share/doc/fake/doc007.rst.gz"] == b"Doc 7\n=====\n\nSee :ref:`part 7 <p7>`.\n"  # gunzipped
    gzdeb = make_deb(fake / "g.deb", {"usr/x.txt": b"hello"}, "data.tar.gz")
    assert pdd.read_members(gzdeb, r"usr/.+") == [("usr/x.txt", b"hello")]
    zst = make_deb(fake / "z.deb", {}, "data.tar.zst")
    with pytest.raises(pdd.CorpusError, match=r"holds data\.tar\.zst; this script reads only data\.tar\.xz"):
        pdd.read_members(zst, ".+")
    (fake / "not.deb").write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(pdd.CorpusError, match="is not a .deb"):
        pdd.read_members(fake / "not.deb", ".+")


def test_build_writes_the_documents_split_by_name(fake, capsys):
    raw = raw_with_debs(fake, "raw")
    (raw / f".{pdd.CARRIED_NAME}.tmp-999999999").write_bytes(b"a killed run's temp file")
    (raw / f".{pdd.CARRIED_NAME}.tmp-notes").write_bytes(b"not a name this script writes")
    rc, out, err = run(capsys, "--out", fake / "out", "--raw-dir", raw)
    assert rc == 0, err
    assert sorted(p.name for p in raw.iterdir()) == \
        sorted([f".{pdd.CARRIED_NAME}.tmp-notes", pdd.CARRIED_NAME, "debian"])  # only the dead run's temp file went
    assert "fake-rst=1.0-1: " in out and "train " in out
    meta = json.loads((fake / "out" / "meta.json").read_text())
    header, docs = carried_docs(raw / pdd.CARRIED_NAME)
    assert header["sources"] == [{"package": s.package, "version": s.version, "deb_sha256": s.sha256}
                                 for s in pdd.SOURCES]
    # documents: packages in SOURCES order, members in path order, dictionary pieces numbered, empty ones left out
    assert [d["package"] for d in docs] == sorted((d["package"] for d in docs), key=list(PACKAGES).index)
    rst_paths = [d["path"] for d in docs if d["package"] == "fake-rst"]
    assert rst_paths == sorted(rst_paths) and len(rst_paths) == N_RST + 1 and not any("yaml" in p for p in rst_paths)
    assert [d["path"] for d in docs if d["package"] == "fake-html"] == \
        ["usr/share/doc/fake-html/a.html", "usr/share/doc/fake-html/b.html"]
    dict_docs = [d for d in docs if d["package"] == "fake-dict"]
    assert [d["path"] for d in dict_docs] == [f"usr/share/dictd/fake.dict.dz#{k:04d}" for k in range(len(dict_docs))]
    assert len(dict_docs) > 3 and "\n".join(d["text"] for d in dict_docs) == "\n".join([GCIDE_TEXT] * 12)
    assert next(d["text"] for d in docs if d["path"].endswith("rules.rst.gz")) == RST_TEXT
    assert next(d["text"] for d in docs if d["path"].endswith("doc007.rst.gz")) == "Doc 7\n\nSee part 7.\n"
    assert next(d["text"] for d in docs if d["package"] == "fake-pod") == POD_TEXT
    assert next(d["text"] for d in docs if d["path"].endswith("a.html")) == "First page, café.\n"
    # the split: by the documented rule on "<package>/<path>", whole documents, joined by a blank line
    val = [d for d in docs if val_by_rule(d["package"], d["path"])]
    train = [d for d in docs if not val_by_rule(d["package"], d["path"])]
    assert val and train  # N_RST names make sure some document is drawn for validation
    b = lambda ds: "\n".join(d["text"] for d in ds).encode("utf-8")  # noqa: E731
    assert np.fromfile(fake / "out" / "train.bin", np.uint16).astype(np.uint8).tobytes() == b(train)
    assert np.fromfile(fake / "out" / "val.bin", np.uint16).astype(np.uint8).tobytes() == b(val)
    # meta.json
    assert meta["n_train"] == len(b(train)) and meta["n_val"] == len(b(val))
    assert meta["tokenizer"] == "byte" and meta["vocab_size"] == 257 and meta["mask_id"] == 256
    assert meta["text_sha256"] == hashlib.sha256(b(docs)).hexdigest() == header["text_sha256"]
    assert meta["split"] == pdd.SPLIT_RULE and "% 100" in meta["split"]
    assert meta["n_documents"] == len(docs) and meta["n_documents_val"] == len(val)
    assert meta["carried"]["sha256"] == hashlib.sha256((raw / pdd.CARRIED_NAME).read_bytes()).hexdigest()
    assert meta["created_by"].startswith("python data_scripts/prepare_debian_docs.py --out ")
    by_pkg = {s["package"]: s for s in meta["sources"]}
    for s in pdd.SOURCES:
        mine = [d for d in docs if d["package"] == s.package]
        assert by_pkg[s.package]["version"] == s.version and by_pkg[s.package]["deb_sha256"] == s.sha256
        assert by_pkg[s.package]["bytes"] == sum(len(d["text"].encode()) for d in mine)
        assert by_pkg[s.package]["documents"] == len(mine)
    for name in ("train.bin", "val.bin"):
        assert meta["sha256"][name] == hashlib.sha256((fake / "out" / name).read_bytes()).hexdigest()
    # a re-run is a no-op; --force rebuilds the same files
    before = (fake / "out" / "train.bin").stat().st_mtime_ns
    rc, out, _ = run(capsys, "--out", fake / "out", "--raw-dir", raw)
    assert rc == 0 and "up to date" in out and (fake / "out" / "train.bin").stat().st_mtime_ns == before
    first = files(fake / "out")
    rc, out, _ = run(capsys, "--out", fake / "out", "--raw-dir", raw, "--force")
    assert rc == 0 and "up to date" not in out and files(fake / "out") == first


def test_two_builds_from_the_debs_are_identical(fake, capsys):
    for name in ("a", "b"):
        assert run(capsys, "--out", fake / f"out_{name}", "--raw-dir", raw_with_debs(fake, f"raw_{name}"))[0] == 0
    ma, mb = (json.loads((fake / f"out_{n}" / "meta.json").read_text()) for n in "ab")
    assert ma["text_sha256"] == mb["text_sha256"] and ma["sha256"] == mb["sha256"]
    assert (fake / "raw_a" / pdd.CARRIED_NAME).read_bytes() == (fake / "raw_b" / pdd.CARRIED_NAME).read_bytes()


def test_the_carried_file_alone_rebuilds_the_same_dataset(fake, capsys, monkeypatch):
    raw = raw_with_debs(fake, "raw")
    assert run(capsys, "--out", fake / "out", "--raw-dir", raw)[0] == 0
    meta = json.loads((fake / "out" / "meta.json").read_text())
    # pin what was built, as the real script does, then carry only the .xz to a "machine" with no apt
    monkeypatch.setattr(pdd, "TEXT_SHA256", meta["text_sha256"])
    monkeypatch.setattr(pdd, "CARRIED_SHA256", meta["carried"]["sha256"])
    offline = fake / "offline"
    offline.mkdir()
    shutil.copy(raw / pdd.CARRIED_NAME, offline / pdd.CARRIED_NAME)
    rc, out, err = run(capsys, "--out", fake / "out2", "--raw-dir", offline, "--no-download")
    assert rc == 0, err
    assert not (offline / "debian").exists()  # nothing was fetched
    a, b = files(fake / "out"), files(fake / "out2")
    assert a.keys() == b.keys() == {"train.bin", "val.bin", "meta.json"}
    assert a["train.bin"] == b["train.bin"] and a["val.bin"] == b["val.bin"]
    ma, mb = json.loads(a["meta.json"]), json.loads(b["meta.json"])
    assert {k: v for k, v in ma.items() if k != "created_by"} == {k: v for k, v in mb.items() if k != "created_by"}
    # a copy compressed by another liblzma (other bytes, same text) is accepted with a note; other text is not
    with lzma.open(offline / pdd.CARRIED_NAME, "rb") as f:
        payload = f.read()
    (offline / pdd.CARRIED_NAME).write_bytes(lzma.compress(payload, preset=1))
    rc, out, err = run(capsys, "--out", fake / "out2", "--raw-dir", offline, "--force")
    assert rc == 0 and "its text verifies" in out and files(fake / "out2")["train.bin"] == a["train.bin"]
    (offline / pdd.CARRIED_NAME).write_bytes(lzma.compress(payload.replace(b"bold", b"BOLD")))
    rc, out, err = run(capsys, "--out", fake / "out2", "--raw-dir", offline, "--force")
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "holds text with sha256" in err


# ----------------------------------------------------------------------------- one-line refusals

def one_error_line(rc: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_deb_with_the_wrong_sha256_is_refused_and_kept(fake, capsys):
    raw = raw_with_debs(fake, "raw")
    bad = raw / "debian" / pdd.SOURCES[1].deb_name
    bad.write_bytes(bad.read_bytes() + b"tampered")
    kept = bad.read_bytes()
    line = one_error_line(*run(capsys, "--out", fake / "out", "--raw-dir", raw)[::2])
    assert "has sha256" in line and "fake-pod=2:0.5 is pinned" in line and "delete that file" in line
    assert bad.read_bytes() == kept and not (fake / "out").exists() and not (raw / pdd.CARRIED_NAME).exists()


def test_a_truncated_carried_file_is_refused_and_nothing_changes(fake, capsys):
    raw = raw_with_debs(fake, "raw")
    assert run(capsys, "--out", fake / "out", "--raw-dir", raw)[0] == 0
    before = files(fake / "out")
    xz = raw / pdd.CARRIED_NAME
    xz.write_bytes(xz.read_bytes()[: xz.stat().st_size // 2])
    cut = xz.read_bytes()
    line = one_error_line(*run(capsys, "--out", fake / "out", "--raw-dir", raw)[::2])
    assert "damaged or truncated" in line and "copy debian_docs.txt.xz again" in line
    assert xz.read_bytes() == cut and files(fake / "out") == before


def test_a_missing_package_version_says_what_apt_said(fake, capsys, monkeypatch):
    apt = fake / "apt-get"
    apt.write_text("#!/bin/sh\necho 'Reading package lists...'\n"
                   "echo \"E: Version '${2#*=}' for '${2%%=*}' was not found\"\nexit 100\n")
    apt.chmod(0o755)
    monkeypatch.setattr(pdd, "APT_GET", str(apt))
    raw = fake / "raw"
    line = one_error_line(*run(capsys, "--out", fake / "out", "--raw-dir", raw)[::2])
    assert "E: Version '1.0-1' for 'fake-rst' was not found" in line and "apt-get update" in line
    assert [p.name for p in (raw / "debian").iterdir()] == []  # its temp folder is gone


def test_apt_download_is_verified_before_it_is_kept(fake, capsys, monkeypatch):
    apt = fake / "apt-get"
    apt.write_text(f"#!/bin/sh\ncp {fake / 'debs'}/\"${{2%%=*}}\".deb \"./${{2%%=*}}_fetched_all.deb\"\n")
    apt.chmod(0o755)
    monkeypatch.setattr(pdd, "APT_GET", str(apt))
    rc, out, err = run(capsys, "--out", fake / "out", "--raw-dir", fake / "raw")
    assert rc == 0, err
    assert sorted(p.name for p in (fake / "raw" / "debian").iterdir()) == sorted(s.deb_name for s in pdd.SOURCES)
    assert "fake-pod_2%3a0.5_all.deb" in {s.deb_name for s in pdd.SOURCES}  # an epoch is written as apt writes it
    # apt handing back other bytes than the pin: refused, nothing kept
    shutil.rmtree(fake / "raw")
    (fake / "debs" / "fake-html.deb").write_bytes(b"!<arch>\nother")
    line = one_error_line(*run(capsys, "--out", fake / "out2", "--raw-dir", fake / "raw")[::2])
    assert "fake-html=1.0 from apt has sha256" in line
    assert not (fake / "raw" / "debian" / pdd.SOURCES[2].deb_name).exists()
    assert not any(p.name.startswith(".download-") for p in (fake / "raw" / "debian").iterdir())


def test_no_carried_file_and_no_apt_says_what_to_copy_where(fake, capsys, monkeypatch):
    line = one_error_line(*run(capsys, "--out", fake / "out", "--raw-dir", fake / "raw")[::2])
    assert f"copy {pdd.CARRIED_NAME} from a machine that built this corpus into" in line and "raw/" in line
    assert "there is no" in line and "sha256" in line  # or the .deb itself, named with its pin
    monkeypatch.setattr(pdd, "APT_GET", "sh")  # apt "exists", but --no-download keeps it from running
    line = one_error_line(*run(capsys, "--out", fake / "out", "--raw-dir", fake / "raw", "--no-download")[::2])
    assert "downloads are off (--no-download): copy debian_docs.txt.xz" in line
    assert not (fake / "raw").exists() and not (fake / "out").exists()


def test_a_folder_of_other_files_is_refused_before_any_work(fake, capsys):
    out = fake / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    line = one_error_line(*run(capsys, "--out", out, "--raw-dir", raw_with_debs(fake, "raw"))[::2])
    assert "notes.txt" in line
    assert (out / "notes.txt").read_text() == "my notes" and os.listdir(out) == ["notes.txt"]
    assert not (fake / "raw" / pdd.CARRIED_NAME).exists()
