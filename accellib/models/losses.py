"""Cross-entropy over a large vocabulary without an fp32 copy of the logits.

`F.cross_entropy(logits.float(), targets)` on bf16 logits first makes a full fp32 copy of them (for
GPT-2 small, B=16, T=1024, V=50,304: 3.3 GB per micro-batch), and autograd then keeps the fp32
log-softmax of that copy (another 3.3 GB) until the backward pass. `cross_entropy` below computes the
same loss with the same fp32 arithmetic, but a chunk of rows at a time:

    forward   for each chunk of rows: upcast to fp32, logsumexp lse_i and the target's logit z_i,t;
              loss = sum over scored rows of (lse_i - z_i,t) / (number of scored rows)
    saved     the logits as they came (bf16: half the bytes of fp32), the targets, lse (one float per row)
    backward  for each chunk: softmax p = exp(z - lse) in fp32, p - onehot(t), times grad / n_scored,
              cast to the logits' dtype

So the largest fp32 temporary is one chunk, CHUNK_ELEMENTS floats (64 MiB), whatever B, T and V are.
This is the memory trick of fused / chunked cross-entropy kernels (e.g. Liger Kernel, Hsu et al. 2024,
arXiv:2410.10989; Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models",
arXiv:2411.09009) written in plain PyTorch: no custom kernel, so it runs on every device.

Rows whose target is `ignore_index` (-100: MLM's unmasked positions) contribute 0 and are not counted,
as in F.cross_entropy. If every row is ignored the loss is 0/0 = nan and every gradient is 0: exactly
what F.cross_entropy(reduction="mean") returns (tested).
"""
from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2 ** 24   # fp32 elements per chunk (64 MiB); rows per chunk = CHUNK_ELEMENTS // V
IGNORE_INDEX = -100


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit logits, the logits' own dtype for fp32 and fp64 (gradcheck runs in fp64)."""
    return torch.promote_types(dtype, torch.float32)


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits (N, V) against targets (N,), chunk by chunk (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        ct = _compute_dtype(logits.dtype)
        with torch.autocast(device_type=logits.device.type, enabled=False):
            valid = targets != IGNORE_INDEX
            safe = torch.where(valid, targets, 0)     # an ignored row reads column 0, then counts 0
            lse = torch.empty(len(logits), dtype=ct, device=logits.device)
            picked = torch.empty_like(lse)
            for s in range(0, len(logits), chunk_rows):
                z = logits[s:s + chunk_rows].to(ct)   # the only fp32 copy: one chunk
                lse[s:s + chunk_rows] = torch.logsumexp(z, dim=1)
                picked[s:s + chunk_rows] = z.gather(1, safe[s:s + chunk_rows, None]).squeeze(1)
            n_valid = valid.sum()
            loss = torch.where(valid, lse - picked, 0).sum() / n_valid   # 0/0 = nan when all are ignored
        ctx.save_for_backward(logits, safe, valid, lse, n_valid)
        ctx.chunk_rows = chunk_rows
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits, safe, valid, lse, n_valid = ctx.saved_tensors
        rows = ctx.chunk_rows
        with torch.autocast(device_type=logits.device.type, enabled=False):
            # d loss / d z_ij = (softmax_ij - [j == t_i]) / n_valid on scored rows, 0 on ignored ones
            # (clamp: with no scored row every weight is 0, so the gradient is 0, not 0 * inf = nan)
            weight = valid.to(lse.dtype) * (grad_loss.to(lse.dtype) / n_valid.clamp_min(1))
            grad = torch.empty_like(logits)
            for s in range(0, len(logits), rows):
                p = torch.exp(logits[s:s + rows].to(lse.dtype) - lse[s:s + rows, None])
                p.scatter_add_(1, safe[s:s + rows, None], p.new_full((len(p), 1), -1.0))
                grad[s:s + rows] = p.mul_(weight[s:s + rows, None])
        return grad, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """Mean cross-entropy of logits (..., V) against targets (...), ignoring targets == -100: the value
    (and gradient) of F.cross_entropy(logits.float(), targets, ignore_index=-100), computed in at least
    fp32, without ever holding the whole of the logits in fp32. Targets must be in [0, V) or -100."""
    V = logits.size(-1)
    rows = max(1, chunk_elements // V)
    return ChunkedCrossEntropy.apply(logits.reshape(-1, V), targets.reshape(-1), rows)
