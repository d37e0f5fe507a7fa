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

The loop talks to the data-parallel group through four calls (`AllReduceGrads` here): gather(params)
before a segment computes, release(params) after, reduce(params) once a segment's gradients are final,
finish() before the optimizer step. `shard: true` swaps in the ZeRO-3 half of the paper's §4
(accellib/parallel/zero_layered.py): parameters sharded over the processes, gathered once per segment
per pass and released after it, gradients reduce-scattered; the technique then runs as an engine
(accellib/parallel/engine.py), since the optimizer must step the shards, not the model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ..core.options import ConfigError, opt
from ..models.transformer import Plan, gather_positions, lm_loss, run_block
from ..techniques import register
from .comm import AllReduceGrads, CommThread
from .engine import Engine
from .zero_layered import ShardedParams


def segments(model) -> tuple[list[list[tuple[str, torch.nn.Parameter]]], bool]:
    """The parameters each segment owns (0 = embedding, 1..L = the blocks, L+1 = ln_f and an untied
    head), each parameter once; a tied head/embedding weight is owned by segment 0, its last user."""
    L = len(model.blocks)
    tied = model.lm_head.weight is model.transformer.wte.weight
    seg_params: list[list[tuple[str, torch.nn.Parameter]]] = [[] for _ in range(L + 2)]
    seen = set()
    for n, p in model.named_parameters(remove_duplicate=False):   # the embedding first
        if id(p) in seen:
            continue
        seen.add(id(p))
        if n.startswith("transformer.wte") or n.startswith("transformer.wpe"):
            seg_params[0].append((n, p))
        elif n.startswith("transformer.h."):
            seg_params[1 + int(n.split(".")[2])].append((n, p))
        else:  # ln_f, untied lm_head
            seg_params[L + 1].append((n, p))
    assert sum(len(s) for s in seg_params) == len({id(p) for p in model.parameters()})
    return seg_params, tied


class _Sharded:
    """`splits_model` of a LayeredAccumulation: its config's `shard` (sharded, the technique is an engine:
    the trainer steps the shards it returns); False on the class, which stands for the unsharded default."""

    def __get__(self, obj, cls=None) -> bool:
        return False if obj is None else obj.cfg.shard


