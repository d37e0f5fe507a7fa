"""The `pld` technique: Progressive Layer Dropping.

Progressive Layer Dropping (PLD). Zhang & He, "Accelerating Training of Transformer-Based
Language Models with Progressive Layer Dropping", NeurIPS 2020 (arXiv 2010.13369), §4.

Whole blocks are skipped at random, per micro-batch, with a keep probability that falls over
time (to a floor theta_bar) and over depth (deeper blocks are dropped more):

    theta(t) = (1 - theta_bar) * exp(-gamma * t) + theta_bar          t = optimizer step
    p_l(t)   = 1 - (l / L) * (1 - theta(t))                           l = 1..L (paper)
    E[executed blocks] = L - (1 - theta)(L + 1) / 2

Kept blocks' residual branches are scaled by 1/p_l in training, eval runs the full model.

Depth conventions (`pld.convention`): `paper` is the §4.2 formula above, l = 1..L (the first block can
be skipped, the last is kept with probability theta). `code` follows DeepSpeedExamples' BERT
(bing_bert/nvidia/modelingpreln_layerdrop.py, `BertEncoder.forward`): p starts at 1 and falls by (1 - theta)/L
after each block, so block i (0-based) is gated with p_i = 1 - i (1 - theta)/L, the first block is always kept and
E = L - (1 - theta)(L - 1)/2.

Checked against the official code (issue 28): theta(t) is DeepSpeed's `_prob` in
deepspeed/runtime/progressive_layer_drop.py exactly (theta starts at 1); gamma = 0.001 and theta_bar = 0.5 are
DeepSpeed's defaults (runtime/constants.py) and its PLD tutorial's recommendation; the 1/p scale multiplies both
residual branches and only in training (DeepSpeed's engine passes theta to the model only in train mode).
One difference, on purpose: DeepSpeedExamples scales a kept block i by 1/p_(i+1), the probability after the
decrement, although it gated the block with p_i, so its kept blocks are scaled up by p_i / p_(i+1) > 1 on average.
accellib's `code` convention uses p_i for both the gate and the scale: the unbiased form of that code, not a
replica. Still unverified, because the paper's body could not be read: the depth index of its Algorithm 1
(`paper` or `code`), and gamma = 100/T as the paper's heuristic (only a third-party summary of the paper states it).
The gate, scaling, DDP and zero-fill machinery is shared with SBLD in `_layer_drop_common.py`.

    python -m accellib.train --config configs/pld_tiny.yaml --out runs/pld

theta is a pure function of the step counter (checkpointed by the trainer), so a resumed run
continues the schedule exactly; the running expected-block/FLOP sums are checkpointed here.

`keep_probs_fn` (None by default: accellib's `pld_theta` + `depth_keep_probs`, bit for bit) replaces the chain
that gives the §4.2 keep probabilities: fn(step, theta_bar, gamma, L) -> [p_1, ..., p_L] in the `paper`
convention, the signature of notebook 01's your-turn `my_pld_keep_probs`. Set it on a trainer's technique
instance; the gates, the 1/p scale and the FLOPs bookkeeping then use its list.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..core.options import opt
from . import register
from ._layer_drop_common import LayerDropTechnique, depth_keep_probs, pld_theta


@dataclass
class PLDConfig:
    enabled: bool = opt(False, "Progressive Layer Dropping (Zhang & He 2020)")
    theta_bar: float = opt(0.5, "floor of the global keep ratio theta(t)", min=0.05, max=1.0)
    gamma: float = opt(0.001, "decay rate of theta(t) per optimizer step (DeepSpeed default 0.001; "
                              "tiny runs: about 10/train.steps)", min=0.0, horizon="rate")
    convention: str = opt("paper", "depth schedule: paper (l=1..L), code (l=0..L-1, first block always "
                                   "kept), uniform (ablation: p_l = theta)", choices=["paper", "code", "uniform"])
    scale_by_inverse_p: bool = opt(True, "scale kept residual branches by 1/p_l (unbiased); false = ablation")
    zero_fill: bool = opt(False, "give skipped blocks zero gradients as DeepSpeed did (AdamW momentum and "
                                 "weight decay then still move them); default: no update")


@register
class ProgressiveLayerDrop(LayerDropTechnique):
    name = "pld"
    Config = PLDConfig
    keep_probs_fn: Optional[Callable] = None   # fn(step, theta_bar, gamma, L) -> [p_1..p_L], paper convention (§4.2)

    def theta(self, step: int) -> float:
        return pld_theta(step, self.cfg.theta_bar, self.cfg.gamma)

    def keep_probs(self, step: int) -> list[float]:
        fn = self.keep_probs_fn
        if fn is None:
            return depth_keep_probs(self.theta(step), self.n_layer, self.cfg.convention)
        if self.cfg.convention != "paper":
            raise ValueError("pld: keep_probs_fn gives the paper convention's p_l (l = 1..L); set "
                             f"pld.convention=paper (not {self.cfg.convention}) or keep_probs_fn=None")
        p = list(fn(step, self.cfg.theta_bar, self.cfg.gamma, self.n_layer))
        if len(p) != self.n_layer:
            raise ValueError(f"pld: keep_probs_fn returned {len(p)} keep probabilities for {self.n_layer} blocks")
        return p
