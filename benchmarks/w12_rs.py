"""Explore-only: a W12 linear whose MMA warps load their words straight into warpgroup-MMA
A registers, decode them there and multiply x slices that a TMA ring brings into shared
memory (wgmma's B operand), timed against the shipped picks at batch 16-32.

    PYTHONPATH=. python3 benchmarks/w12_rs.py [--shapes ...] [--batches 16,32] [--reps 2]

The twenty-fourth W12 run found the TMA + wgmma kernel (`w12_wgmma.py`) bound by its TMA
word copies, which stream worse than the register kernels' loads. This kernel keeps wgmma
(x read from shared memory: no x registers, one x slice a step for 64 weight rows instead of
16) but loads the words as the register kernels do, with 8-byte loads in the A operand
layout one step ahead; one warpgroup of 64 weight rows a program, no warp specialization.
OVERLAP 1 decodes the next step while this step's wgmma run (one more step of decoded tiles
held). Aligned shapes only (K a multiple of 512: every benchmark shape). Each config is
checked against the fp32 reference with a NaN-poisoned output, then A/B-timed against the
shipped pick (`w12_ksplit.bench_shape`); rows to $OUT/w12_rs.json. Measured in
docs/BENCHMARKS.md, twenty-fourth W12 run: slower than the shipped picks everywhere; not in
the engine.
"""

from __future__ import annotations

import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from specpilot.kernels.splitk import workspace
from specpilot.kernels.w12 import W12Weight
from specpilot.kernels.w12_gluon import (
    _barrier,
    _decode,
    _epilogue,
    _program_ids,
    _rows,
    _words,
)
from specpilot.kernels.w12_triton import split_words


