"""W12 tensor-core linear written in Gluon (Triton's explicit-layout language), batch 2-32.

Why a second kernel: in the Triton kernel (`w12_triton.py`) the compiler picks the register
layouts, and the word tiles reach the MMA only through shared memory (cp.async staging, or a
layout conversion of the decoded tile) that also holds x slices every warp re-reads. Here the
layouts are explicit. The product is computed transposed, y^T = W x^T: the weights are the
A operand of mma.sync m16n8k16 (16 weight rows per warp), x^T the B operand (8 batch rows
per MMA: batch 2-8 pads to 8, 9-16 to 16, 17-32 runs either two 16-row tiles of x side by
side, the second reading the weight words from L2, or all 32 rows in one program, which
decodes the words once; the tuner picks per shape). Each thread loads its words from global
memory straight into A operand registers (`DotOperandLayout(0)`, k_width 8: eight consecutive words,
16-byte loads), the byte-permute decode writes the bf16 pairs the MMA takes, and x slices
load from L1/L2 straight into B registers (16 bytes a load); weights never touch shared
memory. The next one or two steps' words are loaded before this step's math (`DEPTH`), and
with `XPRE` (batch 2-8, depth 1) the next step's x slices with them: the loop body is
unrolled DEPTH + 1 times so the buffers rotate without register copies, and
loads are unmasked on aligned shapes (prefetches past a split's end re-read its last step;
rows past M or N read valid rows whose results are never stored). Escapes and the row scale
are applied per split as in the sliced Triton path; with 8 rows of x (`ESC_EARLY`) the row
bases and escape range are loaded first and the first escape chunk's table and x values
during the last unrolled iteration, so the epilogue's dependent round trips do not all wait
at the end. Split-K partials are reduced by the last program of a tile (`splitk.py`'s
protocol). The stream-K launch (`w12_gluon_sk_kernel`) runs the same tile code over
pieces: as many programs as stay resident share the tiles x steps units evenly, each
tile's pieces reduced in program order (deterministic, like split-K). With PDL (`pdl.py`,
the engine's knob) a program loads its first steps' words (constant data), then waits for
the kernel before it, and releases the next one after its main loop. The tuner picks, per
shape and batch, between this kernel and the Triton ones (`KernelConfig.variant` bit
`GLUON`). Steps are 32-64 words of one column group (a 16-word step leaves the k_width-8
operand layout half empty and measured wrong in the first form of this kernel).
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from . import pdl
from .splitk import workspace
from .w12 import W12Weight
from .w12_triton import DECODE_BF16_ASM, DECODE_BF16_CONSTRAINTS, H_CONST4, H_MASK4, split_words

_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # renamed in 3.7+


@gluon.jit
def _decode(c, a0, a1):
    """The 8 bf16 weights w'_0..7 of words (codes c, a0, a1), the Triton kernel's decode."""
    b0, b1, b2, b3, b4, b5, b6, b7 = gl.inline_asm_elementwise(
        asm=DECODE_BF16_ASM, constraints=DECODE_BF16_CONSTRAINTS,
        args=[c, a0, a1, gl.full(c.shape, H_MASK4, gl.int32, c.type.layout),
              gl.full(c.shape, H_CONST4, gl.int32, c.type.layout)],
        dtype=(gl.int16,) * 8, is_pure=True, pack=1)
    return (b0.to(gl.bfloat16, bitcast=True), b1.to(gl.bfloat16, bitcast=True),
            b2.to(gl.bfloat16, bitcast=True), b3.to(gl.bfloat16, bitcast=True),
            b4.to(gl.bfloat16, bitcast=True), b5.to(gl.bfloat16, bitcast=True),
            b6.to(gl.bfloat16, bitcast=True), b7.to(gl.bfloat16, bitcast=True))


@gluon.jit
def _gdc(ASM: gl.constexpr):
    """One grid-dependency-control instruction (`pdl.py`'s enter and release, in Gluon)."""
    gl.inline_asm_elementwise(ASM + " // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _ld_l1ef(p):
    """int32 words at pointers p as `ld.global.L1::evict_first` 16-byte loads, without the
    L2 evict-first policy of `gl.load(eviction_policy="evict_first")`: one load from the
    first of each 4 of a thread's consecutive words (contiguous and 16-byte aligned in the
    A operand layout of an aligned shape)."""
    return gl.inline_asm_elementwise(
        asm="ld.global.L1::evict_first.v4.b32 {$0, $1, $2, $3}, [$4];",
        constraints="=r,=r,=r,=r,l,l,l,l", args=[p.to(gl.int64, bitcast=True)],
        dtype=gl.int32, is_pure=False, pack=4)


@gluon.jit
def _words(c_ptr, a_ptr, c_off, a_off, w, GW: gl.constexpr, j2, KW, EVEN: gl.constexpr):
    """Word tiles [BN, SW] (codes, A0, A1) of the step at word w, in the A operand layout.
    w is always a valid step start (the caller clamps prefetches past the split's end), so
    aligned shapes (EVEN 1 or 2) load unmasked: no zero-fill instructions, full 16-byte
    vectors; with EVEN 2 without the L2 evict-first policy (faster at 16 rows of x)."""
    wa = w + (w // GW) * GW
    if EVEN == 2:
        cw = _ld_l1ef(c_ptr + c_off + w)
        a0 = _ld_l1ef(a_ptr + a_off + wa)
        a1 = _ld_l1ef(a_ptr + a_off + wa + GW)
    elif EVEN:
        cw = gl.load(c_ptr + c_off + w, eviction_policy="evict_first")
        a0 = gl.load(a_ptr + a_off + wa, eviction_policy="evict_first")
        a1 = gl.load(a_ptr + a_off + wa + GW, eviction_policy="evict_first")
    else:
        m = w + j2 < KW
        cw = gl.load(c_ptr + c_off + w, mask=m, other=0, eviction_policy="evict_first")
        a0 = gl.load(a_ptr + a_off + wa, mask=m, other=0, eviction_policy="evict_first")
        a1 = gl.load(a_ptr + a_off + wa + GW, mask=m, other=0, eviction_policy="evict_first")
    return cw, a0, a1


@gluon.jit
def _xi(x_ptr, x_off, col, jx2, K, EVEN: gl.constexpr):
    """x^T slice [SW, BM] at column col, in the B operand layout (rows of x past M are
    clamped to row M - 1 by the caller: computed, never stored)."""
    if EVEN:
        return gl.load(x_ptr + x_off + col, eviction_policy="evict_last")
    else:
        return gl.load(x_ptr + x_off + col, mask=col + jx2 < K, other=0.0,
                       eviction_policy="evict_last")


@gluon.jit
def _xs(x_ptr, x_off, w, GW: gl.constexpr, jx2, K, EVEN: gl.constexpr):
    """The 8 x^T slices of the step at word w (weight i of its words: columns + i * GW)."""
    colb = w + 7 * (w // GW) * GW  # column of weight 0 of word w
    return (_xi(x_ptr, x_off, colb, jx2, K, EVEN), _xi(x_ptr, x_off, colb + GW, jx2, K, EVEN),
            _xi(x_ptr, x_off, colb + 2 * GW, jx2, K, EVEN),
            _xi(x_ptr, x_off, colb + 3 * GW, jx2, K, EVEN),
            _xi(x_ptr, x_off, colb + 4 * GW, jx2, K, EVEN),
            _xi(x_ptr, x_off, colb + 5 * GW, jx2, K, EVEN),
            _xi(x_ptr, x_off, colb + 6 * GW, jx2, K, EVEN),
            _xi(x_ptr, x_off, colb + 7 * GW, jx2, K, EVEN))


@gluon.jit
def _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, w, GW: gl.constexpr, j2, jx2, KW, K,
          EVEN: gl.constexpr, XPRE: gl.constexpr):
    """One step's buffer: its word tiles, and with XPRE its x slices too (else 0: the step
    loads them when it runs)."""
    return _with_x(_words(c_ptr, a_ptr, c_off, a_off, w, GW, j2, KW, EVEN), x_ptr, x_off, w,
                   GW, jx2, K, EVEN, XPRE)


@gluon.jit
def _with_x(wd, x_ptr, x_off, w, GW: gl.constexpr, jx2, K, EVEN: gl.constexpr,
            XPRE: gl.constexpr):
    """`_load`'s buffer from words wd loaded earlier: with XPRE, the step's x slices added."""
    if XPRE:
        return (wd[0], wd[1], wd[2], _xs(x_ptr, x_off, w, GW, jx2, K, EVEN))
    else:
        return (wd[0], wd[1], wd[2], 0)


@gluon.jit
def _step(acc, buf, x_ptr, x_off, w, GW: gl.constexpr, jx2, K, EVEN: gl.constexpr,
          XPRE: gl.constexpr):
    """acc [BN, BM] += decode(the buffer's words of step w) @ x^T[the step's 8 slices]."""
    w0, w1, w2, w3, w4, w5, w6, w7 = _decode(buf[0], buf[1], buf[2])
    if XPRE:
        xs = buf[3]
    else:
        xs = _xs(x_ptr, x_off, w, GW, jx2, K, EVEN)
    acc = mma_v2(w0, xs[0], acc)
    acc = mma_v2(w1, xs[1], acc)
    acc = mma_v2(w2, xs[2], acc)
    acc = mma_v2(w3, xs[3], acc)
    acc = mma_v2(w4, xs[4], acc)
    acc = mma_v2(w5, xs[5], acc)
    acc = mma_v2(w6, xs[6], acc)
    acc = mma_v2(w7, xs[7], acc)
    return acc


@gluon.jit
def _program_ids(M, BM: gl.constexpr):
    """(tile, weight tile, x tile, split) of this program. program_id(0) walks the (weight
    tile, x tile) pairs with the x tiles fastest: the programs that share a weight tile
    (batch > BM) run side by side, so its words come from DRAM once and from L2 for the
    others; program_id(1) is the split."""
    mt = (M + BM - 1) // BM
    tile = gl.program_id(0)
    return tile, tile // mt, tile % mt, gl.program_id(1)


@gluon.jit
def w12_gluon_kernel(
    x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
    cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, K_PER,
    BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr, GW: gl.constexpr,
    SPLIT_K: gl.constexpr, EVEN: gl.constexpr, ECH: gl.constexpr, WARPS: gl.constexpr,
    DEPTH: gl.constexpr, XPRE: gl.constexpr, ESC_EARLY: gl.constexpr, PDL: gl.constexpr,
):
    """One (tile, split) per program: split pid_k takes words [pid_k * K_PER, + K_PER)."""
    tile, pid_n, pid_m, pid_k = _program_ids(M, BM)
    _tile(x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
          cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, tile, pid_n, pid_m,
          pid_k, K_PER, K_PER, pid_k, SPLIT_K, SPLIT_K, BM, BN, SW, GW, EVEN, ECH, WARPS, DEPTH,
          XPRE, ESC_EARLY, PDL)


@gluon.jit
def w12_gluon_sk_kernel(
    x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
    cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, S, UNITS, SLOTS,
    BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr, GW: gl.constexpr,
    EVEN: gl.constexpr, ECH: gl.constexpr, WARPS: gl.constexpr, DEPTH: gl.constexpr,
    XPRE: gl.constexpr, ESC_EARLY: gl.constexpr, PDL: gl.constexpr,
):
    """Stream-K: the UNITS = tiles x S steps (S steps of SW words a tile) split evenly over
    the programs, program p taking units [p * UNITS // P, (p + 1) * UNITS // P) across tile
    boundaries; each tile's pieces are its splits, reduced in program order (`_epilogue`)."""
    p = gl.program_id(0)
    P = gl.num_programs(0)
    lo = p * UNITS // P
    hi = (p + 1) * UNITS // P
    mt = (M + BM - 1) // BM
    for t in range(lo // S, (hi + S - 1) // S):
        a = gl.maximum(lo - t * S, 0)
        first = ((t * S + 1) * P - 1) // UNITS  # the program holding the tile's first step
        last = ((t + 1) * S * P - 1) // UNITS  # ... and its last
        _tile(x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr,
              ws_ptr, cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, t, t // mt,
              t % mt, a, SW, (gl.minimum(hi - t * S, S) - a) * SW, p - first,
              last - first + 1, SLOTS, BM, BN, SW, GW, EVEN, ECH, WARPS, DEPTH, XPRE, ESC_EARLY,
              PDL)


@gluon.jit
def _tile(x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
          cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, tile, pid_n, pid_m,
          i0, mult, kper, pid_k, nsplit, slots, BM: gl.constexpr, BN: gl.constexpr,
          SW: gl.constexpr, GW: gl.constexpr, EVEN: gl.constexpr, ECH: gl.constexpr,
          WARPS: gl.constexpr, DEPTH: gl.constexpr, XPRE: gl.constexpr,
          ESC_EARLY: gl.constexpr, PDL: gl.constexpr):
    """Words [i0 * mult, + kper) of weight tile pid_n x x tile pid_m (clipped to KW), as split
    pid_k of the tile's nsplit (partials in ws slots tile * slots + split). With PDL the
    first buffers' words (constant data) load before the wait for the kernel before, which
    wrote x; x and everything after come after it."""
    # y^T tile [BN, BM] = W [BN, K] @ x^T [K, BM]: the weights are the MMA's A operand (16
    # rows x 16 K per mma.sync m16n8k16, warps split the rows), x^T its B operand (8 batch
    # rows per MMA: batch 2-8 pads to 8, not 16). k_width 8: each thread holds 8 consecutive
    # K positions of both operands (a K order the MMA sums in, the same for x and w), so
    # words and x load as 16-byte vectors; decoded weights are written by the decode's
    # byte permutes straight into the A registers, x's B registers are its load's registers.
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1],
                                                  instr_shape=[16, 8])
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    op_x: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    n0 = pid_n * BN
    # A operand tiles [BN, SW]: element (n, j) is word w + j of weight row n0 + n
    nb = gl.arange(0, BN, layout=gl.SliceLayout(1, op_w))
    jb = gl.arange(0, SW, layout=gl.SliceLayout(0, op_w))
    rows_b = (n0 + nb) % N  # rows past N read valid memory; their results are never stored
    j2 = gl.expand_dims(jb, 0)
    c_off = gl.expand_dims(rows_b, 1) * stride_c + j2
    a_off = gl.expand_dims(rows_b, 1) * stride_a + j2
    # B operand slices [SW, BM]: x row m (rows past M read row M - 1), column (start) + j
    ja = gl.arange(0, SW, layout=gl.SliceLayout(1, op_x))
    ma = gl.minimum(pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, op_x)), M - 1)
    jx2 = gl.expand_dims(ja, 1)
    x_off = gl.expand_dims(ma, 0) * stride_xm + jx2

    # DEPTH + 1 buffers rotate without register copies: the loop body is unrolled DEPTH + 1
    # times, and each buffer is reloaded (DEPTH + 1 steps ahead) right after its step's math.
    # A buffer holds a step's words, and with XPRE its x slices too (their L1/L2 round trip
    # then overlaps the step before instead of stalling this step's MMAs). Loads past the
    # split's last step re-read that step (never used).
    acc = gl.zeros([BN, BM], gl.float32, mma)
    U: gl.constexpr = DEPTH + 1
    if ESC_EARLY:  # row bases and escape range first, used after the loop
        rows = _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, WARPS)
    w_lo = i0 * mult
    w_end = gl.maximum(gl.minimum(w_lo + kper, KW), w_lo)
    nsteps = (w_end - w_lo + SW - 1) // SW
    wl = gl.maximum(gl.minimum(w_lo + (nsteps - 1) * SW, KW - SW), 0)  # last step start
    if PDL:
        wd0 = _words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w_lo, wl), GW, j2, KW, EVEN)
        wd1 = _words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w_lo + SW, wl), GW, j2, KW, EVEN)
        _gdc("griddepcontrol.wait;")
        b0 = _with_x(wd0, x_ptr, x_off, gl.minimum(w_lo, wl), GW, jx2, K, EVEN, XPRE)
        b1 = _with_x(wd1, x_ptr, x_off, gl.minimum(w_lo + SW, wl), GW, jx2, K, EVEN, XPRE)
    else:
        b0 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, gl.minimum(w_lo, wl), GW, j2, jx2,
                   KW, K, EVEN, XPRE)
        b1 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, gl.minimum(w_lo + SW, wl), GW, j2,
                   jx2, KW, K, EVEN, XPRE)
    if DEPTH > 1:
        b2 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, gl.minimum(w_lo + 2 * SW, wl), GW,
                   j2, jx2, KW, K, EVEN, XPRE)
    w_full = w_lo + (nsteps // U) * (U * SW)
    if ESC_EARLY:
        w_main = gl.maximum(w_full - U * SW, w_lo)  # the last full iteration is peeled below
    else:
        w_main = w_full
    for w in range(w_lo, w_main, U * SW):
        acc = _step(acc, b0, x_ptr, x_off, w, GW, jx2, K, EVEN, XPRE)
        b0 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, gl.minimum(w + U * SW, wl), GW, j2,
                   jx2, KW, K, EVEN, XPRE)
        acc = _step(acc, b1, x_ptr, x_off, w + SW, GW, jx2, K, EVEN, XPRE)
        b1 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, gl.minimum(w + (U + 1) * SW, wl), GW,
                   j2, jx2, KW, K, EVEN, XPRE)
        if DEPTH > 1:
            acc = _step(acc, b2, x_ptr, x_off, w + 2 * SW, GW, jx2, K, EVEN, XPRE)
            b2 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, gl.minimum(w + (U + 2) * SW, wl),
                       GW, j2, jx2, KW, K, EVEN, XPRE)
    if ESC_EARLY:
        # this split's first escape chunk: its table is loaded before the last full
        # iteration and its x gathered inside it, so neither round trip waits at the end
        t = _esc_table(rows[1] + pid_k * ECH, rows[2], erow_ptr, ecol_ptr, ebits_ptr, ECH,
                       WARPS, True)
        if w_main < w_full:
            acc = _step(acc, b0, x_ptr, x_off, w_main, GW, jx2, K, EVEN, XPRE)
            b0 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off, gl.minimum(w_main + U * SW, wl),
                       GW, j2, jx2, KW, K, EVEN, XPRE)
            xe = _esc_x(t, x_ptr, stride_xm, M, pid_m, BM, ECH, WARPS, True)
            acc = _step(acc, b1, x_ptr, x_off, w_main + SW, GW, jx2, K, EVEN, XPRE)
            b1 = _load(c_ptr, a_ptr, c_off, a_off, x_ptr, x_off,
                       gl.minimum(w_main + (U + 1) * SW, wl), GW, j2, jx2, KW, K, EVEN, XPRE)
            if DEPTH > 1:
                acc = _step(acc, b2, x_ptr, x_off, w_main + 2 * SW, GW, jx2, K, EVEN, XPRE)
        else:
            xe = _esc_x(t, x_ptr, stride_xm, M, pid_m, BM, ECH, WARPS, True)
    # the last nsteps % U (< U <= 3) steps sit in buffers 0 and 1
    if w_full < w_end:
        acc = _step(acc, b0, x_ptr, x_off, w_full, GW, jx2, K, EVEN, XPRE)
    if w_full + SW < w_end:
        acc = _step(acc, b1, x_ptr, x_off, w_full + SW, GW, jx2, K, EVEN, XPRE)
    if PDL:
        _gdc("griddepcontrol.launch_dependents;")
    if not ESC_EARLY:  # all after the loop (16 rows: the early form measured slower)
        rows = _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, WARPS)
        t = 0
        xe = 0
    _epilogue(acc, rows, t, xe, x_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M,
              N, stride_xm, stride_ym, n0, pid_m, pid_k, tile, BM, BN, nsplit, slots, ECH,
              WARPS, ESC_EARLY)


