"""Multi-node that resumes (issue 27): every process must see the run folder the main process writes. Two
real gloo processes stand in for two machines without a shared filesystem: each gets its own --out."""
import json
from pathlib import Path

import pytest

from accellib.core.config import load_config
from accellib.core.launch import LaunchError, launch_processes
from conftest import tiny_overrides


def _train_into(data_dir, outs, report):
    from accelerate.state import PartialState

    from accellib.train import training_function
    rank = PartialState(cpu=True).process_index
    cfg = load_config(None, tiny_overrides(data_dir, **{"train.steps": 2}))
    try:
        training_function(cfg, Path(outs[rank]))
        msg = None
    except LaunchError as e:
        msg = str(e)
    Path(report, f"rank{rank}.json").write_text(json.dumps(msg))


@pytest.mark.timeout(180)
def test_a_run_folder_not_shared_by_every_process_stops_every_process_in_one_line(tiny_data_dir, tmp_path):
    outs = [str(tmp_path / "node0" / "run"), str(tmp_path / "node1" / "run")]   # two "machines", no shared disk
    (tmp_path / "node1" / "run").mkdir(parents=True)
    launch_processes(_train_into, (tiny_data_dir, outs, tmp_path), 2, timeout_s=150)
    msgs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert msgs[0] == msgs[1] and msgs[0] is not None and "\n" not in msgs[0]
    assert msgs[0].startswith("process(es) [1] of 2 do not see the run folder") and "shared by every node" in msgs[0]
    assert not (tmp_path / "node0" / "run" / "checkpoints").exists()   # stopped before training
    assert not (tmp_path / "node0" / "run" / ".run_token").exists()


@pytest.mark.timeout(180)
def test_a_shared_run_folder_passes_and_leaves_no_token(tiny_data_dir, tmp_path):
    outs = [str(tmp_path / "run")] * 2
    launch_processes(_train_into, (tiny_data_dir, outs, tmp_path), 2, timeout_s=150)
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)] == [None, None]
    assert (tmp_path / "run" / "checkpoints" / "last").is_dir() and not (tmp_path / "run" / ".run_token").exists()
