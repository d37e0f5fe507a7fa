"""The full-scale (GPU) path checked on a CPU (issue 27): the documented launch is the measured one, a
launcher's whole-model compile is refused, a fresh GPU box fails early and plainly, the peak table."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accellib.core.config import load_config
from accellib.core.hardware import table_peak
from accellib.core.launch import LaunchError, check_dynamo, make_accelerator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
# the GPU-scale transformer configs (tests/test_configs.py's GPU_SCALE)
FULL_SCALE = ("gpt2_small_owt", "multilevel_gpt_base", "pld_bert_base", "pld_gpt2_medium_owt",
              "random_ltd_gpt2_medium_owt", "random_ltd_gpt2_small_owt")


@pytest.mark.parametrize("name", FULL_SCALE)
def test_full_scale_configs_compile_what_gpu_check_measures(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert (cfg.train.compile, cfg.train.compile_backend) == ("blocks", "inductor")


def test_gpu_check_runs_the_shipped_config_with_only_length_batch_data_and_peak_changed():
    import argparse

    import gpu_check
    assert gpu_check.CONFIG == "configs/gpt2_small_owt.yaml"
    args = argparse.Namespace(steps=1000, smoke=False, peak_flops=756e12)
    over = gpu_check.base_overrides(args, Path("runs/gpu_check/data"))
    keys = [o.removeprefix("--").split("=")[0] for o in over]
    assert set(keys) <= set(gpu_check.ALLOWED) and "train.peak_flops" in keys
    assert "--train.peak_flops=7.56e+14" in over
    assert not any(k.startswith(("model.", "train.compile", "train.precision")) for k in gpu_check.ALLOWED)
    # and the command line accepts the flag
    assert subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--help"], cwd=ROOT, capture_output=True,
                          text=True).stdout.count("--peak-flops PEAK_FLOPS") == 2   # usage and option list


@pytest.mark.parametrize("backend", ["inductor", "INDUCTOR", "aot_eager"])
def test_a_whole_model_compile_from_the_launcher_is_refused_in_one_line(backend, monkeypatch):
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", backend)
    with pytest.raises(LaunchError) as e:
        make_accelerator(device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and "--dynamo_backend no" in msg and "train.compile=blocks" in msg


@pytest.mark.parametrize("value", [None, "no", "NO"])
def test_no_dynamo_from_the_launcher_passes_and_prepare_compiles_nothing(value, monkeypatch):
    if value is None:
        monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", value)
    check_dynamo()
    acc = make_accelerator(device="cpu")
    assert acc.state.dynamo_plugin.backend.value == "NO"


@pytest.mark.parametrize("name,key,peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12), ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA H100 NVL", "bf16", 835e12), ("NVIDIA H200", "bf16", 989e12), ("NVIDIA B200", "bf16", 2250e12),
    ("NVIDIA GB200", "bf16", 2500e12),
    ("NVIDIA B200", "fp32", None), ("NVIDIA A100-SXM4-80GB", "tf32", 156e12), ("Some New GPU", "bf16", None)])
def test_peak_table_tells_h100_variants_apart_and_has_b200(name, key, peak):
    assert table_peak(name, key) == peak


@pytest.mark.skipif(shutil.which("dirname") is None or shutil.which("date") is None, reason="needs coreutils")
def test_gpu_check_sh_stops_in_one_line_without_a_c_compiler(tmp_path):
    """A machine where torch sees CUDA (a stand-in python that says so) but no C compiler is on PATH."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("dirname", "date"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env.update(PATH=str(bin_), PYTHON=str(fake))
    p = subprocess.run([shutil.which("bash"), "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "no C compiler found" in p.stderr
    # CC naming a compiler that is not there: Triton would use it, so it is refused even when gcc exists
    (bin_ / "gcc").symlink_to(shutil.which("true"))
    env.update(CC="no-such-cc")
    p = subprocess.run([shutil.which("bash"), "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "CC=no-such-cc is not a command" in p.stderr


# FSDP launches: tests/test_fsdp.py
