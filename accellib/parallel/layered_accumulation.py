"""Layered gradient accumulation (LGA): for each layer, all micro-batches.

Lamy-Poirier, "Layered gradient accumulation and modular pipeline parallelism", arXiv 2106.02679
(2021), §4 (layered accumulation). Standard accumulation runs the two loops the other way round:

    standard (micro-batch major)          layered (layer major)
    for i in micro-batches:               for l in layers:          (forward)
        for l in layers: F(l, i)              for i in micro-batches: F(l, i)
        for l in reversed(layers): B(l, i) for l in reversed(layers):  (backward)
                                              for i in micro-batches: B(l, i)
                                              reduce(grad W_l)      <- final *now*

Both compute the same sum  g_W = sum_i dL_i/dW  with the micro-batches added to each parameter in
the same order, so the gradients are bitwise equal (tested). In layer-major order the gradient of
layer l is final as soon as B(l, m-1) is done, so its data-parallel all-reduce is launched right
there and overlaps with the backward of the layers below; in standard order every gradient
becomes final only during the *last* micro-batch's backward, so at most t_bwd/m of compute is left
to hide the communication behind (planner.exposed_dp_time has the closed forms).
The price: the activations of all m micro-batches are alive at once (as for one big batch).

How it plugs into the one trainer: `run_step(trainer, batches, plans)` replaces the standard
micro-batch loop and returns the micro-batch losses; clipping, LR and the optimizer step stay in
the trainer. Deliberate bypasses, and why:
  * DDP's bucketed reduction: DDP's reducer assumes one autograd backward over the whole graph per
    forward (its buckets fire as gradients of the *final* backward arrive). LGA runs one backward
    per (layer, micro-batch) on detached layer boundaries, so we forward through the unwrapped
    model, hold `accelerator.no_sync(model)` for the whole step, and reduce ourselves: one async
    `all_reduce(SUM)` per parameter launched when its layer is done, divided by the world size.
  * Accelerate's `accumulate()`: it assumes one full forward+backward per micro-batch (depth
    first) and scales each backward call; here the loss scaling 1/m is applied explicitly.

Segments ("layers" of the loop): 0 = embedding (wte, wpe), 1..L = the blocks, L+1 = the head
(ln_f, lm_head). A tied head/embedding weight receives its last contribution in segment 0, so it
is owned (and reduced) there. Plans from layer-dropping/token-dropping techniques are supported:
each block runs through `run_block` under its plan (a skipped block passes gradients through;
a block skipped on every micro-batch has no gradient and is not reduced). Extra losses from other
techniques are supported when they are computed from (x, y, logits) only.

Emulated slow network: with `emulate_mbps > 0`, reductions go through one
communication thread where each layer's all_reduce takes bytes / bandwidth in all (a serial link),
so loopback's speed does not hide the overlap; it works on one process too (sleep only).
`order: standard` runs the same engine micro-batch-major (reductions launched during the last
micro-batch's backward, as DDP + no_sync does), for apples-to-apples comparisons.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ..config import opt
from ..model import gather_positions, lm_loss, run_block
from ..techniques import register
from ..techniques.base import Technique


class CommThread:
    """A serial emulated link: each job all-reduces (if world > 1), then sleeps until bytes/bandwidth
    has passed since it started."""

    def __init__(self, bytes_per_s: float, world: int):
        self.bps, self.world = bytes_per_s, world
        self.q: queue.Queue = queue.Queue()
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self):
        while True:
            job = self.q.get()
            if job is None:
                return
            tensors, done = job
            # a message takes bytes / bandwidth on the link, the real (loopback) transfer included:
            # reduce, then sleep what is left, so the link model is what the prediction assumes
            t0 = time.perf_counter()
            for t in tensors:
                if self.world > 1:
                    dist.all_reduce(t)
            link = sum(t.numel() * t.element_size() for t in tensors) / self.bps
            time.sleep(max(0.0, link - (time.perf_counter() - t0)))
            done()
            self.q.task_done()

    def submit(self, tensors, done):
        self.q.put((tensors, done))

    def wait(self):
        self.q.join()

    def close(self):
        self.q.put(None)


@register
class LayeredAccumulation(Technique):
    name = "layered_accumulation"
    needs = "the language model's embedding, blocks and head, which it runs layer by layer"

    @dataclass
    class Config:
        enabled: bool = opt(False, "layered gradient accumulation (Lamy-Poirier 2021): layer-major "
                                   "backward over all micro-batches with early per-layer all-reduce")
        order: str = opt("layered", "loop order of the engine: layered (layer-major) or standard "
                                    "(micro-batch-major, for comparisons)", choices=["layered", "standard"])
        emulate_mbps: float = opt(0.0, "emulated network bandwidth in MB/s for the reductions "
                                        "(0 = real network, no emulation)", min=0.0)
        keep_trace: bool = opt(True, "record the event trace of the last step (self.trace)")

    def __init__(self, cfg, run_cfg):
        super().__init__(cfg, run_cfg)
        self.trace: list[tuple[str, int, float]] = []   # (event, segment, seconds since step start)
        self.reductions: list[str] = []                  # parameter names in launch order, last step
        self.exposed_comm = 0.0                           # s between end of backward and last reduce
        self._comm: Optional[CommThread] = None

    # ------------------------------------------------------------------ segments
    def setup(self, trainer) -> None:
        m = trainer.raw_model
        L = len(m.blocks)
        tied = m.lm_head.weight is m.transformer.wte.weight
        seg_params: list[list[tuple[str, torch.nn.Parameter]]] = [[] for _ in range(L + 2)]
        seen = set()
        # the embedding first, so a tied head weight is owned by segment 0 (its last user)
        for n, p in m.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if n.startswith("transformer.wte") or n.startswith("transformer.wpe"):
                seg_params[0].append((n, p))
            elif n.startswith("transformer.h."):
                seg_params[1 + int(n.split(".")[2])].append((n, p))
            else:  # ln_f, untied lm_head
                seg_params[L + 1].append((n, p))
        self.seg_params, self.tied = seg_params, tied
        # every parameter owned by exactly one segment
        assert sum(len(s) for s in seg_params) == len({id(p) for p in m.parameters()})

    # ------------------------------------------------------------------ the step
    def run_step(self, trainer, batches, plans) -> list:
        acc, model = trainer.accelerator, trainer.raw_model
        world = acc.num_processes
        mbs = len(batches)
        L = len(model.blocks)
        t0 = time.perf_counter()
        self.trace, self.reductions = [], []
        rec = (lambda ev, s: self.trace.append((ev, s, time.perf_counter() - t0))) if self.cfg.keep_trace \
            else (lambda ev, s: None)
        if self.cfg.emulate_mbps > 0 and self._comm is None:
            self._comm = CommThread(self.cfg.emulate_mbps * 1e6, world)
        handles = []

        def reduce_segment(s: int):
            """Launch the reduction of segment s's (final) gradients: exactly once per parameter."""
            ps = [(n, p) for n, p in self.seg_params[s] if p.grad is not None]
            if not ps:
                return
            self.reductions += [n for n, _ in ps]
            rec("reduce_launch", s)
            done = lambda *_: rec("reduce_done", s)  # noqa: E731  (list.append is thread-safe)
            if self._comm is not None:
                self._comm.submit([p.grad for _, p in ps], done)
            elif world > 1:
                works = [dist.all_reduce(p.grad, async_op=True) for _, p in ps]
                torch.futures.collect_all([w.get_future() for w in works]).then(done)
                handles.extend(works)
            else:
                done()

        inputs = [[None] * (L + 2) for _ in range(mbs)]   # detached input of segment s, micro-batch i
        outputs = [[None] * (L + 2) for _ in range(mbs)]  # its output (loss for the head)
        losses = [None] * mbs
        tied_head = [None] * mbs   # head's contribution to a tied weight, added with the embedding's

        def fwd(s: int, i: int):
            x, y = batches[i]
            with acc.autocast():
                if s == 0:
                    pos = torch.arange(x.size(1), device=x.device)
                    out = model.transformer.wte(x) + model.transformer.wpe(pos)   # (B, T, C)
                    inputs[i][s] = None
                else:
                    h = outputs[i][s - 1].detach().requires_grad_(True)
                    inputs[i][s] = h
                    if s <= L:
                        out = run_block(model.blocks[s - 1], h, plans[i].blocks[s - 1])
                    else:
                        pos = trainer.task.positions(y)   # mlm: the head scores the masked positions only
                        if pos is not None:
                            h, y = gather_positions(h, pos), torch.gather(y, 1, pos)
                        logits = model.head(h)                                          # (B, T or k, V)
                        loss = lm_loss(logits, y)   # the model's own loss, so the gradients stay bitwise equal
                        total = loss
                        for tech in trainer.techniques:
                            extra = tech.extra_loss(model, x, y, logits)
                            total = total if extra is None else total + extra
                        losses[i] = loss.detach()
                        out = total / mbs   # the trainer's standard loop backprops total / m
            outputs[i][s] = out

        def bwd(s: int, i: int):
            """Backprop segment s of micro-batch i; accumulate its parameter grads in .grad the way
            AccumulateGrad does (first: set, then in-place add), so the sums are bitwise equal."""
            out, h = outputs[i][s], inputs[i][s]
            g_out = None if s == L + 1 else inputs[i][s + 1].grad
            params = [p for _, p in self.seg_params[s]]
            if s == L + 1 and self.tied:
                params = params + [model.lm_head.weight]
            wrt = ([h] if h is not None else []) + params
            if out is h:  # skipped block: identity, gradient passes through
                h.grad = g_out
            else:
                grads = torch.autograd.grad(out, wrt, grad_outputs=g_out, allow_unused=True)
                if h is not None:
                    h.grad, grads = grads[0], grads[1:]
                for p, g in zip(params, grads):
                    if g is None:
                        continue
                    if s == L + 1 and self.tied and p is model.lm_head.weight:
                        tied_head[i] = g   # standard backward sums head + embedding grads first
                        continue
                    if s == 0 and self.tied and p is model.transformer.wte.weight and tied_head[i] is not None:
                        g = tied_head[i] + g
                    if p.grad is None:
                        p.grad = g.clone()
                    else:
                        p.grad += g
            outputs[i][s] = None   # free this segment's graph
            if s + 1 <= L + 1:
                inputs[i][s + 1] = None

        segs = range(L + 2)
        with acc.no_sync(trainer.model):
            if self.cfg.order == "layered":
                for s in segs:
                    for i in range(mbs):
                        fwd(s, i)
                rec("bwd_start", -1)
                for s in reversed(segs):
                    for i in range(mbs):
                        bwd(s, i)
                    rec("bwd_done", s)
                    reduce_segment(s)     # every micro-batch has contributed: final now
            else:  # standard: micro-batch major; a layer is final during the last micro-batch
                for i in range(mbs):
                    for s in segs:
                        fwd(s, i)
                    if i == mbs - 1:
                        rec("bwd_start", -1)   # the only backward that can hide communication
                    for s in reversed(segs):
                        bwd(s, i)
                        if i == mbs - 1:
                            rec("bwd_done", s)
                            reduce_segment(s)
            t_bwd_end = time.perf_counter()
            if self._comm is not None:
                self._comm.wait()
            for w in handles:
                w.wait()
        self.exposed_comm = time.perf_counter() - t_bwd_end
        if world > 1:
            for s in segs:
                for _, p in self.seg_params[s]:
                    if p.grad is not None:
                        p.grad.div_(world)   # SUM -> mean over data-parallel ranks, as DDP does
        return losses

    def metrics(self, state) -> dict:
        return dict(exposed_comm_s=round(self.exposed_comm, 5))

    def __del__(self):
        if self._comm is not None:
            self._comm.close()


def predicted_exposed(trace: list, seg_bytes: list[float], bytes_per_s: float) -> float:
    """Exposed communication predicted from a trace on a serial link: segment k's reduction starts at
    max(its launch, previous reduction's end) and lasts bytes_k / bandwidth."""
    t, last_bwd = 0.0, 0.0
    for ev, s, when in trace:
        if ev == "reduce_launch":
            t = max(t, when) + seg_bytes[s] / bytes_per_s
        if ev == "bwd_done":
            last_bwd = when
    return max(0.0, t - last_bwd)


def segment_names(n_layer: int) -> list[str]:
    """Readable names of the LGA segments: embed, h.0 .. h.{L-1}, head."""
    return ["embed"] + [f"h.{i}" for i in range(n_layer)] + ["head"]
