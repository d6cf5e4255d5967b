"""A batch-1 W12 GEMV fed by TMA, against the shipped table's pick (a design probe: not in the
engine). The shipped GEMV keeps its weight loads in flight in registers, one K step a warp;
here each program streams its word tiles (codes, A0, A1: [BN, SW] each) through a
STAGES-deep shared-memory ring with TMA bulk copies, so the bytes in flight are the ring's,
and its warps read them back with 16-byte shared loads, decode (the shared bf16 byte-permute
PTX, then bf16 -> fp32) and FMA. x comes through the ring too (`xtma`: 8 copies of [1, SW] a
step) or from global memory a step ahead in registers (`xreg`); `bare` skips the decode and
7 of the 8 products (the loads and one FMA a word: the structure's own cost).

    PYTHONPATH=. python3 benchmarks/w12_tma_gemv.py [--shapes qkv_32B,o_32B]

Per shape: a plain read of the W12 bytes, the shipped pick, then every config of `CONFIGS`
(bn rows a program, sw words a step, ring stages, warps, K splits, x mode), each checked
against the fp32 reference on NaN-poisoned outputs (`bare` gives wrong products on purpose:
time only). Timing as in w12_bench.py: CUDA graphs over weight copies rotated past the L2,
medians.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from benchmarks.stream_read import read_us
from benchmarks.w12_bench import ALL_SHAPES, SHAPES, w12_copies
from benchmarks.w12_probe import names_in
from specpilot.kernels.splitk import workspace
from specpilot.kernels.tuning import graph_timer, load_table
from specpilot.kernels.w12_gluon import _barrier, _decode, _epilogue, _rows
from specpilot.kernels.w12_triton import split_words, w12_matmul

# (bn, sw, stages, warps, split_k, x mode)
CONFIGS = ((16, 64, 3, 1, 1, "xtma"), (16, 64, 3, 1, 1, "xreg"), (16, 64, 4, 1, 1, "xreg"),
           (8, 64, 4, 1, 1, "xreg"), (8, 64, 6, 1, 1, "xreg"), (32, 64, 3, 2, 1, "xreg"),
           (64, 64, 2, 4, 1, "xreg"), (16, 64, 3, 1, 2, "xreg"), (16, 64, 4, 1, 1, "bare"),
           (8, 64, 6, 1, 1, "bare"))


@gluon.jit
def _issue(c_desc, a_desc, x_desc, c_s, a0_s, a1_s, x_s, ready, t, w_lo, n0, GW: gl.constexpr,
           SW: gl.constexpr, STAGES: gl.constexpr, XTMA: gl.constexpr):
    """Step t's word tiles (and with XTMA its 8 x slices) into ring stage t % STAGES."""
    s = t % STAGES
    bar = ready.index(s)
    if XTMA:
        mbarrier.expect(bar, 3 * c_desc.block_type.nbytes + 8 * x_desc.block_type.nbytes)
    else:
        mbarrier.expect(bar, 3 * c_desc.block_type.nbytes)
    w = w_lo + t * SW
    wa = w + (w // GW) * GW
    tma.async_copy_global_to_shared(c_desc, [n0, w], bar, c_s.index(s))
    tma.async_copy_global_to_shared(a_desc, [n0, wa], bar, a0_s.index(s))
    tma.async_copy_global_to_shared(a_desc, [n0, wa + GW], bar, a1_s.index(s))
    if XTMA:
        colb = w + 7 * (w // GW) * GW
        for i in gl.static_range(8):
            tma.async_copy_global_to_shared(x_desc, [0, colb + i * GW], bar,
                                            x_s.index(s * 8 + i))


@gluon.jit
def _x_global(x_ptr, xo, t, w_lo, nsteps, GW: gl.constexpr, SW: gl.constexpr):
    """Step t's 8 x slices [1, SW] from global memory (nothing past the split's last step)."""
    w = w_lo + t * SW
    p = x_ptr + (w + 7 * (w // GW) * GW) + xo
    ok = t < nsteps
    return (gl.load(p, mask=ok), gl.load(p + GW, mask=ok), gl.load(p + 2 * GW, mask=ok),
            gl.load(p + 3 * GW, mask=ok), gl.load(p + 4 * GW, mask=ok),
            gl.load(p + 5 * GW, mask=ok), gl.load(p + 6 * GW, mask=ok),
            gl.load(p + 7 * GW, mask=ok))


@gluon.jit
def tma_gemv_kernel(c_desc, a_desc, x_desc, x_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr,
                    ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, KW, stride_xm, stride_ym, K_PER,
                    BN: gl.constexpr, SW: gl.constexpr, GW: gl.constexpr,
                    SPLIT_K: gl.constexpr, ECH: gl.constexpr, STAGES: gl.constexpr,
                    WARPS: gl.constexpr, XTMA: gl.constexpr, BARE: gl.constexpr):
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    n0 = pid_n * BN
    c_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], c_desc.layout)
    a0_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], a_desc.layout)
    a1_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], a_desc.layout)
    x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES * 8, 1, SW], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(ready.index(p), count=1)
    w_lo = pid_k * K_PER
    nsteps = (gl.maximum(gl.minimum(w_lo + K_PER, KW), w_lo) - w_lo + SW - 1) // SW
    for p in gl.static_range(STAGES - 1):
        if p < nsteps:
            _issue(c_desc, a_desc, x_desc, c_s, a0_s, a1_s, x_s, ready, p, w_lo, n0, GW, SW,
                   STAGES, XTMA)
    TS: gl.constexpr = SW // 4  # threads along a step's words, 4 words (16 bytes) each
    wl: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TS, TS], [WARPS, 1], [1, 0])
    xo = gl.expand_dims(gl.arange(0, SW, layout=gl.SliceLayout(0, wl)), 0)  # [1, SW]
    xn = _x_global(x_ptr, xo, 0, w_lo, nsteps, GW, SW)
    acc = gl.zeros([BN, SW], gl.float32, wl)
    for t in range(nsteps):
        s = t % STAGES
        if t + STAGES - 1 < nsteps:  # into the stage read in step t - 1
            if WARPS > 1:
                _barrier()
            fence_async_shared()
            _issue(c_desc, a_desc, x_desc, c_s, a0_s, a1_s, x_s, ready, t + STAGES - 1, w_lo,
                   n0, GW, SW, STAGES, XTMA)
        if not XTMA:  # this step's x was loaded in the last one; the next one's now
            xc = xn
            xn = _x_global(x_ptr, xo, t + 1, w_lo, nsteps, GW, SW)
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        if XTMA:
            xc = (x_s.index(s * 8).load(wl), x_s.index(s * 8 + 1).load(wl),
                  x_s.index(s * 8 + 2).load(wl), x_s.index(s * 8 + 3).load(wl),
                  x_s.index(s * 8 + 4).load(wl), x_s.index(s * 8 + 5).load(wl),
                  x_s.index(s * 8 + 6).load(wl), x_s.index(s * 8 + 7).load(wl))
        c = c_s.index(s).load(wl)
        a0 = a0_s.index(s).load(wl)
        a1 = a1_s.index(s).load(wl)
        if BARE:
            acc += (c ^ a0 ^ a1).to(gl.float32, bitcast=True) * xc[0].to(gl.float32)
        else:
            w0, w1, w2, w3, w4, w5, w6, w7 = _decode(c, a0, a1)
            acc += w0.to(gl.float32) * xc[0].to(gl.float32)
            acc += w1.to(gl.float32) * xc[1].to(gl.float32)
            acc += w2.to(gl.float32) * xc[2].to(gl.float32)
            acc += w3.to(gl.float32) * xc[3].to(gl.float32)
            acc += w4.to(gl.float32) * xc[4].to(gl.float32)
            acc += w5.to(gl.float32) * xc[5].to(gl.float32)
            acc += w6.to(gl.float32) * xc[6].to(gl.float32)
            acc += w7.to(gl.float32) * xc[7].to(gl.float32)
    out = gl.expand_dims(gl.sum(acc, axis=1), 1)  # [BN, 1]: y^T of this split
    _epilogue(out, _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, WARPS), 0, 0, x_ptr, erow_ptr,
              ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_ym, n0, 0,
              pid_k, pid_n, 1, BN, SPLIT_K, SPLIT_K, ECH, WARPS, False)


