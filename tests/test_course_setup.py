"""The course on a fresh machine and on a GPU (issue 37): the first cell of notebooks 00-09 clones and installs
only where accellib is missing, is a no-op in the checkout, and every live run compared with a CPU cache stays on
the CPU in fp32 when a GPU is present (checked with a fake one)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accellib.course import setup as course

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0[0-9]_*.ipynb"))


def code_cells(path):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_every_notebook_opens_with_the_setup_cell_and_readme_links_colab():
    assert len(NOTEBOOKS) == 10
    for p in NOTEBOOKS:   # `python -m accellib.course.setup --stamp` writes them
        assert code_cells(p)[0] == course.setup_cell(p.name[:2]), p.name
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## The course", 1)[1].split("\n## ", 1)[0]
    for p in NOTEBOOKS:
        assert f"({course.COLAB}{p.name})" in table, p.name


def test_the_hf_extra_only_where_it_is_used_and_no_upgrade():
    for p in NOTEBOOKS:
        cell = code_cells(p)[0]
        assert ('"[hf]"' in cell) == p.name.startswith("00_"), p.name     # lm-eval and transformers: notebook 00 only
        pip = cell.split('"pip", ', 1)[1].split("], check=True)", 1)[0]          # the install command's words
        assert "upgrade" not in pip and '"-U"' not in pip and "torch" not in pip      # a new-enough torch stays
        assert course.REPO_URL in cell and "ACCELLIB_REPO_URL" in cell and len(cell.splitlines()) <= 16


def test_setup_cell_is_a_no_op_in_the_checkout(monkeypatch, capsys):
    if course.missing(course.DATA):
        pytest.skip("the checkout's data are not prepared here")
    def refuse(*a, **k):
        raise AssertionError(f"the setup cell ran {a} in a prepared checkout")
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for p in NOTEBOOKS:
        exec(code_cells(p)[0], {})
    assert capsys.readouterr().out == ""


def test_setup_cell_on_a_fresh_machine_clones_installs_and_prepares(tmp_path, monkeypatch):
    import importlib.metadata as md
    real = md.distributions
    monkeypatch.setattr(md, "distributions", lambda: [d for d in real() if d.metadata["Name"] not in ("accellib", "lm_eval")])
    monkeypatch.chdir(tmp_path)                                  # no checkout above this folder (Colab's /content)
    monkeypatch.setenv("ACCELLIB_REPO_URL", "file:///somewhere/accellib")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(course, "missing", lambda names, root=None: list(names))   # and no data yet
    calls = []
    def fake_run(cmd, **kw):
        calls.append(cmd)
        if cmd[:2] == ["git", "clone"]:
            (Path(cmd[-1]) / "accellib").mkdir(parents=True)
            (Path(cmd[-1]) / "accellib" / "__init__.py").write_text("")
    monkeypatch.setattr(subprocess, "run", fake_run)
    exec(course.setup_cell("08"), {})                                 # 08: both data sets
    clone = (tmp_path / "accellib-course").resolve()
    assert calls[0] == ["git", "clone", "-q", "--depth=1", "file:///somewhere/accellib", str(clone)]
    assert calls[1] == [sys.executable, "-m", "pip", "install", "-q", "-e", str(clone)]
    assert [Path(c[-1]).name for c in calls[2:]] == ["prepare_shakespeare.py", "prepare_digits.py"]
    assert sys.path[0] == str(clone)
    calls.clear()
    exec(course.setup_cell("00"), {})                                 # 00: the hf extra; the clone is there already
    assert calls[0] == [sys.executable, "-m", "pip", "install", "-q", "-e", str(clone) + "[hf]"]
    assert sys.path.count(str(clone)) == 1


def test_setup_prepares_only_what_is_missing(tmp_path):
    (tmp_path / "data" / "digits").mkdir(parents=True)
    (tmp_path / "data" / "digits" / "meta.json").write_text("{}")
    ran = []
    course.setup("shakespeare", "digits", root=tmp_path, run=lambda cmd, **kw: ran.append(cmd))
    assert [Path(c[-1]).name for c in ran] == ["prepare_shakespeare.py"]


def test_live_runs_stay_on_the_cpu_in_fp32_with_a_gpu_present(monkeypatch, tiny_data_dir):
    from accellib.core.config import load_config
    from accellib.core.trainer import Trainer
    from conftest import tiny_overrides
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)          # a fake GPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    from accellib.core.launch import mixed_precision_for, use_cpu
    plain = load_config(None, tiny_overrides(tiny_data_dir))
    assert not use_cpu(plain.train.device) and mixed_precision_for(plain.train.precision) == "bf16"   # what it guards
    cfg = load_config(None, tiny_overrides(tiny_data_dir) + course.CPU_RUN)
    assert use_cpu(cfg.train.device) and mixed_precision_for(cfg.train.precision) == "no"
    tr = Trainer(cfg)
    assert tr.accelerator.device.type == "cpu" and tr.accelerator.mixed_precision == "no"
    assert next(tr.raw_model.parameters()).device.type == "cpu"


def test_notebooks_route_live_runs_through_cpu_run_and_assert_no_absence_of_a_gpu():
    for p in NOTEBOOKS:
        body = "\n".join(code_cells(p)[1:])
        if any(k in body for k in ("Trainer(", "training_function(", "time_on_processes(")):
            assert "CPU_RUN" in body, p.name
        assert "not torch.cuda.is_available()" not in body, p.name
