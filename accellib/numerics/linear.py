"""An emulated low-precision Linear layer: FP8 operands, narrow chunk-based accumulation.

Wang et al. (NeurIPS 2018, arXiv 1812.08011) train with every GEMM operand (weights, activations, errors) in FP8
(1,5,2) and every GEMM accumulated in FP16 (1,6,9) with chunk-based accumulation. A Linear layer runs
three GEMMs, each with its own accumulation length K (Sakr et al., ICLR 2019, arXiv 1901.06588; the
lengths below are ours for a transformer):

    forward          y  = x W^T         K = d_in
    input gradient   gx = g W           K = d_out
    weight gradient  gW = g^T x         K = tokens in the micro-batch (the long one)

`LowpGemms` holds the formats and one chunk length per GEMM. The errors g are multiplied by
`loss_scale` (a power of two) before they are rounded to FP8 and the GEMM results divided by it
after, which is exactly loss scaling by that factor: scaling by 2^k is exact in the fp32 parts of
the network. The bias add and its gradient stay in fp32, as does every non-GEMM operation.

With fp32 operands and an fp32 accumulator the layer equals `F.linear` to float32 round-off
(tests/test_numerics_linear.py): only the summation order differs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

from .accumulate import matmul, matmul_by
from .formats import FP32, Format, quantize


@dataclass
class LowpGemms:
    operand: Format = FP32
    acc: Format = FP32
    chunk_fwd: int = 0
    chunk_bgrad: int = 0
    chunk_wgrad: int = 0
    outer: Optional[Format] = None        # second accumulator for the chunk sums (None: acc)
    rounding: str = "nearest"             # accumulator rounding
    loss_scale: float = 1.0
    generator: Optional[torch.Generator] = None   # draws of stochastic accumulator rounding
    sum_fn: Optional[Callable] = None     # a per-vector sum (terms, fmt, cl) -> float instead of the vectorised one:
                                          # notebook 07 routes a short run through the student's (slow; tiny models)

    def q(self, x: torch.Tensor) -> torch.Tensor:
        return quantize(x, self.operand)

    def mm(self, a: torch.Tensor, b: torch.Tensor, chunk: int) -> torch.Tensor:
        if self.sum_fn is not None:
            if self.rounding != "nearest" or self.outer not in (None, self.acc):
                raise ValueError("LowpGemms.sum_fn sums in one format with round to nearest; set rounding='nearest' "
                                 "and outer=None, or sum_fn=None")
            return matmul_by(self.sum_fn, a, b, self.acc, chunk)
        return matmul(a, b, self.acc, chunk, self.rounding, self.generator, self.outer)


class _EmulatedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, gemms: LowpGemms):
        lead = x.shape[:-1]
        xq = gemms.q(x.reshape(-1, x.shape[-1]).float())
        wq = gemms.q(weight.float())
        y = gemms.mm(xq, wq.t(), gemms.chunk_fwd)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(xq, wq)
        ctx.gemms, ctx.lead, ctx.has_bias = gemms, lead, bias is not None
        return y.reshape(*lead, -1)

    @staticmethod
    def backward(ctx, gy):
        xq, wq = ctx.saved_tensors
        gm, s = ctx.gemms, ctx.gemms.loss_scale
        g = gy.reshape(-1, gy.shape[-1]).float()
        gq = gm.q(g * s)
        gx = gm.mm(gq, wq, gm.chunk_bgrad) / s if ctx.needs_input_grad[0] else None
        gw = gm.mm(gq.t(), xq, gm.chunk_wgrad) / s if ctx.needs_input_grad[1] else None
        gb = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return (None if gx is None else gx.reshape(*ctx.lead, -1)), gw, gb, None


def emulated_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    gemms: LowpGemms) -> torch.Tensor:
    """F.linear with all three GEMMs emulated as `gemms` says."""
    return _EmulatedLinear.apply(x, weight, bias, gemms)


class EmulatedLinear(nn.Linear):
    """An nn.Linear whose GEMMs are emulated; same parameters and names, so checkpoints load either way.
    `convert` switches existing layers in place (their class changes, their tensors stay)."""
    gemms: LowpGemms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return emulated_linear(x, self.weight, self.bias, self.gemms)


def convert(model: nn.Module, gemms: LowpGemms, keep: tuple[str, ...] = ()) -> list[str]:
    """Make every nn.Linear of `model` (except the module names in `keep`) an EmulatedLinear sharing
    `gemms`; returns the converted module names."""
    done = []
    for name, m in model.named_modules():
        if type(m) is nn.Linear and name not in keep:
            m.__class__ = EmulatedLinear
            m.gemms = gemms
            done.append(name)
        elif isinstance(m, EmulatedLinear) and name not in keep:
            m.gemms = gemms
            done.append(name)
    return done
