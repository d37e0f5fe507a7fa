"""The standardization loss function: per-channel batch moments pulled toward N(0, 1).

The standardization loss of Collins, Ballé & Shlens, "Accelerating Training of Deep Neural Networks
with a Standardization Loss", arXiv 1903.00925 (2019), §3.

For a layer's pre-activations x (before the nonlinearity) with channels i = 1..n, the per-channel batch
moments mu_i and sigma_i^2 are computed as batch normalization computes them: the biased (maximum-
likelihood) mean and variance over every dimension but the channel (batch, and spatial positions or
sequence positions). The loss is the KL divergence of the diagonal Gaussian fit N(mu, diag sigma^2) to
N(0, I):

    L_std = 1/2 * sum_i (mu_i^2 + sigma_i^2 - log sigma_i^2 - 1)        >= 0, = 0 iff mu = 0, sigma = 1

so d L/d mu_i = mu_i and d L/d sigma_i^2 = (1 - 1/sigma_i^2) / 2. The paper sums it over layers and adds
w * sum to the task loss during training only; the network has no normalization layers at test time.
eps (ours; the paper gives none) floors the variance inside the log, so a dead channel stays finite
and the loss is still exactly 0 on whitened input.
"""
from __future__ import annotations

import torch


def channel_moments(x: torch.Tensor, channel_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased per-channel mean and variance over every other dimension (as batch norm computes them)."""
    dims = [d for d in range(x.dim()) if d != channel_dim % x.dim()]
    mu = x.mean(dims)
    var = (x - mu.view([-1 if d == channel_dim % x.dim() else 1 for d in range(x.dim())])).pow(2).mean(dims)
    return mu, var


def kl_to_standard(mu: torch.Tensor, var: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """1/2 sum_i (mu_i^2 + var_i - log var_i - 1): KL(N(mu, diag var) || N(0, I))."""
    return 0.5 * (mu.pow(2) + var - torch.log(var.clamp_min(eps)) - 1.0).sum()


def standardization_loss(x: torch.Tensor, channel_dim: int = -1, eps: float = 1e-5) -> torch.Tensor:
    """L_std of one layer's pre-activations: (B, C) for an MLP, (B, C, H, W) with channel_dim=1 for a
    CNN, (B, T, C) for a transformer (channel_dim=-1: moments over batch and sequence)."""
    mu, var = channel_moments(x.float(), channel_dim)
    return kl_to_standard(mu, var, eps)
