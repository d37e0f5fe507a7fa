"""FLOPs accounting against a hand count."""
import torch

from accellib.analysis.flops import forward_flops, layer_tokens, train_step_flops
from accellib.models.transformer import BlockPlan, ModelConfig, Plan


def test_hand_count_one_block():
    # d=4, r=4, T=3, V=10, L=1, batch 1
    cfg = ModelConfig(vocab_size=10, seq_len=3, n_layer=1, n_head=1, d_model=4, mlp_ratio=4)
    qkv = 2 * 3 * 4 * 12          # 288
    attn = 2 * 3 * 3 * 4 * 2      # 144: scores and weighted sum
    proj = 2 * 3 * 4 * 4          # 96
    ffn = 2 * 3 * 4 * 16 * 2      # 768
    head = 2 * 3 * 4 * 10         # 240
    assert forward_flops(cfg, 1, 3) == qkv + attn + proj + ffn + head == 1536
    assert train_step_flops(cfg, 2, 3) == 3 * 2 * 1536


def test_plan_skips_and_token_subsets():
    cfg = ModelConfig(vocab_size=10, seq_len=8, n_layer=3, n_head=1, d_model=4)
    full = forward_flops(cfg, 1, 8)
    skip = Plan.full(3)
    skip.blocks[1].run = False
    one_block = forward_flops(ModelConfig(vocab_size=10, seq_len=8, n_layer=1, n_head=1, d_model=4), 1, 8) \
        - 2 * 8 * 4 * 10
    assert forward_flops(cfg, 1, 8, skip) == full - one_block
    sub = Plan([BlockPlan(), BlockPlan(keep=torch.zeros(1, 4, dtype=torch.long)), BlockPlan()])
    assert layer_tokens(sub, 3, 2, 8) == 2 * (8 + 4 + 8)
    assert layer_tokens(skip, 3, 2, 8) == 2 * 16


def test_a_masked_lms_head_counts_its_masked_positions_only():
    import pytest
    cfg = ModelConfig(kind="mlm", vocab_size=10, seq_len=3, n_layer=1, n_head=1, d_model=4, mlp_ratio=4)
    # the hand count above with the head on 1 of the 3 positions: 1536 - 240 + 2 * 1 * 4 * 10
    assert forward_flops(cfg, 1, 3, head_tokens=1) == 1376
    assert train_step_flops(cfg, 2, 3, head_tokens=1) == 3 * 2 * 1376
    with pytest.raises(ValueError, match="pass head_tokens"):
        forward_flops(cfg, 1, 3)     # an MLM's FLOPs without its k would count the head on every position


def test_bert_base_head_share():
    # BERT-base shape, T=512, k = round(0.15 * 512) = 77 masked positions per sequence
    cfg = ModelConfig(kind="mlm", vocab_size=30522, seq_len=512, n_layer=12, n_head=12, d_model=768)
    blocks = 12 * (2 * 512 * 768 * 2304 + 4 * 512 * 512 * 768 + 2 * 512 * 768 * 768 + 4 * 512 * 768 * 3072)
    assert blocks == 96_636_764_160
    assert forward_flops(cfg, 1, 512, head_tokens=512) == blocks + 24_003_477_504   # head: 19.9% of the forward
    assert forward_flops(cfg, 1, 512, head_tokens=77) == blocks + 3_609_897_984     # head: 3.6%


def test_lm_task_counts_the_mlm_head_on_k_positions(tiny_cfg):
    from accellib.core.tasks import make_task
    for kind, h in (("gpt", 32), ("mlm", 5)):            # tiny config: T=32, mlm_prob 0.15 -> k=5
        task = make_task(tiny_cfg(**{"model.kind": kind}))
        task.configure()
        m = task.cfg.model
        block = 2 * 32 * 32 * 96 + 4 * 32 * 32 * 32 + 2 * 32 * 32 * 32 + 4 * 32 * 32 * 128
        assert task.micro_flops(None) == 3 * 8 * (4 * block + 2 * h * 32 * 257) == train_step_flops(
            m, 8, 32, head_tokens=h)
