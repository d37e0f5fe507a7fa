"""Prepare a second byte-level corpus: English documentation prose from pinned Debian 12 packages (>= 100M tokens).

    python data_scripts/prepare_debian_docs.py          # -> data/debian_docs

Why: the regime experiment needs enough fresh text that a small model trains far past its compute-optimum
without seeing any text twice (Shakespeare's 5 MB would be revisited dozens of times); documentation is
the English prose Debian ships in bulk, not a domain we care about.

Sources: the packages in SOURCES, each pinned by exact version and the sha256 of its .deb, fetched with
`apt-get download NAME=VERSION` into data/raw/debian/ and unpacked here in pure Python (a .deb is an `ar`
archive holding data.tar.xz; no dpkg needed). Members are read in sorted path order, packages in SOURCES
order, and their markup is stripped by the rules of `strip_rst`, `strip_asciidoc`, `strip_pod`, `strip_html`
and `strip_gcide`; `normalise` then makes every document plain UTF-8 text. The dictionary (one 40 MB file) is
cut into ~64 KB documents at paragraph boundaries, named <path>#<index>.

Split, by document: a document is validation when int(sha256(b"<package>/<path>").hexdigest(), 16) % 100 == 0
(about 1% of the documents, from every source). train.bin is the train documents joined by a blank line,
val.bin the same for validation (uint16 byte ids, the format of tokenize_corpus.py).

Carried form: every build also writes data/raw/debian_docs.txt.xz (23.5 MB), the stripped documents with
their names as xz-compressed JSON lines. When that file is present (copied to a machine without apt, e.g. a
GPU box) the dataset is built from it alone: no apt, no download. It must match the pins (CARRIED_SHA256,
or, if another liblzma compressed it, its content's TEXT_SHA256).

Re-running is a no-op while the output and the carried file verify (use --force to rebuild).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from io import BytesIO
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `data_scripts` importable
    sys.path.insert(0, str(ROOT))
from accellib.data.atomic_folder import _alive as alive  # noqa: E402
from data_scripts.tokenize_corpus import (  # noqa: E402
    BYTE_VOCAB, describe, is_up_to_date, prepare_target, read_meta, sha256_file, show_path, write_token_streams)


@dataclass(frozen=True)
class Source:
    """One pinned package: which members of its .deb are read, and by which stripping rules."""
    package: str
    version: str
    sha256: str   # of the .deb file
    members: str  # regex, matched in full against a member's path (no leading "./")
    fmt: str      # "rst", "asciidoc", "pod", "html" or "gcide" (a ".gz" member is gunzipped first)

    @property
    def deb_name(self) -> str:  # the name `apt-get download` gives the file (an epoch's ':' is written %3a)
        return f"{self.package}_{self.version.replace(':', '%3a')}_all.deb"


# Debian 12 "bookworm" (some from its security and point-release updates, whose superseded versions leave the
# archive in time: then the carried file is the way to rebuild), in the corpus's order. The first five are the
# corpus's core; git-doc, python-django-doc, sqlite3-doc and cmake-doc take it past 100M training tokens.
SOURCES: list[Source] = [
    Source("linux-doc-6.1", "6.1.192-3",
           "f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f",
           r"usr/share/doc/linux-doc-6.1/Documentation/(?!translations/)(?:.+\.(?:rst|txt)|ABI/[^.]+)\.gz", "rst"),
    Source("python3.11-doc", "3.11.2-6+deb12u9",
           "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
           r"usr/share/doc/python3\.11/html/_sources/.+\.txt", "rst"),
    Source("perl-doc", "5.36.0-7+deb12u4",
           "f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8",
           r"usr/share/perl/5\.36\.0/pod/(?!perl(?:cn|jp|ko|tw)\.pod$).+\.pod|usr/share/doc/perl/.+\.pod\.gz", "pod"),
    Source("dict-gcide", "0.48.5+nmu2",
           "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
           r"usr/share/dictd/gcide\.dict\.dz", "gcide"),
    Source("postgresql-doc-15", "15.20-0+deb12u1",
           "4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7",
           r"usr/share/doc/postgresql-doc-15/html/.+\.html", "html"),
    Source("python-django-doc", "3:3.2.25-0+deb12u7",
           "87307f067916df72e17180d35b7cde5c7ea6080336cda518efd7f6e66988a7ca",
           r"usr/share/doc/python-django-doc/html/(?:faq|howto|internals|intro|misc|ref|releases|topics)/.+\.html",
           "html"),
    Source("git-doc", "1:2.39.5-0+deb12u3",
           "3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec",
           r"usr/share/doc/git-doc/.+\.txt", "asciidoc"),
    Source("sqlite3-doc", "3.40.1-2+deb12u2",
           "466e30d7066e2641fa13e56bc662a2ad521b8cc9c17dde9c9dac3d4f105e32f2",
           r"usr/share/doc/sqlite3/(?!syntax/).+\.html", "html"),
    Source("cmake-doc", "3.25.1-1",
           "6e805a758ffed87cc7ea234cf0a7a1bb8ae78b93d8b5783e7fb989a6320f8133",
           r"usr/share/doc/cmake-data/html/_sources/.+\.txt", "rst"),
]
# The stripped corpus ("\n".join of every document, in order: 102,156,827 bytes) and the carried file (23,502,152
# bytes, xz preset 6 with Python 3.11's liblzma), as this script built them from the packages above.
TEXT_SHA256: str | None = "4076647231f801ba14fca5eb41dab5733ad2242b26e721024900185795173691"
CARRIED_SHA256: str | None = "bd4a80d6933e86c2c7dc80e199d3383e586454ed482b69aa473f9d4f7ce54b26"

CARRIED_NAME = "debian_docs.txt.xz"
CARRIED_FORMAT = "accellib-debian-docs-1"
APT_GET = "apt-get"
SPLIT_RULE = ("document-level: validation when int(sha256(b'<package>/<path>').hexdigest(), 16) % 100 == 0; "
              "gcide cut into ~64 KB documents at blank lines, path '<member>#<index>'")
GCIDE_DOC_CHARS = 1 << 16


class CorpusError(Exception):
    """Something the user must fix; its message is the one `error:` line."""


@dataclass
class Doc:
    package: str
    path: str
    text: str  # normalised: UTF-8-clean, ends with exactly one "\n"


# ----------------------------------------------------------------------------- .deb files

def deb_data_tar(deb: Path) -> tarfile.TarFile:
    """The data.tar.{xz,gz} of a .deb, parsed by hand: "!<arch>\\n", then members, each a 60-byte header
    (name 16, mtime 12, uid 6, gid 6, mode 8, size 10, "`\\n") and its data padded to an even length."""
    blob = deb.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise CorpusError(f"{deb} is not a .deb (no ar header): delete it and rerun")
    pos = 8
    while pos + 60 <= len(blob):
        head = blob[pos:pos + 60]
        if head[58:60] != b"`\n":
            break
        name = head[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(head[48:58].decode("ascii").strip())
        except ValueError:
            break
        pos += 60
        if name.startswith("data.tar"):
            data = blob[pos:pos + size]
            if len(data) != size:
                raise CorpusError(f"{deb} is truncated ({name} ends early): delete it and rerun")
            mode = {"data.tar.xz": "r|xz", "data.tar.gz": "r|gz", "data.tar": "r|"}.get(name)
            if mode is None:
                raise CorpusError(f"{deb} holds {name}; this script reads only data.tar.xz or data.tar.gz "
                                  f"(pin a package version built with xz)")
            return tarfile.open(fileobj=BytesIO(data), mode=mode)
        pos += size + (size & 1)
    raise CorpusError(f"{deb} holds no data.tar member: delete it and rerun")


def read_members(deb: Path, pattern: str) -> list[tuple[str, bytes]]:
    """(path, bytes) of the regular files of the .deb whose path matches `pattern` in full, sorted by
    path; a ".gz" or ".dz" (dictzip, gzip-readable) member is decompressed."""
    rx = re.compile(pattern)
    found = {}
    try:
        with deb_data_tar(deb) as tf:
            for ti in tf:
                path = ti.name.removeprefix("./")
                if ti.isfile() and rx.fullmatch(path):
                    data = tf.extractfile(ti).read()
                    if path.endswith((".gz", ".dz")):
                        data = zlib.decompress(data, 16 + zlib.MAX_WBITS)
                    found[path] = data
    except (tarfile.TarError, lzma.LZMAError, EOFError, zlib.error, OSError) as e:
        raise CorpusError(f"{deb} is damaged ({type(e).__name__}: {e}): delete it and rerun") from None
    return sorted(found.items())


def fetch_deb(src: Source, deb_dir: Path, download: bool = True) -> Path:
    """The verified .deb of `src` in deb_dir, fetched with `apt-get download` when it is missing."""
    path = deb_dir / src.deb_name
    if path.is_file():
        if (digest := sha256_file(path)) != src.sha256:
            raise CorpusError(f"{show_path(path)} has sha256 {digest}, but {src.package}={src.version} is pinned "
                              f"to {src.sha256}: delete that file to download it again")
        return path
    if not download:
        raise CorpusError(f"{show_path(path)} is missing and downloads are off (--no-download): copy {CARRIED_NAME} "
                          f"from a machine that built this corpus into {show_path(deb_dir.parent)}/")
    if shutil.which(APT_GET) is None:
        raise CorpusError(f"{show_path(path)} is missing and there is no {APT_GET} to download it: copy "
                          f"{CARRIED_NAME} from a machine that built this corpus into {show_path(deb_dir.parent)}/ "
                          f"(or {src.deb_name}, sha256 {src.sha256}, into {show_path(deb_dir)}/)")
    deb_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=deb_dir))  # same folder: the final move is atomic
    try:
        cmd = [APT_GET, "download", f"{src.package}={src.version}"]
        print(f"downloading {src.package}={src.version} with {APT_GET} into {show_path(deb_dir)} ...", flush=True)
        res = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = sorted(tmp.glob("*.deb"))
        if res.returncode != 0 or len(got) != 1:
            why = next((ln.strip() for ln in res.stdout.splitlines() if ln.startswith("E:")), "") or \
                (res.stdout.strip().splitlines() or ["no output"])[-1]
            raise CorpusError(f"`{shlex.join(cmd)}` failed (exit {res.returncode}: {why}): the pinned version may "
                              f"have left the archive or apt's lists are stale (run apt-get update); or copy "
                              f"{CARRIED_NAME} from a machine that built this corpus into {show_path(deb_dir.parent)}/")
        if (digest := sha256_file(got[0])) != src.sha256:
            raise CorpusError(f"{src.package}={src.version} from apt has sha256 {digest}, expected {src.sha256}; "
                              f"refusing to use it")
        got[0].replace(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


# ----------------------------------------------------------------------------- text rules

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def to_text(data: bytes) -> str:
    """UTF-8 when the bytes are valid UTF-8, else Windows-1252 (undefined bytes become U+FFFD)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("cp1252", "replace")