@register
class LayeredAccumulation(Engine):
    name = "layered_accumulation"
    needs = "the language model's embedding, blocks and head, which it runs layer by layer"

    @dataclass
    class Config:
        enabled: bool = opt(False, "layered gradient accumulation (Lamy-Poirier 2021): layer-major "
                                   "backward over all micro-batches with early per-layer all-reduce")
        order: str = opt("layered", "loop order of the engine: layered (layer-major) or standard "
                                    "(micro-batch-major, for comparisons)", choices=["layered", "standard"])
        emulate_mbps: float = opt(0.0, "emulated network bandwidth in MB/s for the reductions "
                                        "(0 = real network, no emulation)", min=0.0, resume=True)
        keep_trace: bool = opt(True, "record the event trace of the last step (self.trace)", resume=True)
        shard: bool = opt(False, "ZeRO-3 half of the paper's §4: shard the parameters over the processes, "
                                 "gather each layer once per pass, reduce-scatter its gradient (several processes)")

    def __init__(self, cfg, run_cfg):
        super().__init__(cfg, run_cfg)
        self.trace: list[tuple[str, int, float]] = []   # (event, segment, seconds since step start)
        self.reductions: list[str] = []                  # parameter names in launch order, last step
        self.exposed_comm = 0.0                           # s between end of backward and last reduce
        self._comm: Optional[CommThread] = None
        self.sharded = None                               # zero_layered.ShardedParams when shard=true

    splits_model = _Sharded()
    resume_fixed = ("shard",)   # train.resume_config: the checkpoint's optimizer state is split (or not) by it

    def _link(self) -> Optional[CommThread]:
        if self.cfg.emulate_mbps > 0 and self._comm is None:
            self._comm = CommThread(self.cfg.emulate_mbps * 1e6)
        return self._comm

    # ------------------------------------------------------------------ segments
    def setup(self, trainer) -> None:
        self.trainer = trainer
        m = trainer.raw_model
        self.seg_params, self.tied = segments(m)
        L = len(m.blocks)
        # the parameters each segment computes with: its own, and for the head a tied weight
        self.seg_uses = [[p for _, p in ps] for ps in self.seg_params]
        if self.tied:
            self.seg_uses[L + 1].append(m.lm_head.weight)

    # ------------------------------------------------------------------ the step
    def run_step(self, trainer, batches, plans) -> list:
        io = AllReduceGrads(trainer.accelerator.num_processes, self._link())
        with trainer.accelerator.no_sync(trainer.model):
            return self.layered_step(trainer, batches, plans, io)

    def layered_step(self, trainer, batches, plans, io) -> list:
        """The micro-batch losses of one step; each parameter's gradient final (and reduced by `io`)."""
        acc, model = trainer.accelerator, trainer.raw_model
        mbs = len(batches)
        L = len(model.blocks)
        t0 = time.perf_counter()
        self.trace, self.reductions = [], []
        rec = (lambda ev, s: self.trace.append((ev, s, time.perf_counter() - t0))) if self.cfg.keep_trace \
            else (lambda ev, s: None)

        def reduce_segment(s: int):
            """Launch the reduction of segment s's (final) gradients: exactly once per parameter."""
            ps = [(n, p) for n, p in self.seg_params[s] if p.grad is not None]
            if not ps:
                return
            self.reductions += [n for n, _ in ps]
            rec("reduce_launch", s)
            io.reduce([p for _, p in ps], lambda *_: rec("reduce_done", s))  # (list.append is thread-safe)

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
            params = self.seg_uses[s]   # its own and, for the head, a tied weight
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

        segs, uses = range(L + 2), self.seg_uses
        if self.cfg.order == "layered":
            for s in segs:
                io.gather(uses[s])          # sharded: once for the forward of all micro-batches
                for i in range(mbs):
                    fwd(s, i)
                io.release(uses[s])
            rec("bwd_start", -1)
            for s in reversed(segs):
                io.gather(uses[s])          # and once for their backward
                for i in range(mbs):
                    bwd(s, i)
                io.release(uses[s])
                rec("bwd_done", s)
                reduce_segment(s)     # every micro-batch has contributed: final now
        else:  # standard: micro-batch major; a layer is final during the last micro-batch
            for i in range(mbs):
                for s in segs:
                    io.gather(uses[s])      # sharded: 2 m gathers per segment
                    fwd(s, i)
                    io.release(uses[s])
                if i == mbs - 1:
                    rec("bwd_start", -1)   # the only backward that can hide communication
                for s in reversed(segs):
                    io.gather(uses[s])
                    bwd(s, i)
                    io.release(uses[s])
                    if i == mbs - 1:
                        rec("bwd_done", s)
                        reduce_segment(s)
        t_bwd_end = time.perf_counter()
        io.finish()
        self.exposed_comm = time.perf_counter() - t_bwd_end
        return losses

    # ------------------------------------------------------------------ sharded: the engine interface
    def data_parallel(self, world: int) -> int:
        return world  # ZeRO: every process its own micro-batches, as plain data parallelism

    def build(self, model, accelerator) -> None:
        world = accelerator.num_processes
        if world == 1:
            raise ConfigError("layered_accumulation.shard=true shards the weights over data-parallel processes: "
                              "run it under torchrun --nproc_per_node N (N >= 2), or set shard=false")
        self.dp_world, self.dp_rank, self.device = world, accelerator.process_index, accelerator.device
        seg_params, _ = segments(model)
        self.sharded = ShardedParams([p for ps in seg_params for _, p in ps], world, self.dp_rank,
                                     dist.new_group(list(range(world))), self._link())
        # Engine.clip_grad_norm_: every process adds its shards' sums of squares into their parameters' slots
        from .engine import model_slots
        slot = model_slots(model)
        self.model, self.counted = model, [self.dp_rank]
        self.part = {id(s): self.dp_rank for s in self.sharded.shards}
        self.norm_slot = {id(s): slot[id(p)] for p, s in zip(self.sharded.params, self.sharded.shards)}

    def parameters(self):
        return self.sharded.shards

    def forward_backward(self, batches: list) -> list:
        plans = [Plan.full(len(self.trainer.raw_model.blocks)) for _ in batches]
        self.sharded.start_step()
        losses = self.layered_step(self.trainer, batches, plans, self.sharded)
        v = torch.stack(losses).float()
        dist.all_reduce(v)   # the same numbers on every process (the trainer averages them)
        return list(v / self.dp_world)

    def sync_replica(self) -> None:
        self.sharded.gather_all()

    def load_rank_state(self, d: dict) -> None:
        self.sharded.reshard()   # the trainer has just loaded the full weights: take this process's rows

    def state_dict(self) -> dict:
        return dict(shard=self.cfg.shard)

    def load_state_dict(self, d: dict) -> None:
        if d.get("shard", False) != self.cfg.shard:
            raise ConfigError(f"the checkpoint was trained with layered_accumulation.shard={d.get('shard', False)}; "
                              "resume it with the same setting (the optimizer state is split differently)")

    def metrics(self, state) -> dict:
        out = dict(exposed_comm_s=round(self.exposed_comm, 5))
        if self.sharded is not None:
            out.update({f"{k}_mb": round(v / 1e6, 6) for k, v in self.sharded.volume.items()})   # to the byte
        return out

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
