"""Gradient communication shared by the engines: ring byte factors, an emulated link, a layer's all-reduce."""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist


def ring_factor(kind: str, n: int) -> float:
    """Bytes one process sends on its link per byte of the full tensor in a ring collective over n
    processes: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n. One process emulating a
    link (n = 1) is charged as a two-process ring."""
    n = max(n, 2)
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CommThread:
    """A serial emulated link: jobs run one at a time on one thread; a job runs its collectives, then
    sleeps until link_bytes / bandwidth has passed since it started (the real loopback transfer is
    part of that time), so the link is what the predictions assume."""

    def __init__(self, bytes_per_s: float):
        self.bps = bytes_per_s
        self.q: queue.Queue = queue.Queue()
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self):
        while True:
            job = self.q.get()
            if job is None:
                return
            run, link_bytes, done = job
            t0 = time.perf_counter()
            run()
            time.sleep(max(0.0, link_bytes / self.bps - (time.perf_counter() - t0)))
            if done is not None:
                done()
            self.q.task_done()

    def submit(self, run: Callable[[], None], link_bytes: float, done: Optional[Callable] = None):
        self.q.put((run, link_bytes, done))

    def wait(self):
        self.q.join()

    def close(self):
        self.q.put(None)


class AllReduceGrads:
    """Plain data parallelism for a layered step: every process holds the full weights (gather and
    release do nothing); a segment's final gradients are summed over the group (async all_reduce, or a
    job on the emulated link) and divided by the group size in finish()."""

    def __init__(self, world: int, comm: Optional[CommThread] = None, group=None):
        self.world, self.comm, self.group = world, comm, group
        self.works: list = []
        self.pending: list[torch.Tensor] = []

    def gather(self, params) -> None:
        pass

    def release(self, params) -> None:
        pass

    def reduce(self, params, done: Callable) -> None:
        grads = [p.grad for p in params]
        self.pending += grads
        world, group = self.world, self.group
        if self.comm is not None:
            def run():
                if world > 1:
                    for g in grads:
                        dist.all_reduce(g, group=group)
            self.comm.submit(run, ring_factor("all_reduce", world) * nbytes(grads), done)
        elif world > 1:
            works = [dist.all_reduce(g, group=group, async_op=True) for g in grads]
            torch.futures.collect_all([w.get_future() for w in works]).then(done)
            self.works += works
        else:
            done()

    def finish(self) -> None:
        """Wait for every reduction; SUM -> mean over the group, as DDP does."""
        if self.comm is not None:
            self.comm.wait()
        for w in self.works:
            w.wait()
        if self.world > 1:
            for g in self.pending:
                g.div_(self.world)
        self.works, self.pending = [], []
