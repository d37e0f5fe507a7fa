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
over a (dp, pp) grid of processes).

When the data-parallel reduction starts (`pipeline.reduce`):
  * after_step: every gradient is all-reduced after the schedule's step, fully exposed;
  * per_stage: the paper's combination, layered gradient accumulation inside each stage (Lamy-Poirier
    2021 §4-§5; BFPP §3): a stage's all-reduce is launched as soon as its last micro-batch's backward
    is done (torch's REDUCE_GRAD action of the schedule, which we fill in) and overlaps the backward of
    the rank's earlier stages; only the reductions of the last stages to finish stay exposed. The tied
    embedding/head weight is reduced after the step (its two halves are summed first), as in after_step.
`pipeline.emulate_mbps` puts the reductions on one serial emulated link per process
(comm.CommThread), so loopback gloo does not hide the difference.
Each micro-batch backprops loss / m, as the trainer's standard loop does, and looped_bfs runs each
stage's backward in micro-batch order (torch runs m-1..0): without a tied head, the gradients are
bitwise those of the standard loop on the same micro-batches, in both reduce modes (tested).

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

import functools
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ..core.options import ConfigError, opt
from ..models.transformer import Transformer, lm_loss
from ..techniques import register
from .engine import Engine, Stage, unique_params
from .comm import AllReduceGrads, CommThread

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs")
MULTI_STAGE = ("interleaved_1f1b", "looped_bfs")
REDUCES = ("after_step", "per_stage")


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
                 style: str = "looped", reduce: str = "after_step", dp: int = 1, emulate_mbps: float = 0.0) -> None:
    """The known launch traps, as one-line errors before anything runs."""
    if reduce not in REDUCES:
        raise PipelineError(f"unknown pipeline.reduce {reduce!r}; choose one of {REDUCES}")
    if reduce == "per_stage" and dp == 1:
        raise PipelineError("pipeline.reduce=per_stage overlaps the data-parallel reduction with the backward; "
                            "it needs pipeline.dp > 1 (with dp=1 there is nothing to reduce)")
    if reduce == "per_stage" and schedule not in MULTI_STAGE:
        raise PipelineError(f"pipeline.reduce=per_stage needs several stages per rank (looped_bfs or interleaved_1f1b); "
                            f"with {schedule} a rank's only stage finishes when the step ends, so use after_step")
    if emulate_mbps > 0 and dp == 1:
        raise PipelineError("pipeline.emulate_mbps emulates the data-parallel link; it needs pipeline.dp > 1")
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


@functools.cache
def looped_bfs_in_order():
    """torch's breadth-first schedule with each stage's backward in micro-batch order 0..m-1 (torch runs
    m-1..0): the order in which the standard loop adds micro-batches into .grad, so the sums are bitwise
    equal for any m. The timeline is the same (every forward is done before the first backward)."""
    from torch.distributed.pipelining import schedules as S

    class LoopedBFSInOrder(S.ScheduleLoopedBFS):
        def _calculate_single_rank_operations(self, rank):
            m = self._n_microbatches
            return [a._replace(microbatch_index=m - 1 - a.microbatch_index)
                    if a is not None and a.computation_type == S._ComputationType.FULL_BACKWARD else a
                    for a in super()._calculate_single_rank_operations(rank)]
    return LoopedBFSInOrder


