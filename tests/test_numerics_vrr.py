"""Variance retention ratio (accellib.numerics.vrr, after Sakr et al., ICLR 2019): the Monte Carlo
emulation against known limits, our approximation against the Monte Carlo, the mantissa rule, and the
per-GEMM accumulation lengths of the tutorial model. b = sqrt(n) 2^-man sets the loss throughout."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from accellib.models.transformer import ModelConfig
from accellib.numerics.vrr import (gemm_lengths, min_mantissa, predict_table, vrr_approx,
                                   vrr_monte_carlo)

ROOT = Path(__file__).resolve().parents[1]


def test_enough_mantissa_bits_keep_all_the_variance():
    # man >= log2(n)/2 + 3, i.e. b <= 1/8: nothing measurable is lost
    for man in (8, 11):
        assert abs(vrr_monte_carlo(1024, man) - 1.0) < 0.01
    assert vrr_monte_carlo(1024, 3) < 0.7          # b = 4: about 0.54, so the check above has teeth


def test_vrr_falls_with_the_accumulation_length():
    v64, v512, v4096 = (vrr_monte_carlo(n, 4) for n in (64, 512, 4096))   # b = 0.5, 1.4, 4
    assert v64 > v512 + 0.03 and v512 > v4096 + 0.2
    assert v64 > 0.98 and v4096 < 0.65


@pytest.mark.parametrize("n, man", [(256, 2), (256, 3), (1024, 5), (1024, 6), (4096, 8)])  # b = 4 ... 1/4
def test_approx_within_0_04_of_monte_carlo(n, man):
    assert abs(vrr_approx(n, man) - vrr_monte_carlo(n, man, trials=4000, seed=1)) < 0.04


def test_approx_loss_at_small_b_is_the_monte_carlo_loss():
    # b = 1/2: the loss is ~0.006 (approx 0.008); "1 - P(swamped)" would say 0.10, the swamping term
    # alone 0.0025. Over seeds the ratio came out 1.3-2.0 at 100000 trials.
    mc_loss = 1.0 - vrr_monte_carlo(256, 5, trials=100000, seed=2)
    assert 0.6 < (1.0 - vrr_approx(256, 5)) / mc_loss < 3.0


def test_approx_is_scale_free_and_monotone():
    assert vrr_approx(1024, 5) == pytest.approx(vrr_approx(4096, 6), abs=1e-3)     # same b
    vals = [vrr_approx(n, 6) for n in (16, 256, 4096, 65536, 10 ** 6)]
    assert vals == sorted(vals, reverse=True)
    assert vals[0] > 0.999 and vals[-1] < 0.1        # b = 15.6: 0.06 measured
    assert vrr_approx(4096, 3, chunk=64) == pytest.approx(vrr_approx(64, 3) ** 2)


def test_min_mantissa_grows_with_n_and_chunking_never_needs_more():
    ns = [64, 256, 1024, 4096, 16384, 2 ** 20]
    naive = [min_mantissa(n) for n in ns]
    chunked = [min_mantissa(n, chunk=64) for n in ns]
    assert naive[0] == 1 and all(a < b for a, b in zip(naive, naive[1:]))
    assert all(c <= m for c, m in zip(chunked, naive)) and all(c < m for c, m in zip(chunked[2:], naive[2:]))
    assert min_mantissa(4096, cutoff=500.0) < min_mantissa(4096)
    # the approximation picks the same mantissa as the exact emulation
    assert min_mantissa(1024, method="monte_carlo") == min_mantissa(1024) == 5
    assert min_mantissa(1024, 64, method="monte_carlo") == min_mantissa(1024, 64) == 3


def test_min_mantissa_refuses_what_it_cannot_answer():
    with pytest.raises(ValueError, match="no mantissa"):
        min_mantissa(4096, man_range=range(1, 3))
    with pytest.raises(ValueError, match="method"):
        min_mantissa(64, method="exact")


def test_chunk_product_rule():
    n, cl, man = 4096, 64, 3                         # b = 1 inside and between the chunks
    chunked = vrr_monte_carlo(n, man, chunk=cl, trials=20000)
    product = (vrr_monte_carlo(cl, man, trials=20000, seed=1)
               * vrr_monte_carlo(n // cl, man, trials=20000, seed=2))
    # the rule holds to ~0.02, and errs on the optimistic side (0.008-0.025 over 6 seeds): the chunk sums
    # are accumulator-grid values, on which the inter-chunk loop loses a little more than on float32 terms
    assert product - 0.05 < chunked < product + 0.005
    assert abs(vrr_approx(n, man, chunk=cl) - chunked) < 0.03
    assert vrr_monte_carlo(n, man) < 0.4              # naive: b = 8, most of the variance is gone


def tutorial_model() -> tuple[ModelConfig, int]:
    raw = yaml.safe_load((ROOT / "configs" / "tutorial.yaml").read_text())
    return ModelConfig(vocab_size=257, **raw["model"]), raw["train"]["batch_size"]


def test_gemm_lengths_of_the_tutorial_model():
    cfg, batch = tutorial_model()
    assert (cfg.d_model, cfg.mlp_ratio, cfg.seq_len, cfg.n_layer, batch) == (64, 4, 64, 6, 32)
    rows = {r["name"]: r for r in gemm_lengths(cfg, batch)}
    expect = {"attn.c_attn": (64, 192, 6), "attn.c_proj": (64, 64, 6), "mlp.c_fc": (64, 256, 6),
              "mlp.c_proj": (256, 64, 6), "lm_head": (64, 257, 1)}
    assert set(rows) == set(expect)
    for name, (d_in, d_out, count) in expect.items():
        assert rows[name] == {"name": name, "d_in": d_in, "d_out": d_out, "count": count, "tied": False,
                              "forward": d_in, "backward": d_out, "weight_grad": 2048}
    tied = ModelConfig(d_model=64, vocab_size=257, tie_head=True)
    assert gemm_lengths(tied, 2)[-1]["tied"] is True


def test_predict_table_of_the_tutorial_model():
    cfg, batch = tutorial_model()
    table = {(r["name"], r["pass"]): (r["K"], r["m_acc"], r["m_acc_chunk"])
             for r in predict_table(cfg, batch, chunk=64)}
    assert len(table) == 15
    assert table["attn.c_attn", "forward"] == (64, 1, 1)
    assert table["attn.c_attn", "backward"] == (192, 3, 2)
    assert table["mlp.c_proj", "forward"] == (256, 3, 2)
    for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "lm_head"):
        assert table[name, "weight_grad"] == (2048, 6, 4)           # the longest sum needs the most bits
