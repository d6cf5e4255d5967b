"""W12 format: bit-exact round trips on adversarial tensors, size accounting, reference linear."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels import w12


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def from_bits(values, shape) -> torch.Tensor:
    b = torch.tensor(values, dtype=torch.int32).to(torch.int16)
    return b.view(shape).view(torch.bfloat16)


def llm_like(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    outliers = torch.rand(n, k, generator=g) < 1e-4
    heavy = torch.empty(n, k).exponential_(0.1, generator=g)  # up to ~50-100x
    return torch.where(outliers, w * heavy, w).to(torch.bfloat16)


def test_every_bf16_bit_pattern_round_trips():
    w = from_bits(list(range(-32768, 32768)), (256, 256))
    p = w12.pack(w)
    assert torch.equal(bits(w12.unpack(p)), bits(w))
    # every NaN payload, both infinities and many out-of-window values are escapes
    n_nan = int(torch.isnan(w.float()).sum())
    assert n_nan == 2 * 127  # 7-bit payloads != 0, both signs
    assert p.n_escapes >= n_nan + 2


def test_special_values_round_trip_in_every_position():
    specials = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x807F,
                0x0080, 0x7F7F, 0xFF7F, 0x3F80]
    g = torch.Generator().manual_seed(3)
    w = llm_like(37, 300, seed=1)  # K not a multiple of 8 or 128: padding path
    b = bits(w).clone()
    idx = torch.randperm(b.numel(), generator=g)[: 4 * len(specials)]
    b.view(-1)[idx] = torch.tensor(specials * 4, dtype=torch.int32).to(torch.int16)
    w = b.view(torch.bfloat16)
    p = w12.pack(w)
    out = w12.unpack(p)
    assert out.shape == w.shape
    assert torch.equal(bits(out), bits(w))


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (64, 128), (130, 1000)])
def test_round_trip_shapes(shape):
    w = llm_like(*shape, seed=sum(shape))
    assert torch.equal(bits(w12.unpack(w12.pack(w))), bits(w))


def test_subnormals_and_zeros_need_no_escape():
    vals = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0040]
    w = from_bits(vals * 16, (16, 7))
    p = w12.pack(w)
    assert p.n_escapes == 0
    assert torch.equal(bits(w12.unpack(p)), bits(w))


def test_row_with_wide_exponent_spread_escapes_only_outside_window():
    # exponents 100..139 in one row: a 15-wide window covers 15, the rest escape
    exps = torch.arange(100, 140)
    row = ((exps << 7) | 0x15).to(torch.int32)
    w = row.to(torch.int16).view(1, -1).view(torch.bfloat16)
    p = w12.pack(w)
    assert p.n_escapes == 40 - 15
    assert torch.equal(bits(w12.unpack(p)), bits(w))


def test_bits_per_weight_on_llm_like_weights():
    for n, k in [(512, 4096), (1024, 2048)]:
        p = w12.pack(llm_like(n, k, seed=n))
        assert p.bits_per_weight <= 12.1, p.bits_per_weight
        assert p.escape_rate < 1e-3


def test_nbytes_counts_every_tensor():
    w = llm_like(10, 250, seed=0)
    w[0, 0] = float("inf")
    p = w12.pack(w)
    kp = 256
    expect = 10 * kp + 10 * kp // 2 + 10 + 4 * 11 + p.n_escapes * (4 + 4 + 2)
    assert p.nbytes == expect
    assert p.n_escapes >= 1


def test_reference_linear_matches_fp32_matmul():
    w = llm_like(48, 200, seed=5)
    x = torch.randn(3, 5, 200)
    p = w12.pack(w)
    y = w12.linear(x, p)
    ref = x @ w.float().T
    assert y.shape == (3, 5, 48)
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-6)
    bias = torch.randn(48)
    assert torch.allclose(w12.linear(x, p, bias), ref + bias, rtol=1e-5, atol=1e-5)


def test_pack_rejects_non_bf16():
    with pytest.raises(ValueError):
        w12.pack(torch.randn(4, 4))


def test_stats_reports_coverage():
    w = llm_like(64, 512, seed=9)
    s = w12.stats(w)
    assert s["shape"] == [64, 512]
    assert 0.999 <= s["coverage"] <= 1.0
    assert s["bits_per_weight"] == pytest.approx(8 * s["nbytes"] / (64 * 512))
