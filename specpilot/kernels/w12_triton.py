"""Triton kernels for W12 weights: fused decode + CUDA-core GEMV (batch 1-4), fused
decode + tensor cores (batch 2-32), and a Triton unpack.

The format (`w12.py`) stores 8 weights in 3 words (codes, A0, A1) so that the scaled
weights w' are built with word-wide ops: per 8 weights 4 and/or pairs (fused to LOP3), one
rotate and 8 byte permutes (PTX `prmt`, via `tl.inline_asm_elementwise`) give 8 fp32
values; for the tensor-core path 2 and/or pairs, one rotate and 4 permutes give 4 bf16x2
words. There is no per-weight select: the row's 2^(base - E0) multiplies the finished dot
products, and escapes (decoded as the placeholder 2^-15) are corrected from the row-sorted
side table in the same launch. Accumulation is fp32; split-K uses the one-launch workspace
reduction of `splitk.py`.

Tensor-core paths. Weight i (0..7) of word g of a column group sits at column
q * 8GW + i * GW + g, so the i-th decoded tile w_i [BN, words] of a step covers contiguous
columns. The *sliced* path (variant bit 2) does 8 `tl.dot`s per step, one per i, each on
w_i (elementwise from the loaded word tiles, no reshape) and the matching x slice loaded
directly: the word tiles and x slices stream through cp.async into shared memory and the
decoded weights go from registers straight into the MMA (mma.sync B operand in x W^T,
wgmma A operand in W x^T); escape corrections are spread over the K steps (one chunk per
step, table loaded a step ahead). The older *joined* path (bit 2 clear) joins the 8 tiles
into one [BN, BK] tile and permutes x to match (a shared-memory round trip per step).

`KernelConfig.variant` for W12: bit 0 = PTX byte-permute decode (else the same bit math in
plain Triton ops), bit 1 = tensor-core path computes (W x^T) instead of (x W^T), bit 2 =
sliced tensor-core path, bit 4 (`PIPE`) = the GEMV's K loop software-pipelined through
shared memory, `stages` deep (cp.async; without it the loop, which has no dot, is left
unpipelined whatever the launch's `num_stages`: each step waits a full memory round
trip), bit 5 (`DEFER`) = the GEMV's first escape chunk spread over its first two steps
(table loaded in the first, x gathered in the second, terms added after the loop) instead
of done in the first step, bit 6 (`GLUON`) = the Gluon kernel of `w12_gluon.py` (weights
straight from global memory into MMA registers; bm 8 or 16, `stages` = steps prefetched,
CUDA only; bit 8, `XPRE`, loads x slices a step ahead too; bit 9, `SK`, launches it
stream-K: `split_k` programs an SM share the (tile, step) units evenly), bit 7 (`WGMMA`) =
the TMA + wgmma kernel of `w12_wgmma.py` (in the grid at batch 9-32, with 16 or 32 rows of x;
bm 8/16/32, bn 64 or 128 weight rows, `stages` = shared-memory ring steps; bit 11, `XT`,
gathers the escapes' x values from x^T made by a small kernel launched ahead of it). Under
TRITON_INTERPRET=1 (CPU tests) the plain decode is used, activations/outputs are fp32 and
`f32_dot=True`: the interpreter mishandles bf16 and cannot run PTX.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from . import interpreting, pdl
from .splitk import k_per_split, reduce_partials, store_partial_and_count, workspace
from .w12 import W12Weight

GLUON = 64  # `KernelConfig.variant` bit of the W12 Gluon kernel
WGMMA = 128  # ... and of the W12 TMA + wgmma kernel (`w12_wgmma.py`)
XPRE = 256  # with GLUON: x slices loaded a step ahead with the words (batch 2-8, depth 1)
SK = 512  # with GLUON: stream-K (`split_k` = programs an SM, sharing the (tile, step) units)
L1EF = 1024  # with GLUON: the words load with an L1 evict-first hint only, no L2 policy
PIPE = 16  # the GEMV's loop pipelined through shared memory, `stages` deep (`LOOP_STAGES`)
DEFER = 32  # the GEMV's first escape chunk spread over its first two steps (`ESC_DEFER`)
XT = 2048  # with WGMMA: the escapes' x values from x^T (made ahead, PDL in between)


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of a W12 or bf16 linear kernel."""

    bm: int = 1  # rows of x per program (GEMV: 1..4, dot: 16/32)
    bn: int = 8  # output features per program
    bk: int = 512  # K columns per loop step (W12: rounded up to whole column groups)
    split_k: int = 1
    warps: int = 4
    stages: int = 3
    dot: bool = False  # tensor-core path
    variant: int = 1  # bf16 GEMV: 0 reduce every step, 1 elementwise acc; W12: see above

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelConfig:
        return cls(**{k: (bool(v) if k == "dot" else int(v)) for k, v in d.items()})

    @property
    def label(self) -> str:
        kind = "dot" if self.dot else "gemv"
        return (f"{kind}{self.variant}_m{self.bm}n{self.bn}k{self.bk}s{self.split_k}"
                f"w{self.warps}p{self.stages}")


# -- decode: 3 words -> 8 weights ---------------------------------------------------------

@triton.jit
def _rotr4(c):
    return ((c >> 4) & 0x0FFFFFFF) | (c << 28)


@triton.jit
def _f32_plain(x, a, j: tl.constexpr):
    # fp32 bits of w': byte 3 = (H | 0x38), byte 2 = L, low half 0
    h = (x >> (8 * j)) & 0x87
    lo = (a >> (8 * j)) & 0xFF
    return ((h << 24) | (lo << 16) | 0x38000000).to(tl.float32, bitcast=True)


