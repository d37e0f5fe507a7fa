"""benchmarks/notebooks_gpu.py, the plain notebook runner used on the GPU box (no Jupyter there): a cell that raises
stops the notebook and is named, a widget cell runs as in a kernel, and bad input gets one line."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "benchmarks" / "notebooks_gpu.py"


def notebook(tmp_path: Path, *cells: str) -> Path:
    nb = dict(nbformat=4, nbformat_minor=5, metadata={},
              cells=[dict(cell_type="markdown", metadata={}, source="# title")] +
                    [dict(cell_type="code", metadata={}, source=c, outputs=[], execution_count=None) for c in cells])
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(nb))
    return p


def run_one(nb: Path, tmp_path: Path):
    rep = tmp_path / "report.json"
    p = subprocess.run([sys.executable, str(RUNNER), "--one", str(nb), str(rep)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    return p, json.loads(rep.read_text())


def test_a_failing_cell_stops_the_notebook_and_is_named(tmp_path):
    p, r = run_one(notebook(tmp_path, "x = 1", "assert x == 2, 'x is not two'", "open('ran_on', 'w')"), tmp_path)
    assert p.returncode == 1
    assert r["cells"] == 3 and r["cells_run"] == 1 and r["failed_cell"] == 1
    assert r["error"] == "AssertionError: x is not two"
    assert not (tmp_path / "ran_on").exists()        # nothing after the failing cell ran


def test_widgets_magics_and_figures_run_as_in_a_kernel(tmp_path):
    p, r = run_one(notebook(
        tmp_path,
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nfrom ipywidgets import IntSlider, interact",
        "seen = []\ndef f(k):\n    seen.append(k)\n    plt.plot([0, k]); plt.show()\ninteract(f, k=IntSlider(value=3, min=0, max=5));",
        "assert seen == [3], seen\nimport os; assert os.getcwd() == %r" % str(tmp_path)), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert r["cells_run"] == 3 and r["failed_cell"] is None and r["cuda_available"] in (True, False)


def test_bad_prefix_and_no_gpu_are_one_line_errors(tmp_path):
    p = subprocess.run([sys.executable, str(RUNNER), "--allow-cpu", "--notebooks", "99", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "starts with '99'" in p.stderr
    import torch
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, str(RUNNER), "--out-dir", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 1 and "no CUDA GPU" in p.stderr and p.stderr.strip().count("\n") == 0
    assert not list(tmp_path.glob("*.json"))          # nothing written by a refused run


def test_records_keep_no_machine_paths(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from notebooks_gpu import short_paths
    from accellib.core.records import command_line
    # absolute paths of this machine (built at run time: the repository names none)
    lib = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "torch" / "autograd" / "graph.py"
    tail = f'File "{lib}", line 869\n  {tmp_path / "x" / "a.py"}:3'
    assert short_paths(tail) == 'File ".../autograd/graph.py", line 869\n  .../x/a.py:3'
    assert command_line("benchmarks/notebooks_gpu.py", ["--out-dir", str(tmp_path / "out"), "--jobs", "4",
                                                        "--notebooks", str(ROOT / "notebooks")], ROOT) == (
        "python3 benchmarks/notebooks_gpu.py --out-dir <path> --jobs 4 --notebooks notebooks")
