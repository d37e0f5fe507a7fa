"""The package's layout: no import circles, no upward imports, every module documented and listed, and a
built wheel that imports and runs its command lines outside the checkout.

The import graph is read from the source with ast. An edge is every `import`/`from ... import` statement,
at module level AND inside functions (a lazy import is still a dependency: it only hides a circle until
the function runs), resolved to the module it names (`from .x import f` -> x; `from . import x` -> x
when x is a module, else the package). Not edges: the implicit import of a parent package's __init__, and
the technique registry's importlib discovery (techniques/__init__.py imports every technique module by
name; those modules import `register` from it, which is the plug-in pattern, not a circle of the code).
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "accellib"
COMMANDS = ("train", "compare", "evaluate", "export")   # the root command lines, `python -m accellib.X`


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The accellib modules that `name` (at `path`) imports anywhere in its source; an import of an
    accellib module that does not exist (e.g. a relative import left behind by a move) fails here."""
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    missing = {m for m in out if m.split(".")[0] == "accellib" and m not in known}
    assert not missing, f"{path} imports {', '.join(sorted(missing))}, which do not exist"
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports(n, p, set(mods)) for n, p in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}   # 1 on the path, 2 done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(g[n]):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_find_cycle_names_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_graph_sees_lazy_and_relative_imports(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("from .y import z\n\ndef f():\n    from ..core import config\n")
    known = {"accellib.sub.y", "accellib.core", "accellib.core.config"}
    assert imports("accellib.sub.x", f, known) == {"accellib.sub.y", "accellib.core.config"}
    f.write_text("def f():\n    from .techniques import build_techniques\n")
    with pytest.raises(AssertionError, match="accellib.sub.techniques, which do not exist"):
        imports("accellib.sub.x", f, known)


def test_no_import_circles():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_upward_imports():
    """A module in a subpackage never imports the command lines at the root; only the root and drivers/
    import drivers/."""
    bad = [f"{n} imports {m}" for n, deps in graph().items() for m in deps
           if n.count(".") > 1 and (m in {f"accellib.{c}" for c in COMMANDS}
                                    or (m.startswith("accellib.drivers") and not n.startswith("accellib.drivers")))]
    assert not bad, "; ".join(bad)


def test_every_module_opens_with_one_line_saying_what_it_holds():
    bad = []
    for n, p in modules().items():
        doc = ast.get_docstring(ast.parse(p.read_text()), clean=False)
        lines = (doc or "").split("\n")
        if not lines[0].strip() or (len(lines) > 1 and lines[1].strip()):
            bad.append(n)
    assert not bad, f"docstring missing or its first line is not a line of its own: {', '.join(bad)}"


def listed_modules(text: str) -> set[str]:
    """Paths of the layout tree (the ``` block under '## Layout'): a folder line ends in '/', two spaces
    of indent per level; the first word of every other line is a module file of the folder above."""
    block = re.search(r"^## Layout\n.*?```\n(.*?)```", text, re.S | re.M)
    assert block, "no ``` block under '## Layout'"
    out, stack = set(), []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        depth, word = (len(line) - len(line.lstrip())) // 2, line.split()[0]
        stack = stack[:depth]
        if word.endswith("/"):
            stack.append(word)
        elif word.endswith(".py") and stack and stack[0] == "accellib/":
            out.add("".join(stack) + word)
    return out


def test_layout_lists_every_module_and_nothing_else():
    listed = listed_modules((ROOT / "docs" / "data_and_layout.md").read_text())
    real = {str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if p.name != "__init__.py"}
    assert not real - listed, f"docs/data_and_layout.md's layout misses {sorted(real - listed)}"
    assert not listed - real, f"docs/data_and_layout.md's layout names modules that do not exist: {sorted(listed - real)}"


def test_layout_parser():
    text = "## Layout\n\n```\naccellib/   the package\n  train.py  cli\n  core/  loop\n    config.py  x\n" \
           "  export.py  y\nconfigs/   yaml\n  tiny.py\n```\n"
    assert listed_modules(text) == {"accellib/train.py", "accellib/core/config.py", "accellib/export.py"}


@pytest.mark.timeout(300)
def test_wheel_imports_and_runs_outside_the_checkout(tmp_path):
    """`pip install .` (not editable): build the wheel, unpack it alone (no checkout on sys.path, cwd
    outside the repo), import every module and run every command line's --help; what needs the checkout
    says so in one line."""
    src = tmp_path / "src"   # a copy: setuptools writes build/ and *.egg-info beside the sources
    shutil.copytree(PKG, src / "accellib", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                           cwd=tmp_path, timeout=240)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("accellib-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        packed = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in names
                  if n.startswith("accellib/") and n.endswith(".py")}
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        scripts = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert packed == set(modules()), f"the wheel's modules differ: {sorted(packed ^ set(modules()))}"
    # issue 36: what runs, and only that (the notebook stack is the `notebooks` extra); PEP 561's marker; the scripts
    assert "accellib/py.typed" in names
    needs = {re.split(r"[<>=!~ ;]", ln.split(":", 1)[1].strip())[0].lower() for ln in meta.splitlines()
             if ln.startswith("Requires-Dist:") and "extra ==" not in ln}
    assert {"torch", "accelerate", "scipy"} <= needs and not needs & {"jupyterlab", "ipywidgets", "notebook"}, needs
    assert 'extra == "notebooks"' in meta
    for cmd in COMMANDS:
        assert f"accellib-{cmd} = accellib.{cmd}:main" in scripts, scripts
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                              str(site), str(wheel)], capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    script = ("import importlib, sys\n"
              f"mods = {sorted(packed)!r}\n"
              "for m in mods:\n    importlib.import_module(m)\n"
              "import accellib\nassert accellib.__file__.startswith(sys.argv[1]), accellib.__file__\n"
              "assert accellib.CHECKOUT is None\n"
              "try:\n    accellib.REPO_ROOT\nexcept accellib.CheckoutError as e:\n    print('checkout:', e)\n")
    run = subprocess.run([sys.executable, "-c", script, str(site)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    msg = run.stdout.strip().splitlines()
    assert len(msg) == 1 and "needs a checkout" in msg[0], run.stdout
    for cmd in COMMANDS:
        r = subprocess.run([sys.executable, "-m", f"accellib.{cmd}", "--help"], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=240)
        assert r.returncode == 0 and "usage:" in r.stdout, (cmd, r.stderr[-2000:])
        r = subprocess.run([str(site / "bin" / f"accellib-{cmd}"), "--help"], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=240)
        assert r.returncode == 0 and f"usage: accellib-{cmd}" in r.stdout, (cmd, r.stderr[-2000:])
    # an error naming an optional package says how to install it into this (non-checkout) install
    r = subprocess.run([sys.executable, "-c", "import accellib; print(accellib.install_hint('hf'))"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert r.stdout.startswith("pip install 'transformers") and "install -e" not in r.stdout, r.stdout


def test_tracked_records_hold_no_machine_paths():
    """results/*.json are committed: an absolute path of the machine that wrote one (an --out-dir, a compiler's
    location) means nothing to a reader and leaks that machine's layout."""
    import re
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r'"(/(?:root|home|opt|usr|tmp|work|Users|scratch|mnt|data)/[^"]*)"|\s(/(?:root|home|opt|tmp|work)/\S+)')
    found = [(p.name, m.group(0)) for p in sorted((root / "results").glob("*.json"))
             for m in pattern.finditer(p.read_text())]
    assert not found, found[:5]
