"""The vision models of issue 13: shapes, norms, PreAct markers, FLOPs count, ViT plans."""
from __future__ import annotations

import pytest
import torch

from accellib.models.transformer import ModelConfig, Plan
from accellib.models.vision import NORMS, ConvNet, MLPNet, PreAct, ViT, forward_flops


@pytest.mark.parametrize("norm", NORMS)
def test_cnn_and_mlp_shapes_and_preacts(norm):
    x = torch.randn(5, 1, 8, 8)
    cnn, mlp = ConvNet(1, 8, 10, norm), MLPNet(64, 10, norm)
    assert cnn(x).shape == (5, 10) and mlp(x).shape == (5, 10)
    assert sum(isinstance(m, PreAct) for m in cnn.modules()) == 3
    assert sum(isinstance(m, PreAct) for m in mlp.modules()) == 3
    if norm == "batch":  # shift only, as the paper's BN baselines
        assert not any(p.requires_grad for n, p in cnn.named_parameters() if n.endswith("1.weight"))


def test_cnn_flops_by_hand():
    cnn = ConvNet(1, 28, 10)   # the paper's MNIST CNN: 28 -> 14 -> 7 -> 4
    want = 2 * (14 * 14 * 32 * 25 * 1 + 7 * 7 * 16 * 25 * 32 + 4 * 4 * 8 * 25 * 16 + 10 * 128)
    assert forward_flops(cnn, torch.zeros(1, 1, 28, 28)) == want


def test_vit_runs_plans_and_skipping_all_blocks_is_identity_on_tokens():
    cfg = ModelConfig(kind="mlm", n_layer=3, n_head=2, d_model=16, seq_len=17)
    vit = ViT(cfg, 1, 8, 10, patch=2)
    x = torch.randn(4, 1, 8, 8)
    full = vit(x)
    assert torch.equal(full, vit(x, Plan.full(3)))
    plan = Plan.full(3)
    for b in plan.blocks:
        b.run = False
    assert not torch.allclose(vit(x, plan), full)   # blocks matter; skipping them still runs
    keep = torch.arange(0, 17, 2).expand(4, -1)    # a token subset (class token 0 kept)
    plan = Plan.full(3)
    plan.blocks[1].keep = keep
    assert vit(x, plan).shape == (4, 10)
