"""The GPU check's promises, checked on a CPU (issue 34): its plan fits the deadline by its own accounting, a kill
at any moment leaves a whole JSON of what was measured, "no torch" is told from "no GPU", a deadline skips parts
and says which, a missed target still exits 0 with its verdict written, the wheels it carries install into a
temporary folder, and accellib's minimum torch is declared once and checked."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable)
SMOKE = [sys.executable, "benchmarks/gpu_check.py", "--smoke"]


def run(cmd: list[str], env=None, timeout: int = 540) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def missed(tmp_path_factory):
    """One smoke run of two arms whose MFU target (200%) cannot be met: (process, JSON)."""
    out = tmp_path_factory.mktemp("gc") / "missed.json"
    p = run(SMOKE + ["--arms", "baseline,pld", "--mfu-target", "2.0", "--deadline", "540", "--out", str(out)], timeout=590)
    return p, json.loads(out.read_text())


def test_a_missed_target_exits_0_with_its_verdict_in_the_json_and_the_output(missed):
    p, rec = missed
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert rec["finished"] is True
    v = [v for v in rec["verdicts"] if v["what"].startswith("MFU of the trainer")]
    assert len(v) == 1 and v[0]["passed"] is False and v[0]["target"] == ">= 200%", rec["verdicts"]
    assert re.search(r"^\s+MISSED\s+MFU of the trainer", p.stdout, re.M), p.stdout[-3000:]
    # the missed MFU asks for the profiler's summary: its top operators are in the JSON
    assert rec["parts"]["profile"]["status"] == "done" and rec["parts"]["profile"]["top"]


def test_the_plan_fits_the_deadline_by_its_own_accounting(missed):
    p, rec = missed
    plan = rec["plan"]
    assert plan["parts"] and "estimate" in plan["note"]
    assert plan["planned_total_s"] <= plan["budget_s"] + 1e-6
    assert plan["elapsed_at_plan_s"] + plan["budget_s"] <= rec["deadline_s"] - rec["margin_s"] + 0.2
    cum = [q["cumulative_s"] for q in plan["parts"]]
    assert cum == sorted(cum) and abs(cum[-1] - plan["planned_total_s"]) < 0.2
    assert "ESTIMATES" in p.stdout and "gpu_check plan" in p.stdout
    # printed before any part it plans starts
    assert p.stdout.index("gpu_check plan") < p.stdout.index("] matmul_peak")
    # every planned part ran, and the check kept to its deadline
    assert rec["elapsed_s"] <= rec["deadline_s"]
    for q in plan["parts"]:
        name = q["part"]
        got = rec["arms"].get(name[4:]) if name.startswith("arm:") else rec["parts"].get(name)
        assert got is not None or name in rec["skipped"], name


def test_make_plan_leaves_out_what_does_not_fit_and_keeps_later_parts_that_do():
    planned, left = gpu_check.make_plan([("a", 30), ("b", 50), ("c", 10), ("d", 25)], 60)
    assert [n for n, _, _ in planned] == ["a", "c"] and [n for n, _ in left] == ["b", "d"]
    assert planned[-1][2] == 40 <= 60


def test_a_kill_at_any_moment_leaves_a_whole_json_of_what_was_measured(tmp_path):
    """SIGKILL the smoke run as soon as its first part is in the JSON: the file parses and holds that part."""
    out = tmp_path / "killed.json"
    p = subprocess.Popen(SMOKE + ["--out", str(out)], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        t_end = time.monotonic() + 300
        rec = None
        while time.monotonic() < t_end:
            if out.exists():
                rec = json.loads(out.read_text())   # every version read here is whole (rename, never a partial write)
                if "environment" in rec["parts"]:
                    break
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    rec = json.loads(out.read_text())
    assert rec["finished"] is False
    env = rec["parts"]["environment"]
    assert env["status"] == "done" and env["torch"] == torch.__version__ and env["seconds"] >= 0


def test_no_torch_is_told_apart_from_no_gpu(tmp_path):
    """A python3 on PATH without torch (this interpreter with site-packages switched off) gets "no torch"; the
    interpreter with torch on this GPU-less machine gets "no CUDA GPU"."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    (bin_ / "python3").chmod(0o755)
    env = {k: v for k, v in ENV.items() if k != "PYTHON"}
    env["PATH"] = f"{bin_}{os.pathsep}{os.environ['PATH']}"
    p = run(["bash", "benchmarks/gpu_check.sh"], env=env, timeout=300)
    assert p.returncode == 1 and p.stdout == ""
    line = p.stderr.strip()
    assert line.splitlines() == [line] and "has no torch" in line and "no CUDA GPU" not in line, line
    if torch.cuda.is_available():
        pytest.skip("the no-GPU message needs a machine without CUDA")
    p = run(["bash", "benchmarks/gpu_check.sh"], timeout=300)
    assert p.returncode == 1 and p.stdout == ""
    line = p.stderr.strip()
    assert line.splitlines() == [line] and "no CUDA GPU is visible" in line and "no torch" not in line, line


