"""benchmarks/fp8_table.py on a CPU: GPT-2 small's Linear shapes, the timing code at toy scale (bf16 only, FP8
reported as not available), a table the technique reads back, and the one-line refusal without CUDA and torchao.
The GPU run itself (results/fp8_table_<gpu>.json) needs an FP8 GPU; no number here stands in for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fp8_table  # noqa: E402
from accellib.techniques.low_precision import fp8_plan, read_table, table_path  # noqa: E402


def test_gpt2_small_shapes_are_its_four_block_linears_and_the_head():
    assert fp8_table.gpt2_small_shapes(16 * 1024) == [
        ("attn.c_attn", (16384, 768, 2304)), ("attn.c_proj", (16384, 768, 768)), ("mlp.c_fc", (16384, 768, 3072)),
        ("mlp.c_proj", (16384, 3072, 768)), ("lm_head", (16384, 768, 50304))]


def test_measure_on_a_cpu_times_bf16_and_reports_fp8_as_not_available(tmp_path):
    rows = fp8_table.measure("cpu", fp8_table.SMOKE_SHAPES, steps=2, warmup=1, compile_backend="aot_eager")
    assert [r["name"] for r in rows] == ["toy_fc", "toy_proj"] and rows[0]["shape"] == [64, 32, 48]
    for r in rows:
        assert r["bf16_ms"] > 0
        assert r["fp8_ms"] == r["speedup"] == {"tensorwise": None, "rowwise": None}
        assert r["skipped"] == {"tensorwise": "not available on cpu", "rowwise": "not available on cpu"}
    # the technique reads such a table, and converts nothing where FP8 was not measured
    path = tmp_path / "fp8_table_cpu.json"
    path.write_text(json.dumps({"gpu": "cpu", "rows": rows}))
    plan = fp8_plan(read_table(path), [("fc", 32, 48), ("proj", 48, 32)], 64, "tensorwise")
    assert plan.convert == [] and plan.reasons["fc"] == "(64, 32, 48): tensorwise not measured"


def test_the_table_of_a_gpu_is_named_by_its_slug():
    assert table_path("NVIDIA H200").name == "fp8_table_h200.json"
    assert table_path("NVIDIA H100 80GB HBM3").name == "fp8_table_h100_80gb_hbm3.json"


def test_without_cuda_main_says_what_it_needs_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(fp8_table, "_torchao_from_wheels", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fp8_table.main([]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "needs a CUDA GPU" in out and "torchao" in out


def test_smoke_runs_on_a_cpu():
    p = subprocess.run([sys.executable, "benchmarks/fp8_table.py", "--smoke"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "toy_fc" in p.stdout and "bf16" in p.stdout and "not available on cpu" in p.stdout
