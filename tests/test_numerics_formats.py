"""Exact tests of the emulated number formats (accellib/numerics/formats.py) and of naive and
chunk-based accumulation in them (accellib/numerics/accumulate.py).

Round to nearest is checked bit for bit against torch's own casts (float16, bfloat16,
float8_e5m2, float8_e4m3fn) on float32 inputs of every kind; the accumulators are checked bit for
bit against a scalar Python-loop reference written here (`ref_accumulate`)."""
from __future__ import annotations

import math

import pytest
import torch

from accellib.numerics.accumulate import accumulate, matmul
from accellib.numerics.formats import (BF16, E4M3, E5M2, E6M9, FP16, FP32, TORCH_DTYPE, Format,
                                       parse_format, quantize, quantum)

N = 200_000
TORCH_FORMATS = [FP16, BF16, E5M2, E4M3]                  # formats torch can cast to
ALL_FORMATS = [FP16, BF16, E5M2, E4M3, E6M9, parse_format("e3m4")]


# ---------------------------------------------------------------- helpers

def bits(x: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns of a float32 tensor, every NaN mapped to one pattern (NaN == NaN)."""
    b = x.contiguous().view(torch.int32)
    return torch.where(x.isnan(), torch.full_like(b, 0x7FC00000), b)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor | None = None):
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    bad = bits(got) != bits(want)
    if bad.any():
        i = bad.nonzero()[0].item() if bad.dim() else None
        where = "" if i is None else f" first at [{i}]"
        inp = "" if (x is None or i is None) else f" x={x.reshape(-1)[i].item()!r}"
        g = got.reshape(-1)[i or 0].item()
        w = want.reshape(-1)[i or 0].item()
        raise AssertionError(f"{int(bad.sum())} bit mismatches{where}:{inp} got {g!r} want {w!r}")


def torch_cast(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    return x.to(TORCH_DTYPE[fmt.name]).float()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_float32_bits(n: int, seed: int) -> torch.Tensor:
    """Uniform over all 2^32 float32 bit patterns: subnormals, zeros, huge values, inf, NaN."""
    i = torch.randint(-2 ** 31, 2 ** 31, (n,), generator=gen(seed), dtype=torch.int64)
    return i.to(torch.int32).view(torch.float32)


def binade_values(fmt: Format, n: int, seed: int) -> torch.Tensor:
    """Random float32 values (random sign and 23 mantissa bits) whose binades run from below the
    format's smallest subnormal to above its largest finite value (float32 subnormals included)."""
    g = gen(seed)
    lo = max(0, fmt.e_min - fmt.man - 3 + 127)            # biased float32 exponent fields
    hi = min(254, fmt.e_max + 2 + 127)
    e = torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int64)
    m = torch.randint(0, 2 ** 23, (n,), generator=g, dtype=torch.int64)
    s = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64)
    i = (s << 31) | (e << 23) | m
    return i.to(torch.int32).view(torch.float32)        # int64 -> int32 wraps the sign bit in


def tie_values(fmt: Format, n: int, seed: int) -> torch.Tensor:
    """Exact ties, odd multiples of half a quantum: half of them in the normal binades (plus the
    tie just past max), half in the subnormal range, with random signs."""
    g = gen(seed)
    h = n // 2
    # normal: 2^E (1 + (2j+1) / 2^(man+1)), E in [e_min, e_max], j in [0, 2^man)
    E = torch.randint(fmt.e_min, fmt.e_max + 1, (h,), generator=g, dtype=torch.int64)
    j = torch.randint(0, 2 ** fmt.man, (h,), generator=g, dtype=torch.int64)
    normal = torch.ldexp(1 + (2 * j + 1).double() / 2 ** (fmt.man + 1), E.double())
    # subnormal: (2j+1) * tiny / 2, j in [0, 2^man)
    j = torch.randint(0, 2 ** fmt.man, (n - h,), generator=g, dtype=torch.int64)
    sub = (2 * j + 1).double() * (fmt.tiny / 2)
    past_max = torch.tensor([fmt.max + 2.0 ** (fmt.e_max - fmt.man) / 2], dtype=torch.float64)
    x = torch.cat([normal, sub, past_max])
    x = x * (1 - 2 * torch.randint(0, 2, x.shape, generator=g)).double()
    x32 = x.float()
    assert torch.equal(x32.double(), x), "test bug: a tie is not a float32"
    return x32


