"""A batch-1 W12 GEMV of one program an SM whose warps step through K together, each timed
against the shipped pick on the same weights.

    PYTHONPATH=. python3 benchmarks/w12_lockstep.py [--shapes o_32B,qkv_32B] [--reps 3]

The thirty-first W12 run (docs/BENCHMARKS.md) found the one-wave batch-1 picks losing the
spread of their programs' ends (1-2 us, 8-13% of a call), in the order the programs were
dispatched: programs that share an SM and do equal work finish one after another, so the
last ones stream with fewer bytes in flight. The thirty-second run's queues and short
programs cost more than that spread. Here each SM runs one program (`per_sm` 1; 2 for the
control of two) of `warps` warps over a contiguous block of N / programs rows (the blocks
differ by at most one row), and with `sync` its warps meet at a barrier after every K step,
so no warp of an SM runs ahead of the others and the SM's warps end together. The tile is
the next power of two of rows, the rows past the block masked off (no loads). Decode,
escapes and epilogue are the shipped GEMV's (`w12_triton`); `stages` 0 is the plain loop,
2-3 the loop pipelined through shared memory (the `PIPE` GEMV's; without the barrier only). Checks and timing are
`w12_ksplit.bench_shape`'s (fp32 reference, NaN-poisoned output; CUDA graphs over weight
copies rotated past the L2; configs alternated `reps` times). Writes w12_lockstep.json
under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from benchmarks.w12_ksplit import run_shapes
from specpilot.kernels import interpreting
from specpilot.kernels.w12 import W12Weight
from specpilot.kernels.w12_triton import (
    _decode_f32,
    _escape_table,
    _escape_terms,
    _escape_x,
    _finish,
    _fma8,
    _sum3,
    escape_chunk,
    step_words,
    w12_matmul,
)


@triton.jit
def w12_lock_kernel(x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr,
                    y_ptr, N, K, KW, stride_a, stride_c, P,
                    BN: tl.constexpr, NG: tl.constexpr, GS: tl.constexpr, GW: tl.constexpr,
                    ECH: tl.constexpr, STAGES: tl.constexpr, SYNC: tl.constexpr,
                    USE_ASM: tl.constexpr = True):
    pid = tl.program_id(0)
    start = (pid * N) // P
    end = ((pid + 1) * N) // P
    SW: tl.constexpr = NG * GS
    q = tl.arange(0, NG)[None, :, None]
    g = tl.arange(0, GS)[None, None, :]
    xq = q * (8 * GW) + g
    offs_m = tl.arange(0, 1)
    m_mask = offs_m < 1
    offs_n = start + tl.arange(0, BN)
    live = (offs_n < end)[:, None, None]
    rows = tl.minimum(offs_n, N - 1)
    r3 = rows[:, None, None]
    c_off = r3 * stride_c + q * GW + g
    a_off = r3 * stride_a + q * (2 * GW) + g
    base = tl.load(base_ptr + rows).to(tl.int32)
    scale = ((base + (127 - 0x70)) << 23).to(tl.float32, bitcast=True)
    ph = (base << 23).to(tl.float32, bitcast=True)
    lo = tl.load(rowptr_ptr + start)
    hi = tl.load(rowptr_ptr + end)
    er, ec, ev = _escape_table(lo, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH)
    acc0 = tl.zeros((BN, NG, GS), dtype=tl.float32)
    for w in tl.range(0, KW, SW, num_stages=STAGES):
        q0 = w // GW
        wa = tl.multiple_of(w + q0 * GW, 16)
        colb = tl.multiple_of(w + 7 * q0 * GW, 16)
        cw = tl.load(c_ptr + c_off + w, mask=live, other=0, eviction_policy="evict_first")
        a0 = tl.load(a_ptr + a_off + wa, mask=live, other=0, eviction_policy="evict_first")
        a1 = tl.load(a_ptr + a_off + wa + GW, mask=live, other=0,
                     eviction_policy="evict_first")
        f0, f1, f2, f3, f4, f5, f6, f7 = _decode_f32(cw, a0, a1, USE_ASM)
        acc0 = _fma8(acc0, f0, f1, f2, f3, f4, f5, f6, f7, x_ptr, 0, 1, 0, colb + xq, GW,
                     K, True)
        if SYNC:
            tl.debug_barrier()
    exv = _escape_x(x_ptr, 0, offs_m, m_mask, er, ec)
    esc = _escape_terms(exv, er, ev, offs_n, ph)
    acc = _sum3(acc0)[None, :]
    _finish(acc, esc, x_ptr, 0, offs_m, m_mask, offs_n, end, scale, ph, lo, hi, erow_ptr,
            ecol_ptr, ebits_ptr, y_ptr, 0, ECH)


def lock_matmul(x: torch.Tensor, w: W12Weight, y: torch.Tensor, bk: int, warps: int,
                stages: int, per_sm: int, sync: bool) -> torch.Tensor:
    """y [1, N] = x [1, K] @ w.T, one program per SM (per_sm) over a contiguous row block;
    K a whole number of bk steps with no padding (every preset shape)."""
    ng, gs = step_words(w.gw, bk)
    kw = w.kp // 8
    if x.shape[0] != 1 or w.kp != w.k or kw % (ng * gs):
        raise ValueError(f"lock_matmul takes one row of x and whole steps, got x "
                         f"{tuple(x.shape)}, K={w.k}, bk={bk}")
    p = min(w.n, programs(x.device, per_sm))
    bn = triton.next_power_of_2(triton.cdiv(w.n, p))
    w12_lock_kernel[(p,)](
        x, w.a.view(torch.int32), w.codes.view(torch.int32), w.base, w.esc_rowptr, w.esc_row,
        w.esc_col, w.esc_bits, y, w.n, w.k, kw, *w.row_strides(), p, BN=bn, NG=ng, GS=gs,
        GW=w.gw, ECH=escape_chunk(1, bn), STAGES=stages or None, SYNC=sync,
        USE_ASM=not interpreting(), num_warps=warps)
    return y


def programs(device: torch.device, per_sm: int) -> int:
    sms = 2 if interpreting() else torch.cuda.get_device_properties(device).multi_processor_count
    return sms * per_sm


# (bk, weight rows a warp, stages, programs an SM): warps = the tile's rows / rows a warp.
# The barrier stops Triton's loop pipelining (no cp.async with it, checked for sm_90), so
# the pipelined entries run without it only; at 32 warps (64 registers a thread) a warp's
# rows x bk must stay <= 1024 or ptxas spills (checked for sm_90 on these shapes)
LOCK_GRID = [(512, 2, 0, 1), (256, 4, 0, 1), (512, 4, 0, 1), (1024, 1, 0, 1), (1024, 2, 0, 2),
             (512, 2, 0, 2), (512, 2, 3, 1), (256, 4, 3, 1), (1024, 2, 2, 2), (512, 2, 3, 2)]


def _configs(x, y, packed, ship, b: int) -> list[tuple[str, object]]:
    if ship is None:  # a GPU with no shipped table (an H100): the H200's pick, same kernel
        from specpilot.kernels.tuning import load_table

        ship = load_table("NVIDIA H200").lookup("w12", packed.n, packed.k, b)
    out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
    for bk, rpw, st, per in LOCK_GRID:
        bn = triton.next_power_of_2(triton.cdiv(packed.n, programs(x.device, per)))
        wp = bn // rpw
        if (packed.kp // 8) % (bk // 8) or not 1 <= wp <= 32 or (wp == 32 and rpw * bk > 1024):
            continue
        for sync in (True, False) if st == 0 else (False,):
            label = f"{'sync' if sync else 'free'}_k{bk}r{rpw}w{wp}p{st}x{per}"
            out.append((label, lambda p, a=(bk, wp, st, per, sync): lock_matmul(x, p, y, *a)))
    return out


def main() -> None:
    from benchmarks.w12_bench import SHAPES

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="o_32B,qkv_32B,down_8B,down_32B")
    ap.add_argument("--reps", type=int, default=3, help="A/B alternations per config")
    args = ap.parse_args()
    unknown = set(args.shapes.split(",")) - set(SHAPES)
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; pick from {sorted(SHAPES)}")
    run_shapes(args.shapes, "1", args.reps, _configs, "w12_lockstep.json")
    with open(os.path.join(os.environ.get("OUT", "."), "w12_lockstep.json")) as f:
        rows = json.load(f)
    print(f"{'shape':12} {'config':34} {'us':>7} {'vs shipped':>10}")
    for r in rows:
        if "us" in r:
            print(f"{r['shape']:12} {r['config']:34} {r['us']:7.2f} {r['vs_shipped']:10.3f}")


if __name__ == "__main__":
    main()
