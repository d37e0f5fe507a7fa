"""What the first cell of every notebook calls: the course on a fresh machine (Colab), a no-op in a checkout.

The cell itself (`setup_cell`, written into notebooks 00-09; tests/test_course_setup.py checks them and runs it
twice in a real kernel on a fresh folder) finds the checkout the notebook sits in, or else the course's own clone
`accellib-course/` beside it, cloning it once from `REPO_URL` (or `$ACCELLIB_REPO_URL`); it installs that folder
with pip only while no `accellib` is installed (a restart keeps the install, so a re-run does nothing), without
--upgrade, so a runtime's torch that is new enough (accellib.MIN_TORCH) stays; notebook 00 adds the `hf` extra
(it exports with transformers and evaluates with lm-eval), the others do not need it. Then it calls `setup(...)`,
which prepares each missing data set with its script in `data_scripts/`. In a prepared checkout nothing is cloned,
installed or prepared, and nothing is printed. While `REPO_URL` is the placeholder, a fresh machine gets one line
saying what to set, not a failing clone.

The clone is not named `accellib`: a folder of that name in the working directory (Colab's /content) would be
imported as an empty namespace package after a restart, which is what broke the earlier cell.

`REPO_URL` is the one place the repository's address is written down (the README's "Open in Colab" links and
the notebooks' setup cells repeat it, and a test keeps them equal). No public address is stated anywhere in the
repository, so it is a placeholder: replace `REPO_URL` (`COLAB` follows it), then rewrite the cells
(`python -m accellib.course.setup --stamp`) and the README's links.

`CPU_RUN` is what every live run that is compared with a CPU cache adds to its overrides: the CPU and fp32 even
when a GPU is present (otherwise `train.device=auto` and `precision=auto` would train in bf16 on the GPU, and
the cached fp32 CPU numbers would be out of tolerance).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


REPO_URL = "https://github.com/REPLACE-WITH-OWNER/accellib"      # placeholder: no public address is stated
COLAB = REPO_URL.replace("https://github.com/", "https://colab.research.google.com/github/") + "/blob/main/notebooks/"
CPU_RUN = ["--train.device=cpu", "--train.precision=fp32"]

# data set -> (its folder under data/, the script that prepares it)
DATA = {"shakespeare": ("shakespeare", "prepare_shakespeare.py"), "digits": ("digits", "prepare_digits.py")}


def _root(root: Path | None) -> Path:
    from .. import REPO_ROOT            # at call time: an installed wheel without a checkout imports this module too
    return REPO_ROOT if root is None else Path(root)


def missing(names, root: Path | None = None) -> list[str]:
    """The data sets among `names` whose folder has no meta.json yet (what the scripts write last)."""
    return [n for n in names if not (_root(root) / "data" / DATA[n][0] / "meta.json").is_file()]


def setup(*names: str, root: Path | None = None, run=None) -> None:
    """Prepare each data set in `names` that is missing, with its script in data_scripts/. In a prepared
    checkout nothing runs and nothing is printed (and the cell shows no output)."""
    root = _root(root)
    for n in missing(names or ("shakespeare",), root):
        print(f"preparing data/{DATA[n][0]} (python data_scripts/{DATA[n][1]}) ...", flush=True)
        (run or subprocess.run)([sys.executable, str(root / "data_scripts" / DATA[n][1])], cwd=root, check=True)


PLACEHOLDER = "REPLACE-WITH-OWNER"
# notebook -> (data sets, pip extra)
NEEDS = {"00": (("shakespeare",), "hf"), "08": (("shakespeare", "digits"), "")}
_CELL = """# Setup: on Colab or a fresh machine this fetches the course and prepares its data; in a prepared checkout it does nothing
import importlib.metadata as md, os, pathlib, subprocess, sys
REPO_URL = os.environ.get("ACCELLIB_REPO_URL") or "{url}"  # or your copy's address
REPO = next((p for p in (pathlib.Path.cwd(), *pathlib.Path.cwd().parents) if (p / "accellib" / "__init__.py").is_file()),
            pathlib.Path("accellib-course").resolve())     # the checkout this notebook is in, else the course's clone
if not (REPO / "accellib" / "__init__.py").is_file():
    if "{placeholder}" in REPO_URL:
        raise type("SetupStop", (Exception,), {{"_render_traceback_": lambda e: [str(e)]}})(
            "setup: set REPO_URL in this cell (or the ACCELLIB_REPO_URL variable) to the course's git address, then run it again")
    subprocess.run(["git", "clone", "-q", "--depth=1", REPO_URL, str(REPO)], check=True)
if {wanted} - {{(d.metadata["Name"] or "").replace("-", "_") for d in md.distributions()}}:   # once: a restart keeps it
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(REPO){extra}], check=True)  # keeps torch >= 2.11
sys.path[:0] = [] if str(REPO) in sys.path else [str(REPO)]
from accellib.course.setup import CPU_RUN, setup     # CPU_RUN: live runs on the CPU in fp32, as the cached runs
setup({data})"""


def setup_cell(notebook: str) -> str:
    """The first cell of notebook `notebook` ("00" ... "09"): the same everywhere but for its data and pip extra."""
    data, extra = NEEDS.get(notebook, (("shakespeare",), ""))
    wanted = '{"accellib", "lm_eval"}' if extra == "hf" else '{"accellib"}'
    return _CELL.format(url=REPO_URL, placeholder=PLACEHOLDER, wanted=wanted,
                        extra=f' + "[{extra}]"' if extra else "", data=", ".join(f'"{d}"' for d in data))


def stamp(root: Path | None = None) -> list[str]:
    """Write `setup_cell` into the first code cell of every notebook 00-09 (after REPO_URL changed); returns the
    notebooks changed. Outputs of that cell are cleared (in a checkout it prints nothing)."""
    import json
    changed = []
    for nb_path in sorted((_root(root) / "notebooks").glob("0[0-9]_*.ipynb")):
        nb = json.loads(nb_path.read_text())
        cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
        src = setup_cell(nb_path.name[:2])
        if "".join(cell["source"]) != src:
            cell["source"] = src.splitlines(keepends=True)
            cell["outputs"] = []
            nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            changed.append(nb_path.name)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["--stamp"]:
        print("\n".join(stamp()) or "every setup cell is up to date")
    else:
        setup(*DATA)
