"""A tiny discrete-event simulator of pipeline schedules, and their Gantt charts.

Lamy-Poirier 2021 (arXiv 2106.02679) §5 (modular pipeline) and Lamy-Poirier 2023 (BFPP, arXiv
2211.05953) §3: S = v*P stages of equal cost, F(s, i) / B(s, i) the forward / backward of stage s
on micro-batch i, stage s on device placement(s). Each device runs its own action list in order;
an action starts at max(device free, its dependencies done):

    F(s, i) needs F(s-1, i);   B(s, i) needs F(s, i) and B(s+1, i).

The bubble fraction is  rho = makespan / (work per device) - 1,  work = v*m*(t_f + t_b); the
closed forms it is checked against (tests/test_planner.py) are in accellib.planner.bubble.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs")


@dataclass
class Task:
    kind: str      # "F" or "B"
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


def bubble_fraction(tasks: list[Task], P: int, v: int, m: int, t_f: float = 1.0, t_b: float = 2.0) -> float:
    # rho = makespan / (v m (t_f + t_b)) - 1
    return max(t.end for t in tasks) / (v * m * (t_f + t_b)) - 1.0


def gantt(tasks: list[Task], P: int, ax=None, title: str = ""):
    """Gantt chart: one row per device, forward light / backward dark, labelled by micro-batch;
    the colour hue is the stage's loop (stage // P)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * P))
    cmap = plt.get_cmap("tab10")
    for t in tasks:
        c = cmap((t.stage // P) % 10)
        ax.barh(t.device, t.end - t.start, left=t.start, color=c, alpha=0.45 if t.kind == "F" else 0.95,
                edgecolor="k", linewidth=0.4)
        ax.text((t.start + t.end) / 2, t.device, f"{t.kind}{t.mb}", ha="center", va="center", fontsize=6)
    ax.set_yticks(range(P))
    ax.set_yticklabels([f"dev {d}" for d in range(P)])
    ax.invert_yaxis()
    ax.set_xlabel("time (units of one stage forward)")
    ax.set_title(title)
    return ax