def ref_accumulate(terms, fmt: Format, chunk: int = 0, outer: Format | None = None) -> torch.Tensor:
    """Scalar reference of chunk-based accumulation: terms (a list of 0-d float32 tensors) are cut
    into chunks of `chunk` consecutive terms (0 or >= n: one chunk); each chunk is summed left to
    right rounding every partial sum to fmt; the chunk sums are summed left to right in `outer`."""
    outer = outer or fmt
    n = len(terms)
    cl = n if chunk <= 0 or chunk >= n else chunk
    sums = []
    for c0 in range(0, n, cl):
        s = None
        for t in terms[c0:c0 + cl]:
            s = quantize(t if s is None else s + t, fmt)
        sums.append(s)
    total = sums[0]
    for s in sums[1:]:
        total = quantize(total + s, outer)
    return total


def ref_accumulate_batch(terms: torch.Tensor, fmt, chunk=0, outer=None) -> torch.Tensor:
    """ref_accumulate over every batch position of terms (n, *batch)."""
    flat = terms.reshape(terms.shape[0], -1)
    out = [ref_accumulate(list(flat[:, b]), fmt, chunk, outer) for b in range(flat.shape[1])]
    return torch.stack(out).reshape(terms.shape[1:])


def e5m2_values() -> torch.Tensor:
    """All finite float8_e5m2 values (both zeros included), as float32."""
    v = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(torch.float8_e5m2).float()
    return v[v.isfinite()]


# ---------------------------------------------------------------- 1. bit-exact against torch

@pytest.mark.parametrize("fmt", TORCH_FORMATS, ids=str)
def test_nearest_matches_torch_cast_on_random_float32_bits(fmt):
    x = random_float32_bits(N, seed=1)
    assert x.isnan().any() and (x.abs() < 2.0 ** -126).any()          # the sample has both
    assert_same_bits(quantize(x, fmt), torch_cast(x, fmt), x)


@pytest.mark.parametrize("fmt", TORCH_FORMATS, ids=str)
def test_nearest_matches_torch_cast_over_binades(fmt):
    x = binade_values(fmt, N, seed=2)
    ax = x.abs()
    assert (ax < fmt.tiny).any() and (ax < 2.0 ** fmt.e_min).any() and (ax > fmt.max).any()
    specials = torch.tensor([fmt.max, -fmt.max, fmt.tiny, -fmt.tiny, fmt.tiny / 2, 2.0 ** fmt.e_min,
                             float("inf"), float("-inf"), float("nan")]).float()
    x = torch.cat([x, specials])
    assert_same_bits(quantize(x, fmt), torch_cast(x, fmt), x)


@pytest.mark.parametrize("fmt", TORCH_FORMATS, ids=str)
def test_nearest_matches_torch_cast_on_exact_ties(fmt):
    x = tie_values(fmt, N, seed=3)
    q = quantize(x, fmt)
    assert_same_bits(q, torch_cast(x, fmt), x)
    # and ties really went to the even neighbour: the result's last mantissa bit is 0 in quanta
    fin = q.isfinite() & (q.abs() <= fmt.max) & (q != 0)
    k = (q[fin] / quantum(q[fin], fmt)).abs()
    assert torch.all((k % 2 == 0) | (k == 2 ** fmt.man * 2))   # top-of-binade carry is even too


@pytest.mark.parametrize("fmt", TORCH_FORMATS + [E6M9], ids=str)
def test_signed_zeros_and_underflow_keep_sign(fmt):
    x = torch.tensor([0.0, -0.0, fmt.tiny / 4, -fmt.tiny / 4, fmt.tiny / 2, -fmt.tiny / 2])
    want = torch.tensor([0.0, -0.0, 0.0, -0.0, 0.0, -0.0])             # ties to even: 0
    assert_same_bits(quantize(x, fmt), want, x)
    if fmt.name in TORCH_DTYPE:
        assert_same_bits(quantize(x, fmt), torch_cast(x, fmt), x)


# ---------------------------------------------------------------- 2. idempotent and monotone

