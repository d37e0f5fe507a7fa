"""The `sbld` technique: Sensitivity-Based Layer Dropping.

Sensitivity-Based Layer Dropping (SBLD). Zeng, He, Vasyltsov, Pang & Chen, "Acceleration of
Large Transformer Model Training by Sensitivity-Based Layer Dropping", AAAI 2023
(doi 10.1609/aaai.v37i9.26321).

There is no official code and the paper body was not retrievable; what is known (abstract,
reviews) is: a pre-analysis measures each layer's sensitivity "with respect to changes in the
training loss"; the most sensitive layers go on a Block list (never dropped), the rest on an
Allow list; Algorithm 1 combines the sensitivities with the model's global keep ratio into a
keep-probability list; a "variance-based" scheduler (a poly-weighted exponential gamma
distribution, PWEGD) drives the global keep ratio over time. Everything below that is more
specific is OUR reconstruction, marked [ours]:

1. [ours] Train W steps without dropping (default W = max(2% of T, min(100, T/5))), then profile:
   on K fixed training batches, in eval mode, without gradients,
       s_l = mean_k max(loss_k(block l skipped) - loss_k(full), 0)      averaged over ranks
   Optional re-profiling every R steps on the same batches. [ours] A profile is one-off work between two
   steps (`Trainer.one_off`: its seconds go to the run's one_off_s, not to the steps' tokens/s; its FLOPs
   are charged to the step, `extra_flops`), and its forward passes run eagerly (the `force_eager`
   stance): with train.compile=blocks, eval mode without gradients would compile graphs of its own.
2. [ours] Block list = the ceil(beta * L) most sensitive blocks (or all with s_l >= tau * max s);
   ties broken by depth, the lower block counting as more sensitive.
3. Global keep ratio theta(t), t = steps since profiling: PLD's
       theta(t) = (1 - theta_bar) exp(-gamma t) + theta_bar
   or [ours] the variance option  theta(t) = theta_bar + (1 - theta_bar) f(t) / max f,
       f(t) = (a0 + a1 t + a2 t^2) t^(k-1) exp(-t / beta)            (our reading of PWEGD)
   with (a0, a1, a2, k, beta) fitted by `fit_pwegd` to a pilot's loss gap.
4. [ours] Algorithm 1: budget K(t) = theta(t) L executed blocks; Block list p = 1; the Allow
   list A shares K_A = max(K - |Block|, 0) with drop rates proportional to rank weights
   w (least sensitive = |A|, most = 1, normalised to mean 1):
       p_l = clip(1 - c w_l, p_min, 1),   c chosen so that sum_A p_l = K_A   (water-filling)
   If K < |Block| the Allow list is clamped to p_min and we warn. If every s_l is 0 we fall
   back to PLD's depth-linear prior.
5. [ours, as PLD] gate per block per micro-batch, residual x 1/p in training, full model in eval.

Reported by the paper (its reproducibility summary, the course's source document): GPT-3 1.7B / 3.6B
pre-training on 32 / 64 A100-80GB, BookCorpus, 10,000 steps; GPT-3 Medium with PLD and SBLD at
theta = 0.5 / 0.7 / 0.9 "for the same iterations"; -19.67% end-to-end time and +1.65% accuracy; Swin
V2-L fine-tuning 35% less time, 3.86 h with 20 epochs vs 5.97 h with 30 epochs, Top-1 87.62% vs
87.60%. Per epoch that is 0.193 h vs 0.199 h (3% less): most of the 35% is the shorter schedule
(notebook 02, section 6).

`keep_prob_list_fn` (None by default: `keep_prob_list`, bit for bit) replaces Algorithm 1's list (step 4):
fn(theta, sens, block, p_min) -> [p_1, ..., p_L], the signature of notebook 02's your-turn `my_keep_prob_list`.
`keep_prob_list` calls it (as `fill`, on copies) where step 4's water-filling runs; its two fallbacks (all-zero s,
a budget below the Block list + p_min) stay accellib's. Set it on a trainer's technique instance; the gates, the 1/p scale and the FLOPs bookkeeping then use its list.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from ..core.options import opt
from ..data.tokens import generator_for
from ..models.transformer import Plan
from . import register
from ._layer_drop_common import LayerDropTechnique, depth_keep_probs, pld_theta

_PROFILE_TAG = 0x5B1D  # the profiling batches' own data stream, fixed for the whole run


# ----------------------------------------------------------------------------- lists (Algorithm 1)
def block_list(sens: list[float], fraction: float, threshold: float = 0.0) -> list[int]:
    """Indices of the Block list (never dropped), most sensitive first; ties -> lower block first."""
    L = len(sens)
    order = sorted(range(L), key=lambda l: (-sens[l], l))
    if max(sens) <= 0:
        return []
    if threshold > 0:
        return [l for l in order if sens[l] >= threshold * max(sens)]
    return order[:max(1, math.ceil(fraction * L))]


def keep_prob_list(theta: float, sens: list[float], block: list[int], p_min: float = 0.1,
                   warn: bool = True, fill: Optional[Callable] = None) -> list[float]:
    """Keep probability of each block under the budget sum_l p_l = theta * L (module doc, step 4). `fill`, when
    given, replaces step 4's water-filling (fill(theta, sens, block, p_min) -> the list, called on copies); the two
    fallbacks below stay these."""
    L = len(sens)
    if max(sens) <= 0:  # nothing measurable: PLD's depth-linear prior
        if warn:
            warnings.warn("SBLD: every sensitivity is 0; using PLD's depth-linear keep probabilities")
        return depth_keep_probs(theta, L, "paper")
    allow = [l for l in range(L) if l not in block]
    p = [1.0] * L
    if not allow:
        return p
    budget = theta * L - len(block)                      # K_A = K(t) - |Block|
    if budget < len(allow) * p_min - 1e-9:
        if warn:
            warnings.warn(f"SBLD: budget theta*L = {theta * L:.2f} blocks cannot cover the Block list "
                          f"({len(block)}) plus p_min={p_min} for the Allow list; clamping Allow-list "
                          f"blocks to p_min (more blocks run than theta asks for)")
        for l in allow:
            p[l] = p_min
        return p
    if fill is not None:
        return list(fill(theta, list(sens), list(block), p_min))
    # rank weights: least sensitive (ties: higher block) gets |A|, most sensitive gets 1; mean 1
    by_sens = sorted(allow, key=lambda l: (sens[l], -l))
    n = len(allow)
    w = {l: (n - r) / ((n + 1) / 2) for r, l in enumerate(by_sens)}
    # water-filling: sum_A clip(1 - c w_l, p_min, 1) falls monotonically in c; bisect for = budget
    total = lambda c: sum(min(1.0, max(p_min, 1.0 - c * w[l])) for l in allow)
    lo, hi = 0.0, (1.0 - p_min) / min(w.values())
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) > budget else (lo, mid)
    for l in allow:
        p[l] = min(1.0, max(p_min, 1.0 - hi * w[l]))
    return p


# ----------------------------------------------------------------------------- variance scheduler
def pwegd(t, params) -> np.ndarray:
    """f(t) = (a0 + a1 t + a2 t^2) t^(k-1) exp(-t/beta), our reading of SBLD's PWEGD."""
    a0, a1, a2, k, beta = params
    t = np.asarray(t, dtype=float)
    return (a0 + a1 * t + a2 * t * t) * np.power(np.maximum(t, 1e-12), k - 1) * np.exp(-t / beta)


