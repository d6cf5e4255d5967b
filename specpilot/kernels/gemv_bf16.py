"""A Triton bf16 linear of the same design as the W12 kernel (the fair bf16 baseline).

y = x @ w.T for skinny x: CUDA-core GEMV for batch 1-4, tl.dot for larger batches, fp32
accumulation, weights streamed with evict_first, activations kept with evict_last,
split-K in one launch (see `splitk.py`). Benchmarks compare W12 against the faster of this
kernel and cuBLAS; the engine may use it wherever it beats cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .splitk import k_per_split, reduce_partials, store_partial_and_count, workspace
from .w12_triton import KernelConfig, launch_grid


@triton.jit
def bf16_linear_kernel(
    x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_w, stride_xm, stride_ym, K_PER,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr, F32_DOT: tl.constexpr, EVEN_K: tl.constexpr, VARIANT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = offs_n % N
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    kk = tl.arange(0, BK)
    w_off = rows[:, None] * stride_w + kk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc3 = tl.zeros((BM, BN, BK), dtype=tl.float32)  # GEMV VARIANT 1 only
    k_lo = pid_k * K_PER
    for k0 in range(k_lo, tl.minimum(k_lo + K_PER, K), BK):
        if EVEN_K:
            w = tl.load(w_ptr + w_off + k0, eviction_policy="evict_first")
        else:
            w = tl.load(w_ptr + w_off + k0, mask=(k0 + kk < K)[None, :], other=0.0,
                        eviction_policy="evict_first")
        if USE_DOT:
            xt = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + kk)[None, :],
                         mask=m_mask[:, None] & (k0 + kk < K)[None, :], other=0.0,
                         eviction_policy="evict_last")
            if F32_DOT:
                acc += tl.dot(xt.to(tl.float32), tl.trans(w.to(tl.float32)),
                              input_precision="ieee")
            else:
                acc += tl.dot(xt.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
        elif VARIANT == 1:
            x3 = tl.load(x_ptr + offs_m[:, None, None] * stride_xm + (k0 + kk)[None, None, :],
                         mask=m_mask[:, None, None] & (k0 + kk < K)[None, None, :], other=0.0,
                         eviction_policy="evict_last").to(tl.float32)
            acc3 += w.to(tl.float32)[None, :, :] * x3
        else:
            wf = w.to(tl.float32)
            for m in tl.static_range(BM):
                row_m = pid_m * BM + m
                xm = tl.load(x_ptr + row_m * stride_xm + k0 + kk, mask=(k0 + kk < K) & (row_m < M),
                             other=0.0, eviction_policy="evict_last").to(tl.float32)
                part = tl.sum(wf * xm[None, :], axis=1)
                acc += tl.where((tl.arange(0, BM) == m)[:, None], part[None, :], 0.0)
    if not USE_DOT and VARIANT == 1:
        acc = tl.sum(acc3, axis=2)
    finish = True
    if SPLIT_K > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        finish = store_partial_and_count(acc, ws_ptr, cnt_ptr, tile, pid_k, offs_m, offs_n, BM, BN)
    if finish:
        if SPLIT_K > 1:
            acc = reduce_partials(ws_ptr, cnt_ptr, tile, BM, BN)
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & (offs_n < N)[None, :])


def bf16_matmul(x: torch.Tensor, w: torch.Tensor, cfg: KernelConfig,
                out: torch.Tensor | None = None, f32_dot: bool = False) -> torch.Tensor:
    """y [M, N] = x [M, K] @ w.T for a row-major weight w [N, K]."""
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"x has {k} columns, w has {w.shape[1]}")
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = launch_grid(m, n, cfg)
    ws, cnt = workspace(x.device, grid[0] * grid[1] * grid[2] * cfg.bm * cfg.bn,
                        grid[0] * grid[2])
    kper = k_per_split(k, cfg.bk, cfg.split_k)
    even = k % cfg.bk == 0 and kper * cfg.split_k == k
    bf16_linear_kernel[grid](
        x, w, y, ws, cnt, m, n, k, w.stride(0), x.stride(0), y.stride(0), kper,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, SPLIT_K=cfg.split_k, USE_DOT=cfg.dot,
        F32_DOT=f32_dot, EVEN_K=even, VARIANT=cfg.variant, num_warps=cfg.warps,
        num_stages=cfg.stages,
    )
    return y
