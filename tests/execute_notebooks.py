"""Execute notebooks in place so their stored outputs are exactly what CI's nbval run sees.

    python tests/execute_notebooks.py notebooks/00_setup_and_baseline.ipynb [...]

Runs each notebook in its own folder with the python3 kernel and the environment of `make test`
(OMP_NUM_THREADS=1), then strips widget state (it only bloats diffs; nbval ignores it).
"""
import os
import sys
import time

import nbformat
from nbclient import NotebookClient


def execute(path: str, write: bool = True) -> None:
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}}).execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    if write:
        nbformat.write(nb, path)
    print(f"{path}: executed in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    args = sys.argv[1:]
    write = "--no-write" not in args          # --no-write: execute and time only (benchmarks/notebook_times.py)
    for p in [a for a in args if a != "--no-write"]:
        execute(p, write=write)