def fit_pwegd(t, v, ks=(1.0, 1.5, 2.0, 3.0), betas=None) -> list[float]:
    """Least-squares fit of PWEGD to a loss-gap curve v(t): linear in (a0, a1, a2) for each (k, beta)
    on a small grid. Returns [a0, a1, a2, k, beta]."""
    t, v = np.asarray(t, float), np.asarray(v, float)
    betas = betas if betas is not None else [t.max() * f for f in (0.05, 0.1, 0.2, 0.4, 0.8)]
    best = None
    for k in ks:
        for beta in betas:
            base = np.power(np.maximum(t, 1e-12), k - 1) * np.exp(-t / beta)
            X = np.stack([base, t * base, t * t * base], 1)          # (n, 3)
            coef, *_ = np.linalg.lstsq(X, v, rcond=None)
            err = float(((X @ coef - v) ** 2).sum())
            if best is None or err < best[0]:
                best = (err, [*map(float, coef), float(k), float(beta)])
    return best[1]


@dataclass
class SBLDConfig:
    enabled: bool = opt(False, "Sensitivity-Based Layer Dropping (Zeng et al. 2023); reconstruction")
    theta_bar: float = opt(0.5, "floor of the global keep ratio theta(t)", min=0.05, max=1.0)
    gamma: float = opt(0.001, "decay rate of PLD's theta(t) per step after profiling", min=0.0, horizon="rate")
    schedule: str = opt("pld", "global schedule: pld (default) or variance (PWEGD, needs variance_params)",
                        choices=["pld", "variance"])
    variance_params: list[float] = opt([], "[a0, a1, a2, k, beta] of the PWEGD curve (fit_pwegd), steps since profiling")
    profile_step: int = opt(-1, "profile after this many steps without dropping; -1 = auto "
                                "max(2% of train.steps, min(100, steps/5)); 0 = at init", min=-1, horizon="steps")
    profile_batches: int = opt(8, "fixed training batches used for profiling (per process)", min=1)
    reprofile_every: int = opt(0, "re-profile every N steps after the first profile; 0 = never", min=0,
                              horizon="steps")
    block_fraction: float = opt(0.25, "Block list = this fraction of blocks (at least 1), most sensitive",
                                min=0.0, max=0.99)
    block_threshold: float = opt(0.0, "if > 0: Block list = blocks with s_l >= this * max s (replaces the fraction)",
                                 min=0.0, max=1.0)
    p_min: float = opt(0.1, "lowest keep probability of an Allow-list block", min=0.01, max=1.0)
    scale_by_inverse_p: bool = opt(True, "scale kept residual branches by 1/p_l (assumed, as PLD)")
    zero_fill: bool = opt(False, "give skipped blocks zero gradients as DeepSpeed did")

    def validate(self):
        if self.schedule == "variance" and len(self.variance_params) != 5:
            raise ValueError("schedule=variance needs variance_params=[a0, a1, a2, k, beta] "
                             "(fit them with accellib.techniques.sensitivity_layer_drop.fit_pwegd)")


