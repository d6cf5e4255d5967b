"""Does the tensor-core picks' access pattern, not their math, cap their streaming at batch 4-8?
The Gluon register kernel's word loads alone (same one-warp programs of 16 weight rows, same
operand layout and 16-byte vectors, same step and prefetch), with no decode, x or MMA,
against a plain read of the same bytes: in the planes' row-major layout (each step reads
16 rows x 3 planes of SW-word runs, 48 runs of 128 bytes at SW = 32), and in a tiled layout
where each step's words of a plane are one contiguous block (what a tiled W12 layout would
give the kernel).

    PYTHONPATH=. python3 benchmarks/w12_pattern.py [--shapes qkv_32B,o_32B,down_8B]

Background (docs/BENCHMARKS.md, twentieth W12 run): at batch 4-8 the shipped picks are 4-12
points of a plain read short of their targets on qkv 32B-class, and the probes of
`w12_floor.py` show the words' DRAM traffic costs most (words from cache: 0.70x the time),
not x (x loads all L1 hits: 0.98x). Measured: the pattern alone streams at 94-95% of a plain
read there, in either layout; it is not the access pattern. The last rows read the same
words through `w12_inflight.py`'s per-thread cp.async ring (78-89%). Timing as in
w12_bench.py (CUDA graphs over weight copies rotated past the L2, medians); the tiled reads
address the same buffers in tile order (the values are not decoded, so their order does not
matter). Rows also go to w12_pattern.json under $OUT (default: the current directory).
Scratch: nothing here is in the engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from benchmarks.stream_read import read_us
from benchmarks.w12_bench import SHAPES, w12_copies
from benchmarks.w12_inflight import _ring_copy
from benchmarks.w12_probe import names_in
from specpilot.kernels.tuning import graph_timer


@gluon.jit
def _words(c_ptr, a_ptr, rr, jj, w, KW, t, BN: gl.constexpr, SW: gl.constexpr,
           GW: gl.constexpr, TILED: gl.constexpr):
    """The three word tiles [BN, SW] of the step at word w of tile t."""
    if TILED:  # step s's codes: one [BN, SW] block, its A words one [BN, 2 SW] block
        s = w // SW
        cw = gl.load(c_ptr + t * BN * KW + s * BN * SW + rr * SW + jj,
                     eviction_policy="evict_first")
        ab = a_ptr + t * BN * 2 * KW + s * BN * 2 * SW + rr * 2 * SW + jj
        return cw, gl.load(ab, eviction_policy="evict_first"), \
            gl.load(ab + SW, eviction_policy="evict_first")
    wa = w + (w // GW) * GW
    row = t * BN + rr
    cw = gl.load(c_ptr + row * KW + w + jj, eviction_policy="evict_first")
    ab = a_ptr + row * 2 * KW + wa + jj
    return cw, gl.load(ab, eviction_policy="evict_first"), \
        gl.load(ab + GW, eviction_policy="evict_first")


@gluon.jit
def pattern_kernel(c_ptr, a_ptr, out_ptr, KW, BN: gl.constexpr, SW: gl.constexpr,
                   GW: gl.constexpr, TILED: gl.constexpr, DEPTH: gl.constexpr):
    """Program t reads the words of weight rows [16 t, 16 t + 16), step by step with DEPTH
    steps prefetched as the shipped kernel does, and stores their xor."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1],
                                                  instr_shape=[16, 8])
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    t = gl.program_id(0)
    rr = gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(1, op_w)), 1)
    jj = gl.expand_dims(gl.arange(0, SW, layout=gl.SliceLayout(0, op_w)), 0)
    acc = gl.zeros([BN, SW], gl.int32, op_w)
    last = KW - SW
    b0 = _words(c_ptr, a_ptr, rr, jj, 0, KW, t, BN, SW, GW, TILED)
    b1 = _words(c_ptr, a_ptr, rr, jj, gl.minimum(SW, last), KW, t, BN, SW, GW, TILED)
    if DEPTH > 1:
        b2 = _words(c_ptr, a_ptr, rr, jj, gl.minimum(2 * SW, last), KW, t, BN, SW, GW, TILED)
    U: gl.constexpr = DEPTH + 1
    w_full = (KW // (U * SW)) * (U * SW)
    for w in range(0, w_full, U * SW):
        acc ^= b0[0] ^ b0[1] ^ b0[2]
        b0 = _words(c_ptr, a_ptr, rr, jj, gl.minimum(w + U * SW, last), KW, t, BN, SW, GW,
                    TILED)
        acc ^= b1[0] ^ b1[1] ^ b1[2]
        b1 = _words(c_ptr, a_ptr, rr, jj, gl.minimum(w + (U + 1) * SW, last), KW, t, BN, SW,
                    GW, TILED)
        if DEPTH > 1:
            acc ^= b2[0] ^ b2[1] ^ b2[2]
            b2 = _words(c_ptr, a_ptr, rr, jj, gl.minimum(w + (U + 2) * SW, last), KW, t, BN,
                        SW, GW, TILED)
    if w_full < KW:  # the last KW / SW % U steps sit in buffers 0 and 1
        acc ^= b0[0] ^ b0[1] ^ b0[2]
    if w_full + SW < KW:
        acc ^= b1[0] ^ b1[1] ^ b1[2]
    gl.store(out_ptr + t, gl.sum(gl.sum(acc, axis=1), axis=0))


@gluon.jit
def pattern_ring_kernel(c_ptr, a_ptr, out_ptr, KW, BN: gl.constexpr, SW: gl.constexpr,
                        GW: gl.constexpr, STAGES: gl.constexpr):
    """The row-major pattern read through `w12_inflight.py`'s per-thread cp.async ring (STAGES
    steps, STAGES - 1 ahead), each step read back from shared memory before its xor."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1],
                                                  instr_shape=[16, 8])
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    sl: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
    t = gl.program_id(0)
    rr = gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(1, op_w)), 1)
    jj = gl.expand_dims(gl.arange(0, SW, layout=gl.SliceLayout(0, op_w)), 0)
    c_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], sl)
    a0_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], sl)
    a1_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, SW], sl)
    c_off = (t * BN + rr) * KW + jj
    a_off = (t * BN + rr) * 2 * KW + jj
    last = KW - SW
    for i in gl.static_range(STAGES - 1):
        _ring_copy(c_s.index(i), a0_s.index(i), a1_s.index(i), c_ptr, a_ptr, c_off, a_off,
                   gl.minimum(i * SW, last), GW)
    acc = gl.zeros([BN, SW], gl.int32, op_w)
    for s in range(KW // SW):
        async_copy.wait_group(STAGES - 2)
        st = s % STAGES
        v = c_s.index(st).load(op_w) ^ a0_s.index(st).load(op_w) ^ a1_s.index(st).load(op_w)
        nx = (s + STAGES - 1) % STAGES
        _ring_copy(c_s.index(nx), a0_s.index(nx), a1_s.index(nx), c_ptr, a_ptr, c_off, a_off,
                   gl.minimum((s + STAGES - 1) * SW, last), GW)
        acc ^= v
    async_copy.wait_group(0)
    gl.store(out_ptr + t, gl.sum(gl.sum(acc, axis=1), axis=0))


def bench(name: str) -> list[dict]:
    """Each (layout, step, depth) of the pattern on one shape, with its plain read."""
    _, packed, copies = w12_copies(name)
    n, kw = packed.n, packed.kp // 8
    plain, _ = read_us(packed.nbytes)
    out = torch.empty(n // 16, dtype=torch.int32, device="cuda")
    it = {"i": 0}
    rows = []
    for tiled, sw, depth in ((False, 32, 1), (False, 32, 2), (False, 64, 1), (True, 32, 1),
                             (True, 32, 2), (True, 64, 1)):
        def call(tiled=tiled, sw=sw, depth=depth):
            it["i"] = (it["i"] + 1) % len(copies)
            p = copies[it["i"]]
            pattern_kernel[(n // 16,)](p.codes.view(torch.int32), p.a.view(torch.int32), out,
                                       kw, BN=16, SW=sw, GW=p.gw, TILED=tiled, DEPTH=depth,
                                       num_warps=1)

        rows.append(_row(name, "tiled" if tiled else "row-major", sw, depth, call, len(copies),
                         plain))
    for stages in (3, 4, 6):
        def call(stages=stages):
            it["i"] = (it["i"] + 1) % len(copies)
            p = copies[it["i"]]
            pattern_ring_kernel[(n // 16,)](p.codes.view(torch.int32), p.a.view(torch.int32),
                                            out, kw, BN=16, SW=32, GW=p.gw, STAGES=stages,
                                            num_warps=1)

        rows.append(_row(name, "cp.async ring", 32, stages - 1, call, len(copies), plain))
    return rows


def _row(name, layout, sw, depth, call, rotations, plain) -> dict:
    us = statistics.median(graph_timer(call, rotations))
    print(f"{name:12} {layout:13} SW {sw:2} depth {depth}: {us:7.2f} us, plain read "
          f"{plain:6.2f} us ({plain / us:.0%})", flush=True)
    return {"shape": name, "layout": layout, "sw": sw, "depth": depth, "us": us,
            "plain_us": plain, "of_plain": plain / us}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qkv_32B,o_32B,down_8B")
    a = ap.parse_args()
    rows = []
    for name in names_in(a.shapes, SHAPES, "shape"):
        rows += bench(name)
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "w12_pattern.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
