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


def test_chunked_pack_equals_one_piece(monkeypatch):
    """Large matrices are packed a few rows at a time; the result is the same W12 form
    (every tensor equal), escapes' rows and row pointers shifted to the whole matrix."""
    w = from_bits(list(range(-32768, 32768)), (256, 256))[:, :250]  # escapes in every row
    whole = w12.pack(w)
    monkeypatch.setattr(w12, "PACK_CHUNK", 7 * 250)  # 7 rows a chunk: a ragged last one
    parts = w12.pack(w)
    assert (parts.n, parts.k) == (whole.n, whole.k) and whole.n_escapes > 256
    for name, t in whole.tensors().items():
        assert torch.equal(getattr(parts, name), t), name
    assert torch.equal(bits(w12.unpack(parts)), bits(w))


def test_zeros_and_subnormals_are_exact_escapes():
    vals = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0040]
    w = from_bits(vals * 16, (16, 7))
    p = w12.pack(w)
    assert p.n_escapes == w.numel()  # exponent 0 has no code: every one is in the table
    assert torch.equal(bits(w12.unpack(p)), bits(w))


def test_padding_columns_are_not_escapes():
    w = (torch.randn(4, 300, generator=torch.Generator().manual_seed(2)) * 0.02)
    w[1, 299] = float("inf")  # one escape for sure, in the last real column
    p = w12.pack(w.to(torch.bfloat16))
    assert p.kp == 384 and p.gw == 16
    assert 1 <= p.n_escapes <= 3 and int(p.esc_col.max()) == 299  # none in columns 300..383
    assert torch.equal(bits(w12.unpack(p)), bits(w.to(torch.bfloat16)))


def test_row_with_wide_exponent_spread_escapes_only_outside_window():
    # exponents 100..139 in one row: a 16-wide window covers 16, the rest escape
    exps = torch.arange(100, 140)
    row = ((exps << 7) | 0x15).to(torch.int32)
    w = row.to(torch.int16).view(1, -1).view(torch.bfloat16)
    p = w12.pack(w)
    assert p.n_escapes == 40 - 16
    assert torch.equal(bits(w12.unpack(p)), bits(w))


@pytest.mark.parametrize("shape", [(5, 128), (7, 256), (3, 1024), (9, 1664)])
def test_kernel_decode_is_an_exact_power_of_two_scaling(shape):
    """What the kernels compute from the planes (w', one fp32 per weight) times the row's
    2^(base - E0) is exactly w for every stored weight; escapes decode to 2^-15."""
    w = llm_like(*shape, seed=shape[1])
    w[0, 0], w[1, 5] = 0.0, 1e-30
    p = w12.pack(w)
    scaled = w12.decoded_scaled(p)
    assert scaled.shape == (shape[0], p.kp)
    escaped = torch.zeros_like(scaled, dtype=torch.bool)
    escaped[p.esc_row.long(), p.esc_col.long()] = True
    assert escaped[0, 0] and escaped[1, 5]
    assert torch.all(scaled[escaped] == 2.0 ** -15)
    back = (scaled * w12.row_scale(p.base)[:, None])[:, : shape[1]]
    keep = ~escaped[:, : shape[1]]
    assert torch.equal(back[keep], w.float()[keep])
    assert torch.all((scaled.abs() >= 2.0 ** -15) & (scaled.abs() < 2.0))


def test_word_layout_groups_columns_by_word():
    # column q*8*gw + i*gw + g lives in word g of group q: changing one weight changes only
    # its own code word and its own plane-A word
    w = llm_like(2, 1024, seed=4)
    p0 = w12.pack(w)
    col = 512 + 5 * 64 + 17  # group 1, i = 5, g = 17
    w2 = w.clone()
    w2[1, col] = -w2[1, col]  # flips the sign bit only
    p1 = w12.pack(w2)
    dc = (p0.codes.view(torch.int32) != p1.codes.view(torch.int32)).nonzero().tolist()
    da = (p0.a.view(torch.int32) != p1.a.view(torch.int32)).nonzero().tolist()
    assert dc == [[1, 64 + 17]]  # codes: 64 words per group
    assert da == []  # the sign lives in the code word's high-byte bits
    w3 = w.clone()
    w3.view(torch.int16)[1, col] ^= 1  # the lowest mantissa bit: plane A only
    p3 = w12.pack(w3)
    assert torch.equal(p0.codes, p3.codes)
    da = (p0.a.view(torch.int32) != p3.a.view(torch.int32)).nonzero().tolist()
    assert da == [[1, 128 + 64 + 17]]  # group 1 (128 words), A1 half (i >= 4), word g


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
