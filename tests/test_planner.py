"""Planner closed forms, checked against the discrete-event simulator and for monotonicity."""
import pytest

from accellib.analysis import planner as P
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


# the earlier model's plans (the code before the added costs; Costs.none() must give them back exactly):
# N -> (baseline n_gpu, days), (improved n_gpu, days), ZeRO-1, 80% floor
EARLIER = {1e10: ((7224, 0.040331693035381415), (14448, 0.02114202373012983)),
           1e11: ((15312, 0.4239124469396682), (30624, 0.21624799284112753)),
           1e12: ((10752, 15.49243580596918), (64896, 2.3233553847735875))}


def test_without_the_added_costs_the_earlier_plans_come_back():
    for N, want in EARLIER.items():
        for meth, (n_gpu, days) in zip(("baseline", "improved"), want):
            p = P.shortest_time(N, meth, costs=P.Costs.none())
            assert (p.n_gpu, p.t_p2p, p.t_gather, p.eta_k) == (n_gpu, 0.0, 0.0, 0.5)
            assert p.days == pytest.approx(days, rel=1e-12), (N, meth)
    # ZeRO-3 gathers do nothing below stage 3; the earlier ZeRO-3 1e12 ratio was 0.505
    gathers_only = P.Costs(p2p="off", zero3_gathers=True, kernel_efficiency=False)
    assert P.shortest_time(1e11, "improved", costs=gathers_only) == \
        P.shortest_time(1e11, "improved", costs=P.Costs.none())
    b3, i3 = (P.shortest_time(1e12, m, zero=3, costs=P.Costs.none()) for m in ("baseline", "improved"))
    assert round(i3.days / b3.days, 3) == 0.505


def test_improved_never_slower_and_about_half_at_scale_without_the_added_costs():
    ratios = []
    for N in (1e9, 1e10, 1e11, 1e12):
        base, imp = (P.shortest_time(N, m, costs=P.Costs.none()) for m in ("baseline", "improved"))
        assert imp.days <= base.days
        assert base.memory <= 80e9 and imp.memory <= 80e9
        ratios.append(imp.days / base.days)
    assert min(ratios[1:]) < 0.6                      # the paper's "cut by half" at large N


def test_p2p_bytes_and_time_closed_forms():
    cl = P.Cluster()
    # b s d beta per boundary per micro-batch, forward and backward, v boundaries per micro-batch when looped
    assert P.p2p_bytes(2, 4096, 3, 16, cl) == 2 * 16 * 3 * 2 * 2048 * 4096 * 2
    assert P.p2p_bytes(2, 4096, 3, 16, cl, n_t=8) == P.p2p_bytes(2, 4096, 3, 16, cl) / 8
    assert P.p2p_time(4, 5, 8, 0.1, 1.0, 3.0, "exposed") == pytest.approx(2 * 5 * 8 * 0.1)
    assert P.p2p_time(1, 5, 8, 0.1, 1.0, 3.0, "exposed") == P.p2p_time(4, 5, 8, 0.1, 1.0, 3.0, "off") == 0.0
    # overlapped, m >= P: fill + drain 2 (P-1) msg; a loop return costs P msg beyond the (m-P) t of cover
    assert P.p2p_time(4, 5, 6, 0.5, 0.25, 3.0, "overlapped") == pytest.approx(2 * 3 * 0.5 + 4 * (2 * 1.0 - 0.25 * 2))
    # m < P: the return already waits (P-m) t; the hops add P msg on top, each direction
    assert P.p2p_time(4, 5, 2, 0.5, 1.0, 3.0, "overlapped") == pytest.approx(2 * 3 * 0.5 + 4 * 2 * 4 * 0.5)
    # contiguous (v = 1): fill and drain only
    assert P.p2p_time(4, 1, 8, 0.5, 1.0, 3.0, "overlapped") == pytest.approx(2 * 3 * 0.5)
    with pytest.raises(P.PlannerError, match="Costs.p2p must be one of"):
        P.Costs(p2p="hidden")