def normalise(text: str) -> str:
    """The rules every document gets last: no BOM, "\\n" line ends, no control characters but tab and
    newline, no trailing spaces, at most two blank lines in a row, none at either end; ends in "\\n"
    ("" for a document with no text left)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    text = _CONTROL.sub("", text)
    text = "\n".join(ln.rstrip() for ln in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text).strip("\n")
    return text + "\n" if text.strip() else ""


# reST (the kernel's and Python's documentation sources)
_RST_EXPLICIT = re.compile(r"^(\s*)\.\.(?:\s+(.*))?$")            # ".. anything": directive, comment, target
_RST_DIRECTIVE = re.compile(r"([\w:+-]+)::(?:\s+(.*))?$")          # "name:: argument"
_RST_OPTION = re.compile(r"^\s+:[^:`]+:(?:\s|$)")                 # "   :option: value"
_RST_UNDERLINE = re.compile(r"^\s*([!-/:-@\[-`{-~])\1{2,}\s*$")  # "=====", "-----", "~~~~": headings, transitions
_RST_LITERAL = re.compile(r"``(.+?)``")
_RST_ROLE = re.compile(r":(?:[A-Za-z0-9_.+-]+:)+`([^`]+)`")
_RST_LINK = re.compile(r"`([^`]+?)`__?(?![\w`])")
_TITLE_TARGET = re.compile(r"^(.*?)\s*<[^<>]+>$", re.S)
RST_KEEP_ARGUMENT = {"note", "warning", "tip", "important", "hint", "caution", "attention", "danger", "error",
                     "seealso", "admonition", "versionadded", "versionchanged", "deprecated", "rubric", "topic"}


def _rst_inline(line: str) -> str:
    def title(s: str) -> str:  # "title <target>" -> "title"; Python's "~mod.func" / "!name" -> "mod.func"
        m = _TITLE_TARGET.match(s)
        return (m.group(1) if m and m.group(1) else s).lstrip("~!")

    line = _RST_LITERAL.sub(lambda m: m.group(1), line)
    line = _RST_ROLE.sub(lambda m: title(m.group(1)), line)
    return _RST_LINK.sub(lambda m: title(m.group(1)), line)


def _skip_blank_after_drop(out: list[str], lines: list[str], i: int) -> int:
    """After a dropped block that stood between blank lines, skip the blank lines after it too (else the
    text would get two blank lines where the source had one); returns the next line to read."""
    if not out or not out[-1].strip():
        while i < len(lines) and not lines[i].strip():
            i += 1
    return i


def strip_rst(text: str) -> str:
    """reST to text, line by line:
      - an explicit-markup line ("..", ".. name:: arg", ".. _target:", ".. [#note]", ".. |sub|") is dropped,
        with the ":option: value" lines right after it; an admonition's argument (".. note:: Text") is kept;
        a comment (".." followed by no directive) also drops its indented continuation lines; a dropped block
        between blank lines takes the blank lines after it along;
      - lines of one punctuation character repeated (heading under/overlines, transitions) are dropped;
      - a paragraph's closing "::" becomes ":" (a line of only "::" is dropped);
      - ``literal`` -> literal, :role:`text` and :role:`title <target>` -> text / title,
        `title <url>`_ and `name`_ -> title / name.
    Everything else (directive bodies, code blocks, tables) is kept as it is."""
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _RST_EXPLICIT.match(line)
        if m:
            indent, rest = m.group(1), (m.group(2) or "")
            d = _RST_DIRECTIVE.match(rest)
            if d and d.group(1).lower() in RST_KEEP_ARGUMENT and d.group(2):
                out.append(indent + _rst_inline(d.group(2)))
            i += 1
            while i < len(lines) and _RST_OPTION.match(lines[i]) and \
                    len(lines[i]) - len(lines[i].lstrip()) > len(indent):
                i += 1
            is_comment = not d and not rest.startswith(("_", "[", "|"))
            if is_comment:  # its indented continuation lines are the comment's text
                while i < len(lines) and lines[i].strip() and \
                        len(lines[i]) - len(lines[i].lstrip()) > len(indent):
                    i += 1
            i = _skip_blank_after_drop(out, lines, i)
            continue
        i += 1
        if _RST_UNDERLINE.match(line):
            continue
        if line.strip() == "::":
            i = _skip_blank_after_drop(out, lines, i)
            continue
        if line.endswith("::"):
            line = line[:-1]
        out.append(_rst_inline(line))
    return "\n".join(out)


# AsciiDoc (Git's documentation sources)
_ADOC_DROP = re.compile(r"^(?:\[\[[^\]]*\]\]"                                          # [[anchor]]
                        r"|\[(?:[A-Z]+|verse|literal|listing|horizontal"                   # [NOTE], [verse]
                        r"|(?:source|quote|caption|options|cols)\b[^\]]*)\]"                # [caption="..."]
                        r"|(?:include|ifdef|ifndef|endif|ifeval)::.*\[.*\]|\+|--|//.*)\s*$")
_ADOC_COMMENT_BLOCK = re.compile(r"^/{4,}\s*$")
_ADOC_ATTRIBUTES = {"litdd": "--", "caret": "^", "tilde": "~", "asterisk": "*", "startsb": "[", "endsb": "]",
                    "plus": "+", "hash": "#", "empty": "", "apostrophe": "'", "backtick": "`", "vbar": "|"}


def strip_asciidoc(text: str) -> str:
    """AsciiDoc to text, line by line:
      - dropped: block attribute lines ("[verse]", "[NOTE]", "[caption=...]", "[[anchor]]"), preprocessor lines
        ("include::x[]", "ifdef::x[]", "endif::x[]"), list continuations ("+"), open-block delimiters ("--"),
        comment lines ("// ...") and comment blocks (between "////" lines), and lines of one punctuation
        character repeated (title underlines, block delimiters such as "----"); a dropped line between
        blank lines takes the blank lines after it along;
      - linkgit:git-foo[1] -> git-foo(1); the character attributes {litdd} {caret} {tilde} {asterisk} {startsb}
        {endsb} {plus} {hash} {empty} -> the character they stand for.
    Everything else ("term::" lists, code blocks, 'emphasis') is kept as it is."""
    out: list[str] = []
    in_comment = False
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if _ADOC_COMMENT_BLOCK.match(line):
            in_comment = not in_comment
            if not in_comment:
                i = _skip_blank_after_drop(out, lines, i)
            continue
        if in_comment or _ADOC_DROP.match(line) or _RST_UNDERLINE.match(line):
            if not in_comment:
                i = _skip_blank_after_drop(out, lines, i)
            continue
        line = re.sub(r"linkgit:([\w.-]+)\[(\w+)\]", r"\1(\2)", line)
        out.append(re.sub(r"\{(\w+)\}", lambda m: _ADOC_ATTRIBUTES.get(m.group(1), m.group(0)), line))
    return "\n".join(out)


# POD (Perl's documentation)
_POD_COMMAND = re.compile(r"^=([a-zA-Z]\w*)[ \t]*(.*)$", re.S)
_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}
_POD_SIMPLE = re.compile(r"([A-Z])<([^<>]*)>")


def _pod_code(letter: str, inner: str) -> str:
    if letter in "XZ":  # an index entry / a zero-width mark: no text
        return ""
    if letter == "E":
        if inner.isdigit() or inner.lower().startswith("0x"):
            try:
                return chr(int(inner, 0) if not inner.isdigit() else int(inner))
            except (ValueError, OverflowError):
                return ""
        return _POD_ENTITIES.get(inner, inner)
    if letter == "L":
        return inner.split("|", 1)[0] if "|" in inner else inner
    return inner  # B, I, C, F, S and unknown letters: the text itself


def pod_inline(text: str) -> str:
    """Formatting codes to their text: X<< a >> / X<<< a >>> (spaces inside) and X<a>, innermost first."""
    for n in (4, 3, 2):
        text = re.sub(rf"([A-Z]){'<' * n}\s+(.*?)\s+{'>' * n}", lambda m: _pod_code(m.group(1), m.group(2)),
                      text, flags=re.S)
    while True:
        new = _POD_SIMPLE.sub(lambda m: _pod_code(m.group(1), m.group(2)), text)
        if new == text:
            return text
        text = new


def strip_pod(text: str) -> str:
    """POD to text, paragraph by paragraph (paragraphs are separated by blank lines):
      - a command paragraph ("=name ...") is dropped, except "=head1".."=head4" and "=item", whose text is
        kept ("=item *" and "=item 1." keep only what follows the bullet);
      - between "=begin X" and "=end X", and in a "=for X" paragraph, nothing is kept (output for other
        formatters);
      - in an ordinary paragraph, formatting codes become their text: B<>, I<>, C<>, F<>, S<> -> inner,
        L<text|target> -> text, L<name> -> name, E<lt> / E<gt> / E<NNN> -> the character, X<> and Z<> -> "";
      - a verbatim paragraph (first line indented) is kept as it is.
    Text outside POD (code before the first command) is kept only between "=pod"/"=head" and "=cut"."""
    out: list[str] = []
    in_pod, skip_to = False, None
    for para in re.split(r"\n[ \t]*\n", text):
        if not para.strip():
            continue
        m = _POD_COMMAND.match(para)
        if m:
            cmd, arg = m.group(1), m.group(2).strip()
            in_pod = cmd != "cut"
            if skip_to is not None:
                if cmd == "end" and arg.split()[:1] == [skip_to]:
                    skip_to = None
                continue
            if cmd == "begin":
                skip_to = (arg.split() or [""])[0]
                continue
            if not (re.fullmatch(r"head[1-6]", cmd) or cmd == "item"):
                continue
            para = re.sub(r"^(?:\*|\d+\.?)(?:\s+|$)", "", arg) if cmd == "item" else arg
        elif not in_pod or skip_to is not None:
            continue
        text = para.rstrip() if para[:1] in " \t" else pod_inline(para).strip()
        if text.strip():  # a paragraph of only X<> index entries leaves nothing
            out.append(text)
    return "\n\n".join(out)


# HTML (PostgreSQL's DocBook output, Django's Sphinx output)
_HTML_SKIP_TAGS = {"script", "style", "head", "template", "noscript"}
_HTML_SKIP_CLASSES = {"navheader", "navfooter", "headerlink",  # page navigation, the "¶" after headings
                      "nosearch"}                               # SQLite's page header and table of contents
_HTML_SKIP_IDS = {"hd", "sidebar", "ft"}                        # Sphinx/YUI page header, sidebar, footer
_HTML_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_HTML_PARA = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "ul", "ol", "dl", "blockquote",
              "title", "figure", "section", "article"}
_HTML_LINE = {"div", "li", "dt", "dd", "tr", "br", "hr", "caption", "figcaption", "header", "footer", "nav"}
_HTML_CELL = {"td", "th"}


_LINE, _PARA = "\x00", "\x01"  # break marks while parsing; a run of marks and white space becomes "\n" or "\n\n"
_BREAKS = re.compile(r"[ \t\n]*[\x00\x01][\x00\x01\n]*")


class _HTMLText(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip_tag, self.skip_depth, self.pre = None, 0, 0
        self.line_start, self.pre_start = True, False

    def _break(self, tag: str) -> None:
        if tag in _HTML_PARA or tag in _HTML_LINE:
            self.parts.append(_PARA if tag in _HTML_PARA else _LINE)
            self.line_start = True

    def handle_starttag(self, tag, attrs):
        if self.skip_tag is not None:
            self.skip_depth += tag == self.skip_tag
            return
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        if tag not in _HTML_VOID and (tag in _HTML_SKIP_TAGS or classes & _HTML_SKIP_CLASSES
                                      or a.get("id") in _HTML_SKIP_IDS):
            self.skip_tag, self.skip_depth = tag, 1
            return
        if tag == "pre":
            self.pre += 1
            self.pre_start = True
        self._break(tag)
        if tag in _HTML_CELL and not self.line_start and not self.parts[-1][-1:].isspace():
            self.parts.append(" ")

    def handle_endtag(self, tag):
        if self.skip_tag is not None:
            if tag == self.skip_tag:
                self.skip_depth -= 1
                if self.skip_depth == 0:
                    self.skip_tag = None
            return
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        self._break(tag)

    def handle_data(self, data):
        if self.skip_tag is not None:
            return
        data = data.replace(_LINE, "").replace(_PARA, "")
        if self.pre and self.pre_start:  # HTML ignores a newline right after <pre>
            data = data.removeprefix("\n")
        self.pre_start = False
        if not self.pre:
            data = re.sub(r"\s+", " ", data)
            if self.line_start or (self.parts and self.parts[-1][-1:] == " "):
                data = data.lstrip(" ")
        if data:
            self.parts.append(data)
            self.line_start = data.endswith("\n")


def strip_html(text: str) -> str:
    """HTML to text with the standard library's html.parser: only character data is kept (entities
    decoded); nothing inside <head>, <script>, <style>, <template>, <noscript>, or an element of class
    navheader / navfooter / headerlink / nosearch or id hd / sidebar / ft (page navigation and chrome);
    outside <pre>, runs of white space become one space and lines start with no space; block elements
    (p, h1-h6, pre, table, lists, blockquote) start and end a paragraph (one blank line, however many
    meet), div / li / dt / dd / tr / br a line; table cells are separated by a space."""
    p = _HTMLText()
    p.feed(text)
    p.close()
    return _BREAKS.sub(lambda m: "\n\n" if _PARA in m.group(0) else "\n", "".join(p.parts))


# The GCIDE dictionary (dictd's plain-text database)
_GCIDE_SOURCE = (r"(?:1913 Webster|Webster 1913 Suppl\.|WordNet 1\.[56]|WordNet sense \d+|PJC\.?|AS|RDH|RP|GG"
                 r"|Century Dict\.,? 1906\.?)")
_GCIDE_TAG = re.compile(rf"^[ \t]*\[{_GCIDE_SOURCE}(?:[ \t]*\+?[ \t]*{_GCIDE_SOURCE})*\][ \t]*\n", re.M)


def strip_gcide(text: str) -> str:
    """The dictionary stays the plain text it is; only the lines that hold nothing but a source tag
    ("[1913 Webster]", "[WordNet 1.5 +PJC]", "[Webster 1913 Suppl.]", ...) are dropped. Usage labels on a line
    of their own ("[Obs.]", "[Colloq.]") are text and stay. (dictd's index file is not read at all.)"""
    return _GCIDE_TAG.sub("", text)


STRIP = {"rst": strip_rst, "asciidoc": strip_asciidoc, "pod": strip_pod, "html": strip_html, "gcide": strip_gcide}


def split_paragraphs(text: str, size: int) -> list[str]:
    """Cut `text` at blank lines into pieces of at least `size` characters (the last may be shorter)."""
    pieces, start = [], 0
    while start < len(text):
        cut = text.find("\n\n", start + size)
        end = len(text) if cut < 0 else cut + 2
        pieces.append(text[start:end])
        start = end
    return pieces


def documents(src: Source, members: Iterable[tuple[str, bytes]]) -> Iterator[Doc]:
    """The documents of one package's members, in member order; empty ones are left out."""
    strip = STRIP[src.fmt]
    for path, data in members:
        text = strip(to_text(data))
        if src.fmt == "gcide":
            for k, piece in enumerate(split_paragraphs(text, GCIDE_DOC_CHARS)):
                if t := normalise(piece):
                    yield Doc(src.package, f"{path}#{k:04d}", t)
        elif t := normalise(text):
            yield Doc(src.package, path, t)


def build_documents(sources: list[Source], debs: list[Path]) -> list[Doc]:
    """Every document of every package, packages in `sources` order."""
    return [d for src, deb in zip(sources, debs) for d in documents(src, read_members(deb, src.members))]


# ----------------------------------------------------------------------------- split, carried form, tokens

def is_val(doc: Doc) -> bool:
    key = f"{doc.package}/{doc.path}".encode("utf-8")
    return int(hashlib.sha256(key).hexdigest(), 16) % 100 == 0


def text_sha256(docs: list[Doc]) -> str:
    """sha256 of the whole stripped corpus: every document, in order, joined by "\\n" (a blank line)."""
    h = hashlib.sha256()
    for k, d in enumerate(docs):
        h.update((("\n" if k else "") + d.text).encode("utf-8"))
    return h.hexdigest()


def pins(sources: list[Source]) -> list[dict]:
    return [{"package": s.package, "version": s.version, "deb_sha256": s.sha256} for s in sources]


def write_carried(path: Path, docs: list[Doc], sources: list[Source]) -> str:
    """The documents as xz-compressed JSON lines (a header line, then one {"package", "path", "text"} per
    document), written to a temp file and renamed; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f".{path.name}.tmp-*"):  # what a killed earlier run of this script left
        if (pid := old.name.rsplit("-", 1)[1]).isdigit() and not alive(int(pid)):
            old.unlink(missing_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    comp = lzma.LZMACompressor(format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6)
    try:
        with open(tmp, "wb") as f:
            header = {"format": CARRIED_FORMAT, "sources": pins(sources), "text_sha256": text_sha256(docs)}
            f.write(comp.compress((json.dumps(header, sort_keys=True) + "\n").encode("utf-8")))
            for d in docs:
                line = json.dumps({"package": d.package, "path": d.path, "text": d.text}, ensure_ascii=False)
                f.write(comp.compress((line + "\n").encode("utf-8")))
            f.write(comp.flush())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return sha256_file(path)


def read_carried(path: Path, sources: list[Source]) -> list[Doc]:
    """The documents of a carried file, checked: the pinned CARRIED_SHA256, or (another compressor's bytes)
    a header naming exactly the pinned packages and a text matching the header and TEXT_SHA256."""
    digest = sha256_file(path)
    fix = (f"copy {CARRIED_NAME} again from a machine where it verifies, or delete it to rebuild from the "
           f"Debian packages")
    try:
        with lzma.open(path, "rt", encoding="utf-8", newline="\n") as f:
            header = json.loads(f.readline())
            docs = [Doc(**json.loads(line)) for line in f]
    except (lzma.LZMAError, EOFError, OSError, ValueError, TypeError) as e:
        raise CorpusError(f"{show_path(path)} is damaged or truncated ({type(e).__name__}: {e}): {fix}") from None
    if not isinstance(header, dict) or header.get("format") != CARRIED_FORMAT:
        raise CorpusError(f"{show_path(path)} is not a {CARRIED_FORMAT} file: {fix}")
    if header.get("sources") != pins(sources):
        raise CorpusError(f"{show_path(path)} holds a corpus of other packages or versions than this script "
                          f"pins: {fix}")
    got = text_sha256(docs)
    if got != header.get("text_sha256") or (TEXT_SHA256 and got != TEXT_SHA256):
        raise CorpusError(f"{show_path(path)} holds text with sha256 {got}, expected "
                          f"{TEXT_SHA256 or header.get('text_sha256')}: {fix}")
    if CARRIED_SHA256 and digest != CARRIED_SHA256:  # the same text compressed by another liblzma: fine
        print(f"note: {show_path(path)} has sha256 {digest}, not the pinned {CARRIED_SHA256}, but its text verifies",
              flush=True)
    return docs


def source_stats(docs: list[Doc], sources: list[Source]) -> list[dict]:
    out = []
    for s in sources:
        mine = [d for d in docs if d.package == s.package]
        out.append({"package": s.package, "version": s.version, "deb_sha256": s.sha256, "format": s.fmt,
                    "members": s.members, "bytes": sum(len(d.text.encode("utf-8")) for d in mine),
                    "documents": len(mine), "documents_val": sum(map(is_val, mine))})
    return out


def _ids(texts: Iterable[str]) -> Iterator[np.ndarray]:
    for k, t in enumerate(texts):
        b = (("\n" if k else "") + t).encode("utf-8")
        yield np.frombuffer(b, dtype=np.uint8).astype(np.uint16)


def write_dataset(out: Path, docs: list[Doc], sources: list[Source], carried: Path, carried_sha: str,
                  created_by: str) -> Path:
    """train.bin / val.bin (byte ids, documents joined by a blank line) and meta.json, swapped in atomically."""
    train = [d.text for d in docs if not is_val(d)]
    val = [d.text for d in docs if is_val(d)]
    meta = {"source": {"name": f"Debian 12 documentation packages (see sources), via {CARRIED_NAME}",
                       "sha256": carried_sha},
            "tokenizer": "byte", "requested_vocab_size": None, "vocab_size": BYTE_VOCAB + 1, "mask_id": BYTE_VOCAB,
            "bytes_per_token": 1.0, "sources": source_stats(docs, sources), "split": SPLIT_RULE,
            "n_documents": len(docs), "n_documents_val": len(val), "text_sha256": text_sha256(docs),
            "carried": {"name": CARRIED_NAME, "sha256": carried_sha, "bytes": carried.stat().st_size},
            "created_by": created_by}
    return write_token_streams(out, _ids(train), _ids(val), meta)


# ----------------------------------------------------------------------------- command line

def expected_meta(sources: list[Source]) -> dict:
    """What meta.json must say for the folder to count as this corpus (is_up_to_date's `expect`)."""
    expect = {"tokenizer": "byte", "split": SPLIT_RULE}
    if TEXT_SHA256:
        expect["text_sha256"] = TEXT_SHA256
    return expect


def _pins_match(meta: dict | None, sources: list[Source]) -> bool:
    try:
        return [{k: s[k] for k in ("package", "version", "deb_sha256")} for s in meta["sources"]] == pins(sources)
    except (TypeError, KeyError):
        return False


def build(out: Path, raw_dir: Path, force: bool = False, download: bool = True,
          created_by: str = "python data_scripts/prepare_debian_docs.py") -> tuple[Path, bool]:
    """Build `out` from the carried file in raw_dir, or else from the pinned .debs (then writing the carried
    file). Returns (out, written); written is False when `out` and the carried file already verify."""
    sources = list(SOURCES)
    carried = raw_dir / CARRIED_NAME
    if err := prepare_target(out):  # before any download: tidy up, never replace a folder of other files
        raise CorpusError(err.removeprefix("error: "))
    meta = read_meta(out)
    if (not force and is_up_to_date(out, expected_meta(sources)) and _pins_match(meta, sources)
            and carried.is_file() and sha256_file(carried) == (meta.get("carried") or {}).get("sha256")):
        return out, False
    if carried.is_file():
        docs = read_carried(carried, sources)
        carried_sha = sha256_file(carried)
    else:
        debs = [fetch_deb(s, raw_dir / "debian", download) for s in sources]
        docs = build_documents(sources, debs)
        if TEXT_SHA256 and (got := text_sha256(docs)) != TEXT_SHA256:
            raise CorpusError(f"the text stripped from the pinned packages has sha256 {got}, not the pinned "
                              f"{TEXT_SHA256} (this Python's parsers differ from the one that pinned it?): copy "
                              f"{CARRIED_NAME} from a machine where it verifies into {show_path(raw_dir)}/")
        carried_sha = write_carried(carried, docs, sources)
    return write_dataset(out, docs, sources, carried, carried_sha, created_by), True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "data" / "debian_docs")
    p.add_argument("--raw-dir", type=Path, default=ROOT / "data" / "raw",
                   help=f"holds {CARRIED_NAME} and debian/, the cached .deb files")
    p.add_argument("--no-download", action="store_true",
                   help="never run apt-get (use the carried file or the cached .debs)")
    p.add_argument("--force", action="store_true", help="rebuild even if the output verifies")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    cmd = "python data_scripts/prepare_debian_docs.py"
    if args.out.resolve() != (ROOT / "data" / "debian_docs").resolve():
        cmd += f" --out {shlex.quote(str(args.out))}"
    try:
        out, written = build(args.out, args.raw_dir, args.force, not args.no_download, cmd)
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not written:
        print(f"{show_path(out)}: up to date ({time.perf_counter() - t0:.2f}s); use --force to rebuild")
        return 0
    m = read_meta(out)
    for s in m["sources"]:
        print(f"  {s['package']}={s['version']}: {s['bytes']:,} bytes in {s['documents']:,} documents "
              f"({s['documents_val']} val)")
        if not s["documents_val"]:
            print(f"warning: no validation document comes from {s['package']}", file=sys.stderr)
    print(f"{show_path(args.raw_dir / CARRIED_NAME)}: {m['carried']['bytes']:,} bytes, sha256 {m['carried']['sha256']}")
    print(f"text sha256 {m['text_sha256']}")
    print(f"{show_path(out)}: {describe(m)} ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
