"""Triton kernels for W12 weights: fused decode + GEMV (batch 1-4) / tl.dot GEMM (batch 2-32).

Weights are decoded in registers with a few integer ops per weight (no shared table):
``e = code ? base + code : 0``, bits = sign | e << 23 | mantissa << 16 (fp32), or the
same in bf16 for the tensor-core path; escapes (decoded as 0 in the main loop) are added
back in the epilogue from the row-sorted side table, in the same launch. Accumulation is
fp32. Split-K uses the one-launch workspace reduction of `splitk.py`.

Under TRITON_INTERPRET=1 (CPU tests) use fp32 activations/outputs and `f32_dot=True`:
the interpreter mishandles bf16.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from .splitk import k_per_split, reduce_partials, store_partial_and_count, workspace
from .w12 import W12Weight


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of a W12 or bf16 linear kernel."""

    bm: int = 1  # rows of x per program (GEMV: 1..4, dot: 16/32)
    bn: int = 8  # output features per program
    bk: int = 512  # K columns per loop step
    split_k: int = 1
    warps: int = 4
    stages: int = 3
    dot: bool = False  # tensor-core path
    variant: int = 1  # bf16 GEMV only: 0 reduce every step, 1 elementwise accumulator

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelConfig":
        return cls(**{k: (bool(v) if k == "dot" else int(v)) for k, v in d.items()})

    @property
    def label(self) -> str:
        kind = "dot" if self.dot else "gemv"
        return (f"{kind}{self.variant}_m{self.bm}n{self.bn}k{self.bk}s{self.split_k}"
                f"w{self.warps}p{self.stages}")


