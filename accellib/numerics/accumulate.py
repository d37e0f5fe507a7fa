"""Sequential accumulation in a narrow floating-point format, naive or chunk-based.

Chunk-based accumulation (Wang et al., NeurIPS 2018, arXiv 1812.08011; named in its abstract): the n terms
of a dot product are split into ceil(n / CL) chunks of CL consecutive terms; each chunk is summed
sequentially in the accumulator format, rounding after every add; then the chunk sums are summed
sequentially, in the same format or a wider second accumulator (`outer`). Every partial sum stays
short, so a small addend is not "swamped" (rounded away) by a large running sum.

    s = accumulate(terms, E6M9)              # naive: s_i = Q(s_{i-1} + t_i), along dim 0
    s = accumulate(terms, E6M9, chunk=64)    # chunks of 64, then the 64-sums
    c = matmul(a, b, E6M9, chunk=64)         # a @ b with that accumulation along K

chunk = 0 or chunk >= n is the naive sum, and so is chunk = 1 for terms already in the format
(each chunk is then Q(0 + t) = t). The loops run over the accumulation index only, CL + n/CL
Python steps; every step is one vectorised add-and-round over all sums at once (all chunks,
all output elements). The running sums start at exact zero, and a padded zero term changes nothing.

Exactness: each add is computed in float32 and then rounded to the format. That equals rounding the
exact sum once whenever both addends have at most 11 significant bits (a first rounding to 24 >= 2p + 2
bits cannot create a false tie; Figueroa, "When is double rounding innocuous?", 1995): so a (1,6,9)
running sum plus a product of two FP8 numbers (at most 8 significant bits) is emulated exactly
(tests/test_numerics_formats.py). With full-width float32 addends a false tie is possible: 2 sums in
200,000 differ by one unit there. Stochastic rounding sees the float32 sum, so bits of an addend more
than 18 binades below the running sum are lost before the draw (a bias below 2^-14 of a quantum).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .formats import Format, parse_format, quantize


def _chunk_length(n: int, chunk: int) -> int:
    if n < 1:
        raise ValueError("nothing to accumulate: the accumulation length is 0")
    if chunk < 0:
        raise ValueError(f"chunk={chunk}: use 0 (naive) or a positive chunk length")
    return n if chunk == 0 or chunk >= n else chunk


def _grouped(x: torch.Tensor, cl: int) -> torch.Tensor:
    """(n, *rest) -> (ceil(n / cl), cl, *rest), the last chunk padded with zero terms."""
    pad = -x.shape[0] % cl
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    return x.reshape(-1, cl, *x.shape[1:])


def _chunked(term: Callable[[int], torch.Tensor], cl: int, fmt: Format, outer: Format,
             rounding: str, generator: Optional[torch.Generator]) -> torch.Tensor:
    """term(j) -> (C, *out): term j of every chunk. Sums each chunk, then the C chunk sums; returns (*out)."""
    s = quantize(term(0), fmt, rounding, generator)
    for j in range(1, cl):
        s = quantize(s + term(j), fmt, rounding, generator)
    total = s[0] if outer == fmt else quantize(s[0], outer, rounding, generator)
    for c in range(1, s.shape[0]):
        total = quantize(total + s[c], outer, rounding, generator)
    return total


def accumulate(terms: torch.Tensor, fmt: Format | str, chunk: int = 0, rounding: str = "nearest",
               generator: Optional[torch.Generator] = None, outer: Format | str | None = None) -> torch.Tensor:
    """Sum float32 `terms` along dim 0, rounding every partial sum to `fmt`; shape (n, *batch) -> (*batch)."""
    fmt = parse_format(fmt)
    outer = fmt if outer is None else parse_format(outer)
    cl = _chunk_length(terms.shape[0], chunk)
    grouped = _grouped(terms, cl)
    return _chunked(lambda j: grouped[:, j], cl, fmt, outer, rounding, generator)


def matmul(a: torch.Tensor, b: torch.Tensor, fmt: Format | str, chunk: int = 0, rounding: str = "nearest",
           generator: Optional[torch.Generator] = None, outer: Format | str | None = None,
           max_elems: int = 1 << 22) -> torch.Tensor:
    """a (M, K) @ b (K, N) in float32: every product a_mk * b_kn is formed in float32 (exact for
    operands of up to 12 significant bits, e.g. FP8 or bfloat16) and the K products of each output
    are accumulated in `fmt` as in `accumulate`. Rows of `a` are processed in tiles of at most
    `max_elems` running sums."""
    fmt = parse_format(fmt)
    outer = fmt if outer is None else parse_format(outer)
    (M, K), N = a.shape, b.shape[1]
    cl = _chunk_length(K, chunk)
    at, bp = _grouped(a.t(), cl), _grouped(b, cl)                      # (C, cl, M), (C, cl, N)
    rows = max(1, max_elems // (at.shape[0] * N))
    out = []
    for r0 in range(0, M, rows):
        ar = at[:, :, r0:r0 + rows].contiguous()
        out.append(_chunked(lambda j: ar[:, j, :, None] * bp[:, j, None, :], cl, fmt, outer, rounding, generator))
    return torch.cat(out) if len(out) > 1 else out[0]


def matmul_by(sum_fn: Callable, a: torch.Tensor, b: torch.Tensor, fmt: Format | str, chunk: int = 0) -> torch.Tensor:
    """a (M, K) @ b (K, N) with the K products of every output summed by `sum_fn(terms, fmt, cl) -> float`, one
    output at a time (cl = K: the naive sum). With a per-vector sum that adds the terms in order and rounds to
    nearest (notebook 07's exercise), this is `matmul(a, b, fmt, chunk)` bit for bit, only far slower."""
    fmt = parse_format(fmt)
    (M, K), N = a.shape, b.shape[1]
    cl = _chunk_length(K, chunk)
    out = torch.empty(M, N)
    for m in range(M):
        prods = a[m, :, None] * b                                      # (K, N): the products, formed in float32
        for n in range(N):
            out[m, n] = float(sum_fn(prods[:, n].contiguous(), fmt, cl))
    return out