@triton.jit
def _decode_f32(c, a0, a1, USE_ASM: tl.constexpr):
    """The 8 fp32 weights w'_0..7 of words (codes c, a0, a1), int32 tensors of one shape."""
    if USE_ASM:
        f0, f1, f2, f3, f4, f5, f6, f7 = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 r, h02, h13, g02, g13;
            lop3.b32 h02, $8, $11, $13, 0xEA;
            lop3.b32 h13, $8, $12, $14, 0xEA;
            shf.r.wrap.b32 r, $8, $8, 4;
            lop3.b32 g02, r, $11, $13, 0xEA;
            lop3.b32 g13, r, $12, $14, 0xEA;
            prmt.b32 $0, h02, $9, 0x0411;
            prmt.b32 $1, h13, $9, 0x1500;
            prmt.b32 $2, h02, $9, 0x2611;
            prmt.b32 $3, h13, $9, 0x3700;
            prmt.b32 $4, g02, $10, 0x0411;
            prmt.b32 $5, g13, $10, 0x1500;
            prmt.b32 $6, g02, $10, 0x2611;
            prmt.b32 $7, g13, $10, 0x3700;
            }
            """,
            constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r",
            args=[c, a0, a1, tl.full(c.shape, 0x00870087, tl.int32),
                  tl.full(c.shape, -2030008576, tl.int32), tl.full(c.shape, 0x00380038, tl.int32),
                  tl.full(c.shape, 0x38003800, tl.int32)], dtype=(tl.int32,) * 8, is_pure=True,
            pack=1)
        return (f0.to(tl.float32, bitcast=True), f1.to(tl.float32, bitcast=True),
                f2.to(tl.float32, bitcast=True), f3.to(tl.float32, bitcast=True),
                f4.to(tl.float32, bitcast=True), f5.to(tl.float32, bitcast=True),
                f6.to(tl.float32, bitcast=True), f7.to(tl.float32, bitcast=True))
    else:
        r = _rotr4(c)
        return (_f32_plain(c, a0, 0), _f32_plain(c, a0, 1), _f32_plain(c, a0, 2),
                _f32_plain(c, a0, 3), _f32_plain(r, a1, 0), _f32_plain(r, a1, 1),
                _f32_plain(r, a1, 2), _f32_plain(r, a1, 3))


@triton.jit
def _bf16_plain(x, a, j: tl.constexpr):
    h = (x >> (8 * j)) & 0x87
    lo = (a >> (8 * j)) & 0xFF
    return (((h | 0x38) << 8) | lo).to(tl.int16).to(tl.bfloat16, bitcast=True)


# The bf16 decode of words (codes $8, A0 $9, A1 $10; masks $11 = 0x87878787, $12 =
# 0x38383838) into w'_0..7 ($0..$7, int16 bits): shared with the Gluon kernel
DECODE_BF16_ASM = tl.constexpr("""
    {
    .reg .b32 r, h, g, p0, p1, p2, p3;
    lop3.b32 h, $8, $11, $12, 0xEA;
    shf.r.wrap.b32 r, $8, $8, 4;
    lop3.b32 g, r, $11, $12, 0xEA;
    prmt.b32 p0, $9, h, 0x5140;
    prmt.b32 p1, $9, h, 0x7362;
    prmt.b32 p2, $10, g, 0x5140;
    prmt.b32 p3, $10, g, 0x7362;
    mov.b32 {$0, $1}, p0;
    mov.b32 {$2, $3}, p1;
    mov.b32 {$4, $5}, p2;
    mov.b32 {$6, $7}, p3;
    }
    """)
DECODE_BF16_CONSTRAINTS = tl.constexpr("=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r")
H_MASK4 = tl.constexpr(-2021161081)  # 0x87878787 as an int32
H_CONST4 = tl.constexpr(0x38383838)


@triton.jit
def _decode_bf16(c, a0, a1, USE_ASM: tl.constexpr):
    """The 8 bf16 weights w'_0..7 of words (c, a0, a1)."""
    if USE_ASM:
        b0, b1, b2, b3, b4, b5, b6, b7 = tl.inline_asm_elementwise(
            asm=DECODE_BF16_ASM, constraints=DECODE_BF16_CONSTRAINTS,
            args=[c, a0, a1, tl.full(c.shape, H_MASK4, tl.int32),
                  tl.full(c.shape, H_CONST4, tl.int32)], dtype=(tl.int16,) * 8, is_pure=True,
            pack=1)
        return (b0.to(tl.bfloat16, bitcast=True), b1.to(tl.bfloat16, bitcast=True),
                b2.to(tl.bfloat16, bitcast=True), b3.to(tl.bfloat16, bitcast=True),
                b4.to(tl.bfloat16, bitcast=True), b5.to(tl.bfloat16, bitcast=True),
                b6.to(tl.bfloat16, bitcast=True), b7.to(tl.bfloat16, bitcast=True))
    else:
        r = _rotr4(c)
        return (_bf16_plain(c, a0, 0), _bf16_plain(c, a0, 1), _bf16_plain(c, a0, 2),
                _bf16_plain(c, a0, 3), _bf16_plain(r, a1, 0), _bf16_plain(r, a1, 1),
                _bf16_plain(r, a1, 2), _bf16_plain(r, a1, 3))


@triton.jit
def _join8(w0, w1, w2, w3, w4, w5, w6, w7):
    """[..., 2, 2, 2] holding w_i at flat index i of the new last dimension (tl.join appends the new
    dimension last, so nesting reverses the index bits: feed them bit-reversed)."""
    return tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)),
                   tl.join(tl.join(w1, w5), tl.join(w3, w7)))


# -- epilogue -----------------------------------------------------------------------------

@triton.jit
def _escape_chunk(e0, hi, x_ptr, stride_xm, offs_m, m_mask, offs_n, ph, erow_ptr, ecol_ptr,
                  ebits_ptr, ECH: tl.constexpr):
    """[BM, BN] correction of escapes e0 .. min(e0 + ECH, hi): x * value - x * placeholder
    added to the escape's own (row, column); all loads vectorized (one round trip for the
    table, one for the x gather)."""
    r, col, v = _escape_table(e0, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH)
    xv = _escape_x(x_ptr, stride_xm, offs_m, m_mask, r, col)
    return _escape_terms(xv, r, v, offs_n, ph)