@triton.jit
def _decode_f32(a, c, base):
    # a * 0x01010000 puts the byte at bits 16..23 and 24..31: the mask keeps the sign at 31
    # and the mantissa at 16..22 (one IMAD + one LOP3); the exponent is c * 2^23 + base << 23
    e = tl.where(c == 0, 0, c * (1 << 23) + (base << 23))
    bits = ((a * 0x01010000) & -2139160576) | e  # -2139160576 == 0x807F0000 as int32
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _decode_bf16(a, c, base):
    e = tl.where(c == 0, 0, c * 128 + (base << 7))
    bits = ((a * 0x0101) & 0x807F) | e
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _patch_escapes(acc, x_ptr, stride_xm, offs_m, m_mask, offs_n, n0, N, rowptr_ptr, erow_ptr,
                   ecol_ptr, ebits_ptr, BN: tl.constexpr):
    lo = tl.load(rowptr_ptr + n0)
    hi = tl.load(rowptr_ptr + tl.minimum(n0 + BN, N))
    for e in range(lo, hi):
        r = tl.load(erow_ptr + e)
        col = tl.load(ecol_ptr + e)
        v = (tl.load(ebits_ptr + e).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        xv = tl.load(x_ptr + offs_m * stride_xm + col, mask=m_mask, other=0.0).to(tl.float32)
        acc += tl.where((offs_n == r)[None, :], xv[:, None] * v, 0.0)
    return acc


@triton.jit
def _row_sum(t):
    return tl.sum(tl.sum(tl.sum(t, axis=3), axis=2), axis=1)


@triton.jit
def w12_linear_kernel(
    x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
    cnt_ptr, M, N, K, Kp, stride_a, stride_c, stride_xm, stride_ym, K_PER,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr, F32_DOT: tl.constexpr, EVEN_K: tl.constexpr,
):
    # A step covers BK = G * 128 columns as a [BN, G, 2, 64] tile (column 128g + 64h + j):
    # plane-A bytes, the code bytes (shared by h = 0 / 1) and x all load in that one shape,
    # so they share a register layout and the decode is thread-local.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    rows = offs_n % N  # rows past N read valid memory; their results are never stored
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    G: tl.constexpr = BK // 128
    g = tl.arange(0, G)[None, :, None, None]
    h = tl.arange(0, 2)[None, None, :, None]
    j = tl.arange(0, 64)[None, None, None, :]
    r4 = rows[:, None, None, None]
    col = g * 128 + h * 64 + j  # [1, G, 2, 64]
    a_off = r4 * stride_a + col
    c_off = r4 * stride_c + g * 64 + h * 0 + j
    base = tl.load(base_ptr + rows).to(tl.int32)[:, None, None, None]
    shift = h * 4
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    # GEMV (BM <= 4): one accumulator per x row, all in the tile's layout, reduced once
    acc0 = tl.zeros((BN, G, 2, 64), dtype=tl.float32)
    acc1 = tl.zeros((BN, G, 2, 64), dtype=tl.float32)
    acc2 = tl.zeros((BN, G, 2, 64), dtype=tl.float32)
    acc3 = tl.zeros((BN, G, 2, 64), dtype=tl.float32)
    m0 = pid_m * BM
    k_lo = pid_k * K_PER
    for k0 in range(k_lo, tl.minimum(k_lo + K_PER, Kp), BK):
        if EVEN_K:
            a = tl.load(a_ptr + a_off + k0, eviction_policy="evict_first")
            cb = tl.load(c_ptr + c_off + k0 // 2, eviction_policy="evict_first")
        else:
            kmask = (k0 + col < Kp) & (r4 >= 0)
            a = tl.load(a_ptr + a_off + k0, mask=kmask, other=0, eviction_policy="evict_first")
            cb = tl.load(c_ptr + c_off + k0 // 2, mask=kmask, other=0,
                         eviction_policy="evict_first")
        c = (cb.to(tl.int32) >> shift) & 0xF
        a = a.to(tl.int32)
        if USE_DOT:
            ks = k0 + tl.arange(0, BK)
            xt = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                         mask=m_mask[:, None] & (ks < K)[None, :], other=0.0,
                         eviction_policy="evict_last")
            if F32_DOT:
                w = tl.reshape(_decode_f32(a, c, base), (BN, BK))
                acc += tl.dot(xt.to(tl.float32), tl.trans(w), input_precision="ieee")
            else:
                w = tl.reshape(_decode_bf16(a, c, base), (BN, BK))
                acc += tl.dot(xt.to(tl.bfloat16), tl.trans(w))
        else:
            w = _decode_f32(a, c, base)
            xk = x_ptr + r4 * 0 + k0 + col  # x in the tile's own shape: same layout as w
            xmask = (k0 + col < K) & (r4 >= 0)
            acc0 += w * tl.load(xk + m0 * stride_xm, mask=xmask & (m0 < M), other=0.0,
                                eviction_policy="evict_last").to(tl.float32)
            if BM > 1:
                acc1 += w * tl.load(xk + (m0 + 1) * stride_xm, mask=xmask & (m0 + 1 < M),
                                    other=0.0, eviction_policy="evict_last").to(tl.float32)
            if BM > 2:
                acc2 += w * tl.load(xk + (m0 + 2) * stride_xm, mask=xmask & (m0 + 2 < M),
                                    other=0.0, eviction_policy="evict_last").to(tl.float32)
                acc3 += w * tl.load(xk + (m0 + 3) * stride_xm, mask=xmask & (m0 + 3 < M),
                                    other=0.0, eviction_policy="evict_last").to(tl.float32)
    if not USE_DOT:
        sel = tl.arange(0, BM)[:, None]
        acc = tl.where(sel == 0, _row_sum(acc0)[None, :], acc)
        if BM > 1:
            acc = tl.where(sel == 1, _row_sum(acc1)[None, :], acc)
        if BM > 2:
            acc = tl.where(sel == 2, _row_sum(acc2)[None, :], acc)
            acc = tl.where(sel == 3, _row_sum(acc3)[None, :], acc)
    finish = True
    if SPLIT_K > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        finish = store_partial_and_count(acc, ws_ptr, cnt_ptr, tile, pid_k, offs_m, offs_n, BM, BN)
    if finish:
        if SPLIT_K > 1:
            acc = reduce_partials(ws_ptr, cnt_ptr, tile, BM, BN)
        acc = _patch_escapes(acc, x_ptr, stride_xm, offs_m, m_mask, offs_n, n0, N, rowptr_ptr,
                             erow_ptr, ecol_ptr, ebits_ptr, BN)
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & (offs_n < N)[None, :])