@register
class SensitivityLayerDrop(LayerDropTechnique):
    name = "sbld"
    Config = SBLDConfig
    keep_prob_list_fn: Optional[Callable] = None  # fn(theta, sens, block, p_min) -> [p_1..p_L] (step 4, Algorithm 1)

    def __init__(self, cfg, run_cfg):
        super().__init__(cfg, run_cfg)
        T = run_cfg.train.steps
        self.W = cfg.profile_step if cfg.profile_step >= 0 else max(math.ceil(0.02 * T), min(100, T // 5))
        self.sensitivity: Optional[list[float]] = None
        self.block: list[int] = []
        self.profiled_at: list[int] = []
        self._cache: dict[int, list[float]] = {}
        self._fmax = None
        self._warned = False
        self._previewing = False   # preview(): stand-in profile, never profile

    # ---------------------------------------------------------------- schedule
    def theta(self, step: int) -> float:
        if self.sensitivity is None or step < self.W:
            return 1.0
        t = step - self.W
        if self.cfg.schedule == "pld":
            return pld_theta(t, self.cfg.theta_bar, self.cfg.gamma)
        if self._fmax is None:  # max of f over the run, for f / max f in [0, 1]
            self._fmax = max(float(pwegd(np.arange(self.run_cfg.train.steps + 1), self.cfg.variance_params).max()), 1e-12)
        f = float(pwegd(t, self.cfg.variance_params)) / self._fmax
        return self.cfg.theta_bar + (1 - self.cfg.theta_bar) * min(1.0, max(0.0, f))

    def keep_probs(self, step: int) -> list[float]:
        if self.sensitivity is None or step < self.W:
            return [1.0] * self.n_layer
        if step not in self._cache:
            p = keep_prob_list(self.theta(step), self.sensitivity, self.block, self.cfg.p_min,
                               warn=not self._warned, fill=self.keep_prob_list_fn)
            if len(p) != self.n_layer:
                raise ValueError(f"sbld: keep_prob_list_fn returned {len(p)} keep probabilities for "
                                 f"{self.n_layer} blocks")
            self._cache = {step: p}
            self._warned = True
        return self._cache[step]

    # ---------------------------------------------------------------- profiling
    def _profile_batches(self, trainer) -> list:
        c, acc = self.run_cfg, trainer.accelerator
        out = []
        for k in range(self.cfg.profile_batches):
            g = generator_for(self.seed, _PROFILE_TAG, k, acc.process_index)
            x, y = trainer.task.sample(g)
            out.append((x.to(acc.device), y.to(acc.device)))
        return out

    @torch.no_grad()
    def profile(self, trainer) -> list[float]:
        """s_l = mean_k max(loss(skip l) - loss(full), 0) on the fixed batches, eval mode, mean over ranks."""
        model, acc = trainer.raw_model, trainer.accelerator
        was_training = model.training
        model.eval()
        L = self.n_layer
        rows = []
        for x, y in self._profile_batches(trainer):
            row = []
            for skip in [None] + list(range(L)):
                plan = Plan.full(L)
                if skip is not None:
                    plan.blocks[skip].run = False
                # compiled blocks run their eager code: no graph for eval mode without gradients (issue 42)
                with acc.autocast(), torch.compiler.set_stance("force_eager"):
                    row.append(trainer.task.forward(model, x, y, plan)[1].float())
            rows.append(torch.stack(row))                          # (L+1,)
        losses = torch.stack(rows)                                 # (K, L+1)
        s = (losses[:, 1:] - losses[:, :1]).clamp_min(0).mean(0)   # (L,)
        s = acc.reduce(s.to(acc.device), "mean").cpu()
        model.train(was_training)
        self.sensitivity = s.tolist()  # one host read per profiling: the plan is decided on the host
        self.block = block_list(self.sensitivity, self.cfg.block_fraction, self.cfg.block_threshold)
        self.profiled_at.append(trainer.state.step)
        self._cache, self._warned = {}, False
        return self.sensitivity

    # ---------------------------------------------------------------- hooks
    def setup(self, trainer) -> None:
        super().setup(trainer)
        if self.W == 0 and self.sensitivity is None:
            trainer.one_off("sbld_profile", lambda: self.profile(trainer))

    def preview(self) -> None:
        # equal sensitivities: a keep list with the same budget sum_l p_l = theta(t) L (so the same
        # expected FLOPs) as any trained profile, and no profiling
        self.sensitivity = [1.0] * self.n_layer
        self.block = block_list(self.sensitivity, self.cfg.block_fraction, self.cfg.block_threshold)
        self._previewing = True

    def profiles_at(self, s: int) -> bool:
        """Whether a profile runs at the end of optimizer step s (one at setup when W = 0, charged to step 1)."""
        R = self.cfg.reprofile_every
        return (s == self.W if self.W > 0 else s == 1) or bool(R and s > self.W and (s - self.W) % R == 0)

    def step_end(self, trainer) -> None:
        super().step_end(trainer)
        s, R = trainer.state.step, self.cfg.reprofile_every
        if self._previewing:
            return
        if s == self.W or (R and s > self.W and (s - self.W) % R == 0):  # outside the step's time (module doc, 1)
            trainer.one_off("sbld_profile", lambda: self.profile(trainer))

    def extra_flops(self, step: int, task) -> float:
        """One profile's forward passes: profile_batches x (the full model + each of the L one-block-skipped
        models), one micro-batch each, at a third of a training micro-batch's FLOPs (forward only)."""
        if not self.profiles_at(step):
            return 0.0
        plans = [Plan.full(self.n_layer)]
        for skip in range(self.n_layer):
            p = Plan.full(self.n_layer)
            p.blocks[skip].run = False
            plans.append(p)
        return self.cfg.profile_batches * sum(task.micro_flops(p) for p in plans) / 3

    def metrics(self, state) -> dict:
        out = super().metrics(state)
        if self.sensitivity is not None:
            out.update(sensitivity=[round(v, 5) for v in self.sensitivity], block_list=list(self.block))
        return out

    def state_dict(self) -> dict:
        return dict(super().state_dict(), sensitivity=self.sensitivity, block=self.block,
                    profiled_at=self.profiled_at)

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.sensitivity, self.block, self.profiled_at = d["sensitivity"], d["block"], d["profiled_at"]
        self._cache = {}
