"""What the first cell of every notebook calls: the course on a fresh machine (Colab), a no-op in a checkout.

The cell itself (identical in notebooks 00-09; tests/test_course_setup.py checks it) clones this repository and
installs it with its `hf` extra (notebook 00 exports with transformers and evaluates with lm-eval) only when
`accellib` cannot be imported and no checkout lies above the notebook's folder; then it calls `setup(...)`,
which prepares each missing data set with its script in `data_scripts/`. In a prepared checkout nothing
is cloned, installed or prepared, and nothing is printed.

`REPO_URL` is the one place the repository's address is written down (the README's "Open in Colab" links and
the notebooks' setup cells repeat it, and a test keeps them equal). No public address is stated anywhere in the
repository, so it is a placeholder: replace `REPO_URL` (`COLAB` follows it), then
change the copies (tests/test_course_setup.py lists them and fails until they agree).

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


if __name__ == "__main__":
    setup(*DATA)
