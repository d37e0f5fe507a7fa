"""The throughput benchmark runs end to end on a CPU (as subprocesses, one thread each):
throughput.py --quick prints its table and writes nothing (gpu_check.py --smoke, its parts and its deadline, kill
and refusal promises: tests/test_gpu_check.py)."""
from __future__ import annotations

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


# gpu_check.py --smoke (every part at toy scale on a CPU, each part's record) is tested in tests/test_gpu_check.py,
# from one smoke run shared by its tests.


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
