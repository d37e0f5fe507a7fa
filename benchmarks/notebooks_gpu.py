"""Every notebook executed cell by cell on a machine with a GPU (issue 37): the record results/notebooks_<gpu>.json.

    python3 benchmarks/notebooks_gpu.py                            # on the GPU box: every notebook, side by side
    python3 benchmarks/notebooks_gpu.py --notebooks 03,07 --out-dir /scratch/nb
    python benchmarks/notebooks_gpu.py --allow-cpu --notebooks 09  # the same runner on a CPU (tests/test_notebooks_gpu.py)

The GPU image has no Jupyter (no nbformat, nbclient or kernel), so this is a plain runner: each notebook runs in a
process of its own, in the notebook's folder, in one IPython shell (magics, `display` and ipywidgets' `interact`
behave as in a kernel; figures go to matplotlib's Agg backend), each code cell in order, stopping at the first
cell that raises. A notebook passes when every cell ran: its own asserts (verdicts, cache numbers, the exercise
checks) are the test. Unlike nbval it does not compare outputs with the stored ones; it shows that the course
runs where `torch.cuda.is_available()` is true (the live runs that are compared with CPU caches go to the CPU in
fp32 through `accellib.course.setup.CPU_RUN`; the record says how much GPU memory each notebook took).

IPython and ipywidgets come from .whl/ when this Python lacks them (benchmarks/gpu_wheels.sh fetches them on a
machine with a package index). The checkout goes on the notebooks' PYTHONPATH, so each setup cell finds accellib
and does nothing; before them, on a GPU machine, the setup cell runs once as a fresh machine runs it (`clone_path`). The JSON is rewritten as each notebook ends, so a job cut at its limit keeps what finished.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT))  # this checkout's accellib, installed or not (as every benchmark)


def run_one(path: Path, report: Path) -> None:
    """In the child: execute `path`'s code cells in one IPython shell and write what happened to `report`."""
    import matplotlib
    matplotlib.use("Agg")
    from IPython.core.interactiveshell import InteractiveShell
    os.chdir(path.parent)
    nb = json.loads(path.read_text())
    cells = [("".join(c["source"]) if isinstance(c["source"], list) else c["source"])
             for c in nb["cells"] if c["cell_type"] == "code"]
    shell = InteractiveShell.instance(colors="nocolor")
    shell.enable_gui = lambda gui=None: None         # `%matplotlib inline` as in a kernel: figures stay on Agg
    out = dict(cells=len(cells), cells_run=0, failed_cell=None, error=None)
    for i, src in enumerate(cells):
        r = shell.run_cell(src, store_history=True)
        if not r.success:
            e = r.error_in_exec or r.error_before_exec
            out.update(failed_cell=i, error=f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}")
            break
        out["cells_run"] = i + 1
    import torch
    out["cuda_available"] = torch.cuda.is_available()
    out["cuda_max_allocated_mb"] = (round(torch.cuda.max_memory_allocated() / 2**20, 1)
                                    if torch.cuda.is_available() else None)
    report.write_text(json.dumps(out))
    sys.stdout.flush()
    os._exit(0 if out["failed_cell"] is None else 1)   # no atexit teardown of widgets/kernels left by the notebook


def wheels_path(whl: Path, tmp: Path) -> str | None:
    """A folder with IPython and ipywidgets installed from `whl` when this Python lacks them (None: it has them)."""
    if importlib.util.find_spec("IPython") and importlib.util.find_spec("ipywidgets"):
        return None
    wheels = sorted(p for p in whl.glob("*.whl") if not p.name.startswith("torchao-")) if whl.is_dir() else []
    if not wheels:
        sys.exit("notebooks_gpu: this Python has no IPython/ipywidgets and .whl/ holds no wheels; run "
                 "bash benchmarks/gpu_wheels.sh on a machine with a package index and copy .whl/ here")
    target = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(target), *map(str, wheels)], check=True)
    return str(target)


def short_paths(text: str) -> str:
    """A log tail as the record keeps it: every absolute path cut to its last two parts (.../torch/autograd/graph.py
    -> .../autograd/graph.py), so the committed record names files, not the machine's folders."""
    return re.sub(r"/(?:[^/\s\"':]+/)+([^/\s\"':]+/[^/\s\"':]+)", r".../\1", text)


