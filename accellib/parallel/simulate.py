"""A tiny discrete-event simulator of pipeline schedules, and their Gantt charts.

Lamy-Poirier 2021 (arXiv 2106.02679) §5 (modular pipeline) and Lamy-Poirier 2023 (BFPP, arXiv
2211.05953) §3: S = v*P stages of equal cost, F(s, i) / B(s, i) the forward / backward of stage s
on micro-batch i, stage s on device placement(s). Each device runs its own action list in order;
an action starts at max(device free, its dependencies done):

    F(s, i) needs F(s-1, i);   B(s, i) needs F(s, i) and B(s+1, i).

The bubble fraction is  rho = makespan / (work per device) - 1,  work = v*m*(t_f + t_b); the
closed forms it is checked against (tests/test_planner.py) are in accellib.analysis.planner.bubble.

`simulate_dp` adds each stage's data-parallel gradient reduction on its device's serial link, launched
right after the stage's last backward (pipeline.reduce=per_stage: layered accumulation inside the
pipeline, Lamy-Poirier 2021 §4-§5) or after the device's whole schedule (after_step), for the step time
and the exposed communication that benchmarks/lga_pipeline.py measures.

`ouroboros_timeline` models the per-process program of Ouroboros (Yang et al., NeurIPS 2019, arXiv
1909.06695; accellib/parallel/ouroboros.py) with the same task rules, iteration by iteration, and
`ouroboros_step_time` is its steady-state iteration time (tests/test_ouroboros_timeline.py).
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs")


@dataclass
class Task:
    kind: str      # "F", "B", or "R" (a stage's data-parallel gradient reduction, simulate_dp; mb = -1)
    stage: int
    mb: int
    device: int
    start: float = 0.0
    end: float = 0.0


def device_of(stage: int, P: int, v: int, placement: str = "looped") -> int:
    """looped (modular): stage s on device s mod P; contiguous: stages [d*v, (d+1)*v) on device d."""
    return stage % P if placement == "looped" else stage // v


def device_orders(schedule: str, P: int, v: int, m: int) -> dict[int, list[tuple[str, int, int]]]:
    """The per-device action lists (kind, stage, micro-batch) of each schedule."""
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{schedule} runs one stage per device; use v=1 (got v={v})")
    orders: dict[int, list] = {}
    for d in range(P):
        stages = [d + k * P for k in range(v)]                    # looped placement
        if schedule == "gpipe":          # all forwards, then all backwards
            o = [("F", d, i) for i in range(m)] + [("B", d, i) for i in range(m)]
        elif schedule == "1f1b":         # warm-up forwards, then one forward / one backward
            w = min(P - 1 - d, m)
            o = [("F", d, i) for i in range(w)]
            for i in range(m - w):
                o += [("F", d, w + i), ("B", d, i)]
            o += [("B", d, i) for i in range(m - w, m)]
        elif schedule == "looped_bfs":   # breadth first: a stage on all micro-batches, then the next
            o = [("F", s, i) for s in stages for i in range(m)]
            o += [("B", s, i) for s in reversed(stages) for i in range(m)]
        elif schedule == "interleaved_1f1b":  # depth first (Megatron): groups of P micro-batches
            if m % P:
                raise ValueError(f"interleaved_1f1b in this simulator needs m a multiple of P (m={m}, P={P})")
            # k-th forward: chunk (k // P) % v, micro-batch (k // (P v)) P + k % P
            fw = [(stages[(k // P) % v], (k // (P * v)) * P + k % P) for k in range(m * v)]
            bw = [(stages[v - 1 - (k // P) % v], (k // (P * v)) * P + k % P) for k in range(m * v)]
            w = m * v if m == P else min((P - d - 1) * 2 + (v - 1) * P, m * v)
            o = [("F", s, i) for s, i in fw[:w]]
            for k in range(m * v - w):
                o += [("F", *fw[w + k]), ("B", *bw[k])]
            o += [("B", s, i) for s, i in bw[m * v - w:]]
        else:
            raise ValueError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")
        orders[d] = o
    return orders


def simulate(schedule: str, P: int, v: int, m: int, t_f: float = 1.0, t_b: float = 2.0) -> list[Task]:
    """Run the per-device lists; return every task with its start and end time."""
    orders = device_orders(schedule, P, v, m)
    S = P * v
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * P
    pos = [0] * P
    out = []
    while any(pos[d] < len(orders[d]) for d in range(P)):
        progressed = False
        for d in range(P):
            while pos[d] < len(orders[d]):
                kind, s, i = orders[d][pos[d]]
                deps = [("F", s - 1, i)] if kind == "F" and s > 0 else []
                if kind == "B":
                    deps = [("F", s, i)] + ([("B", s + 1, i)] if s < S - 1 else [])
                if any(k not in end for k in deps):
                    break
                start = max([free[d]] + [end[k] for k in deps])
                t = Task(kind, s, i, d, start, start + (t_f if kind == "F" else t_b))
                end[(kind, s, i)] = free[d] = t.end
                out.append(t)
                pos[d] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule} deadlocks for P={P}, v={v}, m={m}")
    return out


def simulate_dp(schedule: str, P: int, v: int, m: int, t_f: float = 1.0, t_b: float = 2.0,
                t_red=0.0, reduce: str = "per_stage") -> list[Task]:
    """`simulate` plus one reduction task ("R", stage, -1) per stage on its device's link, one reduction at
    a time: per_stage starts stage s's when its last backward has ended and the link is free (stages in
    the order they finish); after_step queues them all behind the device's last compute task. t_red: the
    reduction time of every stage, or a list with one per stage. The step ends with the last task
    (`step_time`); compute never waits for the link."""
    if reduce not in ("per_stage", "after_step"):
        raise ValueError(f"reduce must be per_stage or after_step, got {reduce!r}")
    tasks = simulate(schedule, P, v, m, t_f, t_b)
    t_red = list(t_red) if isinstance(t_red, (list, tuple)) else [t_red] * (P * v)
    out = list(tasks)
    for d in range(P):
        mine = [t for t in tasks if t.device == d]
        end = max(t.end for t in mine)
        final = {}   # stage -> end of its last backward on this device
        for t in mine:
            if t.kind == "B":
                final[t.stage] = max(final.get(t.stage, 0.0), t.end)
        link = 0.0
        for st in sorted(final, key=final.get):
            start = max(link, final[st] if reduce == "per_stage" else end)
            link = start + t_red[st]
            out.append(Task("R", st, -1, d, start, link))
    return out


def step_time(tasks: list[Task]) -> float:
    return max(t.end for t in tasks)


def exposed_comm(tasks: list[Task], device: int) -> float:
    """Time the device's link is still busy after its last forward/backward."""
    comp = max(t.end for t in tasks if t.device == device and t.kind != "R")
    return max([0.0] + [t.end - comp for t in tasks if t.device == device and t.kind == "R"])


