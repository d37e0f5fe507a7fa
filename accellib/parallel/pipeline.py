"""Modular (looped) pipeline parallelism on torch.distributed.pipelining.

Lamy-Poirier 2021 (arXiv 2106.02679) §5 "modular pipeline parallelism" and its follow-up BFPP
(arXiv 2211.05953) §3: the Transformer's blocks are cut into S = v*P stages of consecutive blocks and
stage s is placed on pipeline rank s mod P ("looped": each rank holds v stages, a micro-batch loops
around the ranks v times), which divides the pipeline bubble by v:

    contiguous (GPipe, 1F1B):          rho = (P-1)/m
    looped (Interleaved1F1B, LoopedBFS): rho = (P-1)/(v m)     (m >= P; planner.bubble has m < P)

The schedules are PyTorch's own (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B = depth
first, ScheduleLoopedBFS = breadth first, i.e. layered-accumulation order); this file builds the
stages, checks the known traps with one-line errors, sums the tied embedding/head gradient across
the first and last stage, and averages gradients over a data-parallel dimension.

Data parallelism: a (dp, pp) device mesh; each stage's gradients are all-reduced over its dp group
after the schedule's step (plain replicated DP). Not supported here: FSDP2-sharded stages (torch
inserts per-stage UNSHARD/REDUCE_GRAD actions for those; left as an exercise) and Accelerate's
prepare() (Accelerate has no pipeline dimension for training; its prepare_pippy is inference only).

Launch (same entry point on CPU/gloo and GPU/NCCL):
    torchrun --nproc_per_node 2 -m accellib.parallel.pipeline --schedule looped_bfs --stages-per-rank 2
    torchrun --nproc_per_node 8 -m accellib.parallel.pipeline --schedule interleaved_1f1b \
        --stages-per-rank 4 --n-layer 32 --d-model 1024 --n-microbatches 16 --dp 2     # 8 GPUs: dp2 x pp4
"""
from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..model import ModelConfig, Transformer

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs")
MULTI_STAGE = ("interleaved_1f1b", "looped_bfs")


class PipelineError(ValueError):
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
                            f"choose --stages-per-rank so that pp * stages_per_rank divides n_layer")
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
        raise PipelineError(f"{schedule} runs one stage per rank; use --stages-per-rank 1 "
                            "or a looped schedule (interleaved_1f1b, looped_bfs)")
    if schedule == "1f1b" and n_mb < pp:
        raise PipelineError(f"1f1b needs n_microbatches >= pipeline stages ({pp}), got {n_mb}")
    if schedule == "interleaved_1f1b":
        rounds = max(1, n_mb // pp)
        if n_mb % rounds:
            raise PipelineError(f"interleaved_1f1b needs n_microbatches divisible by "
                                f"max(1, n_microbatches // pp) = {rounds}; got {n_mb} (use a multiple of {pp})")
    split_layers(n_layer, pp * v)


# ----------------------------------------------------------------------------- stages
class _FixedCost(torch.autograd.Function):
    """Identity whose forward sleeps t_f and backward t_b: a known stage cost for timing on CPU."""

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
    """Some consecutive blocks of a Transformer; the first stage also embeds, the last also applies
    ln_f and the head. Submodules are shared with `model` (same Parameters, same names inside)."""

    def __init__(self, model: Transformer, layers: range, first: bool, last: bool, cost=(0.0, 0.0)):
        super().__init__()
        self.first, self.last, self.cost = first, last, cost
        self.wte = model.transformer.wte if first else None
        self.wpe = model.transformer.wpe if first else None
        self.blocks = nn.ModuleList([model.blocks[i] for i in layers])
        self.ln_f = model.transformer.ln_f if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x):
        if self.first:   # (B, T) ids -> (B, T, C)
            x = self.wte(x) + self.wpe(torch.arange(x.size(1), device=x.device))
        for b in self.blocks:
            x = b(x)
        if self.cost[0] or self.cost[1]:
            x = _FixedCost.apply(x, *self.cost)
        if self.last:    # -> logits (B, T, V)
            x = self.lm_head(self.ln_f(x))
        return x


def lm_loss(logits, y):
    # mean cross-entropy of one micro-batch; scale_grads=True then averages over micro-batches
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))


