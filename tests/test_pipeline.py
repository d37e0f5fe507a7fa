"""Modular pipeline parallelism on torch.distributed.pipelining: every schedule on gloo ranks matches
the unpartitioned model (loss, gradients, 3 SGD steps); placement; the clear errors."""
import pytest

from accellib.parallel.pipeline import PipelineError, check_config, placement, spawn, split_layers

JOBS2 = [dict(schedule="gpipe", v=1, n_mb=4), dict(schedule="1f1b", v=1, n_mb=4),
         dict(schedule="interleaved_1f1b", v=2, n_mb=4), dict(schedule="looped_bfs", v=2, n_mb=4),
         dict(schedule="looped_bfs", v=2, n_mb=2)]
JOBS4 = [dict(schedule="interleaved_1f1b", v=2, n_mb=4), dict(schedule="looped_bfs", v=2, n_mb=2)]


def _check(results, jobs):
    for rank_res in results:
        assert [r["schedule"] for r in rank_res] == [j["schedule"] for j in jobs]
        for r in rank_res:
            assert "error" not in r, r
            assert r["grad_diff"] < 1e-5 and r["param_diff"] < 1e-5, r    # 3 steps tracked
            assert r["loss_diff"] < 1e-5, r
    last = results[-1]
    assert all(len(r["losses"]) == 3 for r in last)          # the last stage saw every step's loss


@pytest.mark.timeout(120)
def test_all_schedules_two_ranks_match_reference(tmp_path):
    _check(spawn(JOBS2, 2, tmp_path, timeout_s=100), JOBS2)


@pytest.mark.timeout(120)
def test_looped_schedules_four_ranks_match_reference(tmp_path):
    _check(spawn(JOBS4, 4, tmp_path, timeout_s=100), JOBS4)


def test_placement_partitions_layers():
    for P, v in [(2, 2), (4, 2), (3, 4), (1, 3)]:
        pl = placement(P * v, P)
        assert all(len(s) == v for s in pl)
        assert sorted(s for r in pl for s in r) == list(range(P * v))
        assert all(s % P == r for r, st in enumerate(pl) for s in st)       # stage s on rank s mod P
        cont = placement(P * v, P, "contiguous")
        assert cont[0] == list(range(v))
    layers = split_layers(8, 4)
    assert [list(r) for r in layers] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("args,msg", [
    (("gpipe", 2, 1, 3, 8, 8), "not divisible by n_microbatches"),
    (("1f1b", 4, 1, 2, 8, 8), "needs n_microbatches >= pipeline stages"),
    (("looped_bfs", 2, 2, 4, 8, 8, "contiguous"), "needs looped placement"),
    (("interleaved_1f1b", 2, 2, 4, 8, 8, "contiguous"), "needs looped placement"),
    (("interleaved_1f1b", 2, 2, 5, 10, 8), "interleaved_1f1b needs n_microbatches divisible"),
    (("gpipe", 2, 2, 4, 8, 8), "one stage per rank"),
    (("looped_bfs", 2, 2, 4, 8, 6), "not divisible by 4 stages"),
    (("gpipe", 2, 1, 16, 8, 8), "exceeds the batch size"),
    (("zero_bubble", 2, 1, 4, 8, 8), "unknown schedule"),
])
def test_clear_errors(args, msg):
    with pytest.raises(PipelineError, match=msg):
        check_config(*args)


@pytest.mark.parametrize("argv,env,msg", [
    (["--dp", "3"], {"WORLD_SIZE": "4"}, "--dp 3 does not divide the 4 processes"),
    (["--stages-per-rank", "0"], {"WORLD_SIZE": "2"}, "--stages-per-rank must be at least 1"),
    ([], {}, "run it under torchrun"),
])
def test_command_line_errors_are_one_line(argv, env, msg, monkeypatch):
    # before: --dp 3 and the missing torchrun died in init_process_group with a traceback (or hung),
    # --stages-per-rank 0 reached the schedule builder
    from accellib.parallel.pipeline import main
    for k in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        main(argv)
    text = str(e.value)
    assert text.startswith("error: ") and msg in text and "\n" not in text
