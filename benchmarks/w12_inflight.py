"""Experiments: ways to keep more of the Gluon W12 kernel's weight words in flight at batch
4-8, each config against the shipped pick of the (shape, batch).

    PYTHONPATH=. python3 benchmarks/w12_inflight.py [--kind ring|rot|sk] [--shapes ...]
        [--batches 4,8]

Why: `w12_pattern.py` reads the shipped picks' words alone (same one-warp programs, layout
and steps, no math) at 94-95% of a plain read on qkv 32B-class, where the kernel itself gets
77%; with the words from cache (`w12_floor.py`'s w-row) the math takes 0.70x the kernel's
time. Each part fits: they do not overlap. In the compiled loop (`w12_sass.py`) the refills
of both register buffers of an unrolled two-step iteration are issued after most of its
MMAs, so while a warp computes it has about one step of words in flight; a deeper register
buffer is not possible with x prefetched (246 registers at depth 1). The kinds:

- ring: each thread copies its own 16-byte chunks of the words into a swizzled shared ring
  (cp.async), STAGES - 1 steps ahead, and reads them back right before the decode: no
  barrier (a thread reads only what it copied), bytes in flight without registers; x slices
  a step ahead in registers (the shipped XPRE form), or with `XRING` through the ring too.
- rot: the loop not unrolled, the next two steps' words in three rotating register buffers,
  the refill of step s + 3 issued at the top of step s; x at use or a step ahead.
- sk: the shipped kernel's stream-K launch with 8 rows of x, 4, 6 or 8 resident one-warp
  programs an SM (qkv 32B-class's split-1 pick runs 4.8 an SM), x a step ahead or not.

The ring and rot kernels keep the shipped decode, MMAs and epilogue (escapes after the loop,
split-K across programs); aligned shapes only. Every config is checked against the fp32
reference on fresh inputs with a NaN-poisoned output before it is timed (CUDA graph,
weights rotated past the L2, the shipped pick alternating with the others). All three kinds
measured slower than the shipped picks (docs/BENCHMARKS.md, twentieth W12 run). Scratch: not
in the engine's grid.
"""

from __future__ import annotations

import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from specpilot.kernels.splitk import workspace
from specpilot.kernels.w12 import W12Weight
from specpilot.kernels.w12_gluon import _epilogue, _program_ids, _rows, _step, _words, _xs

_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _ring_copy(cs, a0s, a1s, c_ptr, a_ptr, c_off, a_off, w, GW: gl.constexpr):
    """This thread's chunks of the step at word w into one ring stage (one commit group)."""
    wa = w + (w // GW) * GW
    _async_load(cs, c_ptr + c_off + w, eviction_policy="evict_first")
    _async_load(a0s, a_ptr + a_off + wa, eviction_policy="evict_first")
    _async_load(a1s, a_ptr + a_off + wa + GW, eviction_policy="evict_first")
    async_copy.commit_group()


@gluon.jit
def _x_copy(x_s, st, x_ptr, x_off, w, GW: gl.constexpr):
    """The 8 x^T slices of the step at word w into ring stage st (in the words' group)."""
    colb = w + 7 * (w // GW) * GW
    for i in gl.static_range(8):
        _async_load(x_s.index(st * 8 + i), x_ptr + x_off + colb + i * GW)


@gluon.jit
def _x_read(x_s, st, op_x: gl.constexpr):
    return (x_s.index(st * 8).load(op_x), x_s.index(st * 8 + 1).load(op_x),
            x_s.index(st * 8 + 2).load(op_x), x_s.index(st * 8 + 3).load(op_x),
            x_s.index(st * 8 + 4).load(op_x), x_s.index(st * 8 + 5).load(op_x),
            x_s.index(st * 8 + 6).load(op_x), x_s.index(st * 8 + 7).load(op_x))


@gluon.jit
def _offsets(M, N, stride_c, stride_a, stride_xm, op_w: gl.constexpr, op_x: gl.constexpr,
             BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr):
    """(tile, x tile, split, first weight row, word offsets [BN, SW] of the codes and A planes
    and their column index, x^T offsets [SW, BM] and their column index) of this program, as
    the shipped kernel's `_tile` builds them."""
    tile, pid_n, pid_m, pid_k = _program_ids(M, BM)
    n0 = pid_n * BN
    rows_b = (n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, op_w))) % N
    j2 = gl.expand_dims(gl.arange(0, SW, layout=gl.SliceLayout(0, op_w)), 0)
    c_off = gl.expand_dims(rows_b, 1) * stride_c + j2
    a_off = gl.expand_dims(rows_b, 1) * stride_a + j2
    ma = gl.minimum(pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, op_x)), M - 1)
    jx2 = gl.expand_dims(gl.arange(0, SW, layout=gl.SliceLayout(1, op_x)), 1)
    return tile, pid_m, pid_k, n0, c_off, a_off, j2, gl.expand_dims(ma, 0) * stride_xm + jx2, jx2


