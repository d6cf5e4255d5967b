"""Triton kernels for the elementwise parts of a decoder layer (CUDA decode/verify steps).

Each replaces a chain of small torch kernels with one launch, with fp32 math inside and the
torch path's rounding points kept (values are rounded to the activation dtype exactly where
the torch code rounds them), so results equal the torch path's up to the order of the sums
in a norm and the last bit of exp/rsqrt:

- `rms_norm(x, w, eps, residual=None)`: optionally ``x = x + residual`` (rounded, and also
  returned), then HF's RMSNorm ``w * (x * rsqrt(mean(x^2) + eps)).to(dtype)``.
- `silu_mul(gate_up)`: ``silu(gate) * up`` over the two halves of a fused gate/up output.
- `qkv_rope(qkv, ...)`: per head of a fused q/k/v projection output: q/k RMSNorm (Qwen3),
  RoPE (``x * cos + rotate_half(x) * sin``), q written in the grouped attention layout,
  k and v written straight into the KV cache at each row's positions.

Under TRITON_INTERPRET=1 (CPU tests) use fp32 tensors: the interpreter mishandles bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl


@triton.jit
def _round(x, like):
    """fp32 x rounded to the element type of pointer `like` (to nearest, ties to even), as
    fp32. bf16 goes through integer ops: with a plain ``x.to(bf16).to(fp32)`` the H200 build
    gave results off torch's rounding in many elements (the pair was likely folded away).
    Exact for every finite value and inf."""
    if like.dtype.element_ty == tl.bfloat16:
        b = x.to(tl.int32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536  # -65536 == 0xFFFF0000 as int32
        return b.to(tl.float32, bitcast=True)
    else:
        return x.to(like.dtype.element_ty).to(tl.float32)


@triton.jit
def _round_kernel(x_ptr, out_ptr, like_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    tl.store(out_ptr + offs, _round(tl.load(x_ptr + offs, mask=m), like_ptr), mask=m)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, xo_ptr, y_ptr, N, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32)
        x = _round(x + r, xo_ptr)
        tl.store(xo_ptr + row * N + offs, x.to(xo_ptr.dtype.element_ty), mask=m)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    xn = _round(x * inv, y_ptr)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    pdl.release(PDL)
    tl.store(y_ptr + row * N + offs, (w * xn).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    g = tl.load(gu_ptr + row * 2 * N + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * N + N + offs, mask=m, other=0.0).to(tl.float32)
    pdl.release(PDL)
    s = _round(g / (1.0 + tl.exp(-g)), out_ptr)
    tl.store(out_ptr + row * N + offs, (s * u).to(out_ptr.dtype.element_ty), mask=m)




@triton.jit
def _qkv_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, nw_ptr, pos_ptr, q_ptr, k_ptr, v_ptr,
                     T, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, eps,
                     NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr,
                     HAS_NORM: tl.constexpr, USE_POS: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)  # b * T + t
    h = tl.program_id(1)  # head of the fused output: NH query, NKV key, NKV value heads
    b = row // T
    t = row % T
    HALF: tl.constexpr = HD // 2
    G: tl.constexpr = NH // NKV
    offs = tl.arange(0, HALF)
    src = qkv_ptr + row * (NH + 2 * NKV) * HD + h * HD
    x1 = tl.load(src + offs).to(tl.float32)
    x2 = tl.load(src + HALF + offs).to(tl.float32)
    pdl.release(PDL)
    if USE_POS:
        slot = tl.load(pos_ptr + row)
    else:
        slot = t
    if h < NH + NKV:
        if HAS_NORM:
            inv = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HD + eps)
            w1 = tl.load(nw_ptr + h * HD + offs).to(tl.float32)
            w2 = tl.load(nw_ptr + h * HD + HALF + offs).to(tl.float32)
            x1 = _round(w1 * _round(x1 * inv, q_ptr), q_ptr)
            x2 = _round(w2 * _round(x2 * inv, q_ptr), q_ptr)
        c1 = tl.load(cos_ptr + row * HD + offs).to(tl.float32)
        c2 = tl.load(cos_ptr + row * HD + HALF + offs).to(tl.float32)
        s1 = tl.load(sin_ptr + row * HD + offs).to(tl.float32)
        s2 = tl.load(sin_ptr + row * HD + HALF + offs).to(tl.float32)
        # x * cos + rotate_half(x) * sin, rounded as torch rounds each product and the sum
        y1 = _round(_round(x1 * c1, q_ptr) - _round(x2 * s1, q_ptr), q_ptr)
        y2 = _round(_round(x2 * c2, q_ptr) + _round(x1 * s2, q_ptr), q_ptr)
        if h < NH:
            # query head h = j * G + g goes to row t * G + g of KV head j
            j = h // G
            dst = q_ptr + ((b * NKV + j) * T * G + t * G + (h % G)) * HD
        else:
            dst = k_ptr + b * k_sb + (h - NH) * k_sh + slot * k_ss
        tl.store(dst + offs, y1.to(q_ptr.dtype.element_ty))
        tl.store(dst + HALF + offs, y2.to(q_ptr.dtype.element_ty))
    else:
        dst = v_ptr + b * v_sb + (h - NH - NKV) * v_sh + slot * v_ss
        tl.store(dst + offs, x1.to(v_ptr.dtype.element_ty))
        tl.store(dst + HALF + offs, x2.to(v_ptr.dtype.element_ty))


def round_as_kernels(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 x rounded to `dtype` the way the kernels round intermediates, returned in fp32
    (for tests of the rounding itself)."""
    x = x.float().contiguous()
    out = torch.empty_like(x)
    like = torch.empty(1, dtype=dtype, device=x.device)
    if x.numel():
        _round_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, like, x.numel(), BLOCK=1024)
    return out


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) when `residual` is given, else (x, rms_norm(x));
    normalised over the last dim, which must be contiguous, weight of the same dtype."""
    N = x.shape[-1]
    _check(weight.shape == (N,) and weight.dtype == x.dtype,
           f"rms_norm: weight must be [{N}] in {x.dtype}, got {tuple(weight.shape)} "
           f"{weight.dtype}")
    x2 = x.reshape(-1, N).contiguous()
    y = torch.empty_like(x2)
    if residual is not None:
        _check(residual.shape == x.shape and residual.dtype == x.dtype,
               "rms_norm: residual must match x in shape and dtype")
        r2 = residual.reshape(-1, N).contiguous()
        xo = torch.empty_like(x2)
    else:
        r2, xo = x2, x2
    if x2.shape[0]:
        block = triton.next_power_of_2(N)
        on = pdl.active(x.device)
        _rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, xo, y, N, eps,
                                         HAS_RES=residual is not None, BLOCK=block,
                                         num_warps=min(16, max(1, block // 512)), PDL=on,
                                         **pdl.launch(on))
    return xo.view(x.shape), y.view(x.shape)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [..., 2 * I] = cat(gate, up) on the last dim."""
    I2 = gate_up.shape[-1]
    _check(I2 % 2 == 0, f"silu_mul: last dim must be even, got {I2}")
    N = I2 // 2
    gu = gate_up.reshape(-1, I2).contiguous()
    out = torch.empty(gu.shape[0], N, dtype=gu.dtype, device=gu.device)
    if gu.shape[0]:
        block = min(2048, triton.next_power_of_2(N))
        on = pdl.active(gu.device)
        _silu_mul_kernel[(gu.shape[0], triton.cdiv(N, block))](gu, out, N, BLOCK=block,
                                                                num_warps=4, PDL=on,
                                                                **pdl.launch(on))
    return out.view(*gate_up.shape[:-1], N)


