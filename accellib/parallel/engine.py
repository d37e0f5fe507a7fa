"""The engine interface: how the one trainer runs a step whose model is split across processes.

An engine is a technique (a config section, e.g. `pipeline:`, `ouroboros:`, or `layered_accumulation:` with
`shard: true`, whose processes each step a shard of every parameter) that owns
  * the process groups and which stage of the model lives on which process,
  * the forward/backward schedule of a step (`forward_backward`),
  * which parameters this process steps (`parameters`: the trainer builds AdamW over them only),
  * the gradient norm across processes (`clip_grad_norm_`) and its own per-process state.
The trainer (accellib/core/trainer.py) keeps everything else: data, LR and technique schedules, counters,
evaluation, metrics.jsonl, checkpoint/resume, and so `compare`.

    trainer.__init__   engine.build(model, accelerator)        after the model is on its device
    each step          losses = engine.forward_backward(batches)   same numbers on every process
                       norm = engine.clip_grad_norm_(max_norm);  optimizer.step() (local params)
    eval / save        engine.sync_replica()   every process gets the current full weights
    save / load        engine.rank_state() / load_rank_state()   written per process, beside Accelerate's files

Every process keeps a full replica of the weights (not of the gradients or optimizer state): the
trainer evaluates and checkpoints that replica exactly as for a plain run, so a checkpoint of any
engine loads into the plain model. The replica is refreshed from the stages' owners before each
evaluation and save (`sync_replica`), a broadcast of the weights; between those it is stale on
the processes that do not own a stage. At full scale this costs a model's worth of memory per
process; an engine that must not pay it would evaluate through its stages instead. The sharded
layered accumulation (accellib/parallel/zero_layered.py) does not pay it between steps: it frees each
layer's full weights after use and gathers the whole replica only for evaluation and saving.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ..models.transformer import Transformer, embed, head
from ..techniques.base import Technique


class Engine(Technique):
    splits_model = True   # the trainer and check_composition look for this

    def fsdp_refusal(self) -> str:
        return "it runs the model's pieces itself, outside the FSDP-wrapped forward, and splits or reduces them its own way"
    needs = "the language model's embedding, blocks and head, which it splits into stages"

    def __init__(self, cfg, run_cfg):
        super().__init__(cfg, run_cfg)
        self.dp_world, self.dp_rank = 1, 0   # data-parallel size and index (whole pipelines / rings)
        self.device = torch.device("cpu")    # build() sets the accelerator's device

    def data_parallel(self, world: int) -> int:
        """How many data-parallel replicas (self.dp_world after build) `world` processes make, each with
        micro-batches of its own: 1 for an engine whose processes all work on one batch (the default)."""
        return 1

    def build(self, model: Transformer, accelerator) -> None:
        """Make the process groups and stages of this process, set self.device, and call assign()."""
        raise NotImplementedError

    def parameters(self) -> list[nn.Parameter]:
        """The parameters this process updates, each once."""
        raise NotImplementedError

    def forward_backward(self, batches: list) -> list[float]:
        """Run one optimizer step's micro-batches; leave the local parameters' .grad set (None where
        a parameter gets no update this step); return the micro-batch losses, the same on every rank."""
        raise NotImplementedError

    def assign(self, model: Transformer, stages: list[nn.Module], process_of: list[int], counted: list[int]) -> None:
        """Called by build(): each parameter belongs to the first stage holding it (the tied embedding: stage
        0) and is owned by that stage's process (`process_of[s]`, in data-parallel replica 0). `counted`: the
        stages whose gradient norms this process contributes to the global norm (its own, in replica 0)."""
        self.model, self.counted = model, counted
        self.part, self.owner_of = {}, {}
        for s, stage in enumerate(stages):
            for p in stage.parameters():
                if id(p) not in self.part:
                    self.part[id(p)], self.owner_of[id(p)] = s, process_of[s]
        self.norm_slot = model_slots(model)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The global pre-clip gradient norm, computed as the trainer's standard step computes it
        (`global_grad_norm`: each parameter's sum of squares in its model-order slot, summed over the
        processes, one sqrt), so an engine that computes the plain model's gradients also clips them to
        the same bits, the clip active or not; clips with `clip_grads` (torch's rule)."""
        params = self.parameters()
        mine = [(self.norm_slot[id(p)], p.grad) for p in params if self.part[id(p)] in self.counted]
        total = global_grad_norm(mine, len(self.norm_slot), self.device, reduce=True)
        clip_grads(params, total, max_norm)
        return total

    def sync_replica(self) -> None:
        """Every process gets the current weights of the stages it does not run (before eval and save)."""
        broadcast_owned(self.model, self.owner_of)

    def rank_state(self) -> dict:
        return {}

    def load_rank_state(self, d: dict) -> None:
        pass


# ----------------------------------------------------------------------------- stages
class FixedCost(torch.autograd.Function):
    """Identity whose forward sleeps t_f seconds and backward t_b: a known stage cost, so that a
    benchmark on a 2-core CPU measures the schedule and not the machine (sleeping uses no core)."""

    @staticmethod
    def forward(ctx, x, t_f, t_b):
        ctx.t_b = t_b
        time.sleep(t_f)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.t_b)
        return g, None, None


