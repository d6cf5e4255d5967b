"""W12 linear on Hopper's copy engine and warpgroup MMA (Gluon), batch 2-32, warp-specialized.

The register kernel (`w12_gluon.py`) keeps at most two steps of words in flight per warp,
each load an instruction per thread. Here a producer warp streams a program's words and x
slices through a shared-memory ring of STAGES steps with TMA bulk copies (11 a step; a
`ready` mbarrier per stage counts the bytes in, an `empty` one is released by the
consumers), so the bytes in flight are the ring's, not the registers', and the consumers
never issue a copy. The consumers, one warpgroup per 64 weight rows, read a step's words
(codes, A0, A1: [64, SW] each) from shared memory into wgmma's register A operand layout,
the decode (`w12_gluon._decode`) writes the 8 bf16 tiles there, and each multiplies its x
slice [BM, SW] read by the wgmma straight from shared memory (a transposed view: y^T = W
x^T, batch rows are the MMA's N). TMA zero-fills past the tensors' ends (rows past N or M,
words past KW, x columns past K), so no load is masked. The consumers correct the escapes
row-parallel (`w12_gluon._esc_rows`: two threads a weight row walk that row's escapes a few
at a time, three dependent round trips: the row's escape range, the escapes' columns and
values, x at those columns). The first round's three are issued one a step between the
first three steps (`ESC_R`); rows with more escapes in the split take further rounds after
the loop. Each round trip is waited on only under the next step: the loads return their raw
values and nothing reads them before the next call of the chain, and the peeled steps sit
under one `nsteps` test rather than an `if` each (ptxas hoists a load's first use above a
guarded step: `tests/test_w12_patch.py` checks the SASS). The correction stays in registers
and the register kernel's epilogue (row scale, split-K) adds it.

What the escapes cost was their x gathers: from x [M, K] an escape's BM values lie in BM
rows of x (32 sectors at 32 rows), and with those loads alone taken away the kernel ran as
fast as on the same weights with no escape table (2-15% faster; docs/BENCHMARKS.md,
twenty-seventh run). So on a weight with escapes the call first makes x^T [K, M]
(`transposed`, one small kernel) and gathers from it (XT: two 16-byte loads a thread a
round where x takes 16 two-byte ones). The kernel is launched with PDL behind the
transpose, which releases it once x is known written: the producer streams words and x
tiles meanwhile and the consumers wait (`griddepcontrol.wait`) only before their first
gather, after step 1. A config asks for this (`w12_triton.XT`, every config of the grid:
timed alone, calls without it win on the smaller shapes at 16 rows, where the transpose's
launch costs more than the gathers save; end to end such picks ran slower while the kernel
without XT was launched without PDL, and within 0.2% once it was; docs/BENCHMARKS.md,
twenty-eighth and twenty-ninth runs). Without XT, inside the engine's PDL region (`pdl.py`)
the kernel is launched with PDL behind x's writer itself: the producer copies step 0's
words, waits (`griddepcontrol.wait`), then copies x; the consumers wait before anything
but their escape ranges. Launched with PDL either way, the consumers release the next
kernel after their main loop (`RELEASE_DEPENDENTS`; the 8B-class step 1.7% faster at batch
16). In the tuning grid at batch 9-32 (`WGMMA_GRID`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import pdl
from .splitk import workspace
from .w12 import W12Weight
from .w12_gluon import (
    _decode,
    _epilogue,
    _esc_fetch,
    _esc_ranges,
    _esc_rows,
    _esc_terms,
    _esc_x3,
    _gdc,
    _lr,
    _program_ids,
    _rows,
)
from .w12_triton import split_words


@gluon.jit
def _produce(c_desc, a_desc, x_desc, c_s, a0_s, a1_s, x_s, ready, empty, w_lo, nsteps, n0, m0,
             PDL: gl.constexpr, GW: gl.constexpr, SW: gl.constexpr, STAGES: gl.constexpr):
    """The producer warp: step t's words and x slices into stage t % STAGES by TMA, once the
    consumers have released it (a fresh barrier counts as released). With PDL (launched
    while x's writer may still run) it waits for that kernel after step 0's word copies."""
    for t in range(nsteps):
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, 3 * c_desc.block_type.nbytes + 8 * x_desc.block_type.nbytes)
        w = w_lo + t * SW
        wa = w + (w // GW) * GW
        tma.async_copy_global_to_shared(c_desc, [n0, w], bar, c_s.index(s))
        tma.async_copy_global_to_shared(a_desc, [n0, wa], bar, a0_s.index(s))
        tma.async_copy_global_to_shared(a_desc, [n0, wa + GW], bar, a1_s.index(s))
        if PDL:  # noqa: SIM102 (PDL is a constexpr, t a run-time value)
            if t == 0:
                _gdc("griddepcontrol.wait;")
        colb = w + 7 * (w // GW) * GW
        for i in gl.static_range(8):
            tma.async_copy_global_to_shared(x_desc, [m0, colb + i * GW], bar,
                                            x_s.index(s * 8 + i))


@gluon.jit
def _step(c_s, a0_s, a1_s, x_s, ready, empty, t, acc, STAGES: gl.constexpr):
    """Step t: its words from stage t % STAGES into wgmma's A layout, decode, 8 wgmma
    against the stage's x slices, release the stage."""
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    s = t % STAGES
    mbarrier.wait(ready.index(s), (t // STAGES) & 1)
    w0, w1, w2, w3, w4, w5, w6, w7 = _decode(c_s.index(s).load(op_w), a0_s.index(s).load(op_w),
                                             a1_s.index(s).load(op_w))
    acc = warpgroup_mma(w0, x_s.index(s * 8).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w1, x_s.index(s * 8 + 1).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w2, x_s.index(s * 8 + 2).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w3, x_s.index(s * 8 + 3).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w4, x_s.index(s * 8 + 4).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w5, x_s.index(s * 8 + 5).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w6, x_s.index(s * 8 + 6).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w7, x_s.index(s * 8 + 7).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
    fence_async_shared()  # this step's shared reads before the producer's next copy
    mbarrier.arrive(empty.index(s), count=1)
    return acc


@gluon.jit
def _gather(col, x_ptr, M, stride_xm, pid_m, BM: gl.constexpr, WARPS: gl.constexpr,
            FIRST: gl.constexpr, XT: gl.constexpr):
    """A round's x values at its escapes' columns: from x^T with XT (the first round waiting
    for the kernel that wrote it: `griddepcontrol.wait`), else from x."""
    if XT and FIRST:
        _gdc("griddepcontrol.wait;")
    return _esc_x3(col, x_ptr, M, stride_xm, pid_m, BM, WARPS, ESC_U, XT)


@gluon.jit
def _consume(c_s, a0_s, a1_s, x_s, ready, empty, nsteps, x_ptr, base_ptr, rowptr_ptr, erow_ptr,
             ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_ym, n0, pid_m,
             pid_k, tile, BM: gl.constexpr, BN: gl.constexpr, SPLIT_K: gl.constexpr,
             ECH: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr, XT: gl.constexpr,
             PDL: gl.constexpr, RELEASE: gl.constexpr):
    """The consumer warps: the steps (`_step`), the first ESC_R rounds of the split's
    escape correction issued one round trip a step between the first 3 * ESC_R, the rest
    after them; then the epilogue. With XT the escapes' x values come from x^T (x_ptr,
    written by the kernel launched just before this one, waited for before the first).
    With PDL (launched behind x's writer, without XT) they wait for that kernel before
    anything but their escape ranges. Launched either way, with RELEASE they let the next
    kernel launch after their loop."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                    instr_shape=[16, BM, 16])
    acc = gl.zeros([BN, BM], gl.float32, acc_l)
    lo, hi, base = _esc_ranges(rowptr_ptr, base_ptr, N, n0, BM, BN, WARPS, ESC_U)
    esc = gl.zeros([BM, BN], gl.float32, gl.SliceLayout(2, _lr(BM, WARPS, ESC_U)))
    if PDL:  # before any gather of x or store (no step can run before x is in anyway)
        _gdc("griddepcontrol.wait;")
    t0 = 0
    if nsteps >= 3 * ESC_R:  # each round trip in flight under a step (no step is guarded:
        # ptxas hoists a load's first use above a guarded step, exposing its round trip)
        for r in gl.static_range(ESC_R):
            acc = _step(c_s, a0_s, a1_s, x_s, ready, empty, 3 * r, acc, STAGES)
            col, bits = _esc_fetch(lo, hi, pid_k + r * ESC_U * SPLIT_K, ecol_ptr, ebits_ptr, BM,
                                   SPLIT_K, WARPS, ESC_U)
            acc = _step(c_s, a0_s, a1_s, x_s, ready, empty, 3 * r + 1, acc, STAGES)
            x3 = _gather(col, x_ptr, M, stride_xm, pid_m, BM, WARPS, r == 0, XT)
            acc = _step(c_s, a0_s, a1_s, x_s, ready, empty, 3 * r + 2, acc, STAGES)
            esc += _esc_terms(x3, bits, base)
        t0 = 3 * ESC_R
    else:  # a split of fewer steps: its rounds before the loop
        for r in gl.static_range(ESC_R):
            col, bits = _esc_fetch(lo, hi, pid_k + r * ESC_U * SPLIT_K, ecol_ptr, ebits_ptr, BM,
                                   SPLIT_K, WARPS, ESC_U)
            esc += _esc_terms(_gather(col, x_ptr, M, stride_xm, pid_m, BM, WARPS, r == 0, XT),
                              bits, base)
    for t in range(t0, nsteps):
        acc = _step(c_s, a0_s, a1_s, x_s, ready, empty, t, acc, STAGES)
    if RELEASE:
        _gdc("griddepcontrol.launch_dependents;")
    # rows with more than ESC_R * ESC_U escapes in this split
    esc += _esc_rows(lo, hi, base, pid_k + ESC_R * ESC_U * SPLIT_K, x_ptr, ecol_ptr, ebits_ptr, M,
                     stride_xm, pid_m, BM, BN, SPLIT_K, WARPS, ESC_U, XT)
    _epilogue(acc, _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, WARPS), esc, 0, x_ptr, erow_ptr,
              ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_ym, n0, pid_m,
              pid_k, tile, BM, BN, SPLIT_K, SPLIT_K, ECH, WARPS, False, True)


@gluon.jit
def w12_wgmma_kernel(
    c_desc, a_desc, x_desc, x_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr,
    ws_ptr, cnt_ptr, M, N, KW, stride_xm, stride_ym, K_PER,
    BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr, GW: gl.constexpr,
    SPLIT_K: gl.constexpr, ECH: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr,
    XT: gl.constexpr, PDL: gl.constexpr, RELEASE: gl.constexpr,
):
    tile, pid_n, pid_m, pid_k = _program_ids(M, BM)
    n0 = pid_n * BN
    c_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], c_desc.layout)
    a0_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], a_desc.layout)
    a1_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], a_desc.layout)
    x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES * 8, BM, SW], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(ready.index(p), count=1)
        mbarrier.init(empty.index(p), count=1)
    w_lo = pid_k * K_PER
    nsteps = (gl.maximum(gl.minimum(w_lo + K_PER, KW), w_lo) - w_lo + SW - 1) // SW
    gl.warp_specialize([
        (_consume, (c_s, a0_s, a1_s, x_s, ready, empty, nsteps, x_ptr, base_ptr, rowptr_ptr,
                    erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm,
                    stride_ym, n0, pid_m, pid_k, tile, BM, BN, SPLIT_K, ECH, WARPS, STAGES,
                    XT, PDL, RELEASE)),
        (_produce, (c_desc, a_desc, x_desc, c_s, a0_s, a1_s, x_s, ready, empty, w_lo, nsteps,
                    n0, pid_m * BM, PDL, GW, SW, STAGES)),
    ], [1], [24])


# escapes a row's thread takes a round in the consumers' escape correction (`_esc_rows`), and
# the rounds issued one round trip a step under the first 3 * ESC_R steps
ESC_U = gl.constexpr(4)
ESC_R = gl.constexpr(1)

# Launched with PDL, the consumers let the next kernel launch after their main loop.
RELEASE_DEPENDENTS = True

# Registers a thread at launch, so that two programs (a consumer warpgroup of 64 rows + the
# producer's warpgroup) share an SM; the consumers take 232 back from the producer's 24.
# Without the cap one program fits an SM, and the capped config was the fastest of every
# (shape, batch 16 and 32) of the benchmark (docs/BENCHMARKS.md, ninth run).
MAXNREG = 128


def wgmma_constants(kp: int, gw: int, bm: int, bn: int, bk: int, split_k: int,
                    stages: int, xt: bool = False, use_pdl: bool = False) -> tuple[int, dict]:
    """(words per split, the kernel's constexprs) of a call with bm rows of x, bn weight
    rows (one warpgroup per 64), a K step of bk columns, (xt) the escapes' x values
    gathered from x^T and (use_pdl, without xt) launched with PDL behind x's writer."""
    if bm not in (8, 16, 32):
        raise ValueError(f"the wgmma W12 kernel takes 8, 16 or 32 rows of x, got {bm}")
    if bn not in (64, 128):
        raise ValueError(f"the wgmma W12 kernel takes 64 or 128 weight rows, got {bn}")
    sw = bk // 8
    if sw < 16 or sw > gw or sw & (sw - 1):
        raise ValueError(f"the wgmma W12 kernel steps 16..{gw} words (a power of two) of one "
                         f"column group, got bk={bk}")
    kper, _ = split_words(kp, kp, sw, split_k)  # TMA zero-fills: no EVEN variant
    return kper, {"BM": bm, "BN": bn, "SW": sw, "GW": gw,
                  "SPLIT_K": -(-(kp // 8) // kper),  # splits left with no step are dropped
                  "ECH": 4 if bm == 32 else 8,  # [32, BN, 8] escape temporaries spill
                  "WARPS": bn // 16, "STAGES": stages, "XT": xt,
                  "PDL": use_pdl and not xt, "RELEASE": (xt or use_pdl) and RELEASE_DEPENDENTS}


@triton.jit
def _transpose_kernel(x_ptr, xt_ptr, M, K, stride_xm, stride_xt, BM: tl.constexpr,
                      BK: tl.constexpr, PDL: tl.constexpr, RELEASE: tl.constexpr):
    """x^T [K, M] (row stride stride_xt) from x [M, K], BK columns a program. It lets the
    next kernel launch (RELEASE) as soon as x is known written (the W12 kernel streams its
    words and x tiles meanwhile, and waits for this kernel only before its first escape
    gather)."""
    pdl.enter(PDL)
    pdl.release(RELEASE)
    m = tl.arange(0, BM)
    k = tl.program_id(0) * BK + tl.arange(0, BK)
    ok = (m[:, None] < M) & (k[None, :] < K)
    v = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=ok)
    tl.store(xt_ptr + k[:, None] * stride_xt + m[None, :], tl.trans(v), mask=tl.trans(ok))


def transposed(x: torch.Tensor) -> torch.Tensor:
    """x^T [K, M padded to 16] of x [M <= 32, K] by `_transpose_kernel` (launched with PDL
    where the engine's region asks: it then waits for x's writer first; releasing its
    dependents where the device has PDL)."""
    m, k = x.shape
    if m > 32:
        raise ValueError(f"the x^T kernel takes up to 32 rows of x, got {m}")
    xt = torch.empty((k, -(-m // 16) * 16), dtype=x.dtype, device=x.device)
    on = pdl.active(x.device)
    _transpose_kernel[(triton.cdiv(k, 64),)](x, xt, m, k, x.stride(0), xt.stride(0), BM=32,
                                              BK=64, PDL=on, RELEASE=pdl.supported(x.device),
                                              num_warps=4, **pdl.launch(on))
    return xt


def w12_wgmma_matmul(x: torch.Tensor, w: W12Weight, y: torch.Tensor, bm: int, bn: int, bk: int,
                     split_k: int, stages: int, xt: bool = False) -> torch.Tensor:
    """y [M, N] = x [M, K] @ w.T (x contiguous bf16 rows, K a multiple of 8). With xt, on a
    weight with escapes and a device with PDL: x^T is made first (`transposed`) and the
    kernel, launched with PDL behind it, gathers the escapes' x values from it (XT).
    Otherwise it is launched with PDL where `pdl.active` says so, behind x's writer."""
    m, k = x.shape
    if k % 8:
        raise ValueError(f"the wgmma W12 kernel needs K a multiple of 8 (TMA), got {k}")
    if x.data_ptr() % 16 or x.stride(0) % 8:  # TMA reads 16-byte aligned rows only
        x = x.clone(memory_format=torch.contiguous_format)
    xt = xt and m <= 32 and w.n_escapes > 0 and pdl.supported(x.device)
    kper, consts = wgmma_constants(w.kp, w.gw, bm, bn, bk, split_k, stages, xt,
                                   pdl.active(x.device))
    sw = consts["SW"]
    kw = w.kp // 8
    wl = gl.NVMMASharedLayout.get_default_for([bn, sw], gl.int32)
    xl = gl.NVMMASharedLayout.get_default_for([bm, sw], gl.bfloat16)
    c_desc = TensorDescriptor.from_tensor(w.codes.view(torch.int32).view(w.n, kw), [bn, sw], wl)
    a_desc = TensorDescriptor.from_tensor(w.a.view(torch.int32).view(w.n, 2 * kw), [bn, sw], wl)
    x_desc = TensorDescriptor.from_tensor(x, [bm, sw], xl)
    grid = (triton.cdiv(w.n, bn) * triton.cdiv(m, bm), consts["SPLIT_K"])
    ws, cnt = workspace(x.device, grid[0] * grid[1] * bm * bn, grid[0])
    # nothing may launch between these two: the kernel reads x before its wait, which is safe
    # only because the kernel it follows released it after waiting for x's writer (pdl.py)
    xg = transposed(x) if xt else x
    w12_wgmma_kernel[grid](
        c_desc, a_desc, x_desc, xg, w.base, w.esc_rowptr, w.esc_row, w.esc_col, w.esc_bits, y,
        ws, cnt, m, w.n, kw, xg.stride(0), y.stride(0), kper, num_warps=bn // 16,
        maxnreg=MAXNREG, **consts, **pdl.launch(xt or consts["PDL"]))
    return y
