"""FLOPs accounting against a hand count."""
import torch

from accellib.flops import forward_flops, layer_tokens, train_step_flops
from accellib.model import BlockPlan, ModelConfig, Plan


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