class Stage(nn.Module):
    """Consecutive blocks of a Transformer; the first stage also embeds, the last also applies ln_f and
    the head. Submodules are the model's own (same Parameters), under short names (wte, blocks.0, ...)."""

    def __init__(self, model: Transformer, layers: range, first: bool, last: bool,
                 cost: tuple[float, float] = (0.0, 0.0)):
        super().__init__()
        self.first, self.last, self.cost = first, last, cost
        self.wte = model.transformer.wte if first else None
        self.wpe = model.transformer.wpe if first else None
        self.blocks = nn.ModuleList([model.blocks[i] for i in layers])
        self.ln_f = model.transformer.ln_f if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = embed(self.wte, self.wpe, x)   # (B, T) ids -> (B, T, C)
        for b in self.blocks:
            x = b(x)
        if self.cost[0] or self.cost[1]:
            x = FixedCost.apply(x, *self.cost)
        if self.last:
            x = head(self.ln_f, self.lm_head, x)   # -> logits (B, T, V)
        return x


def split_evenly(n: int, parts: int) -> list[int]:
    """n items into `parts` consecutive groups whose sizes differ by at most one (larger first)."""
    return [n // parts + (i < n % parts) for i in range(parts)]


def unique_params(modules) -> list[nn.Parameter]:
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


# ----------------------------------------------------------------------------- collectives
def broadcast_owned(model: nn.Module, owner: dict[int, int], group=None) -> None:
    """Give every process the weights of each parameter's owner: one flattened broadcast per owning
    rank (`owner`: id(parameter) -> global rank), in the model's parameter order."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    params = unique_params([model])
    for src in sorted(set(owner.values())):
        mine = [p for p in params if owner.get(id(p)) == src]
        if not mine:
            continue
        flat = torch.cat([p.detach().reshape(-1) for p in mine])
        dist.broadcast(flat, src, group=group)
        if dist.get_rank() != src:
            with torch.no_grad():
                for p, v in zip(mine, flat.split([p.numel() for p in mine])):
                    p.copy_(v.view_as(p))


def model_slots(model: nn.Module) -> dict[int, int]:
    """id(parameter) -> its index in model.parameters() (each shared parameter once): the fixed order in
    which `global_grad_norm` adds the per-parameter sums of squares."""
    return {id(p): i for i, p in enumerate(unique_params([model]))}


def global_grad_norm(grads: list[tuple[int, Optional[torch.Tensor]]], n_slots: int, device,
                     reduce: bool = False, group=None) -> torch.Tensor:
    """The global L2 gradient norm (float32, 0-d, on `device`; nothing read to the host), computed one way
    by the trainer's standard step and by every engine: a float64 vector of one slot per model parameter
    (model_slots), each slot the square of its gradient's L2 norm (of the part this process holds: a ZeRO shard
    adds its rows' squares), summed over the processes when `reduce` (adding the zeros of slots held elsewhere
    is exact), then summed in slot order and one sqrt, rounded to float32. A pipeline stage, an Ouroboros module
    or a DDP replica therefore gives the same bits as the plain model.

    The per-parameter norms are one `torch._foreach_norm(..., dtype=float64)` call: the squares are accumulated
    in float64 inside one multi-tensor kernel on a GPU (torch's clip_grad_norm_ uses the same kernel in the
    gradients' own dtype), so no float64 copy of any gradient is made and the host dispatches a handful of ops
    per step, not four per parameter (issue 42: 600 ops and ~4.5 GB of memory traffic per GPT-2-small step).
    Squaring a float64 norm gives the float64 sum of squares to ~1e-16 relative, as summing them in another
    order does: the float32 result is the bits the earlier per-parameter float64 sums gave unless the norm lies
    that close to a float32 rounding boundary (tests/test_step_cost.py compares them). A sharded parameter's slot
    is the sum of its shards' squared norms, equal to the whole parameter's to the same float64 round-off."""
    slots, present = [], []
    for i, g in grads:  # each slot at most once per process
        if g is not None:
            slots.append(i)
            present.append(g)
    norms = dict(zip(slots, torch._foreach_norm(present, 2, dtype=torch.float64))) if present else {}
    if len(norms) == n_slots:  # every slot present, in slot order (the trainer's standard step)
        v = torch.stack([norms[i] for i in range(n_slots)])
    else:  # built by stacking on the device (no index tensor copied to it)
        zero = torch.zeros((), dtype=torch.float64, device=device)
        v = torch.stack([norms.get(i, zero) for i in range(n_slots)])
    v = v * v
    if reduce and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(v, group=group)
    return v.sum().sqrt().to(torch.float32)


def clip_grads(params: list[nn.Parameter], total: torch.Tensor, max_norm: float) -> None:
    """torch's clip_grad_norm_ rule on the float32 norm `total`: multiply by min(1, max_norm / (total +
    1e-6)), computed in float32 on the device (no host read), so equal norms give equal coefficients.
    Nothing is touched when max_norm is inf (no clipping is bitwise none; multiplying by 1.0 is exact anyway)."""
    if not math.isfinite(max_norm):
        return
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, coef)
