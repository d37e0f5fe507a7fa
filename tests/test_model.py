"""Exact properties of the model and its plan interface."""
import torch

from accellib.models.transformer import BlockPlan, ModelConfig, Plan, Transformer


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


# ----------------------------------------------------------------------------- MLM: the head on masked positions only
def mlm_batch(b=4, t=16, v=50, k=3, seed=1):
    from accellib.data.tokens import mask_tokens
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, v - 1, (b, t), generator=g)
    x, y = mask_tokens(x, v - 1, v, g, prob=k / t)
    assert torch.all((y != -100).sum(1) == k)
    return x, y


def grads(m, x, y, **kw):
    m.zero_grad(set_to_none=True)
    _, loss = m(x, y, **kw)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def plans(cfg):
    """No plan, a skipped + a scaled block, and random-LTD token subsets (which may drop masked positions)."""
    skip = Plan.full(cfg.n_layer)
    skip.blocks[0].run, skip.blocks[2].scale = False, 2.0
    keep = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(i))[:9].sort().values
                        for i in range(4)])
    return [None, skip, Plan([BlockPlan(), BlockPlan(keep=keep), BlockPlan()])]


def test_mlm_head_on_masked_positions_only_gives_the_same_loss_and_gradients():
    from accellib.models.transformer import labelled_positions
    for tie in (True, False):
        m, cfg = make("mlm", tie_head=tie)
        m.train()
        x, y = mlm_batch()
        pos = labelled_positions(y, 3)
        for plan in plans(cfg):
            loss_full, g_full = grads(m, x, y, plan=plan)
            loss_k, g_k = grads(m, x, y, plan=plan, positions=pos)
            torch.testing.assert_close(loss_k, loss_full, rtol=1e-6, atol=0)
            assert g_k.keys() == g_full.keys()
            for n in g_full:
                torch.testing.assert_close(g_k[n], g_full[n], rtol=1e-5, atol=1e-8, msg=n)
        logits, _ = m(x, positions=pos)
        assert logits.shape == (4, 3, 50)
        torch.testing.assert_close(logits, m(x)[0].gather(1, pos[..., None].expand(-1, -1, 50)))


def test_labelled_positions_hold_every_label():
    from accellib.models.transformer import labelled_positions
    y = torch.full((3, 10), -100)
    y[0, [1, 4, 9]] = 7          # exactly k = 3 labels
    y[1, [0]] = 5                # fewer: filled up with unlabelled positions
    pos = labelled_positions(y, 3)
    assert pos[0].tolist() == [1, 4, 9] and 0 in pos[1].tolist()
    assert all(len(set(r)) == 3 and r == sorted(r) for r in pos.tolist())


def test_mask_tokens_never_labels_more_than_the_heads_k():
    # labelled_positions' precondition: the task's k is exactly the number of labels mask_tokens makes
    from accellib.data.tokens import mask_tokens
    from accellib.core.tasks import mlm_labels_per_row
    for t in (1, 2, 7, 16, 33, 128, 512):
        for prob in (0.01, 0.15, 0.2, 0.5, 1.0):
            _, y = mask_tokens(torch.zeros(3, t, dtype=torch.long), 1, 5, torch.Generator().manual_seed(t), prob)
            assert torch.all((y != -100).sum(1) == mlm_labels_per_row(t, prob)), (t, prob)


def test_mlm_task_scores_masked_positions_only(tiny_cfg):
    from accellib.core.tasks import make_task
    cfg = tiny_cfg(**{"model.kind": "mlm"})
    task = make_task(cfg)
    task.configure()
    torch.manual_seed(0)
    model = task.build_model()
    x, y = task.batch(0, 0)
    k = task.head_tokens(32)
    assert k == round(0.15 * 32) == 5
    logits, loss, _ = task.forward(model, x, y, None)
    assert logits.shape == (8, k, cfg.model.vocab_size)
    torch.testing.assert_close(loss, model(x, y)[1], rtol=1e-6, atol=0)
    with torch.no_grad():   # the evaluation sums too: the same per-example losses as the full head
        xv, yv = task.eval_data()
        sums = task.eval_sums(model, xv, yv)
        full = torch.nn.functional.cross_entropy(model(xv)[0].transpose(1, 2), yv, reduction="none")
    torch.testing.assert_close(sums["loss"], full.sum(1), rtol=1e-5, atol=0)
    assert torch.equal(sums["count"], (yv != -100).sum(1).float())