def test_missing_python_headers_are_named_with_the_package_to_install(tmp_path):
    found, problem = gpu_check.python_headers(str(tmp_path))
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert found is None and "Python.h" in problem and f"python{v}-dev" in problem and "\n" not in problem
    (tmp_path / "Python.h").write_text("")
    assert gpu_check.python_headers(str(tmp_path)) == (str(tmp_path), None)


def test_a_deadline_skips_the_parts_and_says_which(tmp_path):
    """A 1-second deadline: the environment is recorded (it always is), every other part is skipped, by name,
    on the console and in the JSON, and the exit status is 0."""
    out = tmp_path / "late.json"
    p = run(SMOKE + ["--deadline", "1", "--out", str(out)], timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["finished"] and list(rec["parts"]) == ["environment"] and not rec["arms"]
    for name in ("calibration", "matmul_peak", "trainer_vs_plain", "arm:baseline", "arm:multilevel", "fsdp",
                 "tutorial_text"):
        assert name in rec["skipped"], name
        assert re.search(rf"^gpu_check: skipped {re.escape(name)}: ", p.stdout, re.M), name
    assert "0 s left" in rec["skipped"]["calibration"]


def test_run_part_skips_what_does_not_fit_and_the_alarm_cuts_a_running_part(tmp_path):
    """In-process: a part whose estimate exceeds what is left is skipped; one that fits runs; the alarm at the
    deadline stops a part that runs past it (recorded as cut) and every later part is skipped."""
    rec = gpu_check.Record(tmp_path / "r.json", {})
    clock = gpu_check.Clock(deadline_s=gpu_check.Clock(0, 0).elapsed() + 10.0, margin_s=4.0)  # about 6 s left
    assert gpu_check.run_part("big", 30.0, lambda: dict(x=1), rec, clock) is None
    assert "estimated 30 s" in rec.data["skipped"]["big"]
    assert gpu_check.run_part("small", 0.5, lambda: dict(x=1), rec, clock)["status"] == "done"
    clock = gpu_check.Clock(deadline_s=clock.elapsed() + 0.6, margin_s=0.4)     # the alarm in 0.4 s
    clock.arm_alarm()
    try:
        def slow():
            t_end = time.monotonic() + 20
            while time.monotonic() < t_end:
                time.sleep(0.01)
            return {}
        t0 = time.monotonic()
        assert gpu_check.run_part("slow", 0.0, slow, rec, clock) is None
        assert time.monotonic() - t0 < 5
    finally:
        clock.disarm()
    assert rec.data["parts"]["slow"]["status"] == "cut" and clock.expired
    assert gpu_check.run_part("after", 0.0, lambda: {}, rec, clock) is None
    assert "deadline came" in rec.data["skipped"]["after"]
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["parts"]["slow"]["status"] == "cut" and "after" in saved["skipped"]


def test_carried_wheels_install_into_a_temporary_folder_and_a_missing_one_is_one_line(tmp_path):
    """setup_torchao with no wheel: the FP8 arm's reason names gpu_wheels.sh; with a (stand-in) torchao wheel in
    the folder: installed with pip --target into a temporary folder and imported (in a subprocess: the test
    process must not see a fake torchao)."""
    import zipfile
    empty = tmp_path / "empty"
    empty.mkdir()
    code = ("import sys, json; sys.path[:0] = [{b!r}, {r!r}]; import torch, gpu_check; from pathlib import Path; "
            "print(json.dumps(gpu_check.setup_torchao(Path({w!r}), Path({t!r}))))")
    args = dict(b=str(ROOT / "benchmarks"), r=str(ROOT), t=str(tmp_path))
    env = dict(ENV, PYTHONNOUSERSITE="1")
    p = run([sys.executable, "-c", code.format(w=str(empty), **args)], env=env, timeout=300)
    info = json.loads(p.stdout.strip().splitlines()[-1])
    if info["source"] == "installed":
        pytest.skip("torchao is installed here")
    assert info["version"] is None and "gpu_wheels.sh" in info["reason"] and "\n" not in info["reason"]
    whl = tmp_path / "whl"
    whl.mkdir()
    with zipfile.ZipFile(whl / "torchao-0.0.1-py3-none-any.whl", "w") as z:
        z.writestr("torchao/__init__.py", "__version__ = '0.0.1+standin'\n")
        z.writestr("torchao-0.0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: torchao\nVersion: 0.0.1\n")
        z.writestr("torchao-0.0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                    "Tag: py3-none-any\n")
        z.writestr("torchao-0.0.1.dist-info/RECORD", "")
    p = run([sys.executable, "-c", code.format(w=str(whl), **args)], env=env, timeout=300)
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["version"] == "0.0.1+standin" and info["reason"] is None, info
    assert "torchao-0.0.1-py3-none-any.whl" in info["source"]


def test_the_minimum_torch_is_declared_once_and_refused_below_in_one_line(monkeypatch):
    import accellib
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"torch>=([\d.]+)"', text)[1] == accellib.MIN_TORCH
    release = lambda v: tuple(int(x) for x in v.split("+")[0].split(".")[:2])  # noqa: E731
    assert release(torch.__version__) >= release(accellib.MIN_TORCH)   # the tests' torch passes its own check
    from importlib import metadata
    monkeypatch.setattr(metadata, "version", lambda pkg: "2.10.1+cu128" if pkg == "torch" else "0")
    with pytest.raises(ImportError) as e:
        accellib._check_torch()
    assert str(e.value).count("\n") == 0 and f"torch >= {accellib.MIN_TORCH}" in str(e.value) and "2.10.1" in str(e.value)
    monkeypatch.setattr(metadata, "version", lambda pkg: "2.11.0")
    accellib._check_torch()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU values of the record")
def test_the_run_record_keeps_the_full_torch_version_and_none_for_the_gpu_stack_on_a_cpu():
    from accellib.core.records import environment
    env = environment()
    assert env["torch"] == torch.__version__   # with its local tag (+cpu, +cu130), which versions["torch"] may lack
    assert env["cuda"] is None and env["driver"] is None and env["nccl"] is None


def test_the_docs_state_the_h200_record_as_it_is():
    """docs/full_scale.md's GPU-check table is gpu_table of the committed record, and its prose numbers are the
    record's; the notebook record shows every cell of every notebook ran (as the docs say)."""
    import json
    from accellib.analysis.results import gpu_table
    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "full_scale.md").read_text()
    rec = json.loads((root / "results" / "gpu_check_h200.json").read_text())
    assert gpu_table(rec) in docs
    tv = rec["parts"]["trainer_vs_plain"]
    for said in (f"reached {100 * tv['mfu']['accellib+compile']['datasheet']:.1f}% of the data sheet's bf16 peak",
                 f"matmul peak was {100 * rec['parts']['matmul_peak']['best_over_datasheet']:.1f}% of it",
                 f"ran\n  {tv['ratios']['accellib / plain']:.3f}x a plain PyTorch loop eager, "
                 f"{tv['ratios']['accellib+compile / plain+compile']:.3f}x compiled",
                 f"idle {100 * rec['parts']['profile']['idle_share']:.0f}% of the",
                 f"PLD realized {rec['arms']['pld']['realized_speedup']['realized']:.2f} of its FLOPs saving",
                 f"the V-cycle {rec['arms']['multilevel']['realized_speedup']['realized']:.2f}",
                 f"{rec['elapsed_s']:.0f} s of a {rec['deadline_s']:.0f} s deadline"):
        assert said in docs, said
    assert list(rec["skipped"]) == ["tutorial_text"] and "`tutorial_text`\n  part did not fit" in docs
    nbs = json.loads((root / "results" / "notebooks_nvidia_h200.json").read_text())
    ran = nbs["notebooks"]
    assert sorted(ran) == sorted(p.name for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert all(r["status"] == "passed" and r["cells_run"] == r["cells"] and r["cuda_available"] for r in ran.values())
    assert all(r["cuda_max_allocated_mb"] == 0 for r in ran.values()) and "no notebook allocated GPU memory" in docs
    readme = (root / "README.md").read_text()
    assert f"{100 * tv['mfu']['accellib+compile']['datasheet']:.0f}% MFU against 45%" in readme
    assert len(ran) == 10 and "All ten ran on an H200" in readme
