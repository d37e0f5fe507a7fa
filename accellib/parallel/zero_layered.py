"""The ZeRO half of layered gradient accumulation: sharded parameters, gathered once per layer per pass.

Lamy-Poirier 2021 (arXiv 2106.02679) §4 pairs layered accumulation with ZeRO-3 style sharding
(Rajbhandari et al. 2020, arXiv 1910.02054, §5: partitioned parameters, gradients and optimizer
states). Each of the n data-parallel processes keeps 1/n of every parameter (rows [r k, (r+1) k) of
dim 0, k = ceil(rows / n), the last shard zero-padded, as FSDP2 shards) and steps only that shard.
A segment's full weights exist only while it computes:

    layered order (this file + LayeredAccumulation.layered_step):
        forward:  for each layer l: all-gather W_l; F(l, i) for every micro-batch i; free W_l
        backward: for each layer l (reversed): all-gather W_l; B(l, i) for every i; free W_l;
                  reduce-scatter dW_l (async, on the emulated link when set)
    standard order: the same gather/free around every (layer, micro-batch): 2 m gathers per layer.

Traffic one process sends per step, ring collectives over n processes, beta bytes per element
(`closed_form_volume`; counted by `ShardedParams.volume` and tested to be equal):
    all-gather      passes x sum_l |W_l| x (n-1)/n x beta,   passes = 2 (layered) or 2 m (standard)
    reduce-scatter  |W| x (n-1)/n x beta                      (each parameter once, when final)
where a tied head/embedding matrix counts in both layers that compute with it (|W| counts it once).
Plain layered accumulation all-reduces instead: 2 |W| (n-1)/n beta, and never gathers.

"Free" releases the storage of the model's parameter (as FSDP does) while the autograd graph keeps
its reference; the backward's gather writes the same values back into it. The gradients and the
AdamW update of the shards are bitwise those of the unsharded run, the gradient clip active or not: the
shards' sums of squares fill their parameters' slots of the trainer's one norm computation
(engine.global_grad_norm; tests/test_zero_layered.py).
The full replica the trainer evaluates and checkpoints is re-gathered by `gather_all` (the engine's
sync_replica); a resumed run re-slices its shards from the loaded replica (`reshard`).
Gathers are not prefetched: each waits for the link, behind any reduce-scatter still on it.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .comm import CommThread, nbytes, ring_factor

# recent torch names them *_single (the *_tensor names still work, with a deprecation warning)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def closed_form_volume(layer_params: list[int], n_params: int, n: int, m: int, layered: bool,
                       beta: int = 4) -> dict:
    """Bytes one process sends per step (module docstring); layer_params: |W_l| of each layer, counted
    for every layer that computes with a parameter; n_params: |W| (each parameter once)."""
    from ..analysis.planner import zero3_gather_bytes   # 2 gathers per layer (layered) or 2 m (standard)
    return dict(all_gather=zero3_gather_bytes(sum(layer_params), n, 1, 1, m, layered, beta),
                reduce_scatter=(n - 1) / n * beta * n_params)


def layer_params(model) -> tuple[list[int], int]:
    """(|W_l| of each layer of a Transformer: embedding, blocks, head with a tied matrix counted again; |W|)."""
    size = lambda mods: sum(p.numel() for mod in mods for p in mod.parameters())   # noqa: E731
    t = model.transformer
    return ([size([t.wte, t.wpe])] + [size([b]) for b in model.blocks] + [size([t.ln_f, model.lm_head])],
            sum(p.numel() for p in model.parameters()))


class ShardedParams:
    """The data-parallel side of a sharded layered step: gather / release / reduce / finish, the calls
    LayeredAccumulation.layered_step makes (AllReduceGrads is the unsharded one)."""

    def __init__(self, params: list[nn.Parameter], world: int, rank: int, group,
                 comm: Optional[CommThread] = None):
        self.params, self.n, self.rank, self.group, self.comm = params, world, rank, group, comm
        self.rows = {id(p): math.ceil(p.shape[0] / world) for p in params}   # k: rows per shard
        self.shards = [nn.Parameter(self._my_rows(p)) for p in params]
        self.shard_of = {id(p): s for p, s in zip(params, self.shards)}
        self.pending: list[tuple[nn.Parameter, torch.Tensor]] = []
        self.works: list = []
        self.start_step()

    def start_step(self) -> None:
        """Zero the per-step traffic counters: bytes sent per collective kind, and gathers per parameter."""
        self.volume = dict(all_gather=0.0, reduce_scatter=0.0)
        self.gathers: dict[int, int] = {}

    def _padded_shape(self, p) -> tuple:
        return (self.n * self.rows[id(p)], *p.shape[1:])

    def _my_rows(self, p) -> torch.Tensor:
        k = self.rows[id(p)]
        full = p.detach()
        if full.shape[0] < self.n * k:   # zero-pad the last shard
            full = torch.cat([full, full.new_zeros((self.n * k - full.shape[0], *p.shape[1:]))])
        return full[self.rank * k:(self.rank + 1) * k].clone()

    def _run(self, run: Callable[[], None], link_bytes: float, done=None, wait: bool = True) -> None:
        if self.comm is not None:   # the emulated link: one serial queue for gathers and reductions
            self.comm.submit(run, link_bytes, done)
            if wait:
                self.comm.wait()
        else:
            run()
            if done is not None:
                done()

    # ------------------------------------------------------------------ the four calls of a layered step
    def gather(self, params) -> None:
        """All-gather the full weights of `params` into the model's parameters (storage re-allocated
        if released); blocking."""
        def run():
            with torch.no_grad():
                for p in params:
                    data = p.data   # .data: writing it does not bump the version the autograd graph saved
                    if data.untyped_storage().size() == 0:
                        data.untyped_storage().resize_(p.numel() * p.element_size())
                    shard = self.shard_of[id(p)].detach()
                    if data.shape[0] == self.n * self.rows[id(p)]:
                        _all_gather(data, shard, group=self.group)
                    else:
                        buf = shard.new_empty(self._padded_shape(p))
                        _all_gather(buf, shard, group=self.group)
                        data.copy_(buf[:data.shape[0]])
        full = sum(math.prod(self._padded_shape(p)) * p.element_size() for p in params)
        self.volume["all_gather"] += ring_factor("all_gather", self.n) * full
        for p in params:
            self.gathers[id(p)] = self.gathers.get(id(p), 0) + 1
        self._run(run, ring_factor("all_gather", self.n) * full)

    def release(self, params) -> None:
        """Free the full weights (the graph's saved references keep the tensor, not the memory)."""
        for p in params:
            p.data.untyped_storage().resize_(0)

    def reduce(self, params, done: Callable) -> None:
        """Launch the reduce-scatter of the final gradients of `params`: this process gets the SUM of its
        rows (divided by n in finish)."""
        jobs = []
        for p in params:
            g, shard = p.grad, self.shard_of[id(p)]
            if g.shape[0] != self._padded_shape(p)[0]:
                g = torch.cat([g, g.new_zeros((self._padded_shape(p)[0] - g.shape[0], *g.shape[1:]))])
            jobs.append((g, torch.empty_like(shard)))
            self.pending.append((p, jobs[-1][1]))
        full = nbytes(g for g, _ in jobs)
        self.volume["reduce_scatter"] += ring_factor("reduce_scatter", self.n) * full
        if self.comm is None:   # async from this thread, in the same order on every process
            self.works.append(([_reduce_scatter(out, g, group=self.group, async_op=True) for g, out in jobs], done))
            return

        def run():
            for g, out in jobs:
                _reduce_scatter(out, g, group=self.group)
        self._run(run, ring_factor("reduce_scatter", self.n) * full, done, wait=False)

    def finish(self) -> None:
        """Wait for the reductions; each shard's gradient is its rows' mean over the processes; the full
        gradients are freed."""
        if self.comm is not None:
            self.comm.wait()
        for works, done in self.works:   # (gloo's works have no future to call done on completion)
            for w in works:
                w.wait()
            done()
        for p, out in self.pending:
            self.shard_of[id(p)].grad = out.div_(self.n)
            p.grad = None
        self.pending, self.works = [], []

    # ------------------------------------------------------------------ replica and checkpoints
    def gather_all(self) -> None:
        """Every process gets the current full weights (before evaluation and checkpoints); not counted."""
        volume, gathers = dict(self.volume), dict(self.gathers)
        self.gather(self.params)
        self.volume, self.gathers = volume, gathers

    def reshard(self) -> None:
        """Take this process's rows of the model's (just loaded) full weights."""
        with torch.no_grad():
            for p, s in zip(self.params, self.shards):
                s.copy_(self._my_rows(p))
