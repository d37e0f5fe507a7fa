"""Planner closed forms, checked against the discrete-event simulator and for monotonicity."""
import pytest

from accellib import planner as P
from accellib.parallel.simulate import bubble_fraction, device_orders, simulate


@pytest.mark.parametrize("t_b", [1.0, 2.0])
def test_simulator_equals_closed_forms_on_a_grid(t_b):
    for Pn in (2, 3, 4, 8):
        for m in (1, 2, 3, 4, 6, 8, 16):
            for sched in ("gpipe", "1f1b"):
                if sched == "1f1b" and m < Pn:
                    continue
                rho = bubble_fraction(simulate(sched, Pn, 1, m, 1.0, t_b), Pn, 1, m, 1.0, t_b)
                assert rho == pytest.approx(P.bubble(Pn, 1, m, "contiguous"), abs=1e-12), (sched, Pn, m)
            for v in (1, 2, 3, 4):
                rho = bubble_fraction(simulate("looped_bfs", Pn, v, m, 1.0, t_b), Pn, v, m, 1.0, t_b)
                assert rho == pytest.approx(P.bubble(Pn, v, m, "looped"), abs=1e-12), (Pn, v, m)
                if m % Pn == 0:
                    rho = bubble_fraction(simulate("interleaved_1f1b", Pn, v, m, 1.0, t_b), Pn, v, m, 1.0, t_b)
                    assert rho == pytest.approx(P.bubble(Pn, v, m, "looped"), abs=1e-12), ("df", Pn, v, m)


def test_looped_with_one_stage_per_device_is_gpipe():
    for Pn, m in [(4, 2), (4, 8), (3, 5)]:
        assert P.bubble(Pn, 1, m, "looped") == P.bubble(Pn, 1, m, "contiguous") == (Pn - 1) / m


def test_every_task_runs_once():
    orders = device_orders("interleaved_1f1b", 4, 2, 8)
    tasks = [t for o in orders.values() for t in o]
    assert len(tasks) == len(set(tasks)) == 2 * 4 * 2 * 8
    with pytest.raises(ValueError, match="one stage per device"):
        device_orders("gpipe", 4, 2, 8)


def test_scaling_law_and_steps():
    c = P.c_min_for(1e10)
    assert 10 < c < 25                                   # about 16 PF-days
    bc = P.critical_batch(P.loss_at(c))
    assert 2e6 < bc < 6e6
    assert P.steps(bc, bc, P.s_min(c)) == pytest.approx(2 * P.s_min(c))
    assert P.steps(2 * bc, bc, 100) < P.steps(bc, bc, 100)


def test_exposed_communication_monotone_and_layered_never_worse():
    prev = 0.0
    for m in (1, 2, 4, 8, 16, 32):
        std = P.exposed_dp_time(1.0, 1.5, m, 24, layered=False)
        lay = P.exposed_dp_time(1.0, 1.5, m, 24, layered=True)
        assert std >= prev and lay <= std
        assert lay == pytest.approx(1.0 / 24)              # fully hidden but the last layer's share
        prev = std


def test_zero_memory_falls_with_data_parallel_degree():
    for stage in (1, 2, 3):
        mems = [P.zero_state_bytes(1e11, n_d, 8, 8, stage) for n_d in (1, 2, 8, 64, 512)]
        assert all(a > b for a, b in zip(mems, mems[1:]))
    assert P.zero3_gather_bytes(1e11, 64, 8, 8, 16, layered=True) * 16 == pytest.approx(
        P.zero3_gather_bytes(1e11, 64, 8, 8, 16, layered=False))


def test_improved_never_slower_and_about_half_at_scale():
    ratios = []
    for N in (1e9, 1e10, 1e11, 1e12):
        base, imp = P.shortest_time(N, "baseline"), P.shortest_time(N, "improved")
        assert imp.days <= base.days
        assert base.memory <= 80e9 and imp.memory <= 80e9
        ratios.append(imp.days / base.days)
    assert min(ratios[1:]) < 0.6                      # the paper's "cut by half" at large N


def test_no_fit_is_a_clear_error():
    with pytest.raises(ValueError, match="no configuration"):
        P.shortest_time(1e12, "baseline", P.Cluster(memory=1e9))
