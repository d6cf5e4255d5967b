"""A batch-1 W12 GEMV whose programs take their row tiles from a queue, each timed against
the shipped pick on the same weights.

    PYTHONPATH=. python3 benchmarks/w12_dynamic.py [--shapes o_32B,qkv_32B] [--reps 3]

The thirty-first W12 run (docs/BENCHMARKS.md) found the one-wave batch-1 picks losing the
spread of their programs' ends to a plain read of their bytes: programs that all start
together and do equal work end 1-2 us apart, in the order they were dispatched. Here a
persistent grid of P programs (`per_sm` an SM) does tile `pid` first, then whatever tile a
global counter hands it next (fetched one tile ahead, so its round trip rides under the
tile's loads), so programs that run ahead take more tiles and all end within about one
tile of each other. The counter is taken three ways: `static` takes tiles pid, pid + P, ...
(the same persistent loop without the queue: the control), `queue` Triton's scalar
`atomic_add` (which hands its result to the program's threads through shared memory
behind a barrier, so each tile waits for it), `asmq` lane 0's own `atom.global.add` in
inline PTX, its result shuffled to the other lanes only where it is used (one-warp
programs). The last program out resets the counter for the next launch (so it runs in
CUDA graphs), one more atomic at every program's end; `ticket` does without: lane 0's
atomic on a 64-bit counter that is never reset, the tile being P + ticket mod T (each
launch takes exactly T tickets, one a tile, and launches on a stream do not overlap; one
counter per tile count T). A tile is `bn` rows by the whole K, its
loop pipelined `stages` deep through shared memory (the shipped `PIPE` GEMV's loop);
escapes as in the shipped GEMV (table loaded before the loop, x gathered and corrected
after it). Checks and timing are `w12_ksplit.bench_shape`'s (fp32 reference, NaN-poisoned
output; CUDA graphs over weight copies rotated past the L2; configs alternated `reps`
times). Writes w12_dynamic.json under $OUT.
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

# lane 0 of a one-warp program adds 1 to the counter at $1 (other lanes' $0 undefined), in
# a 32- or 64-bit form; inline PTX, so the result is waited for where it is used, not at once
# (Triton's own scalar atomic broadcasts its result through shared memory behind a barrier)
_LANE0_ADD = """
        {{
        .reg .pred p;
        .reg .u32 lane;
        mov.u32 lane, %laneid;
        setp.eq.u32 p, lane, 0;
        mov.{w} $0, 0;
        @p atom.global.add.{w} $0, [$1], 1;
        }}
        """
LANE0_ADD32 = tl.constexpr(_LANE0_ADD.format(w="u32"))
LANE0_ADD64 = tl.constexpr(_LANE0_ADD.format(w="u64"))


@triton.jit
def _lane0_add(ptr, WIDE: tl.constexpr):
    """atom.add(ptr, 1) by lane 0: on an int32 counter, or (WIDE) an int64 one."""
    if WIDE:
        v = tl.inline_asm_elementwise(asm=LANE0_ADD64, constraints="=l,l",
                                      args=[ptr], dtype=tl.int64, is_pure=False, pack=1)
    else:
        v = tl.inline_asm_elementwise(asm=LANE0_ADD32, constraints="=r,l",
                                      args=[ptr], dtype=tl.int32, is_pure=False, pack=1)
    return v


@triton.jit
def _from_lane0(v, WIDE: tl.constexpr):
    """lane 0's value of v (int32, or int64 with WIDE), in every lane."""
    if WIDE:
        r = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 lo, hi;
            mov.b64 {lo, hi}, $1;
            shfl.sync.idx.b32 lo, lo, 0, 31, -1;
            shfl.sync.idx.b32 hi, hi, 0, 31, -1;
            mov.b64 $0, {lo, hi};
            }
            """, constraints="=l,l", args=[v], dtype=tl.int64, is_pure=False, pack=1)
    else:
        r = tl.inline_asm_elementwise(
            asm="shfl.sync.idx.b32 $0, $1, 0, 31, -1;", constraints="=r,r", args=[v],
            dtype=tl.int32, is_pure=False, pack=1)
    return r


@triton.jit
def w12_dyn_kernel(x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr,
                   y_ptr, ctr_ptr, N, K, KW, stride_a, stride_c, T, P,
                   BN: tl.constexpr, NG: tl.constexpr, GS: tl.constexpr, GW: tl.constexpr,
                   ECH: tl.constexpr, STAGES: tl.constexpr, QUEUE: tl.constexpr,
                   USE_ASM: tl.constexpr = True):
    pid = tl.program_id(0)
    SW: tl.constexpr = NG * GS
    q = tl.arange(0, NG)[None, :, None]
    g = tl.arange(0, GS)[None, None, :]
    xq = q * (8 * GW) + g
    offs_m = tl.arange(0, 1)
    m_mask = offs_m < 1
    t = pid
    while t < T:
        if QUEUE == 2:  # lane 0's own atomic, its result waited for only where used
            ticket = _lane0_add(ctr_ptr + tl.zeros((1,), tl.int32), False)
        elif QUEUE == 3:  # ... on a counter that is never reset (every launch takes T)
            ticket = _lane0_add(ctr_ptr.to(tl.pointer_type(tl.int64)) + tl.zeros((1,), tl.int32),
                                True)
        elif QUEUE:
            nxt = P + tl.atomic_add(ctr_ptr, 1)
        else:
            nxt = t + P
        n0 = t * BN
        offs_n = n0 + tl.arange(0, BN)
        rows = offs_n % N
        r3 = rows[:, None, None]
        c_off = r3 * stride_c + q * GW + g
        a_off = r3 * stride_a + q * (2 * GW) + g
        base = tl.load(base_ptr + rows).to(tl.int32)
        scale = ((base + (127 - 0x70)) << 23).to(tl.float32, bitcast=True)
        ph = (base << 23).to(tl.float32, bitcast=True)
        lo = tl.load(rowptr_ptr + n0)
        hi = tl.load(rowptr_ptr + tl.minimum(n0 + BN, N))
        er, ec, ev = _escape_table(lo, hi, erow_ptr, ecol_ptr, ebits_ptr, ECH)
        acc0 = tl.zeros((BN, NG, GS), dtype=tl.float32)
        for w in tl.range(0, KW, SW, num_stages=STAGES):
            q0 = w // GW
            wa = tl.multiple_of(w + q0 * GW, 16)
            colb = tl.multiple_of(w + 7 * q0 * GW, 16)
            cw = tl.load(c_ptr + c_off + w, eviction_policy="evict_first")
            a0 = tl.load(a_ptr + a_off + wa, eviction_policy="evict_first")
            a1 = tl.load(a_ptr + a_off + wa + GW, eviction_policy="evict_first")
            f0, f1, f2, f3, f4, f5, f6, f7 = _decode_f32(cw, a0, a1, USE_ASM)
            acc0 = _fma8(acc0, f0, f1, f2, f3, f4, f5, f6, f7, x_ptr, 0, 1, 0, colb + xq, GW,
                         K, True)
        exv = _escape_x(x_ptr, 0, offs_m, m_mask, er, ec)
        esc = _escape_terms(exv, er, ev, offs_n, ph)
        acc = _sum3(acc0)[None, :]
        _finish(acc, esc, x_ptr, 0, offs_m, m_mask, offs_n, N, scale, ph, lo, hi, erow_ptr,
                ecol_ptr, ebits_ptr, y_ptr, 0, ECH)
        if QUEUE == 2:
            nxt = P + tl.sum(_from_lane0(ticket, False), axis=0)
        elif QUEUE == 3:
            nxt = P + (tl.sum(_from_lane0(ticket, True), axis=0) % T).to(tl.int32)
        t = nxt
    if QUEUE == 1 or QUEUE == 2:  # the last program out resets the queue for the next launch
        done = tl.atomic_add(ctr_ptr + 1, 1)
        if done == P - 1:
            tl.atomic_xchg(ctr_ptr, 0)
            tl.atomic_xchg(ctr_ptr + 1, 0)


_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}


def dyn_matmul(x: torch.Tensor, w: W12Weight, y: torch.Tensor, bn: int, bk: int, warps: int,
               stages: int, per_sm: int, queue: int) -> torch.Tensor:
    """y [1, N] = x [1, K] @ w.T, tiles of bn rows from a queue (or static), K a multiple
    of bk with no padding (every preset shape)."""
    ng, gs = step_words(w.gw, bk)
    kw = w.kp // 8
    if x.shape[0] != 1 or w.kp != w.k or kw % (ng * gs) or w.n % bn:
        raise ValueError(f"dyn_matmul takes one row of x and whole steps and tiles, got "
                         f"x {tuple(x.shape)}, N={w.n}, K={w.k}, bn={bn}, bk={bk}")
    tiles = w.n // bn
    key = (x.device, tiles if queue == 3 else 0)  # QUEUE 3: one counter per tile count
    ctr = _COUNTERS.get(key)
    if ctr is None:
        ctr = _COUNTERS[key] = torch.zeros(2, dtype=torch.int64, device=x.device).view(
            torch.int32)
    sms = 2 if interpreting() else torch.cuda.get_device_properties(x.device).multi_processor_count
    p = min(tiles, sms * per_sm)
    w12_dyn_kernel[(p,)](
        x, w.a.view(torch.int32), w.codes.view(torch.int32), w.base, w.esc_rowptr, w.esc_row,
        w.esc_col, w.esc_bits, y, ctr, w.n, w.k, kw, *w.row_strides(), tiles, p, BN=bn,
        NG=ng, GS=gs, GW=w.gw, ECH=escape_chunk(1, bn), STAGES=stages, QUEUE=int(queue),
        USE_ASM=not interpreting(), num_warps=warps)
    return y


# (bn, bk, warps, stages, programs an SM)
DYN_GRID = [(2, 1024, 1, 2, 16), (2, 1024, 1, 2, 20), (2, 1024, 1, 2, 12), (1, 1024, 1, 3, 20),
            (1, 1024, 1, 3, 32), (2, 512, 1, 3, 20), (4, 1024, 1, 2, 12), (4, 1024, 2, 2, 8),
            (2, 2048, 2, 2, 12), (8, 1024, 4, 3, 4), (2, 1024, 1, 3, 12), (2, 1024, 1, 3, 16)]


def _configs(x, y, packed, ship, b: int) -> list[tuple[str, object]]:
    out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
    for bn, bk, wp, st, per in DYN_GRID:
        if (packed.kp // 8) % (bk // 8) or packed.n % bn:
            continue
        for queue in (3, 2, 1, 0) if wp == 1 else (1, 0):
            label = f"{('static', 'queue', 'asmq', 'ticket')[queue]}_n{bn}k{bk}w{wp}p{st}x{per}"
            out.append((label, lambda p, a=(bn, bk, wp, st, per, queue): dyn_matmul(
                x, p, y, *a)))
    return out


def main() -> None:
    from benchmarks.w12_bench import SHAPES

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=3, help="A/B alternations per config")
    args = ap.parse_args()
    run_shapes(args.shapes, "1", args.reps, _configs, "w12_dynamic.json")
    with open(os.path.join(os.environ.get("OUT", "."), "w12_dynamic.json")) as f:
        rows = json.load(f)
    print(f"{'shape':12} {'config':34} {'us':>7} {'vs shipped':>10}")
    for r in rows:
        if "us" in r:
            print(f"{r['shape']:12} {r['config']:34} {r['us']:7.2f} {r['vs_shipped']:10.3f}")


if __name__ == "__main__":
    main()
