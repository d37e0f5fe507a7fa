"""Issue 43: --overwrite deletes exactly what accellib recorded writing, and nothing of the user's; a damaged
checkpoints/last falls back to a kept checkpoint; a resume's options survive a damaged marker. Each test failed
on the code before (noted per test); the property test checks the rule on random trees."""
import os
import random
import shutil
from pathlib import Path

import pytest

from accellib.compare import main as compare_main
from accellib.core.options import ConfigError
from accellib.core.records import read_metrics, read_record
from accellib.core.run_dir import (COPY, LOCK, MARKER, NEXT_RUN, clear_run, note_checkpoint, note_written, plan_clear,
                                   write_marker)
from accellib.core.trainer import Trainer
from accellib.train import main, training_function
from conftest import tiny_overrides
from test_nothing_lost import ROOT, _small_yaml, _vcycle_argv


def files_of(d: Path) -> dict:
    """Every file under `d` (through no link) with its bytes, and every link with its target."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in files + [x for x in dirs if os.path.islink(os.path.join(root, x))]:
            p = Path(root, n)
            out[str(p.relative_to(d))] = ("->", os.readlink(p)) if p.is_symlink() else p.read_bytes()
    return out


def one_line(err: str) -> str:
    err = err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- the user's folders
@pytest.mark.parametrize("names", [("config.yaml", "metrics.jsonl"), ("config.yaml", "vcycle.json", "loss.png")])
def test_the_users_files_at_accellibs_names_are_no_run(tiny_data_dir, tmp_path, capsys, names):
    # before: taken for a run written before the marker ("already holds a run ... replace it with --overwrite"), and
    # --overwrite replaced them (rc 0)
    d = tmp_path / "mine"
    d.mkdir()
    for n in names:
        (d / n).write_text(f"my own {n}\n")
    before = files_of(d)
    argv = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(d)] + tiny_overrides(tiny_data_dir)
    for extra in ([], ["--overwrite"]):
        assert main(argv + extra) == 2
        err = one_line(capsys.readouterr().err)
        assert "accellib did not write" in err and "--overwrite" not in err.split(";")[0], err
        assert files_of(d) == before


def test_the_users_files_inside_a_runs_folders_are_kept(tiny_cfg, tmp_path, capsys):
    # before: --overwrite deleted checkpoints/last/my_notes.txt and the whole checkpoints/step_900/ of the user's
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 2}), run)
    (run / "checkpoints" / "last" / "my_notes.txt").write_text("notes")
    (run / "checkpoints" / "step_900").mkdir()
    (run / "checkpoints" / "step_900" / "model.pt").write_bytes(b"my weights")
    before = files_of(run)
    argv = ["--config", str(run / "config.yaml"), "--out", str(run), "--overwrite", "--train.steps=3"]
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert "checkpoints/last/my_notes.txt" in err and "checkpoints/step_900/" in err and "move them" in err, err
    assert files_of(run) == before
    shutil.move(run / "checkpoints" / "last" / "my_notes.txt", tmp_path / "my_notes.txt")
    shutil.move(run / "checkpoints" / "step_900", tmp_path / "step_900")
    assert main(argv) == 0 and read_metrics(run)[-1]["step"] == 3


def test_the_users_file_in_a_stage_folder_is_kept(tiny_data_dir, tmp_path, capsys):
    # before: --overwrite of a V-cycle run deleted stage_0/ whole, with the user's notes.txt in it
    run = tmp_path / "ml"
    argv = ["--out", str(run)] + _vcycle_argv(tiny_data_dir, **{"train.steps": 10})
    assert main(argv) == 0
    (run / "stage_0" / "notes.txt").write_text("mine")
    before = files_of(run)
    assert main(argv + ["--overwrite"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "stage_0/notes.txt" in err, err
    assert files_of(run) == before
    (run / "stage_0" / "notes.txt").unlink()
    assert main(argv + ["--overwrite"]) == 0
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("stage_")) == ["stage_0", "stage_1", "stage_2"]


def test_symlinked_checkpoints_and_tensorboard_are_unlinked_not_followed(tiny_cfg, tmp_path, capsys):
    # before: --overwrite deleted config.yaml, metrics.jsonl, record.json, loss.png, then crashed with a 25-line
    # "OSError: Cannot call rmtree on a symbolic link", leaving a run that could be neither resumed nor overwritten
    run, scratch = tmp_path / "run", tmp_path / "scratch"
    kw = {"train.steps": 2, "log.trackers": "tensorboard"}
    training_function(tiny_cfg(**kw), run)
    scratch.mkdir()
    for name in ("checkpoints", "tensorboard"):   # moved to a scratch disk, a link left in their place
        shutil.move(run / name, scratch / name)
        (run / name).symlink_to(scratch / name, target_is_directory=True)
    kept = files_of(scratch)
    argv = ["--config", str(run / "config.yaml"), "--out", str(run), "--overwrite", "--train.steps=3"]
    assert main(argv) == 0, capsys.readouterr().err
    assert files_of(scratch) == kept                                  # the targets untouched
    assert not (run / "checkpoints").is_symlink() and (run / "checkpoints" / "last").is_dir()
    assert read_metrics(run)[-1]["step"] == 3 and read_record(run)["final"]["step"] == 3


# ----------------------------------------------------------------------------- kept checkpoints: a fallback
def test_a_damaged_last_falls_back_to_the_newest_intact_kept_checkpoint(tiny_cfg, tmp_path, capsys):
    # before: the resume failed on checkpoints/last and advised --overwrite, which deletes the intact step_6/ and
    # step_4/ kept for exactly this case
    kw = {"train.steps": 8, "train.checkpoint_every": 2, "train.keep_checkpoints": 3}
    run = tmp_path / "run"
    training_function(tiny_cfg(**kw), run)
    ref = tmp_path / "ref"                                            # the same run, resumed from step_6 with no last
    shutil.copytree(run, ref, symlinks=True)
    shutil.rmtree(ref / "checkpoints" / "last")
    want = training_function(tiny_cfg(**dict(kw, **{"train.steps": 10})), ref, resume=True)
    ck = run / "checkpoints"
    (ck / "last" / "optimizer.bin").write_bytes(b"")                 # damaged: a zero-byte optimizer state
    capsys.readouterr()
    assert main(["--resume", str(run), "--train.steps=10"]) == 0
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if "is damaged (" in ln]
    assert len(said) == 1 and "optimizer.bin" in said[0] and "resuming from checkpoints/step_6 (step 6)" in said[0], out
    assert "resumed from step 6" in out
    assert read_record(run)["final"]["val_loss"] == want["val_loss"]
    assert (ck / "last.damaged" / "optimizer.bin").stat().st_size == 0  # kept for inspection, not deleted


def test_no_advice_deletes_an_intact_checkpoint(tiny_cfg, tmp_path, capsys):
    # before: a new run into a run's folder said "... continue it with --resume, or replace it with --overwrite"
    from accellib.core.run_dir import unreadable_advice
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 4, "train.checkpoint_every": 2, "train.keep_checkpoints": 2}), run)
    assert main(["--out", str(run)] + [f"--data.path={tiny_cfg().data.path}"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--resume" in err and "--overwrite" not in err, err
    advice = unreadable_advice(run, run / "checkpoints" / "last")      # for the loader's "cannot be read" line
    assert "--overwrite" not in advice and "step_2" in advice, advice


# ----------------------------------------------------------------------------- comparisons
def test_compare_overwrite_checks_every_arm_before_training_any(tiny_data_dir, tmp_path, capsys):
    # before: the baseline was retrained, then the user's folder named like the pld arm was refused
    cfg, out = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline"]) == 0
    (out / "pld").mkdir()
    (out / "pld" / "notes.txt").write_text("mine")
    before = files_of(out)
    assert compare_main(["--config", str(cfg), "--out", str(out), "--overwrite"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "pld" in err and "accellib did not write" in err, err
    assert files_of(out) == before                                    # nothing retrained, nothing deleted


def test_an_arm_refuses_a_training_from_outside_its_comparison(tiny_data_dir, tmp_path, capsys):
    # before: accepted with another config, and the comparison could no longer --resume
    cfg, out = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline"]) == 0
    before = files_of(out)
    argv = ["--out", str(out / "baseline"), "--overwrite"] + tiny_overrides(tiny_data_dir, **{"optim.lr": 0.001})
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert "is arm baseline of the comparison" in err and "accellib.compare" in err, err
    assert files_of(out) == before
    assert compare_main(["--config", str(cfg), "--out", str(out), "--resume"]) == 0


# ----------------------------------------------------------------------------- an override and a damaged marker
def test_a_resumes_options_survive_a_damaged_marker(tiny_cfg, tmp_path, capsys, monkeypatch):
    # before: the marker was the only copy of --optim.lr=0.001 until the next checkpoint; damaged, a plain --resume
    # silently went back to config.yaml's LR
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 4, "train.checkpoint_every": 2}), run)
    orig = Trainer.train_step

    def crash(self):
        if self.state.step == 5:   # after the resume was accepted, before its first checkpoint (step 6)
            raise KeyboardInterrupt
        return orig(self)
    monkeypatch.setattr(Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        main(["--resume", str(run), "--train.steps=8", "--optim.lr=0.001"])
    monkeypatch.setattr(Trainer, "train_step", orig)
    (run / MARKER).write_text('{"kind": "ru')                         # damaged (a torn write, a bad disk)
    capsys.readouterr()
    assert main(["--resume", str(run), "--train.steps=8"]) == 0
    out = capsys.readouterr().out
    assert "optim.lr=0.001 (kept from its last resume" in out, out
    assert read_record(run)["resumes"][-1]["changes"]["optim.lr"] == [0.005, 0.001]


# ----------------------------------------------------------------------------- the rule, on random trees
CK_FILES = ["pytorch_model.bin", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"]
LIKE = ["pytorch_model.bin", "config.yaml", "metrics.jsonl", "events.out.tfevents.1.host", "notes.txt", "step_900",
        "last", "model.pt", "stage_3", "final_model.pt"]  # the user's names, many of them accellib's


def _write(p: Path, rng: random.Random) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(rng.randbytes(rng.randint(0, 40)))


def _accellib_run(run: Path, rng: random.Random, depth: int = 0) -> set[str]:
    """A run folder written as accellib writes one, recorded as it writes; its files (relative to `run`)."""
    run.mkdir(parents=True)
    write_marker(run, "run")
    mine = set()
    for n in ["config.yaml", "metrics.jsonl"] + rng.sample(["record.json", "loss.png", "vcycle.json"], rng.randint(0, 3)):
        _write(run / n, rng)
        note_written(run, [n])
        mine.add(n)
    for name in rng.sample(["last", ".old", "step_4", "step_8"], rng.randint(0, 3)):
        ck = run / "checkpoints" / name
        for f in rng.sample(CK_FILES, rng.randint(1, 5)) + (["pytorch_model_fsdp_0/__0_0.distcp"] if rng.random() < .3 else []):
            _write(ck / f, rng)
            mine.add(f"checkpoints/{name}/{f}")
        note_checkpoint(run, ck)
    if rng.random() < .5:
        files = [f"tensorboard/run/events.out.tfevents.{k}.host" for k in range(rng.randint(1, 2))] + ["tensorboard/run/hparams.yml"]
        for f in files:
            _write(run / f, rng)
        note_written(run, files)
        mine.update(files)
    for k in range(rng.randint(0, 2) if depth == 0 else 0):
        note_written(run, runs=[f"stage_{k}"])
        mine.update(f"stage_{k}/{f}" for f in _accellib_run(run / f"stage_{k}", rng, depth + 1))
    return mine


def _random_case(root: Path, seed: int) -> tuple[Path, Path, set, dict, bool]:
    """A run with the user's files and links added: (run, scratch, accellib's files still in the run, the user's
    files, whether any of the user's entries is where --overwrite must refuse)."""
    rng = random.Random(seed)
    run, scratch = root / "run", root / "scratch"
    mine = _accellib_run(run, rng)
    scratch.mkdir()
    _write(scratch / "elsewhere.txt", rng)
    # accellib's folders or files moved to a scratch disk, a link left in their place (never followed, only unlinked)
    movable = sorted({p.split("/")[0] for p in mine} & {"checkpoints", "tensorboard", "stage_0", "config.yaml"})
    for name in rng.sample(movable, rng.randint(0, min(2, len(movable)))):
        shutil.move(run / name, scratch / name)
        (run / name).symlink_to(scratch / name)
        mine = {p for p in mine if p != name and not p.startswith(name + "/")} | {name}  # the link is accellib's
    # the user's entries: beside the run, inside accellib's folders (there they stop the overwrite), as links too
    refuse = False
    inside = sorted({str(Path(p).parent) for p in mine if "/" in p})
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        where = rng.choice(["."] * 2 + inside) if inside else "."
        name = rng.choice(LIKE)
        p = run / where / name
        if os.path.lexists(p):
            continue
        if rng.random() < .2:
            p.symlink_to(scratch / "elsewhere.txt")
        elif rng.random() < .3:
            _write(p / "inner.bin", rng)                                 # a folder of the user's
        else:
            _write(p, rng)
        refuse |= where != "." or name in NEXT_RUN or name.startswith("stage_")
    user = {k: v for k, v in files_of(root).items() if not k.startswith("run/") or k[4:] not in mine}
    user = {k: v for k, v in user.items() if not (k.startswith("run/") and Path(k).name in (MARKER, COPY))}
    return run, scratch, mine, user, refuse