def bubble_fraction(tasks: list[Task], P: int, v: int, m: int, t_f: float = 1.0, t_b: float = 2.0) -> float:
    # rho = makespan / (v m (t_f + t_b)) - 1
    return max(t.end for t in tasks) / (v * m * (t_f + t_b)) - 1.0


def gantt(tasks: list[Task], P: int, ax=None, title: str = "", color_by: str = "loop",
          xlabel: str = "time (units of one stage forward)"):
    """Gantt chart: one row per device, forward light / backward dark, labelled by micro-batch;
    the colour hue is the stage's loop (stage // P), or the stage itself with color_by="stage"
    (Ouroboros: one colour per module)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * P))
    # a sequential map (the course's colours name arms, accellib.analysis.plotting.ARM_COLORS; loops and stages are an order)
    hue = (lambda t: t.stage) if color_by == "stage" else (lambda t: t.stage // P)
    top = max((hue(t) for t in tasks), default=0)
    cmap = plt.get_cmap("viridis")
    for t in tasks:
        c = cmap(0.15 + 0.7 * hue(t) / max(top, 1))
        if t.kind == "R":   # the link: a thin hatched bar under the device's row
            ax.barh(t.device + 0.42, t.end - t.start, left=t.start, height=0.16, color=c, hatch="//",
                    edgecolor="k", linewidth=0.4)
            continue
        ax.barh(t.device, t.end - t.start, left=t.start, color=c, alpha=0.45 if t.kind == "F" else 0.95,
                edgecolor="k", linewidth=0.4)
        ax.text((t.start + t.end) / 2, t.device, f"{t.kind}{t.mb}", ha="center", va="center", fontsize=6)
    ax.set_yticks(range(P))
    ax.set_yticklabels([f"dev {d}" for d in range(P)])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return ax


# ----------------------------------------------------------------------------- Ouroboros
def ouroboros_devices(k: int) -> list[int]:
    """Process of each module (index 0..K-1) on the ring of K-1 processes: the engine's own placement."""
    from .ouroboros import placement
    return placement(k, 1 if k <= 2 else k - 1)


def ouroboros_orders(k: int, delayed: bool, t: int) -> dict[int, list[tuple[str, int, int]]]:
    """Iteration t of each process (Ouroboros.forward_backward), as (kind, module, batch) actions:
    F and B are the module's forward and backward of a batch; R(i, n) is module i waiting for the
    error signal module i+1 computed for batch n (a blocking receive: no work, only a wait)."""
    from .ouroboros import delays
    dev = ouroboros_devices(k)
    d = delays(k, delayed)
    orders: dict[int, list] = {}
    for p in range(max(dev) + 1):
        local = [i for i in range(k) if dev[i] == p]
        o = []
        for i in local:   # forwards in module order; the delayed backward right after each forward
            o.append(("F", i, t))
            if i == k - 1:
                o.append(("B", i, t))                 # the loss of batch t, backpropagated at once
            elif d[i] > 0 and t >= d[i]:
                o.append(("B", i, t - d[i]))          # its error signal arrived last iteration
        for i in reversed(local):   # then the receives, last module first
            if i == k - 1:
                continue
            if d[i] == 0:
                o.append(("B", i, t))                 # backward-locked: wait for this batch's error
            elif t >= d[i + 1]:
                o.append(("R", i, t - d[i + 1]))      # keep module i+1's new error for the next iteration
        orders[p] = o
    return orders