@triton.jit
def _escape_x(x_ptr, stride_xm, offs_m, m_mask, r, col):
    """[BM, ECH]: x at the escapes' columns (0 for table slots past the end, r = -1), as
    loaded (converted where used: a conversion here would wait for the load)."""
    return tl.load(x_ptr + offs_m[:, None] * stride_xm + col[None, :],
                   mask=m_mask[:, None] & (r >= 0)[None, :], other=0.0)


@triton.jit
def _escape_terms(xv, r, bits, offs_n, ph):
    """[BM, BN]: x * value - x * placeholder of each escape (x values xv [BM, ECH], rows r,
    values' bf16 bits [ECH]) added to its own row; escapes of other rows (r = -1) drop out."""
    hit = (offs_n[:, None] == r[None, :])[None, :, :]  # [1, BN, ECH]
    xv = xv.to(tl.float32)
    v = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    t = xv[:, None, :] * v[None, None, :] - xv[:, None, :] * ph[None, :, None]
    return tl.sum(tl.where(hit, t, 0.0), axis=2)


@triton.jit
def _escape_table(e0, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH: tl.constexpr):
    """(rows, columns, bf16 bits of the values) of escapes e0 .. min(e0 + ECH, hi); rows -1
    past hi."""
    e = e0 + tl.arange(0, ECH)
    em = e < hi
    r = tl.load(erow_ptr + e, mask=em, other=-1)
    col = tl.load(ecol_ptr + e, mask=em, other=0)
    bits = tl.load(ebits_ptr + e, mask=em, other=0)
    return r, col, bits


@triton.jit
def _finish(acc, esc, x_ptr, stride_xm, offs_m, m_mask, offs_n, N, scale, ph, lo, hi,
            erow_ptr, ecol_ptr, ebits_ptr, y_ptr, stride_ym, ECH: tl.constexpr):
    """acc [BM, BN] of sum x * w' -> y = acc * 2^(base - E0) + escape corrections (the
    first chunk, `esc`, was computed in and after the main loop), stored."""
    acc = acc * scale[None, :] + esc
    for e0 in range(lo + ECH, hi, ECH):
        acc += _escape_chunk(e0, hi, x_ptr, stride_xm, offs_m, m_mask, offs_n, ph, erow_ptr,
                             ecol_ptr, ebits_ptr, ECH)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & (offs_n < N)[None, :])


@triton.jit
def _xload(xp, m, M, cols, K, EVEN: tl.constexpr):
    """x at pointers xp (row m, columns cols) as fp32; 0 past M and K."""
    # each load keeps a mask of its own (always true with EVEN): with one mask shared by a
    # step's 8 loads, or none, ptxas issues most of them after the first products instead
    # of all at the top of the step (fewer registers, 2-20% slower: docs/BENCHMARKS.md
    # fifteenth run)
    if EVEN:
        v = tl.load(xp, mask=(m < M) & (cols >= 0), other=0.0, eviction_policy="evict_last")
    else:
        v = tl.load(xp, mask=(m < M) & (cols < K), other=0.0, eviction_policy="evict_last")
    return v.to(tl.float32)


@triton.jit
def _fma8(acc, f0, f1, f2, f3, f4, f5, f6, f7, x_ptr, m, M, stride_xm, xcol, GW: tl.constexpr,
          K, EVEN: tl.constexpr):
    """acc += each word's 8 weights times x: weight i at column xcol + i * GW. The loads
    share one pointer tensor, so their offsets fold into the load instructions (no address
    arithmetic a load)."""
    xp = x_ptr + m * stride_xm + xcol
    acc += f0 * _xload(xp, m, M, xcol, K, EVEN)
    acc += f1 * _xload(xp + GW, m, M, xcol + GW, K, EVEN)
    acc += f2 * _xload(xp + 2 * GW, m, M, xcol + 2 * GW, K, EVEN)
    acc += f3 * _xload(xp + 3 * GW, m, M, xcol + 3 * GW, K, EVEN)
    acc += f4 * _xload(xp + 4 * GW, m, M, xcol + 4 * GW, K, EVEN)
    acc += f5 * _xload(xp + 5 * GW, m, M, xcol + 5 * GW, K, EVEN)
    acc += f6 * _xload(xp + 6 * GW, m, M, xcol + 6 * GW, K, EVEN)
    acc += f7 * _xload(xp + 7 * GW, m, M, xcol + 7 * GW, K, EVEN)
    return acc


@triton.jit
def _xslice(xp, xm2, colb, jx, K, EVEN: tl.constexpr, F32_DOT: tl.constexpr, SWAP: tl.constexpr):
    """One x slice ([SW, BM] when SWAP else [BM, SW]) in the dot's input type."""
    if EVEN:
        v = tl.load(xp, mask=xm2, other=0.0, eviction_policy="evict_last")
    else:
        if SWAP:
            v = tl.load(xp, mask=xm2 & (colb + jx < K)[:, None], other=0.0,
                        eviction_policy="evict_last")
        else:
            v = tl.load(xp, mask=xm2 & (colb + jx < K)[None, :], other=0.0,
                        eviction_policy="evict_last")
    if F32_DOT:
        v = v.to(tl.float32)
    else:
        v = v.to(tl.bfloat16)
    return v