@gluon.constexpr_function
def _l3(ech, warps):
    """The epilogue's [BM, BN, ECH] layout: weight rows over lanes and warps."""
    return gl.BlockedLayout([1, 1, ech], [1, 32, 1], [1, warps, 1], [2, 1, 0])


@gluon.constexpr_function
def _lx(ech, warps, compact):
    """The [BM, ECH] layout of escape x values: `_l3`'s slice (replicated over the lanes),
    or a compact one for values held through the main loop (a few registers)."""
    if compact:
        return gl.BlockedLayout([1, 1], [32 // ech, ech], [warps, 1], [1, 0])
    return gl.SliceLayout(1, _l3(ech, warps))


@gluon.jit
def _rows(base_ptr, rowptr_ptr, N, n0, BN: gl.constexpr, ECH: gl.constexpr, WARPS: gl.constexpr):
    """(row bases [BN] in the epilogue's layout, the tile's escape range lo, hi): constant
    data, which the kernel loads before its main loop when ESC_EARLY (else after it)."""
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, _l3(ECH, WARPS))))
    return (gl.load(base_ptr + offs_n % N), gl.load(rowptr_ptr + n0),
            gl.load(rowptr_ptr + gl.minimum(n0 + BN, N)))


@gluon.jit
def _esc_table(e0, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH: gl.constexpr, WARPS: gl.constexpr,
               COMPACT: gl.constexpr):
    """(rows, columns, bf16 bits) of escapes e0 .. min(e0 + ECH, hi) (rows -1 past hi)."""
    e = e0 + gl.arange(0, ECH, layout=gl.SliceLayout(0, _lx(ECH, WARPS, COMPACT)))
    em = e < hi
    return (gl.load(erow_ptr + e, mask=em, other=-1), gl.load(ecol_ptr + e, mask=em, other=0),
            gl.load(ebits_ptr + e, mask=em, other=0))


