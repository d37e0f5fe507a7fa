"""Ouroboros: model parallelism with delayed gradients, as an engine of the one trainer.

Ouroboros: model parallelism with delayed gradients (Yang, Huo, Wang, Huang, Carin, NeurIPS 2019,
arXiv 1909.06695), as an engine of the one trainer (accellib/parallel/engine.py).

The L blocks are split into K modules G(1..K). Module 1 holds the token embedding V, module K the
final LayerNorm and the output projection (tied to V when model.tie_head). Modules 1 and K live on
process 0 and modules 2..K-1 on processes 1..K-2: K modules on K-1 processes, the ring that lets the
tied V stay in one place ("the snake eating its tail", §3).

Iteration t (paper §3, Algorithm 1; the DDG-style indices of Huo et al. 2018):
  forward   x_t flows through every module with the current weights w^t; module k keeps its input
  backward  module K backpropagates the loss of batch t at once (delay 0); module k < K backpropagates
            the error signal module k+1 sent it in iteration t-1, which belongs to batch t-(K-k):
                d_k = K - k
  update    w_G(k)^{t+1} = w_G(k)^t - lr_t * grad_G(k) f(w^{t-d_k}; x_{t-d_k})    (Adam in the paper)
  tied V    grad V = output-side gradient of batch t (module K) + input-side gradient of batch
            t-(K-1) (module 1); both on process 0, no communication
  warm-up   module k has no error signal in iterations 0..d_k-1 and makes no update (its .grad stays
            None, so AdamW skips it and its step count starts at its first real update)

Exactness ("snapshot-exact", our reading of the DDG analysis): module k runs its forward on a clone of
its weights taken in that iteration, so the gradient it applies d_k iterations later is the gradient at
w^{t-d_k}, not at the updated weights. The clone and the input are the state of an in-flight batch:
a checkpoint stores them (per process, `rank_state`) and a resume recomputes the stored forwards from
them, which on a CPU gives the same bits, so resume is exact including the stale gradients.

`delayed: false` runs the same placement backward-locked (module k waits for module k+1's error of the
same batch): plain backprop, the speed baseline of the paper's comparison, bitwise equal to the
trainer's standard step, the gradient clip active or not (tested; the engine computes the global norm
as the trainer does, engine.global_grad_norm). So is K = 1 (delay 0). On one process every module runs locally,
in order: that is the exact single-process reference the multi-process run is tested against.

Not reproduced here: the paper's speed and bpc/ppl tables (not retrieved; see notebook 06), and its
extra "training techniques" beyond the per-module warm-up.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.func import functional_call

from ..core.options import ConfigError, opt
from ..models.transformer import lm_loss
from ..techniques import register
from .engine import Engine, Stage, split_evenly, unique_params

ACT, ERR = 0, 1   # message kinds: forward activation, backward error signal


def default_split(n_layer: int, k: int) -> list[int]:
    """Blocks per module, balanced over the K-1 processes: process 0's share is divided between
    module 1 and module K (which also carry the embedding and the head)."""
    if k == 1:
        return [n_layer]
    shares = split_evenly(n_layer, max(1, k - 1))
    first, last = shares[0] // 2, shares[0] - shares[0] // 2
    return [first, *shares[1:], last] if k > 2 else [first, last]


def placement(k: int, world: int) -> list[int]:
    """Process of each module: all on process 0 (the single-process reference), or the ring."""
    if world == 1:
        return [0] * k
    if k >= 3 and world == k - 1:
        return [0, *range(1, k - 1), 0]
    raise ConfigError(f"ouroboros.modules={k} runs on {k - 1 if k >= 3 else 1} process(es) (modules 1 and K share "
                      f"the first) or on 1 (the single-process reference), but {world} were launched; "
                      f"use torchrun --nproc_per_node {k - 1 if k >= 3 else 1}, or --ouroboros.modules={world + 1}")


def delays(k: int, delayed: bool = True) -> list[int]:
    """d_k = K - k for modules k = 1..K (index 0..K-1); all 0 when backward-locked."""
    return [k - 1 - i if delayed else 0 for i in range(k)]


class _Entry:
    """A batch in flight through one module: inputs, the weight clone it ran with, outputs with graph."""

    def __init__(self, ins, snap, outs):
        self.ins, self.snap, self.outs = ins, snap, outs


@register
class Ouroboros(Engine):
    name = "ouroboros"

    @dataclass
    class Config:
        enabled: bool = opt(False, "train with Ouroboros delayed-gradient model parallelism (notebook 06)")
        modules: int = opt(3, "K: modules the blocks are split into; runs on K-1 processes (modules 1 and K "
                           "share the first) or on 1 process (the exact single-process reference)", min=1)
        delayed: bool = opt(True, "false = backward-locked model parallelism on the same placement "
                            "(plain backprop: the speed baseline)")
        split: list[int] = opt([], "blocks per module, K numbers summing to model.n_layer; [] = balanced "
                               "over the processes", min=0)
        block_ms: float = opt(0.0, "benchmarks: a fixed extra forward cost per block in ms (backward 2x), so a "
                              "2-core CPU times the schedule, not the machine", min=0.0)

        def validate(self):
            if self.split and len(self.split) != self.modules:
                raise ValueError(f"split has {len(self.split)} entries but modules={self.modules}; "
                                 "give one block count per module, or [] for a balanced split")

    # ------------------------------------------------------------------ build
    def build(self, model, accelerator) -> None:
        c, K, L = self.cfg, self.cfg.modules, model.cfg.n_layer
        if model.cfg.kind != "gpt":
            raise ConfigError("ouroboros splits a causal LM (model.kind=gpt); the masked LM is not supported")
        sizes = list(c.split) or default_split(L, K)
        if sum(sizes) != L:
            raise ConfigError(f"ouroboros.split={sizes} sums to {sum(sizes)} but model.n_layer={L}; "
                              "the modules must hold every block once")
        self.acc, self.device = accelerator, accelerator.device
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        self.owner = placement(K, self.world)
        self.d = delays(K, c.delayed)
        starts = [sum(sizes[:i]) for i in range(K)]
        cost = lambda n: (n * c.block_ms / 1e3, 2 * n * c.block_ms / 1e3)
        self.stages = [Stage(model, range(starts[i], starts[i] + sizes[i]), i == 0, i == K - 1, cost(sizes[i]))
                       for i in range(K)]
        self.local = [i for i in range(K) if self.owner[i] == self.rank]
        self.assign(model, self.stages, self.owner, self.local)   # the tied V belongs to module 1
        self.params = [p for p in unique_params(self.stages) if self.owner_of[id(p)] == self.rank]
        self.shape = (model.cfg.d_model,)
        self.t = 0                                          # iterations done
        self.pending = {i: deque() for i in self.local}     # in-flight batches of module i < K
        self.err = {i: None for i in self.local}            # error signals for module i's next backward
        self._mail, self._sends = {}, []

    def parameters(self):
        return self.params

    # ------------------------------------------------------------------ messages
    def _send(self, kind: int, dst: int, ts: list[torch.Tensor]) -> None:
        """Send module `dst` its micro-batch tensors: a local mailbox, or isend to its process."""
        if self.owner[dst] == self.rank:
            self._mail[(kind, dst)] = ts
            return
        for x in ts:
            self._sends.append(dist.isend(x.detach().contiguous(), self.owner[dst], tag=2 * dst + kind))

    def _recv(self, kind: int, dst: int, src: int, shapes: list) -> list[torch.Tensor]:
        if self.owner[src] == self.rank:
            return self._mail.pop((kind, dst))
        out = []
        for shp in shapes:
            x = torch.empty(shp, device=self.device)
            dist.recv(x, self.owner[src], tag=2 * dst + kind)
            out.append(x)
        return out

    # ------------------------------------------------------------------ the step
    def _forward(self, i: int, ins: list[torch.Tensor]) -> _Entry:
        stage = self.stages[i]
        snap = {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in stage.named_parameters()}
        if i > 0:
            ins = [x.detach().requires_grad_() for x in ins]
        return _Entry(ins, snap, [functional_call(stage, snap, (x,)) for x in ins])

    def _apply(self, i: int, e: _Entry) -> None:
        """Move the clone's gradients onto the live weights (summing the tied V's two contributions)."""
        for n, p in self.stages[i].named_parameters():
            g = e.snap[n].grad
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g

    def _backward(self, i: int, e: _Entry, errs: list[torch.Tensor]) -> None:
        for out, g in zip(e.outs, errs):
            torch.autograd.backward(out, g)
        if i > 0:
            self._send(ERR, i - 1, [x.grad for x in e.ins])
        self._apply(i, e)

    def forward_backward(self, batches: list) -> list:
        K, M, t = len(self.stages), len(batches), self.t
        shapes = [(x.size(0), x.size(1), *self.shape) for x, _ in batches]
        losses = None
        for i in self.local:   # in module order: on process 0, module 1 then module K
            ins = [x for x, _ in batches] if i == 0 else self._recv(ACT, i, i - 1, shapes)
            e = self._forward(i, ins)
            if i < K - 1:
                self._send(ACT, i + 1, e.outs)
                self.pending[i].append(e)
                if self.d[i] > 0 and t >= self.d[i]:   # the error signal of batch t - d_i came last iteration
                    self._backward(i, self.pending[i].popleft(), self.err.pop(i))
            else:   # module K: the loss of batch t, backpropagated at once
                ls = [lm_loss(out, y) for out, (_, y) in zip(e.outs, batches)]
                e.outs = [l / M for l in ls]
                self._backward(i, e, [None] * M)
                losses = torch.stack([l.detach().float() for l in ls])
        for i in reversed(self.local):
            if i == K - 1:
                continue
            if self.d[i] == 0:   # backward-locked: the error of this very batch, from module i+1
                self._backward(i, self.pending[i].popleft(), self._recv(ERR, i, i + 1, shapes))
            elif t >= self.d[i + 1]:   # module i+1 made an error signal this iteration: keep it for the next
                self.err[i] = self._recv(ERR, i, i + 1, shapes)
        for w in self._sends:
            w.wait()
        self._sends = []
        self.t += 1
        if self.world > 1:   # the loss lives with module K on process 0
            if losses is None:
                losses = torch.empty(M, device=self.device)
            dist.broadcast(losses, 0)
        return list(losses)

    # ------------------------------------------------------------------ in-flight state
    def rank_state(self) -> dict:
        return dict(t=self.t, world=self.world,
                    pending={i: [([x.detach() for x in e.ins], {n: v.detach() for n, v in e.snap.items()})
                                 for e in q] for i, q in self.pending.items()},
                    err={i: None if g is None else [x.detach() for x in g] for i, g in self.err.items()})

    def load_rank_state(self, d: dict) -> None:
        """Rebuild the in-flight batches: recompute each stored forward from its input and weight clone."""
        self.t = d["t"]
        self.err = {i: d["err"].get(i) for i in self.local}
        with self.acc.autocast():
            for i in self.local:
                self.pending[i] = deque()
                for ins, snap in d["pending"].get(i, []):
                    snap = {n: v.clone().requires_grad_() for n, v in snap.items()}
                    ins = [x.requires_grad_() if i > 0 else x for x in ins]
                    self.pending[i].append(_Entry(ins, snap, [functional_call(self.stages[i], snap, (x,))
                                                              for x in ins]))
