"""The one training loop (HuggingFace Accelerate), with named hook points for techniques.

Per optimizer step t:
    for each micro-batch m (data drawn from (seed, t, m, rank), plan from the techniques):
        forward under the plan, loss (+ technique extra losses), backward (no DDP sync but the last)
    clip, LR = schedule(state) * technique factors, AdamW step, counters, logs, eval, checkpoint.

Everything random is a function of (seed, step, micro-step[, rank]), so every data-parallel
rank draws the same plan and a run resumed at step k reproduces the uninterrupted run
bitwise on CPU. See accellib/techniques/base.py for the hook points.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import time
import zipfile
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

import torch
import yaml
from tqdm.auto import tqdm

from .options import ConfigError
from .config import RunConfig, changed_options, load_config
from .hardware import enable_fast_math, peak_flops, peak_memory_gb
from .launch import distributed_setup, fsdp_requested, make_accelerator, tracking_kwargs
from ..models.transformer import Plan
from .run_dir import (check_shared_run_dir, checkpoint_folder, checkpoint_layout, checkpoint_state,
                      note_checkpoint, recorded_checkpoints, remove_checkpoint, unreadable_advice, write_marker)
from .schedules import WarmupCosine
from .tasks import make_task


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); the message says what to change."""


class _Rewind(Exception):
    """A confirmed divergence that fit's loop answers by going back to the last good checkpoint (Trainer._rewind)."""


def command(*args) -> str:
    """The command line `python -m accellib.train ARGS`, quoted so that it pastes into a shell as it is (a path with a
    space stays one argument)."""
    return shlex.join(["python", "-m", "accellib.train", *map(str, args)])


def damaged_files(folder: Path, rank: int = 0) -> list[str]:
    """What is wrong with the files of the checkpoint folder `folder` that this process (`rank`) reads, found without
    loading them: an empty file, a torch file that is not a whole archive (cut short, or overwritten: torch.save
    writes a zip whose directory is at its end), and a missing random_states_<rank>.pkl (Accelerate's load_state
    would skip an unreadable one without a word, and the resumed run would draw other random numbers); [] if none."""
    bad = []
    for p in sorted(Path(folder).rglob("*")):
        if not p.is_file():
            continue
        name = p.relative_to(folder).as_posix()
        if p.stat().st_size == 0:
            bad.append(f"{name} is empty (0 bytes)")
        elif p.suffix in (".bin", ".pkl", ".pt") and not zipfile.is_zipfile(p):
            bad.append(f"{name} is cut short or overwritten (not a whole torch file)")
    if not (Path(folder) / f"random_states_{rank}.pkl").exists():
        bad.append(f"random_states_{rank}.pkl is missing")
    return bad


@dataclass
class TrainState:
    """Counters every metric and schedule is keyed on; checkpointed with the run."""
    step: int = 0                # optimizer steps done
    tokens: int = 0              # training tokens (images, for an image task) consumed, all processes
    flops: float = 0.0           # analytic forward+backward FLOPs, all processes
    layer_tokens: int = 0        # sum over blocks of tokens each block processed, all processes
    blocks_run: int = 0          # executed blocks summed over micro-batches
    micro_batches: int = 0
    wall: float = 0.0            # seconds of training (eval/checkpoint excluded), counted from one log-step
                                 # read of the device to the next (Trainer._tick)
    # the open train-loss averaging window (steps since the last log line), so that a run resumed
    # between two log steps logs exactly what the uninterrupted run logs
    win_loss: float = 0.0
    win_steps: int = 0
    win_tokens: int = 0
    win_wall: float = 0.0
    win_grad_norm: float = 0.0   # largest pre-clip gradient norm in the window (spikes show here first)
    win_flops: float = 0.0       # FLOPs of the window's steps (for its MFU)
    win_metrics: dict = field(default_factory=dict)  # the task's train metrics summed over the window (e.g. acc)
    # what each resume changed from config.yaml (options a resume may change, e.g. a lower optim.lr), as
    # [{"step": k, "changes": {"optim.lr": [old, new]}}]: steps after k trained with the new values
    resumes: list = field(default_factory=list)
    best_loss: float = math.inf  # the lowest logged training loss (window mean): divergence is judged against it
    best_val: float = math.inf   # the lowest validation loss so far: a divergence is confirmed against it
    flagged_since: int = -1      # first step of the open run of flagged log windows (-1: the last one was not flagged)
    # step of the first of the open run of evaluations over 1 nat above best_val (-1: the last one was not): with
    # train.stop_on_divergence the run is diverged once it stays so for train.divergence_window steps
    doubt_since: int = -1
    # what the divergence guard did (Trainer._rewind), as [{"step": c, "at": s, "skipped": n, "flops": f, "why": ...}]:
    # at step s it went back to the checkpoint of step c (giving up f FLOPs of training) and skipped the n batches
    # that followed it (step t >= c reads the batches of step t + n), so a resume reproduces the skips
    rewinds: list = field(default_factory=list)
    # seconds of one-off work done between steps outside the training clock (Trainer.one_off), by name, e.g.
    # {"sbld_profile": 0.8}: charged in FLOPs like any step's work, timed apart so steady-state tok/s stays clean
    one_off: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, d: dict) -> None:
        for f in fields(self):
            if f.name in d:  # checkpoints from before a field existed keep its default
                setattr(self, f.name, d[f.name])