@pytest.mark.parametrize("block", range(4))
def test_overwrite_keeps_every_user_file_on_random_trees(tmp_path, monkeypatch, block):
    # the rule: --overwrite deletes every file accellib recorded and nothing else (byte for byte, links unfollowed),
    # or refuses, deleting nothing, when the user's entries are where it would delete or the next run writes
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # (the records' durability is not what this checks)
    outcomes = []
    for seed in range(block * 100, block * 100 + 100):
        root = tmp_path / str(seed)
        run, scratch, mine, user, refuse = _random_case(root, seed)
        before = files_of(root)
        _, foreign = plan_clear(run)
        assert bool(foreign) == refuse, (seed, foreign)
        if refuse:
            with pytest.raises(ConfigError, match="move them out"):
                clear_run(run)
            assert files_of(root) == before, seed                      # refused before deleting anything
        else:
            clear_run(run)
            after = files_of(root)
            assert {k: after.get(k) for k in user} == user, seed       # every user file byte-identical
            assert not any(k[4:] in mine for k in after if k.startswith("run/")), seed   # every accellib file gone
            assert not any(os.path.lexists(run / n) for n in (MARKER, COPY, LOCK))
        outcomes.append(refuse)
        shutil.rmtree(root)
    assert 20 < sum(outcomes) < 80  # both outcomes well exercised


