"""Image classifiers: the MNIST CNN and MLP (with a norm choice) and a small ViT of transformer Blocks.

Image classifiers for the vision task: the MNIST CNN and MLP of Collins, Ballé & Shlens (arXiv
1903.00925, appendix: 3 conv layers of 32/16/8 filters, 5x5, stride 2, ReLU; 3 x 100 ReLU), each with
norm = none | batch | layer | group, and a small ViT built from accellib's transformer Block (so the
block-level techniques' plans apply to it).

Every nonlinearity is preceded by a `PreAct` marker: the pre-activation the standardization loss reads
(after the normalisation layer when there is one, so with norm=none it is the conv/linear output).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .transformer import Block, ModelConfig, Plan, PreAct, SelfAttention, init_weights, layer_norm, run_block

NORMS = ("none", "batch", "layer", "group")


def norm_layer(kind: str, channels: int, spatial: bool) -> nn.Module:
    """none; batch (shift only, as the paper's BN baselines before a ReLU); layer (all channels of a sample);
    group (groups of 4 channels, GN's default group size of 32 scaled to these widths)."""
    if kind == "none":
        return nn.Identity()
    if kind == "batch":
        bn = (nn.BatchNorm2d if spatial else nn.BatchNorm1d)(channels)
        bn.weight.requires_grad_(False)          # shift only: the scale stays 1
        return bn
    if kind == "layer":
        return nn.GroupNorm(1, channels) if spatial else nn.LayerNorm(channels)
    if kind == "group":
        return nn.GroupNorm(max(1, channels // 4), channels)
    raise ValueError(f"norm={kind!r} is not one of {', '.join(NORMS)}")


class ConvNet(nn.Module):
    """Conv(5x5, stride 2) -> norm -> ReLU, three times (32, 16, 8 filters), then a linear classifier."""

    def __init__(self, channels: int, image_size: int, n_classes: int, norm: str = "none",
                 widths: tuple[int, ...] = (32, 16, 8)):
        super().__init__()
        layers, c, s = [], channels, image_size
        for w in widths:
            layers += [nn.Conv2d(c, w, 5, stride=2, padding=2), norm_layer(norm, w, True), PreAct(), nn.ReLU()]
            c, s = w, (s + 1) // 2
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c * s * s, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class MLPNet(nn.Module):
    """Flatten -> (Linear -> norm -> ReLU) x depth -> Linear."""

    def __init__(self, in_features: int, n_classes: int, norm: str = "none", hidden: int = 100, depth: int = 3):
        super().__init__()
        layers, d = [nn.Flatten()], in_features
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), norm_layer(norm, hidden, False), PreAct(), nn.ReLU()]
            d = hidden
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(d, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class ViT(nn.Module):
    """Patch embedding + a class token + learned positions, accellib's pre-LN Blocks (bidirectional
    attention), final LayerNorm, a linear head on the class token. forward(x, plan) runs the blocks
    under a Plan like the language model does (skip / scale / token subset per block). The blocks and
    the final LayerNorm carry the language model's names (transformer.h.{i}..., transformer.ln_f), so the
    multi-level operators (accellib/techniques/multilevel.py) map a ViT as they map a GPT."""

    def __init__(self, cfg: ModelConfig, channels: int, image_size: int, n_classes: int, patch: int):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch}")
        self.cfg = cfg
        n = (image_size // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.pos = nn.Parameter(torch.randn(1, n + 1, cfg.d_model) * cfg.init_std)
        self.transformer = nn.ModuleDict(dict(
            patch=nn.Conv2d(channels, cfg.d_model, patch, stride=patch),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=layer_norm(cfg)))
        self.head = nn.Linear(cfg.d_model, n_classes)
        init_weights(self, cfg)     # the language model's init (the patch convolution keeps torch's)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.h

    def forward(self, x: torch.Tensor, plan: Optional[Plan] = None) -> torch.Tensor:
        t = self.transformer.patch(x).flatten(2).transpose(1, 2)          # (B, n, d)
        t = torch.cat([self.cls.expand(t.size(0), -1, -1), t], 1) + self.pos
        for i, block in enumerate(self.blocks):
            t = run_block(block, t, None if plan is None else plan.blocks[i])
        return self.head(self.transformer.ln_f(t[:, 0]))


def build_model(cfg: ModelConfig, channels: int, image_size: int, n_classes: int) -> nn.Module:
    """The image classifier of model.kind (cnn | mlp | vit) for images of channels x image_size^2."""
    if cfg.kind == "cnn":
        return ConvNet(channels, image_size, n_classes, cfg.norm)
    if cfg.kind == "mlp":
        return MLPNet(channels * image_size * image_size, n_classes, cfg.norm)
    if cfg.kind == "vit":
        return ViT(cfg, channels, image_size, n_classes, cfg.patch)
    raise ValueError(f"model.kind={cfg.kind!r} is not an image classifier (cnn, mlp or vit)")


@torch.no_grad()
def forward_flops(model: nn.Module, example: torch.Tensor) -> int:
    """Multiply-add FLOPs (2 per MAC) of one forward pass on `example` (one sample or a batch), counted
    from the Conv2d and Linear layers it runs and the attention products of ViT blocks; a training
    step is 3x this (backward = 2x forward)."""
    total = 0

    def conv(m, i, o):
        nonlocal total
        total += 2 * o.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def lin(m, i, o):
        nonlocal total
        total += 2 * o.numel() * m.in_features

    def attn(m, i, o):
        nonlocal total
        B, T, C = i[0].shape
        total += 4 * B * T * T * C        # scores and weights x V over the full square
    hooks = [m.register_forward_hook(conv if isinstance(m, nn.Conv2d) else lin if isinstance(m, nn.Linear) else attn)
             for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear, SelfAttention))]
    was = model.training
    model.eval()
    try:
        model(example)
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    return total
