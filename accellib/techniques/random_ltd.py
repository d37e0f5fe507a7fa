"""Random-LTD: random and layerwise token dropping, with the LayerToken learning-rate schedule.

Yao, Wu, Li, Holmes, Zhang, Li & He, "Random-LTD: Random and Layerwise Token Dropping Brings
Efficient Training for Large-scale Transformers", arXiv 2211.11586 (2022).
  §3.1  every *middle* block (all but the first and the last) sees only a random subset of r of
        the S tokens of each sample, drawn independently per block and per sample; the other
        tokens skip the block unchanged (no rescaling). The first and last blocks see all tokens,
        so the loss is computed on every position.
  §3.2  MSLG (monotonic sequence length growth): r grows linearly from r_min to S.
  §3.3 / App. C  LayerTokens (tokens each block processed, summed over blocks) drive the LR
        warm-up, the decay, and the stopping budget, so runs compare at equal compute.

Four parts, as every accellib technique:
  RandomLTDConfig    the `random_ltd:` config section
  ReservedLength     r(t), the MSLG schedule (multiple of q, never below r_min, never 0)
  LayerTokenLR       warm-up + cosine keyed by consumed LayerTokens
  keep_indices()     the mechanism: sorted random subsets, written into plan.blocks[i].keep;
                     the model's `run_block` gathers them, runs the block, scatters back.

The layer hook (`RandomLTD.layer_fn`, §3.1's layer). None (the default): every dropping block runs
`run_block`'s gather -> block -> scatter. A function (x, keep, block) -> y, x (B, S, C), keep (B, r),
block (B, r, C) -> (B, r, C), replaces those three lines in every dropping block of every step, forward
and backward (update_plan writes it into plan.blocks[i].layer_fn beside keep); notebook 03 routes the
student's `my_random_ltd_layer` through it. With r = S nothing is dropped and the hook is not called.

Why sorting is enough for a causal model: the block runs on the gathered (B, r, C) tensor with
the ordinary causal mask; since kept positions are ascending, "earlier in the gathered tensor"
is "earlier in the original sequence", so a kept token attends exactly to the kept tokens at
earlier positions. Positions stay the original ones: the learned position embedding is added to
each token before block 0 and travels with it.

Data-parallel draws (`random_ltd.draws`). The paper draws an independent subset per (layer,
sample) (§3.1). Under data parallelism the global batch is split across processes, so "per sample"
means per rank too; Megatron-DeepSpeed reseeds its sampler per rank for exactly this reason
(`megatron/training.py`: "random-ltd requires different randomness on each rank").
  per_rank (default)  the generator is keyed by the *global* micro-batch index m * world + rank, the
                      index the data sampler uses: every sample of the global batch gets its own subsets,
                      and the draws, like the batches, do not depend on how the global batch is split into
                      processes x micro-batches (2 processes x 1 micro-batch = 1 process x 2). With one
                      process the index is m: bitwise the `shared` draws, so single-process runs (and every
                      cached result) are unchanged.
  shared              keyed by the micro-step m alone: every rank drops the same positions of its samples
                      (sample b on rank 0 and on rank 1 share subsets). This was the only behaviour before
                      the option existed; keep it to reproduce multi-process runs made then.
Both are rebuilt from integers on resume, so resuming is exact either way. Random-LTD uses every
parameter on every rank whichever is chosen, so DDP needs no find_unused_parameters.

Padding. No accellib path feeds padded batches: language batches are windows of one packed token
stream (accellib/data/tokens.py) and the model's attention takes no padding mask. A data folder whose
meta.json declares a pad id is refused in one line at setup, because a dropped block would let real
tokens attend to pads. `kept_key_mask(pad, keep)` is the piece a padded task would need (the key mask
of the gathered tokens; DeepSpeed gathers the encoder mask the same way); it is not wired into the
model (notebook 03, exercise 5).

On a GPU (issue 42's item 3):
  one draw      update_plan draws the kept indices of every dropping block together: one (L, B, S) score
                tensor, one topk and one sort (`kept_subsets`), where the per-block loop ran 3 kernels x L per
                micro-step; DeepSpeed's sampler likewise draws (layers, batch, r) indices in one call
                (deepspeed/ops/random_ltd/dropping_utils.py, gpt_sample_tokens). On CPU the scores still come from
                one generator per block (the subsets of every cached CPU result, bitwise); on CUDA from one
                generator per micro-step (update_plan's docstring). Still the paper's draw: independent uniform
                subsets per (block, sample) (§3.1).
  one graph     under train.compile=blocks, run_block marks the gathered (B, r, C) tensor's token dimension
                dynamic, in the range [2, S - 1], before the compiled block sees it: the dropped blocks compile one
                dynamic graph at their first call and keep it for every kept length (no static -> dynamic
                recompile), and the full-length blocks keep their own static graph (tests/test_random_ltd_gpu_path.py).
  few lengths   a run meets at most (S - r0) / q + 1 distinct kept lengths (q = step_len, r0 = the first multiple
                of q >= min_len; §3.2's seq_per_step): q is the length bucket. Hypothesis, not measured here
                (issue 42): a GPU pays a one-off cost per new shape (cuDNN's attention builds an execution plan per
                shape; 84-290 ms each were derived from the H200 record), so q bounds how often it is paid. On
                CPU a new length costs nothing measurable (benchmarks/random_ltd.py, results/random_ltd_cpu.json:
                new_length).
  attention     random_ltd.attention picks the SDPA backend of the dropped blocks' calls (torch.nn.attention.
                sdpa_kernel around them, the layer hook included); "auto" (the default) leaves it to PyTorch, as
                before. A backend that cannot run on the device, at the model's head size and precision, is refused
                at setup in one line that lists those that can. Under train.compile=blocks the backend is chosen
                when the dropped blocks' graph is traced, inside that context, and that graph serves no full-length
                block (the length range above).
"""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.options import ConfigError, opt
from ..data.tokens import generator_for
from ..models.transformer import BlockPlan, run_block
from ..core.schedules import WarmupCosine
from . import register
from .base import Technique

