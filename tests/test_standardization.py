"""The standardization loss (Collins, Ballé & Shlens 2019): closed form, sign, zero point, gradients, axes, and the
technique's loss bit for bit."""
from __future__ import annotations

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from accellib.models.standardization import channel_moments, kl_to_standard, standardization_loss


def test_closed_form_equals_summed_kl_divergence():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, 3, 3, generator=g, dtype=torch.float64) * torch.rand(1, 5, 1, 1, dtype=torch.float64,
                                                                                generator=g) * 3 + 0.7
    mu, var = channel_moments(x, 1)
    want = kl_divergence(Normal(mu, var.sqrt()), Normal(torch.zeros_like(mu), torch.ones_like(var))).sum()
    assert torch.allclose(kl_to_standard(mu, var), want, rtol=1e-6, atol=1e-9)


def test_zero_on_whitened_input_and_positive_otherwise():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 7, generator=g, dtype=torch.float64)
    w = (x - x.mean(0)) / x.std(0, unbiased=False)          # exactly standardised per channel (biased variance)
    mu, var = channel_moments(w, -1)
    assert abs(kl_to_standard(mu, var).item()) < 1e-12
    for scale, shift in ((1.5, 0.0), (0.5, 0.0), (1.0, 0.3), (2.0, -1.0)):
        assert standardization_loss((w * scale + shift).float()).item() > 0


def test_gradients_in_mu_and_var():
    mu = torch.tensor([0.3, -1.2, 0.0], dtype=torch.float64, requires_grad=True)
    var = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64, requires_grad=True)
    kl_to_standard(mu, var).backward()
    assert torch.allclose(mu.grad, mu.detach())
    assert torch.allclose(var.grad, 0.5 * (1 - 1 / var.detach()))


def test_moments_are_biased_and_over_the_right_axes():
    x = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)          # (B, T, C): channels last
    mu, var = channel_moments(x, -1)
    flat = x.reshape(-1, 4)
    assert torch.equal(mu, flat.mean(0)) and torch.allclose(var, flat.var(0, unbiased=False))
    mu1, var1 = channel_moments(x, 1)                                    # (B, C, L): channels in dim 1
    assert torch.allclose(var1, x.transpose(1, 2).reshape(-1, 3).var(0, unbiased=False)) and mu1.shape == (3,)


@pytest.mark.parametrize("over", [{}, {"train.grad_accum": 2, "standardization_loss.layers": "[1, 3]",
                                       "standardization_loss.weight": 0.01}], ids=["all", "some-accumulated"])
def test_the_technique_adds_w_times_the_hooked_layers_terms_bitwise(tiny_cfg, over):
    """The terms wait on their markers (PreAct.std_term) between the forward and the loss, not in a list: the
    same losses, bit for bit, as a plain trainer whose loss adds w * (the terms in call order, stacked, summed)."""
    from accellib.core.trainer import Trainer
    from accellib.models.transformer import PreAct
    sl = Trainer(tiny_cfg(**{"model.norm": "none", "standardization_loss.enabled": True, **over}))
    ref = Trainer(tiny_cfg(**{"model.norm": "none", **{k: v for k, v in over.items() if "standardization" not in k}}))
    markers = [m for m in ref.raw_model.modules() if isinstance(m, PreAct)]
    hooked, w = ([1, 3], 0.01) if over else (range(len(markers)), 1.0)
    seen = []
    for i in hooked:
        markers[i].register_forward_hook(lambda m, i, o: seen.append(standardization_loss(o)))
    plain = ref.forward_loss

    def with_terms(x, y, plan):
        seen.clear()
        loss, total = plain(x, y, plan)
        return loss, total + w * torch.stack(seen).sum()
    ref.forward_loss = with_terms
    for _ in range(4):
        assert torch.equal(sl.train_step(), ref.train_step())
    assert all(torch.equal(p, q) for p, q in zip(sl.raw_model.parameters(), ref.raw_model.parameters()))
    assert sl.techniques[0].terms == [] and all(m.std_term is None for m in sl.techniques[0].markers)