@gluon.jit
def _esc_x(t, x_ptr, stride_xm, M, pid_m, BM: gl.constexpr, ECH: gl.constexpr,
           WARPS: gl.constexpr, COMPACT: gl.constexpr):
    """x [BM, ECH] at the columns of escape table t (0 past M and for empty entries)."""
    m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, _lx(ECH, WARPS, COMPACT)))
    return gl.load(x_ptr + gl.expand_dims(m, 1) * stride_xm + gl.expand_dims(t[1], 0),
                   mask=gl.expand_dims(m < M, 1) & gl.expand_dims(t[0] >= 0, 0), other=0.0)


@gluon.jit
def _esc_add(out, t, xv, n3, ph3, ECH: gl.constexpr, WARPS: gl.constexpr):
    """out [BM, BN] += x * value - x * placeholder of each escape of table t (x values xv)
    on its own (row, column); empty entries (row -1) drop out."""
    l3: gl.constexpr = _l3(ECH, WARPS)
    le: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, l3))
    r = gl.convert_layout(t[0], le)
    v = gl.convert_layout((t[2].to(gl.int32) << 16).to(gl.float32, bitcast=True), le)
    x3 = gl.expand_dims(gl.convert_layout(xv, gl.SliceLayout(1, l3)).to(gl.float32), 1)
    d = x3 * gl.expand_dims(gl.expand_dims(v, 0), 1) - x3 * ph3
    hit = n3 == gl.expand_dims(gl.expand_dims(r, 0), 1)
    return out + gl.sum(gl.where(hit, d, 0.0), axis=2)