@gluon.jit
def w12_ring_kernel(
    x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
    cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, K_PER,
    BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr, GW: gl.constexpr,
    SPLIT_K: gl.constexpr, ECH: gl.constexpr, STAGES: gl.constexpr, XRING: gl.constexpr,
):
    """Program (tile, split): split pid_k's K_PER words of a 16-row tile, one warp."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1],
                                                  instr_shape=[16, 8])
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    op_x: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    tile, pid_m, pid_k, n0, c_off, a_off, _, x_off, jx2 = _offsets(
        M, N, stride_c, stride_a, stride_xm, op_w, op_x, BM, BN, SW)
    # 16-byte chunks xor-swizzled by row: a warp's chunk reads hit distinct banks
    sl: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
    c_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], sl)
    a0_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], sl)
    a1_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], sl)
    # x^T slices [SW, BM], 8 a stage, K fastest: a warp's 16-byte reads are one run
    x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 8 if XRING else 1, SW, BM],
                                    gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                            order=[0, 1]))

    w_lo = pid_k * K_PER
    nsteps = K_PER // SW
    wl = w_lo + (nsteps - 1) * SW  # last step start: copies past it re-read it
    for i in gl.static_range(STAGES - 1):
        w = gl.minimum(w_lo + i * SW, wl)
        if XRING:
            _x_copy(x_s, i, x_ptr, x_off, w, GW)
        _ring_copy(c_s.index(i), a0_s.index(i), a1_s.index(i), c_ptr, a_ptr, c_off, a_off,
                   w, GW)
    if not XRING:
        xs = _xs(x_ptr, x_off, w_lo, GW, jx2, K, True)
    acc = gl.zeros([BN, BM], gl.float32, mma)
    for s in range(nsteps):
        async_copy.wait_group(STAGES - 2)  # step s's group has landed (this thread's copies)
        st = s % STAGES
        cw = c_s.index(st).load(op_w)
        a0 = a0_s.index(st).load(op_w)
        a1 = a1_s.index(st).load(op_w)
        if XRING:
            xs = _x_read(x_s, st, op_x)
        # refill the stage step s - 1 used: its reads were consumed by that step's decode
        nx = (s + STAGES - 1) % STAGES
        wn = gl.minimum(w_lo + (s + STAGES - 1) * SW, wl)
        if XRING:
            _x_copy(x_s, nx, x_ptr, x_off, wn, GW)
        _ring_copy(c_s.index(nx), a0_s.index(nx), a1_s.index(nx), c_ptr, a_ptr, c_off, a_off,
                   wn, GW)
        if not XRING:
            xn = _xs(x_ptr, x_off, gl.minimum(w_lo + s * SW + SW, wl), GW, jx2, K, True)
        acc = _step(acc, (cw, a0, a1, xs), x_ptr, x_off, w_lo + s * SW, GW, jx2, K, True,
                    True)
        if not XRING:
            xs = xn
    async_copy.wait_group(0)
    _epilogue(acc, _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, 1), 0, 0, x_ptr, erow_ptr,
              ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_ym, n0,
              pid_m, pid_k, tile, BM, BN, SPLIT_K, SPLIT_K, ECH, 1, False)


@gluon.jit
def w12_rot_kernel(
    x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
    cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, K_PER,
    BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr, GW: gl.constexpr,
    SPLIT_K: gl.constexpr, ECH: gl.constexpr, XPRE: gl.constexpr,
):
    """The shipped kernel's tile with its loop not unrolled: one step an iteration, the
    words of the next two steps in registers rotating through three buffers (register
    moves), the refill of step s + 3 issued with step s (ptxas puts it at the top of the
    iteration), so it has three steps' time to arrive (the shipped unrolled loop issues both
    refills of an iteration at its end); with XPRE the next step's x slices too."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1],
                                                  instr_shape=[16, 8])
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    op_x: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    tile, pid_m, pid_k, n0, c_off, a_off, j2, x_off, jx2 = _offsets(
        M, N, stride_c, stride_a, stride_xm, op_w, op_x, BM, BN, SW)
    w_lo = pid_k * K_PER
    nsteps = K_PER // SW
    wl = w_lo + (nsteps - 1) * SW
    b0 = _words(c_ptr, a_ptr, c_off, a_off, w_lo, GW, j2, KW, True)
    b1 = _words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w_lo + SW, wl), GW, j2, KW, True)
    b2 = _words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w_lo + 2 * SW, wl), GW, j2, KW, True)
    if XPRE:
        x0 = _xs(x_ptr, x_off, w_lo, GW, jx2, K, True)
    acc = gl.zeros([BN, BM], gl.float32, mma)
    for s in range(nsteps):
        w = w_lo + s * SW
        if XPRE:
            xs = x0
            x0 = _xs(x_ptr, x_off, gl.minimum(w + SW, wl), GW, jx2, K, True)
        else:
            xs = _xs(x_ptr, x_off, w, GW, jx2, K, True)
        cur = (b0[0], b0[1], b0[2], xs)
        b0 = b1
        b1 = b2
        b2 = _words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w + 3 * SW, wl), GW, j2, KW, True)
        acc = _step(acc, cur, x_ptr, x_off, w, GW, jx2, K, True, True)
    _epilogue(acc, _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, 1), 0, 0, x_ptr, erow_ptr,
              ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_ym, n0,
              pid_m, pid_k, tile, BM, BN, SPLIT_K, SPLIT_K, ECH, 1, False)


