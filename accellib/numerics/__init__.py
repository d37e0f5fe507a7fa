"""Emulated low-precision arithmetic (Wang et al., NeurIPS 2018; Sakr et al., ICLR 2019).

    formats     Format, quantize: any (exp, man) float format, round-to-nearest-even or stochastic,
                bit-exact against torch's float16 / bfloat16 / float8 casts
    accumulate  accumulate, matmul: sequential sums in a narrow format, naive or chunk-based
    linear      EmulatedLinear: FP8 operands, each of the three GEMMs with its own accumulation
    vrr         the variance retention ratio and the accumulator mantissa each GEMM needs

The `lowp` config section (accellib/techniques/low_precision.py) switches a model onto these.
"""
