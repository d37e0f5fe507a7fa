"""Modular (looped) pipeline parallelism on torch.distributed.pipelining, as an engine of the one trainer.

Lamy-Poirier 2021 (arXiv 2106.02679) §5 "modular pipeline parallelism" and its follow-up BFPP
(arXiv 2211.05953) §3: the Transformer's blocks are cut into S = v*P stages of consecutive blocks and
stage s is placed on pipeline rank s mod P ("looped": each rank holds v stages, a micro-batch loops
around the ranks v times), which divides the pipeline bubble by v:

    contiguous (GPipe, 1F1B):          rho = (P-1)/m
    looped (Interleaved1F1B, LoopedBFS): rho = (P-1)/(v m)     (m >= P; planner.bubble has m < P)

The schedules are PyTorch's own (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B = depth
first, ScheduleLoopedBFS = breadth first, i.e. layered-accumulation order); this file builds the
stages, checks the known traps with one-line errors, sums the tied embedding/head gradient across
the first and last stage, and averages gradients over a data-parallel dimension (plain replicated DP
over a (dp, pp) grid of processes, all-reduced after the schedule's step).

It runs inside the trainer (accellib/parallel/engine.py), so a pipelined run evaluates, logs,
checkpoints, resumes and enters `compare` like any other:
    torchrun --nproc_per_node 3 -m accellib.train --config configs/tutorial.yaml --out runs/pp \
        --pipeline.schedule=looped_bfs --train.steps=50     # 3 CPU processes (gloo): 3 x 2 stages = 6 blocks
    torchrun --nproc_per_node 8 -m accellib.train --config configs/gpt2_small_owt.yaml --out runs/pp8 \
        --train.grad_accum=1 --pipeline.schedule=interleaved_1f1b --pipeline.stages_per_rank=3 --pipeline.dp=2 \
        --pipeline.n_microbatches=8                                            # 8 GPUs: dp2 x pp4
train.batch_size is the batch of one pipeline per step (cut into pipeline.n_microbatches).
Not supported: FSDP2-sharded stages (torch inserts per-stage UNSHARD/REDUCE_GRAD actions for those)
and other techniques in the same run (the stages run the plain model).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import ConfigError, opt
from ..model import Transformer, lm_loss
from ..techniques import register
from .engine import Engine, Stage, unique_params

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs")
MULTI_STAGE = ("interleaved_1f1b", "looped_bfs")


class PipelineError(ConfigError):
    """A pipeline configuration torch would reject with an obscure error (or a hang)."""


# ----------------------------------------------------------------------------- placement
def placement(n_stages: int, pp: int, style: str = "looped") -> list[list[int]]:
    """Stages held by each pipeline rank. looped: stage s on rank s mod pp (rank r: r, r+pp, ...);
    contiguous: rank r holds stages [r v, (r+1) v)."""
    if n_stages % pp:
        raise PipelineError(f"{n_stages} stages cannot be spread evenly over {pp} pipeline ranks; "
                            "make stages a multiple of the pipeline size")
    v = n_stages // pp
    if style == "looped":
        return [[r + k * pp for k in range(v)] for r in range(pp)]
    if style == "contiguous":
        return [[r * v + k for k in range(v)] for r in range(pp)]
    raise PipelineError(f"placement {style!r} is not 'looped' or 'contiguous'")


def split_layers(n_layer: int, n_stages: int) -> list[range]:
    """Consecutive blocks of each stage (a stage of BFPP; MPP is one block per stage)."""
    if n_layer % n_stages:
        raise PipelineError(f"n_layer={n_layer} is not divisible by {n_stages} stages; "
                            "choose pipeline.stages_per_rank so that pipeline ranks x stages_per_rank divides model.n_layer")
    k = n_layer // n_stages
    return [range(s * k, (s + 1) * k) for s in range(n_stages)]


def check_config(schedule: str, pp: int, v: int, n_mb: int, batch: int, n_layer: int,
                 style: str = "looped") -> None:
    """The known launch traps, as one-line errors before anything runs."""
    if schedule not in SCHEDULES:
        raise PipelineError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")
    if n_mb > batch:
        raise PipelineError(f"n_microbatches={n_mb} exceeds the batch size {batch}")
    if batch % n_mb:
        raise PipelineError(f"batch size {batch} is not divisible by n_microbatches={n_mb}; "
                            "torch splits the batch into equal chunks: pick a divisor of the batch")
    if schedule in MULTI_STAGE and style != "looped":
        raise PipelineError(f"{schedule} needs looped placement (stage s on rank s mod P); "
                            f"contiguous placement fails inside torch with a bare AssertionError")
    if schedule not in MULTI_STAGE and v != 1:
        raise PipelineError(f"{schedule} runs one stage per rank; use --pipeline.stages_per_rank=1 "
                            "or a looped schedule (interleaved_1f1b, looped_bfs)")
    if schedule == "1f1b" and n_mb < pp:
        raise PipelineError(f"1f1b needs n_microbatches >= pipeline stages ({pp}), got {n_mb}")
    if schedule == "interleaved_1f1b":
        rounds = max(1, n_mb // pp)
        if n_mb % rounds:
            raise PipelineError(f"interleaved_1f1b needs n_microbatches divisible by "
                                f"max(1, n_microbatches // pp) = {rounds}; got {n_mb} (use a multiple of {pp})")
    split_layers(n_layer, pp * v)


class Pipeline:
    """This rank's stages and torch schedule; `step(x, y)` runs one forward/backward of the batch
    and returns the mean loss on the rank holding the last stage (None elsewhere)."""

    def __init__(self, model: Transformer, schedule: str, v: int, n_mb: int, batch: int,
                 pp_group, pp_ranks: list[int], dp_group, tie_group, device, cost=(0.0, 0.0)):
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as S
        self.pp, self.rank = len(pp_ranks), pp_ranks.index(dist.get_rank())
        check_config(schedule, self.pp, v, n_mb, batch, model.cfg.n_layer)
        self.n_stages = n_stages = self.pp * v
        layers = split_layers(model.cfg.n_layer, n_stages)
        # every stage as a view of the model (for ownership); this rank runs the ones placed on it
        self.all_stages = [Stage(model, layers[s], s == 0, s == n_stages - 1,
                                 (len(layers[s]) * cost[0], len(layers[s]) * cost[1])) for s in range(n_stages)]
        self.placed = placement(n_stages, self.pp)
        self.stage_ids = self.placed[self.rank]
        self.modules = [self.all_stages[s] for s in self.stage_ids]
        stages = [PipelineStage(m, s, n_stages, device, group=pp_group) for m, s in zip(self.modules, self.stage_ids)]
        cls = dict(gpipe=S.ScheduleGPipe, **{"1f1b": S.Schedule1F1B},
                   interleaved_1f1b=S.ScheduleInterleaved1F1B, looped_bfs=S.ScheduleLoopedBFS)[schedule]
        self.schedule = cls(stages if schedule in MULTI_STAGE else stages[0], n_mb, loss_fn=lm_loss)
        self.has_first, self.has_last = 0 in self.stage_ids, n_stages - 1 in self.stage_ids
        self.dp_group, self.tie_group = dp_group, tie_group
        # the embedding (stage 0) and the head (last stage) hold the tied weight on two ranks
        self.tied = model.transformer.wte.weight if model.cfg.tie_head else None

    def parameters(self):
        return unique_params(self.modules)

    def step(self, x, y):
        losses = []
        args = (x,) if self.has_first else ()
        kw = dict(target=y, losses=losses) if self.has_last else {}
        self.schedule.step(*args, **kw)
        if self.tie_group is not None and (self.has_first or self.has_last):
            # sum the tied weight's two gradients so that both copies take the same update
            dist.all_reduce(self.tied.grad, group=self.tie_group)
        if self.dp_group is not None and dist.get_world_size(self.dp_group) > 1:
            n = dist.get_world_size(self.dp_group)
            for p in self.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad.div_(n)
        return torch.stack(losses).mean() if self.has_last else None


@register
class PipelineEngine(Engine):
    """The modular pipeline as an engine of the one trainer: `--pipeline.schedule=looped_bfs`."""
    name = "pipeline"

    @dataclass
    class Config:
        schedule: str = opt("", "'' = off; train with the model cut into pipeline stages across the processes "
                            "(notebook 05)", choices=["", *SCHEDULES])
        stages_per_rank: int = opt(0, "v: stages per pipeline process; 0 = 2 for the looped schedules "
                                   "(interleaved_1f1b, looped_bfs), 1 for gpipe and 1f1b", min=0)
        n_microbatches: int = opt(4, "micro-batches each pipeline's batch (train.batch_size) is cut into", min=1)
        dp: int = opt(1, "data-parallel pipelines: processes = dp x pipeline ranks", min=1)
        block_ms: float = opt(0.0, "benchmarks: a fixed extra forward cost per block in ms (backward 2x)", min=0.0)

        @property
        def enabled(self) -> bool:
            return bool(self.schedule)

    def build(self, model, accelerator) -> None:
        c, t = self.cfg, self.run_cfg.train
        world, rank = accelerator.num_processes, accelerator.process_index
        if t.grad_accum != 1:
            raise PipelineError("the pipeline cuts each batch into pipeline.n_microbatches itself; "
                                "set train.grad_accum=1 (raise train.batch_size for a larger batch)")
        if world % c.dp:
            raise PipelineError(f"pipeline.dp={c.dp} does not divide the {world} processes; the processes are "
                                f"dp x pipeline ranks, so choose from {[d for d in range(1, world + 1) if world % d == 0]}")
        if world == 1:
            raise PipelineError("the pipeline needs several processes: run it under torchrun, e.g. torchrun "
                                "--nproc_per_node 4 -m accellib.train --config ... --pipeline.schedule=looped_bfs")
        pp = world // c.dp
        v = c.stages_per_rank or (2 if c.schedule in MULTI_STAGE else 1)
        check_config(c.schedule, pp, v, c.n_microbatches, t.batch_size, model.cfg.n_layer)
        # new_group must be called by every process for every group in the same order: make them all here
        pp_groups = [dist.new_group(list(range(d * pp, (d + 1) * pp))) for d in range(c.dp)]
        dp_groups = [dist.new_group(list(range(r, world, pp))) for r in range(pp)]
        tie_groups = [dist.new_group([d * pp, d * pp + pp - 1]) for d in range(c.dp)] if model.cfg.tie_head else None
        d = rank // pp
        self.dp_world, self.dp_rank = c.dp, d
        self.world, self.device = world, accelerator.device
        self.pipe = Pipeline(model, c.schedule, v, c.n_microbatches, t.batch_size, pp_groups[d],
                             list(range(d * pp, (d + 1) * pp)), dp_groups[rank % pp],
                             tie_groups[d] if tie_groups else None, accelerator.device,
                             (c.block_ms / 1e3, 2 * c.block_ms / 1e3))
        process_of = [next(r for r, ss in enumerate(self.pipe.placed) if s in ss) for s in range(self.pipe.n_stages)]
        self.assign(model, self.pipe.all_stages, process_of, self.pipe.stage_ids if d == 0 else [])

    def parameters(self):
        return self.pipe.parameters()

    def forward_backward(self, batches: list) -> list:
        (x, y), = batches
        loss = self.pipe.step(x, y)
        v = torch.zeros(1, device=self.device) if loss is None else loss.detach().float().reshape(1)
        dist.all_reduce(v)   # one last stage per pipeline: the sum over processes is the sum over pipelines
        return [v[0] / self.dp_world]