def ring_fits(w: W12Weight, split_k: int, sw: int = 32) -> bool:
    """Aligned shapes whose splits are whole steps (the kernels have no masked loads)."""
    kw = w.kp // 8
    return w.k == w.kp and kw % (split_k * sw) == 0 and (kw // split_k) % w.gw == 0


def _launch(kernel, x: torch.Tensor, w: W12Weight, y: torch.Tensor, split_k: int,
            **consts) -> torch.Tensor:
    """y = x @ w.T by `kernel` (the ring or rotation kernel): 8 rows of x and 16 weight rows
    a one-warp program, 32-word steps, split_k splits."""
    m, k = x.shape
    kw = w.kp // 8
    grid = (triton.cdiv(w.n, 16) * triton.cdiv(m, 8), split_k)
    wsp, cnt = workspace(x.device, grid[0] * grid[1] * 8 * 16, grid[0])
    kernel[grid](
        x, w.a.view(torch.int32), w.codes.view(torch.int32), w.base, w.esc_rowptr, w.esc_row,
        w.esc_col, w.esc_bits, y, wsp, cnt, m, w.n, k, kw, w.kp // 4, kw, x.stride(0),
        y.stride(0), kw // split_k, BM=8, BN=16, SW=32, GW=w.gw, SPLIT_K=split_k, ECH=8,
        num_warps=1, **consts)
    return y


def ring_matmul(x, w, y, stages: int, split_k: int, xring: bool) -> torch.Tensor:
    return _launch(w12_ring_kernel, x, w, y, split_k, STAGES=stages, XRING=xring)


def rot_matmul(x, w, y, split_k: int, xpre: bool) -> torch.Tensor:
    return _launch(w12_rot_kernel, x, w, y, split_k, XPRE=xpre)


def _shipped(x, y, ship) -> list[tuple[str, object]]:
    from specpilot.kernels.w12_triton import w12_matmul

    return [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]


def _sk_configs(x, y, packed, ship, b: int) -> list[tuple[str, object]]:
    """The shipped pick, and the shipped kernel's stream-K form with 8 rows of x."""
    from specpilot.kernels.w12_gluon import w12_gluon_sk_matmul

    return _shipped(x, y, ship) + [
        (f"sk{per_sm}" + ("_xpre" if xp else ""),
         lambda p, s=per_sm, xp=xp: w12_gluon_sk_matmul(x, p, y, 8, 16, 256, s, 1, 1, xp))
        for per_sm in (4, 6, 8) for xp in (False, True)]


def _ring_configs(x, y, packed, ship, b: int) -> list[tuple[str, object]]:
    """The shipped pick, and the ring kernel's configs this shape takes."""
    out = _shipped(x, y, ship)
    for stages in (3, 4, 6):
        for s in (1, 2, 3):
            for xr in (False, True):
                if ring_fits(packed, s):
                    out.append((f"ring{stages}_s{s}" + ("_xring" if xr else ""),
                                lambda p, st=stages, s=s, xr=xr: ring_matmul(x, p, y, st, s,
                                                                             xr)))
    return out


def _rot_configs(x, y, packed, ship, b: int) -> list[tuple[str, object]]:
    """The shipped pick, and the rotating-buffer kernel's configs this shape takes."""
    return _shipped(x, y, ship) + [
        (f"rot_s{s}" + ("_xpre" if xp else ""), lambda p, s=s, xp=xp: rot_matmul(x, p, y, s, xp))
        for s in (1, 2, 3) for xp in (False, True) if ring_fits(packed, s)]


CONFIGS = {"ring": _ring_configs, "rot": _rot_configs, "sk": _sk_configs}


def main() -> None:
    from benchmarks.w12_bench import SHAPES
    from benchmarks.w12_ksplit import run_shapes

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="4,8")
    ap.add_argument("--reps", type=int, default=3, help="A/B alternations per config")
    ap.add_argument("--kind", choices=sorted(CONFIGS), default="ring",
                    help="ring: the cp.async ring kernel; rot: the rotating register buffers; "
                         "sk: the shipped kernel's stream-K launch, x prefetched or not")
    args = ap.parse_args()
    run_shapes(args.shapes, args.batches, args.reps, CONFIGS[args.kind],
               f"w12_inflight_{args.kind}.json")


if __name__ == "__main__":
    main()
