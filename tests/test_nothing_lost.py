"""Failure paths keep the last good state (issue 9, part 2). Each test failed before its fix."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from accellib.compare import main as compare_main
from accellib.compare import run_arms
from accellib.core.config import load_config
from accellib.core.launch import launch_processes
from accellib.core.records import read_metrics
from accellib.train import main, training_function
from accellib.core.trainer import Trainer
from conftest import crash_and_resume, kill9_after, tiny_overrides
from accellib.core.records import TIMING_FIELDS

ROOT = Path(__file__).resolve().parents[1]


def strict_json_lines(path: Path) -> list[dict]:
    def refuse(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return [json.loads(ln, parse_constant=refuse) for ln in path.read_text().splitlines() if ln]


def test_diverged_weights_never_replace_the_last_good_checkpoint(tiny_data_dir, tmp_path, capsys):
    # The reproduction: with weight decay 1e10 the weights after step 2 are not finite while
    # step 2's loss still is. Before: those weights were saved over step 1's checkpoint, metrics.jsonl
    # got a bare NaN, and the message said no checkpoint was written.
    run = tmp_path / "run"
    argv = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(run), f"--data.path={tiny_data_dir}",
            "--optim.weight_decay=1e10", "--train.checkpoint_every=1", "--train.log_every=1",
            "--train.progress=false"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "the last good checkpoint (step 1) is kept" in err, err
    sd = torch.load(run / "checkpoints" / "last" / "pytorch_model.bin", weights_only=True)
    assert all(v.isfinite().all() for v in sd.values())
    state = torch.load(run / "checkpoints" / "last" / "custom_checkpoint_0.pkl", weights_only=False)
    assert state["step"] == 1
    strict_json_lines(run / "metrics.jsonl")  # every line is standard JSON


def test_resume_overrides_reach_the_optimizer(tiny_cfg, tmp_path):
    # before: the optimizer state dict brought back the stored weight decay and betas, so "resume
    # with a lower optim.weight_decay" silently kept the old one
    training_function(tiny_cfg(**{"train.steps": 2}), tmp_path / "run")
    tr = Trainer(tiny_cfg(**{"optim.weight_decay": 0.0, "optim.beta2": 0.9}), tmp_path / "run")
    tr.load(tmp_path / "run")
    assert [g["weight_decay"] for g in tr.optimizer.param_groups] == [0.0, 0.0]
    assert all(g["betas"] == (0.9, 0.9) for g in tr.optimizer.param_groups)


def test_nan_validation_loss_is_not_logged(tiny_cfg, tmp_path, monkeypatch):
    from accellib.core.trainer import TrainingError
    monkeypatch.setattr(torch.nn.functional, "cross_entropy",
                        lambda *a, **k: torch.full(a[1].shape, float("nan")))
    with pytest.raises(TrainingError, match="validation loss is nan"):
        Trainer(tiny_cfg(), tmp_path / "r").evaluate()


def _small_yaml(tmp_path, data_dir) -> Path:
    base = {k.split(".", 1)[0]: {} for k in ("model.x", "train.x", "optim.x", "data.x")}
    for a in tiny_overrides(data_dir, **{"train.steps": 4, "train.checkpoint_every": 2}):
        key, val = a[2:].split("=", 1)
        s, k = key.split(".", 1)
        base[s][k] = yaml.safe_load(val)
    base["arms"] = {"baseline": {}, "pld": {"pld": {"enabled": True, "theta_bar": 0.5}}}
    p = tmp_path / "cmp.yaml"
    p.write_text(yaml.safe_dump(base))
    return p


def test_compare_overwrite_validates_before_deleting(tiny_data_dir, tmp_path):
    # before: a bad --data.path deleted the finished baseline arm, then failed
    cfg, out = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline"]) == 0
    before = (out / "baseline" / "record.json").read_text()
    assert compare_main(["--config", str(cfg), "--out", str(out), "--overwrite",
                         f"--data.path={tmp_path / 'missing'}"]) == 2
    assert (out / "baseline" / "record.json").read_text() == before


def test_compare_refuses_to_mix_old_and_new_arms(tiny_data_dir, tmp_path, capsys):
    cfg, out = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline"]) == 0
    assert compare_main(["--config", str(cfg), "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_interrupted_compare_resumes(tiny_data_dir, tmp_path, monkeypatch):
    # before: compare had no --resume; a crash in the second arm left nothing but --overwrite
    cfg = _small_yaml(tmp_path, tiny_data_dir)
    full = run_arms(cfg, tmp_path / "full")
    orig = Trainer.train_step

    def crash(self):
        if self.techniques and self.state.step == 3:  # the pld arm, after its step-2 checkpoint
            raise KeyboardInterrupt
        return orig(self)
    monkeypatch.setattr(Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        run_arms(cfg, tmp_path / "part")
    monkeypatch.setattr(Trainer, "train_step", orig)
    for arm in ("baseline", "pld"):  # written before options existed: a new option at its default is no change
        f = tmp_path / "part" / arm / "config.yaml"
        old = yaml.safe_load(f.read_text())
        del old["log"], old["model"]["act"], old["model"]["init_from"]
        f.write_text(yaml.safe_dump(old))
    kept = (tmp_path / "part" / "baseline" / "record.json").stat().st_mtime_ns
    part = run_arms(cfg, tmp_path / "part", resume=True)
    assert (tmp_path / "part" / "baseline" / "record.json").stat().st_mtime_ns == kept   # not retrained
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]
    for arm in ("baseline", "pld"):
        assert strip(read_metrics(tmp_path / "part" / arm)) == strip(read_metrics(tmp_path / "full" / arm))
        assert part[arm]["val_loss"] == full[arm]["val_loss"]
    # a changed config is refused instead of resumed into a mixed run
    with pytest.raises(Exception, match="another config"):
        run_arms(cfg, tmp_path / "part", resume=True, overrides=["--optim.lr=0.001"])


def test_resume_logs_what_the_uninterrupted_run_logs(tiny_cfg, tmp_path, monkeypatch):
    # checkpoint_every=3 is not a multiple of log_every=4: before, the loss window restarted at the
    # resume and step 4 logged the mean of one step instead of four
    kw = {"train.steps": 8, "train.log_every": 4, "train.checkpoint_every": 3, "train.eval_every": 0}
    full, part, _, _ = crash_and_resume(tiny_cfg, kw, tmp_path, monkeypatch, crash_after=5)
    assert [r["step"] for r in full] == [4, 8]
    assert part == full


def _vcycle_argv(data_dir, **kw):
    from test_multilevel import vcycle_overrides
    return vcycle_overrides(data_dir, **kw)


def test_vcycle_resume_with_more_steps_is_refused(tiny_data_dir, tmp_path, capsys):
    # before: --resume --train.steps=20 after 10 steps exited 0, trained nothing, rewrote the stage
    # plan in vcycle.json and shifted the logged steps
    run = tmp_path / "ml"
    assert main(["--out", str(run)] + _vcycle_argv(tiny_data_dir, **{"train.steps": 10})) == 0
    plan, metrics = (run / "vcycle.json").read_text(), (run / "metrics.jsonl").read_text()
    assert main(["--resume", str(run), "--train.steps=20"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot be extended or re-planned" in err, err
    assert (run / "vcycle.json").read_text() == plan and (run / "metrics.jsonl").read_text() == metrics


def _racing_vcycle_start(data_dir, out_dir):
    import accellib.drivers.vcycle as V
    from accellib.core.launch import process_state
    ps, orig = process_state(), V.plan_stages

    def late_plan(cfg):  # rank 1 arrives after rank 0 has written vcycle.json (or 5 s have passed)
        if ps.process_index == 1:
            deadline = time.monotonic() + 5
            while not (Path(out_dir) / "run" / "vcycle.json").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return orig(cfg)
    V.plan_stages = late_plan
    V.run_vcycle(load_config(None, _vcycle_argv(data_dir, **{"train.batch_size": 4, "train.steps": 4})),
                 Path(out_dir) / "run")


@pytest.mark.timeout(200)
def test_two_process_vcycle_start_is_decided_by_rank0(tiny_data_dir, tmp_path):
    # before: each rank checked for vcycle.json itself; a late rank 1 saw rank 0's fresh file and
    # failed with "already holds a V-cycle run" (3 times in 10 under torchrun)
    launch_processes(_racing_vcycle_start, (tiny_data_dir, tmp_path), 2, timeout_s=150)
    stages = json.loads((tmp_path / "run" / "vcycle.json").read_text())["stages"]
    final = json.loads((tmp_path / "run" / "record.json").read_text())["final"]
    assert final["step"] == sum(st["steps"] for st in stages)


def test_after_kill9_there_is_a_way_forward(tiny_data_dir, tmp_path):
    # before: with checkpoint_every=0, --resume said "start a new run" and a new run said "--resume"
    run = tmp_path / "run"
    argv = ["--out", str(run)] + tiny_overrides(tiny_data_dir, **{"train.steps": 10**6, "train.checkpoint_every": 0,
                                                                  "train.eval_every": 0})
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    kill9_after(argv, run, 3, tmp_path)
    res = subprocess.run([sys.executable, "-m", "accellib.train", "--resume", str(run)], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 2 and "--overwrite" in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = subprocess.run([sys.executable, "-m", "accellib.train"] + argv, env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 2 and "--overwrite" in res.stderr, res.stderr
    short = [a if not a.startswith("--train.steps") else "--train.steps=3" for a in argv]
    assert main(short + ["--overwrite"]) == 0
    assert read_metrics(run)[-1]["step"] == 3
    assert load_config().train.checkpoint_every > 0  # by default a run is resumable before its end


@pytest.mark.parametrize("bad", [["--pld.enabled=true", "--sbld.enabled=true"],            # techniques clash
                                 ["--multilevel.enabled=true", "--model.tie_head=true"]])  # V-cycle refuses
def test_overwrite_with_a_config_the_trainer_refuses_keeps_the_run(tiny_data_dir, tmp_path, bad):
    # the incompatibilities are found when the techniques / stages are built: that must happen
    # before --overwrite deletes the finished run
    run = tmp_path / "run"
    assert main(["--out", str(run)] + tiny_overrides(tiny_data_dir, **{"train.steps": 2})) == 0
    before = (run / "record.json").read_text()
    assert main(["--out", str(run), "--overwrite"] + tiny_overrides(tiny_data_dir) + bad) == 2
    assert (run / "record.json").read_text() == before and (run / "checkpoints" / "last").is_dir()


def test_a_second_command_on_a_running_folder_is_refused(tiny_cfg, tmp_path, capsys):
    # before: two `--resume` of one run both trained and interleaved their lines in metrics.jsonl
    from accellib.core.run_dir import LOCK
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 2}), run)
    metrics = (run / "metrics.jsonl").read_text()
    # a live process holds the folder (takes it as accellib.train does, then keeps running)
    code = (f"import time; from pathlib import Path; from accellib.core.run_dir import lock_run; "
            f"assert lock_run(Path({str(run)!r})) is None; print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["--resume", str(run), "--train.steps=4"]) == 2
        err = capsys.readouterr().err
        assert f"another process (pid {holder.pid}) is writing to {run}" in err
        assert (run / "metrics.jsonl").read_text() == metrics
    finally:
        holder.kill()
        holder.wait()
    # its process is gone (as after kill -9): the folder is taken over, and released at the end
    assert main(["--resume", str(run), "--train.steps=4"]) == 0
    assert [r["step"] for r in read_metrics(run)][-1] == 4 and not (run / LOCK).exists()


def test_two_real_resumes_cannot_interleave(tiny_data_dir, tmp_path):
    from accellib.core.run_dir import LOCK
    run = tmp_path / "run"
    argv = ["--out", str(run)] + tiny_overrides(tiny_data_dir, **{"train.steps": 2, "train.eval_every": 0})
    assert main(argv) == 0
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "accellib.train", "--resume", str(run), "--train.steps=3000"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (run / LOCK).exists():  # the first has taken the folder
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and "is writing to" in second.stderr, second.stderr
    finally:
        first.kill()
        first.wait()
    steps = [r["step"] for r in read_metrics(run)]
    assert steps == sorted(set(steps))  # one writer: strictly increasing, no duplicates


def test_the_folder_lock_is_the_os_lock_not_the_file(tmp_path):
    # before: a lock file still empty (its taker between create and write) or naming a dead pid was
    # "stale" and taken over, so two live processes could both hold a folder; now only the OS lock counts
    from accellib.core.run_dir import LOCK, lock_run, unlock_run
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text("")               # left over, held by nobody: taken
    assert lock_run(run) is None
    code = f"from pathlib import Path; from accellib.core.run_dir import lock_run; print(lock_run(Path({str(run)!r})))"
    other = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           capture_output=True, text=True, timeout=60)
    assert f"another process (pid {os.getpid()}) is writing to {run}" in other.stdout, other.stdout + other.stderr
    unlock_run(run)
    assert not run.exists()                   # released, and the folder it made empty is gone


@pytest.mark.parametrize("leftover", ["old_beside_last", "only_old", "half_written_tmp"])
def test_every_crash_point_of_the_checkpoint_swap_resumes(tiny_cfg, tmp_path, leftover):
    # save() swaps .tmp -> last through .old; a kill -9 can stop it between any two renames. CI once
    # hit "old beside last" (killed after tmp -> last, before .old was removed) and the resumed run's
    # next save died on rename(last, .old): Directory not empty
    import shutil
    kw = {"train.steps": 6, "train.checkpoint_every": 3, "train.eval_every": 3}
    full = training_function(tiny_cfg(**kw), tmp_path / "full")
    run = tmp_path / "run"
    training_function(tiny_cfg(**dict(kw, **{"train.steps": 3})), run)
    ck = run / "checkpoints"
    if leftover == "old_beside_last":
        shutil.copytree(ck / "last", ck / ".old")
        # a real .old is a recorded checkpoint renamed (its record follows its identity): record the copy as such
        from accellib.core.run_dir import note_checkpoint
        note_checkpoint(run, ck / ".old")
    elif leftover == "only_old":
        (ck / "last").rename(ck / ".old")
    else:
        shutil.copytree(ck / "last", ck / ".tmp")
        next(p for p in (ck / ".tmp").iterdir() if p.is_file()).write_bytes(b"truncated")
    final = training_function(tiny_cfg(**kw), run, resume=True)
    assert final["val_loss"] == full["val_loss"]
    assert sorted(p.name for p in ck.iterdir()) == ["last"]


def test_a_corpus_changed_after_a_cached_start_is_caught_at_resume(tiny_data_dir, tmp_path, capsys):
    # issue 15: the start-up checksums are cached by size and mtime. A train.bin rewritten since the
    # first start (same size) must be hashed again at resume, refused in one line, the checkpoint kept.
    import shutil
    data = tmp_path / "tiny"
    shutil.copytree(tiny_data_dir, data)
    for p in data.iterdir():  # built an hour ago: old enough to be cached
        t = p.stat().st_mtime_ns - 3600 * 10**9
        os.utime(p, ns=(t, t))
    run = tmp_path / "run"
    assert main(["--out", str(run), *tiny_overrides(data, **{"train.steps": 2, "train.eval_every": 0})]) == 0
    assert set(json.loads((data / ".verified.json").read_text())) == {"train.bin", "val.bin"}
    raw = bytearray((data / "train.bin").read_bytes())
    raw[10] ^= 0x01
    (data / "train.bin").write_bytes(bytes(raw))
    kept = (run / "checkpoints" / "last" / "pytorch_model.bin").read_bytes()
    capsys.readouterr()
    assert main(["--resume", str(run), "--train.steps=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.bin is corrupt (sha256 differs from meta.json)" in err[0], err
    assert (run / "checkpoints" / "last" / "pytorch_model.bin").read_bytes() == kept
    assert read_metrics(run)[-1]["step"] == 2


def test_compare_into_a_training_runs_folder_is_refused(tiny_data_dir, tmp_path, capsys):
    # issue 26 item 5: before, compare wrote baseline/, budget.json and summary.json among a live run's files
    cfg, run = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "run"
    hold = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                             "from accellib.core.run_dir import lock_run; assert lock_run(Path(sys.argv[1])) is None; "
                             "print('held', flush=True); time.sleep(60)", str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout.readline().strip() == "held"             # a training has taken the folder
        for extra in ([], ["--resume"], ["--overwrite"]):
            assert compare_main(["--config", str(cfg), "--out", str(run), *extra]) == 2
            err = capsys.readouterr().err
            assert "is the folder of a training run" in err and "--out" in err and err.count("\n") == 1, err
        assert sorted(p.name for p in run.iterdir()) == [".accellib.lock"]
    finally:
        hold.kill()
        hold.wait()
    training_function(load_config(None, tiny_overrides(tiny_data_dir, **{"train.steps": 1})), run)
    files = sorted(p.name for p in run.iterdir())                   # a finished run's folder: refused as well
    assert compare_main(["--config", str(cfg), "--out", str(run)]) == 2
    assert "is the folder of a training run" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == files


def test_compare_resume_with_nothing_to_resume_is_refused(tiny_data_dir, tmp_path, capsys):
    # issue 26 item 6: before, a mistyped --out started the whole comparison anew
    cfg, out = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(tmp_path / "cpm"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "holds no comparison to resume" in err and err.count("\n") == 1, err
    assert not (tmp_path / "cpm").exists()
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline"]) == 0
    assert compare_main(["--config", str(cfg), "--out", str(out), "--resume"]) == 0   # adds pld: resumes the comparison
    assert (out / "pld" / "record.json").is_file()


# ----------------------------------------------------------------------------- issue 36: what --overwrite may delete
def _users_folder(root: Path) -> tuple[Path, dict]:
    """A folder of the user's own files under the names accellib writes (the issue's reproduction)."""
    d = root / "mine"
    files = {"config.yaml": "my: own config\n", "checkpoints/model_epoch9.pt": "weights",
             "tensorboard/notes.txt": "mine", "hf/README.md": "my export"}
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return d, files


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_of_the_users_files_is_never_replaced(tiny_data_dir, tmp_path, capsys, overwrite):
    # issue 36 item 1: before, "already holds a run ... replace it with --overwrite", and --overwrite replaced the
    # user's config.yaml and deleted checkpoints/, tensorboard/ and hf/
    d, files = _users_folder(tmp_path)
    argv = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(d)] + tiny_overrides(tiny_data_dir)
    assert main(argv + (["--overwrite"] if overwrite else [])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "accellib did not write" in err, err
    assert "--overwrite" not in err.split(";")[0] and "replace it with --overwrite" not in err
    assert {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()} == set(files)
    assert all((d / n).read_text() == t for n, t in files.items())


def test_overwrite_keeps_what_accellib_did_not_write_in_a_run(tiny_cfg, tmp_path, capsys):
    # a real run, into whose checkpoints/ the user put a file of their own: --overwrite refuses rather than delete it
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 2}), run)
    (run / "checkpoints" / "model_epoch9.pt").write_text("mine")
    (run / "notes.txt").write_text("mine too")                    # outside accellib's names: kept by any overwrite
    argv = ["--config", str(run / "config.yaml"), "--out", str(run), "--overwrite", "--train.steps=3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "checkpoints/model_epoch9.pt" in err and "would delete" in err, err
    assert (run / "checkpoints" / "model_epoch9.pt").read_text() == "mine" and (run / "checkpoints" / "last").is_dir()
    (run / "checkpoints" / "model_epoch9.pt").unlink()
    assert main(argv) == 0
    assert read_metrics(run)[-1]["step"] == 3 and (run / "notes.txt").read_text() == "mine too"


def test_a_run_written_before_the_marker_is_adopted_not_guessed(tiny_cfg, tmp_path, capsys):
    # issue 43: a folder without accellib's record is never taken for a run by its file names (the user's config.yaml
    # and metrics.jsonl were); a run written before records existed is adopted with one command, then resumes
    from accellib.core.run_dir import COPY, MARKER, holds_run
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 2}), run)
    (run / MARKER).unlink()
    (run / COPY).unlink()
    assert not holds_run(run)
    assert main(["--resume", str(run), "--train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert "holds no run to resume" in err and f"python -m accellib.train --adopt {run}" in err and err.count("\n") == 1
    assert main(["--adopt", str(run)]) == 0 and holds_run(run)
    assert main(["--resume", str(run), "--train.steps=3"]) == 0 and (run / MARKER).is_file()


@pytest.mark.parametrize("out", [".", ""])
def test_the_current_folder_is_refused(tiny_data_dir, tmp_path, monkeypatch, capsys, out):
    # issue 36 item 1: before, `train --out .` and `compare --out ""` wrote a run or a comparison into the checkout's root
    (tmp_path / "c").mkdir()
    cfg = _small_yaml(tmp_path / "c", tiny_data_dir)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["--out", out] + tiny_overrides(tiny_data_dir)) == 2
    err = capsys.readouterr().err
    assert ("is the current folder" if out else "--out is required") in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert compare_main(["--config", str(cfg), "--out", out, "--arms", "baseline"]) == 2
    err = capsys.readouterr().err
    assert "is the current folder" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_training_into_a_comparisons_folder_is_refused(tiny_data_dir, tmp_path, capsys):
    # issue 36 item 5: before, it was accepted, and the comparison could then neither --resume nor add an arm
    cfg, out = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert main(["--out", str(out)] + tiny_overrides(tiny_data_dir)) == 2
    err = capsys.readouterr().err
    assert "is the folder of a comparison" in err and err.count("\n") == 1, err
    assert main(["--out", str(out), "--overwrite"] + tiny_overrides(tiny_data_dir)) == 2
    assert sorted(p.name for p in out.iterdir()) == files
    assert compare_main(["--config", str(cfg), "--out", str(out), "--resume"]) == 0   # still resumable: adds pld


def test_compare_into_a_folder_of_the_users_files_is_refused(tiny_data_dir, tmp_path, capsys):
    cfg = _small_yaml(tmp_path, tiny_data_dir)
    d, files = _users_folder(tmp_path)
    for extra in ([], ["--overwrite"]):
        assert compare_main(["--config", str(cfg), "--out", str(d), "--arms", "baseline", *extra]) == 2
        assert "accellib did not write" in capsys.readouterr().err
    assert {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()} == set(files)


# ----------------------------------------------------------------------------- issue 36: a resume's options
def test_a_plain_resume_continues_with_the_last_resumes_options(tiny_cfg, tmp_path, capsys):
    # issue 36 item 3: before, a plain --resume after `--resume --optim.lr=1e-3` went back to config.yaml's LR
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 4, "train.checkpoint_every": 2}), run)
    capsys.readouterr()
    assert main(["--resume", str(run), "--train.steps=6", "--optim.lr=0.001"]) == 0
    out = capsys.readouterr().out
    assert "resumed from step 4" in out and "optim.lr=0.001, train.steps=6 (from this command)" in out, out
    assert main(["--resume", str(run), "--train.steps=8"]) == 0
    out = capsys.readouterr().out
    assert "resumed from step 6" in out and "optim.lr=0.001 (kept from its last resume" in out, out
    assert "train.steps=8 (from this command)" in out
    from accellib.core.schedules import WarmupCosine
    after = [r for r in read_metrics(run) if r["step"] > 6]              # before: the cosine of config.yaml's 5e-3
    assert after and all(r["lr"] == pytest.approx(WarmupCosine(0.001, 2, 8, 0.1).at(r["step"] - 1)) for r in after)
    assert [r["changes"] for r in json.loads((run / "record.json").read_text())["resumes"]] == \
        [{"optim.lr": [0.005, 0.001], "train.steps": [4, 6]}, {"optim.lr": [0.005, 0.001], "train.steps": [4, 8]}]
    assert main(["--resume", str(run), "--train.steps=9", "--optim.lr=0.005"]) == 0   # set back explicitly
    assert "optim.lr" not in capsys.readouterr().out.splitlines()[0]


# ----------------------------------------------------------------------------- issue 36: keeping N checkpoints
def test_keep_checkpoints_keeps_the_newest_n(tiny_cfg, tmp_path):
    # before: only checkpoints/last was ever kept (1.49 GB at GPT-2 small; no way to keep more)
    from accellib.core.run_dir import checkpoint_state
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 8, "train.checkpoint_every": 2, "train.keep_checkpoints": 3}), run)
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["last", "step_4", "step_6"]
    assert [checkpoint_state(ck / n)["step"] for n in ("step_4", "step_6", "last")] == [4, 6, 8]
    one = tmp_path / "one"
    training_function(tiny_cfg(**{"train.steps": 8, "train.checkpoint_every": 2}), one)   # the default: last only
    assert sorted(p.name for p in (one / "checkpoints").iterdir()) == ["last"]
    # a resume with fewer kept prunes to it; a kill between the swap's two renames resumes from the newest kept one
    assert main(["--resume", str(run), "--train.steps=10", "--train.keep_checkpoints=2"]) == 0
    assert sorted(p.name for p in ck.iterdir()) == ["last", "step_8"]
    (ck / "last").rename(ck / ".tmp")                                # as if killed between the two renames
    assert main(["--resume", str(run), "--train.steps=12"]) == 0
    assert read_metrics(run)[-1]["step"] == 12 and [r["step"] for r in read_metrics(run)].count(9) == 1