class Pipeline:
    """This rank's stages and torch schedule; `step(x, y)` runs one forward/backward of the batch
    and returns the mean loss on the rank holding the last stage (None elsewhere)."""

    def __init__(self, model: Transformer, schedule: str, v: int, n_mb: int, batch: int,
                 pp_group=None, dp_group=None, device=torch.device("cpu"), style: str = "looped",
                 cost=(0.0, 0.0)):
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as S
        self.pp = dist.get_world_size(pp_group)
        self.rank = dist.get_rank(pp_group)
        check_config(schedule, self.pp, v, n_mb, batch, model.cfg.n_layer, style)
        n_stages = self.pp * v
        layers = split_layers(model.cfg.n_layer, n_stages)
        self.stage_ids = placement(n_stages, self.pp, style)[self.rank]
        self.modules = [Stage(model, layers[s], s == 0, s == n_stages - 1, cost).to(device)
                        for s in self.stage_ids]
        stages = [PipelineStage(m, s, n_stages, device, group=pp_group)
                  for m, s in zip(self.modules, self.stage_ids)]
        cls = dict(gpipe=S.ScheduleGPipe, **{"1f1b": S.Schedule1F1B},
                   interleaved_1f1b=S.ScheduleInterleaved1F1B, looped_bfs=S.ScheduleLoopedBFS)[schedule]
        self.schedule = cls(stages if schedule in MULTI_STAGE else stages[0], n_mb, loss_fn=lm_loss)
        self.has_first, self.has_last = 0 in self.stage_ids, n_stages - 1 in self.stage_ids
        self.dp_group = dp_group
        self.tie_group = None
        if model.cfg.tie_head and self.pp > 1:
            # the embedding (stage 0, pp rank 0) and head (last stage, pp rank P-1) hold separate
            # copies of the tied weight: sum their gradients so both take the same update
            ranks = dist.get_process_group_ranks(pp_group) if pp_group is not None else list(range(self.pp))
            self.tie_group = _tie_group(ranks[0], ranks[-1])
            self.tied = model.transformer.wte.weight

    def parameters(self):
        seen, out = set(), []
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def step(self, x, y):
        losses = []
        args = (x,) if self.has_first else ()
        kw = dict(target=y, losses=losses) if self.has_last else {}
        self.schedule.step(*args, **kw)
        if self.tie_group is not None and (self.has_first or self.has_last):
            dist.all_reduce(self.tied.grad, group=self.tie_group)
        if self.dp_group is not None and dist.get_world_size(self.dp_group) > 1:
            n = dist.get_world_size(self.dp_group)
            for p in self.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad.div_(n)
        return torch.stack(losses).mean() if self.has_last else None


_TIE_GROUPS: dict = {}   # (first rank, last rank) of each pipeline replica -> process group


def _tie_group(a: int, b: int):
    if (a, b) not in _TIE_GROUPS:   # not made by init_distributed: every rank gets here together
        _TIE_GROUPS[(a, b)] = dist.new_group([a, b])
    return _TIE_GROUPS[(a, b)]


def check_launch(dp: int, stages_per_rank: int, env=os.environ) -> None:
    """The command-line checks that need no process group (so they fail before any rank waits)."""
    if "WORLD_SIZE" not in env:
        raise PipelineError("the pipeline needs several processes: run it under torchrun, e.g. "
                            "torchrun --nproc_per_node 4 -m accellib.parallel.pipeline --schedule looped_bfs")
    if stages_per_rank < 1:
        raise PipelineError(f"--stages-per-rank must be at least 1, got {stages_per_rank}")
    world = int(env["WORLD_SIZE"])
    if dp < 1 or world % dp:
        raise PipelineError(f"--dp {dp} does not divide the {world} processes; the world is dp x pipeline "
                            f"ranks, so choose --dp from {[d for d in range(1, world + 1) if world % d == 0]}")


