"""FSDP2 through Accelerate (issue 27, item 5), on 2 CPU processes (gloo): the baseline equals DDP, the plan-only
techniques (PLD, SBLD, random-LTD, standardization loss) run under it, a crash-and-resume gives the straight run's
numbers, checkpoints load into the plain Transformer and export; what cannot run sharded refuses in one line.

Tolerance against DDP. FSDP2 all-gathers the same fp32 weights DDP holds whole, so forward and backward compute
the same numbers; with 2 processes the gradient reduce-scatter adds the same two addends DDP's all-reduce adds
(a + b, exact in either order) and halves exactly. The one different sum is the clip's global norm: FSDP2 adds
squares per shard and all-reduces the shards' sums, DDP adds them per whole tensor, so the norm (and the clip
factor min(1, max_norm / norm)) can differ in the last bits. Hence: without clipping (optim.grad_clip=0) the two
runs are bitwise equal, weights included, in bf16 autocast too, even across a crash and resume (test_baseline_...); with the default clip (1.0, active in these runs)
the logged numbers agree to 2e-5 (they are rounded to 5 decimals, so one rounding step apart at most) and the
weights to 1e-5 after 6 steps (measured: 1.4e-6, baseline).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.export import export_run, model_state_dict
from accellib.core.launch import LaunchError, launch_processes, make_accelerator
from accellib.models.transformer import Transformer
from accellib.core.records import TIMING_FIELDS, read_metrics
from accellib.core.run_dir import checkpoint_layout
from accellib.core.trainer import Trainer, TrainingError
from conftest import image_overrides, tiny_overrides, train_run

ROOT = Path(__file__).resolve().parents[1]
# what `accelerate launch --config_file configs/accelerate/fsdp_2proc_cpu.yaml` sets in each process (the part
# accellib reads); test_the_shipped_cpu_config_... runs that command and must give the same numbers
FSDP_ENV = dict(ACCELERATE_USE_FSDP="true", FSDP_VERSION="2", FSDP_AUTO_WRAP_POLICY="TRANSFORMER_BASED_WRAP",
                FSDP_TRANSFORMER_CLS_TO_WRAP="Block", FSDP_STATE_DICT_TYPE="SHARDED_STATE_DICT")
FULL = dict(FSDP_ENV, FSDP_STATE_DICT_TYPE="FULL_STATE_DICT")
# every technique that only changes the plan or adds a loss, in two runs (PLD and SBLD both gate blocks)
PLD_LTD_STD = {"pld.enabled": True, "pld.gamma": 0.5, "random_ltd.enabled": True, "random_ltd.min_len": 16,
               "standardization_loss.enabled": True, "standardization_loss.weight": 0.01}
SBLD = {"sbld.enabled": True, "sbld.profile_step": 2, "sbld.profile_batches": 2, "sbld.gamma": 0.5}
STEPS = 6   # checkpoints at 2, 4 and 6; the crashed runs stop after step 3 (they resume from step 2)
BASE = {"train.batch_size": 4, "train.checkpoint_every": 2, "train.steps": STEPS}


def _train(data_dir, out, extra, env, crash_after=None, resume=False):
    """One process of a 2-process run (accellib.core.launch.launch_processes): the launch's environment, then the CLI's
    training_function (tests/conftest.py's train_run)."""
    os.environ.update(env)
    train_run(data_dir, out, extra, crash_after=crash_after, resume=resume)


def _launch(data_dir, out, extra, env, crash_after=None, resume=False):
    launch_processes(_train, (data_dir, out, {**BASE, **extra}, env, crash_after, resume), 2, timeout_s=150)


def _numbers(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS + ("peak_mem_gb",)} for r in read_metrics(run)]


def _weights(run: Path) -> dict:
    found = checkpoint_layout(run / "checkpoints" / "last")
    assert found is not None
    return model_state_dict(found[1])


def _loads_into_the_plain_model(run: Path, cfg) -> dict:
    sd = _weights(run)
    model = Transformer(cfg.model)
    assert sorted(sd) == sorted(model.state_dict())          # the plain model's keys, no FSDP prefixes
    model.load_state_dict(sd, strict=True)
    return sd


