"""What the two layer-dropping techniques (PLD, SBLD) share: the gate, the 1/p scaling, the bookkeeping.

What Progressive Layer Dropping (PLD) and Sensitivity-Based Layer Dropping (SBLD) share:
the gate, the 1/p scaling, the DDP setting, the optional zero-fill and the bookkeeping.

A subclass only says how keep probabilities p_l(t) come about (`keep_probs(step)`); this base
turns them into one Bernoulli gate per block per micro-batch (Zhang & He 2020, §4, "Switchable
Transformer" block):

    G_l ~ Bernoulli(p_l)                       one draw per block, shared by the whole micro-batch
    h = x + G_l / p_l * Attn(LN1(x));   y = h + G_l / p_l * FFN(LN2(h))     (training)
    y = block(x)                               (eval: the trainer passes plan=None)

so E[y] equals the unscaled block's output for a block whose branches are linear in their input.

Decisions:
* Gates come from `generator_for(seed, step, micro_step, _GATE_TAG)`: every data-parallel rank
  draws the same gates, and a resumed run draws what the uninterrupted run would have.
* Never all blocks dropped: if every gate comes up 0, the block with the largest p (lowest index
  on ties) runs anyway, at its 1/p scale. This changes E[blocks] by at most prod(1 - p_l), which is
  below 1e-3 for the default schedules; `test_layer_drop.py` checks the expectation.
* A block skipped on every rank is never used, so DDP must be told: find_unused_parameters=True.
* Skipped blocks keep grad None (the trainer zeroes with set_to_none=True), so AdamW leaves them
  alone: no momentum drift, no weight decay (the paper's "skipped block gets no update").
  `zero_fill=true` imitates DeepSpeed, whose all-reduce replaces None grads by zeros: we add
  0 * sum(block parameters) to the loss, which gives every block parameter a gradient (0 where the
  block was skipped) without touching the trainer; AdamW then moves skipped blocks through its
  momentum and weight decay, exactly as DeepSpeed did.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..data.tokens import generator_for
from ..analysis.flops import block_forward_flops
from .base import Technique

_GATE_TAG = 0x9A7E  # separates gate draws from the data stream drawn from (seed, step, index)


def pld_theta(step: float, theta_bar: float, gamma: float) -> float:
    """Global keep ratio of PLD (Zhang & He 2020, §4.2, Eq. for theta(t))."""
    # theta(t) = (1 - theta_bar) * exp(-gamma * t) + theta_bar
    return (1.0 - theta_bar) * math.exp(-gamma * max(step, 0.0)) + theta_bar


def depth_keep_probs(theta: float, n_layer: int, convention: str = "paper") -> list[float]:
    """Depth-wise keep probabilities for global ratio theta.

    paper:   p_l = 1 - (l / L) (1 - theta), l = 1..L   (last block kept with prob theta)
    code:    p_l = 1 - (l / L) (1 - theta), l = 0..L-1 (DeepSpeedExamples' gate: first block always kept; that
             code scales a kept block by 1/p_(l+1), we scale by the 1/p_l it was gated with: unbiased)
    uniform: p_l = theta                                 (ablation: no depth schedule)
    """
    L = n_layer
    if convention == "uniform":
        return [theta] * L
    off = 1 if convention == "paper" else 0
    return [1.0 - (l + off) / L * (1.0 - theta) for l in range(L)]


def expected_executed(theta: float, n_layer: int, convention: str = "paper") -> float:
    """Closed form of sum_l p_l (sum of the arithmetic sequence): L - (1-theta)(L+1)/2 (paper), L - (1-theta)(L-1)/2 (code)."""
    L = n_layer
    if convention == "uniform":
        return theta * L
    return L - (1 - theta) * ((L + 1) if convention == "paper" else (L - 1)) / 2


def draw_gates(probs: list[float], seed: int, step: int, micro_step: int) -> list[bool]:
    """One Bernoulli(p_l) gate per block from (seed, step, micro_step); never all False."""
    g = generator_for(seed, step, micro_step, _GATE_TAG)
    u = torch.rand(len(probs), generator=g, dtype=torch.float64).tolist()  # (L,), a CPU draw: the plan is host-side
    gates = [u_l < p for u_l, p in zip(u, probs)]
    if not any(gates):  # keep at least one block: the most likely one (lowest index on ties)
        gates[max(range(len(probs)), key=lambda i: (probs[i], -i))] = True
    return gates


def apply_gates(plan, gates: list[bool], probs: list[float], scale: bool = True) -> None:
    """Write run / 1/p scale into the plan in place. p = 1 gives scale 1.0 exactly, so a run that
    never drops is bitwise the plain model."""
    for bp, g, p in zip(plan.blocks, gates, probs):
        bp.run = g
        bp.scale = (1.0 / p) if (g and scale and p < 1.0) else 1.0


class LayerDropTechnique(Technique):
    """Base of PLD and SBLD. Subclasses implement `keep_probs(step) -> list[float]` (and may add
    to `state_dict`); the config needs `scale_by_inverse_p` and `zero_fill`."""
    plan_fields = ("run", "scale")
    kinds = ("gpt", "mlm", "vit")
    needs = "transformer blocks to drop"

    def __init__(self, cfg, run_cfg):
        super().__init__(cfg, run_cfg)
        self.n_layer = run_cfg.model.n_layer
        self.seed = run_cfg.train.seed
        self.world = 1
        self._gates: dict[int, list[bool]] = {}   # micro_step -> gates of the current step
        self._block_params: list = []
        # bookkeeping of the last finished step and running sums (checkpointed)
        self.last = dict(probs=[1.0] * self.n_layer, theta=1.0, realised=float(self.n_layer))
        self.sum_expected_blocks = 0.0   # sum over micro-batches of sum_l p_l
        self.expected_flops = 0.0        # sum over steps of E[train FLOPs], all processes

    # ---------------------------------------------------------------- subclass API
    def keep_probs(self, step: int) -> list[float]:
        raise NotImplementedError

    def theta(self, step: int) -> float:
        """Global keep ratio sum_l p_l / L at `step`."""
        return sum(self.keep_probs(step)) / self.n_layer

    # ---------------------------------------------------------------- hooks
    def ddp_kwargs(self) -> dict:
        # a block skipped on every rank has no gradient; DDP would wait for it forever otherwise
        return dict(find_unused_parameters=True)

    def fsdp_refusal(self) -> str:
        # the gates skip the same blocks on every rank (drawn from (seed, step, micro-step)), so every rank
        # skips the same FSDP units: no rank waits in an all-gather the others never start
        if self.cfg.zero_fill:
            return ("zero_fill adds 0 * sum of the block parameters to the loss outside the blocks' forward, where "
                    "FSDP holds them as shards (set zero_fill=false)")
        return ""

    def setup(self, trainer) -> None:
        self.world = trainer.accelerator.num_processes
        self._block_params = [p for p in trainer.raw_model.blocks.parameters() if p.requires_grad]
        # forward FLOPs of one sequence outside the blocks (the LM head on the positions it scores, or the
        # ViT's patch embedding and head): the task's count with no block run
        from ..models.transformer import BlockPlan, Plan
        none = Plan([BlockPlan(run=False) for _ in range(self.run_cfg.model.n_layer)])
        self._outside = trainer.task.micro_flops(none) / (3 * self.run_cfg.train.batch_size)

    def update_plan(self, plan, step: int, micro_step: int) -> None:
        probs = self.keep_probs(step)
        gates = draw_gates(probs, self.seed, step, micro_step)
        apply_gates(plan, gates, probs, self.cfg.scale_by_inverse_p)
        self._gates[micro_step] = gates

    def extra_loss(self, model, x, y, logits) -> Optional[torch.Tensor]:
        if not self.cfg.zero_fill:
            return None
        # 0 * sum(theta): d/dtheta = 0, so every block parameter gets a (zero) gradient even when
        # its block was skipped; the loss value is unchanged.
        return 0.0 * sum(p.sum() for p in self._block_params)

    def step_end(self, trainer) -> None:
        step = trainer.state.step - 1          # the step that just finished
        probs = self.keep_probs(step)
        n_micro = max(1, len(self._gates))
        self.last = dict(probs=probs, theta=self.theta(step),
                         realised=sum(sum(g) for g in self._gates.values()) / n_micro)
        self._gates = {}
        e = sum(probs)
        self.sum_expected_blocks += e * n_micro
        m, B = self.run_cfg.model, self.run_cfg.train.batch_size
        T = m.seq_len
        # E[FLOPs] = 3 B (sum_l p_l * block(T) + head(T)) per micro-batch, x micro-batches x ranks
        per_mb = 3 * B * (e * block_forward_flops(m, T) + self._outside)
        self.expected_flops += self.world * n_micro * per_mb

    def metrics(self, state) -> dict:
        p = self.last["probs"]
        return dict(theta=round(self.last["theta"], 5),
                    keep_probs=[round(v, 4) for v in p],
                    expected_blocks=round(sum(p), 4),
                    realised_blocks=round(self.last["realised"], 4),
                    expected_blocks_per_micro_batch=round(self.sum_expected_blocks / max(1, state.micro_batches), 4),
                    expected_flops=self.expected_flops)

    def state_dict(self) -> dict:
        return dict(last=self.last, sum_expected_blocks=self.sum_expected_blocks,
                    expected_flops=self.expected_flops)

    def load_state_dict(self, d: dict) -> None:
        self.last = d["last"]
        self.sum_expected_blocks = d["sum_expected_blocks"]
        self.expected_flops = d["expected_flops"]
