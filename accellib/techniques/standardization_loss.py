"""The `standardization_loss` technique: the standardization loss added at the model's pre-activations.

Standardization loss (Collins, Ballé & Shlens, "Accelerating Training of Deep Neural Networks with a
Standardization Loss", arXiv 1903.00925, 2019, §3): instead of normalising a layer's pre-activations, a
training-time loss pulls their per-channel batch moments toward N(0, 1):

    loss = task loss + w * sum over hooked layers of L_std(pre-activations)       (training only)
    L_std = 1/2 sum_i (mu_i^2 + sigma_i^2 - log sigma_i^2 - 1)                    (accellib/models/standardization.py)

* Where: every `PreAct` marker of the model, the pre-activation just before its nonlinearity
  (accellib/models/vision.py's CNN and MLP: after the conv / linear (and the norm layer, if any), before ReLU;
  the transformers: the MLP's c_fc output, before GELU). `layers` picks some of them by index.
* Moments: per channel over batch x spatial positions (CNN) or batch x sequence (transformer), biased,
  computed on this process's micro-batch only, never all-reduced: the paper computes them per core
  (its MobileNet runs, App.), and with gradient accumulation each micro-batch is one "core".
* Training only: the hooks record nothing in eval mode or without gradients, so evaluation and the
  exported model are exactly the plain network (tested).
* Where a term waits for the loss, ours: on its marker (`PreAct.std_term`), overwritten by each forward and
  summed in model order by `extra_loss`, outside any compiled region. Appended to a Python list inside a
  compiled block, Dynamo guarded on the list's length and compiled one graph per block position
  (tests/test_compile_graphs.py); a fixed slot per marker keeps train.compile=blocks at 2 graphs.
* The transformer variant, ours (not in the paper): model.norm=none removes every LayerNorm, and the
  loss acts on the MLP pre-activations, the one place a pre-LN block has a nonlinearity.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..core.options import ConfigError, opt
from ..models.transformer import PreAct
from ..models.standardization import standardization_loss
from . import register
from .base import Technique


@dataclass
class StandardizationLossConfig:
    enabled: bool = opt(False, "add the standardization loss of the pre-activations (Collins et al. 2019)")
    weight: float = opt(1.0, "w: the training loss is task + w * sum of the layers' L_std (paper: 1.0 for the "
                             "MNIST CNN/MLP, 1e-6 to 1e-3 for large networks)", min=0.0)
    layers: list[int] = opt([], "indices of the model's PreAct markers to hook, in model order; [] = all")
    eps: float = opt(1e-5, "floor of the variance inside the log (ours: keeps a dead channel finite)", min=0.0)

    def validate(self) -> None:
        if any(i < 0 for i in self.layers):
            raise ValueError(f"layers={self.layers} must be indices >= 0 of the model's pre-activations")


@register
class StandardizationLoss(Technique):
    name = "standardization_loss"
    Config = StandardizationLossConfig
    kinds = ("gpt", "mlm", "vit", "cnn", "mlp")
    needs = "pre-activation markers"
    # layered accumulation runs the layers of all micro-batches before any head: the loss of a layer
    # would be added to another micro-batch's head, across its detached segment boundaries
    incompatible = ("layered_accumulation",)

    def __init__(self, cfg, run_cfg):
        super().__init__(cfg, run_cfg)
        self.markers: list[PreAct] = []   # the hooked PreAct markers, in model order
        self.handles = []
        self.last = 0.0          # sum of L_std over the hooked layers, mean over the step's micro-batches
        self._step_sums: list[torch.Tensor] = []
        # L_std of one layer (x, channel_dim, eps) -> 0-dim tensor; notebook 08 sets its student's function here
        self.loss_fn = standardization_loss

    def setup(self, trainer) -> None:
        markers = [m for m in trainer.raw_model.modules() if isinstance(m, PreAct)]
        chosen = self.cfg.layers or list(range(len(markers)))
        if not markers or max(chosen) >= len(markers):
            raise ConfigError(f"standardization_loss.layers={self.cfg.layers} but the model has {len(markers)} "
                              f"pre-activation(s) (indices 0..{len(markers) - 1})")
        self.markers = [markers[i] for i in chosen]
        self.terms = []  # every slot empty
        self.handles = [m.register_forward_hook(self._record) for m in self.markers]
        # every forward of the whole model starts with no terms: a training-mode forward outside a step
        # (a student looking at the logits) must not add its L_std to the next step's loss
        trainer.raw_model.register_forward_pre_hook(lambda module, args: self._clear())

    def _record(self, module, inputs, out) -> None:
        if module.training and torch.is_grad_enabled():
            module.std_term = self.loss_fn(out, 1 if out.dim() == 4 else -1, self.cfg.eps)

    def _clear(self) -> None:
        for m in self.markers:
            m.std_term = None

    @property
    def terms(self) -> list[torch.Tensor]:
        """The L_std terms recorded since the model's last forward began, in model order (not yet in a loss)."""
        return [m.std_term for m in self.markers if m.std_term is not None]

    @terms.setter
    def terms(self, value: list) -> None:
        if list(value):
            raise ValueError("standardization_loss.terms can only be emptied (terms = [])")
        self._clear()

    def extra_loss(self, model, x, y, logits) -> Optional[torch.Tensor]:
        terms = self.terms
        if not terms:
            return None
        total = torch.stack(terms).sum()
        self._clear()
        self._step_sums.append(total.detach())
        return self.cfg.weight * total

    def step_end(self, trainer) -> None:
        if self._step_sums:  # kept on the device: read at log steps and checkpoints only (self.last)
            self._last = torch.stack(self._step_sums).mean()
        self._step_sums = []

    @property
    def last(self) -> float:
        """The last step's L_std (mean over its micro-batches), read from the device when asked for."""
        return float(self._last)

    @last.setter
    def last(self, value: float) -> None:
        self._last = value

    def metrics(self, state) -> dict:
        return dict(std_loss=round(self.last, 5))

    def state_dict(self) -> dict:
        return dict(last=self.last)

    def load_state_dict(self, d: dict) -> None:
        self.last = d["last"]