@gluon.constexpr_function
def _lr(bm, warps, u):
    """The row-parallel escape correction's [BM, BN, U] layout: two threads a weight row
    (half the rows of x each), U of that row's escapes in each."""
    return gl.BlockedLayout([bm // 2, 1, u], [2, 16, 1], [1, warps, 1], [2, 0, 1])


@gluon.jit
def _esc_ranges(rowptr_ptr, base_ptr, N, n0, BM: gl.constexpr, BN: gl.constexpr,
                WARPS: gl.constexpr, U: gl.constexpr):
    """The row-parallel escape correction, round trip 1: each of the tile's BN weight rows'
    CSR escape range [lo, hi) and row base (its escapes decode to the placeholder 2^(base -
    127)), [BN] each. Rows past N hold none (they are never stored). Like `_esc_fetch` and
    `_esc_xs` it only issues loads and returns what they load: each value's first use is in
    the next call of the chain, so a caller that puts a step between two calls has the round
    trip run under it (no compare or convert waits on the load right after it)."""
    lt: gl.constexpr = gl.SliceLayout(0, _lr(BM, WARPS, U))
    n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, lt))
    lo = gl.load(rowptr_ptr + gl.minimum(n, N))  # rows past N: the empty range at the end
    hi = gl.load(rowptr_ptr + gl.minimum(n + 1, N))
    return lo, hi, gl.load(base_ptr + gl.minimum(n, N - 1))


