"""Bad input gets one line that says what is wrong and how to fix it, never a traceback, and
loses nothing (issue 9, part 3). Each case failed (traceback or silent run) before its fix."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accellib.train import main, training_function
from conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def finished_run(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 2}), run)
    return run


@pytest.mark.parametrize("text,msg", [("- model\n- train\n", "must be a mapping of sections"),
                                      ("", "is empty"), ("# only a comment\n", "is empty")])
def test_bad_yaml_top_level(text, msg, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(text)
    assert msg in one_line(capsys, ["--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("override,msg", [("--optim.lr=nan", "optim.lr must be a finite number"),
                                          ("--optim.lr=inf", "optim.lr must be a finite number"),
                                          ("--optim.beta2=1.0", "optim.beta2=1.0 must be below 1.0"),
                                          ("--model.vocab_size=100", "smaller than the vocabulary")])
def test_bad_values(override, msg, tiny_data_dir, tmp_path, capsys):
    err = one_line(capsys, ["--out", str(tmp_path / "r")] + tiny_overrides(tiny_data_dir) + [override])
    assert msg in err


def test_resume_of_a_run_with_an_empty_config(finished_run, capsys):
    (finished_run / "config.yaml").write_text("")  # before: it continued on the defaults
    assert "is empty" in one_line(capsys, ["--resume", str(finished_run)])


def test_resume_with_a_shape_changing_override(finished_run, capsys):
    err = one_line(capsys, ["--resume", str(finished_run), "--model.d_model=64"])
    assert "--model.d_model=64 changes how the run" in err and "model.d_model=32" in err


def test_resume_with_another_optimizer(finished_run, capsys):
    # before: a traceback (KeyError: 'dampening') once the AdamW param groups reached SGD's step
    err = one_line(capsys, ["--resume", str(finished_run), "--optim.name=sgd", "--train.steps=20"])
    assert "--optim.name=sgd changes how the run" in err and "optim.name=adamw" in err


def test_out_is_a_file(tiny_data_dir, tmp_path, capsys):
    (tmp_path / "f").write_text("keep me")
    assert "is a file" in one_line(capsys, ["--out", str(tmp_path / "f")] + tiny_overrides(tiny_data_dir))
    assert (tmp_path / "f").read_text() == "keep me"


def test_a_technique_refusing_the_stored_state_says_why(tiny_cfg, tmp_path, capsys):
    # random-LTD's ramp follows train.steps, so a longer resume changes its schedule; before, its reason was
    # wrapped as "the checkpoint ... cannot be read (ConfigError: ...); restore the folder from a backup"
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 4, "random_ltd.enabled": True}), run)
    err = one_line(capsys, ["--resume", str(run), "--train.steps=8"])
    assert "random_ltd schedule" in err and "train.steps" in err and "cannot be read" not in err


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing"])
def test_damaged_checkpoint(damage, finished_run, capsys):
    f = finished_run / "checkpoints" / "last" / "pytorch_model.bin"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif damage == "garbage":
        f.write_bytes(os.urandom(4096))
    else:
        f.unlink()
    metrics = (finished_run / "metrics.jsonl").read_text()
    err = one_line(capsys, ["--resume", str(finished_run), "--train.steps=4"])
    assert "cannot be read" in err and "--overwrite" in err
    assert (finished_run / "metrics.jsonl").read_text() == metrics  # nothing truncated or appended


def test_accelerate_cpu_launch_trap_is_refused_first_and_not_as_a_preemption(tiny_data_dir, tmp_path):
    # `accelerate launch --cpu --num_processes 2` starts one process. Round 3: accelerate's CalledProcessError
    # traceback followed our line; then accellib ended the launcher with SIGTERM, whose status 143 schedulers read as
    # "preempted" (issue 36). Now our line comes first and the launcher's status is its own failure status (1), its
    # report naming our exit status 2.
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([accelerate, "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
                          "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "accellib.train",
                          "--out", str(tmp_path / "r")] + tiny_overrides(tiny_data_dir),
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.splitlines()
    errors = [i for i, ln in enumerate(lines) if ln.startswith("error: ")]
    assert len(errors) == 1 and "starts only ONE process" in lines[errors[0]], res.stderr
    assert errors[0] < next(i for i, ln in enumerate(lines) if ln.startswith("Traceback"))
    assert "returned non-zero exit status 2" in res.stderr
    assert not (tmp_path / "r").exists()


def test_a_refusal_under_torchrun_comes_first_and_is_torchruns_root_cause(tiny_data_dir, tmp_path):
    # issue 36 item 7: before, torchrun's report followed our line and said only "To enable traceback see: ..."
    from accellib.core.launch import _free_port
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([torchrun, "--nproc_per_node", "2", f"--master_port={_free_port()}", "-m", "accellib.train",
                          "--out", str(tmp_path / "r"), "--train.no_such_key=1"] + tiny_overrides(tiny_data_dir),
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if ln.startswith("error: ")]
    assert len(errors) == 1 and "unknown config key 'train.no_such_key'" in lines[errors[0]], res.stderr
    assert errors[0] == 0, res.stderr[:2000]                       # the first line of the output
    root = res.stderr[res.stderr.index("Root Cause"):]
    assert "error: unknown config key 'train.no_such_key'" in root and "To enable traceback" not in root, root


def test_gpu_config_without_cuda_fails_before_anything_else(tmp_path, capsys, monkeypatch):
    # before: a GPU-scale config fell back to the CPU silently (or first asked for OpenWebText)
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = one_line(capsys, ["--config", str(ROOT / "configs" / "gpt2_small_owt.yaml"), "--out", str(tmp_path / "r")])
    assert "train.device=cuda" in err and "--train.device=cpu" in err
    assert not (tmp_path / "r").exists()


def test_console_shows_progress_without_the_bar(tiny_cfg, tmp_path, capsys):
    # before: with train.progress=false (the full-scale configs) nothing was printed until the end
    training_function(tiny_cfg(**{"train.steps": 4, "train.log_every": 2, "train.eval_every": 4}), tmp_path / "r")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["2/4", "4/4"]
    assert "train " in lines[0] and "tok/s" in lines[0] and "val " in lines[1]


def _another_value(section: str, f, value, path):
    """A value of field `f` other than `value` that the config accepts on its own (None if none is found)."""
    from accellib.core.options import ConfigError
    from accellib.core.config import _meta, load_config
    meta = _meta(section, f)
    if meta.get("choices"):
        cands = [c for c in meta["choices"] if c != value and [c] != value]
        cands = [[c] for c in cands] if isinstance(value, list) else cands
    elif isinstance(value, bool):
        cands = [not value]
    elif isinstance(value, (int, float)):
        cands = [value * 2, value + 1, value / 2, value - 1, 0.5, 2]
    elif isinstance(value, str) or value is None:
        cands = ["hf:x", "x", 1]
    elif isinstance(value, list):
        cands = [[1], [1, 2], [2, 2], [1.0, 1.0, 1.0, 10.0, 0.5]]
    else:
        cands = []
    for c in cands:
        if c == value:
            continue
        try:
            load_config(path, [f"--{section}.{f.name}={str(c).lower() if isinstance(c, bool) else c}"])
            return c
        except ConfigError:
            continue
    return None


def test_a_resume_may_change_only_the_options_marked_so(tiny_data_dir, tmp_path):
    # issue 26 item 4: one rule over every section. Before, --train.seed=7 resumed with another data order
    # (record.json said seed 7, config.yaml 1337), and so did every other option but the model, the
    # optimizer's name and the techniques' switches
    import dataclasses
    import yaml
    from accellib.core.options import ConfigError
    from accellib.core.config import default_config, load_config
    from accellib.train import resume_config
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(load_config(None, tiny_overrides(tiny_data_dir)).to_dict()))
    may, refused, untried = [], [], []
    for section, obj in default_config().sections().items():
        stored = load_config(tmp_path / "config.yaml").sections()[section]
        for f in dataclasses.fields(obj):
            key = f"{section}.{f.name}"
            new = _another_value(section, f, getattr(stored, f.name), tmp_path / "config.yaml")
            if new is None or key == "model.vocab_size":   # (vocab_size is filled in from the data)
                untried.append(key)
                continue
            arg = f"--{key}={str(new).lower() if isinstance(new, bool) else new}"
            try:
                resume_config(tmp_path, [arg])
                may.append(key)
            except ConfigError as e:
                assert str(e).startswith(f"--{key}=") and "changes how the run" in str(e) and "\n" not in str(e), str(e)
                refused.append(key)
            assert (key in may) == bool(f.metadata.get("resume")), key
    # (no valid value alone: sbld.schedule=variance needs variance_params, ouroboros.split needs modules)
    assert untried == ["model.vocab_size", "sbld.schedule", "ouroboros.split"], untried
    assert {"train.seed", "train.batch_size", "train.eval_windows", "train.precision", "data.path", "model.d_model",
            "optim.name", "pld.enabled", "pld.gamma", "ouroboros.modules"} <= set(refused)
    assert set(may) == {"train.steps", "train.eval_every", "train.log_every", "train.checkpoint_every",
                        "train.progress", "train.device", "train.threads", "train.compile", "train.compile_backend",
                        "train.stop_on_divergence", "train.divergence_window", "train.divergence_rewinds",
                        "train.keep_checkpoints",
                        "train.peak_flops", "data.verify", "log.trackers", "log.project", "optim.lr",
                        "optim.min_lr_ratio", "optim.warmup_steps", "optim.weight_decay", "optim.beta1",
                        "optim.beta2", "optim.momentum", "optim.grad_clip", "layered_accumulation.emulate_mbps",
                        "layered_accumulation.keep_trace",
                        "random_ltd.attention"}   # an SDPA kernel choice, like train.compile: the machine's business


def test_resume_with_another_seed_is_one_line(finished_run, capsys):
    before = (finished_run / "record.json").read_text()
    err = one_line(capsys, ["--resume", str(finished_run), "--train.seed=7", "--train.steps=4"])
    assert "--train.seed=7 changes how the run" in err and "train.seed=1337" in err
    assert (finished_run / "record.json").read_text() == before


def test_resume_below_the_step_reached_is_one_line(finished_run, capsys):
    # issue 26 item 4: before, --train.steps=1 on a run at step 2 exited 0, trained nothing, and
    # record.json said steps 1 with final step 2
    before = {p.name: p.read_bytes() for p in finished_run.iterdir() if p.is_file() and p.name != ".accellib.lock"}
    err = one_line(capsys, ["--resume", str(finished_run), "--train.steps=1"])
    assert "has reached step 2" in err and "--train.steps=1 would train nothing" in err
    assert {p.name: p.read_bytes() for p in finished_run.iterdir() if p.is_file()} == before


def test_a_resume_records_what_it_changed(finished_run, capsys):
    import json
    lr = json.loads((finished_run / "record.json").read_text())["config"]["optim"]["lr"]
    assert main(["--resume", str(finished_run), "--train.steps=3", "--optim.lr=0.001"]) == 0
    assert main(["--resume", str(finished_run), "--train.steps=4", "--optim.lr=0.001"]) == 0
    rec = json.loads((finished_run / "record.json").read_text())
    assert rec["final"]["step"] == 4 and rec["config"]["train"]["steps"] == 4
    assert rec["resumes"] == [dict(step=2, changes={"optim.lr": [lr, 0.001], "train.steps": [2, 3]}),
                              dict(step=3, changes={"optim.lr": [lr, 0.001], "train.steps": [2, 4]})]


@pytest.mark.parametrize("project", ["../..", "a/b", ".."])
def test_a_tracker_project_that_leaves_the_run_folder_is_one_line(project, tiny_data_dir, tmp_path, capsys):
    # issue 26: before, --log.project=../.. wrote TensorBoard files outside the run folder
    err = one_line(capsys, ["--out", str(tmp_path / "r")] + tiny_overrides(tiny_data_dir) +
                   ["--log.trackers=tensorboard", f"--log.project={project}"])
    assert f"log.project={project!r}" in err and "plain name" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- issue 36 item 6
def _cmp_yaml(tmp_path, data_dir):
    from test_nothing_lost import _small_yaml
    return _small_yaml(tmp_path, data_dir)


def test_an_out_that_cannot_be_created_is_one_line(tiny_data_dir, tmp_path, capsys):
    # before: NotADirectoryError tracebacks from train and compare
    from accellib.compare import main as compare_main
    (tmp_path / "f").write_text("keep me")
    err = one_line(capsys, ["--out", str(tmp_path / "f" / "run")] + tiny_overrides(tiny_data_dir))
    assert "cannot be created" in err and "--out" in err
    assert compare_main(["--config", str(_cmp_yaml(tmp_path, tiny_data_dir)), "--out", str(tmp_path / "f" / "cmp"),
                         "--arms", "baseline"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "cannot be created" in err and "\n" not in err, err
    assert (tmp_path / "f").read_text() == "keep me"


@pytest.mark.parametrize("arms,msg", [("baseline,baseline", "more than once"), ("", "names an empty arm"),
                                      ("baseline,", "names an empty arm")])
def test_compare_arms_named_twice_or_none_are_one_line(arms, msg, tiny_data_dir, tmp_path, capsys):
    # before: both ran silently (--arms "" trained every arm)
    from accellib.compare import main as compare_main
    out = tmp_path / "cmp"
    assert compare_main(["--config", str(_cmp_yaml(tmp_path, tiny_data_dir)), "--out", str(out), "--arms", arms]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err
    assert not out.exists()


def test_dense_arms_of_a_fixed_size_model_are_refused(digits_dir, tmp_path, capsys):
    # issue 36 item 4: before, --control dense on the digits CNN trained dense-L1..L3 as byte-identical copies of the
    # baseline (the CNN ignores n_layer), and the table called them 1-3-block models
    from accellib.compare import main as compare_main
    for extra in (["--control", "dense"], ["--arms", "baseline,dense-L2"]):
        assert compare_main(["--config", str(ROOT / "configs" / "digits_cnn.yaml"), "--out", str(tmp_path / "c"),
                             f"--data.path={digits_dir}", "--train.steps=2", *extra]) == 2
        err = capsys.readouterr().err
        assert "fixed size" in err and "model.kind=cnn" in err and err.count("\n") == 1, err
    assert not (tmp_path / "c").exists()


def test_an_arm_with_almost_no_steps_is_named(tiny_data_dir, tmp_path, capsys):
    # issue 36 item 6: before, dense-L99 at the baseline's FLOPs got a couple of steps without a word
    from accellib.compare import main as compare_main
    argv = ["--config", str(_cmp_yaml(tmp_path, tiny_data_dir)), "--out", str(tmp_path / "cmp"), "--budget", "flops",
            "--arms", "baseline,dense-L40", "--train.steps=20"]
    assert compare_main(argv) == 0
    out = capsys.readouterr().out
    warned = [ln for ln in out.splitlines() if ln.startswith("warning: arm dense-L40")]
    assert len(warned) == 1 and "too few" in warned[0] and "the baseline 20" in warned[0], out
    assert "warning: arm baseline" not in out


def test_token_ids_are_checked_without_a_checksum(tiny_data_dir, tmp_path, capsys):
    # before: a meta.json without sha256 skipped the id check, so ids >= vocab_size ended in an IndexError
    import json
    d = tmp_path / "data"
    shutil.copytree(tiny_data_dir, d)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "sha256"} | {"vocab_size": 100}))
    (d / ".verified.json").unlink(missing_ok=True)
    err = one_line(capsys, ["--out", str(tmp_path / "r")] + tiny_overrides(d))
    assert "holds token id" in err and "vocab_size is 100" in err
    assert not (tmp_path / "r").exists()


def test_resume_of_a_checkpoint_from_another_config_names_the_shapes(finished_run, capsys):
    # issue 43 item 4: before, "cannot be read ...; start the run again with --overwrite" (which deletes the checkpoint)
    cfg = finished_run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("d_model: 32", "d_model: 64"))
    err = one_line(capsys, ["--resume", str(finished_run), "--train.steps=4"])
    assert "does not fit" in err and "model.d_model=32 where the config has 64" in err and "--overwrite" not in err
