"""A Triton bf16 linear of the same design as the W12 kernel (the fair bf16 baseline).

y = x @ w.T for skinny x: CUDA-core GEMV for batch 1-4, tl.dot for larger batches, fp32
accumulation, weights streamed with evict_first, activations kept with evict_last,
split-K in one launch (see `splitk.py`). Benchmarks compare W12 against the faster of this
kernel and cuBLAS.

`GemvLinear` / `apply_gemv` are the engine's linear backend (knob `gemv = "auto"`): each
bf16 CUDA linear runs this kernel in the batch buckets where the device's tuned table says
it beats cuBLAS, and `F.linear` everywhere else.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from . import pdl
from .splitk import k_per_split, reduce_partials, store_partial_and_count, workspace
from .tuning import BUCKETS, TunedTable, bucket, load_table
from .w12_triton import PIPE, KernelConfig, launch_grid


@triton.jit
def bf16_linear_kernel(
    x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_w, stride_xm, stride_ym, K_PER,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr, F32_DOT: tl.constexpr, EVEN_K: tl.constexpr, VARIANT: tl.constexpr,
    PDL: tl.constexpr = False, LOOP_STAGES: tl.constexpr = None,
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
    k_lo = pid_k * K_PER
    pdl.enter(PDL)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc3 = tl.zeros((BM, BN, BK), dtype=tl.float32)  # GEMV VARIANT 1 only
    # LOOP_STAGES (PIPE, as in the W12 GEMV): this loop's own pipelining depth
    for k0 in tl.range(k_lo, tl.minimum(k_lo + K_PER, K), BK, num_stages=LOOP_STAGES):
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
    pdl.release(PDL)
    if not USE_DOT and VARIANT == 1:
        acc = tl.sum(acc3, axis=2)
    finish = True
    if SPLIT_K > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        finish = store_partial_and_count(acc, ws_ptr, cnt_ptr, tile, pid_k, BM, BN)
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
    on = pdl.active(x.device)
    kper, consts = kernel_constants(k, cfg, f32_dot, on)
    bf16_linear_kernel[grid](
        x, w, y, ws, cnt, m, n, k, w.stride(0), x.stride(0), y.stride(0), kper,
        num_warps=cfg.warps, num_stages=cfg.stages, **consts, **pdl.launch(on),
    )
    return y


def kernel_constants(k: int, cfg: KernelConfig, f32_dot: bool = False,
                     use_pdl: bool = False) -> tuple[int, dict]:
    """(columns per split, the kernel's constexprs) of a call with K columns (shared by
    `bf16_matmul` and the sm90 compile test)."""
    kper = k_per_split(k, cfg.bk, cfg.split_k)
    even = k % cfg.bk == 0 and kper * cfg.split_k == k
    return kper, {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "SPLIT_K": cfg.split_k,
                  "USE_DOT": cfg.dot, "F32_DOT": f32_dot, "EVEN_K": even,
                  "VARIANT": cfg.variant & ~PIPE, "PDL": use_pdl,
                  "LOOP_STAGES": cfg.stages if cfg.variant & PIPE and not cfg.dot else None}


# -- the engine's linear backend: the Triton kernel where the tuned table says it wins -------

MIN_GEMV_GAIN = 1.02  # cuBLAS time / Triton time needed to switch a (shape, batch bucket)


class GemvLinear(nn.Linear):
    """An `nn.Linear` (same weight and bias Parameters, so ties and `.weight` keep working)
    whose calls with a row count in `configs`' batch buckets run `bf16_matmul` on CUDA with
    bf16 activations; every other call (other buckets, prefill, CPU, fp32) is `F.linear`."""

    def __init__(self, linear: nn.Linear, configs: dict[int, KernelConfig]):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.configs = dict(configs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if self.in_features else 0
        cfg = self.configs.get(bucket(rows)) if x.is_cuda and rows else None
        if cfg is None or x.dtype != torch.bfloat16 or self.weight.dtype != torch.bfloat16:
            return F.linear(x, self.weight, self.bias)
        y = bf16_matmul(x.reshape(rows, self.in_features), self.weight, cfg)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", triton_buckets={sorted(self.configs)}"


@dataclass
class GemvReport:
    """What `apply_gemv` did: per swapped layer name, the buckets that run Triton."""

    swapped: dict[str, list[int]] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)


def gemv_configs(n: int, k: int, table: TunedTable,
                 min_gain: float = MIN_GEMV_GAIN) -> dict[int, KernelConfig]:
    """Batch bucket -> Triton config for an [n, k] weight, for the buckets where the table
    says Triton beats cuBLAS by `min_gain`: measured on this shape when the table has both,
    else when the median gain over the table's other shapes at that bucket does (then with
    the config that won most often there)."""
    out = {}
    for b in BUCKETS:
        t_tri, t_cub = table.median_us("bf16", n, k, b), table.median_us("cublas", n, k, b)
        if t_tri and t_cub:
            if t_cub / t_tri >= min_gain:
                out[b] = table.lookup("bf16", n, k, b)
            continue
        gains, winners = [], Counter()
        for key, hit in table.entries.items():
            kern, shape, bb = key.split(":")
            if kern != "bf16" or bb != f"b{b}":
                continue
            sn, sk = map(int, shape.split("x"))
            cub = table.median_us("cublas", sn, sk, b)
            if cub:
                gains.append(cub / hit["median_us"])
                if gains[-1] >= min_gain:
                    winners[json.dumps(hit["config"], sort_keys=True)] += 1
        if gains and sorted(gains)[len(gains) // 2] >= min_gain and winners:
            out[b] = KernelConfig.from_dict(json.loads(winners.most_common(1)[0][0]))
    return out


def apply_gemv(model: nn.Module, table: TunedTable | None = None,
               min_gain: float = MIN_GEMV_GAIN) -> GemvReport:
    """Swap, in place, every bf16 CUDA `nn.Linear` of `model` (contiguous weight) for a
    `GemvLinear` that runs the Triton kernel in the batch buckets where the tuned table
    (default: the device's, `tuning.load_table`) says it beats cuBLAS. Layers with no such
    bucket, and every layer of a CPU or non-bf16 model, are left alone."""
    rep = GemvReport()
    for name, mod in list(model.named_modules()):
        if type(mod) is not nn.Linear:
            continue
        w = mod.weight
        if not (w.is_cuda and w.dtype == torch.bfloat16 and w.is_contiguous()):
            rep.kept.append(name)
            continue
        if table is None:
            table = load_table(torch.cuda.get_device_name(w.device))
        cfgs = gemv_configs(w.shape[0], w.shape[1], table, min_gain)
        if not cfgs:
            rep.kept.append(name)
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, GemvLinear(mod, cfgs))
        rep.swapped[name] = sorted(cfgs)
    return rep