@gluon.jit
def _x_copy(x_desc, x_s, ready, s, w, m0, GW: gl.constexpr):
    """Step w's 8 x slices into stage s by TMA (zero past K)."""
    bar = ready.index(s)
    mbarrier.expect(bar, 8 * x_desc.block_type.nbytes)
    colb = w + 7 * (w // GW) * GW
    for i in gl.static_range(8):
        tma.async_copy_global_to_shared(x_desc, [m0, colb + i * GW], bar, x_s.index(s * 8 + i))


@gluon.jit
def _word_load(c_ptr, a_ptr, c_off, a_off, w, GW: gl.constexpr):
    """Step w's word tiles, unmasked (aligned shapes only): the register kernel's loads."""
    return _words(c_ptr, a_ptr, c_off, a_off, w, GW, 0, 0, 1)


@gluon.jit
def _mma_step(ws, x_s, s, acc):
    """The 8 decoded tiles of a step against its 8 x slices of stage s (async); waited for
    with the tiles kept live, so their registers outlast the MMAs that read them."""
    for i in gl.static_range(8):
        acc = warpgroup_mma(ws[i], x_s.index(s * 8 + i).permute((1, 0)), acc, is_async=True)
    return acc


@gluon.jit
def _mma_wait(acc, ws):
    w0, w1, w2, w3, w4, w5, w6, w7 = ws
    return warpgroup_mma_wait(0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]


@gluon.jit
def _refill(x_desc, x_s, ready, t, nsteps, w_lo, m0, SW: gl.constexpr, GW: gl.constexpr,
            STAGES: gl.constexpr):
    """After every warp's wait for step t: step t + STAGES - 1's x into the stage that step
    t - 1 read."""
    tn = t + STAGES - 1
    if tn < nsteps:
        _barrier()
        _x_copy(x_desc, x_s, ready, tn % STAGES, w_lo + tn * SW, m0, GW)


@gluon.jit
def w12_rs_kernel(x_desc, a_ptr, c_ptr, x_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr,
                  ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, KW, stride_a, stride_c, stride_xm,
                  stride_ym, K_PER, BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr,
                  GW: gl.constexpr, SPLIT_K: gl.constexpr, ECH: gl.constexpr,
                  WARPS: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr):
    tile, pid_n, pid_m, pid_k = _program_ids(M, BM)
    n0 = pid_n * BN
    m0 = pid_m * BM
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                    instr_shape=[16, BM, 16])
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    rows_b = (n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, op_w))) % N
    jb = gl.expand_dims(gl.arange(0, SW, layout=gl.SliceLayout(0, op_w)), 0)
    c_off = gl.expand_dims(rows_b, 1) * stride_c + jb
    a_off = gl.expand_dims(rows_b, 1) * stride_a + jb
    x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES * 8, BM, SW], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(ready.index(p), count=1)
    w_lo = pid_k * K_PER
    nsteps = (gl.maximum(gl.minimum(w_lo + K_PER, KW), w_lo) - w_lo + SW - 1) // SW
    wl = gl.maximum(w_lo + (nsteps - 1) * SW, 0)  # loads past the last step re-read it
    for p in gl.static_range(STAGES - 1):
        if p < nsteps:
            _x_copy(x_desc, x_s, ready, p, w_lo + p * SW, m0, GW)
    acc = gl.zeros([BN, BM], gl.float32, acc_l)
    words = _word_load(c_ptr, a_ptr, c_off, a_off, w_lo, GW)
    if OVERLAP:
        ws = _decode(*words)
        words = _word_load(c_ptr, a_ptr, c_off, a_off, gl.minimum(w_lo + SW, wl), GW)
        for t in range(nsteps):
            s = t % STAGES
            mbarrier.wait(ready.index(s), (t // STAGES) & 1)
            acc = _mma_step(ws, x_s, s, acc)
            ws_next = _decode(*words)  # under this step's MMAs
            words = _word_load(c_ptr, a_ptr, c_off, a_off,
                               gl.minimum(w_lo + (t + 2) * SW, wl), GW)
            acc = _mma_wait(acc, ws)
            _refill(x_desc, x_s, ready, t, nsteps, w_lo, m0, SW, GW, STAGES)
            ws = ws_next
    else:
        for t in range(nsteps):
            s = t % STAGES
            nxt = _word_load(c_ptr, a_ptr, c_off, a_off, gl.minimum(w_lo + (t + 1) * SW, wl),
                             GW)
            ws = _decode(*words)
            mbarrier.wait(ready.index(s), (t // STAGES) & 1)
            acc = _mma_wait(_mma_step(ws, x_s, s, acc), ws)
            _refill(x_desc, x_s, ready, t, nsteps, w_lo, m0, SW, GW, STAGES)
            words = nxt
    for p in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(p))
    _epilogue(acc, _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, WARPS), 0, 0, x_ptr, erow_ptr,
              ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_ym, n0, pid_m,
              pid_k, tile, BM, BN, SPLIT_K, SPLIT_K, ECH, WARPS, False)


def w12_rs_matmul(x: torch.Tensor, w: W12Weight, y: torch.Tensor, bm: int, bk: int,
                  split_k: int, stages: int, overlap: bool = False) -> torch.Tensor:
    """y [M, N] = x [M, K] @ w.T with 64 weight rows a program, K steps of bk columns."""
    m, k = x.shape
    if k % (8 * w.gw) or bk % 128 or bk // 8 > w.gw:
        raise ValueError(f"w12_rs takes K a multiple of {8 * w.gw} and bk in 128..{8 * w.gw}")
    sw, kw = bk // 8, w.kp // 8
    kper, _ = split_words(w.kp, w.kp, sw, split_k)
    x_desc = TensorDescriptor.from_tensor(
        x, [bm, sw], gl.NVMMASharedLayout.get_default_for([bm, sw], gl.bfloat16))
    grid = (triton.cdiv(w.n, 64) * triton.cdiv(m, bm), -(-kw // kper))
    ws, cnt = workspace(x.device, grid[0] * grid[1] * bm * 64, grid[0])
    w12_rs_kernel[grid](
        x_desc, w.a.view(torch.int32), w.codes.view(torch.int32), x, w.base, w.esc_rowptr,
        w.esc_row, w.esc_col, w.esc_bits, y, ws, cnt, m, w.n, kw, w.kp // 4, kw, x.stride(0),
        y.stride(0), kper, BM=bm, BN=64, SW=sw, GW=w.gw, SPLIT_K=grid[1],
        ECH=4 if bm == 32 else 8, WARPS=4, STAGES=stages, OVERLAP=int(overlap), num_warps=4)
    return y


GRID = [(bk, split, stages, overlap) for overlap in (False, True)
        for bk, split, stages in ((128, 1, 3), (128, 2, 3), (128, 4, 3), (256, 1, 2),
                                  (256, 2, 2), (256, 4, 2))]


def _configs(x, y, packed, ship, b):
    from specpilot.kernels.w12_triton import w12_matmul

    bm = 16 if b <= 16 else 32
    out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
    for bk, split, stages, overlap in GRID:
        label = f"rs_m{bm}k{bk}s{split}p{stages}" + ("_overlap" if overlap else "")
        out.append((label, lambda p, a=(bm, bk, split, stages, overlap): w12_rs_matmul(
            x, p, y, *a)))
    return out


def main() -> None:
    from benchmarks.w12_bench import SHAPES
    from benchmarks.w12_ksplit import run_shapes

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--reps", type=int, default=2, help="A/B alternations per config")
    args = ap.parse_args()
    if any(int(b) < 9 or int(b) > 32 for b in args.batches.split(",")):
        raise SystemExit("w12_rs times batch 9-32 (16 or 32 rows of x a program)")
    run_shapes(args.shapes, args.batches, args.reps, _configs, "w12_rs.json")


if __name__ == "__main__":
    main()
