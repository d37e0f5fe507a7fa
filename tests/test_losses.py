"""The chunked cross-entropy (accellib/models/losses.py): F.cross_entropy's value and gradient, in fp32 and
from bf16 logits, without keeping an fp32 copy of the logits for the backward pass."""
import pytest
import torch
import torch.nn.functional as F

from accellib.models.losses import cross_entropy


def case(n=37, v=11, dtype=torch.float32, ignore_every=3, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(n, v, generator=g)).to(dtype).requires_grad_(True)
    targets = torch.randint(v, (n,), generator=g)
    if ignore_every:
        targets[::ignore_every] = -100
    return logits, targets


def reference(logits, targets):
    """What lm_loss computed before: fp32 cross-entropy of an fp32 copy."""
    loss = F.cross_entropy(logits.float(), targets, ignore_index=-100)
    return loss, torch.autograd.grad(loss, logits)[0]


def ours(logits, targets, **kw):
    loss = cross_entropy(logits, targets, **kw)
    return loss, torch.autograd.grad(loss, logits)[0]


# chunks of 1 row, 3 rows (37 = 12 * 3 + 1: the last chunk is short), 5 rows, and one chunk for all
@pytest.mark.parametrize("chunk_elements", [1, 33, 55, 2 ** 24])
def test_fp32_equals_f_cross_entropy_with_ignored_rows(chunk_elements):
    logits, targets = case()
    (loss, grad), (ref, ref_grad) = ours(logits, targets, chunk_elements=chunk_elements), reference(logits, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-7)
    assert torch.all(grad[::3] == 0)   # ignored rows get no gradient


def test_batched_shapes_and_grad_output_scale():
    logits, targets = case(n=2 * 7, v=5)
    logits3, targets3 = logits.detach().view(2, 7, 5).requires_grad_(True), targets.view(2, 7)
    loss = cross_entropy(logits3, targets3, chunk_elements=10)
    (2.5 * loss).backward()
    ref, ref_grad = reference(logits, targets)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(logits3.grad.view(14, 5), 2.5 * ref_grad, rtol=1e-6, atol=1e-7)


def test_every_row_ignored_is_what_f_cross_entropy_returns():
    # F.cross_entropy's mean over no scored row is 0/0 = nan, with an all-zero (finite) gradient
    logits, targets = case(ignore_every=1)
    (loss, grad), (ref, ref_grad) = ours(logits, targets, chunk_elements=20), reference(logits, targets)
    assert torch.isnan(loss) and torch.isnan(ref)
    assert torch.equal(grad, torch.zeros_like(grad)) and torch.equal(ref_grad, grad)


def test_bf16_logits_match_the_fp32_copy_reference():
    logits, targets = case(n=64, v=1000, dtype=torch.bfloat16, ignore_every=5, scale=4.0)
    (loss, grad), (ref, ref_grad) = ours(logits, targets, chunk_elements=3000), reference(logits, targets)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)
    # the same fp32 values up to rounding order, then one rounding to bf16: at most 1 bf16 ulp apart
    tiny = torch.finfo(torch.bfloat16).tiny
    ulp = torch.exp2(torch.floor(torch.log2(ref_grad.float().abs().clamp_min(tiny))) - 7)
    assert torch.all((grad.float() - ref_grad.float()).abs() <= ulp)


def test_under_autocast_the_loss_is_still_computed_in_fp32():
    logits, targets = case(n=16, v=40, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grad = ours(logits, targets, chunk_elements=100)
    ref, ref_grad = reference(logits, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)


def saved_tensors(fn):
    """(dtype, shape) of every tensor autograd saves for backward while fn() runs."""
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_no_fp32_copy_of_the_logits_is_kept_for_backward():
    logits, targets = case(n=64, v=1000, dtype=torch.bfloat16)
    full = tuple(logits.shape)
    ref = saved_tensors(lambda: F.cross_entropy(logits.float(), targets, ignore_index=-100))
    assert (torch.float32, full) in ref   # the old way keeps an fp32 (N, V) log-softmax: the hook sees it
    saved = saved_tensors(lambda: cross_entropy(logits, targets, chunk_elements=3000))
    assert (torch.float32, full) not in saved
    big = [s for s in saved if len(s[1]) == 2]
    assert big == [(torch.bfloat16, full)]   # only the logits themselves; the rest is one value per row
    assert all(len(s[1]) <= 1 and (not s[1] or s[1][0] == 64) for s in saved if len(s[1]) != 2)


def test_gradcheck_float64():
    logits, targets = case(n=7, v=5, dtype=torch.float64, ignore_every=4)
    assert torch.autograd.gradcheck(lambda z: cross_entropy(z, targets, chunk_elements=10), (logits,))