@gluon.jit
def _esc_fetch(lo, hi, p0, ecol_ptr, ebits_ptr, BM: gl.constexpr, SPLIT_K: gl.constexpr,
               WARPS: gl.constexpr, U: gl.constexpr):
    """Round trip 2: the columns and bf16 bits ([BN, U] each) of escapes p0 + u * SPLIT_K
    (u < U) of each row's range; column -1 and bits 0 past a row's end."""
    lt: gl.constexpr = gl.SliceLayout(0, _lr(BM, WARPS, U))
    u = gl.expand_dims(gl.arange(0, U, layout=gl.SliceLayout(0, lt)), 0)  # [1, U]
    j = gl.expand_dims(lo, 1) + p0 + u * SPLIT_K
    ok = j < gl.expand_dims(hi, 1)
    return gl.load(ecol_ptr + j, mask=ok, other=-1), gl.load(ebits_ptr + j, mask=ok, other=0)


@gluon.jit
def _esc_xs(col, x_ptr, M, stride_xm, pid_m, BM: gl.constexpr, WARPS: gl.constexpr,
            U: gl.constexpr):
    """Round trip 3: x at those columns for the tile's BM rows of x, [BM, BN, U] as loaded (0
    past M or a row's end)."""
    le: gl.constexpr = gl.SliceLayout(2, _lr(BM, WARPS, U))
    m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, le))
    xrow = gl.expand_dims(gl.expand_dims(x_ptr + m * stride_xm, 1), 2)  # [BM, 1, 1]
    c3 = gl.expand_dims(col, 0)
    ok = gl.expand_dims(gl.expand_dims(m < M, 1), 2) & (c3 >= 0)
    return gl.load(xrow + c3, mask=ok, other=0.0)


