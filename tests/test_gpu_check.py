"""The GPU check's promises, checked on a CPU (issues 34 and 42): one smoke run exercises every part and writes each
into a whole JSON; the prediction arithmetic is right on synthetic numbers; the targets are judged from the record
(never in a smoke run); a kill at any moment leaves a whole JSON; "no torch" is told from "no GPU"; a deadline
skips parts and says which, and its alarm stops a running part; the wheels it carries install into a temporary
folder; accellib's minimum torch is declared once and checked. No test here is timed: the smoke run's numbers
are only checked to be there and finite."""
from __future__ import annotations

import json
import math
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
from gpu import predict, targets, verify  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable)
SMOKE = [sys.executable, "benchmarks/gpu_check.py", "--smoke"]
POINTS = ("baseline", "pld@0.5", "pld@0.75", "sbld@0.5", "random_ltd@1/8", "random_ltd@1/4", "random_ltd@1/2",
          "random_ltd@3/4", "standardization_loss")
CPU_PARTS = ("environment", "matmul_peak", "trainer_vs_plain", *(f"point:{p}" for p in POINTS), "vcycle", "profile",
             "shapes:random_ltd", "predict", "check:pld", "check:random_ltd")


def run(cmd: list[str], env=None, timeout: int = 540) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of the whole check on this CPU: (process, JSON, its text)."""
    out = tmp_path_factory.mktemp("gc") / "smoke.json"
    # a deadline near pytest's limits: on a loaded machine the default 420 s could skip parts (as it should)
    p = run(SMOKE + ["--deadline", "540", "--out", str(out)], timeout=590)
    return p, json.loads(out.read_text()), out.read_text()


def test_the_smoke_run_exercises_every_part_and_writes_it(smoke):
    p, rec, text = smoke
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert rec["finished"] and rec["smoke"] and rec["device"] == "cpu" and rec["git_commit"]
    assert rec["check"] == targets.CHECK and "<path>" in rec["command"] and str(ROOT) not in text  # no machine paths
    for name in CPU_PARTS:
        assert rec["parts"].get(name, {}).get("status") == "done", (name, rec["parts"].get(name), rec["skipped"].get(name))
    # FP8 needs a GPU: skipped in one line each, not failed
    for name in ("point:lowp_fp8", "fp8_table"):
        assert name in rec["skipped"] and "\n" not in rec["skipped"][name], name
    assert set(rec["parts"]) | set(rec["skipped"]) == set(CPU_PARTS) | {"point:lowp_fp8", "fp8_table"}
    assert not (ROOT / "results" / "gpu_check_cpu.json").exists()


def test_every_point_has_per_step_times_compiles_apart_and_its_realized_speedup(smoke):
    _, rec, _ = smoke
    parts = rec["parts"]
    for name in POINTS:
        pt = parts[f"point:{name}"]
        assert len(pt["step_s"]) == pt["timed_steps"] == pt["planned_steps"] and not pt["cut_by_deadline"], name
        assert all(s > 0 for s in pt["step_s"]) and math.isclose(pt["mean_step_s"], sum(pt["step_s"]) / len(pt["step_s"]), rel_tol=1e-3)
        assert pt["warmup_steps"] >= 1 and pt["compile_s"] >= 0 and pt["build"]["seconds"] > 0, name
        assert set(pt["graphs"]) == {"warmup", "timed"} and pt["graphs"]["timed"] == 0, (name, pt["graphs"])
        assert "perf_counter" in pt["timer"] and pt["sync_calls"]["per_step"] is None
        assert "not applicable on CPU" in pt["sync_calls"]["note"]
        assert math.isfinite(pt["final_train_loss"]) and pt["flops_per_step"] > 0, name
        if name != "baseline":
            assert set(pt["vs_baseline"]) == {"speedup", "flops_saving", "time_saving", "realized"}, name
    # the schedules stood still at their points
    assert parts["point:pld@0.5"]["theta_measured"] == 0.5 and parts["point:sbld@0.5"]["theta_measured"] == 0.5
    S = rec["check_model"]["seq_len"]
    assert [parts[f"point:random_ltd@{f}"]["kept_len"] for f in ("1/8", "1/4", "1/2", "3/4")] == [S // 8, S // 4, S // 2, 3 * S // 4]
    # dropping work does what its FLOPs say: fewer FLOPs per step at every dropping point
    for name in POINTS[1:-1]:
        assert parts[f"point:{name}"]["flops_per_step"] < parts["point:baseline"]["flops_per_step"], name
    one = parts["point:sbld@0.5"]["one_off"]
    assert one["profile_s"] > 0 and one["profile_graphs"] == 0   # the profile builds no graph
    v = parts["vcycle"]
    assert set(v["levels"]) == {"0", "1"} and v["levels"]["1"]["model"]["d_model"] == v["levels"]["0"]["model"]["d_model"] // 2
    assert v["one_off"]["coalesce_s"] > 0 and [s["level"] for s in v["stages"]] == [0, 1, 0]


def test_loops_run_in_their_own_processes_with_the_host_probe(smoke):
    _, rec, _ = smoke
    tvp = rec["parts"]["trainer_vs_plain"]
    assert {"plain", "accellib", "plain+compile", "accellib+compile"} <= set(tvp["loops"])
    for name, loop in tvp["loops"].items():
        assert loop["main"]["step_s"] > 0 and loop["host"]["step_s"] > 0, name
        assert loop["main"]["graphs_timed"] == 0, name
    for r in ("accellib / plain", "accellib+compile / plain+compile"):
        assert 0 < tvp["ratios"][r] < 10 and 0 < tvp["host_probe"]["ratios"][r] < 10
    assert tvp["host_probe"]["batch"] == 1 and "own process" in tvp["method"]
    prof = rec["parts"]["profile"]
    assert prof["schedule"]["active"] == len(prof["active_step_s"]) and prof["busy_share"] is None
    assert prof["top"] and prof["event_s"] > 0


def test_the_prediction_and_its_check_are_in_the_record(smoke):
    _, rec, _ = smoke
    pred = rec["parts"]["predict"]["configs"]
    assert set(pred) == {"pld", "sbld", "random_ltd", "multilevel"}
    for tech, p in pred.items():
        assert p["predicted_s"] > 0 and p["baseline_s"] > 0 and p["flops_saving"] > 0, tech
        assert math.isclose(p["time_saving"], 1 - p["predicted_s"] / p["baseline_s"], abs_tol=2e-4), tech
    assert pred["sbld"]["one_off_s"]["profiles"] > 0 and pred["multilevel"]["one_off_s"]["transitions"] > 0
    for tech in ("pld", "random_ltd"):
        ch = rec["parts"][f"check:{tech}"]
        assert ch["timed_steps"] == ch["steps"] - ch["warmup_steps"] == len(ch["measured_step_s"])
        assert math.isclose(ch["ratio"], ch["measured_s"] / ch["predicted_s"], rel_tol=1e-3)
        assert ch["within"] is None                                   # a smoke run judges no CPU number
    coords = rec["parts"]["check:pld"]["coordinates"]
    assert coords == sorted(coords, reverse=True) and coords[0] < 1      # theta falls during the short run
    assert len(set(rec["parts"]["check:random_ltd"]["coordinates"])) > 1  # the kept length moves


def test_every_target_is_given_and_a_smoke_run_judges_none(smoke):
    p, rec, _ = smoke
    assert [v["key"] for v in rec["verdicts"]] == [t[0] for t in targets.TARGETS]
    assert all(v["passed"] is None for v in rec["verdicts"])
    measured = [v for v in rec["verdicts"] if isinstance(v["measured"], (int, float))]
    assert len(measured) >= 10 and all("CPU" in v["smoke"] for v in measured)
    assert re.search(r"^\s+SMOKE\s+tokens/s of the trainer", p.stdout, re.M)
    assert "PASS" not in p.stdout and "MISSED" not in p.stdout


def test_the_plan_fits_the_deadline_by_its_own_accounting(smoke):
    p, rec, _ = smoke
    plan = rec["plan"]
    assert plan["parts"] and "estimate" in plan["note"]
    assert plan["planned_total_s"] <= plan["budget_s"] + 1e-6
    assert plan["elapsed_at_plan_s"] + plan["budget_s"] <= rec["deadline_s"] - rec["margin_s"] + 0.2
    cum = [q["cumulative_s"] for q in plan["parts"]]
    assert cum == sorted(cum) and abs(cum[-1] - plan["planned_total_s"]) < 0.2
    assert "ESTIMATES" in p.stdout and p.stdout.index("gpu_check plan") < p.stdout.index("] matmul_peak")
    assert rec["elapsed_s"] <= rec["deadline_s"]
    for q in plan["parts"]:
        assert q["part"] in rec["parts"] or q["part"] in rec["skipped"], q["part"]


# ----------------------------------------------------------------------------- the arithmetic, on synthetic numbers
class FakeRecord:
    def __init__(self, parts: dict, smoke=False):
        self.data = dict(parts={k: dict(v, status="done") for k, v in parts.items()}, smoke=smoke,
                         check_model=dict(kind="gpt", n_layer=12, d_model=768, seq_len=1024))

    def done(self, name):
        return self.data["parts"].get(name)


def test_interpolation_is_piecewise_linear_and_extends_beyond_the_points():
    pts = [(1.0, 10.0), (0.5, 6.0), (0.75, 7.0)]
    assert predict.interp(pts, 0.5) == 6.0 and predict.interp(pts, 1.0) == 10.0
    assert predict.interp(pts, 0.625) == pytest.approx(6.5) and predict.interp(pts, 0.875) == pytest.approx(8.5)
    assert predict.interp(pts, 0.25) == pytest.approx(5.0)           # the end segment, extended
    assert predict.interp([(3.0, 2.0)], 7.0) == 2.0
    secs, flops = predict.integrate([0.5, 0.5, 1.0], pts, [(0.5, 1.0), (1.0, 2.0)])
    assert secs == pytest.approx(22.0) and flops == pytest.approx(4.0)


def test_pld_whole_run_is_the_integral_of_its_schedule_over_the_points():
    """configs/pld_gpt2_medium_owt.yaml: theta(t) = 0.5 + 0.5 e^(-0.001 t) over 100K steps, grad_accum 8. Points: the
    baseline 1 s per step at 100 FLOPs, theta 0.5 at 0.6 s and 50 FLOPs: t(theta(t)) = 0.6 + 0.4 e^(-0.001 t),
    whose sum is 0.6 T + 0.4 (1 - e^-100) / (1 - e^-0.001)."""
    rec = FakeRecord({"point:baseline": dict(mean_step_s=1.0, flops_per_step=100.0, compile_s=5.0),
                      "point:pld@0.5": dict(x=0.5, mean_step_s=0.6, flops_per_step=50.0, compile_s=7.0)})
    p = predict.predict_config(rec, "pld", 1024)
    T, g = 100_000, 0.001
    geo = (1 - math.exp(-g * T)) / (1 - math.exp(-g))
    steps = 0.6 * T + 0.4 * geo
    assert p["predicted_s"] == pytest.approx(8 * steps + 7.0, abs=0.1)
    assert p["baseline_s"] == pytest.approx(8 * T * 1.0 + 5.0, abs=0.1)
    flops = 50 * T + 50 * geo
    assert p["flops_saving"] == pytest.approx(1 - flops / (100 * T), abs=1e-4)
    assert p["time_saving"] == pytest.approx(1 - (8 * steps + 7) / (8 * T + 5), abs=1e-4)
    assert p["realized"] == pytest.approx(p["time_saving"] / p["flops_saving"], abs=1e-3)
    assert p["notes"] and "24" in p["notes"][0]    # GPT-2 medium's schedule on the measured model, said


def test_sbld_waits_for_its_profile_and_charges_it():
    from accellib.core.config import load_config
    cfg = load_config(ROOT / "configs/pld_gpt2_medium_owt.yaml", predict.FULL_SCALE["sbld"][1])
    xs, n = predict.sbld_schedule(cfg)
    assert n == 1 and xs[:2000] == [1.0] * 2000 and xs[2000] == 1.0 and xs[2001] < 1.0   # W = 2% of 100K
    rec = FakeRecord({"point:baseline": dict(mean_step_s=1.0, flops_per_step=100.0, compile_s=0.0),
                      "point:sbld@0.5": dict(x=0.5, mean_step_s=0.5, flops_per_step=50.0, compile_s=0.0,
                                             one_off=dict(profile_s=30.0))})
    p = predict.predict_config(rec, "sbld", 1024)
    assert p["one_off_s"]["profiles"] == 30.0
    expected = 8 * sum(0.5 + 0.5 * (x - 0.5) / 0.5 for x in xs) + 30.0
    assert p["predicted_s"] == pytest.approx(expected, abs=0.5)


def test_random_ltd_runs_to_its_layer_token_budget_and_pays_each_new_length():
    from accellib.core.config import load_config
    cfg = load_config(ROOT / "configs/random_ltd_gpt2_small_owt.yaml")
    xs = predict.ltd_schedule(cfg)
    L, S, budget = 12, 1024, 66667 * 12 * 1024
    used = [2 * S + 10 * r for r in xs]
    assert sum(used) >= budget > sum(used[:-1])                    # it stops at the budget, not at train.steps
    assert xs[0] == 128 and xs[-1] == 1024 and all(r % 16 == 0 for r in xs)
    rec = FakeRecord({"point:baseline": dict(mean_step_s=1.0, flops_per_step=100.0, compile_s=0.0),
                      "point:random_ltd@1/8": dict(x=128, mean_step_s=0.5, flops_per_step=40.0, compile_s=0.0),
                      "shapes:random_ltd": dict(per_new_length_s=0.25)})
    p = predict.predict_config(rec, "random_ltd", 1024)
    steady = sum(0.5 + 0.5 * (r - 128) / (1024 - 128) for r in xs)
    assert p["one_off_s"]["new_lengths"] == pytest.approx(0.25 * len(set(xs)))
    assert p["predicted_s"] == pytest.approx(4 * steady + 0.25 * len(set(xs)), abs=0.5)
    assert p["baseline_steps"] == 100_000 and p["notes"] == []     # the measured model is the config's


def test_the_vcycle_is_the_sum_of_its_stages_plus_transitions():
    lv = lambda s, f: dict(mean_step_s=s, flops_per_step=f, compile_s=1.0)  # noqa: E731
    rec = FakeRecord({"point:baseline": dict(mean_step_s=9.0, flops_per_step=9.0),
                      "vcycle": dict(levels={"0": lv(1.0, 100.0), "1": lv(0.3, 25.0)}, one_off=dict(coalesce_s=2.0))})
    p = predict.predict_config(rec, "multilevel", 1024)
    # 10K + 50K + 50K steps of levels 0, 1, 0, grad_accum 2; the baseline is level 0 for 100K steps
    assert p["predicted_s"] == pytest.approx(2 * (60_000 * 1.0 + 50_000 * 0.3) + 3.0 + 2.0)
    assert p["baseline_s"] == pytest.approx(2 * 100_000 * 1.0 + 1.0)
    assert p["flops_saving"] == pytest.approx(1 - (60_000 * 100 + 50_000 * 25) / (100_000 * 100))


def test_the_short_run_check_adds_a_cost_per_length_not_run_before():
    class C:
        sc = dict(seq_len=64)
        rec = FakeRecord({"point:baseline": dict(mean_step_s=1.0, flops_per_step=1.0),
                          "point:random_ltd@1/2": dict(x=32, mean_step_s=0.6, flops_per_step=0.5),
                          "shapes:random_ltd": dict(per_new_length_s=0.1)})
    steps, new = verify.predicted_steps(C, "random_ltd", [32, 48, 48, 64], seen={32})
    assert new == 1 and steps == pytest.approx([0.6, 0.8 + 0.1, 0.8, 1.0])


def test_targets_are_judged_only_outside_a_smoke_run_and_a_miss_says_by_how_much():
    parts = {"point:pld@0.5": dict(vs_baseline=dict(realized=0.80)),
             "point:random_ltd@1/2": dict(vs_baseline=dict(realized=0.9)),
             "check:pld": dict(ratio=1.04)}
    rec = dict(parts={k: dict(v, status="done") for k, v in parts.items()}, smoke=False)
    v = {r["key"]: r for r in targets.judge(rec)}
    assert v["pld@0.5"]["passed"] is False and v["pld@0.5"]["missed_by"] == pytest.approx(0.05)
    assert v["random_ltd@1/2"]["passed"] is True and v["prediction:pld"]["passed"] is True
    assert v["mfu"]["passed"] is None and v["mfu"]["measured"] is None           # not measured: not judged
    rec["smoke"] = True
    v = {r["key"]: r for r in targets.judge(rec)}
    assert v["pld@0.5"]["passed"] is None and "smoke" in v["pld@0.5"] and "smoke_meets" not in v["pld@0.5"]


def test_fp8_is_not_judged_when_no_linear_converted():
    """With no FP8 table for the GPU, lowp converts nothing and its point times bf16 against bf16 (about 1.0x): that
    must not read as FP8 meeting its target."""
    point = dict(status="done", fp8=dict(fp8_layers="0/49"), vs_baseline=dict(speedup=1.0))
    v = {r["key"]: r for r in targets.judge(dict(parts={"point:lowp_fp8": point}, smoke=False))}
    assert v["lowp_fp8"]["passed"] is None and "FP8 not measured" in v["lowp_fp8"]["measured"]
    point["fp8"]["fp8_layers"] = "12/49"
    v = {r["key"]: r for r in targets.judge(dict(parts={"point:lowp_fp8": point}, smoke=False))}
    assert v["lowp_fp8"]["passed"] is True and v["lowp_fp8"]["measured"] == 1.0


def test_the_findings_gpu_cells_come_only_from_a_gpu_record_of_this_check():
    from accellib.analysis.results import GPU_CHECK, GPU_POINTS, gpu_cells, gpu_heading
    assert GPU_CHECK == targets.CHECK                     # accellib knows this check by the name it writes
    old = json.loads((ROOT / "results" / "gpu_check_h200_2026-11-27.json").read_text())
    assert set(gpu_cells(old).values()) == {"not measured"} and gpu_heading(old) == "GPU"   # the old check's record
    rec = dict(check=targets.CHECK, smoke=False, finished=True, parts={
        "point:pld@0.5": dict(status="done", vs_baseline=dict(realized=0.91)),
        "predict": dict(status="done", configs=dict(pld=dict(time_saving=0.12, config="configs/pld_gpt2_medium_owt.yaml")))})
    cells = gpu_cells(rec)
    assert cells["pld"] == "0.91 at 0.5; -12%" and cells["sbld"] == "not measured"
    assert set(gpu_cells(dict(rec, smoke=True)).values()) == {"not measured"}
    # the committed record is this check's: each technique's cell is its point's realized speed-up and its config's
    # predicted whole-run time change, recomputed here (the findings tables' tests compare the tables with the pages)
    new = json.loads((ROOT / "results" / "gpu_check_h200.json").read_text())
    assert new["check"] == targets.CHECK and new["smoke"] is False and new["finished"] is True
    assert gpu_heading(new) != "GPU"
    cells, pred = gpu_cells(new), new["parts"]["predict"]["configs"]
    for arm, key in GPU_POINTS.items():
        real = new["parts"][f"point:{key}"]["vs_baseline"]["realized"] if key else None
        at = "—" if real is None else f"{real:.2f} at {key.split('@')[1]}"
        assert cells[arm] == f"{at}; {-100 * pred[arm]['time_saving']:+.0f}%", arm
    assert cells["random_ltd"].startswith("-") and cells["multilevel"].startswith("—")   # slower; no fixed point


def test_make_plan_leaves_out_what_does_not_fit_and_keeps_later_parts_that_do():
    planned, left = gpu_check.make_plan([("a", 30), ("b", 50), ("c", 10), ("d", 25)], 60)
    assert [n for n, _, _ in planned] == ["a", "c"] and [n for n, _ in left] == ["b", "d"]
    assert planned[-1][2] == 40 <= 60


# ----------------------------------------------------------------------------- the deadline, a kill, the refusals
def test_a_deadline_skips_the_parts_and_says_which(tmp_path):
    """A 1-second deadline: the environment is recorded (it always is), every other part is skipped, by name,
    on the console and in the JSON, and the exit status is 0."""
    out = tmp_path / "late.json"
    p = run(SMOKE + ["--deadline", "1", "--out", str(out)], timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["finished"] and list(rec["parts"]) == ["environment"]
    for name in ("point:baseline", "matmul_peak", "trainer_vs_plain", "point:pld@0.5", "vcycle", "predict",
                 "check:random_ltd"):
        assert name in rec["skipped"], name
        assert re.search(rf"^gpu_check: skipped {re.escape(name)}: ", p.stdout, re.M), name
    # (on a loaded machine the environment part itself can outlast the 1 s: then the deadline came during it)
    assert re.search(r"0 s left|the deadline came during an earlier part", rec["skipped"]["point:baseline"])
    assert all(v["passed"] is None for v in rec["verdicts"])


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
    assert set(env["features"]) == {"compile_model", "one_off", "sbld_profile_one_off", "random_ltd_attention", "fp8_table"}


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
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()   # AVX512 / AVX2 / DEFAULT: which kernels ran


def test_the_docs_state_the_h200_record_as_it_is():
    """docs/full_scale.md's GPU-check tables are gpu_verdicts_table, gpu_table and gpu_predict_table of the committed
    record of the reworked check, and every number its prose and the README quote is recomputed from that record;
    the trainer-against-plain-loop numbers are the earlier record's (the old check, an older tree), said so and
    recomputed from that file. The notebook record: every cell of every notebook ran, the GPU cells of 01-08 allocated
    GPU memory, 00 and 09 none, and the clone-and-install path passed (as the docs say)."""
    from accellib.analysis.results import gpu_predict_table, gpu_table, gpu_verdicts_table
    docs = (ROOT / "docs" / "full_scale.md").read_text()
    flat = " ".join(docs.split())                       # the prose wraps: compared with its whitespace collapsed
    rec = json.loads((ROOT / "results" / "gpu_check_h200.json").read_text())
    assert rec["check"] == targets.CHECK and rec["smoke"] is False and rec["finished"] is True
    for table in (gpu_verdicts_table(rec), gpu_table(rec), gpu_predict_table(rec)):
        assert table in docs
    parts, v = rec["parts"], {r["key"]: r for r in rec["verdicts"]}
    assert v == {r["key"]: r for r in targets.judge(rec)}                    # the verdicts are the targets' own
    goal = lambda k: v[k]["target"].split()[-1]                               # noqa: E731  ('>= 0.85' -> '0.85')
    vs = lambda p: parts[f"point:{p}"]["vs_baseline"]                        # noqa: E731
    points = [p for n, p in parts.items() if n.startswith("point:")]
    base, sync = parts["point:baseline"], v["sync_calls"]["measured"]
    said = [f"({rec['started'][:10]}, one {rec['device']}, torch {parts['environment']['torch']}, tree "
            f"`{rec['tree_commit']}`, a {rec['deadline_s']:.0f} s deadline of which it used {rec['elapsed_s']:.0f} s, "
            "run with `--skip trainer_vs_plain`: `results/gpu_check_h200.json`",
            f"then {points[0]['timed_steps']} steps between CUDA events",
            f"Met: PLD at θ 0.5 turned {v['pld@0.5']['measured']:.2f} of its FLOPs saving into time saving and SBLD at "
            f"θ 0.5 {v['sbld@0.5']['measured']:.2f} (target {goal('pld@0.5')})",
            f"the standardization loss kept {v['standardization_loss']['measured']:.3f} of the baseline's tokens/s "
            f"(target {goal('standardization_loss')}); no point compiled a graph in its timed steps",
            f"random-LTD's realized speed-up is negative, {v['random_ltd@1/2']['measured']:.2f} at kept length 1/2 and "
            f"{v['random_ltd@1/8']['measured']:.2f} at 1/8 (targets {goal('random_ltd@1/2')} and "
            f"{goal('random_ltd@1/8')}): its steps were slower than the baseline's "
            f"({vs('random_ltd@1/2')['speedup']:.2f}x and {vs('random_ltd@1/8')['speedup']:.2f}x its speed) although "
            f"they do {100 * vs('random_ltd@1/2')['flops_saving']:.1f}% and "
            f"{100 * vs('random_ltd@1/8')['flops_saving']:.1f}% fewer FLOPs",
            f"The V-cycle's predicted whole run realized {v['vcycle']['measured']:.2f} of its FLOPs saving "
            f"(target {goal('vcycle')})",
            f"The check counted {sync:.3f} synchronizing calls per step, one every {round(1 / sync)} steps (target "
            "none), all in the baseline point; the one message counted there is the sync debug mode's own notice",
            f"The baseline point (the trainer with `train.compile=blocks`) ran {1e3 * base['mean_step_s']:.2f} ms per "
            f"step, {100 * base['mfu']['datasheet']:.1f}% of the data sheet's bf16 peak (the card's own matmul peak "
            f"was {100 * parts['matmul_peak']['best_over_datasheet']:.1f}% of it)",
            f"(the H200 record: {rec['elapsed_s']:.0f} s of a {rec['deadline_s']:.0f} s deadline"]
    for s in said:
        assert s in flat, s
    # what the prose calls met, missed and not measured is what the record judged
    assert all(v[k]["passed"] is True for k in ("pld@0.5", "sbld@0.5", "standardization_loss", "graphs_timed"))
    assert all(v[k]["passed"] is False for k in ("random_ltd@1/2", "random_ltd@1/8", "vcycle", "sync_calls"))
    assert all(v[k]["measured"] < 0 and vs(k)["speedup"] < 1 for k in ("random_ltd@1/2", "random_ltd@1/8"))
    assert all(v[k]["passed"] is None for k in ("trainer_vs_plain", "trainer_vs_plain_model", "mfu", "lowp_fp8",
                                                "prediction:pld", "prediction:random_ltd"))
    assert "--skip" in rec["skipped"]["trainer_vs_plain"] and all(p["timed_steps"] == points[0]["timed_steps"]
                                                                   for p in points)
    assert all("deadline" in rec["skipped"][p] for p in ("point:pld@0.75", "point:random_ltd@1/4",
                                                         "point:random_ltd@3/4", "check:pld", "check:random_ltd"))
    assert parts["point:lowp_fp8"]["fp8"]["fp8_layers"].startswith("0/") and "Not measured: FP8" in flat
    # the one synchronizing 'call' is torch's once-per-process notice, in the first point counted; the others have none
    assert base["sync_calls"]["per_step"] * base["sync_calls"]["steps"] == pytest.approx(1, abs=0.01)
    assert [m.startswith("Synchronization debug mode is a prototype feature") for m in base["sync_calls"]["first"]] == [True]
    assert all(p["sync_calls"]["per_step"] == 0 for p in points if p is not base)
    # the trainer against a plain loop and its MFU: the earlier record, the old check on an older tree
    old = json.loads((ROOT / "results" / "gpu_check_h200_2026-11-27.json").read_text())
    assert old["check"] != targets.CHECK and old["tree_commit"] != rec["tree_commit"]
    tv = old["parts"]["trainer_vs_plain"]
    for s in (f"({old['started'][:10]}, the same kind of card, the older tree `{old['tree_commit']}`: "
              "`results/gpu_check_h200_2026-11-27.json`), is where the trainer-against-plain-loop numbers come from",
              f"reached {100 * tv['mfu']['accellib+compile']['datasheet']:.1f}% of the data sheet's bf16 peak (its "
              f"matmul peak was {100 * old['parts']['matmul_peak']['best_over_datasheet']:.1f}% of it) and ran "
              f"{tv['ratios']['accellib / plain']:.3f}x a plain PyTorch loop eager, "
              f"{tv['ratios']['accellib+compile / plain+compile']:.3f}x compiled",
              f"idle {100 * old['parts']['profile']['idle_share']:.0f}% of the wall",
              f"the old check's: {old['elapsed_s']:.0f} s of a {old['deadline_s']:.0f} s deadline"):
        assert s in flat, s
    # the notebooks
    nbs = json.loads((ROOT / "results" / "notebooks_nvidia_h200.json").read_text())
    ran = nbs["notebooks"]
    assert sorted(ran) == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert all(r["status"] == "passed" and r["cells_run"] == r["cells"] and r["cuda_available"] for r in ran.values())
    allocated = {k: r["cuda_max_allocated_mb"] > 0 for k, r in ran.items()}
    assert allocated == {k: k[:2] not in ("00", "09") for k in ran}         # the GPU cells of 01-08, none in 00 and 09
    top = max(ran, key=lambda k: ran[k]["cuda_max_allocated_mb"])
    assert nbs["clone_path"]["status"] == "passed"
    for s in (f"on the same H200 ({nbs['session_note'][:10]}, tree `{nbs['tree_commit']}`: "
              f"`results/notebooks_nvidia_h200.json`, written by `python3 benchmarks/notebooks_gpu.py --jobs "
              f"{nbs['jobs']}` in {nbs['wall_s']:.0f} s)",
              "the technique notebooks' GPU cells (01–08) ran on CUDA and allocated GPU memory (at most "
              f"{ran[top]['cuda_max_allocated_mb']:,.0f} MB, in {top[:2]}); 00 and 09, which have no GPU cell, "
              "allocated none",
              f"clone-and-install path, run once more in a fresh folder, passed on the GPU box too (`clone_path`: "
              f"{nbs['clone_path']['seconds']:.1f} s)"):
        assert s in flat, s
    earlier = json.loads((ROOT / "results" / "notebooks_nvidia_h200_2026-11-27.json").read_text())["notebooks"]
    assert all(r["cuda_max_allocated_mb"] == 0 for r in earlier.values())
    assert "`results/notebooks_nvidia_h200_2026-11-27.json`, before the notebooks had GPU cells, no GPU memory allocated" in flat
    readme = (ROOT / "README.md").read_text()
    assert "missed some targets: random-LTD ran slower than its baseline" in readme   # both its points' speed < 1
    assert len(ran) == 10 and nbs["gpu"] == rec["device"] == "NVIDIA H200" and "All ten ran on an H200" in readme


def test_skip_leaves_parts_out_and_says_so(tmp_path):
    """--skip: a device budget that measured a part in another call leaves it out, listed with the reason; a name
    that is not a part (or the baseline point) is refused in one line."""
    bad = run(SMOKE + ["--skip", "point:baseline"], timeout=60)
    assert bad.returncode == 2 and "always run" in bad.stderr.strip().splitlines()[-1]
    out = tmp_path / "skip.json"
    left = [p for p in CPU_PARTS if p not in ("environment", "point:baseline", "point:pld@0.5")]
    p = run(SMOKE + ["--deadline", "300", "--out", str(out), "--skip", ",".join(left)], timeout=360)
    assert p.returncode == 0, p.stderr[-800:]
    rec = json.loads(out.read_text())
    assert rec["parts"]["point:pld@0.5"]["status"] == "done"
    for name in left:
        assert name not in rec["parts"] and "--skip" in rec["skipped"][name], name


def test_count_syncs_counts_synchronizing_calls_not_torchs_notice():
    """torch warns once that the sync debug mode is a prototype when it is first set; that notice is not a
    synchronizing call (the 2026-11-28 H200 record counted it: 0.333 per step on its first point)."""
    import types
    import warnings as w
    from gpu.timing import count_syncs

    def set_mode(mode):
        if mode == "warn":
            w.warn("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
                   "operations (Triggered internally at Module.cpp)")
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(set_sync_debug_mode=set_mode))
    c = types.SimpleNamespace(device=torch.device("cuda"), torch=fake_torch, sync=lambda: None)
    calls = iter([0, 1, 0])

    def step():
        if next(calls):
            w.warn("called a synchronizing CUDA operation")
    r = count_syncs(c, step, 3)
    assert r["per_step"] == round(1 / 3, 3) and r["first"] == ["called a synchronizing CUDA operation"]
    assert count_syncs(c, lambda: None, 3)["per_step"] == 0


def test_the_docs_state_the_one_fsdp_number_from_its_record():
    """docs/full_scale.md's FSDP sentence is the earlier H200 record's `fsdp` part."""
    root = Path(__file__).resolve().parents[1]
    docs = " ".join((root / "docs" / "full_scale.md").read_text().split())
    f = json.loads((root / "results" / "gpu_check_h200_2026-11-27.json").read_text())["parts"]["fsdp"]
    assert f["distributed_type"] == "FSDP" and f["status"] == "done"
    said = (f"at {f['vs_baseline_arm']:.2f}x the baseline's tokens/s ({100 * f['mfu']['datasheet']:.1f}% data-sheet "
            f"MFU, {f['peak_mem_gb']:.1f} GB peak)")
    assert said in docs, said