@triton.jit
def _dot1(acc, wi, xp, xm2, colb, jx, K, EVEN: tl.constexpr, F32_DOT: tl.constexpr,
          SWAP: tl.constexpr):
    """acc += w_i @ x_i ([BN, BM], SWAP) or x_i @ w_i^T ([BM, BN]) for the x slice at xp."""
    # one return at the end: the compiler (unlike the interpreter) also builds the code
    # after an early `return` under a constexpr `if`
    xi = _xslice(xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
    if SWAP:
        if F32_DOT:
            acc = tl.dot(wi, xi, acc, input_precision="ieee")
        else:
            acc = tl.dot(wi, xi, acc)
    else:
        if F32_DOT:
            acc = tl.dot(xi, tl.trans(wi), acc, input_precision="ieee")
        else:
            acc = tl.dot(xi, tl.trans(wi), acc)
    return acc


@triton.jit
def _dot8(acc, w0, w1, w2, w3, w4, w5, w6, w7, xp, xm2, colb, jx, K, GW: tl.constexpr,
          EVEN: tl.constexpr, F32_DOT: tl.constexpr, SWAP: tl.constexpr):
    """acc += sum_i of w_i's dot with its x slice x_i (at column offset i * GW), in the
    orientation SWAP picks (see `_dot1`)."""
    acc = _dot1(acc, w0, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
    acc = _dot1(acc, w1, xp + GW, xm2, colb + GW, jx, K, EVEN, F32_DOT, SWAP)
    acc = _dot1(acc, w2, xp + 2 * GW, xm2, colb + 2 * GW, jx, K, EVEN, F32_DOT, SWAP)
    acc = _dot1(acc, w3, xp + 3 * GW, xm2, colb + 3 * GW, jx, K, EVEN, F32_DOT, SWAP)
    acc = _dot1(acc, w4, xp + 4 * GW, xm2, colb + 4 * GW, jx, K, EVEN, F32_DOT, SWAP)
    acc = _dot1(acc, w5, xp + 5 * GW, xm2, colb + 5 * GW, jx, K, EVEN, F32_DOT, SWAP)
    acc = _dot1(acc, w6, xp + 6 * GW, xm2, colb + 6 * GW, jx, K, EVEN, F32_DOT, SWAP)
    acc = _dot1(acc, w7, xp + 7 * GW, xm2, colb + 7 * GW, jx, K, EVEN, F32_DOT, SWAP)
    return acc


@triton.jit
def _sum3(t):
    return tl.sum(tl.sum(t, axis=2), axis=1)


# -- the fused kernel ---------------------------------------------------------------------

@triton.jit(do_not_specialize=["M"])
def w12_linear_kernel(
    x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
    cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, K_PER,
    BM: tl.constexpr, BN: tl.constexpr, NG: tl.constexpr, GS: tl.constexpr, GW: tl.constexpr,
    SPLIT_K: tl.constexpr, USE_DOT: tl.constexpr, F32_DOT: tl.constexpr, EVEN: tl.constexpr,
    USE_ASM: tl.constexpr, SWAP: tl.constexpr, ECH: tl.constexpr, SLICED: tl.constexpr = False,
    PDL: tl.constexpr = False, LOOP_STAGES: tl.constexpr = None, ESC_DEFER: tl.constexpr = False,
):
    # Words are indexed per row by w = 0 .. KW - 1 (KW = Kp / 8, the code words); word w of
    # group q = w // GW describes columns q * 8GW + i * GW + w % GW, i = 0..7. A step takes
    # NG * GS words as [BN, NG, GS] tiles of codes, A0 and A1 (NG > 1 only when GS == GW),
    # so the three tiles share one register layout and the decode is thread-local.
    # Everything before `pdl.enter` reads constant data only (row bases, escape tables).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    rows = offs_n % N  # rows past N read valid memory; their results are never stored
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    SW: tl.constexpr = NG * GS  # words per step
    BK: tl.constexpr = 8 * SW  # weights per row per step
    q = tl.arange(0, NG)[None, :, None]
    g = tl.arange(0, GS)[None, None, :]
    r3 = rows[:, None, None]
    c_off = r3 * stride_c + q * GW + g
    a_off = r3 * stride_a + q * (2 * GW) + g
    xq = q * (8 * GW) + g  # [1, NG, GS]: column offset of weight 0 of each word
    # the epilogue's inputs: row scales 2^(base - E0), escape placeholders 2^(base - 127)
    # and the escape range are loaded before the main loop; the first escape chunk is
    # gathered inside the first step, after its weight loads are in flight
    base = tl.load(base_ptr + rows).to(tl.int32)
    scale = ((base + (127 - 0x70)) << 23).to(tl.float32, bitcast=True)
    ph = (base << 23).to(tl.float32, bitcast=True)
    lo = tl.load(rowptr_ptr + n0)
    hi = tl.load(rowptr_ptr + tl.minimum(n0 + BN, N))
    esc = tl.zeros((BM, BN), dtype=tl.float32)
    # the first escape chunk (not SLICED): done in the first step, after its weight loads
    # are in flight; with ESC_DEFER spread so that no step waits on it: its table loaded in
    # the first step, its x gathered in the second, its terms added after the loop (`got`
    # counts the parts done: table, x, terms)
    got = 0
    er = tl.full((ECH,), -1, tl.int32)
    ec = tl.zeros((ECH,), dtype=tl.int32)
    ev = tl.zeros((ECH,), dtype=ebits_ptr.dtype.element_ty)
    exv = tl.zeros((BM, ECH), dtype=x_ptr.dtype.element_ty)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_t = tl.zeros((BN, BM), dtype=tl.float32)
    acc0 = tl.zeros((BN, NG, GS), dtype=tl.float32)
    acc1 = tl.zeros((BN, NG, GS), dtype=tl.float32)
    acc2 = tl.zeros((BN, NG, GS), dtype=tl.float32)
    acc3 = tl.zeros((BN, NG, GS), dtype=tl.float32)
    m0 = pid_m * BM
    w_lo = pid_k * K_PER
    if SLICED:
        # word j of a step (flat over its NG * GS words) is word jw of the step's first group
        # slice; its weight i sits at column jx + i * GW from the step's first column
        j = tl.arange(0, SW)
        if NG == 1:
            jw = j
            jx = j
            ja = j
        else:
            jw = (j // GS) * GW + j % GS
            jx = (j // GS) * (8 * GW) + j % GS
            ja = (j // GS) * (2 * GW) + j % GS
        c_off2 = rows[:, None] * stride_c + jw[None, :]
        a_off2 = rows[:, None] * stride_a + ja[None, :]
        # the x masks broadcast along K (full-width vector loads, cp.async-able)
        if SWAP:  # x slices loaded as [SW, BM]: the dot's B operand, no transpose
            x_off2 = offs_m[None, :] * stride_xm + jx[:, None]
            xm2 = (offs_m < M)[None, :]
        else:
            x_off2 = offs_m[:, None] * stride_xm + jx[None, :]
            xm2 = (offs_m < M)[:, None]
    if SLICED:
        # escapes: chunk pid_k + t * SPLIT_K of the tile's escape list is corrected in step
        # t of this split (its table is loaded one step ahead, its x gathered at the top of
        # the step), so the corrections ride under the weight stream; chunks left over when
        # a split has fewer steps than chunks are done after the loop
        e_cur = lo + pid_k * ECH
        er, ec, ev = _escape_table(e_cur, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH)
    if USE_DOT and not SLICED:
        # the decoded tile [BN, BK] holds at column (q * GS + g) * 8 + i the weight of word
        # (q, g), i: x is loaded in column order [BM, NG, 8, GS] and permuted to match
        m4 = offs_m[:, None, None, None]
        xc4 = (tl.arange(0, NG)[None, :, None, None] * (8 * GW)
               + tl.arange(0, 8)[None, None, :, None] * GW
               + tl.arange(0, GS)[None, None, None, :])
    pdl.enter(PDL)
    # LOOP_STAGES (the GEMV with PIPE): this loop's own pipelining depth; None leaves the
    # loop to the launch's num_stages (which pipelines only loads that feed a dot)
    for w in tl.range(w_lo, tl.minimum(w_lo + K_PER, KW), SW, num_stages=LOOP_STAGES):
        q0 = w // GW
        # steps start at multiples of SW >= 16 words and GW >= 16: tell the compiler, so the
        # word and x loads are 16-byte vectors
        wa = tl.multiple_of(w + q0 * GW, 16)  # A0 word of w: groups hold 2 * GW A words
        colb = tl.multiple_of(w + 7 * q0 * GW, 16)  # column of weight 0 of word w
        if SLICED:
            if EVEN:
                cw = tl.load(c_ptr + c_off2 + w, eviction_policy="evict_first")
                a0 = tl.load(a_ptr + a_off2 + wa, eviction_policy="evict_first")
                a1 = tl.load(a_ptr + a_off2 + wa + GW, eviction_policy="evict_first")
            else:
                wm2 = (w + jw < KW)[None, :]
                cw = tl.load(c_ptr + c_off2 + w, mask=wm2, other=0, eviction_policy="evict_first")
                a0 = tl.load(a_ptr + a_off2 + wa, mask=wm2, other=0,
                             eviction_policy="evict_first")
                a1 = tl.load(a_ptr + a_off2 + wa + GW, mask=wm2, other=0,
                             eviction_policy="evict_first")
        elif EVEN:
            cw = tl.load(c_ptr + c_off + w, eviction_policy="evict_first")
            a0 = tl.load(a_ptr + a_off + wa, eviction_policy="evict_first")
            a1 = tl.load(a_ptr + a_off + wa + GW, eviction_policy="evict_first")
        else:
            wmask = (w + q * GW + g < KW) & (r3 >= 0)
            cw = tl.load(c_ptr + c_off + w, mask=wmask, other=0, eviction_policy="evict_first")
            a0 = tl.load(a_ptr + a_off + wa, mask=wmask, other=0,
                         eviction_policy="evict_first")
            a1 = tl.load(a_ptr + a_off + wa + GW, mask=wmask, other=0,
                         eviction_policy="evict_first")
        if SLICED:
            exv = _escape_x(x_ptr, stride_xm, offs_m, m_mask, er, ec)
            e_nxt = e_cur + SPLIT_K * ECH
            er_n, ec_n, ev_n = _escape_table(e_nxt, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH)
        elif ESC_DEFER:
            if w == w_lo:
                er, ec, ev = _escape_table(lo, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH)
                got = 1
            elif w == w_lo + SW:
                exv = _escape_x(x_ptr, stride_xm, offs_m, m_mask, er, ec)
                got = 2
        elif w == w_lo:
            esc = _escape_chunk(lo, hi, x_ptr, stride_xm, offs_m, m_mask, offs_n, ph, erow_ptr,
                                ecol_ptr, ebits_ptr, ECH)
            got = 3
        if SLICED:
            # 8 dots of K = SW, one per weight index i: w_i is elementwise from the loaded
            # word tiles (no join, reshape or permute), x_i a plain strided slice of x
            if F32_DOT:
                w0, w1, w2, w3, w4, w5, w6, w7 = _decode_f32(cw, a0, a1, USE_ASM)
            else:
                w0, w1, w2, w3, w4, w5, w6, w7 = _decode_bf16(cw, a0, a1, USE_ASM)
            xp = x_ptr + x_off2 + colb
            if SWAP:
                acc_t = _dot8(acc_t, w0, w1, w2, w3, w4, w5, w6, w7, xp, xm2, colb, jx, K,
                              GW, EVEN, F32_DOT, True)
            else:
                acc = _dot8(acc, w0, w1, w2, w3, w4, w5, w6, w7, xp, xm2, colb, jx, K, GW,
                            EVEN, F32_DOT, False)
            esc += _escape_terms(exv, er, ev, offs_n, ph)
            er, ec, ev, e_cur = er_n, ec_n, ev_n, e_nxt
        elif USE_DOT:
            if F32_DOT:
                w0, w1, w2, w3, w4, w5, w6, w7 = _decode_f32(cw, a0, a1, USE_ASM)
            else:
                w0, w1, w2, w3, w4, w5, w6, w7 = _decode_bf16(cw, a0, a1, USE_ASM)
            wt = tl.reshape(_join8(w0, w1, w2, w3, w4, w5, w6, w7), (BN, BK))
            x4 = tl.load(x_ptr + m4 * stride_xm + colb + xc4,
                         mask=(m4 < M) & (colb + xc4 < K), other=0.0,
                         eviction_policy="evict_last")
            xt = tl.reshape(tl.permute(x4, (0, 1, 3, 2)), (BM, BK))
            if F32_DOT:
                xt = xt.to(tl.float32)
            else:
                xt = xt.to(tl.bfloat16)
            if SWAP:
                if F32_DOT:
                    acc_t += tl.dot(wt, tl.trans(xt), input_precision="ieee")
                else:
                    acc_t += tl.dot(wt, tl.trans(xt))
            else:
                if F32_DOT:
                    acc += tl.dot(xt, tl.trans(wt), input_precision="ieee")
                else:
                    acc += tl.dot(xt, tl.trans(wt))
        else:
            f0, f1, f2, f3, f4, f5, f6, f7 = _decode_f32(cw, a0, a1, USE_ASM)
            xc = colb + xq
            acc0 = _fma8(acc0, f0, f1, f2, f3, f4, f5, f6, f7, x_ptr, m0, M, stride_xm, xc,
                         GW, K, EVEN)
            if BM > 1:
                acc1 = _fma8(acc1, f0, f1, f2, f3, f4, f5, f6, f7, x_ptr, m0 + 1, M,
                             stride_xm, xc, GW, K, EVEN)
            if BM > 2:
                acc2 = _fma8(acc2, f0, f1, f2, f3, f4, f5, f6, f7, x_ptr, m0 + 2, M,
                             stride_xm, xc, GW, K, EVEN)
                acc3 = _fma8(acc3, f0, f1, f2, f3, f4, f5, f6, f7, x_ptr, m0 + 3, M,
                             stride_xm, xc, GW, K, EVEN)
    pdl.release(PDL)
    if USE_DOT:
        if SWAP:
            acc = tl.trans(acc_t)
    else:
        sel = tl.arange(0, BM)[:, None]
        acc = tl.where(sel == 0, _sum3(acc0)[None, :], acc)
        if BM > 1:
            acc = tl.where(sel == 1, _sum3(acc1)[None, :], acc)
        if BM > 2:
            acc = tl.where(sel == 2, _sum3(acc2)[None, :], acc)
            acc = tl.where(sel == 3, _sum3(acc3)[None, :], acc)
    if SLICED:
        for e0 in range(e_cur, hi, SPLIT_K * ECH):  # chunks of this split not yet done
            esc += _escape_chunk(e0, hi, x_ptr, stride_xm, offs_m, m_mask, offs_n, ph,
                                 erow_ptr, ecol_ptr, ebits_ptr, ECH)
        # each split's partial is finished (row scale 2^(base - E0): a power of two, exact)
        acc = acc * scale[None, :] + esc
    else:  # parts not done in the loop (a split with no step; ESC_DEFER with one)
        if got == 0:
            er, ec, ev = _escape_table(lo, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH)
        if got < 2:
            exv = _escape_x(x_ptr, stride_xm, offs_m, m_mask, er, ec)
        if got < 3:
            esc = _escape_terms(exv, er, ev, offs_n, ph)
    finish = True
    if SPLIT_K > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        finish = store_partial_and_count(acc, ws_ptr, cnt_ptr, tile, pid_k, BM, BN)
    if finish:
        if SPLIT_K > 1:
            acc = reduce_partials(ws_ptr, cnt_ptr, tile, BM, BN)
        if SLICED:
            y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty),
                     mask=m_mask[:, None] & (offs_n < N)[None, :])
        else:
            _finish(acc, esc, x_ptr, stride_xm, offs_m, m_mask, offs_n, N, scale, ph, lo, hi,
                    erow_ptr, ecol_ptr, ebits_ptr, y_ptr, stride_ym, ECH)


# (bn, split_k, warps, prefetch depth) of the Gluon kernel's configs (16 weight rows a warp:
# 32 a warp spills at depth 1 and 2). 3 splits: 320 tiles of 16 rows x 3 fill the H200's
# 132 SMs x 8 one-warp programs once (one wave, no tail)
GLUON_GRID = [(16, 1, 1, 1), (16, 2, 1, 1), (16, 3, 1, 1), (16, 4, 1, 1), (16, 1, 1, 2),
              (16, 2, 1, 2), (32, 2, 2, 1), (64, 4, 4, 1)]
# (bn, split_k, stages) of the TMA + wgmma kernel's configs at batch 9-32 (256-column steps):
# one consumer warpgroup of 64 weight rows (two programs an SM at a 2-step ring) or two of
# 128 (docs/BENCHMARKS.md, twenty-fifth run)
WGMMA_GRID = [(64, 1, 2), (64, 1, 3), (64, 2, 2), (64, 2, 3), (128, 1, 2)]


def w12_candidates(b: int) -> list[KernelConfig]:
    """The W12 search grid for batch bucket b (every config is a compile: kept small).
    GEMV (CUDA cores) for 1-4 rows, the sliced tensor-core path for 2-32 (rows padded to
    16 or 32) and the Gluon kernel for 2-32. bk below 512 steps through a slice of each
    64-word column group."""
    K = KernelConfig
    gemv = {1: [(8, 512, 1, 4), (8, 512, 2, 4), (16, 512, 1, 4), (16, 512, 2, 4),
                (8, 512, 1, 2), (8, 512, 4, 4), (4, 512, 1, 2), (8, 1024, 1, 4),
                (8, 1024, 1, 8)],
            2: [(16, 512, 1, 4), (16, 512, 2, 4), (8, 512, 1, 4), (8, 512, 2, 4),
                (32, 512, 1, 4)],
            4: [(16, 512, 1, 4), (16, 512, 2, 4), (8, 512, 1, 4)]}.get(b, [])
    # the unpipelined loop with its first escape chunk deferred (faster on both shapes that
    # picked it; docs/BENCHMARKS.md fourteenth run)
    cfgs = [K(bm=b, bn=bn, bk=bk, split_k=s, warps=w, variant=1 | DEFER)
            for bn, bk, s, w in gemv]
    if b == 1:
        cfgs.append(K(bm=1, bn=8, bk=512, variant=0))  # plain-op decode, for comparison
    if b <= 2:  # the loop pipelined through shared memory: wins on some shapes (one-warp
        # programs with 2 stages: thirteenth run; 8 rows of 1-2 warps with 3 stages at
        # batch 2: sixteenth run); the deferred escape chunk wins on some shapes, loses on
        # others (fourteenth run): both
        cfgs += [K(bm=b, bn=bn, bk=bk, warps=w, stages=p, variant=1 | PIPE | d)
                 for bn, bk, w, p in ((4, 512, 2, 3), (8, 1024, 4, 3), (4, 1024, 1, 2),
                                      (2, 1024, 1, 2), (8, 1024, 1, 3), (8, 512, 2, 3))
                 for d in (0, DEFER)]
    # (bn, bk, split_k, warps, stages, variant): 5 = sliced x W^T (mma.sync), 7 = sliced
    # W x^T (wgmma, A from registers)
    dots = {16: [(32, 512, 1, 4, 2, 5), (64, 256, 2, 4, 3, 5), (64, 512, 1, 4, 3, 5),
                 (32, 512, 2, 4, 3, 5), (64, 256, 1, 4, 4, 5), (32, 256, 4, 4, 4, 5),
                 (64, 256, 4, 4, 4, 5), (64, 256, 2, 4, 4, 7)],
            32: [(64, 512, 1, 4, 3, 5), (64, 256, 1, 4, 4, 5), (64, 256, 2, 4, 3, 5),
                 (64, 512, 1, 4, 2, 5), (64, 256, 4, 4, 4, 5), (64, 512, 2, 4, 3, 7)]}
    if b >= 2:
        bm = 32 if b > 16 else 16
        grid = dots[bm] if b >= 8 else dots[16][:4]
        cfgs += [K(bm=bm, bn=bn, bk=bk, split_k=s, warps=w, stages=p, dot=True, variant=v)
                 for bn, bk, s, w, p, v in grid]
    if 2 <= b <= 16:  # the Gluon kernel, 8 or 16 rows of x; stages = steps prefetched
        cfgs += [K(bm=8 if b <= 8 else 16, bn=bn, bk=256, split_k=s, warps=w, stages=p,
                   dot=True, variant=GLUON) for bn, s, w, p in GLUON_GRID]
    elif b > 16:  # two 16-row x tiles side by side (the second reads the words from L2),
        # or the 32 rows in one program (the words decoded once; wins on some shapes)
        cfgs += [K(bm=16, bn=16, bk=256, split_k=s, warps=1, stages=1, dot=True,
                   variant=GLUON) for s in (1, 2, 3, 4, 8)]
        cfgs += [K(bm=32, bn=16, bk=256, split_k=s, warps=1, stages=1, dot=True,
                   variant=GLUON) for s in (2, 3)]
    if 2 <= b <= 8:  # the Gluon kernel with x slices prefetched too (one warp, depth 1)
        cfgs += [K(bm=8, bn=16, bk=256, split_k=s, warps=1, stages=1, dot=True,
                   variant=GLUON | XPRE) for s in (1, 2, 3, 4)]
    if 4 <= b <= 8:  # ... and stream-K with 8 rows of x: evens out the waves of the largest
        # shapes (gate_up 32B-class is 3.03 waves of one-warp tiles; seventeenth run)
        cfgs.append(K(bm=8, bn=16, bk=256, split_k=8, warps=1, stages=1, dot=True,
                      variant=GLUON | SK))
    if 8 < b <= 16:  # the Gluon kernel stream-K: 8 one-warp programs an SM (all resident)
        cfgs.append(K(bm=16, bn=16, bk=256, split_k=8, warps=1, stages=1, dot=True,
                      variant=GLUON | SK))
    if b > 8:  # ... and each Gluon config with its words off the L2 evict-first policy (2-4%
        # faster on 5 of 6 shapes at batch 16: docs/BENCHMARKS.md twenty-first run)
        cfgs += [replace(c, variant=c.variant | L1EF) for c in cfgs
                 if c.variant & GLUON]
        # the TMA + wgmma kernel, its escapes corrected row-parallel before its main loop
        # and gathered from x^T (XT). Timed alone, configs without XT win by 1-8% on five
        # smaller shapes at 16 rows, but the 8B-class engine on a table of such picks ran 1.3%
        # slower at batch 16 (docs/BENCHMARKS.md, twenty-eighth run): the grid keeps XT only
        cfgs += [K(bm=16 if b <= 16 else 32, bn=bn, bk=256, split_k=s, warps=bn // 16,
                   stages=p, dot=True, variant=WGMMA | XT) for bn, s, p in WGMMA_GRID]
    return cfgs


def w12_default_config(n: int, k: int, m: int) -> KernelConfig:
    """An untuned but reasonable W12 config (used when the tuned table has no entry)."""
    if m <= 1:
        return KernelConfig(bm=1, bn=8, bk=512, split_k=2 if n <= 6144 else 1, warps=4,
                            variant=1 | DEFER)
    if m <= 4:
        return KernelConfig(bm=4 if m > 2 else 2, bn=16, bk=512, warps=4, variant=1 | DEFER)
    if m <= 16:
        return KernelConfig(bm=16, bn=64, bk=256, split_k=2, warps=4, stages=3, dot=True,
                            variant=5)
    return KernelConfig(bm=32, bn=64, bk=512, split_k=1, warps=4, stages=3, dot=True,
                        variant=5)


def launch_grid(m: int, n: int, cfg: KernelConfig) -> tuple[int, int, int]:
    return (triton.cdiv(n, cfg.bn), cfg.split_k, triton.cdiv(m, cfg.bm))


def escape_chunk(bm: int, bn: int) -> int:
    """Escapes handled per vector step of the epilogue (a [bm, bn, chunk] temporary): at
    most 16 (a tile holds ~8 escapes at the usual 1e-4 rate; 16 measured 0.4-1.1% faster than
    32 on the batch-1 GEMV, docs/BENCHMARKS.md eleventh run)."""
    return max(4, min(16, triton.next_power_of_2(max(1, 1024 // (bm * bn)))))


def step_words(gw: int, bk: int) -> tuple[int, int]:
    """(groups, words per group) of one K step for a requested bk: whole groups when bk
    covers one (8 * gw columns), else a power-of-two slice of a group (at least 16 words)."""
    if bk >= 8 * gw:
        return bk // (8 * gw), gw
    return 1, max(16, min(gw, triton.next_power_of_2(bk // 8)))


def split_words(k: int, kp: int, sw: int, split_k: int) -> tuple[int, bool]:
    """(words per split, EVEN) for steps of sw words over a weight of K columns (kp padded):
    EVEN when every split is whole steps of real columns (no masks needed)."""
    kw = kp // 8
    kper = k_per_split(kw, sw, split_k)
    return kper, kw % sw == 0 and kper * split_k == kw and k == kp


def kernel_constants(k: int, kp: int, gw: int, cfg: KernelConfig, f32_dot: bool = False,
                     use_pdl: bool = False) -> tuple[int, dict]:
    """(words per split, the fused kernel's constexprs) of a call on a W12 weight of K
    columns (kp padded, groups of gw words): what `w12_matmul` launches, and what the
    sm90 compile test builds on a machine without a GPU."""
    ng, gs = step_words(gw, cfg.bk)
    kper, even = split_words(k, kp, ng * gs, cfg.split_k)
    return kper, {
        "BM": cfg.bm, "BN": cfg.bn, "NG": ng, "GS": gs, "GW": gw, "SPLIT_K": cfg.split_k,
        "USE_DOT": cfg.dot, "F32_DOT": f32_dot, "EVEN": even,
        "USE_ASM": bool(cfg.variant & 1) and not interpreting(), "SWAP": bool(cfg.variant & 2),
        "ECH": escape_chunk(cfg.bm, cfg.bn), "SLICED": cfg.dot and bool(cfg.variant & 4),
        "PDL": use_pdl, "LOOP_STAGES": cfg.stages if cfg.variant & PIPE and not cfg.dot else None,
        "ESC_DEFER": bool(cfg.variant & DEFER) and not cfg.dot}


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
    if cfg.dot and cfg.variant & (GLUON | WGMMA):
        if interpreting() or x.device.type != "cuda":
            raise ValueError(f"the Gluon W12 kernels run on a CUDA device ({cfg.label})")
        if cfg.variant & WGMMA:
            from .w12_wgmma import w12_wgmma_matmul

            return w12_wgmma_matmul(x, w, y, cfg.bm, cfg.bn, cfg.bk, cfg.split_k, cfg.stages,
                                    bool(cfg.variant & XT))
        from .w12_gluon import w12_gluon_matmul, w12_gluon_sk_matmul

        run = w12_gluon_sk_matmul if cfg.variant & SK else w12_gluon_matmul
        return run(x, w, y, cfg.bm, cfg.bn, cfg.bk, cfg.split_k, cfg.warps, cfg.stages,
                   bool(cfg.variant & XPRE), bool(cfg.variant & L1EF))
    grid = launch_grid(m, w.n, cfg)
    ws, cnt = workspace(x.device, grid[0] * grid[1] * grid[2] * cfg.bm * cfg.bn,
                        grid[0] * grid[2])
    on = pdl.active(x.device)
    kper, consts = kernel_constants(k, w.kp, w.gw, cfg, f32_dot, on)
    kw = w.kp // 8
    w12_linear_kernel[grid](
        x, w.a.view(torch.int32), w.codes.view(torch.int32), w.base, w.esc_rowptr, w.esc_row,
        w.esc_col, w.esc_bits, y, ws, cnt, m, w.n, k, kw, *w.row_strides(), x.stride(0),
        y.stride(0), kper, num_warps=cfg.warps, num_stages=cfg.stages, **consts,
        **pdl.launch(on),
    )
    return y


@triton.jit
def w12_unpack_kernel(a_ptr, c_ptr, base_ptr, out_ptr, N, K, stride_a, stride_c,
                      BN: tl.constexpr, GW: tl.constexpr):
    """bf16 bit patterns (int16) of one column group of BN rows; escapes (decoded as the
    placeholder here) are patched after."""
    pid_n = tl.program_id(0)
    grp = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    g = tl.arange(0, GW)[None, :]
    r2 = rows[:, None]
    rmask = (r2 < N) & (g >= 0)
    cw = tl.load(c_ptr + r2 * stride_c + grp * GW + g, mask=rmask, other=0)
    a0 = tl.load(a_ptr + r2 * stride_a + grp * 2 * GW + g, mask=rmask, other=0)
    a1 = tl.load(a_ptr + r2 * stride_a + grp * 2 * GW + GW + g, mask=rmask, other=0)
    base = tl.load(base_ptr + rows, mask=rows < N, other=0).to(tl.int32)[:, None]
    rot = _rotr4(cw)
    for i in tl.static_range(8):
        xw = cw if i < 4 else rot
        aw = a0 if i < 4 else a1
        h = (xw >> (8 * (i % 4))) & 0x87
        lo = (aw >> (8 * (i % 4))) & 0xFF
        code = ((h & 7) << 1) | (lo >> 7)
        bits = ((h >> 7) << 15) | ((code + base) << 7) | (lo & 0x7F)
        cols = grp * 8 * GW + i * GW + g
        tl.store(out_ptr + r2 * K + cols, bits.to(tl.int16), mask=rmask & (cols < K))


def w12_unpack(w: W12Weight) -> torch.Tensor:
    """The exact bf16 matrix [N, K], decoded by a Triton kernel (plus an escape scatter)."""
    out = torch.empty(w.n, w.k, dtype=torch.int16, device=w.device)
    bn = 16
    gw = w.gw
    w12_unpack_kernel[(triton.cdiv(w.n, bn), w.kp // (8 * gw))](
        w.a.view(torch.int32), w.codes.view(torch.int32), w.base, out, w.n, w.k,
        *w.row_strides(), BN=bn, GW=gw)
    if w.n_escapes:
        out[w.esc_row.long(), w.esc_col.long()] = w.esc_bits
    return out.view(torch.bfloat16)
