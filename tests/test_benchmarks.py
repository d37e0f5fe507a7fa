"""The throughput benchmark and the GPU check run end to end on a CPU (as subprocesses, one thread each):
throughput.py --quick prints its table and writes nothing; gpu_check.py --smoke runs every part at toy scale and
writes one finite record per arm to --out (its deadline, kill and refusal promises: tests/test_gpu_check.py)."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable)


def run(*cmd: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_throughput_quick_prints_every_loop_and_ratio_and_writes_nothing():
    results = ROOT / "results" / "throughput_cpu.json"
    before = results.stat().st_mtime_ns if results.exists() else None
    # the eager backend keeps the test fast; compilation itself (inductor) is what the full run times
    p = run(sys.executable, "benchmarks/throughput.py", "--quick", "--compile-backend", "eager")
    assert p.returncode == 0, p.stderr[-2000:]
    for loop in ("plain", "accellib", "plain+compile", "accellib+compile"):
        assert re.search(rf"^{re.escape(loop)}\s+\d+\s+\d+\.\.\d+", p.stdout, re.M), p.stdout
    for name in ("accellib / plain", "accellib+compile / plain+compile", "accellib+compile / accellib",
                 "plain+compile / plain"):
        m = re.search(rf"^ratio {re.escape(name)}\s+(\d+\.\d+)", p.stdout, re.M)
        assert m and 0 < float(m[1]) < 10, p.stdout
    assert "(target >= 0.97)" in p.stdout
    assert "graphs compiled during timing: 0" in p.stdout
    assert (results.stat().st_mtime_ns if results.exists() else None) == before  # --quick writes no results


def test_gpu_check_smoke_writes_one_finite_record_per_arm(tmp_path):
    """Every part of the GPU check at toy scale on a CPU: each arm's tokens/s over its timed steps, MFU (against
    the measured matmul; a CPU has no data sheet), peak memory and graph counts; the FP8 arm skipped in one line."""
    out = tmp_path / "gpu_check.json"
    # a deadline near pytest's 600 s: on a loaded machine the default 420 s would skip arms (as it should)
    p = run(sys.executable, "benchmarks/gpu_check.py", "--smoke", "--deadline", "540", "--out", str(out), timeout=590)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["device"] == "cpu" and rec["smoke"] and rec["git_commit"] and rec["finished"]
    assert str(tmp_path) not in out.read_text() and rec["command"].endswith("--out <path>")   # no machine paths
    assert rec["parts"]["environment"]["compiler"] in (None, "gcc", "clang", "cc")
    assert set(rec["arms"]) == {"baseline", "pld", "sbld", "random_ltd", "multilevel", "standardization_loss"}
    assert "CUDA" in rec["skipped"]["arm:lowp_fp8"]
    for name in ("environment", "calibration", "matmul_peak", "trainer_vs_plain", "fsdp"):
        assert rec["parts"][name]["status"] == "done", (name, rec["parts"].get(name), rec["skipped"].get(name))
    assert rec["parts"]["fsdp"]["distributed_type"] == "FSDP"
    for name, arm in rec["arms"].items():
        assert arm["status"] == "done", (name, arm)
        for k in ("tok_per_s", "flops_per_token", "peak_mem_gb"):
            assert math.isfinite(arm[k]) and arm[k] > 0, (name, k, arm)
        assert arm["mfu"]["datasheet"] is None and 0 < arm["mfu"]["measured"], (name, arm)
        assert arm["schedule"] and math.isfinite(arm["final_train_loss"])
        if name != "multilevel":
            assert arm["timed_steps"] == arm["planned_steps"] == 6 and not arm["cut_by_deadline"]
    for name in ("pld", "sbld", "random_ltd", "multilevel"):
        assert "realized" in rec["arms"][name]["realized_speedup"]
    if (ROOT / "data" / "shakespeare" / "meta.json").is_file():  # the real-text run against the CPU cache
        assert rec["parts"]["tutorial_text"]["within"], rec["parts"]["tutorial_text"]
    assert not (ROOT / "results" / "gpu_check_cpu.json").exists()


# gpu_check.sh's one-line refusals (no torch, no GPU, no C compiler): tests/test_gpu_check.py, tests/test_full_scale.py


def test_scaling_grid_every_size_and_arm_is_a_valid_config():
    """benchmarks/scaling.py's full grid: each (depth, width) x arm validates with its overrides, and the
    heads keep 16 dimensions (depth 3 would fail here: the V-cycle merges pairs of blocks)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scaling
    from accellib.drivers.arms import arm_configs, check_data
    from accellib.core.config import validate
    from accellib.techniques import build_techniques
    from accellib.drivers.vcycle import plan_stages
    for L in scaling.DEPTHS:
        for d in scaling.WIDTHS:
            cfgs = arm_configs(scaling.CONFIG, list(scaling.ARMS), scaling.size_overrides(L, d))
            check_data(cfgs)
            for cfg in cfgs.values():
                validate(cfg)
                build_techniques(cfg)                 # e.g. random-LTD needs a middle block
                if cfg.techniques["multilevel"].enabled:
                    plan_stages(cfg)                  # the V-cycle merges pairs of blocks and of heads
                assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.head_dim) == (L, d, scaling.HEAD_DIM)
                assert cfg.optim.lr == pytest.approx(scaling.BASE_LR * scaling.BASE_WIDTH / d, rel=1e-5)


def test_every_benchmark_runs_from_the_checkout_without_installing(tmp_path):
    # issue 36: before, `python benchmarks/notebook_times.py --help` failed with "No module named 'accellib'" outside
    # an environment that had installed the package. An `accellib` on PYTHONPATH that refuses to import stands for
    # "not installed" (or another copy installed): each script must use this checkout's.
    shadow = tmp_path / "shadow" / "accellib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not the checkout this script is in')\n")
    env = {**ENV, "PYTHONPATH": str(shadow.parent)}
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if "argparse" in p.read_text()]
    assert any(p.name == "notebook_times.py" for p in scripts)
    for script in scripts:
        p = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0 and "usage:" in p.stdout, (script.name, p.stderr[-1500:])
