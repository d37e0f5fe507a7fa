"""The Ouroboros timeline (accellib/parallel/simulate.py): exact steady-state iteration times for
K = 1..5, the closed forms in ouroboros_step_time's docstring, and the program it models."""
import itertools
import math
import random

import pytest

from accellib.parallel.ouroboros import default_split, delays
from accellib.parallel.simulate import (ouroboros_orders, ouroboros_step_time,
                                        ouroboros_timeline)


def closed_form(sizes, t_f=1.0, t_b=2.0, delayed=True):
    """The general closed form of the docstring, written independently of the simulator."""
    k = len(sizes)
    f, b = [t_f * s for s in sizes], [t_b * s for s in sizes]
    if not delayed or k <= 2:
        return sum(f) + sum(b)
    S = list(itertools.accumulate(f))
    return max(max(f[0] + b[0], S[k - 2]) + f[k - 1] + b[k - 1],
               max(S[i] + b[i] for i in range(1, k - 1)))


# (sizes, delayed step time) with t_f = 1, t_b = 2, worked by hand from the closed form
EXACT = [
    ([6], 18), ([3, 3], 18),                               # K = 1, 2: one process, plain backprop
    ([1, 3, 2], 10), ([1, 2, 2, 1], 9), ([1, 2, 1, 1, 1], 8),   # default_split(6, K), K = 3, 4, 5
    ([3, 6, 3], 21), ([2, 4, 4, 2], 18), ([1, 3, 3, 3, 2], 16),  # default_split(12, K)
    ([2, 2, 2], 12), ([4, 4, 4], 24), ([3, 3, 3, 3], 18),  # equal modules: process 0 carries two
    ([2, 3, 1], 11), ([1, 4, 1], 13), ([0, 1, 1, 1, 1], 6), ([1, 1, 1, 1, 8], 28),
]


@pytest.mark.parametrize("sizes,want", EXACT)
def test_exact_step_times(sizes, want):
    assert ouroboros_step_time(sizes) == want
    assert ouroboros_step_time(sizes, delayed=False) == 3 * sum(sizes)   # locked = the backprop sum


def test_default_splits_are_the_ones_tabulated():
    assert [default_split(6, k) for k in (1, 2, 3, 4, 5)] == [[6], [3, 3], [1, 3, 2], [1, 2, 2, 1], [1, 2, 1, 1, 1]]
    assert [default_split(12, k) for k in (3, 4, 5)] == [[3, 6, 3], [2, 4, 4, 2], [1, 3, 3, 3, 2]]


def test_general_closed_form_on_random_splits():
    rng = random.Random(0)
    for _ in range(300):
        k = rng.randint(1, 6)
        sizes = [rng.randint(0, 5) for _ in range(k)]
        t_f, t_b = rng.choice([(1.0, 2.0), (1.0, 1.0), (0.5, 1.5), (2.0, 1.0)])
        for delayed in (True, False):
            got = ouroboros_step_time(sizes, t_f, t_b, delayed)
            assert got == pytest.approx(closed_form(sizes, t_f, t_b, delayed), abs=1e-12), (sizes, t_f, t_b)


def test_balanced_short_form_and_bounds():
    for k in (3, 4, 5, 6):
        for w in (2, 3, 4, 5, 6):
            L = (k - 1) * w
            sizes = default_split(L, k)
            T = ouroboros_step_time(sizes)
            assert T == L - math.ceil(w / 2) + 2 * w, (k, w)
            # the forward chain bounds it below, backprop above; never the balanced ideal 3W
            assert L <= T < 3 * L and T > 3 * w


def test_locked_is_one_chain_and_delayed_reaches_a_steady_state():
    for sizes in ([1, 3, 2], [1, 2, 2, 1], [1, 3, 3, 3, 2]):
        k = len(sizes)
        tasks = ouroboros_timeline(sizes, delayed=False, iterations=3)
        for t in range(3):   # every task of an iteration waits for the previous one: no overlap
            it = sorted((x for x in tasks if x.mb == t), key=lambda x: x.start)
            assert all(a.end == b.start for a, b in zip(it, it[1:]))
            assert it[0].start == 3 * sum(sizes) * t
        starts = [min(x.start for x in ouroboros_timeline(sizes, iterations=k + 3) if x.kind == "F" and x.mb == t)
                  for t in range(k + 3)]
        steps = [b - a for a, b in zip(starts, starts[1:])]
        T = ouroboros_step_time(sizes)
        assert all(s <= T for s in steps[:k - 1]) and all(s == T for s in steps[k - 1:]), steps


def test_timeline_models_the_engines_program():
    for k in (1, 2, 3, 4, 5):
        sizes, iters = [1] * k, k + 2
        tasks = ouroboros_timeline(sizes, iterations=iters)
        d = delays(k)
        for i in range(k):   # module i runs every forward, and the backward of batch n once n + d_i < iters
            assert sorted(x.mb for x in tasks if x.stage == i and x.kind == "F") == list(range(iters))
            assert sorted(x.mb for x in tasks if x.stage == i and x.kind == "B") == list(range(iters - d[i]))
    # process 0 of K=3 in a steady iteration: module 1's forward and delayed backward, module 3's
    # forward and backward, then the wait for module 2's error signal
    assert ouroboros_orders(3, True, 5)[0] == [("F", 0, 5), ("B", 0, 3), ("F", 2, 5), ("B", 2, 5), ("R", 0, 4)]
    assert ouroboros_orders(3, True, 5)[1] == [("F", 1, 5), ("B", 1, 4), ("R", 1, 5)]
    assert ouroboros_orders(3, False, 5)[0] == [("F", 0, 5), ("F", 2, 5), ("B", 2, 5), ("B", 0, 5)]