@gluon.jit
def _esc_xs_t(col, xt_ptr, M, stride_xt, pid_m, BM: gl.constexpr, WARPS: gl.constexpr,
              U: gl.constexpr):
    """`_esc_xs` from x^T [K, M] (row stride stride_xt, 16-byte aligned): a thread's BM / 2
    rows of x at an escape's column are contiguous there, two 16-byte loads where x takes 16
    two-byte ones, each from its own row of x (at 32 rows of x, 32 sectors an escape)."""
    lt: gl.constexpr = gl.BlockedLayout([BM // 2, 1, U], [2, 16, 1], [1, WARPS, 1], [0, 2, 1])
    c3 = gl.expand_dims(gl.convert_layout(col, gl.SliceLayout(0, lt)), 0)
    m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, gl.SliceLayout(2, lt)))
    m3 = gl.expand_dims(gl.expand_dims(m, 1), 2)
    x3 = gl.load(xt_ptr + c3 * stride_xt + m3, mask=(m3 < M) & (c3 >= 0), other=0.0)
    return gl.convert_layout(x3, _lr(BM, WARPS, U))


@gluon.jit
def _esc_x3(col, x_ptr, M, stride_xm, pid_m, BM: gl.constexpr, WARPS: gl.constexpr,
            U: gl.constexpr, XT: gl.constexpr):
    """`_esc_xs_t` with XT (x_ptr then x^T, stride_xm its row stride), else `_esc_xs`."""
    if XT:
        x3 = _esc_xs_t(col, x_ptr, M, stride_xm, pid_m, BM, WARPS, U)
    else:
        x3 = _esc_xs(col, x_ptr, M, stride_xm, pid_m, BM, WARPS, U)
    return x3


@gluon.jit
def _esc_terms(x3, bits, base):
    """[BM, BN]: the sum over a round's escapes of x * value - x * placeholder (`_esc_add`'s
    terms; empty slots add 0), from what `_esc_xs`, `_esc_fetch` and `_esc_ranges` loaded."""
    x3 = x3.to(gl.float32)
    v = gl.expand_dims((bits.to(gl.int32) << 16).to(gl.float32, bitcast=True), 0)
    ph = (base.to(gl.int32) << 23).to(gl.float32, bitcast=True)
    ph3 = gl.expand_dims(gl.expand_dims(ph, 1), 0)  # [1, BN, 1]
    return gl.sum(x3 * v - x3 * ph3, axis=2)


@gluon.jit
def _esc_rows(lo, hi, base, p_first, x_ptr, ecol_ptr, ebits_ptr, M, stride_xm, pid_m,
              BM: gl.constexpr, BN: gl.constexpr, SPLIT_K: gl.constexpr,
              WARPS: gl.constexpr, U: gl.constexpr, XT: gl.constexpr = False):
    """[BM, BN] escape correction of a split's share of the tile's escapes from escape p_first
    of each row on, row-parallel: each weight row's escapes are its own CSR range (from
    `_esc_ranges`), escape p of a row goes to split p % SPLIT_K (p_first is this split's), and
    two threads walk each row U escapes a round (`_esc_fetch`, then `_esc_x3`): two dependent
    round trips a round, as many rounds as the tile's fullest row needs (a row holds about
    K x 1e-4 escapes on the benchmark's LLM-like weights), where `_epilogue`'s chunks take two
    per ECH escapes of the whole tile. Callable in a warp-specialized partition."""
    esc = gl.zeros([BM, BN], gl.float32, gl.SliceLayout(2, _lr(BM, WARPS, U)))
    most = gl.max(hi - lo, axis=0)
    for p0 in range(p_first, most, U * SPLIT_K):
        col, bits = _esc_fetch(lo, hi, p0, ecol_ptr, ebits_ptr, BM, SPLIT_K, WARPS, U)
        esc += _esc_terms(_esc_x3(col, x_ptr, M, stride_xm, pid_m, BM, WARPS, U, XT), bits, base)
    return esc


