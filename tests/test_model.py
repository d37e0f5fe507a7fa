"""Exact properties of the model and its plan interface."""
import torch

from accellib.model import BlockPlan, ModelConfig, Plan, Transformer


def make(kind="gpt", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(kind=kind, vocab_size=50, seq_len=16, n_layer=3, n_head=2, d_model=16, **kw)
    return Transformer(cfg).eval(), cfg


def test_full_plan_equals_no_plan_bitwise():
    for kind in ("gpt", "mlm"):
        m, cfg = make(kind)
        x = torch.randint(0, 50, (4, 16))
        a, _ = m(x)
        b, _ = m(x, plan=Plan.full(cfg.n_layer))
        assert torch.equal(a, b)


def test_keep_all_tokens_equals_plain_model():
    m, cfg = make()
    x = torch.randint(0, 50, (2, 16))
    keep = torch.arange(16).expand(2, 16)
    plan = Plan([BlockPlan(keep=keep) for _ in range(cfg.n_layer)])
    torch.testing.assert_close(m(x, plan=plan)[0], m(x)[0], rtol=0, atol=1e-6)


def test_skipped_block_is_identity_and_gets_no_grad():
    m, cfg = make()
    m.train()
    x = torch.randint(0, 50, (2, 16))
    plan = Plan.full(cfg.n_layer)
    plan.blocks[1].run = False
    _, loss = m(x, x, plan=plan)
    loss.backward()
    assert all(p.grad is None for p in m.blocks[1].parameters())
    assert all(p.grad is not None for p in m.blocks[0].parameters())
    # identity: a model whose block 1 is skipped equals a 2-block model with the same other weights
    m2_cfg = ModelConfig(kind="gpt", vocab_size=50, seq_len=16, n_layer=2, n_head=2, d_model=16)
    m2 = Transformer(m2_cfg).eval()
    sd = {k: v for k, v in m.state_dict().items() if not k.startswith("transformer.h.1.")}
    sd = {k.replace("transformer.h.2.", "transformer.h.1."): v for k, v in sd.items()}
    m2.load_state_dict(sd)
    m.eval()
    torch.testing.assert_close(m(x, plan=plan)[0], m2(x)[0], rtol=0, atol=0)


def test_residual_scale_scales_branches():
    m, cfg = make()
    x = torch.randn(2, 16, 16)
    blk = m.blocks[0]
    h = x + 2.0 * blk.attn(blk.ln_1(x))
    expect = h + 2.0 * blk.mlp(blk.ln_2(h))
    torch.testing.assert_close(blk(x, 2.0), expect)


def test_causal_model_has_no_future_leak_and_mlm_does():
    for kind, leaks in (("gpt", False), ("mlm", True)):
        m, _ = make(kind)
        emb = m.transformer.wte(torch.randint(0, 50, (1, 16))).detach().requires_grad_(True)
        x = emb + m.transformer.wpe(torch.arange(16))
        for b in m.blocks:
            x = b(x)
        x[0, 5].sum().backward()
        future = emb.grad[0, 6:].abs().sum().item()
        assert (future > 0) == leaks


def test_untied_head_has_own_weight_and_param_names_match_gpt2():
    m, _ = make(tie_head=False)
    assert m.lm_head.weight.data_ptr() != m.transformer.wte.weight.data_ptr()
    names = set(m.state_dict())
    for n in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
              "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight",
              "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight",
              "transformer.ln_f.weight", "lm_head.weight"):
        assert n in names


def test_loss_ignores_minus_100():
    m, _ = make("mlm")
    x = torch.randint(0, 50, (2, 16))
    y = torch.full_like(x, -100)
    y[:, 3] = x[:, 3]
    logits, loss = m(x, y)
    ref = torch.nn.functional.cross_entropy(logits[:, 3], x[:, 3])
    torch.testing.assert_close(loss, ref)