def gpu_name() -> str:
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def clone_path(tmp: Path, env: dict, timeout: float) -> dict:
    """The setup cell as a fresh machine runs it (issue 45): in an empty folder, with this checkout (as a git
    address) for the course's repository, no package index (the packages come from the image and .whl/), accellib not
    on PYTHONPATH. Passes when the cell cloned, installed and prepared, and accellib then imports from the clone."""
    from accellib.course.setup import setup_cell
    folder = tmp / "content"
    folder.mkdir()
    code = setup_cell("01") + "\nimport accellib; print('FROM', pathlib.Path(accellib.__file__).resolve().parents[1])"
    run_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    run_env.update(ACCELLIB_REPO_URL=ROOT.as_uri(), PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",
                   PIP_FIND_LINKS=f"{ROOT / '.whl'} {ROOT / 'data' / 'raw'}",   # wheels, and the corpus sdist
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=folder, env=run_env, capture_output=True, text=True,
                           timeout=timeout)
        ok = r.returncode == 0 and f"FROM {(folder / 'accellib-course').resolve()}" in r.stdout
        tail = "" if ok else short_paths((r.stdout + r.stderr)[-1500:])
    except subprocess.TimeoutExpired:
        ok, tail = False, f"timed out after {timeout:.0f} s"
    return dict(status="passed" if ok else "failed", seconds=round(time.perf_counter() - t0, 1),
                **({"log_tail": tail} if tail else {}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--notebooks", default="", help="comma-separated prefixes (e.g. 03,07); default: all")
    ap.add_argument("--jobs", type=int, default=min(10, max(1, (os.cpu_count() or 2) // 2)),
                    help="notebooks at a time (default: half the cores, at most 10)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one notebook may take (default 300)")
    ap.add_argument("--out-dir", default=str(ROOT / "results"), help="folder of the JSON (default results/)")
    ap.add_argument("--allow-cpu", action="store_true", help="run without a GPU (the runner's own tests)")
    ap.add_argument("--clone-path", choices=["auto", "yes", "no"], default="auto",
                    help="also run the setup cell on a fresh folder (clone this checkout, pip install it, prepare the "
                         "data): auto = on a GPU machine only (it installs accellib into this Python)")
    ap.add_argument("--one", nargs=2, metavar=("NOTEBOOK", "REPORT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        run_one(Path(a.one[0]), Path(a.one[1]))
    from accellib.core.records import command_line, environment, write_json
    gpu = gpu_name()
    if gpu == "cpu" and not a.allow_cpu:
        sys.exit("notebooks_gpu: torch sees no CUDA GPU here; run it on the GPU machine (or pass --allow-cpu to "
                 "try the runner on a CPU)")
    wanted = [p for p in a.notebooks.split(",") if p]
    paths = [p for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
             if not wanted or any(p.name.startswith(w) for w in wanted)]
    if not paths:
        sys.exit(f"notebooks_gpu: no notebook in notebooks/ starts with {a.notebooks!r}; give prefixes like 03,07")
    slug = "".join(ch if ch.isalnum() else "_" for ch in gpu.lower()).strip("_")
    out = Path(a.out_dir) / f"notebooks_{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="notebooks_gpu_"))
    lock = threading.Lock()
    site = wheels_path(ROOT / ".whl", tmp)
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), site, os.environ.get("PYTHONPATH")) if p))
    cmd = command_line("benchmarks/notebooks_gpu.py", sys.argv[1:] if argv is None else argv, ROOT)
    record = dict(command=cmd, gpu=gpu, environment=environment(), jobs=a.jobs, timeout_s=a.timeout, finished=False,
                  notebooks={})
    t_all = time.perf_counter()

    def one(p: Path) -> None:
        rep, log = tmp / f"{p.stem}.json", tmp / f"{p.stem}.log"
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            try:
                rc = subprocess.run([sys.executable, __file__, "--one", str(p), str(rep)], env=env, stdout=fh,
                                    stderr=subprocess.STDOUT, timeout=a.timeout, start_new_session=True).returncode
            except subprocess.TimeoutExpired:
                rc = None
        r = json.loads(rep.read_text()) if rep.is_file() else {}
        status = ("passed" if rc == 0 else "timeout" if rc is None else "failed")
        r.update(status=status, seconds=round(time.perf_counter() - t0, 1))
        if status != "passed":
            r["log_tail"] = short_paths(log.read_text(errors="replace")[-1500:])
        with lock:
            record["notebooks"][p.name] = r
            write_json(out, record)
        print(f"notebooks_gpu: {p.name}: {status} in {r['seconds']:.0f} s"
              + (f" (cell {r.get('failed_cell')}: {r.get('error')})" if status == "failed" else ""), flush=True)

    if a.clone_path == "yes" or (a.clone_path == "auto" and gpu != "cpu"):
        record["clone_path"] = clone_path(tmp, env, a.timeout)
        write_json(out, record)
        print(f"notebooks_gpu: the setup cell on a fresh folder: {record['clone_path']['status']} in "
              f"{record['clone_path']['seconds']:.0f} s", flush=True)
    print(f"notebooks_gpu: {len(paths)} notebooks on {gpu}, {a.jobs} at a time; writing {out}", flush=True)
    with ThreadPoolExecutor(a.jobs) as ex:
        list(ex.map(one, paths))
    record.update(finished=True, wall_s=round(time.perf_counter() - t_all, 1),
                  passed=sum(r["status"] == "passed" for r in record["notebooks"].values()))
    write_json(out, record)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"notebooks_gpu: {record['passed']}/{len(paths)} passed in {record['wall_s']:.0f} s", flush=True)
    return 0 if record["passed"] == len(paths) else 1


if __name__ == "__main__":
    sys.exit(main())
