"""Triton attention for decode and verify steps (few query rows, a long KV cache).

`attend(q, k, v, mask)` computes what ``F.scaled_dot_product_attention(q, k, v,
attn_mask=mask)`` computes for q [B, H, M, hd] and k/v [B, H, S, hd] (one KV head per q
head, e.g. the grouped layout of `runtime.model`: the G query heads of a KV head stacked as
rows): scale 1/sqrt(hd), an additive mask (broadcastable to [B, H, M, S]; a bool mask is
turned into 0/-inf), softmax and both sums in fp32, output in q's dtype. bf16/fp16 operands
go to the tensor cores as flash attention does (q.k^T in fp32 from bf16 operands, the
probabilities rounded to v's dtype for p.v, fp32 accumulation); fp32 operands use full fp32
dots (what the CPU interpreter tests check to 1e-6). `attend_merged(..., groups)` is the same
function written straight into o_proj's input layout [B, M / G, H * G * hd], which saves the
transpose copy of the SDPA path.

Flash-decoding: the S axis is split into chunks so that a batch-1 step with few KV heads
still fills the GPU; each program keeps an online softmax over its chunk, stores fp32
partials (unnormalised sum, running max, running denominator) and bumps a per-tile counter;
the last program of a tile combines the partials (a few splits' loads at a time) and writes
the output (one launch, the counters reset to zero, nothing to memset: CUDA-graph
friendly). The grid, the split and the block shape come from the shapes alone (no host
sync, no data-dependent shape): `choose_splits` and `launch_config`.

Rows whose mask is -inf everywhere (unused batch rows) come out as exact zeros, as torch's
SDPA gives on CPU (it gives zeros on the CUDA flash/efficient paths too), never NaN.

Head dims 64 and 128 on CUDA (or under TRITON_INTERPRET=1) run here; anything else falls
back to SDPA (`supported` says which). Under TRITON_INTERPRET=1 use fp32: the interpreter
mishandles bf16.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import interpreting, pdl

HEAD_DIMS = (64, 128)
MIN_SPLIT = 256  # fewest KV slots a split handles (see `choose_splits`)
MAX_SPLITS = 8
_SM_COUNT: dict[torch.device, int] = {}
_WORKSPACES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
# outgrown workspaces stay alive: a CUDA graph captured earlier holds their addresses
_RETIRED: list[torch.Tensor] = []


@triton.jit
def _attn_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, ws_ptr, ml_ptr, cnt_ptr,
                 H, M, S, G, chunk, n_mt,
                 sq_b, sq_h, sq_m, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                 sm_b, sm_h, sm_m, sm_s, so_b, so_h, so_t, so_g, qk_scale,
                 HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HAS_MASK: tl.constexpr, SPLIT: tl.constexpr, F32_DOT: tl.constexpr,
                 NSP: tl.constexpr = 1, CH: tl.constexpr = 1, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    LOG2E: tl.constexpr = 1.4426950408889634
    bh = tl.program_id(0) // n_mt  # the row tiles of one head are neighbours (L2 reuse)
    mt = tl.program_id(0) % n_mt
    sp = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    d = tl.arange(0, HD)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_m + d[None, :],
                mask=rmask[:, None], other=0.0)
    if F32_DOT:
        q = q.to(tl.float32)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h
    m_base = mask_ptr + b * sm_b + h * sm_h + rows[:, None] * sm_m
    start = sp * chunk
    end = tl.minimum(start + chunk, S)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HD), tl.float32)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        cmask = cols < end
        kt = tl.load(k_base + cols[None, :] * sk_s + d[:, None], mask=cmask[None, :],
                     other=0.0)  # [HD, BLOCK_N]
        v = tl.load(v_base + cols[:, None] * sv_s + d[None, :], mask=cmask[:, None],
                    other=0.0)  # [BLOCK_N, HD]
        if F32_DOT:
            s = tl.dot(q, kt.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * qk_scale
        if HAS_MASK:
            add = tl.load(m_base + cols[None, :] * sm_s, mask=rmask[:, None] & cmask[None, :],
                          other=float("-inf")).to(tl.float32)
            s = s + add * LOG2E
        s = tl.where(cmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: no NaN
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if F32_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    pdl.release(PDL)
    if SPLIT:
        tile = bh * n_mt + mt
        nsp = tl.num_programs(1)
        r = tl.arange(0, BLOCK_M)
        part = (tile * nsp + sp).to(tl.int64)
        # padded rows (past M) store nothing: at T = 1, G = 4 they are 3/4 of the tile
        tl.store(ws_ptr + part * BLOCK_M * HD + r[:, None] * HD + d[None, :], acc,
                 mask=rmask[:, None])
        tl.store(ml_ptr + part * 2 * BLOCK_M + r, m_i)
        tl.store(ml_ptr + part * 2 * BLOCK_M + BLOCK_M + r, l_i)
        tl.debug_barrier()
        last = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel") == nsp - 1
        if last:  # the last split of this tile combines them all
            # every split's max and denominator in one load [NSP, BLOCK_M]; the partial
            # sums CH splits a step, their loads issued together (not a round trip a split)
            js = tl.arange(0, NSP)
            pj = (tile * nsp + js).to(tl.int64)
            ml_j = ml_ptr + pj[:, None] * 2 * BLOCK_M + r[None, :]
            jm = (js < nsp)[:, None]
            m_j = tl.load(ml_j, mask=jm, other=float("-inf"), cache_modifier=".cg")
            l_j = tl.load(ml_j + BLOCK_M, mask=jm, other=0.0, cache_modifier=".cg")
            m_all = tl.max(m_j, 0)
            m_use = tl.where(m_all == float("-inf"), 0.0, m_all)
            l_i = tl.sum(tl.exp2(m_j - m_use[None, :]) * l_j, 0)
            acc = tl.zeros((BLOCK_M, HD), tl.float32)
            for j0 in range(0, nsp, CH):
                for c in tl.static_range(CH):
                    ok = j0 + c < nsp
                    pc = (tile * nsp + j0 + c).to(tl.int64)
                    w = tl.exp2(tl.load(ml_ptr + pc * 2 * BLOCK_M + r, mask=ok,
                                        other=float("-inf"), cache_modifier=".cg") - m_use)
                    acc += w[:, None] * tl.load(ws_ptr + pc * BLOCK_M * HD + r[:, None] * HD
                                                + d[None, :], mask=ok & rmask[:, None],
                                                other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        last = True
    if last:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # fully masked rows: 0
        t = rows // G
        g = rows % G
        dst = o_ptr + b * so_b + h * so_h + t[:, None] * so_t + g[:, None] * so_g + d[None, :]
        tl.store(dst, out.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


def supported(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether `attend` runs the Triton kernel for these inputs (else it calls SDPA): head
    dim 64 or 128, bf16/fp16/fp32, one KV head per q head, on CUDA (or any device under
    TRITON_INTERPRET=1)."""
    return (q.dim() == 4 and k.dim() == 4 and q.shape[-1] in HEAD_DIMS
            and q.shape[:2] == k.shape[:2] and k.shape[-1] == q.shape[-1]
            and q.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and k.dtype == q.dtype and (q.is_cuda or interpreting()))


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: an H200's count, so the CPU tests split as the GPU does
    n = _SM_COUNT.get(device)
    if n is None:
        n = _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def block_m(rows: int) -> int:
    """Query rows per program: the rows rounded up to a power of two, 16 to 64 (more rows
    take several row tiles: on the H200 (2026-11-29, benchmarks/attention_bench.py --sweep)
    tiles of 64 rows beat tiles of 128 by 1.1-1.5x on the 32B verify shapes)."""
    return min(64, max(16, triton.next_power_of_2(rows)))