def _ouroboros_run(sizes, t_f, t_b, delayed, iterations):
    k = len(sizes)
    if k < 1 or any(s < 0 for s in sizes):
        raise ValueError(f"sizes must be K >= 1 non-negative block counts, got {sizes}")
    dev = ouroboros_devices(k)
    P = max(dev) + 1
    cost = {"F": [t_f * s for s in sizes], "B": [t_b * s for s in sizes]}
    end: dict[tuple[str, int, int], float] = {}
    out, bounds = [], [0.0]
    for t in range(iterations):
        orders = ouroboros_orders(k, delayed, t)
        free, pos = [bounds[-1]] * P, [0] * P
        while any(pos[p] < len(orders[p]) for p in range(P)):
            progressed = False
            for p in range(P):
                while pos[p] < len(orders[p]):
                    kind, i, n = orders[p][pos[p]]
                    if kind == "F":
                        deps = [("F", i - 1, n)] if i > 0 else []
                    elif kind == "B":
                        deps = [("F", i, n)] + ([("B", i + 1, n)] if i < k - 1 else [])
                    else:   # R: the error of module i+1
                        deps = [("B", i + 1, n)]
                    if any(x not in end for x in deps):
                        break
                    start = max([free[p]] + [end[x] for x in deps])
                    if kind == "R":
                        free[p] = start
                    else:
                        task = Task(kind, i, n, p, start, start + cost[kind][i])
                        end[(kind, i, n)] = free[p] = task.end
                        out.append(task)
                    pos[p] += 1
                    progressed = True
            if not progressed:
                raise RuntimeError(f"ouroboros timeline deadlocks at iteration {t} for sizes={sizes}")
        bounds.append(max(free))   # the grad-norm all-reduce: every process waits for the slowest
    return out, bounds


def ouroboros_timeline(sizes: list[int], t_f: float = 1.0, t_b: float = 2.0, delayed: bool = True,
                       iterations: int = 4) -> list[Task]:
    """Every forward/backward of `iterations` Ouroboros iterations with start and end times.

    Module i (Task.stage, 0..K-1) holds sizes[i] blocks: its forward costs t_f * sizes[i], its backward
    t_b * sizes[i] (embedding, head and messages are free). Task.mb is the batch, Task.device the process
    (ouroboros_devices). Each process runs its program of accellib/parallel/ouroboros.py in order
    (ouroboros_orders); a forward needs the previous module's forward of the same batch, a backward
    the module's forward and the next module's backward of that batch; an iteration ends when every
    process has finished it (the trainer's gradient-norm all-reduce), and the next starts there.
    Delayed, module i's first backward is in iteration d_i = K-1-i: the first K-1 iterations are
    warm-up iterations, no longer than the steady ones."""
    return _ouroboros_run(sizes, t_f, t_b, delayed, iterations)[0]


def ouroboros_step_time(sizes: list[int], t_f: float = 1.0, t_b: float = 2.0, delayed: bool = True) -> float:
    """Steady-state iteration time (from iteration K-1 on every iteration is the same), simulated.

    Closed forms (tests/test_ouroboros_timeline.py), with f_i = t_f s_i, b_i = t_b s_i, L = sum(s):
      backward-locked, or K <= 2 (one process):   T = (t_f + t_b) L     plain backprop, one chain
      delayed, K >= 3, with S_i = f_0 + ... + f_i (batch t reaches the end of module i):
          T = max( max(f_0 + b_0, S_{K-2}) + f_{K-1} + b_{K-1},   process 0: module 1's backward,
                                                                  then module K after the forward chain
                   max_{1 <= i <= K-2} S_i + b_i )                module i+1's forward, then backward
      the default balanced split (L = (K-1) W, K >= 3, W >= 2 blocks per process, t_b = 2 t_f):
          T = t_f (L - ceil(W/2)) + t_b W,    e.g. L=6: K=3 -> 10 t_f, K=4 -> 9 t_f (locked: 18 t_f)
    Ouroboros unlocks the backward, not the forward: batch t still crosses every module's forward in
    turn within its iteration, so T >= t_f L, and the speed-up over backprop is below (t_f + t_b) / t_f
    (3 here) however many modules, and never reaches the balanced ideal of (t_f + t_b) W per process."""
    k = len(sizes)
    _, bounds = _ouroboros_run(sizes, t_f, t_b, delayed, k + 1)
    return bounds[-1] - bounds[-2]
