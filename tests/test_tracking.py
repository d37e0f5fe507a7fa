"""Live tracking through Accelerate's trackers (issue 14, "Track"): --log.trackers=tensorboard sends the
numbers of metrics.jsonl, which stays the record, to TensorBoard event files in <run>/tensorboard/<project>/."""
import time

import pytest
import yaml

from accellib.core.launch import launch_processes
from accellib.core.records import read_metrics
from accellib.train import main, training_function
from accellib.core.trainer import Trainer
from conftest import tiny_overrides, train_run


def scalars(run, project=None) -> dict:
    """tag -> [(step, value)] as TensorBoard reads the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(run / "tensorboard" / (project or run.name)))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def assert_tracked_as_metrics(run, project=None) -> None:
    """Every numeric field of metrics.jsonl is a scalar with the same steps and values (float32 in the file)."""
    recs, tb = read_metrics(run), scalars(run, project)
    fields = {k for r in recs for k, v in r.items() if k != "step" and isinstance(v, (int, float))}
    assert {"train_loss", "val_loss"} <= fields and set(tb) == fields
    for tag in fields:
        want = [(r["step"], r[tag]) for r in recs if tag in r]
        assert [s for s, _ in tb[tag]] == [s for s, _ in want], tag
        assert [v for _, v in tb[tag]] == pytest.approx([v for _, v in want], rel=1e-6), tag


def test_tensorboard_gets_the_metrics(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"log.trackers": "tensorboard", "train.steps": 5, "train.log_every": 2}), run)
    assert_tracked_as_metrics(run)
    assert [r["step"] for r in read_metrics(run)] == [2, 3, 4, 5]
    assert yaml.safe_load((run / "config.yaml").read_text())["log"] == {"trackers": ["tensorboard"], "project": ""}


def test_project_names_the_tensorboard_folder(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"log.trackers": "[tensorboard]", "log.project": "demo", "train.steps": 2}), run)
    assert [p.name for p in (run / "tensorboard").iterdir()] == ["demo"]
    assert_tracked_as_metrics(run, "demo")


def test_cli_resume_appends_to_the_tracked_run(tiny_data_dir, tmp_path, monkeypatch):
    # crash during step 7 (step 6 was logged after the step-4 checkpoint), resume from the command line: the
    # resumed steps appear once, as in metrics.jsonl (step 6, logged again, is not out of order for TensorBoard:
    # only the resumed writer's purge_step hides the first one)
    run = tmp_path / "run"
    kw = {"train.steps": 8, "train.checkpoint_every": 4, "train.log_every": 2, "train.eval_every": 2}
    argv = ["--out", str(run), *tiny_overrides(tiny_data_dir, **kw), "--log.trackers=tensorboard"]
    orig = Trainer.train_step

    def crash(self):
        if self.state.step == 6:
            raise KeyboardInterrupt
        return orig(self)
    monkeypatch.setattr(Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    assert [s for s, _ in scalars(run)["train_loss"]] == [2, 4, 6]  # flushed although the run failed
    monkeypatch.setattr(Trainer, "train_step", orig)
    time.sleep(1)  # event files are ordered by name, which begins with the second they were opened in
    assert main(["--resume", str(run)]) == 0  # the stored config.yaml keeps log.trackers
    assert [r["step"] for r in read_metrics(run)] == [2, 4, 6, 8]
    assert_tracked_as_metrics(run)


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_bad_or_missing_tracker_is_one_line(tiny_data_dir, tmp_path, capsys, monkeypatch):
    base = ["--out", str(tmp_path / "r"), *tiny_overrides(tiny_data_dir)]
    err = one_line_error(capsys, base + ["--log.trackers=tensorboard,nope"])
    assert "log.trackers='nope' is not allowed" in err and "wandb" in err
    monkeypatch.setattr("accellib.core.launch.tracker_available", lambda name: name != "wandb")
    err = one_line_error(capsys, base + ["--log.trackers=tensorboard,wandb"])
    assert "log.trackers=wandb needs the wandb package: pip install wandb" in err
    err = one_line_error(capsys, base + ["--log.trackers=tensorboard", "--multilevel.enabled=true",
                                         "--model.tie_head=false"])
    assert "does not work with multilevel" in err
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_no_trackers_no_tracker_files(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 2}), run)
    assert not (run / "tensorboard").exists()
    assert yaml.safe_load((run / "config.yaml").read_text())["log"]["trackers"] == []


def test_overwrite_drops_the_replaced_runs_events(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"log.trackers": "tensorboard", "train.steps": 4}), run)
    training_function(tiny_cfg(**{"log.trackers": "tensorboard", "train.steps": 2}), run, overwrite=True)
    assert_tracked_as_metrics(run)
    assert [s for s, _ in scalars(run)["train_loss"]] == [1, 2]


@pytest.mark.timeout(180)
def test_two_processes_track_once(tiny_data_dir, tmp_path):
    # Accelerate starts and feeds the trackers on the main process only: one event file, the run's numbers
    run = tmp_path / "run"
    launch_processes(train_run, (tiny_data_dir, run, {"log.trackers": "tensorboard", "train.steps": 3}), 2,
                     timeout_s=150)
    assert len(list((run / "tensorboard" / "run").glob("events.out.tfevents.*"))) == 1
    assert_tracked_as_metrics(run)