@gluon.jit
def _epilogue(acc, rows, t, xe, x_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M,
              N, stride_xm, stride_ym, n0, pid_m, pid_k, tile, BM: gl.constexpr,
              BN: gl.constexpr, nsplit, slots, ECH: gl.constexpr, WARPS: gl.constexpr,
              FIRST: gl.constexpr, EARLY: gl.constexpr = False):
    """y tile [BM, BN] from split pid_k's accumulator acc [BN, BM] (any layout) of the
    tile's nsplit splits, in a blocked layout: row scale 2^(base - E0) (bases and escape range
    `rows` from `_rows`), this split's escape chunks (chunk c of the tile's escape list is
    done by split c % nsplit; with FIRST the first one's table t and x values xe loaded by the
    caller; with EARLY, t is instead the split's whole correction from `_esc_rows`), then the
    split-K reduction (`splitk.py`'s protocol; the tile's partials in slots
    tile * slots + 0 .. nsplit - 1, summed in that order) and the store. nsplit and slots
    are constexprs (SPLIT_K) or, in the stream-K kernel, run-time values."""
    l2: gl.constexpr = gl.SliceLayout(2, _l3(ECH, WARPS))
    out = gl.convert_layout(gl.permute(acc, (1, 0)), l2)
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, l2))
    offs_m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, l2))
    base = rows[0].to(gl.int32)
    hi = rows[2]
    scale = ((base + (127 - 0x70)) << 23).to(gl.float32, bitcast=True)
    ph = (base << 23).to(gl.float32, bitcast=True)
    out = out * gl.expand_dims(scale, 0)
    n3 = gl.expand_dims(gl.expand_dims(offs_n, 0), 2)  # [1, BN, 1]
    ph3 = gl.expand_dims(gl.expand_dims(ph, 0), 2)
    if EARLY:
        out += gl.convert_layout(t, l2)
    else:
        e_next = rows[1] + pid_k * ECH
        if FIRST:
            out = _esc_add(out, t, xe, n3, ph3, ECH, WARPS)
            e_next += nsplit * ECH
        for e0 in range(e_next, hi, nsplit * ECH):
            tc = _esc_table(e0, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH, WARPS, FIRST)
            out = _esc_add(out, tc, _esc_x(tc, x_ptr, stride_xm, M, pid_m, BM, ECH, WARPS,
                                           FIRST), n3, ph3, ECH, WARPS)

    loc = gl.expand_dims(gl.arange(0, BM, layout=gl.SliceLayout(1, l2)), 1) * BN + \
        gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(0, l2)), 0)
    finish = nsplit < 2
    if nsplit > 1:
        gl.store(ws_ptr + (tile * slots + pid_k) * BM * BN + loc, out)
        _barrier()
        done = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        finish = done == nsplit - 1
    if finish:
        if nsplit > 1:
            out = gl.zeros([BM, BN], gl.float32, l2)
            for s in range(nsplit):
                out += gl.load(ws_ptr + (tile * slots + s) * BM * BN + loc,
                               cache_modifier=".cg")
            gl.atomic_xchg(cnt_ptr + tile, 0)
        y_ptrs = y_ptr + gl.expand_dims(offs_m, 1) * stride_ym + gl.expand_dims(offs_n, 0)
        gl.store(y_ptrs, out.to(y_ptr.dtype.element_ty),
                 mask=gl.expand_dims(offs_m < M, 1) & gl.expand_dims(offs_n < N, 0))