def param_groups(params, weight_decay: float) -> list[dict]:
    """AdamW groups as in nanoGPT: every >= 2-D tensor (weight matrices, embeddings) is decayed;
    1-D tensors (biases, LayerNorm gains) are not."""
    decay, no_decay = [], []
    for p in params:
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def make_optimizer(params, o, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay), or plain SGD with optional momentum and L2 weight decay (the
    standardization-loss paper's MNIST runs: SGD, lr 1e-3, weight decay 4e-5; Collins et al. 2019, App.).
    fused=True (the trainer's choice on CUDA; the parameters must already be there) updates every
    parameter in one kernel launch instead of a few per tensor group."""
    groups = param_groups(params, o.weight_decay)
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, **(dict(fused=True) if fused else {}))
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), **(dict(fused=True) if fused else {}))


def compile_blocks(model: torch.nn.Module, backend: str = "inductor") -> None:
    """torch.compile each transformer block in place (train.compile=blocks). A whole-model compile sees a
    new Python program whenever a technique's plan skips a new set of blocks: 20 PLD steps compiled 7
    graphs (tests/test_efficiency.py), one more per new pattern until torch's recompile limit (8) makes it
    fall back to eager. One block is always the same function of (x, scale) or
    of a (B, r, C) token subset, so each block needs a few graphs for the whole run: plain, scaled, and
    one with a dynamic length for random-LTD (tests/test_efficiency.py counts them). The parameters keep
    their names, so checkpoints and exports do not change. The head and the loss (ln_f -> lm_head ->
    cross-entropy) are compiled as one more region (accellib.models.transformer.head_loss): run eagerly outside the
    compiled blocks, the loss of 16-bit logits was the largest cost of a GPT-2-small step."""
    from ..models.transformer import portable_inductor
    portable_inductor()
    for block in model.blocks:  # (models without blocks are refused by the config's validation)
        block.compile(backend=backend)
    if hasattr(model, "head_loss_backend"):
        model.head_loss_backend = backend


def compile_model(model: torch.nn.Module, backend: str = "inductor") -> None:
    """torch.compile the whole model in place (train.compile=model): embedding, every block, head and loss in one
    graph for training (and one for evaluation), so Inductor fuses across block boundaries and the host launches
    one compiled program per step. Only for runs whose block plan never changes (the trainer passes no plan, and
    refuses the techniques that write one): a changing plan would be part of the compiled program (see
    compile_blocks). Parameter names stay, so checkpoints and exports do not change."""
    from ..models.transformer import portable_inductor
    portable_inductor()
    model.compile(backend=backend)


def check_compile(mode: str, techniques: list) -> None:
    """train.compile=model compiles one fixed program: refuse, in one line, what changes the step's program each step
    (a technique that writes the block plan), or runs the model's pieces itself (an engine, a run_step of its own)."""
    from ..techniques.base import Technique
    if mode != "model":
        return
    bad = [x.name for x in techniques if x.plan_fields or getattr(x, "splits_model", False)
           or type(x).run_step is not Technique.run_step]
    if bad:
        raise ConfigError(f"train.compile=model compiles one fixed program, and {', '.join(bad)} changes the block plan "
                          "or runs the model's pieces itself; use train.compile=blocks")


class Trainer:
    def __init__(self, cfg: RunConfig, out_dir: Optional[str | Path] = None, *,
                 data=None, model: Optional[torch.nn.Module] = None,
                 accelerator=None, data_offset: int = 0):
        self.cfg = cfg
        self.data_offset = data_offset  # step t reads the batches of step t + offset (V-cycle stages)
        t = cfg.train
        if t.threads:
            torch.set_num_threads(t.threads)
        from ..techniques import build_techniques  # lazy: technique modules may import this module
        # what is trained on (accellib/core/tasks.py): language or images; every process builds it here
        self.task = make_task(cfg, data, every_rank=True)
        self.task.configure()             # the model fields the data decides, before techniques read them
        self.techniques = build_techniques(cfg)
        if fsdp_requested() and accelerator is None:  # before any process group: what cannot run sharded says so
            from ..techniques import check_fsdp
            check_fsdp(self.techniques, cfg.model.kind)
        ddp = {}
        for tech in self.techniques:
            ddp.update(tech.ddp_kwargs())
        # live trackers (log.trackers) write into the run folder; an accelerator passed in brings its own
        track = tracking_kwargs(cfg.log.trackers, out_dir) if out_dir is not None else {}
        self.accelerator = accelerator or make_accelerator(ddp, precision=t.precision, device=t.device, **track)
        # FSDP2 (accellib.core.launch.fsdp_plugin): prepare() shards every Block and the rest (embeddings, final
        # LayerNorm, tied head) over the processes; the loop below is the same, Accelerate's FSDP2 paths do the rest
        self.fsdp = bool(getattr(self.accelerator, "is_fsdp2", False))
        self.data = self.task.data
        torch.manual_seed(t.seed)  # same init on every rank
        model = model if model is not None else self.task.build_model()
        check_compile(t.compile, self.techniques)
        if t.compile == "blocks":
            compile_blocks(model, t.compile_backend)
        elif t.compile == "model":
            compile_model(model, t.compile_backend)
        # an engine splits the model across processes (accellib/parallel/engine.py): it decides which
        # parameters this process steps; the full model stays here as the replica that is evaluated and saved
        self.engine = next((x for x in self.techniques if getattr(x, "splits_model", False)), None)
        if self.engine is not None:
            self.engine.build(model.to(self.accelerator.device), self.accelerator)
        device = self.accelerator.device
        enable_fast_math(device)  # TF32 matmuls on CUDA
        if self.engine is not None:
            params = self.engine.parameters()
        elif self.fsdp:  # left where it was built (host memory): prepare()'s fully_shard moves each unit's shard to
            params = model.parameters()  # the device, so the whole model never has to fit on one GPU
        else:
            params = model.to(device).parameters()
        self.optimizer = make_optimizer(params, cfg.optim, fused=device.type == "cuda")
        if self.engine is None:
            self.model, self.optimizer = self.accelerator.prepare(model, self.optimizer)
            # With mixed precision, prepare() wraps the model's forward so that it returns fp32 outputs: a
            # full fp32 copy of the logits (3.3 GB per GPT-2-small micro-batch) that the loss does not need
            # (accellib/models/losses.py upcasts chunk by chunk). Every forward here already runs inside
            # accelerator.autocast(), so the plain forward computes the same numbers.
            self.accelerator.unwrap_model(self.model, keep_fp32_wrapper=False)
        else:  # no DDP wrapper: gradients are the engine's business; the optimizer is saved per process
            self.model = self.accelerator.prepare_model(model, evaluation_mode=True)
        # data-parallel size and index: every process for a plain run, whole pipelines/rings for an engine
        self.dp = ((self.accelerator.num_processes, self.accelerator.process_index) if self.engine is None
                   else (self.engine.dp_world, self.engine.dp_rank))
        self.state = TrainState()
        # Accelerate's optimizer wrapper adds to torch's only an fp16 GradScaler's step and XLA's gradient sync; without
        # them its per-step package look-ups and signature inspection are host time a plain loop does not pay (issue
        # 42), so the trainer steps the optimizer it wraps (the same object: Accelerate's checkpoints are unchanged)
        inner = getattr(self.optimizer, "optimizer", None)
        if inner is not None and self.accelerator.scaler is None and self.accelerator.distributed_type.value != "XLA":
            self.optimizer = inner
        self.lr_schedule = WarmupCosine(cfg.optim.lr, cfg.optim.warmup_steps, t.steps, cfg.optim.min_lr_ratio)
        self.accelerator.register_for_checkpointing(self.state)
        for tech in self.techniques:
            self.accelerator.register_for_checkpointing(tech)  # has state_dict / load_state_dict
        self.last_lr = self.lr_schedule(self.state)
        self.last_grad_norm = torch.zeros(())  # a device tensor after the first step (read it at log steps only)
        # the open log window's sums, kept on the device until a log step or a checkpoint reads them (_flush):
        # reading a number from a GPU waits for all the work queued before it, so doing it every step would
        # stall the host and leave the GPU idle while Python prepares the next step
        self._window: dict = {}
        self._prefetched = None  # (step, batches) drawn ahead during the previous step
        self._params = None  # the model's parameters, each once, in order (clip_grad_norm_)
        self._clock: Optional[float] = None  # perf_counter() where the training time runs from (_tick; fit only)
        self.prefetch = self.accelerator.device.type == "cuda"  # one batch ahead, while the GPU still computes
        self.precision = "bf16" if self.accelerator.mixed_precision == "bf16" else "fp32"
        self.out = Path(out_dir) if out_dir is not None else None
        self.saved_step: Optional[int] = None  # step of the checkpoint on disk (None: none yet)
        self._eval = None
        self._last_eval: Optional[tuple[int, dict]] = None  # (step, metrics) of the latest evaluation
        self.step_metrics: dict[str, list] = {}  # the task's train metrics of the current step's micro-batches
        # the divergence guard (train.stop_on_divergence; _val_diverged, _rewind): validation over 1 nat above its best
        # for this many steps is a divergence, and a run goes back to its last good checkpoint at most this many times
        self.divergence_window, self.divergence_rewinds = t.divergence_window, t.divergence_rewinds
        self._fitting = False  # inside fit's loop, where a divergence may rewind (_diverged)
        self.good_checkpoint: Optional[Path] = None  # the folder of the checkpoint saved or loaded last (_rewind's)
        for tech in self.techniques:
            tech.setup(self)

    # ------------------------------------------------------------------ helpers
    @property
    def raw_model(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def distributed(self) -> dict:
        """How this run is split over processes, for the console and record.json (core/launch.py distributed_setup)."""
        return distributed_setup(self.accelerator, self.engine)

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of optimizer step `step`. Micro-batch m of rank r is global
        micro-batch m * world + r, drawn from (seed, step, that index): so 2 processes x 1
        micro-batch see exactly the data of 1 process x 2 micro-batches."""
        out, (world, rank), dev = [], self.dp, self.accelerator.device
        step += self.data_offset + sum(r["skipped"] for r in self.state.rewinds)  # batches skipped by a rewind
        for m in range(self.cfg.train.grad_accum):
            x, y = self.task.batch(step, m * world + rank, self.cfg.train.grad_accum * world)
            if dev.type == "cuda":  # page-locked host memory: the copy runs asynchronously, beside compute
                x, y = x.pin_memory(), y.pin_memory()
            out.append((x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)))
        return out

    def _step_batches(self, step: int) -> list:
        """Step `step`'s batches: the ones prefetched during the previous step when they are for this
        step, else drawn now. Batches depend on (seed, step, index) only, so prefetching never changes them."""
        ready, self._prefetched = self._prefetched, None
        return ready[1] if ready is not None and ready[0] == step else self.batches(step)

    def plan(self, step: int, micro_step: int) -> Plan:
        """The plan of one micro-batch: the full model, then each technique fills its part.
        Techniques draw from (seed, step, micro_step), so a resumed run draws what the uninterrupted run
        would have; the gates of PLD/SBLD are the same on every rank, random-LTD's token subsets are drawn
        per rank unless random_ltd.draws=shared."""
        p = Plan.full(self.task.n_blocks)
        for tech in self.techniques:
            tech.update_plan(p, step, micro_step)
        return p

    def forward_loss(self, x, y, plan: Optional[Plan]):
        """(task loss, loss to differentiate = task loss + the techniques' extra losses); the task's
        train metrics of this micro-batch are added to the step's (self.step_metrics)."""
        with self.accelerator.autocast():
            out, loss, metrics = self.task.forward(self.model, x, y, plan)
            total = loss
            for tech in self.techniques:
                extra = tech.extra_loss(self.model, x, y, out)
                if extra is not None:
                    total = total + extra
        for k, v in metrics.items():
            self.step_metrics.setdefault(k, []).append(v.detach())
        return loss, total

    # ------------------------------------------------------------------ one step
    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns its training loss (mean over micro-batches and processes) as a
        0-d tensor on the device. Nothing here reads a number back to the host: the loss, the gradient
        norm and the task's metrics are summed on the device (see _flush for when they are read)."""
        cfg, st, acc = self.cfg, self.state, self.accelerator
        if not self.model.training:  # after an evaluation (a walk over every module: not every step)
            self.model.train()
        self.step_metrics = {}
        batches = self._step_batches(st.step)
        plans = [self.plan(st.step, m) for m in range(len(batches))]
        losses = None
        if self.engine is not None:  # the model is split across processes: the engine runs the step
            with acc.autocast():
                losses = self.engine.forward_backward(batches)  # the same numbers on every process
        else:
            for tech in self.techniques:
                losses = tech.run_step(self, batches, plans)
                if losses is not None:
                    break
        if losses is None:  # standard gradient accumulation
            losses = []
            whole = cfg.train.compile == "model"  # its plan is always the full model: none passed (no guard on it)
            for m, ((x, y), plan) in enumerate(zip(batches, plans)):
                last = m == len(batches) - 1
                with nullcontext() if last else acc.no_sync(self.model):
                    loss, total = self.forward_loss(x, y, None if whole else plan)
                    acc.backward(total / len(batches) if len(batches) > 1 else total)  # (x / 1 is x: skipped)
                losses.append(loss.detach())
        # every op below is skipped where it would be an identity (one micro-batch, one process): the same numbers
        loss = _mean([torch.as_tensor(v, dtype=torch.float32, device=acc.device) for v in losses])
        reduce = self.engine is None and acc.num_processes > 1
        if reduce:
            loss = acc.reduce(loss, "mean")  # the same number on every rank (a collective, not a host read)
        metrics = {}
        for k, v in self.step_metrics.items():  # e.g. accuracy: the mean over micro-batches and processes
            v = _mean([t.float() for t in v])
            metrics[k] = acc.reduce(v, "mean") if reduce else v
        # the pre-clip global gradient norm; max_norm=inf leaves the gradients untouched (no clipping is bitwise none)
        max_norm = cfg.optim.grad_clip or float("inf")
        norm = self.clip_grad_norm_(max_norm) if self.engine is None else self.engine.clip_grad_norm_(max_norm)
        if self.fsdp:  # FSDP2's norm is a DTensor over the shards' norms: the full value (a collective, no host read)
            norm = norm.full_tensor()
        self.last_grad_norm = torch.as_tensor(norm, dtype=torch.float32, device=acc.device).detach()
        self._accumulate(loss.detach(), self.last_grad_norm, metrics)
        lr = self.lr_schedule(st)
        for tech in self.techniques:
            lr *= tech.lr_factor(st)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # skipped blocks keep grad None: no AdamW update
        # counters (all processes: this rank's work x world size; plans are identical across ranks)
        world, task = self.dp[0], self.task
        step_flops = world * sum(task.micro_flops(p) for p in plans)
        st.step += 1
        st.tokens += world * task.micro_tokens() * len(batches)
        st.flops += step_flops
        st.win_flops += step_flops
        st.layer_tokens += world * sum(task.micro_layer_tokens(p) for p in plans)
        st.blocks_run += sum(p.executed() for p in plans)
        st.micro_batches += len(plans)
        self.last_lr = lr
        for tech in self.techniques:  # one-off work here (SBLD's profile) runs through self.one_off, timed apart
            tech.step_end(self)
            # ... and charged in the run's FLOPs, not in the log window's (whose MFU is over training time only)
            st.flops += world * tech.extra_flops(st.step, task)
        if self.prefetch:  # the host draws the next batches while the device works through this step
            self._prefetched = (st.step, self.batches(st.step))
        return loss

    def _tick(self) -> None:
        """Add the time since the last mark to the run's and the window's wall, and mark now. Called right
        after a host read of the window (_flush), which waits for every step queued on the device: timing
        each step on the host would stop before the device has done its work, and overstate tok/s and MFU
        by up to a queue's depth of steps per window. So the time runs from one log step's read to the
        next (as torchtitan's metrics do); evaluation and checkpoints restart it (self._clock), uncounted."""
        now, st = time.perf_counter(), self.state
        if self._clock is not None:
            st.wall += now - self._clock
            st.win_wall += now - self._clock
        self._clock = now

    def one_off(self, name: str, fn):
        """Run fn() once between two training steps, outside the training clock, and return its result: one-off
        work such as SBLD's sensitivity profile (accellib/techniques/sensitivity_layer_drop.py), whose cost belongs
        to the run but not to its steady-state tokens/s. The device is waited for before and after (so the steps
        queued before it are training time and its own kernels are not); its seconds add up in
        state.one_off[name] (record.json's "one_off_s"). Outside fit() (train_step called directly) it just runs fn."""
        timed = self._clock is not None
        if timed:
            _wait_for(self.accelerator.device)
            self._tick()  # the training time up to here
        t0 = time.perf_counter()
        out = fn()
        _wait_for(self.accelerator.device)
        self.state.one_off[name] = self.state.one_off.get(name, 0.0) + time.perf_counter() - t0
        if timed:
            self._clock = time.perf_counter()
        return out

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The standard step's clip: the global norm computed as every engine computes it
        (accellib/parallel/engine.py global_grad_norm: per-parameter float64 sums of squares in the
        model's parameter order, one sqrt), so an engine that computes the same gradients (Ouroboros
        with one module, a pipeline, ZeRO's shards) clips to the same bits. DDP's gradients are already
        the same on every process: no collective. Distributed types that own the gradients themselves
        (FSDP, DeepSpeed, XLA) keep Accelerate's clip_grad_norm_."""
        from accelerate.utils import DistributedType

        from ..parallel.engine import clip_grads, global_grad_norm, unique_params
        acc = self.accelerator
        if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.XLA):
            return acc.clip_grad_norm_(self.model.parameters(), max_norm)
        if acc.scaler is not None:
            acc.unscale_gradients()   # an fp16 GradScaler's scale out first, as Accelerate does
        if self._params is None:  # the model's parameters never change during a run: listed once
            self._params = unique_params([self.model])
        params = self._params
        total = global_grad_norm(list(enumerate(p.grad for p in params)), len(params), acc.device)
        clip_grads(params, total, max_norm)
        return total

    def _accumulate(self, loss: torch.Tensor, grad_norm: torch.Tensor, metrics: dict) -> None:
        """Add one step to the device-side window: loss and metric sums in float64 (a sum of float32
        values of similar size is then exact, so a window split by a checkpoint and a resume sums to the
        same number as an unsplit one), the largest gradient norm."""
        w = self._window
        w["loss"] = w.get("loss", 0) + loss.double()
        w["grad_norm"] = torch.maximum(w["grad_norm"], grad_norm) if "grad_norm" in w else grad_norm
        for k, v in metrics.items():
            w[f"m_{k}"] = w.get(f"m_{k}", 0) + v.double()
        w["steps"] = w.get("steps", 0) + 1

    def _flush(self) -> None:
        """Move the device-side window into the TrainState (one host read for every number), at log steps
        and before every checkpoint. A non-finite training loss stops the run here, so a diverged model is
        never logged as a number nor checkpointed."""
        w, st = self._window, self.state
        if not w:
            return
        self._window = {}
        keys = [k for k in w if k != "steps"]
        values = torch.stack([w[k].double().reshape(()) for k in keys]).tolist()
        got = dict(zip(keys, values))
        first, last = st.step - w["steps"] + 1, st.step
        st.win_steps += w["steps"]
        if not math.isfinite(got["loss"]):
            self._diverged(f"training loss is {got['loss']} in steps {first}-{last}" if first < last
                           else f"training loss is {got['loss']} at step {last}")
        st.win_loss += got.pop("loss")
        st.win_grad_norm = max(st.win_grad_norm, got.pop("grad_norm"))
        for k, v in got.items():
            st.win_metrics[k[2:]] = st.win_metrics.get(k[2:], 0.0) + v

    # ------------------------------------------------------------------ evaluation
    def _eval_loader(self):
        if self._eval is None:
            ds = torch.utils.data.TensorDataset(*self.task.eval_data())
            dl = torch.utils.data.DataLoader(ds, batch_size=self.cfg.train.batch_size, shuffle=False)
            self._eval = self.accelerator.prepare_data_loader(dl)
        return self._eval

    def _diverged(self, what: str) -> None:
        """A confirmed divergence (non-finite numbers, or with train.stop_on_divergence validation that stayed high, see
        _val_diverged). With train.stop_on_divergence, while the run has a checkpoint and rewinds left, it goes on from
        that checkpoint (_rewind); otherwise it stops, saying truly what is on disk and the command that goes on."""
        st, o, t = self.state, self.cfg.optim, self.cfg.train
        if (t.stop_on_divergence and self._fitting and self.saved_step is not None
                and len(st.rewinds) < self.divergence_rewinds):
            raise _Rewind(what)
        lr = f"{self.calmer_lr():.3g}"
        if self.saved_step is None:
            how = (f"no checkpoint had been written; start again with a lower optim.lr (now {o.lr}): "
                   + command("--config", self.out / "config.yaml", "--out", self.out, "--overwrite", f"--optim.lr={lr}")
                   if self.out is not None else f"no checkpoint had been written; lower optim.lr (now {o.lr}) to {lr}")
        else:
            when = ("saved before the loss was first flagged, and checked on validation" if t.stop_on_divergence else
                    f"saved after the loss was first flagged at step {st.flagged_since}, so it may be diverged too"
                    if 0 <= st.flagged_since <= self.saved_step else "saved before the loss was flagged")
            tried = (f"{len(st.rewinds)} rewind(s) to a checkpoint, skipping {sum(r['skipped'] for r in st.rewinds)} "
                     "batches in all, did not keep it from diverging; " if st.rewinds else "")
            how = (f"{tried}the last good checkpoint (step {self.saved_step}) is kept in "
                   f"{self.good_checkpoint or self.checkpoint_dir() / 'last'} ({when}); continue from it with a lower optim.lr (now {o.lr}): "
                   + command("--resume", self.out, f"--optim.lr={lr}"))
        raise TrainingError(f"{what}; {how} (or raise optim.warmup_steps, now {o.warmup_steps}, or clip with "
                            f"optim.grad_clip, now {o.grad_clip})")

    def _rewind(self, why: str) -> None:
        """Go on from a confirmed divergence as large runs do: back to the last good checkpoint (under
        train.stop_on_divergence one is written only while nothing is flagged or in doubt, after its validation check),
        skipping the batches that followed it, up to the step where the divergence was confirmed. PaLM (Chowdhery et
        al. 2022, section 5.1) restarted from a checkpoint about 100 steps before each loss spike and skipped about
        200-500 batches, and the spike did not come back; OPT (Zhang et al. 2022, section 2.5) restarted from an
        earlier checkpoint with a lower LR, which is what the stop after the last rewind (divergence_rewinds) advises.
        The batches of step t are a pure function of (seed, t + data offset): skipping n of them adds n to the offset
        of every later step (batches()). The rewind is kept in the state (checkpoints, record.json) so a resume reads
        the same batches; metrics.jsonl drops the lines after the checkpoint, as a resume does."""
        st = self.state
        at, flops, wall, resumes, rewinds = st.step, st.flops, st.wall, st.resumes, st.rewinds
        self._load_from(self.good_checkpoint, self.out)
        # the counters are the checkpoint's, but for the training time, which stays the time spent; the FLOPs given up
        # are in the rewind's entry; a resume's changes still hold
        st.wall, st.resumes = wall, resumes
        st.rewinds = rewinds + [dict(step=st.step, at=at, skipped=at - st.step, flops=flops - st.flops, why=why)]
        self._window, self._prefetched, self._last_eval = {}, None, None
        if self.is_main:
            _truncate_metrics(self.out / "metrics.jsonl", st.step)
            tqdm.write(f"warning: step {at}: {why}; going back to the checkpoint of step {st.step} and skipping the "
                       f"{at - st.step} batches that followed it (rewind {len(st.rewinds)} of "
                       f"{self.divergence_rewinds}, train.stop_on_divergence)")
        self.accelerator.wait_for_everyone()
        self._clock = time.perf_counter()

    def calmer_lr(self) -> float:
        """The peak LR a diverged run is advised to go on with. From its last good checkpoint: the LR it had trained at
        when that checkpoint was saved (it was still fine there), at most a quarter of its peak (the schedule would
        otherwise climb back to where it diverged). Without one: a tenth of the LR of its last step (it diverged
        at or below that LR, and nothing says how far below)."""
        from .schedules import WarmupCosine
        o = self.cfg.optim
        lr = WarmupCosine(o.lr, o.warmup_steps, self.cfg.train.steps, o.min_lr_ratio).at
        if self.saved_step is not None:
            return min(lr(max(0, self.saved_step - 1)), o.lr / 4)
        return lr(max(0, self.state.step - 1)) / 10

    def _divergence(self, loss: float) -> str | None:
        """A warning when the window's training loss is over 1 nat above the lower of the best logged so far
        and the uniform prediction's (where a random model starts); numbers already read at this log step."""
        st, o = self.state, self.cfg.optim
        ref = min(st.best_loss, self.task.uniform_loss())
        st.best_loss = min(st.best_loss, loss)
        if loss <= ref + 1.0:
            return None
        return (f"training loss {loss:.3f} is {loss - ref:.2f} nats above {ref:.3f} (the lower of its best so far "
                f"and the uniform prediction's): the run may be diverging; lower optim.lr (now {o.lr}), raise "
                f"optim.warmup_steps (now {o.warmup_steps}) or clip with optim.grad_clip (now {o.grad_clip})")

    def _val_diverged(self, val_loss: float, last: bool = False) -> str | None:
        """Validation's word on a divergence, on evidence that persists. An evaluation over 1 nat above the lower of the
        best validation loss so far and the uniform prediction's opens a doubt (with train.stop_on_divergence every log
        step then evaluates, and no checkpoint is written); the run has diverged when every evaluation stays that high
        for divergence_window steps, or the run ends (`last`) in doubt. One back under the line closes the doubt: a
        spike the run comes back from is not a divergence. Returns the reason once diverged, else None."""
        st = self.state
        ref = min(st.best_val, self.task.uniform_loss())
        if val_loss <= ref + 1.0:
            st.best_val, st.doubt_since = min(st.best_val, val_loss), -1
            return None
        if st.doubt_since < 0:
            st.doubt_since = st.step
        if st.step - st.doubt_since < self.divergence_window and not last:
            return None
        since = (f"as at every evaluation since step {st.doubt_since}" if st.doubt_since < st.step
                 else "at the run's last step")
        return (f"the run diverged: validation loss {val_loss:.3f} at step {st.step} is {val_loss - ref:.2f} nats "
                f"above {ref:.3f} (the lower of its best so far and the uniform prediction's), {since}")

    def weights_finite(self) -> bool:
        # FSDP2's parameters are DTensors: each process checks its own shards, the reduce below covers them all
        flags = torch.stack([_local(p).detach().isfinite().all() for p in self.model.parameters()])
        ok = flags.all().float()
        return bool(self.accelerator.reduce(ok.to(self.accelerator.device), "mean").item() == 1.0)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Full model (no plan), the task's metrics over its fixed validation set, all ranks' parts."""
        if self.engine is not None:
            self.engine.sync_replica()
        self.model.eval()
        parts: dict[str, list] = {}
        for x, y in self._eval_loader():
            with self.accelerator.autocast():
                for k, v in self.task.eval_sums(self.model, x, y).items():
                    parts.setdefault(k, []).append(v)
        totals = {k: self.accelerator.gather_for_metrics(torch.cat(v)).sum().item() for k, v in parts.items()}
        self.model.train()
        out = self.task.eval_metrics(totals)
        if not math.isfinite(out["val_loss"]):
            self._diverged(f"validation loss is {out['val_loss']} after step {self.state.step}")
        self._last_eval = (self.state.step, out)
        return out

    def _evaluated(self) -> dict:
        """This step's evaluation: the one already made at this step, or a new one."""
        if self._last_eval is not None and self._last_eval[0] == self.state.step:
            return self._last_eval[1]
        return self.evaluate()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def save(self, final: bool = False) -> bool:
        """Write the full state to checkpoints/last atomically: save to a temp folder, then swap,
        so a crash mid-save never destroys the previous checkpoint. With train.stop_on_divergence, a checkpoint
        is written only while no log window is flagged and its validation loss is not in doubt (so the one kept
        is always from before the first flagged step: a rewind's target); returns whether it was written. `final`:
        the run's end, whose state is saved whatever (its last evaluation already passed the check)."""
        acc, ck = self.accelerator, self.checkpoint_dir()
        self._flush()  # the open window's sums go into the checkpoint; a NaN loss stops the run here
        self._tick()   # and its time so far (the save itself is not counted: fit restarts the clock)
        st = self.state
        if self.cfg.train.stop_on_divergence and not final:
            if st.flagged_since < 0 and st.doubt_since < 0:
                self._val_diverged(self._evaluated()["val_loss"])  # may open a doubt (see _val_diverged)
            if st.flagged_since >= 0 or st.doubt_since >= 0:
                return False  # the last good checkpoint stays until the flag and the doubt clear (or the run rewinds)
        if self.engine is not None:
            self.engine.sync_replica()
        if not self.weights_finite():  # never replace a good checkpoint by a diverged model
            self._diverged(f"the weights are not finite after step {self.state.step}")
        tmp, last, old = ck / ".tmp", ck / "last", ck / ".old"
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp), safe_serialization=False)  # torch.save keeps the tied head tied
        if self.engine is not None:  # per process: its optimizer state and the engine's in-flight work
            tmp.mkdir(parents=True, exist_ok=True)
            torch.save(dict(world=acc.num_processes, optimizer=self.optimizer.state_dict(),
                            engine=self.engine.rank_state()), tmp / f"engine_rank{acc.process_index}.pt")
        acc.wait_for_everyone()
        if self.is_main:
            keep = self.cfg.train.keep_checkpoints
            note_checkpoint(self.out, tmp, fresh=True)  # recorded whole, before its renames: what --overwrite and pruning delete
            if last.exists():
                # "last" only ever appears by an atomic rename of a finished temp folder, so when it
                # exists it is whole; an ".old" beside it is a leftover of a kill after an earlier swap
                remove_checkpoint(self.out, old)
                if os.path.lexists(old):  # not (all) accellib's: never deleted (a leftover of a run from before records)
                    raise TrainingError(f"{old} holds files accellib did not record writing; move it out of "
                                        f"{ck} and resume: " + command("--resume", self.out))
                prev = self.saved_step if self.saved_step is not None else checkpoint_state(last).get("step")
                last.rename(ck / f"step_{prev}" if keep > 1 and prev is not None and prev < self.state.step else old)
            tmp.rename(last)
            remove_checkpoint(self.out, old)
            # train.keep_checkpoints: the newest keep-1 older ones stay (and none from beyond this step: a resume
            # from an earlier one has replaced them); only what accellib recorded writing is deleted (run_dir)
            older = recorded_checkpoints(self.out)
            for k, p in older[:max(0, len(older) - (keep - 1))] + [(k, p) for k, p in older if k >= self.state.step]:
                remove_checkpoint(self.out, p)
        acc.wait_for_everyone()
        self.saved_step, self.good_checkpoint = self.state.step, last
        return True

    def load(self, run_dir: Path) -> None:
        src = checkpoint_folder(run_dir)
        if src is None:
            raise TrainingError(f"{run_dir} has no checkpoint (the run stopped before its first one); start it "
                                "again with: "
                                + command("--config", run_dir / "config.yaml", "--out", run_dir, "--overwrite"))
        self._load_from(src, run_dir)

    def _load_from(self, src: Path, run_dir: Path) -> None:
        """Load the checkpoint folder `src` of the run in `run_dir`: a damaged file is named in one line (Accelerate
        itself would skip an unreadable random_states_<rank>.pkl without a word), with the intact checkpoints kept."""
        self._check_layout(src)
        what = damaged_files(src, self.accelerator.process_index)
        if not what:
            try:
                self.accelerator.load_state(str(src))
            except ConfigError:  # a technique refusing the stored state (its own one-line reason): not a damaged file
                raise
            except Exception as e:  # garbage or missing files: torch/pickle raise many types
                from .checkpoint_shapes import checkpoint_mismatch
                if why := checkpoint_mismatch(src, self.raw_model, self.cfg.model):  # another config's checkpoint
                    raise TrainingError(f"the checkpoint {src} does not fit {run_dir / 'config.yaml'}: {why}; resume "
                                        "with the config.yaml it was trained with (put it back)") from None
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                what = [f"{type(e).__name__}: {msg[:160]}"]
        if what:
            raise TrainingError(f"the checkpoint {src} cannot be read ({'; '.join(what)}); "
                                f"{unreadable_advice(run_dir, src)}")
        if self.engine is not None:
            self._load_engine(src)
        self.saved_step, self.good_checkpoint = self.state.step, src  # (after a fallback: a kept one, not last)
        # the optimizer's state dict carries its hyper-parameters: the config (with a resume's
        # overrides, e.g. a lower weight decay after a divergence) wins over the stored values
        o = self.cfg.optim
        for g, wd in zip(self.optimizer.param_groups, (o.weight_decay, 0.0)):  # groups of param_groups()
            g.update(weight_decay=wd, **(dict(betas=(o.beta1, o.beta2)) if o.name == "adamw" else dict(momentum=o.momentum)))

    def _check_layout(self, src: Path) -> None:
        """A checkpoint resumes under the kind of launch that wrote it: data-parallel, or FSDP with the same
        state-dict type (Accelerate reads each from different files); otherwise one line says which launch."""
        found = checkpoint_layout(src)
        if found is None or self.engine is not None:
            return  # no model file: load_state's own error says the folder is damaged; engines write their own
        if self.fsdp:
            now = f"FSDP {self.accelerator.state.fsdp_plugin.state_dict_type.name}"
        else:
            now = "data-parallel"
        if found[0] != now:
            how = ("accelerate launch --multi_gpu (or torchrun)" if found[0] == "data-parallel" else
                   f"accelerate launch with an FSDP config whose fsdp_state_dict_type is {found[0].split()[-1]} "
                   "(configs/accelerate/fsdp_*.yaml)")
            raise TrainingError(f"the checkpoint {src} was written under {found[0]} and this resume runs under {now}; "
                                f"resume it with {how}")

    def _load_engine(self, src: Path) -> None:
        acc, f = self.accelerator, src / f"engine_rank{self.accelerator.process_index}.pt"
        try:
            # (map to the device type: torch cannot restore a storage to "cpu:0", Accelerate's multi-CPU device)
            where = "cpu" if acc.device.type == "cpu" else acc.device
            d = torch.load(f, map_location=where, weights_only=False) if f.is_file() else None
        except Exception as e:
            raise TrainingError(f"the checkpoint file {f} cannot be read ({type(e).__name__}); "
                                f"{unreadable_advice(self.out, src)}") from None
        n = len(list(src.glob("engine_rank*.pt")))
        if d is None or d["world"] != acc.num_processes:
            raise TrainingError(f"{src} was written by {d['world'] if d else n} process(es) of "
                                f"{self.engine.name}, and this resume runs {acc.num_processes}; resume it "
                                f"with torchrun --nproc_per_node {d['world'] if d else n}")
        self.optimizer.load_state_dict(d["optimizer"])
        self.engine.load_rank_state(d["engine"])

    # ------------------------------------------------------------------ the loop
    def _log(self, rec: dict) -> None:
        if self.is_main and self.out is not None:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec, allow_nan=False) + "\n")  # strict JSON: a NaN fails here
        if self.accelerator.trackers:  # the same numbers, live (trackers only exist on the main process)
            self.accelerator.log({k: v for k, v in rec.items() if k != "step" and _is_number(v)}, step=rec["step"])

    def _note_resume(self) -> None:
        """Keep in the state (so in the checkpoints and record.json) what this resume changed from config.yaml, and in
        the run's marker the options it set, which the next plain --resume keeps (accellib/train.py resume_config)."""
        stored = self.out / "config.yaml"
        if not stored.is_file():
            return
        old, now = load_config(stored).to_dict(), changed_options(stored, self.cfg)
        changes = {k: [old[k.split(".")[0]][k.split(".", 1)[1]], v] for k, v in now.items()}
        if changes != (self.state.resumes[-1]["changes"] if self.state.resumes else {}):
            self.state.resumes.append(dict(step=self.state.step, changes=changes))
        if self.is_main:
            write_marker(self.out, "run", resume=now)

    def _start_trackers(self, resume: bool) -> None:
        """Start log.trackers for this fit (Accelerate does it on the main process only), with the run's
        config as hyper-parameters. On resume TensorBoard hides what was logged after the checkpoint
        (purge_step), as metrics.jsonl drops those lines."""
        if self.out is None or not self.accelerator.log_with:
            return
        project = self.cfg.log.project or self.out.resolve().name
        flat = {f"{s}.{k}": v for s, d in self.cfg.to_dict().items()
                if s not in self.cfg.techniques or s in self.cfg.enabled()   # not the disabled techniques
                for k, v in d.items() if _is_number(v) or isinstance(v, (str, bool))}
        self.accelerator.init_trackers(project, config=flat, init_kwargs=dict(
            tensorboard=dict(purge_step=self.state.step + 1) if resume else {}))

    def _end_trackers(self) -> None:
        """Close the trackers (TensorBoard flushes its event file). Not accelerator.end_training(): it also
        destroys the process group, which the run still needs after fit (the record, the V-cycle's next stage)."""
        for tracker in self.accelerator.trackers:
            tracker.finish()
        self.accelerator.trackers.clear()

    def _efficiency(self, flops: float, wall: float) -> dict:
        """MFU of a window (its model FLOPs per second over the peak of every device the run uses; see
        accellib/core/hardware.py) and this process's peak memory so far, in GB."""
        acc, out = self.accelerator, dict(peak_mem_gb=round(peak_memory_gb(self.accelerator.device), 3))
        peak = peak_flops(acc.device, self.precision, self.cfg.train.peak_flops)
        if peak and wall > 0:
            out["mfu"] = round(flops / wall / (peak * acc.num_processes), 5)
        return out

    def _train_record(self, loss: float, window_tokens: int, window_wall: float, grad_norm: float = 0.0) -> dict:
        st = self.state
        rec = dict(step=st.step, train_loss=round(loss, 5), grad_norm=round(grad_norm, 5), lr=self.last_lr, tokens=st.tokens,
                   flops=st.flops, layer_tokens=st.layer_tokens, wall=round(st.wall, 4),
                   tok_per_s=round(window_tokens / max(window_wall, 1e-9), 1),
                   blocks_per_micro_batch=round(st.blocks_run / max(1, st.micro_batches), 4))
        for tech in self.techniques:
            rec.update(tech.metrics(st))
        return rec

    def finished(self) -> bool:
        """train.steps done, train.flops_budget spent, or a technique's stop (e.g. a LayerToken budget)."""
        st, t = self.state, self.cfg.train
        return (st.step >= t.steps or (t.flops_budget > 0 and st.flops >= t.flops_budget)
                or any(x.should_stop(st) for x in self.techniques))

    def fit(self, resume: bool = False) -> dict:
        """Train to cfg.train.steps (or a technique's stop), evaluating and checkpointing;
        returns the final record. With resume=True, continue the run in self.out."""
        try:
            return self._fit(resume)
        finally:  # also when training fails: what was logged reaches the trackers' files
            self._end_trackers()

    def _fit_step(self, bar) -> dict | None:
        """One step of fit's loop: train, then at log steps log (and evaluate), at checkpoint steps save; returns the
        log record of a log step, else None."""
        st, t, rec_out = self.state, self.cfg.train, None
        tok0 = st.tokens
        self.train_step()
        st.win_tokens += st.tokens - tok0
        bar.update(1)
        done = self.finished()
        do_eval = done or (t.eval_every and st.step % t.eval_every == 0)
        if st.step % t.log_every == 0 or do_eval:
            self._flush()
            self._tick()  # after the read: the window's time includes the device's queued work
            rec = self._train_record(st.win_loss / st.win_steps, st.win_tokens, st.win_wall, st.win_grad_norm)
            rec.update({f"train_{k}": round(v / st.win_steps, 5) for k, v in st.win_metrics.items()})
            rec.update(self._efficiency(st.win_flops, st.win_wall))
            warning = self._divergence(st.win_loss / st.win_steps)
            if warning:
                rec["warning"] = warning
                if st.flagged_since < 0:
                    st.flagged_since = st.step - st.win_steps + 1  # the window's first step
            else:
                st.flagged_since = -1
            st.win_loss, st.win_steps, st.win_tokens, st.win_wall, st.win_grad_norm = 0.0, 0, 0, 0.0, 0.0
            st.win_metrics, st.win_flops = {}, 0.0
            # a flagged window is one batch's spike or a divergence: with stop_on_divergence, validation decides, at
            # every log step while it is in doubt (_val_diverged)
            diverged = None
            if do_eval or (t.stop_on_divergence and (warning or st.doubt_since >= 0)):
                ev = self.evaluate()
                rec.update({k: round(v, 5) for k, v in ev.items()})
                bar.set_postfix(val=f"{rec['val_loss']:.3f}")
                diverged = self._val_diverged(ev["val_loss"], last=done)
            self._log(rec)
            if not t.progress:  # without a bar the console must still show the run is alive
                self.accelerator.print(log_line(rec, t.steps), flush=True)
            if warning and self.is_main:
                tqdm.write(f"warning: step {st.step}: {warning}")
            if diverged and t.stop_on_divergence:
                self._diverged(f"{diverged} (train.stop_on_divergence)")
            rec_out = rec
        save = self.out is not None and (done or (t.checkpoint_every and st.step % t.checkpoint_every == 0))
        if save:
            self.save(final=done)
        if save or do_eval or st.step % t.log_every == 0:
            self._clock = time.perf_counter()  # logging, evaluation and saving are not training time
        return rec_out

    def _fit(self, resume: bool) -> dict:
        cfg, st, t = self.cfg, self.state, self.cfg.train
        if self.out is not None and self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        if self.out is not None:  # several machines: every process must see this folder (a shared filesystem)
            check_shared_run_dir(self.accelerator, self.out)
        if resume:
            self.load(self.out)
            if st.step > t.steps:  # nothing to train, and the records would say t.steps of a longer run
                raise ConfigError(f"the run in {self.out} has reached step {st.step}; --train.steps={t.steps} would "
                                  f"train nothing: give at least {st.step} steps, or drop it")
            self._note_resume()
            if self.is_main:  # drop log lines written after the checkpoint
                _truncate_metrics(self.out / "metrics.jsonl", st.step)
            self.accelerator.print(f"resumed from step {st.step}", flush=True)
        elif self.out is not None and self.is_main:
            write_marker(self.out, "run")  # the folder is accellib's run (run_dir.holds_run)
            (self.out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            (self.out / "metrics.jsonl").write_text("")
        self.accelerator.wait_for_everyone()
        self._start_trackers(resume)
        dist = self.distributed()
        self.accelerator.print(f"accellib: {dist['world_size']} process(es), {dist['type']}, on "
                               f"{self.accelerator.device}, techniques: {[x.name for x in self.techniques] or 'none'}")
        bar = tqdm(total=t.steps, initial=st.step, disable=not (t.progress and self.is_main),
                   desc="train", dynamic_ncols=True)
        final = {}
        self._clock = time.perf_counter()
        self._fitting = True
        try:
            while not self.finished():
                try:
                    final = self._fit_step(bar) or final
                except _Rewind as r:  # a confirmed divergence that can go back to the last good checkpoint
                    self._rewind(str(r))
                    bar.n = st.step
                    bar.refresh()
        finally:
            self._fitting = False
        bar.close()
        if not final or final.get("step") != st.step or "val_loss" not in final:  # nothing was trained
            final = dict(self._train_record(0.0, 0, 1.0), train_loss=None, **self.evaluate())
        return final


def _mean(values: list[torch.Tensor]) -> torch.Tensor:
    """The mean of 0-d tensors; one value is returned as it is (its mean, with no op dispatched)."""
    return values[0] if len(values) == 1 else torch.stack(values).mean()


def _wait_for(device: torch.device) -> None:
    """Wait until the device has done every queued kernel (a no-op on a CPU, whose ops run as called)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor: the local shard of an FSDP2 DTensor, any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def log_line(rec: dict, total: int) -> str:
    """One console line per logged step, e.g.
    `step 100/3000  train 2.3456  val 2.4012  lr 3.0e-04  gnorm 0.412  81,920 tok/s  mfu 41.2%  mem 23.10GB  95s`."""
    parts = [f"step {rec['step']}/{total}", f"train {rec['train_loss']:.4f}"]
    if "val_loss" in rec:
        parts.append(f"val {rec['val_loss']:.4f}")
    if "val_acc" in rec:
        parts.append(f"acc {rec['val_acc']:.4f}")
    parts += [f"lr {rec['lr']:.2e}", f"gnorm {rec['grad_norm']:.3f}", f"{rec['tok_per_s']:,.0f} tok/s"]
    if "mfu" in rec:
        parts.append(f"mfu {rec['mfu']:.1%}")
    if "peak_mem_gb" in rec:
        parts.append(f"mem {rec['peak_mem_gb']:.2f}GB")
    parts.append(f"{rec['wall']:.0f}s")
    return "  ".join(parts)


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the log lines of steps <= `step` (a resume or a rewind), replacing the file in one rename so a kill
    cannot leave it empty; a torn last line (a kill while it was written) is dropped."""
    if not path.exists():
        return
    keep = []
    for ln in path.read_text().splitlines():
        try:
            if ln and json.loads(ln)["step"] <= step:
                keep.append(ln)
        except (ValueError, KeyError, TypeError):
            continue  # not a whole record: the line a kill cut short
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(ln + "\n" for ln in keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
