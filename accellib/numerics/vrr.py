"""How many accumulator mantissa bits a GEMM needs: the variance retention ratio (VRR).

How many accumulator mantissa bits a GEMM needs: the variance retention ratio (VRR) of Sakr et al.,
"Accumulation Bit-Width Scaling for Ultra-Low Precision Training of Deep Networks", ICLR 2019
(arXiv 1901.06588). Only the paper's abstract was retrieved here, so section numbers are not cited.

The paper's idea, in our words: sum n i.i.d. zero-mean products of variance sigma^2 in a narrow
accumulator; whatever the rounding throws away (small addends "swamped" by a large running sum) shows
up as missing variance across an ensemble of such sums,

    VRR = Var(s_hat_n) / (n sigma^2)       (1 is ideal),

and a GEMM of accumulation length n is safe with the smallest accumulator mantissa whose "normalized
variance lost" v(n) = n (1 - VRR) stays below a cut-off. The paper's closed form for VRR (its
Theorem 1, full and partial swamping, chunking) is NOT reproduced here. What this module offers:

    vrr_monte_carlo(n, man, chunk)   exact emulation with accellib.numerics.accumulate
    vrr_approx(n, man, chunk)        an approximation of our own [ours], checked against the emulation
    min_mantissa(n, chunk, cutoff)   the smallest mantissa with v(n) < cutoff
    gemm_lengths(cfg, batch_size)    the accumulation length K of each GEMM of a transformer Linear
    predict_table(cfg, batch_size, chunk, cutoff)   min_mantissa for each of them
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .accumulate import accumulate
from .formats import Format

KAPPA = 1.0 / (32.0 * math.log(2.0))     # [ours]: smooth rounding loses KAPPA 4^-man E[x^2] a step


def vrr_monte_carlo(n: int, man: int, chunk: int = 0, exp: int = 8, trials: int = 2000,
                    rounding: str = "nearest", seed: int = 0) -> float:
    """VRR of `trials` sums of n i.i.d. N(0,1) terms, each summed sequentially along the accumulation
    index in Format(exp, man, overflow="saturate"), chunk-based if chunk > 0 (`accumulate`). The terms
    stay float32, as the products of narrow operands are exact in float32 (`matmul`): only the running
    sums are rounded, starting with Q(0 + t_1).

    Estimator: sum(s_hat^2) / sum(s^2) over the same draws, s the exact (float64) sum. It estimates the
    same quantity as Var(s_hat) / (n sigma^2) (both sums have mean 0, E[s^2] = n) with less noise, as
    s_hat and s are strongly correlated: standard deviation over seeds at 2000 trials 0.003-0.006 where
    1 - VRR < 0.03, 0.013 at VRR ~ 0.86, against 0.04 for the plain ratio; v(n) = n (1 - VRR) needs
    more trials as n grows.
    Speed: n = 4096 with 2000 trials takes about 0.25 s on one core (n vectorised rounding steps).
    Terms are continuous; products of narrow operands have few significant bits and can lose more
    (see vrr_approx on chunking, whose outer loop adds such grid values)."""
    g = torch.Generator().manual_seed(seed)
    terms = torch.randn(n, trials, generator=g)
    s_hat = accumulate(terms, Format(exp, man, overflow="saturate"), chunk, rounding, g).double()
    s = terms.double().sum(0)
    return float((s_hat ** 2).sum() / (s ** 2).sum())


def _swamped_share(beta: np.ndarray) -> np.ndarray:
    """E[p^2; |p| < beta |s|] / sigma_p^2 for independent zero-mean Gaussians p, s with sd ratio 1/beta
    (polar coordinates: (2 arctan(beta) - sin(2 arctan(beta))) / pi)."""
    return (2 * np.arctan(beta) - 2 * beta / (1 + beta * beta)) / np.pi


def _vrr_naive(n: float, man: int) -> float:
    """Integrate dV/di = 1 - KAPPA 4^-man V - share(2^-(man+1) sqrt(V)) (sigma = 1) as i(V) on a grid
    of V, stopping where the growth rate reaches 0 (the running sum stagnates); VRR = V(n) / n."""
    v = np.geomspace(1e-6, 2.0 * n, 4000)
    rate = 1.0 - KAPPA * 4.0 ** -man * v - _swamped_share(2.0 ** -(man + 1) * np.sqrt(v))
    stop = int(np.argmax(rate <= 1e-9)) if (rate <= 1e-9).any() else len(v)
    v, inv = v[:stop], 1.0 / rate[:stop]
    i = v[0] + np.concatenate([[0.0], np.cumsum(np.diff(v) * (inv[1:] + inv[:-1]) / 2)])
    return min(1.0, float(np.interp(n, i, v)) / n)


def vrr_approx(n: int, man: int, chunk: int = 0) -> float:
    """[ours] An approximation of our own (not the paper's Theorem 1), round to nearest, exponent range
    ignored, sigma = 1. V_i = E[s_i^2], the variance retained after i terms, grows as

        dV/di = 1 - KAPPA 4^-man V - share(2^-(man+1) sqrt(V)),     VRR = V(n) / n,

    two losses added (integrated numerically; it depends on n and man only through b = sqrt(n) 2^-man):

    1. Smooth rounding (the b^2 law). With x = s_{i-1} + p_i the value the adder rounds, a step adds
       1 + E[Q(x)^2 - x^2]. For x spread over many grid points, rounding to spacing u adds u^2/12
       (Sheppard), and at each binade boundary 2^k, where the spacing doubles, round-to-nearest sends
       all of [2^k - u/2, 2^k + u) to 2^k, pulling magnitudes toward zero. Averaged over binades the
       pull is twice the Sheppard term: a step loses E[x^2] 4^-man / (32 ln 2) (rounding 2e7 float32
       normals to 3, 5 and 7 mantissa bits gives 0.043-0.048 for 1/(32 ln 2) = 0.0451). Alone it gives
       VRR = (1 - e^-kn) / (kn), k = KAPPA 4^-man, i.e. 1 - VRR ~ b^2 / (64 ln 2) for small b.
    2. Whole-term swamping, which dominates once the ulp of the running sum nears sigma (b >~ 2): a
       term with |p| < 2^-(man+1) |s| (the largest half-ulp relative to |s|) is lost whole; with s
       Gaussian of variance V that loses the share (2 arctan(B) - 2B/(1+B^2)) / pi of the term's
       variance, B = 2^-(man+1) sqrt(V) (`_swamped_share`). The share grows like B^3, so for b < 1
       it is a small correction: counting every swamped term as lost whole ("1 - P(swamped)")
       overstates the loss 8x at b = 1 and 20-70x at b = 1/2 to 1/8. Of the thresholds
       2^-(man+1), 2^-(man+1.5), 2^-(man+2) tried, the first fits the Monte Carlo best (a choice).

    Measured against vrr_monte_carlo (20000 trials), naive sums: within 0.02 for b <= 4 (e.g. b = 1:
    0.961 vs 0.971-0.984; b = 2: 0.839 vs 0.852-0.864; b = 4: 0.546 vs 0.539-0.561), 0.03 at b = 8,
    0.012 at b = 16; min_mantissa agrees with the Monte Carlo's for n = 16 ... 8192, chunk 0 and 64.

    Chunk-based accumulation: the product VRR(CL) * VRR(n / CL), intra-chunk times inter-chunk (the
    chunk sums are again zero-mean terms, of variance CL VRR(CL), and the model is scale-free; the
    last, shorter chunk is not treated apart). n = 4096, CL = 64: 0.924 vs 0.926 Monte Carlo at
    man 3, 0.984 vs 0.983 at man 4, 0.704 vs 0.667 at man 2. The chunk sums lie on the accumulator's
    own grid, and the inter-chunk loop loses more on such terms than on float32 ones, so the product
    of two Monte Carlo VRRs of float32 terms is itself optimistic (0.952 and 0.993 at man 3 and 4)."""
    if n < 1 or chunk < 0:
        raise ValueError(f"vrr_approx: need n >= 1 and chunk >= 0 (got n={n}, chunk={chunk})")
    if chunk == 0 or chunk >= n:
        return _vrr_naive(n, man)
    return _vrr_naive(chunk, man) * _vrr_naive(n / chunk, man)


def min_mantissa(n: int, chunk: int = 0, cutoff: float = 50.0, method: str = "approx",
                 man_range=range(1, 24), **mc_kwargs) -> int:
    """The smallest accumulator mantissa m in `man_range` with normalized variance lost
    v(n) = n (1 - VRR) < cutoff: the paper's selection rule. The default cut-off of 50 is recalled,
    NOT verified against the paper. method: "approx" (`vrr_approx`, any n) or "monte_carlo"
    (`vrr_monte_carlo`, keyword arguments passed on; its noise on v(n) is about n * 0.005 at 2000
    trials, and it costs n rounding steps per m tried, so keep n to a few thousand)."""
    if method not in ("approx", "monte_carlo"):
        raise ValueError(f"method={method!r}: use 'approx' or 'monte_carlo'")
    for m in man_range:
        vrr = vrr_approx(n, m, chunk) if method == "approx" else vrr_monte_carlo(n, m, chunk, **mc_kwargs)
        if n * (1.0 - vrr) < cutoff:
            return m
    raise ValueError(f"no mantissa in {man_range} keeps n (1 - VRR) below {cutoff} for n={n}, chunk={chunk}")


PASSES = ("forward", "backward", "weight_grad")


def gemm_lengths(model_cfg, batch_size: int) -> list[dict]:
    """One row per kind of nn.Linear of `accellib.models.transformer.Transformer`: name, d_in, d_out, count (how many
    such layers) and the accumulation length K of its three GEMMs,
    forward y = x W^T: K = d_in; backward dx = dy W: K = d_out; weight_grad dW = dy^T x: K = tokens
    = batch_size * seq_len, the longest, summed over every token of the micro-batch.
    lm_head is listed tied or not (`tied`): with tie_head it is still an nn.Linear doing the same GEMMs,
    on the embedding's weight. Attention's own matmuls (QK^T, AV) are not Linears and are left out."""
    d, h = model_cfg.d_model, model_cfg.mlp_ratio * model_cfg.d_model
    tokens = batch_size * model_cfg.seq_len
    layers = [("attn.c_attn", d, 3 * d, model_cfg.n_layer), ("attn.c_proj", d, d, model_cfg.n_layer),
              ("mlp.c_fc", d, h, model_cfg.n_layer), ("mlp.c_proj", h, d, model_cfg.n_layer),
              ("lm_head", d, model_cfg.vocab_size, 1)]
    return [{"name": name, "d_in": di, "d_out": do, "count": c,
             "tied": name == "lm_head" and model_cfg.tie_head,
             "forward": di, "backward": do, "weight_grad": tokens} for name, di, do, c in layers]


def predict_table(model_cfg, batch_size: int, chunk: int = 64, cutoff: float = 50.0,
                  method: str = "approx") -> list[dict]:
    """One row per GEMM (Linear kind x pass): name, pass, K, and the predicted minimal accumulator
    mantissa `m_acc` for a naive sum and `m_acc_chunk` for chunk-based accumulation with `chunk`."""
    return [{"name": row["name"], "pass": p, "K": row[p], "chunk": chunk,
             "m_acc": min_mantissa(row[p], 0, cutoff, method),
             "m_acc_chunk": min_mantissa(row[p], chunk, cutoff, method)}
            for row in gemm_lengths(model_cfg, batch_size) for p in PASSES]