def init_distributed(dp: int = 1, timeout_s: int = 60):
    """Process group from torchrun's env (gloo on CPU, NCCL on GPU) with a short timeout, and the
    (dp, pp) groups. Returns (device, pp_group, dp_group)."""
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % dp:
        raise PipelineError(f"world size {world} is not divisible by --dp {dp}")
    pp = world // dp
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    pp_groups = [dist.new_group(list(range(d * pp, (d + 1) * pp))) for d in range(dp)]
    dp_groups = [dist.new_group(list(range(r, world, pp))) for r in range(pp)]
    # new_group must be called by every rank for every group in the same order: make them all now
    for d in range(dp if pp > 1 else 0):
        _TIE_GROUPS[(d * pp, d * pp + pp - 1)] = dist.new_group([d * pp, d * pp + pp - 1])
    return device, pp_groups[rank // pp], dp_groups[rank % pp]


# ----------------------------------------------------------------------------- parity check
def parity_run(schedule: str, v: int, n_mb: int, batch: int = 8, steps: int = 3, dp: int = 1,
               n_layer: int = 8, d_model: int = 32, seq_len: int = 16, lr: float = 0.1,
               cost=(0.0, 0.0), pp_group=None, dp_group=None, device=torch.device("cpu")) -> dict:
    """Train `steps` SGD steps pipelined and, on every rank, the unpartitioned model on the same
    global batch; return the largest loss and gradient differences and the step times."""
    cfg = ModelConfig(vocab_size=64, seq_len=seq_len, n_layer=n_layer, n_head=2, d_model=d_model)
    torch.manual_seed(0)
    model, ref = Transformer(cfg).to(device), Transformer(cfg).to(device)
    ref.load_state_dict(model.state_dict())
    pipe = Pipeline(model, schedule, v, n_mb, batch, pp_group, dp_group, device, cost=cost)
    opt = torch.optim.SGD(pipe.parameters(), lr=lr)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
    names = {id(p): n for n, p in model.named_parameters()}
    ref_params = dict(ref.named_parameters())
    dp_rank = dist.get_rank(dp_group) if dp_group is not None else 0
    out = dict(loss_diff=0.0, grad_diff=0.0, param_diff=0.0, times=[], losses=[])
    for t in range(steps):
        g = torch.Generator().manual_seed(100 + t)
        x = torch.randint(0, cfg.vocab_size, (dp * batch, seq_len), generator=g).to(device)
        y = torch.randint(0, cfg.vocab_size, (dp * batch, seq_len), generator=g).to(device)
        xs, ys = x[dp_rank * batch:(dp_rank + 1) * batch], y[dp_rank * batch:(dp_rank + 1) * batch]
        dist.barrier()
        t0 = time.perf_counter()
        loss = pipe.step(xs, ys)
        out["times"].append(time.perf_counter() - t0)
        _, ref_loss = ref(x, y)   # the global batch, mean loss
        ref_loss.backward()
        if loss is not None and dp == 1:
            out["loss_diff"] = max(out["loss_diff"], abs(loss.item() - ref_loss.item()))
            out["losses"].append(loss.item())
        for p in pipe.parameters():
            out["grad_diff"] = max(out["grad_diff"], (p.grad - ref_params[names[id(p)]].grad).abs().max().item())
        opt.step(), opt_ref.step()
        opt.zero_grad(), opt_ref.zero_grad()
        for p in pipe.parameters():
            out["param_diff"] = max(out["param_diff"], (p - ref_params[names[id(p)]]).abs().max().item())
    return out


def _spawn_worker(rank: int, world: int, port: int, jobs: list, dp: int, out_path: str):
    """Entry of torch.multiprocessing.spawn (tests, notebook, benchmark): run parity jobs, dump JSON."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    device, pp_group, dp_group = init_distributed(dp)
    res = []
    try:
        for job in jobs:
            try:
                r = parity_run(**job, dp=dp, pp_group=pp_group, dp_group=dp_group, device=device)
                res.append(dict(job, **r))
            except PipelineError as e:
                res.append(dict(job, error=str(e)))
        Path(out_path, f"pipe_rank{rank}.json").write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def spawn(jobs: list, world: int, out_dir: str, dp: int = 1, timeout_s: float = 120) -> list[list[dict]]:
    """Run parity jobs on `world` fresh CPU processes (spawn); returns each rank's results."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_spawn_worker, args=(world, port, jobs, dp, str(out_dir)), nprocs=world,
                             join=False, start_method="spawn")
    t0 = time.time()
    while not ctx.join(timeout=1):
        if time.time() - t0 > timeout_s:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"pipeline processes did not finish in {timeout_s} s")
    return [json.loads(Path(out_dir, f"pipe_rank{r}.json").read_text()) for r in range(world)]


# ----------------------------------------------------------------------------- CLI
def main(argv=None):
    ap = argparse.ArgumentParser(description="modular pipeline parallelism (run under torchrun)")
    ap.add_argument("--schedule", default="looped_bfs", choices=SCHEDULES)
    ap.add_argument("--stages-per-rank", type=int, default=2)
    ap.add_argument("--n-microbatches", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per data-parallel replica")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas (world = dp x pp)")
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--stage-ms", type=float, default=0.0, help="fixed forward cost per stage (backward 2x)")
    ap.add_argument("--out", default=None, help="folder for per-rank JSON results")
    a = ap.parse_args(argv)
    try:
        check_launch(a.dp, a.stages_per_rank)
    except PipelineError as e:
        raise SystemExit(f"error: {e}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device, pp_group, dp_group = init_distributed(a.dp)
    try:
        r = parity_run(a.schedule, a.stages_per_rank, a.n_microbatches, a.batch_size, a.steps, a.dp,
                       a.n_layer, a.d_model, a.seq_len, cost=(a.stage_ms / 1e3, 2 * a.stage_ms / 1e3),
                       pp_group=pp_group, dp_group=dp_group, device=device)
    except PipelineError as e:
        raise SystemExit(f"error: {e}")
    rank = dist.get_rank()
    print(f"rank {rank}: {a.schedule} v={a.stages_per_rank} m={a.n_microbatches}: "
          f"max|loss-ref|={r['loss_diff']:.2e} max|grad-ref|={r['grad_diff']:.2e} "
          f"step {sum(r['times']) / len(r['times']) * 1e3:.1f} ms", flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, f"rank{rank}.json").write_text(json.dumps(r))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