@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_nearest_is_idempotent(fmt):
    x = torch.cat([random_float32_bits(N // 4, seed=4), binade_values(fmt, N // 4, seed=5)])
    q = quantize(x, fmt)
    assert_same_bits(quantize(q, fmt), q, x)


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_nearest_is_monotone(fmt):
    x = torch.cat([random_float32_bits(N // 4, seed=6), binade_values(fmt, N // 4, seed=7),
                   torch.tensor([float("inf"), float("-inf")])])
    x = torch.sort(x[~x.isnan()]).values
    q = quantize(x, fmt)
    assert not q.isnan().any()
    assert torch.all(q[1:] >= q[:-1])


# ---------------------------------------------------------------- 3. stochastic rounding

def neighbours(x: torch.Tensor, fmt: Format):
    """The grid points below and above x (overflow/saturation applied to them as to any value)."""
    q = quantum(x, fmt).double()  # float64: next to float32's max, lo + q must not start from -inf
    lo = torch.floor(x.double() / q) * q
    return quantize(lo.float(), fmt), quantize((lo + q).float(), fmt)


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_stochastic_gives_one_of_the_two_neighbours(fmt):
    x = binade_values(fmt, N // 4, seed=8)
    y = quantize(x, fmt, "stochastic", generator=gen(9))
    lo, hi = neighbours(x, fmt)
    assert torch.all((y == lo) | (y == hi))
    # both neighbours occur (off-grid values are not all rounded one way)
    off = (lo != hi) & (x != lo)
    assert (y[off] == lo[off]).float().mean() > 0.2 and (y[off] == hi[off]).float().mean() > 0.2


@pytest.mark.parametrize("fmt,values", [
    (E5M2, [1.3, -1.3, 2.7 * 2.0 ** -16, -0.4 * 2.0 ** -16, 50000.0, 1e-3]),
    (E6M9, [1.0 + 2 ** -11, 3.14159, -7e-12, 3.0e9, 1.0e-5]),
    (E4M3, [0.3, 2.1 * 2.0 ** -9, 300.0, -440.0]),
    (BF16, [1.0 + 2 ** -9, 3e-39, -1e38]),
], ids=["e5m2", "e6m9", "e4m3", "bf16"])
def test_stochastic_is_unbiased(fmt, values):
    draws = 20_000
    x = torch.tensor(values, dtype=torch.float32)
    assert torch.all(quantize(x, fmt) != x), "test bug: pick values off the grid"
    y = quantize(x.repeat(draws, 1), fmt, "stochastic", generator=gen(10)).double()
    lo, hi = neighbours(x, fmt)
    assert torch.all(hi.isfinite() & (hi.abs() <= fmt.max)), "test bug: values must stay in range"
    q = (hi - lo).double()
    p = (x.double() - lo.double()) / q
    se = torch.sqrt(p * (1 - p)) * q / math.sqrt(draws)
    err = (y.mean(0) - x.double()).abs()
    assert torch.all(err < 4 * se), (err / se).tolist()


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_stochastic_keeps_grid_values(fmt):
    x = quantize(binade_values(fmt, N // 4, seed=11), fmt)
    # -0.0 left out: quantize(-0.0, fmt, "stochastic") returns +0.0 (floor(-0) + 0.0 = +0)
    x = x[(x != 0) | (bits(x) == 0)]
    x = torch.cat([x, torch.tensor([0.0, fmt.max, -fmt.max, fmt.tiny, -fmt.tiny])])
    assert_same_bits(quantize(x, fmt, "stochastic", generator=gen(12)), x, x)


def test_stochastic_is_reproducible():
    x = binade_values(E6M9, N // 4, seed=13)
    a = quantize(x, E6M9, "stochastic", generator=gen(14))
    b = quantize(x, E6M9, "stochastic", generator=gen(14))
    c = quantize(x, E6M9, "stochastic", generator=gen(15))
    assert_same_bits(a, b, x)
    assert not torch.equal(bits(a), bits(c))


def test_stochastic_overflow_and_saturation():
    inf = float("inf")
    big = torch.tensor([1e10, -1e10, inf, -inf, float("nan")])
    for fmt, top in [(E5M2, inf), (FP16, inf), (BF16, 1e10), (E4M3, E4M3.max), (E6M9, E6M9.max)]:
        y = quantize(big, fmt, "stochastic", generator=gen(16))
        if fmt is BF16:                                          # 1e10 is in bf16's range
            assert (y[:2].abs() - 1e10).abs().max() <= 2.0 ** (33 - 7)
            y, big_, top = y[2:], big[2:], inf
            want = torch.tensor([top, -top, float("nan")])
        else:
            big_ = big
            want = torch.tensor([top, -top, top, -top, float("nan")])
        assert_same_bits(y, want, big_)
    # between max and the next power of two: max or +-inf (e5m2), always max (e4m3 saturates)
    y = quantize(torch.full((2000,), 60000.0), E5M2, "stochastic", generator=gen(17))
    assert set(y.unique().tolist()) == {E5M2.max, inf}
    y = quantize(torch.full((2000,), -470.0), E4M3, "stochastic", generator=gen(18))
    assert set(y.unique().tolist()) == {-E4M3.max}


def test_stochastic_rejects_unknown_rounding():
    with pytest.raises(ValueError, match="nearest"):
        quantize(torch.ones(3), E5M2, "up")


# ---------------------------------------------------------------- 4. overflow and properties

@pytest.mark.parametrize("x,fmt,want", [
    (61440.0, E5M2, float("inf")), (61439.0, E5M2, 57344.0), (-61440.0, E5M2, float("-inf")),
    (57344.0, E5M2, 57344.0), (2.0 ** 100, E5M2, float("inf")),
    (65520.0, FP16, float("inf")), (65519.99609375, FP16, 65504.0), (-65520.0, FP16, float("-inf")),
    (2.0 ** 128 - 2.0 ** 119, BF16, float("inf")), (2.0 ** 128 - 2.0 ** 119 - 2.0 ** 104, BF16, BF16.max),
    (448.0, E4M3, 448.0), (464.0, E4M3, 448.0), (1e6, E4M3, 448.0), (-2.0 ** 100, E4M3, -448.0),
    (float("inf"), E4M3, 448.0), (float("-inf"), E4M3, -448.0),
    (1e10, E6M9, E6M9.max), (float("inf"), E6M9, E6M9.max), (float("-inf"), E6M9, -E6M9.max),
    (float("inf"), E5M2, float("inf")), (float("-inf"), FP16, float("-inf")),
])
def test_overflow(x, fmt, want):
    xt = torch.tensor([x], dtype=torch.float32)
    assert xt.item() == x, "test bug: x is not a float32"
    got = quantize(xt, fmt)
    assert_same_bits(got, torch.tensor([want], dtype=torch.float32), xt)
    if fmt.name in TORCH_DTYPE:
        assert_same_bits(got, torch_cast(xt, fmt), xt)


def test_e6m9_max_and_threshold():
    assert E6M9.max == (2 - 2 ** -9) * 2.0 ** 31
    q_top = 2.0 ** (31 - 9)
    x = torch.tensor([E6M9.max + q_top / 2 - q_top / 4, E6M9.max + q_top / 2, 2.0 ** 32])
    assert_same_bits(quantize(x, E6M9), torch.full((3,), E6M9.max), x)


@pytest.mark.parametrize("fmt", [FP16, BF16, E5M2, E4M3, FP32], ids=str)
def test_format_properties_match_torch_finfo(fmt):
    dt = TORCH_DTYPE[fmt.name]
    fi = torch.finfo(dt)
    smallest_subnormal = torch.tensor([1], dtype=torch.int64).to(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32}[fi.bits // 8]).view(dt).float().item()
    assert fmt.max == fi.max
    assert 2.0 ** fmt.e_min == fi.smallest_normal
    assert fmt.tiny == smallest_subnormal
    assert math.frexp(fi.max)[1] - 1 == fmt.e_max
    assert 2.0 ** -fmt.man == fi.eps
    assert fi.bits == 1 + fmt.exp + fmt.man


def test_e6m9_properties():
    assert (E6M9.bias, E6M9.e_min, E6M9.e_max) == (31, -30, 31)
    assert E6M9.tiny == 2.0 ** -39 and E6M9.overflow == "saturate"


# ---------------------------------------------------------------- 5. parse_format and errors

def test_parse_format_names_and_exmy():
    assert parse_format("e5m2") is E5M2 and parse_format(" E4M3 ") is E4M3
    assert parse_format("fp16") is FP16 and parse_format("bf16") is BF16
    assert parse_format("fp32") is FP32 and parse_format("e6m9") is E6M9
    assert parse_format(E5M2) is E5M2
    f = parse_format("e3m4")
    assert (f.exp, f.man, f.ieee, f.overflow) == (3, 4, True, "saturate")
    assert f.max == (2 - 2 ** -4) * 2.0 ** 3 and f.tiny == 2.0 ** -6
    # quantize takes a name too
    x = torch.tensor([1.3])
    assert torch.equal(quantize(x, "e5m2"), quantize(x, E5M2))


@pytest.mark.parametrize("spec", ["fp8", "e5", "m2", "e5m2x", "float16", "", "e-1m2"])
def test_parse_format_rejects_unknown_names(spec):
    with pytest.raises(ValueError) as e:
        parse_format(spec)
    msg = str(e.value)
    for allowed in ("e5m2", "e4m3", "e6m9", "fp16", "bf16", "fp32", "eXmY"):
        assert allowed in msg, msg


@pytest.mark.parametrize("spec", ["e9m2", "e1m2", "e5m24"])
def test_parse_format_rejects_unemulable_widths(spec):
    with pytest.raises(ValueError, match="exponent bits"):
        parse_format(spec)


def test_quantize_rejects_non_float32():
    for dt in (torch.float64, torch.float16, torch.bfloat16):
        with pytest.raises(TypeError, match="float32"):
            quantize(torch.ones(3, dtype=dt), E5M2)


# ---------------------------------------------------------------- 6. accumulation

def uniform4096() -> torch.Tensor:
    return torch.rand(4096, generator=torch.Generator().manual_seed(0))


def test_naive_e6m9_sum_stagnates_at_1024():
    x = uniform4096()
    s = accumulate(x, E6M9)
    assert s.item() == 1024.0 == 2.0 ** (E6M9.man + 1)
    # partial sums: reach 1024 and stay there (at 1024 the spacing is 2: every addend < 1 is lost)
    partial, sums = None, []
    for t in x:
        partial = quantize(t if partial is None else partial + t, E6M9)
        sums.append(partial.item())
    first = sums.index(1024.0)
    assert first < 4095 and all(v == 1024.0 for v in sums[first:])
    assert sums[-1] == s.item()
    assert x.double().sum().item() > 2000                       # the true sum is about 2048


def test_chunked_e6m9_sum_is_accurate():
    x = uniform4096()
    exact = x.double().sum().item()
    s = accumulate(x, E6M9, chunk=64).item()
    assert abs(s - exact) / exact < 1e-2
    assert abs(accumulate(x, E6M9).item() - exact) / exact > 0.4  # the naive one is not


@pytest.mark.parametrize("fmt", [E6M9, E5M2, BF16], ids=str)
def test_chunk_1_and_n_equal_the_naive_sum(fmt):
    terms = quantize(torch.randn(37, 5, generator=gen(20)) * 3, fmt)
    naive = accumulate(terms, fmt)
    assert_same_bits(naive, ref_accumulate_batch(terms, fmt))
    for chunk in (0, 1, 37, 38, 1000):
        assert_same_bits(accumulate(terms, fmt, chunk=chunk), naive)


def test_fp32_accumulation_is_a_float32_loop():
    x = torch.randn(1000, generator=gen(21)) * torch.logspace(-3, 3, 1000)
    s = torch.zeros((), dtype=torch.float32)
    for t in x:
        s = s + t
    assert_same_bits(accumulate(x, FP32), s)
    assert_same_bits(accumulate(x, "fp32", chunk=0), s)


@pytest.mark.parametrize("n,chunk", [(1, 0), (1, 4), (7, 3), (64, 64), (10, 4), (100, 7), (65, 64)])
@pytest.mark.parametrize("fmt,outer", [(E6M9, None), (E5M2, E6M9), (E6M9, FP32), (E4M3, BF16)],
                         ids=["e6m9", "e5m2+e6m9", "e6m9+fp32", "e4m3+bf16"])
def test_chunked_equals_scalar_reference(n, chunk, fmt, outer):
    terms = torch.randn(n, 3, generator=gen(22 + n)) * torch.tensor([1.0, 30.0, 1e-3])
    got = accumulate(terms, fmt, chunk=chunk, outer=outer)
    assert got.shape == (3,)
    assert_same_bits(got, ref_accumulate_batch(terms, fmt, chunk, outer))


def test_outer_accumulator_is_used():
    x = uniform4096()
    inner_only = accumulate(x, E5M2, chunk=64)
    wide = accumulate(x, E5M2, chunk=64, outer=FP32)
    assert_same_bits(wide, ref_accumulate(list(x), E5M2, 64, FP32))
    assert_same_bits(inner_only, ref_accumulate(list(x), E5M2, 64))
    assert not torch.equal(wide, inner_only)


def test_stochastic_accumulation_is_reproducible():
    x = uniform4096().reshape(512, 8)
    a = accumulate(x, E6M9, 16, "stochastic", gen(23))
    b = accumulate(x, E6M9, 16, "stochastic", gen(23))
    assert_same_bits(a, b)


def test_accumulate_rejects_empty_and_negative_chunk():
    with pytest.raises(ValueError, match="nothing to accumulate"):
        accumulate(torch.zeros(0, 3), E6M9)
    with pytest.raises(ValueError, match="chunk"):
        accumulate(torch.ones(4), E6M9, chunk=-1)


def test_e5m2_products_are_exact_in_e6m9():
    v = e5m2_values()
    assert v.numel() == 256 - 8                                 # +-inf and 6 NaNs dropped
    p = v[:, None] * v[None, :]                                  # float32: 3 x 3 bits, exact
    assert torch.equal(p.double(), v.double()[:, None] * v.double()[None, :])
    assert_same_bits(quantize(p, E6M9), p, p)


# ---------------------------------------------------------------- 7. matmul

def ref_matmul(a, b, fmt, chunk, outer=None):
    M, K = a.shape
    N_ = b.shape[1]
    out = torch.empty(M, N_)
    for i in range(M):
        for j in range(N_):
            out[i, j] = ref_accumulate([a[i, k] * b[k, j] for k in range(K)], fmt, chunk, outer)
    return out


@pytest.mark.parametrize("chunk", [0, 3, 10, 4])
@pytest.mark.parametrize("outer", [None, FP32], ids=["same", "fp32"])
def test_matmul_equals_scalar_reference(chunk, outer):
    a = quantize(torch.randn(3, 10, generator=gen(30)), E5M2)
    b = quantize(torch.randn(10, 4, generator=gen(31)) * 8, E5M2)
    got = matmul(a, b, E6M9, chunk=chunk, outer=outer)
    assert got.shape == (3, 4)
    assert_same_bits(got, ref_matmul(a, b, E6M9, chunk, outer))


@pytest.mark.parametrize("chunk", [0, 8, 7])
def test_matmul_tiling_does_not_change_bits(chunk):
    a = torch.randn(17, 40, generator=gen(32))
    b = torch.randn(40, 5, generator=gen(33))
    whole = matmul(a, b, E6M9, chunk=chunk)
    for max_elems in (1, 7, 40, 100):
        assert_same_bits(matmul(a, b, E6M9, chunk=chunk, max_elems=max_elems), whole)


def test_matmul_fp32_is_close_to_torch():
    a = torch.randn(32, 64, generator=gen(34))
    b = torch.randn(64, 16, generator=gen(35))
    want = (a.double() @ b.double())
    got = matmul(a, b, FP32).double()
    bound = a.double().abs() @ b.double().abs()
    assert torch.all((got - want).abs() <= 1e-5 * bound)
    assert ((got - (a @ b).double()).norm() / (a @ b).double().norm()).item() < 1e-5


def _round_float64(x: torch.Tensor, man: int) -> torch.Tensor:
    """Round-to-nearest-even of float64 values to man+1 significant bits (no range limits)."""
    m, e = torch.frexp(x)                                  # m in [0.5, 1)
    return torch.ldexp(torch.round(m * 2.0 ** (man + 1)), e - (man + 1))


def test_float32_add_then_round_is_the_exactly_rounded_sum_for_narrow_addends():
    """The accumulator computes s + t in float32 and then rounds to (1,6,9). For addends of at most 11
    significant bits this equals rounding the exact sum once (double rounding is innocuous when the first
    precision is >= 2p + 2 bits: 24 >= 2 * 10 + 2; Figueroa 1995): a (1,6,9) running sum plus a product of
    two FP8 (1,5,2) numbers, which has at most 6 significant bits."""
    g = gen(21)
    n = 200_000
    s = quantize(torch.randn(n, generator=g) * torch.ldexp(torch.ones(n), torch.randint(-12, 12, (n,), generator=g)), E6M9)
    a = quantize(torch.randn(n, generator=g) * torch.ldexp(torch.ones(n), torch.randint(-6, 6, (n,), generator=g)), E5M2)
    b = quantize(torch.randn(n, generator=g) * torch.ldexp(torch.ones(n), torch.randint(-6, 6, (n,), generator=g)), E5M2)
    t = a * b
    exact = s.double() + t.double()            # exact: the exponent gap here is < 53 - 10 bits
    want = _round_float64(exact, E6M9.man)
    got = quantize(s + t, E6M9)
    assert torch.equal(got.double(), want)
    ties = (exact / torch.ldexp(torch.ones(n, dtype=torch.float64), torch.frexp(exact)[1] - 11)).frac().abs() == 0.5
    assert ties.sum() > 100                    # the draws include exact ties, where a double rounding would show