_TAG = 0x17D  # separates random-LTD's draws from the data sampler's (seed, step, micro) stream
PAD_KEYS = ("pad_id", "pad_token_id")  # a meta.json that declares one of these holds padded sequences
# random_ltd.attention -> torch.nn.attention.SDPBackend member ("auto": no choice made, PyTorch's own)
ATTENTION = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
             "math": "MATH"}


@dataclass
class RandomLTDConfig:
    enabled: bool = opt(False, "drop tokens in the middle blocks (random-LTD)")
    min_len: int = opt(16, "r_min: kept tokens per sample at step 0 (rounded up to a multiple of step_len)", min=1)
    step_len: int = opt(8, "q: the kept length is a multiple of this (the paper's seq_per_step); it bounds a run's "
                           "distinct kept lengths to (S - r0)/q + 1, and with them the one-off per-shape costs "
                           "on a GPU (a hypothesis: cuDNN attention plans one execution per shape)", min=1)
    ramp_steps: int = opt(0, "T_r: optimizer steps for r to grow from min_len to the full length; "
                             "0 = 60% of train.steps (or of budget_steps when set)", min=0, horizon="steps")
    layers: list[int] = opt([], "blocks that drop tokens; [] = the middle blocks 1..n_layer-2")
    layer_token_lr: bool = opt(False, "key LR warm-up/decay by consumed LayerTokens instead of steps")
    draws: str = opt("per_rank", "per_rank: each data-parallel rank draws its own subsets (keyed like its "
                                 "batches, as Megatron-DeepSpeed); shared: every rank drops the same positions",
                     choices=["per_rank", "shared"])
    budget_steps: int = opt(0, "stop once LayerTokens reach this many full-length (baseline) steps' "
                               "worth; also the LayerToken LR's decay end. 0 = stop at train.steps", min=0,
                               horizon="steps")
    attention: str = opt("auto", "SDPA backend of the dropped blocks' attention (torch.nn.attention.sdpa_kernel "
                                 "around their calls only); auto = PyTorch's choice", choices=["auto", *ATTENTION],
                     resume=True)

    def validate(self) -> None:
        if any((not isinstance(i, int)) or i < 0 for i in self.layers):
            raise ValueError(f"layers must be block indices >= 0, got {self.layers}")