def test_kept_checkpoints_are_recorded_when_saved(tiny_cfg, tmp_path, capsys):
    # every checkpoint Trainer.save writes is recorded before its renames (.tmp -> last -> step_<k> or .old), so
    # --overwrite deletes the kept ones too, also after a kill between two renames
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 8, "train.checkpoint_every": 2, "train.keep_checkpoints": 3}), run)
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["last", "step_4", "step_6"]
    (ck / "last").rename(ck / ".old")                                 # as if killed between the two renames
    assert plan_clear(run)[1] == []
    argv = ["--config", str(run / "config.yaml"), "--out", str(run), "--overwrite", "--train.steps=2"]
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in ck.iterdir()) == ["last"]


def test_pruning_kept_checkpoints_deletes_only_what_accellib_wrote(tiny_cfg, tmp_path):
    """train.keep_checkpoints prunes the older kept checkpoints by their record: a file of the user's inside one
    (and the folder holding it) stays, and a step_<k> folder accellib never wrote is never touched."""
    from accellib.train import training_function
    run = tmp_path / "run"
    kw = {"train.steps": 8, "train.checkpoint_every": 2, "train.eval_every": 0, "train.keep_checkpoints": 2}
    training_function(tiny_cfg(**dict(kw, **{"train.steps": 4})), run)
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["last", "step_2"]
    (ck / "step_2" / "my_notes.txt").write_text("mine")
    (ck / "step_900").mkdir()
    (ck / "step_900" / "model.pt").write_bytes(b"not accellib's")
    training_function(tiny_cfg(**kw), run, resume=True)
    assert (ck / "step_2" / "my_notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (ck / "step_2").iterdir()) == ["my_notes.txt"]   # accellib's files went
    assert (ck / "step_900" / "model.pt").read_bytes() == b"not accellib's"
    assert (ck / "step_6").is_dir() and (ck / "last").is_dir()


# ----------------------------------------------------------------------------- runs of an earlier accellib
def _strip_records(top: Path) -> None:
    """Make every marker under `top` what the accellib before records wrote: kind and written_by only, no copy."""
    import json
    for m in top.rglob(MARKER):
        d = json.loads(m.read_text())
        m.write_text(json.dumps({k: v for k, v in d.items() if k in ("kind", "written_by", "arm")}))
        (m.parent / COPY).unlink(missing_ok=True)


def test_a_run_of_an_earlier_accellib_is_adopted_then_overwritten_keeping_the_users_files(tiny_cfg, tmp_path, capsys):
    # before this: its marker without a record made --overwrite refuse every file as foreign, and --adopt refuse
    # ("already accellib's"), so the run could be neither replaced nor adopted; and --adopt recorded every file in
    # the folder, the user's notes.txt beside the run included, so the --overwrite it advised deleted them
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 2, "train.eval_every": 0}), run)
    _strip_records(run)
    (run / "notes.txt").write_text("mine")
    data = Path(read_record(run)["config"]["data"]["path"])
    argv = ["--out", str(run), "--overwrite"] + tiny_overrides(data, **{"train.steps": 2, "train.eval_every": 0})
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert "an earlier accellib" in err and f"python -m accellib.train --adopt {run}" in err, err
    assert main(["--adopt", str(run)]) == 0 and "other files stay yours" in capsys.readouterr().out
    assert main(argv) == 0
    assert (run / "notes.txt").read_text() == "mine" and (run / "checkpoints" / "last").is_dir()


