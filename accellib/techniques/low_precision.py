"""The `lowp` technique: FP8 GEMM operands, narrow chunk-based accumulation, a stochastically rounded update.

Low-precision training numerics: FP8 GEMM operands, chunk-based narrow accumulation, and a
stochastically rounded 16-bit weight update with no fp32 master copy. Wang et al., "Training Deep
Neural Networks with 8-bit Floating Point Numbers", NeurIPS 2018 (arXiv 1812.08011). Only the
abstract was retrieved: the kept first/last layers, loss scaling and chunk length 64 are as commonly
reported, not checked against the paper.

    python -m accellib.train --config configs/tutorial.yaml --out runs/fp8 --lowp.enabled=true --lowp.chunk=64

backend=emulate (any CPU or GPU) switches every nn.Linear of the model, except the first and the
last when keep_first_last, to `accellib.numerics.EmulatedLinear`: operands rounded to `operand`,
each of its three GEMMs accumulated in `acc` with its own chunk length. After every optimizer step
the emulated layers' weights and AdamW moments are rounded to `weights` with `update` rounding:
the fp32 values the optimizer computes exist only inside the step, as in Wang et al.'s update
W <- SR(W - lr * u). Attention's score and value products, LayerNorm, softmax and the loss stay fp32.

The random draws of stochastic rounding come from (seed, step): a resumed run rounds exactly as the
uninterrupted one, and every data-parallel process rounds its replica identically.

backend=torchao runs real FP8 GEMMs through `torchao.float8.convert_to_float8_training` (H100-class
GPU; its own recipe: tensorwise-scaled e4m3/e5m2 operands, fp32 accumulation with the GPU's
periodic promotion, fp32 master weights), so operand/acc/chunk/weights do not apply to it.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from ..core.options import ConfigError, opt
from ..data.tokens import seed_for
from ..numerics.formats import parse_format, quantize
from ..numerics.linear import LowpGemms, convert
from . import register
from .base import Technique

ACC_STREAM, UPDATE_STREAM = 0x10, 0x11   # tags of the two random streams per step


@dataclass
class LowpConfig:
    enabled: bool = opt(False, "low-precision GEMMs and weight update (Wang et al. 2018)")
    backend: str = opt("emulate", "emulate = exact emulation on any device (accellib.numerics); torchao = real "
                       "FP8 GEMMs via torchao.float8 (CUDA GPU with FP8 tensor cores)", choices=["emulate", "torchao"])
    operand: str = opt("e5m2", "format of every GEMM operand: weights, activations, errors (paper: FP8 (1,5,2)); "
                       "e5m2, e4m3, fp16, bf16, fp32 or eXmY")
    acc: str = opt("e6m9", "accumulator format of every GEMM (paper: FP16 (1,6,9)); fp32 = wide accumulation")
    chunk: int = opt(64, "chunk length CL of the accumulations; 0 = naive (one running sum)", min=0)
    chunk_fwd: int = opt(-1, "CL of the forward GEMM (K = d_in); -1 = chunk", min=-1)
    chunk_bgrad: int = opt(-1, "CL of the input-gradient GEMM (K = d_out); -1 = chunk", min=-1)
    chunk_wgrad: int = opt(-1, "CL of the weight-gradient GEMM (K = tokens per micro-batch); -1 = chunk", min=-1)
    outer: str = opt("", "format of the second accumulator that sums the chunk sums; '' = acc")
    acc_rounding: str = opt("nearest", "rounding after every accumulator add", choices=["nearest", "stochastic"])
    keep_first_last: bool = opt(True, "keep the first and the last Linear layer at fp32 (as the paper is reported to)")
    loss_scale: float = opt(1024.0, "power of two the errors are multiplied by before FP8 rounding (loss "
                            "scaling); 1 = none", min=1.0)
    weights: str = opt("e6m9", "storage format of the emulated layers' weights and AdamW moments (paper: "
                       "FP16 (1,6,9), no fp32 master copy); fp32 = keep an fp32 master copy")
    update: str = opt("stochastic", "rounding of the weight update into `weights`", choices=["nearest", "stochastic"])


def _fmt(cfg: LowpConfig, key: str):
    try:
        return parse_format(getattr(cfg, key))
    except ValueError as e:
        raise ConfigError(f"lowp.{key}: {e}") from None


@register
class LowPrecision(Technique):
    name = "lowp"
    kinds = ("gpt", "mlm", "vit", "mlp")
    needs = "a model of Linear layers (the emulation covers Linear, not convolutions)"
    Config = LowpConfig

    def __init__(self, cfg: LowpConfig, run_cfg):
        super().__init__(cfg, run_cfg)
        if cfg.backend == "torchao":
            if run_cfg.train.device == "cpu" or not torch.cuda.is_available():
                raise ConfigError("lowp.backend=torchao runs real FP8 GEMMs and needs a CUDA GPU (H100-class); "
                                  "on this machine use lowp.backend=emulate")
            if importlib.util.find_spec("torchao") is None:
                raise ConfigError("lowp.backend=torchao needs the torchao package: pip install torchao "
                                  "(or use lowp.backend=emulate)")
        if math.frexp(cfg.loss_scale)[0] != 0.5:
            raise ConfigError(f"lowp.loss_scale={cfg.loss_scale} is not a power of two (only those scale exactly); "
                              "use e.g. 1024")
        self.wfmt = _fmt(cfg, "weights")
        outer = _fmt(cfg, "outer") if cfg.outer else None
        pick = lambda c: cfg.chunk if c < 0 else c  # noqa: E731
        self.gemms = LowpGemms(_fmt(cfg, "operand"), _fmt(cfg, "acc"), pick(cfg.chunk_fwd), pick(cfg.chunk_bgrad),
                               pick(cfg.chunk_wgrad), outer, cfg.acc_rounding, cfg.loss_scale)
        self.params: list[nn.Parameter] = []
        self.converted: list[str] = []
        self._before: list[torch.Tensor] = []
        self._same: Optional[torch.Tensor] = None   # weights the last step left unchanged (on the device)
        self.device = torch.device("cpu")

    def _generator(self, step: int, stream: int) -> torch.Generator:
        """The draws of one step's stochastic rounding, on the device the tensors live on."""
        return torch.Generator(self.device).manual_seed(seed_for(self.run_cfg.train.seed, step, stream))

    def fsdp_refusal(self) -> str:
        return ("it swaps the model's Linear layers and rounds the weights and AdamW moments in place with draws "
                "over whole tensors, which FSDP holds as shards")

    def setup(self, trainer) -> None:
        model = trainer.raw_model
        self.device = trainer.accelerator.device
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        keep = (linears[0], linears[-1]) if self.cfg.keep_first_last and linears else ()
        self.kept = list(dict.fromkeys(keep))
        if self.cfg.backend == "torchao":  # pragma: no cover - needs CUDA and torchao
            from torchao.float8 import convert_to_float8_training
            convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn not in keep)
            return
        self.converted = convert(model, self.gemms, keep)
        mods = dict(model.named_modules())
        seen: dict[int, nn.Parameter] = {}
        for n in self.converted:
            for p in mods[n].parameters(recurse=False):
                seen.setdefault(id(p), p)
        self.params = list(seen.values())
        self._round(trainer, None, "nearest")  # the stored weights start in the format

    def update_plan(self, plan, step: int, micro_step: int) -> None:
        if micro_step == 0 and self.params:
            self.gemms.generator = self._generator(step, ACC_STREAM)
            self._before = [p.detach().clone() for p in self.params]

    def step_end(self, trainer) -> None:
        if not self.params:
            return
        self._round(trainer, self._generator(trainer.state.step, UPDATE_STREAM), self.cfg.update)
        if self._before:
            # a device tensor, read at log steps only (metrics): no wait for the device every step
            self._same = torch.stack([(p == b).sum() for p, b in zip(self.params, self._before)]).sum()

    @property
    def frozen(self) -> float:
        """The share of emulated weights the last step left exactly unchanged."""
        return 0.0 if self._same is None else int(self._same) / sum(p.numel() for p in self.params)

    @torch.no_grad()
    def _round(self, trainer, g: torch.Generator, rounding: str) -> None:
        """Round the emulated layers' weights and AdamW moments to the storage format, in place."""
        if self.wfmt.is_fp32:
            return
        opt_state = trainer.optimizer.state
        for p in self.params:
            p.copy_(quantize(p.float(), self.wfmt, rounding, g))
            for k in ("exp_avg", "exp_avg_sq", "momentum_buffer"):  # AdamW's moments, SGD's momentum
                if k in opt_state.get(p, {}):
                    opt_state[p][k].copy_(quantize(opt_state[p][k].float(), self.wfmt, rounding, g))

    def metrics(self, state) -> dict:
        # the share of emulated weights this step left exactly unchanged (round-to-nearest stalls small updates)
        return dict(lowp_frozen=round(self.frozen, 5)) if self.params else {}