# ----------------------------------------------------------------------------- vocabulary padding
def gpt2_like_folder(out, n_tokens=6000, seed=0):
    """A token folder laid out as data_scripts/prepare_hf.py --tokenizer gpt2 writes it: 50,257 tokenizer
    ids (the last is <|endoftext|>) + a [MASK] id 50257, so vocab_size 50,258. GPT-2's own tokenizer files
    need a download; a word-level tokenizer of the same size stands in for it (only its size and eos matter)."""
    import numpy as np
    from tokenizers import Tokenizer, models
    from data_scripts.tokenize_corpus import write_token_dataset
    vocab = {f"w{i}": i for i in range(50256)} | {"<|endoftext|>": 50256}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    rng = np.random.default_rng(seed)
    ids = lambda n: np.where(rng.random(n) < 0.05, 50256, rng.integers(0, 300, n)).astype(np.uint16)
    return write_token_dataset(out, ids(n_tokens), ids(n_tokens // 4),
                               dict(tokenizer="gpt2", vocab_size=50258, mask_id=50257, bytes_per_token=4.0,
                                    created_by="python data_scripts/prepare_hf.py --dataset text --tokenizer gpt2",
                                    source=dict(name="synthetic")),
                               {"tokenizer.json": tok.to_str().encode()})


def test_gpt2_data_pads_the_vocabulary_and_byte_data_keeps_its_size(tiny_data_dir, tmp_path, monkeypatch):
    from accellib.core import tasks
    from accellib.core.config import load_config
    from conftest import tiny_overrides
    gpt2 = gpt2_like_folder(tmp_path / "gpt2")
    drawn = []
    real_mask_tokens = tasks.mask_tokens
    monkeypatch.setattr(tasks, "mask_tokens", lambda x, mid, v, *a: drawn.append(v) or real_mask_tokens(x, mid, v, *a))
    for data, kind, vocab in ((gpt2, "gpt", 50304), (gpt2, "mlm", 50304),
                              (tiny_data_dir, "gpt", 257), (tiny_data_dir, "mlm", 257)):
        task = tasks.make_task(load_config(None, tiny_overrides(data, **{"model.kind": kind})))
        task.configure()
        assert task.cfg.model.vocab_size == vocab, (data, kind)
        x, y = task.batch(0, 0)
        assert x.max() < task.data.vocab_size and y.max() < task.data.vocab_size   # no padding id, ever
    # mask_tokens' random replacement ids come from the data's 50,258 ids, not the model's 50,304
    assert drawn == [50258, 257]
    # a causal LM's rows are sized from the real ids ([MASK] excluded): 64 real ids + [MASK] -> 64, not 128
    meta = dict(tokenizer="gpt2")
    small = lambda v, mask: type("D", (), dict(meta=meta, vocab_size=v, mask_id=mask))()
    assert tasks.model_vocab_size(small(65, 64), "gpt") == 64 and tasks.model_vocab_size(small(65, 64), "mlm") == 128
    assert tasks.model_vocab_size(small(50257, None), "gpt") == 50304


def test_an_mlm_training_step_reads_nothing_back_from_the_device(tiny_cfg, monkeypatch):
    # the masked positions are found on the device (topk), not by boolean indexing or nonzero
    from test_efficiency import _counted_steps, host_reads
    from accellib.core.trainer import Trainer
    reads = host_reads.__wrapped__(monkeypatch)
    tr = Trainer(tiny_cfg(**{"model.kind": "mlm", "train.steps": 4}))
    assert _counted_steps(tr, reads, 4) == []
    torch.zeros(1).item()
    assert len(reads) == 1   # the counter is live: a read here is seen