def test_p2p_in_the_step_is_the_closed_form_and_its_share_of_the_earlier_improved_steps():
    cl, only_p2p = P.Cluster(), P.Costs(p2p="exposed", zero3_gathers=False, kernel_efficiency=False)
    shares = []
    for N in (1e10, 1e11, 1e12):
        i = P.shortest_time(N, "improved", costs=P.Costs.none())
        s = P.step_time(N, "improved", i.n_d, i.n_p, i.n_t, i.b, i.m, cl, 1, only_p2p)
        n_l, d = P.shape_for(N)
        assert s.t_p2p == pytest.approx(P.p2p_bytes(i.b, d, i.m, n_l // i.n_p, cl) / cl.bw_pp, rel=1e-12)
        assert s.t_step == pytest.approx(i.t_step + s.t_p2p, rel=1e-12)      # everything else unchanged
        shares.append(s.t_p2p / i.t_step)
    # full activations over a 25 GB/s link: 28% / 19% / 9% of the earlier improved step
    assert [round(x, 2) for x in shares] == [0.28, 0.19, 0.09], shares


def test_zero3_gathers_2m_standard_against_2_layered_in_the_step():
    cl, gathers = P.Cluster(), P.Costs(p2p="off", zero3_gathers=True, kernel_efficiency=False)
    N, n_d, n_p, n_t, b, m = 1e11, 64, 4, 8, 1, 6
    p_loc = N / (n_p * n_t)
    for meth, g in (("baseline", 2 * m), ("improved", 2)):
        s = P.step_time(N, meth, n_d, n_p, n_t, b, m, cl, 3, gathers)
        assert s.t_gather == pytest.approx(g * (n_d - 1) / n_d * 2 * p_loc / cl.bw_dp, rel=1e-12), meth
        off = P.step_time(N, meth, n_d, n_p, n_t, b, m, cl, 3, P.Costs.none())
        n_l = P.shape_for(N)[0]
        # the reduction becomes a reduce-scatter (half the all-reduce), the gathers share its link
        t_rs = (n_d - 1) / n_d * 2 * p_loc / cl.bw_dp
        assert s.exposed_dp == pytest.approx(P.exposed_dp_time(t_rs, off.t_comp * 6 / 8, m, n_l // n_p,
                                                               meth == "improved", s.t_gather, off.t_comp / 4))
        assert s.t_step - off.t_step == pytest.approx(s.exposed_dp - off.exposed_dp)
        assert s.memory - off.memory == pytest.approx(2 * 2 * p_loc / (n_l // n_p))   # two gathered layers
        assert P.step_time(N, meth, n_d, n_p, n_t, b, m, cl, 1, gathers) == \
            P.step_time(N, meth, n_d, n_p, n_t, b, m, cl, 1, P.Costs.none())      # only ZeRO-3 gathers


def test_exposed_link_time_with_gathers_is_the_larger_bound():
    # no gathers: the earlier formula, exactly
    assert P.exposed_dp_time(1.0, 1.5, 4, 8, False, 0.0, 0.5) == P.exposed_dp_time(1.0, 1.5, 4, 8, False)
    # latency bound: the reduction's exposure + one layer's share of the gathers
    t_dp, t_bwd, t_fwd, L = 0.2, 3.0, 1.0, 10
    assert P.exposed_dp_time(t_dp, t_bwd, 1, L, True, 1.0, t_fwd) == pytest.approx(t_dp / L + 1.0 / L)
    # capacity bound: the forward carries half the gathers, the backward the other half and the reduction
    assert P.exposed_dp_time(t_dp, t_bwd, 1, L, True, 6.0, t_fwd) == pytest.approx((3.0 - 1.0) + (3.0 + 0.2 - 3.0))


def test_kernel_efficiency_curve_and_its_switch():
    cl = P.Cluster()
    x = 1 * 2048 * 4096 / 8
    assert P.kernel_efficiency(1, 4096, 8, cl) == pytest.approx(0.5 * x / (x + 2 ** 17))
    eta = P.kernel_efficiency
    assert eta(1, 4096, 8, cl) < eta(2, 4096, 8, cl) < eta(2, 4096, 1, cl) < 0.5      # grows with b s d / n_t
    on = P.step_time(1e10, "improved", 100, 2, 8, 1, 4, cl, 1, P.Costs(p2p="off", zero3_gathers=False))
    off = P.step_time(1e10, "improved", 100, 2, 8, 1, 4, cl, 1, P.Costs.none())
    assert on.eta_k == P.kernel_efficiency(1, 4096, 8, cl) and off.eta_k == 0.5
    assert on.t_comp == pytest.approx(off.t_comp * 0.5 / on.eta_k, rel=1e-12)


def test_gpu_days_are_gpus_times_time():
    for N in (1e10, 1e12):
        p = P.shortest_time(N, "improved")
        c = P.c_min_for(N)
        T = P.steps(p.n_d * p.b * p.m * 2048, P.critical_batch(P.loss_at(c)), P.s_min(c)) * p.t_step
        assert p.days == pytest.approx(T / 86400, rel=1e-12)
        assert p.gpu_days == pytest.approx(p.n_gpu * T / 86400, rel=1e-12)
        assert p.n_gpu == p.n_d * p.n_p * p.n_t


def test_plans_are_what_shortest_time_chooses_from():
    ps = list(P.plans(1e11, "improved"))
    assert min(ps, key=lambda p: p.days) == P.shortest_time(1e11, "improved")
    assert all(p.memory <= 80e9 and p.efficiency >= 0.8 for p in ps)
    with pytest.raises(P.PlannerError, match="method must be"):
        next(P.plans(1e11, "fast"))
    with pytest.raises(P.PlannerError, match="method must be"):   # not silently the baseline's step
        P.step_time(1e11, "improve", 64, 4, 8, 1, 6, P.Cluster())


def test_no_fit_is_a_clear_error():
    with pytest.raises(P.PlannerError, match="no configuration") as e:
        P.shortest_time(1e12, "baseline", P.Cluster(memory=1e9))
    assert "\n" not in str(e.value)                      # a ConfigError subclass, printed as one line
