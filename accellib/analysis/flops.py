"""Analytic FLOPs of a training step under a plan: the x-axis of every comparison.

Counting convention (Kaplan et al. 2020, §2.1; PaLM App. B), per sequence, one multiply-add = 2 FLOPs:
  block forward on n tokens, width d, FFN hidden r*d:
      QKV projections   2 * n * d * 3d
      scores  Q K^T     2 * n * n * d      (the full n x n square: SDPA's math kernel computes it,
      weights x V       2 * n * n * d       causal or not)
      output proj       2 * n * d * d
      FFN               2 * n * d * rd * 2
  LM head              2 * h * d * V       (h = the positions the head scores, never dropped by a plan:
                                            all T for a causal LM; for a masked LM only its k =
                                            max(1, round(mlm_prob * T)) masked positions, which is all
                                            Transformer.forward scores with `positions`)
  backward = 2 x forward, so a training step = 3 x forward.
LayerNorm, GELU, softmax, embeddings and the optimizer are left out (< 2% at our sizes).
A skipped block costs 0; a block that sees k of T tokens costs block_forward(k).
"""
from __future__ import annotations

from typing import Optional

from ..models.transformer import ModelConfig, Plan


def block_forward_flops(cfg: ModelConfig, n_tokens: int) -> int:
    d, n, r = cfg.d_model, n_tokens, cfg.mlp_ratio
    return 2 * n * d * 3 * d + 4 * n * n * d + 2 * n * d * d + 4 * n * d * r * d


def head_forward_flops(cfg: ModelConfig, n_tokens: int) -> int:
    """The vocabulary projection on n_tokens scored positions of one sequence."""
    return 2 * n_tokens * cfg.d_model * cfg.vocab_size


def block_tokens(plan: Optional[Plan], n_layer: int, seq_len: int) -> list[int]:
    """Tokens each block processes per sequence under `plan` (0 for a skipped block)."""
    if plan is None:
        return [seq_len] * n_layer
    return [0 if not b.run else (seq_len if b.keep is None else int(b.keep.shape[-1]))
            for b in plan.blocks]


def forward_flops(cfg: ModelConfig, batch: int, seq_len: int, plan: Optional[Plan] = None,
                  head_tokens: Optional[int] = None) -> int:
    """Forward FLOPs of `batch` sequences; the head scores `head_tokens` positions of each (a masked
    LM's k: LMTask.head_tokens), all seq_len when None. A masked LM must say how many."""
    if head_tokens is None:
        if cfg.kind == "mlm":
            raise ValueError("a masked LM's head scores only its masked positions: pass head_tokens "
                             "(accellib.core.tasks.mlm_labels_per_row(seq_len, mlm_prob))")
        head_tokens = seq_len
    per_seq = sum(block_forward_flops(cfg, n) for n in block_tokens(plan, cfg.n_layer, seq_len) if n)
    return batch * (per_seq + head_forward_flops(cfg, head_tokens))


def train_step_flops(cfg: ModelConfig, batch: int, seq_len: int, plan: Optional[Plan] = None,
                     head_tokens: Optional[int] = None) -> int:
    """Forward + backward FLOPs of one micro-batch of `batch` sequences under `plan`."""
    return 3 * forward_flops(cfg, batch, seq_len, plan, head_tokens)


def layer_tokens(plan: Optional[Plan], n_layer: int, batch: int, seq_len: int) -> int:
    """LayerTokens of one micro-batch: sum over blocks of tokens that block processed
    (random-LTD's compute measure, Yao et al. 2022, §3.2)."""
    return batch * sum(block_tokens(plan, n_layer, seq_len))