def gluon_constants(k: int, kp: int, gw: int, bm: int, bn: int, bk: int, split_k: int,
                    warps: int, depth: int, xpre: bool = False, use_pdl: bool = False,
                    l1ef: bool = False) -> tuple[int, dict]:
    """(words per split, the kernel's constexprs) of a call on a W12 weight of K columns
    (kp padded, column groups of gw words) with bm rows of x and bn weight rows per program,
    a K step of bk columns, (xpre) x slices loaded a step ahead with the words,
    (use_pdl) a launch with programmatic dependent launch and (l1ef) the words of an
    aligned shape loaded with an L1 evict-first hint only (`EVEN` 2)."""
    if bm not in (8, 16, 32):
        raise ValueError(f"the Gluon W12 kernel takes 8, 16 or 32 rows of x per program, "
                         f"got {bm}")
    if bn % (16 * warps):
        raise ValueError(f"the Gluon W12 kernel gives each warp 16k weight rows: bn={bn} "
                         f"does not split over {warps} warps")
    sw = bk // 8
    if sw < 32 or sw > gw or sw & (sw - 1):
        raise ValueError(f"the Gluon W12 kernel steps 32..{gw} words (a power of two) of one "
                         f"column group, got bk={bk}")
    if depth not in (1, 2):
        raise ValueError(f"the Gluon W12 kernel prefetches 1 or 2 steps, got {depth}")
    if xpre and (bm != 8 or depth != 1):
        raise ValueError(f"the Gluon W12 kernel prefetches x slices for 8 rows of x at depth "
                         f"1 only (more spills registers), got bm={bm}, depth={depth}")
    kper, even = split_words(k, kp, sw, split_k)
    even = int(even) * (2 if l1ef else 1)
    return kper, {"BM": bm, "BN": bn, "SW": sw, "GW": gw, "SPLIT_K": split_k, "EVEN": even,
                  "ECH": 8, "WARPS": warps, "DEPTH": depth, "XPRE": xpre,
                  "ESC_EARLY": bm == 8, "PDL": use_pdl}


def w12_gluon_matmul(x: torch.Tensor, w: W12Weight, y: torch.Tensor, bm: int, bn: int, bk: int,
                     split_k: int, warps: int, depth: int, xpre: bool = False,
                     l1ef: bool = False) -> torch.Tensor:
    """y [M, N] = x [M, K] @ w.T (x contiguous bf16 rows on a CUDA device, y allocated; rows
    in tiles of bm); with PDL where `pdl.active` says so."""
    m, k = x.shape
    on = pdl.active(x.device)
    kper, consts = gluon_constants(k, w.kp, w.gw, bm, bn, bk, split_k, warps, depth, xpre, on,
                                   l1ef)
    grid = (triton.cdiv(w.n, bn) * triton.cdiv(m, bm), split_k)
    ws, cnt = workspace(x.device, grid[0] * grid[1] * bm * bn, grid[0])
    kw = w.kp // 8
    w12_gluon_kernel[grid](
        x, w.a.view(torch.int32), w.codes.view(torch.int32), w.base, w.esc_rowptr, w.esc_row,
        w.esc_col, w.esc_bits, y, ws, cnt, m, w.n, k, kw, *w.row_strides(), x.stride(0),
        y.stride(0), kper, num_warps=warps, **consts, **pdl.launch(on))
    return y


def sk_constants(k: int, kp: int, gw: int, bm: int, bn: int, bk: int, warps: int, depth: int,
                 xpre: bool = False, use_pdl: bool = False, l1ef: bool = False) -> dict:
    """The stream-K kernel's constexprs: `gluon_constants`' less the split count; EVEN when x
    has no padded columns (every unit is a whole step of real words)."""
    _, consts = gluon_constants(k, kp, gw, bm, bn, bk, 1, warps, depth, xpre, use_pdl)
    del consts["SPLIT_K"]
    consts["EVEN"] = int(k == kp) * (2 if l1ef else 1)
    return consts


@functools.cache
def _sm_count(index: int) -> int:
    """SMs of CUDA device `index` (a CUDA tensor's device always carries its index)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def stream_k_plan(n: int, m: int, kw: int, bm: int, bn: int, sw: int,
                  programs: int) -> tuple[int, int, int, int, int]:
    """(tiles, steps a tile, units, programs, partial slots a tile) of a stream-K launch:
    units = tiles x steps spread over at most `programs` programs; a tile is covered by at
    most ceil(steps / units-per-program) + 1 of them, its partial slots."""
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    steps = kw // sw
    units = tiles * steps
    p = max(1, min(programs, units))
    return tiles, steps, units, p, -(-steps // (units // p)) + 1


def w12_gluon_sk_matmul(x: torch.Tensor, w: W12Weight, y: torch.Tensor, bm: int, bn: int,
                        bk: int, per_sm: int, warps: int, depth: int, xpre: bool = False,
                        l1ef: bool = False) -> torch.Tensor:
    """`w12_gluon_matmul` in stream-K form: per_sm programs an SM (as many as stay resident:
    8 one-warp programs at 246-254 registers) share the (tile, step) units evenly, so no
    wave of programs is left part-full."""
    m, k = x.shape
    on = pdl.active(x.device)
    consts = sk_constants(k, w.kp, w.gw, bm, bn, bk, warps, depth, xpre, on, l1ef)
    kw = w.kp // 8
    tiles, steps, units, p, slots = stream_k_plan(
        w.n, m, kw, bm, bn, consts["SW"], per_sm * _sm_count(x.device.index))
    ws, cnt = workspace(x.device, tiles * slots * bm * bn, tiles)
    w12_gluon_sk_kernel[(p,)](
        x, w.a.view(torch.int32), w.codes.view(torch.int32), w.base, w.esc_rowptr, w.esc_row,
        w.esc_col, w.esc_bits, y, ws, cnt, m, w.n, k, kw, *w.row_strides(), x.stride(0),
        y.stride(0), steps, units, slots, num_warps=warps, **consts, **pdl.launch(on))
    return y