def qkv_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             norm_weight: torch.Tensor | None, eps: float, num_heads: int, num_kv_heads: int,
             positions: torch.Tensor | None = None, k_cache: torch.Tensor | None = None,
             v_cache: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split, normalise and rotate a fused projection output qkv [B, T, nh + 2 * nkv, hd].

    cos, sin [B, T, hd] (any shape with B * T * hd elements in that order); norm_weight
    [nh + nkv, hd] or None (no q/k norm). Returns q in the grouped layout
    [B, nkv, T * G, hd] (row t * G + g of KV head j is query head j * G + g) and k, v:
    with `positions` [B, T], k/v are written into the caches [Bc >= B, nkv, S, hd] at those
    slots and the caches' first B rows are returned; without, fresh [B, nkv, T, hd]."""
    B, T, H, hd = qkv.shape
    nh, nkv = num_heads, num_kv_heads
    _check(H == nh + 2 * nkv and nh % nkv == 0,
           f"qkv_rope: qkv has {H} heads, expected {nh} + 2 * {nkv}")
    _check(hd % 2 == 0 and hd == triton.next_power_of_2(hd),
           f"qkv_rope: head_dim must be a power of two, got {hd}")
    _check(cos.numel() == B * T * hd and sin.numel() == B * T * hd,
           "qkv_rope: cos/sin must hold B * T * head_dim values")
    qkv = qkv.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    if norm_weight is not None:
        _check(norm_weight.shape == (nh + nkv, hd) and norm_weight.dtype == qkv.dtype,
               "qkv_rope: norm_weight must be [nh + nkv, head_dim] in the activation dtype")
        norm_weight = norm_weight.contiguous()
    q = torch.empty(B, nkv, T * (nh // nkv), hd, dtype=qkv.dtype, device=qkv.device)
    use_pos = positions is not None
    if use_pos:
        _check(k_cache is not None and v_cache is not None and positions.shape == (B, T),
               "qkv_rope: positions need k_cache and v_cache, and must be [B, T]")
        _check(k_cache.shape[0] >= B and k_cache.shape[1] == nkv and k_cache.shape[3] == hd
               and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
               and k_cache.dtype == qkv.dtype and v_cache.shape == k_cache.shape,
               "qkv_rope: caches must be [>= B, nkv, S, head_dim] in the activation dtype")
        k_out, v_out = k_cache, v_cache
        pos = positions.contiguous()
    else:
        k_out = torch.empty(B, nkv, T, hd, dtype=qkv.dtype, device=qkv.device)
        v_out = torch.empty_like(k_out)
        pos = qkv  # unused
    if B * T:
        on = pdl.active(qkv.device)
        _qkv_rope_kernel[(B * T, H)](
            qkv, cos, sin, norm_weight if norm_weight is not None else qkv, pos, q, k_out, v_out,
            T, k_out.stride(0), k_out.stride(1), k_out.stride(2),
            v_out.stride(0), v_out.stride(1), v_out.stride(2), eps,
            NH=nh, NKV=nkv, HD=hd, HAS_NORM=norm_weight is not None, USE_POS=use_pos,
            num_warps=1 if hd <= 128 else 2, PDL=on, **pdl.launch(on))
    if use_pos:
        return q, k_out[:B], v_out[:B]
    return q, k_out, v_out