def tma_gemv(x, w, y, bn: int, sw: int, stages: int, warps: int, split_k: int, mode: str):
    """y [1, N] = x [1, K] @ w.T (x bf16, K a multiple of 8) with the TMA GEMV."""
    kw = w.kp // 8
    kper, _ = split_words(w.kp, w.kp, sw, split_k)
    nsplit = -(-kw // kper)
    wl = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    xl = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    c_desc = TensorDescriptor.from_tensor(w.codes.view(torch.int32).view(w.n, kw), [bn, sw], wl)
    a_desc = TensorDescriptor.from_tensor(w.a.view(torch.int32).view(w.n, 2 * kw), [bn, sw], wl)
    x_desc = TensorDescriptor.from_tensor(x, [1, sw], xl)
    grid = (triton.cdiv(w.n, bn), nsplit)
    ws, cnt = workspace(x.device, grid[0] * grid[1] * bn, grid[0])
    tma_gemv_kernel[grid](c_desc, a_desc, x_desc, x, w.base, w.esc_rowptr, w.esc_row,
                          w.esc_col, w.esc_bits, y, ws, cnt, 1, w.n, kw, x.stride(0),
                          y.stride(0), kper, BN=bn, SW=sw, GW=w.gw, SPLIT_K=nsplit, ECH=8,
                          STAGES=stages, WARPS=warps, XTMA=mode == "xtma", BARE=mode == "bare",
                          num_warps=warps)
    return y


def run_shape(name: str, table) -> dict:
    n, k = ALL_SHAPES[name]
    w, p, rot = w12_copies(name)
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    ref = x.float() @ w.float().T
    y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    turn = itertools.cycle(rot)

    def median_us(call) -> float:  # call(weight), over the rotation
        return statistics.median(graph_timer(lambda: call(next(turn)), len(rot)))

    ship = table.lookup("w12", n, k, 1)
    row = {"shape": name, "read_us": read_us(p.nbytes)[0], "ship": ship.label,
           "ship_us": median_us(lambda q: w12_matmul(x, q, ship, out=y)), "tma": {}}
    for cfg in CONFIGS:
        bn, sw, st, wp, sk, mode = cfg
        y.fill_(float("nan"))
        tma_gemv(x, p, y, *cfg)
        err = float((y.float() - ref).abs().max() / ref.abs().max())
        us = median_us(lambda q, cfg=cfg: tma_gemv(x, q, y, *cfg))
        row["tma"][f"n{bn}k{8 * sw}p{st}w{wp}s{sk}-{mode}"] = {
            "us": us, "correct": mode == "bare" or err < 0.02}
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args()
    shapes = names_in(a.shapes, ALL_SHAPES, "shape")
    table = load_table(torch.cuda.get_device_name())
    rows = []
    for name in shapes:
        r = run_shape(name, table)
        torch.cuda.empty_cache()
        rows.append(r)
        real = {lab: v["us"] for lab, v in r["tma"].items() if not lab.endswith("bare")}
        best = min(real, key=real.get)
        bare = min(v["us"] for lab, v in r["tma"].items() if lab.endswith("bare"))
        bad = [lab for lab, v in r["tma"].items() if not v["correct"]]
        print(f"{name:12s} read {r['read_us']:6.2f}  shipped {r['ship_us']:6.2f} "
              f"({r['ship']})  best TMA {real[best]:6.2f} ({best})  TMA bare {bare:6.2f}  "
              f"failed {bad}", flush=True)
    if a.json:  # whole or not at all
        with open(a.json + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