def test_a_comparison_of_an_earlier_accellib_is_adopted_with_its_arms(tiny_data_dir, tmp_path, capsys):
    cfg, out = _small_yaml(tmp_path, tiny_data_dir), tmp_path / "cmp"
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline"]) == 0
    _strip_records(out)
    assert main(["--adopt", str(out)]) == 0 and "1 run(s)" in capsys.readouterr().out
    assert compare_main(["--config", str(cfg), "--out", str(out), "--arms", "baseline", "--overwrite"]) == 0


def test_adopt_needs_evidence_that_accellib_wrote_the_folder(tmp_path, capsys):
    # review of issue 43: --adopt took any folder with a config.yaml, and the --overwrite it then allowed replaced the
    # user's metrics.jsonl and deleted checkpoints/model_epoch9.pt (the first case, by another door)
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "config.yaml").write_text("model:\n  n_layer: 2\n")
    (mine / "metrics.jsonl").write_text("{}\n")
    (mine / "checkpoints" / "model_epoch9.pt").write_bytes(b"mine")
    before = files_of(mine)
    assert main(["--adopt", str(mine)]) == 2
    assert "nothing says accellib wrote it" in one_line(capsys.readouterr().err)
    assert files_of(mine) == before and not (mine / MARKER).exists()


def test_a_pruned_checkpoints_record_goes_with_it(tiny_cfg, tmp_path):
    # review of issue 43: a pruned folder's entry stayed, and the file system gives its inode to the next .tmp, which
    # then matched the stale entry (its old sizes): intact checkpoints read as damaged
    import json
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 10, "train.checkpoint_every": 1, "train.keep_checkpoints": 2,
                                  "train.eval_every": 0}), run)
    rec = json.loads((run / MARKER).read_text())
    here = {(os.stat(p).st_dev, os.stat(p).st_ino) for p in (run / "checkpoints").iterdir()}
    assert {tuple(e["id"]) for e in rec["checkpoints"]} == here and len(here) == 2   # no stale entry left
    from accellib.core.run_dir import damage
    assert all(damage(p) is None for p in (run / "checkpoints").iterdir())


def test_a_torn_last_log_line_does_not_stop_a_resume(tiny_cfg, tmp_path, monkeypatch):
    # review of issue 43: a kill while a line of metrics.jsonl was written left half a line; --resume then failed
    # with a JSONDecodeError traceback (and its truncation rewrote the file in place, so a kill there emptied it)
    from conftest import crash_and_resume  # noqa: F401  (the same fixture data)
    run = tmp_path / "run"
    kw = {"train.steps": 4, "train.checkpoint_every": 2, "train.eval_every": 0, "train.log_every": 1}
    training_function(tiny_cfg(**dict(kw, **{"train.steps": 2})), run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "train_lo')
    training_function(tiny_cfg(**kw), run, resume=True)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