def launch_grid(m: int, n: int, cfg: KernelConfig) -> tuple[int, int, int]:
    return (triton.cdiv(n, cfg.bn), cfg.split_k, triton.cdiv(m, cfg.bm))


def w12_matmul(x: torch.Tensor, w: W12Weight, cfg: KernelConfig, out: torch.Tensor | None = None,
               f32_dot: bool = False) -> torch.Tensor:
    """y [M, N] = x [M, K] @ w.T with the fused kernel (x contiguous rows)."""
    m, k = x.shape
    if k != w.k:
        raise ValueError(f"x has {k} columns, the W12 weight has K={w.k}")
    if cfg.bk % 128:
        raise ValueError(f"W12 kernels step K by multiples of 128, got bk={cfg.bk}")
    if not cfg.dot and cfg.bm not in (1, 2, 4):
        raise ValueError(f"the W12 GEMV path takes bm 1, 2 or 4, got {cfg.bm}")
    if x.stride(1) != 1:
        x = x.contiguous()
    y = out if out is not None else torch.empty(m, w.n, dtype=x.dtype, device=x.device)
    grid = launch_grid(m, w.n, cfg)
    ws, cnt = workspace(x.device, grid[0] * grid[1] * grid[2] * cfg.bm * cfg.bn,
                        grid[0] * grid[2])
    kper = k_per_split(w.kp, cfg.bk, cfg.split_k)
    even = w.kp % cfg.bk == 0 and kper * cfg.split_k == w.kp
    w12_linear_kernel[grid](
        x, w.a, w.codes, w.base, w.esc_rowptr, w.esc_row, w.esc_col, w.esc_bits, y, ws, cnt,
        m, w.n, k, w.kp, w.a.stride(0), w.codes.stride(0), x.stride(0), y.stride(0), kper,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, SPLIT_K=cfg.split_k, USE_DOT=cfg.dot,
        F32_DOT=f32_dot, EVEN_K=even, num_warps=cfg.warps, num_stages=cfg.stages,
    )
    return y


@triton.jit
def w12_unpack_kernel(a_ptr, c_ptr, base_ptr, out_ptr, N, Kp, K, BN: tl.constexpr):
    """bf16 bit patterns (int16) of one 128-column group of BN rows; escapes (stored as
    code 0, byte 0: +0 here) are patched after."""
    pid_n = tl.program_id(0)
    k0 = tl.program_id(1) * 128
    rows = pid_n * BN + tl.arange(0, BN)
    h = tl.arange(0, 2)[None, :, None]
    j = tl.arange(0, 64)[None, None, :]
    r3 = rows[:, None, None]
    rmask = r3 < N
    a = tl.load(a_ptr + r3 * Kp + k0 + h * 64 + j, mask=rmask, other=0).to(tl.int32)
    cb = tl.load(c_ptr + r3 * (Kp // 2) + k0 // 2 + h * 0 + j, mask=rmask, other=0)
    base = tl.load(base_ptr + rows, mask=rows < N, other=0).to(tl.int32)[:, None, None]
    c = (cb.to(tl.int32) >> (h * 4)) & 0xF
    e = tl.where(c == 0, 0, c + base)
    bits = ((a & 0x80) << 8) | (a & 0x7F) | (e << 7)
    cols = k0 + h * 64 + j
    tl.store(out_ptr + r3 * K + cols, bits.to(tl.int16), mask=rmask & (cols < K))


def w12_unpack(w: W12Weight) -> torch.Tensor:
    """The exact bf16 matrix [N, K], decoded by a Triton kernel (plus an escape scatter)."""
    out = torch.empty(w.n, w.k, dtype=torch.int16, device=w.device)
    bn = 16
    w12_unpack_kernel[(triton.cdiv(w.n, bn), w.kp // 128)](
        w.a, w.codes, w.base, out, w.n, w.kp, w.k, BN=bn)
    if w.n_escapes:
        out[w.esc_row.long(), w.esc_col.long()] = w.esc_bits
    return out.view(torch.bfloat16)