class ReservedLength:
    """MSLG, the paper's "fixed_linear" schedule (§3.2):

        r(t) = min(S, max(r0, q * floor((r_min + (t / T_r) * (S - r_min)) / q)))
        r0   = q * ceil(r_min / q)     the first multiple of q >= r_min

    The clamp at r0 avoids rounding below the minimum, even to 0 (DeepSpeed PR #8529); at the end
    of the ramp r = S exactly, also when S is not a multiple of q (flooring would stop short)."""

    def __init__(self, min_len: int, full_len: int, step_len: int, ramp_steps: int):
        if not 1 <= min_len <= full_len:
            raise ConfigError(f"random_ltd.min_len={min_len} must be in [1, model.seq_len={full_len}]")
        self.min_len, self.full_len, self.q, self.ramp = min_len, full_len, step_len, max(1, ramp_steps)

    def __call__(self, step: int) -> int:
        r0 = self.q * math.ceil(self.min_len / self.q)
        lin = self.min_len + min(1.0, step / self.ramp) * (self.full_len - self.min_len)
        if lin >= self.full_len:  # end of the ramp: full length even when S is not a multiple of q
            return self.full_len
        return min(self.full_len, max(r0, self.q * int(lin // self.q)))

    def state_dict(self) -> dict:
        return dict(min_len=self.min_len, full_len=self.full_len, step_len=self.q, ramp_steps=self.ramp)


class LayerTokenLR(WarmupCosine):
    """The trainer's warm-up + cosine schedule keyed by consumed LayerTokens (Yao et al. 2022, App. C).

    With P = LayerTokens of one full-length step (all processes), s = layer_tokens / P counts
    "baseline-equivalent steps" and lr = WarmupCosine.at(s): exactly the step schedule when nothing
    is dropped (s = t). Dropping tokens slows s down, so warm-up and decay stretch over more steps."""

    def __init__(self, lr: float, warmup: int, total: int, min_ratio: float, lt_per_step: int):
        super().__init__(lr, warmup, total, min_ratio)
        self.P = lt_per_step

    def at(self, layer_tokens: float) -> float:
        return super().at(layer_tokens / self.P)

    def __call__(self, state) -> float:
        return self.at(state.layer_tokens)


def keep_indices(batch: int, seq_len: int, r: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, r) int64: per sample, a uniform random r-subset of range(seq_len), sorted ascending,
    drawn on the generator's device (so indices for a CUDA model never cross from the host)."""
    # one score per position; kept_subsets keeps the r smallest (a uniform random subset), in position order
    return kept_subsets(torch.rand(batch, seq_len, generator=generator, device=generator.device), r)


def kept_subsets(scores: torch.Tensor, r: int) -> torch.Tensor:
    """(..., S) uniform scores -> (..., r) int64: per row, the positions of the r smallest scores, sorted
    ascending: a uniform random r-subset per row. One topk and one sort for every row, whatever the leading
    dimensions (update_plan passes all dropping blocks' (L, B, S) scores at once); each row's result is the
    one keep_indices gives for that row alone (tests/test_random_ltd_gpu_path.py, ties included)."""
    return scores.topk(r, dim=-1, largest=False).indices.sort(dim=-1).values


def sdpa_backend(name: str):
    """random_ltd.attention's name -> torch.nn.attention.SDPBackend."""
    from torch.nn.attention import SDPBackend
    return getattr(SDPBackend, ATTENTION[name])


def attention_runs(name: str, device: torch.device, n_head: int, head_dim: int, causal: bool,
                   autocast=contextlib.nullcontext) -> bool:
    """Whether SDPA's `name` backend runs a forward and a backward on `device` at this head size, inside
    `autocast` (the trainer's precision): a tiny (1, n_head, 8, head_dim) attention, no warning printed."""
    from torch.nn.attention import sdpa_kernel
    q, k, v = (torch.randn(1, n_head, 8, head_dim, device=device, requires_grad=True) for _ in range(3))
    try:
        with warnings.catch_warnings(), sdpa_kernel(sdpa_backend(name)), autocast():
            warnings.simplefilter("ignore")  # a refused backend warns why before it raises
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).float().sum().backward()
        return True
    except RuntimeError:
        return False


class UnderBackend:
    """A layer hook (x, keep, block) -> y that runs `inner` (a RandomLTD.layer_fn; None = run_block's own
    gather -> block -> scatter) inside sdpa_kernel(backend): random_ltd.attention for the dropped blocks only.
    The backward uses the backward of the kernel the forward chose."""

    def __init__(self, backend, inner=None):
        self.backend, self.inner = backend, inner

    def __call__(self, x: torch.Tensor, keep: torch.Tensor, block) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel(self.backend):
            if self.inner is None:
                return run_block(block, x, BlockPlan(keep=keep))
            return self.inner(x, keep, block)


def kept_key_mask(pad: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Padding mask of the gathered tokens: pad (B, S) bool (True = real token), keep (B, r)
    -> (B, 1, 1, r) bool, broadcastable to SDPA's (B, heads, r, r) attn_mask."""
    return pad.gather(1, keep)[:, None, None, :]


@register
class RandomLTD(Technique):
    name = "random_ltd"
    Config = RandomLTDConfig
    plan_fields = ("keep",)
    kinds = ("gpt", "mlm", "vit")
    needs = "token sequences in transformer blocks"

    def __init__(self, cfg: RandomLTDConfig, run_cfg):
        super().__init__(cfg, run_cfg)
        m, t = run_cfg.model, run_cfg.train
        if m.n_layer < 3 and not cfg.layers:
            raise ConfigError(f"random_ltd needs model.n_layer >= 3 (the first and last blocks keep all "
                              f"tokens), got {m.n_layer}; or list random_ltd.layers explicitly")
        self.layers = sorted(set(cfg.layers)) if cfg.layers else list(range(1, m.n_layer - 1))
        if self.layers[-1] >= m.n_layer:
            raise ConfigError(f"random_ltd.layers={cfg.layers} has a block >= model.n_layer={m.n_layer}")
        if cfg.budget_steps and t.steps < cfg.budget_steps:
            raise ConfigError(f"train.steps={t.steps} is the step cap of a LayerToken-budget run and must be "
                              f">= random_ltd.budget_steps={cfg.budget_steps} (the paper uses about 2x)")
        horizon = cfg.budget_steps or t.steps
        ramp = cfg.ramp_steps or max(1, round(0.6 * horizon))
        self.schedule = ReservedLength(cfg.min_len, m.seq_len, cfg.step_len, ramp)
        self.device = torch.device("cpu")
        self.last_r = self.schedule(0)
        self.lt_per_step = 0  # set in setup, when the world size is known
        self.world, self.rank = 1, 0  # data-parallel size and index, set in setup
        self.layer_fn = None  # (x, keep, block) -> y instead of run_block's gather/scatter (module docstring)
        self.backend = None if cfg.attention == "auto" else sdpa_backend(cfg.attention)

    def setup(self, trainer) -> None:
        c, m, t, o = self.cfg, self.run_cfg.model, self.run_cfg.train, self.run_cfg.optim
        self.device = trainer.accelerator.device
        self.world, self.rank = trainer.dp  # data-parallel: a pipeline's stages share one rank here
        pad = next((k for k in PAD_KEYS if k in getattr(trainer.task.data, "meta", {})), None)
        if pad is not None:
            raise ConfigError(f"random_ltd needs packed data without padding, but {self.run_cfg.data.path}/"
                              f"meta.json declares {pad}={trainer.task.data.meta[pad]}: the model has no padding "
                              "mask, so kept tokens would attend to pads; pack the data or disable random_ltd")
        if c.attention != "auto":  # refused here in one line, not deep inside the first step
            args = (self.device, m.n_head, m.d_model // m.n_head, m.kind == "gpt", trainer.accelerator.autocast)
            if not attention_runs(c.attention, *args):
                ok = [n for n in ATTENTION if attention_runs(n, *args)]
                raise ConfigError(f"random_ltd.attention={c.attention}: SDPA's {c.attention} backend does not run on "
                                  f"{self.device.type} here (head size {args[2]}, precision "
                                  f"{trainer.accelerator.mixed_precision}); backends that run here: auto, "
                                  f"{', '.join(ok)}")
        # LayerTokens of one full-length optimizer step, all processes
        self.lt_per_step = trainer.accelerator.num_processes * t.grad_accum * t.batch_size * m.seq_len * m.n_layer
        if c.layer_token_lr:
            trainer.lr_schedule = LayerTokenLR(o.lr, o.warmup_steps, c.budget_steps or t.steps,
                                               o.min_lr_ratio, self.lt_per_step)

    def preview(self) -> None:  # one process: LayerTokens of a full-length step
        m, t = self.run_cfg.model, self.run_cfg.train
        self.world, self.rank = 1, 0
        self.lt_per_step = t.grad_accum * t.batch_size * m.seq_len * m.n_layer

    def update_plan(self, plan, step: int, micro_step: int) -> None:
        """Each dropping block's kept indices, drawn on the model's device (no host-to-device copy), for all
        dropping blocks at once: an (L, B, S) score tensor, then one topk and one sort (kept_subsets), as
        DeepSpeed's sampler draws (layers, batch, r) in one call. index = the global micro-batch index
        (per_rank) or the micro-step (shared); the draws are rebuilt from integers on resume, so resuming is
        exact, and are independent per (step, micro-batch, block, sample) (§3.1).
          CPU   block l's (B, S) scores come from generator_for(seed, step, index, _TAG, l), as when each block
                was drawn on its own (keep_indices): the same subsets, bit for bit, so every cached CPU result
                stays valid (tests/test_random_ltd_gpu_path.py checks it against that per-block draw).
          else  one generator per micro-step, generator_for(seed, step, index, _TAG) on the device (its Philox
                stream on CUDA), draws the whole (L, B, S) tensor in one kernel: one generator object per
                micro-step instead of one per block. Equally uniform subsets, but not the CPU's (nor the earlier
                per-block CUDA draws): a CUDA run and a CPU run of the same seed drop different tokens."""
        r = self.last_r = self.schedule(step)
        S, B = self.run_cfg.model.seq_len, self.run_cfg.train.batch_size
        if r >= S:
            return  # full length: no gather/scatter at all (bitwise the plain model)
        seed = self.run_cfg.train.seed
        index = micro_step * self.world + self.rank if self.cfg.draws == "per_rank" else micro_step
        if self.device.type == "cpu":
            scores = torch.empty(len(self.layers), B, S)
            for row, i in zip(scores, self.layers):
                row.uniform_(generator=generator_for(seed, step, index, _TAG, i))  # = torch.rand(B, S, generator=g)
        else:
            g = generator_for(seed, step, index, _TAG, device=self.device)
            scores = torch.rand(len(self.layers), B, S, generator=g, device=self.device)
        keep = kept_subsets(scores, r)  # (L, B, r)
        layer_fn = self.layer_fn if self.backend is None else UnderBackend(self.backend, self.layer_fn)
        for i, k in zip(self.layers, keep):
            plan.blocks[i].keep = k
            plan.blocks[i].layer_fn = layer_fn

    def should_stop(self, state) -> bool:
        budget = self.cfg.budget_steps * self.lt_per_step
        return bool(budget) and state.layer_tokens >= budget

    def metrics(self, state) -> dict:
        out = dict(ltd_keep=self.last_r)
        if self.lt_per_step:
            out["ltd_equiv_steps"] = round(state.layer_tokens / self.lt_per_step, 4)
        return out

    def state_dict(self) -> dict:
        return dict(schedule=self.schedule.state_dict(), layers=self.layers, last_r=self.last_r,
                    draws=self.cfg.draws)

    def load_state_dict(self, d: dict) -> None:
        if d["schedule"] != self.schedule.state_dict() or list(d["layers"]) != self.layers:
            raise ConfigError(f"the checkpoint's random_ltd schedule {d['schedule']} (layers {d['layers']}) "
                              f"differs from this config's {self.schedule.state_dict()}; resume with the same "
                              "random_ltd settings and train.steps (ramp_steps=0 follows train.steps)")
        was = d.get("draws", "shared")  # checkpoints from before the option drew shared subsets
        if was != self.cfg.draws and self.world > 1:  # one process: the two draw the same subsets
            raise ConfigError(f"the checkpoint was trained with random_ltd.draws={was}; resume it with "
                              f"--random_ltd.draws={was} (this run says {self.cfg.draws})")
        self.last_r = d["last_r"]