@pytest.mark.timeout(200)
def test_baseline_under_fsdp_crashed_and_resumed_is_bitwise_ddp_without_clipping_in_bf16(tiny_data_dir, tmp_path):
    """In bf16 (CPU autocast): FSDP2 all-gathers fp32 weights (no FSDP parameter casting) and the forward runs under
    accelerator.autocast() as DDP's does. The FSDP run crashes after step 3 and resumes from its FULL_STATE_DICT
    checkpoint of step 2; bitwise equal to the straight DDP run, it shows both that FSDP computes what DDP computes
    and that the resume is exact (the other tests run fp32 and SHARDED_STATE_DICT)."""
    extra = {"optim.grad_clip": 0, "train.precision": "bf16"}
    _launch(tiny_data_dir, tmp_path / "ddp", extra, {})
    with pytest.raises(Exception, match="crash"):
        _launch(tiny_data_dir, tmp_path / "fsdp", extra, FULL, crash_after=3)
    _launch(tiny_data_dir, tmp_path / "fsdp", extra, FULL, resume=True)
    assert checkpoint_layout(tmp_path / "fsdp" / "checkpoints" / "last")[0] == "FSDP FULL_STATE_DICT"
    assert checkpoint_layout(tmp_path / "ddp" / "checkpoints" / "last")[0] == "data-parallel"
    assert _numbers(tmp_path / "fsdp") == _numbers(tmp_path / "ddp")
    cfg = load_config(tmp_path / "fsdp" / "config.yaml")
    a, b = _loads_into_the_plain_model(tmp_path / "fsdp", cfg), _weights(tmp_path / "ddp")
    assert all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.timeout(150)
def test_pld_random_ltd_and_standardization_loss_under_fsdp_match_ddp_and_export(tiny_data_dir, tmp_path):
    _launch(tiny_data_dir, tmp_path / "ddp", PLD_LTD_STD, {})
    _launch(tiny_data_dir, tmp_path / "fsdp", PLD_LTD_STD, FSDP_ENV)   # SHARDED_STATE_DICT: a DCP folder
    assert checkpoint_layout(tmp_path / "fsdp" / "checkpoints" / "last")[0] == "FSDP SHARDED_STATE_DICT"
    a, b = _numbers(tmp_path / "fsdp"), _numbers(tmp_path / "ddp")
    assert min(r["blocks_per_micro_batch"] for r in a) < 4      # blocks were skipped (every rank the same ones)
    assert min(r["ltd_keep"] for r in a) < 32 and all(r["std_loss"] > 0 for r in a)
    close = ("train_loss", "val_loss", "val_bpb", "grad_norm", "std_loss")
    for ra, rb in zip(a, b, strict=True):
        assert {k: v for k, v in ra.items() if k not in close} == {k: v for k, v in rb.items() if k not in close}
        for k in close:
            if k in rb:
                assert ra[k] == pytest.approx(rb[k], abs=2e-5), (ra["step"], k)
    cfg = load_config(tmp_path / "fsdp" / "config.yaml")
    wa, wb = _loads_into_the_plain_model(tmp_path / "fsdp", cfg), _weights(tmp_path / "ddp")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wb) < 1e-5
    pytest.importorskip("transformers")
    info = export_run(tmp_path / "fsdp", tmp_path / "hf")    # the merged shards, checked on validation logits
    assert info["step"] == STEPS and (tmp_path / "hf" / "model.safetensors").is_file()


@pytest.mark.timeout(200)
def test_the_shipped_cpu_config_runs_sbld_and_a_crash_resumes_exactly(tiny_data_dir, tmp_path):
    """The straight run is the README's launch line with configs/accelerate/fsdp_2proc_cpu.yaml; the crashed run
    (after step 3, checkpoint at step 2) and its resume use FSDP_ENV: all three must give the same numbers."""
    from accellib.core.launch import _free_port
    argv = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
            str(ROOT / "configs/accelerate/fsdp_2proc_cpu.yaml"), "--main_process_port", str(_free_port()),
            "-m", "accellib.train", "--out", str(tmp_path / "full")]
    argv += tiny_overrides(tiny_data_dir, **{**BASE, **SBLD})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "2 process(es)" in p.stdout and p.stdout.count("final:") == 1
    assert checkpoint_layout(tmp_path / "full" / "checkpoints" / "last")[0] == "FSDP SHARDED_STATE_DICT"
    with pytest.raises(Exception, match="crash"):
        _launch(tiny_data_dir, tmp_path / "part", SBLD, FSDP_ENV, crash_after=3)
    _launch(tiny_data_dir, tmp_path / "part", SBLD, FSDP_ENV, resume=True)
    full, part = _numbers(tmp_path / "full"), _numbers(tmp_path / "part")
    assert full == part and len(full) == STEPS and full[-1]["block_list"]    # SBLD profiled at step 2, then dropped
    assert min(r["blocks_per_micro_batch"] for r in full) < 4
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- one-line refusals (one process)
@pytest.mark.parametrize("name,extra", [
    ("pipeline", {"pipeline.schedule": "gpipe"}),
    ("layered_accumulation", {"layered_accumulation.enabled": True, "train.grad_accum": 2}),
    ("ouroboros", {"ouroboros.enabled": True, "ouroboros.modules": 3}),
    ("multilevel", {"multilevel.enabled": True, "model.tie_head": False}),
    ("lowp", {"lowp.enabled": True, "model.tie_head": False}),
    ("pld", {"pld.enabled": True, "pld.zero_fill": True}),
    ("sbld", {"sbld.enabled": True, "sbld.zero_fill": True}),
])
def test_what_cannot_run_sharded_refuses_an_fsdp_launch_in_one_line(name, extra, tiny_data_dir, tmp_path, monkeypatch):
    from accellib.train import training_function
    for k, v in FSDP_ENV.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        training_function(load_config(None, tiny_overrides(tiny_data_dir, **extra)), tmp_path / "run")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{name} cannot run under an FSDP launch") and "--multi_gpu" in msg
    assert not (tmp_path / "run").exists()   # refused before anything was written


