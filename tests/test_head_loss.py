"""The head and the loss compiled as one region (accellib.models.transformer.head_loss, train.compile=blocks): the value
and gradients of an fp32 reference, and with compile off the very numbers (bitwise) every cached CPU result
was made with."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accellib.models.transformer import ModelConfig, Transformer, compiled_head_loss, head_loss
from accellib.core.trainer import Trainer, compile_blocks


def model_and_batch(vocab=300, seed=0, kind="gpt"):
    torch.manual_seed(seed)
    m = Transformer(ModelConfig(kind=kind, vocab_size=vocab, seq_len=16, n_layer=2, n_head=2, d_model=32))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(vocab, (3, 16), generator=g)
    y = torch.randint(vocab, (3, 16), generator=g)
    y[:, ::5] = -100   # ignored positions, as MLM has
    return m, x, y


def grads(model, loss):
    return torch.autograd.grad(loss, [p for p in model.parameters()])


def fp32_reference(model, x, y):
    """The loss as written before the compiled head existed: logits, then F.cross_entropy in fp32."""
    h = model.embed(x)
    for b in model.blocks:
        h = b(h)
    logits = model.lm_head(model.transformer.ln_f(h))
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)


def test_compile_off_is_bitwise_the_loss_and_gradients_of_before():
    m, x, y = model_and_batch()
    assert m.head_loss_backend == ""
    _, loss = m(x, y)
    ref = fp32_reference(m, x, y)
    assert torch.equal(loss, ref)
    assert all(torch.equal(a, b) for a, b in zip(grads(m, loss), grads(m, ref)))


def test_compile_blocks_compiles_the_head_with_the_loss_and_keeps_fp32_numbers():
    m, x, y = model_and_batch()
    compile_blocks(m, backend="eager")  # Dynamo captures what inductor would compile, runs the same kernels
    assert m.head_loss_backend == "eager"
    torch._dynamo.reset()
    logits, loss = m(x, y)
    ref = fp32_reference(m, x, y)
    assert logits.shape == (3, 16, 300) and logits.dtype == torch.float32
    assert torch.equal(loss, ref)
    assert all(torch.equal(a, b) for a, b in zip(grads(m, loss), grads(m, ref)))
    assert list(m.state_dict()) == list(model_and_batch()[0].state_dict())   # checkpoints unchanged


def test_the_trainer_with_compile_off_never_enters_the_compiled_head(tiny_cfg, monkeypatch):
    called = []
    monkeypatch.setattr("accellib.models.transformer.compiled_head_loss", lambda backend: called.append(backend))
    tr = Trainer(tiny_cfg(**{"train.steps": 2}))
    tr.train_step()
    assert called == [] and tr.raw_model.head_loss_backend == ""


def test_trainer_losses_with_the_compiled_head_equal_the_eager_ones(tiny_cfg):
    torch._dynamo.reset()
    over = {"train.steps": 3}
    a = Trainer(tiny_cfg(**over))
    b = Trainer(tiny_cfg(**over, **{"train.compile": "blocks", "train.compile_backend": "eager"}))
    assert b.raw_model.head_loss_backend == "eager"
    for _ in range(3):
        assert torch.equal(a.train_step(), b.train_step())


@pytest.mark.parametrize("kind", ["gpt", "mlm"])
def test_inductor_bf16_head_loss_matches_an_fp32_reference(kind):
    """Inductor on bf16 autocast (the GPU configuration, run on the CPU): value and gradients within bf16's
    rounding of a float64 reference, and as close to it as the eager chunked loss the GPU path used before.
    (torch 2.13's F.linear_cross_entropy was 2.6% off in bf16 on a CPU: a tolerance of 0.5% catches that.)"""
    torch._dynamo.reset()
    torch.manual_seed(0)
    V, C, N = 1000, 64, 96
    ln_f, lm_head = torch.nn.LayerNorm(C), torch.nn.Linear(C, V, bias=False)
    torch.nn.init.normal_(lm_head.weight, 0, 0.2)
    x = torch.randn(2, N // 2, C, requires_grad=True)
    y = torch.randint(V, (2, N // 2))
    if kind == "mlm":
        y[:, ::3] = -100
    params = [x, ln_f.weight, ln_f.bias, lm_head.weight]

    def run(fn, dtype):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logits, loss = fn(ln_f, lm_head, x, y)
        return logits, loss, torch.autograd.grad(loss, params)

    ref64 = [p.detach().double().requires_grad_(True) for p in params]
    z = F.linear(F.layer_norm(ref64[0], (C,), ref64[1], ref64[2]), ref64[3])
    ref_loss = F.cross_entropy(z.reshape(-1, V), y.reshape(-1), ignore_index=-100)
    ref_grads = torch.autograd.grad(ref_loss, ref64)

    logits, loss, g = run(compiled_head_loss("inductor"), torch.bfloat16)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert abs(loss.item() - ref_loss.item()) <= 5e-3 * ref_loss.item()
    for got, want in zip(g, ref_grads):
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-2

    # the eager chunked path (accellib/models/losses.py via lm_loss) on the same bf16 autocast: no closer
    from accellib.models.transformer import lm_loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = lm_loss(lm_head(ln_f(x)), y)
    assert abs(loss.item() - ref_loss.item()) <= 2 * abs(eager.item() - ref_loss.item()) + 1e-3 * ref_loss.item()
    # and the uncompiled function is the fp32 expression exactly
    _, loss32, _ = run(head_loss, torch.float32)
    assert torch.equal(loss32, F.cross_entropy(lm_head(ln_f(x)).reshape(-1, V), y.reshape(-1), ignore_index=-100))