class Pipeline:
    """This rank's stages and torch schedule; `step(x, y)` runs one forward/backward of the batch
    and returns the mean loss on the rank holding the last stage (None elsewhere)."""

    def __init__(self, model: Transformer, schedule: str, v: int, n_mb: int, batch: int,
                 pp_group, pp_ranks: list[int], dp_group, tie_group, device, cost=(0.0, 0.0),
                 reduce: str = "after_step", link: Optional[CommThread] = None):
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as S
        self.pp, self.rank = len(pp_ranks), pp_ranks.index(dist.get_rank())
        self.dp = dist.get_world_size(dp_group) if dp_group is not None else 1
        check_config(schedule, self.pp, v, n_mb, batch, model.cfg.n_layer, reduce=reduce, dp=self.dp,
                     emulate_mbps=1.0 if link is not None else 0.0)
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
                   interleaved_1f1b=S.ScheduleInterleaved1F1B, looped_bfs=looped_bfs_in_order())[schedule]
        # each micro-batch backprops loss / m, as the trainer's standard loop does (not torch's division
        # of the summed gradients by m after the step): the same bits
        self.n_mb = n_mb
        self.schedule = cls(stages if schedule in MULTI_STAGE else stages[0], n_mb, loss_fn=self._loss,
                            scale_grads=False)
        self.has_first, self.has_last = 0 in self.stage_ids, n_stages - 1 in self.stage_ids
        self.dp_group, self.tie_group = dp_group, tie_group
        # the embedding (stage 0) and the head (last stage) hold the tied weight on two ranks
        self.tied = model.transformer.wte.weight if model.cfg.tie_head else None
        self.io = AllReduceGrads(self.dp, link, dp_group) if self.dp > 1 else None
        if reduce == "per_stage":   # torch's runtime puts REDUCE_GRAD right after a stage's last backward
            self.schedule.register_custom_function(S._ComputationType.REDUCE_GRAD, self._reduce_stage)
        self.trace: list[tuple[str, int, float]] = []   # (event, stage, seconds since the step started), last step
        self.exposed_comm = 0.0   # s from the end of the schedule to the last reduction's end, last step

    def parameters(self):
        return unique_params(self.modules)

    def _loss(self, logits, y):
        return lm_loss(logits, y) / self.n_mb

    def _rec(self, event: str, stage: int) -> None:
        self.trace.append((event, stage, time.perf_counter() - self._t0))   # (list.append is thread-safe)

    def _grads_of(self, stages) -> list:
        """The local parameters of `stages` that have a gradient, but the tied weight (reduced after the step)."""
        return [p for p in unique_params([self.all_stages[s] for s in stages])
                if p.grad is not None and p is not self.tied]

    def _reduce_stage(self, action, ctx) -> None:
        """REDUCE_GRAD of stage s: its last micro-batch's backward is done, so its gradients are final."""
        s = action.stage_index
        self._launched.append(s)
        self._rec("reduce_launch", s)
        self.io.reduce(self._grads_of([s]), lambda *_: self._rec("reduce_done", s))

    def step(self, x, y):
        losses, self._launched, self.trace, self._t0 = [], [], [], time.perf_counter()
        args = (x,) if self.has_first else ()
        kw = dict(target=y, losses=losses) if self.has_last else {}
        self.schedule.step(*args, **kw)
        t_end = time.perf_counter()
        self._rec("schedule_end", -1)
        if self.tie_group is not None and (self.has_first or self.has_last):
            # sum the tied weight's two gradients so that both copies take the same update
            dist.all_reduce(self.tied.grad, group=self.tie_group)
        if self.io is not None:
            rest = self._grads_of([s for s in self.stage_ids if s not in self._launched])
            if self.tie_group is not None and (self.has_first or self.has_last):
                rest.append(self.tied)
            if rest:
                self._rec("reduce_launch", -1)
                self.io.reduce(rest, lambda *_: self._rec("reduce_done", -1))
            self.io.finish()   # sum over the data-parallel pipelines, then / dp
        self.exposed_comm = time.perf_counter() - t_end
        # (torch's losses are the loss_fn's, loss / m; the first step's shape inference also calls loss_fn)
        return torch.stack(losses).mean() * self.n_mb if self.has_last else None


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
        reduce: str = opt("after_step", "when a stage's data-parallel gradient all-reduce starts: after_step (after "
                          "the schedule) or per_stage (right after its last micro-batch's backward, overlapping the "
                          "rest: layered accumulation in the pipeline; looped schedules, dp > 1)", choices=list(REDUCES))
        emulate_mbps: float = opt(0.0, "benchmarks: emulated data-parallel link in MB/s, one serial link per "
                                  "process (0 = the real network); dp > 1", min=0.0)

        @property
        def enabled(self) -> bool:
            return bool(self.schedule)

    def data_parallel(self, world: int) -> int:
        return self.cfg.dp

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
        check_config(c.schedule, pp, v, c.n_microbatches, t.batch_size, model.cfg.n_layer, reduce=c.reduce, dp=c.dp,
                     emulate_mbps=c.emulate_mbps)
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
                             (c.block_ms / 1e3, 2 * c.block_ms / 1e3), c.reduce,
                             CommThread(c.emulate_mbps * 1e6) if c.emulate_mbps > 0 else None)
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

    def metrics(self, state) -> dict:
        # data-parallel reduction time left after the schedule (this process, last step)
        return dict(exposed_comm_s=round(self.pipe.exposed_comm, 5)) if self.dp_world > 1 else {}