def test_a_model_without_blocks_refuses_an_fsdp_launch(digits_dir, tmp_path, monkeypatch):
    from accellib.train import training_function
    for k, v in FSDP_ENV.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match="model.kind=cnn has none"):
        training_function(load_config(None, image_overrides(digits_dir)), tmp_path / "run")


@pytest.mark.parametrize("env,needle", [
    ({"FSDP_VERSION": "1"}, "FSDP2 only"),
    ({"FSDP_VERSION": None}, "FSDP2 only"),                      # `accelerate launch --use_fsdp` alone: FSDP1
    ({"FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP"}, "one FSDP unit per transformer block"),
    ({"FSDP_TRANSFORMER_CLS_TO_WRAP": "GPT2Block"}, "one FSDP unit per transformer block"),
    ({"FSDP_ACTIVATION_CHECKPOINTING": "true"}, "fsdp_activation_checkpointing: true is not supported"),
    ({"FSDP_OFFLOAD_PARAMS": "true"}, "fsdp_offload_params: true is not supported"),
    ({}, "with one process shards nothing"),                      # a valid FSDP config, but no WORLD_SIZE
])
def test_an_fsdp_launch_accellib_did_not_build_is_refused_in_one_line(env, needle, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for k, v in {**FSDP_ENV, **env}.items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    with pytest.raises(LaunchError) as e:
        make_accelerator(device="cpu")
    assert "\n" not in str(e.value) and needle in str(e.value)


def test_no_fsdp_launch_builds_the_ddp_accelerator(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    acc = make_accelerator(device="cpu")
    assert acc.distributed_type.value in ("NO", "MULTI_CPU") and not acc.is_fsdp2


LAUNCHES = {"data-parallel": (False, None), "sharded": (True, "SHARDED_STATE_DICT"), "full": (True, "FULL_STATE_DICT")}


@pytest.mark.parametrize("written,wrote", [("pytorch_model.bin", "data-parallel"), ("pytorch_model_fsdp_0", "sharded"),
                                           ("pytorch_model_fsdp.bin", "full")])
def test_a_checkpoint_resumes_only_under_the_launch_that_wrote_it(written, wrote, tmp_path):
    from torch.distributed.fsdp.fully_sharded_data_parallel import StateDictType
    (tmp_path / written).mkdir() if "." not in written else (tmp_path / written).write_bytes(b"")
    for launch, (fsdp, sdt) in LAUNCHES.items():
        plugin = SimpleNamespace(state_dict_type=StateDictType[sdt]) if sdt else None
        trainer = SimpleNamespace(engine=None, fsdp=fsdp,
                                  accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))
        if launch == wrote:
            Trainer._check_layout(trainer, tmp_path)
            continue
        with pytest.raises(TrainingError) as e:
            Trainer._check_layout(trainer, tmp_path)
        msg = str(e.value)
        assert "\n" not in msg and "resume it with" in msg
        assert ("--multi_gpu" in msg) == (wrote == "data-parallel")
        assert (sdt is not None and wrote != "data-parallel") <= (f"fsdp_state_dict_type is {LAUNCHES[wrote][1]}" in msg)


@pytest.mark.parametrize("name,processes,precision", [("fsdp_2proc_cpu", 2, "no"), ("fsdp_8gpu", 8, "bf16")])
def test_the_shipped_fsdp_configs_give_a_launch_accellib_accepts(name, processes, precision):
    """The environment `accelerate launch --config_file configs/accelerate/NAME.yaml` gives each process, computed
    by Accelerate's own launch code without launching (the 8-GPU file cannot run here): accellib's plugin accepts
    it, and its FSDP settings are the ones the 2-process tests run."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    from accellib.core.launch import fsdp_plugin
    args = launch_command_parser().parse_args(["--config_file", str(ROOT / f"configs/accelerate/{name}.yaml"), "x.py"])
    args = _validate_launch_command(args)[0]
    env = prepare_multi_gpu_env(args)
    assert args.num_processes == processes and env["ACCELERATE_MIXED_PRECISION"] == precision
    assert {k: env[k] for k in FSDP_ENV} == FSDP_ENV
    plugin = fsdp_plugin(env)
    assert plugin.fsdp_version == 2 and plugin.transformer_cls_names_to_wrap == ["Block"]
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT" and plugin.reshard_after_forward is True
