"""Experiment: the Gluon W12 kernel with the K range of a tile split over the warps of one
program (reduced through shared memory), against the shipped picks, batch 2-16.

    PYTHONPATH=. python3 benchmarks/w12_ksplit.py [--shapes ...] [--batches 2,4,8,16]

Why: at batch 4-8 the shipped picks of the under-filled shapes are one-warp programs of 16
weight rows: qkv 32B-class runs 640 of them (5 warps an SM, one split) at 75-78% of a plain
read where 1.25x the best bf16 kernel needs 86-87% (docs/BENCHMARKS.md, nineteenth run);
splitting K over programs (split-K) adds warps but also the partials' round trips through
global memory at the end. Here KS warps of one program each take every KS-th step of the
tile's K range (a [KS, 16, SW] word tile, warps along the first dimension), and their accumulators
are summed by the compiler through shared memory (`gl.sum` over that dimension) before the
shipped kernel's epilogue (row scale, escapes, split-K across programs). Same decode, same
step, same operand layouts; only the work split differs. Measured slower than the shipped
picks everywhere (docs/BENCHMARKS.md, nineteenth run). Every config is checked against the
fp32 reference on fresh inputs with a NaN-poisoned output before it is timed (CUDA graph,
weights rotated past the L2, as `w12_bench.py`); scratch: not in the engine's grid.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from specpilot.kernels import pdl
from specpilot.kernels.splitk import workspace
from specpilot.kernels.w12 import W12Weight
from specpilot.kernels.w12_gluon import _decode, _epilogue, _gdc, _rows


@gluon.jit
def _ks_words(c_ptr, a_ptr, c_off, a_off, w, GW: gl.constexpr):
    """Word tiles [KS, BN, SW] of the steps at w (warp s: w + its own offset, in the
    offsets; w is a multiple of GW, so a step's A0/A1 split is the offsets' too)."""
    wa = 2 * w
    return (gl.load(c_ptr + c_off + w, eviction_policy="evict_first"),
            gl.load(a_ptr + a_off + wa, eviction_policy="evict_first"),
            gl.load(a_ptr + a_off + wa + GW, eviction_policy="evict_first"))


@gluon.jit
def _ks_step(acc, wd, x_ptr, x_off, w, GW: gl.constexpr):
    """acc [KS, BN, BM] += decode(words wd) @ x^T slices of the steps at w."""
    w0, w1, w2, w3, w4, w5, w6, w7 = _decode(wd[0], wd[1], wd[2])
    c = 8 * w  # column of the round's first weight (w is a multiple of GW)
    acc = mma_v2(w0, gl.load(x_ptr + x_off + c, eviction_policy="evict_last"), acc)
    acc = mma_v2(w1, gl.load(x_ptr + x_off + (c + GW), eviction_policy="evict_last"), acc)
    acc = mma_v2(w2, gl.load(x_ptr + x_off + (c + 2 * GW), eviction_policy="evict_last"), acc)
    acc = mma_v2(w3, gl.load(x_ptr + x_off + (c + 3 * GW), eviction_policy="evict_last"), acc)
    acc = mma_v2(w4, gl.load(x_ptr + x_off + (c + 4 * GW), eviction_policy="evict_last"), acc)
    acc = mma_v2(w5, gl.load(x_ptr + x_off + (c + 5 * GW), eviction_policy="evict_last"), acc)
    acc = mma_v2(w6, gl.load(x_ptr + x_off + (c + 6 * GW), eviction_policy="evict_last"), acc)
    acc = mma_v2(w7, gl.load(x_ptr + x_off + (c + 7 * GW), eviction_policy="evict_last"), acc)
    return acc


@gluon.jit
def w12_ks_kernel(
    x_ptr, a_ptr, c_ptr, base_ptr, rowptr_ptr, erow_ptr, ecol_ptr, ebits_ptr, y_ptr, ws_ptr,
    cnt_ptr, M, N, stride_a, stride_c, stride_xm, stride_ym, K_PER, NSTEPS,
    BM: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr, GW: gl.constexpr,
    KS: gl.constexpr, SPLIT_K: gl.constexpr, ECH: gl.constexpr, PDL: gl.constexpr,
):
    """Program (tile, split): split pid_k's K_PER words of the tile in NSTEPS rounds of KS
    steps, warp s taking step s of each round (steps interleaved, so the warps of a program
    read neighbouring words together). A round is KS * SW words, a whole number of column
    groups (GW words), so each warp's offsets into the planes and x are constant tensors and
    the loop adds one scalar a round, as in the one-warp kernel (aligned shapes only)."""
    mt = (M + BM - 1) // BM
    tile = gl.program_id(0)
    pid_n = tile // mt
    pid_m = tile % mt
    pid_k = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[KS, 1, 1],
                                                  instr_shape=[1, 16, 8])
    op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    op_x: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    n0 = pid_n * BN
    # word tiles [KS, BN, SW]: element (s, n, j) is word s * SW + j of the round, row n
    sb = gl.arange(0, KS, layout=gl.SliceLayout(1, gl.SliceLayout(2, op_w))) * SW
    nb = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, op_w)))
    jb = gl.arange(0, SW, layout=gl.SliceLayout(0, gl.SliceLayout(1, op_w)))
    rows3 = gl.expand_dims(gl.expand_dims((n0 + nb) % N, 0), 2)
    j3 = gl.expand_dims(gl.expand_dims(jb, 0), 1)
    s3 = gl.expand_dims(gl.expand_dims(sb, 1), 2)
    c_off = rows3 * stride_c + j3 + s3
    a_off = rows3 * stride_a + j3 + s3 + (s3 // GW) * GW
    # x^T slices [KS, SW, BM]: x row m (rows past M read row M - 1), column (start) + j
    sx = gl.arange(0, KS, layout=gl.SliceLayout(1, gl.SliceLayout(2, op_x))) * SW
    jx = gl.arange(0, SW, layout=gl.SliceLayout(0, gl.SliceLayout(2, op_x)))
    mx = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, gl.SliceLayout(1, op_x)))
    mx = gl.minimum(mx, M - 1)
    sx3 = gl.expand_dims(gl.expand_dims(sx, 1), 2)
    x_off = gl.expand_dims(gl.expand_dims(mx, 0), 1) * stride_xm + \
        gl.expand_dims(gl.expand_dims(jx, 0), 2) + sx3 + 7 * (sx3 // GW) * GW

    R: gl.constexpr = KS * SW  # words a round
    w_lo = pid_k * K_PER
    last = w_lo + (NSTEPS - 1) * R
    b0 = _ks_words(c_ptr, a_ptr, c_off, a_off, w_lo, GW)
    b1 = _ks_words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w_lo + R, last), GW)
    if PDL:
        _gdc("griddepcontrol.wait;")
    acc = gl.zeros([KS, BN, BM], gl.float32, mma)
    for t in range(NSTEPS // 2):
        w = w_lo + 2 * t * R
        acc = _ks_step(acc, b0, x_ptr, x_off, w, GW)
        b0 = _ks_words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w + 2 * R, last), GW)
        acc = _ks_step(acc, b1, x_ptr, x_off, w + R, GW)
        b1 = _ks_words(c_ptr, a_ptr, c_off, a_off, gl.minimum(w + 3 * R, last), GW)
    if NSTEPS % 2:
        acc = _ks_step(acc, b0, x_ptr, x_off, last, GW)
    if PDL:
        _gdc("griddepcontrol.launch_dependents;")
    out = gl.sum(acc, axis=0)  # [BN, BM]: the warps' K parts
    _epilogue(out, _rows(base_ptr, rowptr_ptr, N, n0, BN, ECH, KS), 0, 0, x_ptr, erow_ptr,
              ecol_ptr, ebits_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_ym, n0,
              pid_m, pid_k, tile, BM, BN, SPLIT_K, SPLIT_K, ECH, KS, False)


def ks_constants(w: W12Weight, bm: int, ks: int, split_k: int, sw: int = 32,
                 use_pdl: bool = False) -> tuple[int, int, dict] | None:
    """(words per split, rounds of ks steps, constexprs), or None where the shape does not
    split into whole rounds of whole column groups (aligned shapes only)."""
    kw = w.kp // 8
    if w.k != w.kp or kw % (split_k * ks * sw) or (ks * sw) % w.gw or (kw // split_k) % w.gw:
        return None
    kper = kw // split_k
    return kper, kper // (ks * sw), {"BM": bm, "BN": 16, "SW": sw, "GW": w.gw, "KS": ks,
                                     "SPLIT_K": split_k, "ECH": 8, "PDL": use_pdl}


def ks_matmul(x: torch.Tensor, w: W12Weight, y: torch.Tensor, bm: int, ks: int,
              split_k: int) -> torch.Tensor:
    m, _ = x.shape
    on = pdl.active(x.device)
    kper, nsteps, consts = ks_constants(w, bm, ks, split_k, use_pdl=on)
    grid = (triton.cdiv(w.n, 16) * triton.cdiv(m, bm), split_k)
    wsp, cnt = workspace(x.device, grid[0] * grid[1] * bm * 16, grid[0])
    kw = w.kp // 8
    w12_ks_kernel[grid](
        x, w.a.view(torch.int32), w.codes.view(torch.int32), w.base, w.esc_rowptr, w.esc_row,
        w.esc_col, w.esc_bits, y, wsp, cnt, m, w.n, w.kp // 4, kw, x.stride(0), y.stride(0),
        kper, nsteps, num_warps=ks, **consts, **pdl.launch(on))
    return y


def _configs(x, y, packed, ship, b: int) -> list[tuple[str, object]]:
    """(label, call on a W12 weight) of the shipped pick and of every split this shape takes."""
    from specpilot.kernels.w12_triton import w12_matmul

    out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
    for bm in (8, 16) if b <= 8 else (16,):
        for ks in (2, 4, 8):
            for s in (1, 2, 3):
                if ks_constants(packed, bm, ks, s):
                    out.append((f"ks{ks}_m{bm}_s{s}",
                                lambda p, bm=bm, ks=ks, s=s: ks_matmul(x, p, y, bm, ks, s)))
    return out


def bench_shape(name: str, batches: list[int], reps: int, table, configs=None,
                timing_only: tuple[str, ...] = (), escape_free: bool = False) -> list[dict]:
    """Every config of `configs` (default `_configs`: (label, call on a W12 weight) pairs,
    the shipped pick first) checked, then timed alternating `reps` times (so drift hits every
    config alike); rows sorted fastest first per batch. Configs whose label's first word is
    in `timing_only` compute wrong products on purpose: they are only checked to write every
    element. With `escape_free`, every config runs on the same weights with an empty escape
    table (`w12_escapes.no_escapes`: the escapes decode as their placeholder), checked
    against that weight."""
    from benchmarks.w12_bench import w12_copies
    from specpilot.kernels.tuning import graph_timer

    w, packed, copies = w12_copies(name, seed=sum(map(ord, name)))
    if escape_free:
        from benchmarks.w12_escapes import no_escapes
        from specpilot.kernels.w12 import unpack

        packed, copies = no_escapes(packed), [no_escapes(c) for c in copies]
        w = unpack(packed)
    ref_w = w.float()
    it = {"i": 0}

    def rot() -> W12Weight:
        it["i"] = (it["i"] + 1) % len(copies)
        return copies[it["i"]]

    rows = []
    for b in batches:
        g = torch.Generator(device="cuda").manual_seed(7 + b)
        x = torch.randn(b, w.shape[1], device="cuda", generator=g).to(torch.bfloat16)
        y = torch.empty(b, w.shape[0], device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ ref_w.T
        cands = (configs or _configs)(x, y, packed, table.lookup("w12", *w.shape, b), b)
        times, errs = {}, {}
        for label, fn in cands:
            y.fill_(float("nan"))
            fn(packed)
            err = errs[label] = float((y.float() - ref).norm() / ref.norm())
            if err < 1e-2:  # NaN (an unwritten element) fails too
                times[label] = []
            elif label.split()[0] in timing_only and bool(torch.isfinite(y).all()):
                times[label] = []
                print(f"{name} b{b} {label}: timing only (rel error {err:.3g})", flush=True)
            else:
                rows.append({"shape": name, "batch": b, "config": label, "rel_error": err})
                print(f"{name} b{b} {label}: WRONG rel error {err:.3g}", flush=True)
        for _ in range(reps):
            for label, fn in cands:
                if label in times:
                    times[label].append(sorted(graph_timer(lambda f=fn: f(rot()),
                                                           len(copies)))[12])
        base = min(times[cands[0][0]])
        for label, ts in sorted(times.items(), key=lambda kv: min(kv[1])):
            rows.append({"shape": name, "batch": b, "config": label, "us": min(ts),
                         "all_us": ts, "vs_shipped": base / min(ts), "rel_error": errs[label],
                         "timing_only": errs[label] >= 1e-2})
        best = min(times, key=lambda k: min(times[k]))
        print(f"{name:12} b{b:<2} shipped {base:7.2f} us | best {best:16} "
              f"{min(times[best]):7.2f} us ({base / min(times[best]):.3f}x)", flush=True)
    return rows


def run_shapes(shapes: str, batches: str, reps: int, configs, out_name: str,
               timing_only: tuple[str, ...] = (), escape_free: bool = False) -> None:
    """`bench_shape` with `configs` (`timing_only`, `escape_free`) on each of the
    comma-separated shapes and batches, the shipped table's picks first; all rows to $OUT/out_name."""
    from specpilot.kernels.tuning import load_table

    table = load_table(torch.cuda.get_device_name())
    rows = []
    for name in shapes.split(","):
        rows += bench_shape(name, [int(b) for b in batches.split(",")], reps, table, configs,
                            timing_only, escape_free)
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), out_name), "w") as f:
        json.dump(rows, f, indent=1)


def main() -> None:
    from benchmarks.w12_bench import SHAPES

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="2,4,8,16")
    ap.add_argument("--reps", type=int, default=3, help="A/B alternations per config")
    args = ap.parse_args()
    run_shapes(args.shapes, args.batches, args.reps, _configs, "w12_ksplit.json")


if __name__ == "__main__":
    main()
