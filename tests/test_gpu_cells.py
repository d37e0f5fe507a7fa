"""The technique notebooks' GPU cell (accellib/course/gpu_cell.py, issue 45): its code path on the CPU with a tiny
config (the device forced to the CPU, a few steps), the realized speed-up, what it prints without CUDA (read from
the committed GPU record), the one GPU cell of each technique notebook 01-08, and that the benchmarks time with the
same code."""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from accellib.course import gpu_cell

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model.n_layer=2", "--model.d_model=32", "--model.n_head=2", "--model.seq_len=32", "--train.batch_size=4",
        "--train.threads=1"]


def printed(fn, *a, **k):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        out = fn(*a, **k)
    return out, buf.getvalue()


def test_gpu_speed_runs_on_the_cpu_and_measures_every_arm():
    arms = {"baseline": [], "pld@0.5": ["--pld.enabled=true", "--pld.theta_bar=0.5", "--pld.gamma=1000"],
            "layered": ["--layered_accumulation.enabled=true", "--train.grad_accum=2"],
            "standard": ["--layered_accumulation.enabled=true", "--layered_accumulation.order=standard",
                         "--train.grad_accum=2"]}
    res = gpu_cell.gpu_speed("configs/tiny.yaml", arms, base={"pld@0.5": "baseline", "layered": "standard"},
                             warmup=1, steps=3, device="cpu", scale=TINY)
    assert res["device"] == "cpu" and "perf_counter" in res["timer"] and list(res["arms"]) == list(arms)
    for name, r in res["arms"].items():
        assert r["timed_steps"] == 3 and len(r["step_s"]) == 3 and r["warmup_steps"] == 1, name
        assert r["tok_per_s"] > 0 and r["mean_step_s"] > 0 and r["flops_per_step"] > 0, name
        assert r["tok_per_s"] == pytest.approx(r["tokens_per_step"] / r["mean_step_s"], rel=1e-3), name
        assert r["precision"] == "fp32" and r["overrides"] == arms[name]
    assert res["arms"]["layered"]["tokens_per_step"] == 2 * res["arms"]["baseline"]["tokens_per_step"]   # grad_accum 2
    # PLD saves FLOPs: the realized speed-up; layered vs standard order: the same FLOPs, the plain time ratio
    pld, lay = res["vs"]["pld@0.5"], res["vs"]["layered"]
    assert pld["base"] == "baseline" and pld["flops_saving"] > 0.1 and pld["realized"] is not None
    assert lay["base"] == "standard" and abs(lay["flops_saving"]) < 1e-6 and lay["realized"] is None
    assert set(res["vs"]) == {"pld@0.5", "layered"}
    _, text = printed(gpu_cell.show, res)
    lines = text.splitlines()
    assert len(lines) == 1 + len(arms) and "tok/s" in lines[1]
    assert "realized speed-up" in lines[2] and "the time ratio" in lines[3]


def test_realized_speedup_is_time_saving_over_flops_saving():
    r = gpu_cell.realized(dict(mean_step_s=0.8, flops_per_step=75.0), dict(mean_step_s=1.0, flops_per_step=100.0))
    assert r == dict(speedup=1.25, flops_saving=0.25, time_saving=0.2, realized=0.8)
    same = gpu_cell.realized(dict(mean_step_s=1.25, flops_per_step=100.0), dict(mean_step_s=1.0, flops_per_step=100.0))
    assert same["realized"] is None and same["speedup"] == 0.8
    assert gpu_cell.realized({}, dict(mean_step_s=1.0)) is None