def launch_config(rows: int, programs: int, sm_count: int = 132) -> dict:
    """Block shape, warps and stages for `rows` query rows per head and `programs` programs
    in all. From the H200 sweep (2026-12-04, `benchmarks/attention_bench.py --sweep`, 36
    decode/verify shapes): 128 KV slots an iteration, three stages deep, while the programs
    fit one wave; 64 once they do not, and on 64-row tiles (whose 128-slot tiles three
    deep do not fit in shared memory); 64-row tiles in several waves two stages deep
    (more of them fit on an SM)."""
    bm = block_m(rows)
    waves = programs > sm_count
    bn = 64 if bm == 64 or waves else 128
    stages = 2 if bm == 64 and waves else 3
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4, "num_stages": stages}


def choose_splits(tiles: int, S: int, sm_count: int = 132) -> int:
    """KV splits per (batch, head, row tile) for `tiles` such tiles, from the shapes alone:
    a power of two, at most MAX_SPLITS and at most two waves of programs over the SMs, each
    split at least MIN_SPLIT slots (2 * MIN_SPLIT once the tiles alone would fill a quarter
    of the SMs), none once they fill them all: below that a split's partials and combine
    cost more than its shorter loop saves (the H200 sweep of `launch_config`)."""
    if tiles >= sm_count:
        return 1
    shortest = MIN_SPLIT if 4 * tiles < sm_count else 2 * MIN_SPLIT
    most = min(MAX_SPLITS, S // shortest, 2 * sm_count // tiles)
    return 1 << (max(1, most).bit_length() - 1)


def _workspace(device: torch.device, n_ws: int, n_ml: int,
               n_tiles: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp32 partial sums >= n_ws, fp32 max/denominators >= n_ml, int32 zero counters)."""
    ws, cnt = _WORKSPACES.get(device, (None, None))
    if ws is None or ws.numel() < n_ws + n_ml:
        if ws is not None:
            _RETIRED.append(ws)
        ws = torch.empty(max(2 * (n_ws + n_ml), 1 << 16), dtype=torch.float32, device=device)
    if cnt is None or cnt.numel() < n_tiles:
        if cnt is not None:
            _RETIRED.append(cnt)
        cnt = torch.zeros(max(2 * n_tiles, 1 << 10), dtype=torch.int32, device=device)
    _WORKSPACES[device] = (ws, cnt)
    return ws[:n_ws], ws[ws.numel() - n_ml:], cnt


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf"))
    return mask


def _launch(q, k, v, mask, out, G: int, so: tuple[int, int, int, int],
            splits: int | None, config: dict | None = None) -> None:
    B, H, M, hd = q.shape
    S = k.shape[2]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if mask is not None:
        mask = _additive(mask, q.dtype).expand(B, H, M, S)
        sm = mask.stride()
    else:
        mask, sm = q, (0, 0, 0, 0)
    config = config or {}
    n_sm = _sm_count(q.device)
    bm = config.get("BLOCK_M", block_m(M))
    n_mt = triton.cdiv(M, bm)
    if splits is None:
        splits = choose_splits(B * H * n_mt, S, n_sm)
    cfg = {**launch_config(M, B * H * n_mt * splits, n_sm), "BLOCK_M": bm, **config}
    bn = cfg["BLOCK_N"]
    chunk = triton.cdiv(triton.cdiv(max(S, 1), splits), bn) * bn
    splits = triton.cdiv(max(S, 1), chunk)  # no empty split
    n_tiles = B * H * n_mt
    if splits > 1:
        ws, ml, cnt = _workspace(q.device, n_tiles * splits * bm * hd,
                                 n_tiles * splits * 2 * bm, n_tiles)
    else:
        ws = ml = cnt = out  # unused
    on = pdl.active(q.device)
    _attn_kernel[(n_tiles, splits)](
        q, k, v, mask, out, ws, ml, cnt, H, M, S, G, chunk, n_mt,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *sm, *so,
        (1.0 / math.sqrt(hd)) * 1.4426950408889634,
        HD=hd, HAS_MASK=mask is not q, SPLIT=splits > 1, F32_DOT=q.dtype == torch.float32,
        NSP=triton.next_power_of_2(splits), CH=combine_step(splits, bm, hd),
        PDL=on, **cfg, **pdl.launch(on))


def combine_step(splits: int, bm: int, hd: int) -> int:
    """Splits the combine reads a step: a [CH, bm, hd] fp32 tile of about 8192 values."""
    return max(1, min(triton.next_power_of_2(splits), 8192 // (bm * hd)))


def _check(q, k, v, mask) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2]:
        raise ValueError(f"attend: q [B, H, M, hd] and k, v [B, H, S, hd] expected, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if mask is not None and mask.shape[-1] != k.shape[2]:
        raise ValueError(f"attend: mask's last dim must be S={k.shape[2]}, got "
                         f"{tuple(mask.shape)}")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           splits: int | None = None, config: dict | None = None) -> torch.Tensor:
    """SDPA(q, k, v, attn_mask=mask) [B, H, M, hd] (see the module docstring); `splits`
    overrides the KV split and `config` entries of `launch_config` (tests and benchmarks)."""
    _check(q, k, v, mask)
    if not supported(q, k):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    B, H, M, hd = q.shape
    out = torch.empty(B, H, M, hd, dtype=q.dtype, device=q.device)
    if out.numel():
        _launch(q, k, v, mask, out, 1, (H * M * hd, M * hd, hd, 0), splits, config)
    return out


def attend_merged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, groups: int,
                  splits: int | None = None, config: dict | None = None) -> torch.Tensor:
    """`attend` for grouped rows (row t * groups + g of head j is query head j * groups + g
    at position t), returned as [B, M / groups, H * groups * hd]: o_proj's input."""
    _check(q, k, v, mask)
    B, H, M, hd = q.shape
    if M % groups:
        raise ValueError(f"attend_merged: {M} rows are not a multiple of groups={groups}")
    T = M // groups
    if not supported(q, k):
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return y.view(B, H, T, groups, hd).transpose(1, 2).reshape(B, T, H * groups * hd)
    out = torch.empty(B, T, H * groups * hd, dtype=q.dtype, device=q.device)
    if out.numel():
        _launch(q, k, v, mask, out, groups, (T * H * groups * hd, groups * hd,
                                            H * groups * hd, hd), splits, config)
    return out