def test_without_cuda_the_cell_quotes_the_committed_record(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    parts = json.loads((ROOT / gpu_cell.RECORD).read_text())["parts"]
    _, text = printed(gpu_cell.run, "SL's overhead", "configs/tutorial.yaml", {"a": [], "b": []},
                      record="standardization_loss", notebook="08")
    sl, base = parts["point:standardization_loss"], parts["point:baseline"]
    assert text.count("\n") == 2 and text.startswith("No CUDA device here") and gpu_cell.RECORD in text
    assert f"{sl['tok_per_s'] / base['tok_per_s']:.2f}x its speed." in text and f"{base['tok_per_s']:,.0f}" in text
    _, text = printed(gpu_cell.run, "x", "configs/tutorial.yaml", {"a": []}, record="ouroboros", notebook="06")
    nb = json.loads((ROOT / gpu_cell.NOTEBOOKS_RECORD).read_text())["notebooks"]["06_ouroboros.ipynb"]
    assert "has no ouroboros point" in text and f"{nb['seconds']:.0f} s" in text and gpu_cell.NOTEBOOKS_RECORD in text
    assert f"at most {nb['cuda_max_allocated_mb']:,.0f} MB of GPU memory" in text and "before it had" not in text


def test_the_gpu_check_times_with_the_same_code():
    # benchmarks/gpu imports StepTimer, graphs and realized from accellib (one copy, no duplicate)
    for f, names in (("timing.py", ("StepTimer", "graphs")), ("points.py", ("realized",))):
        src = (ROOT / "benchmarks" / "gpu" / f).read_text()
        assert "from accellib.course.gpu_cell import" in src, f
        assert not any(f"def {n}(" in src or f"class {n}" in src for n in names), f


def test_without_cuda_the_record_s_savings_and_stages_are_quoted():
    # 01-03 quote their technique's point (a negative realized speed-up reads only beside the two savings it
    # divides), 04 the V-cycle's half-size level against its full-size one and the predicted whole run, 07 says
    # that no Linear converted to FP8 (the point then times bf16 against bf16)
    rec = json.loads((ROOT / gpu_cell.RECORD).read_text())
    parts, base = rec["parts"], rec["parts"]["point:baseline"]
    for technique, point, nb in (("pld", "pld@0.5", "01"), ("sbld", "sbld@0.5", "02"), ("random_ltd", "random_ltd@1/2", "03")):
        text, p = gpu_cell.skip("x", technique, nb), parts[f"point:{point}"]
        rs = p["vs_baseline"]
        assert f"): {point} {p['tok_per_s']:,.0f} tok/s against the baseline's {base['tok_per_s']:,.0f}, " in text
        assert (f"{p['tok_per_s'] / base['tok_per_s']:.2f}x its speed, realized speed-up {rs['realized']:.2f} "
                f"(time saving {rs['time_saving']:+.1%} / FLOPs saving {rs['flops_saving']:+.1%})") in text
        assert text.count("\n") == 1
    assert parts["point:random_ltd@1/2"]["vs_baseline"]["realized"] < 0      # the case the two savings are for
    text = gpu_cell.skip("x", "multilevel", "04")
    lv, whole = parts["vcycle"]["levels"], parts["predict"]["configs"]["multilevel"]
    assert (f"the V-cycle's half-size level (6 x 384) {lv['1']['tok_per_s']:,.0f} tok/s against the full-size level's "
            f"(12 x 768) {lv['0']['tok_per_s']:,.0f}, {lv['1']['tok_per_s'] / lv['0']['tok_per_s']:.2f}x its speed; "
            f"the predicted whole run ({whole['config']}) realized speed-up {whole['realized']:.2f}") in text
    text = gpu_cell.skip("x", "lowp_fp8", "07")
    assert parts["point:lowp_fp8"]["fp8"]["fp8_layers"].startswith("0/")
    assert f"FP8 Linears {parts['point:lowp_fp8']['fp8']['fp8_layers']}: none converted" in text


def test_the_old_check_s_arms_are_still_quoted(tmp_path, monkeypatch):
    """The earlier record's format (issue 34's `arms`): an arm, its stages, and the FLOPs an arm added."""
    (tmp_path / "results").mkdir()
    (tmp_path / gpu_cell.RECORD).write_text((ROOT / "results" / "gpu_check_h200_2026-11-27.json").read_text())
    (tmp_path / gpu_cell.NOTEBOOKS_RECORD).write_text((ROOT / gpu_cell.NOTEBOOKS_RECORD).read_text())
    arms = json.loads((tmp_path / gpu_cell.RECORD).read_text())["arms"]
    text = gpu_cell.skip("x", "random_ltd", "03", root=tmp_path)
    rs = arms["random_ltd"]["realized_speedup"]
    assert f"): random_ltd {arms['random_ltd']['tok_per_s']:,.0f} tok/s" in text
    assert f"realized speed-up {rs['realized']:.2f} (time saving {rs['time_saving']:+.1%} / FLOPs saving " in text
    text = gpu_cell.skip("x", "sbld", "02", root=tmp_path)
    assert "realized" not in text and f"with {-arms['sbld']['realized_speedup']['flops_saving']:+.1%} FLOPs per step" in text
    text = gpu_cell.skip("x", "multilevel", "04", root=tmp_path)
    assert "per stage " + " / ".join(f"{v['tok_per_s']:,.0f}" for _, v in sorted(arms["multilevel"]["stages"].items())) in text


TECHNIQUE_NOTEBOOKS = [p for p in sorted((ROOT / "notebooks").glob("0[1-8]_*.ipynb"))]
# the CUDA branch forced onto the CPU: the cell's own GPU config (its depth and sequence length: random-LTD's kept
# length and the V-cycle's half-size stage are set against them) at a width and batch a CPU runs in a second
CELL_ON_CPU = [*gpu_cell.GPU_SCALE, "--model.d_model=32", "--model.n_head=2", "--train.batch_size=2", "--train.threads=1"]


@pytest.mark.parametrize("nb", TECHNIQUE_NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_notebook_has_one_gpu_cell_that_without_cuda_says_so(nb, monkeypatch):
    """One code cell starting '# GPU:', with one markdown line above it saying what it measures; the notebook as
    committed (executed without CUDA) shows its message, and run alone without CUDA it prints the same two lines."""
    import torch
    cells = json.loads(nb.read_text())["cells"]
    gpu = [k for k, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).startswith("# GPU:")]
    assert len(gpu) == 1, f"{nb.name}: {len(gpu)} GPU cells"
    cell, above = cells[gpu[0]], cells[gpu[0] - 1]
    src = "".join(cell["source"])
    assert "gpu_cell" in src and "NBVAL_IGNORE_OUTPUT" not in src         # its no-CUDA message is compared by nbval
    assert above["cell_type"] == "markdown" and "\n" not in "".join(above["source"]).strip()
    stored = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    assert stored.startswith("No CUDA device here") and stored.count("\n") == 2 and gpu_cell.RECORD in stored
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, text = printed(exec, compile(src, nb.name, "exec"), {"__name__": "__gpu_cell__"})
    assert text == stored
    gpu_cells = [k for k, c in enumerate(cells) if c["cell_type"] == "code"
                 and re.search(r"gpu_cell\.(run|gpu_speed|show|skip)\(", "".join(c["source"]))]
    assert gpu_cells == gpu           # the GPU runs stay in their one cell (a later cell may read the record: recorded)


@pytest.mark.parametrize("nb", TECHNIQUE_NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_gpu_cell_runs_its_arms_with_cuda_pretended_and_the_device_forced_to_the_cpu(nb, monkeypatch):
    """The cell's CUDA branch, as a GPU would run it, on the CPU: its configs build and train (tiny, one timed step)."""
    cells = json.loads(nb.read_text())["cells"]
    src = next("".join(c["source"]) for c in cells if c["cell_type"] == "code" and "".join(c["source"]).startswith("# GPU:"))
    real, calls = gpu_cell.gpu_speed, []

    def on_cpu(config, arms, **kw):
        calls.append(list(arms))
        kw.update(device="cpu", warmup=1, steps=1,
                  scale=CELL_ON_CPU if kw.get("scale") is None else [*kw["scale"], "--train.threads=1"])
        return real(config, arms, **kw)
    monkeypatch.setattr(gpu_cell, "cuda", lambda: True)
    monkeypatch.setattr(gpu_cell, "gpu_speed", on_cpu)
    _, text = printed(exec, compile(src, nb.name, "exec"), {"__name__": "__gpu_cell__"})
    assert calls and "No CUDA" not in text
    assert sum(line.count("tok/s") for line in text.splitlines()) == sum(len(c) for c in calls)
    assert "x " in text and "'s speed" in text                      # each technique against its base
