"""What bounds the Gluon W12 register kernel at batch 4-32, on one GPU: the kernel with its
memory traffic taken away part by part, down to a floor with none, and the GPU's own
mma.sync rate to compare that floor with.

    PYTHONPATH=. python3 benchmarks/w12_floor.py [--shapes qkv_32B,gate_up_32B,down_8B]
        [--probes shipped,x-row,no-x,w-row,floor] [--mma]

Probes (each in a fresh process, so that a patched helper is compiled fresh):
  shipped  the kernel as the engine launches it
  x-row    x given with row stride 0 (every batch row is row 0): same loads, all L1 hits
  no-x     x slices replaced by constants in registers: no x loads at all
  w-row    the weight words given with row stride 0 (every weight row reads row 0): same
           loads and decode, the words come from L1/L2 instead of DRAM
  floor    no-x and w-row: decode and MMAs of every weight, next to no memory traffic
Configs: 8 rows of x with x slices loaded a step ahead at batch 4 and 8 (one split: the
batch 4-8 picks' form), 16 rows of x at batch 16 (1 and 3 splits), 32 rows in one program
and two 16-row programs at batch 32 (3 and 2 splits); one warp, 16 weight rows, 256-column
steps, depth 1 (the grid's Gluon configs). The stand-ins give wrong products on purpose:
only time is measured (the kernel as shipped is checked by w12_bench.py and the GPU tests).
Timing as in w12_bench.py: CUDA graphs over weight copies rotated past the L2, medians;
cuBLAS in the same process as the shipped probe. The compiled kernels' registers / spilled
bytes are printed.

--mma: mma.sync m16n8k16 (bf16 in, fp32 accumulate) issued back to back from registers, one
accumulator chain a warp, at 8 to 32 warps an SM: the tensor pipe's rate in SM cycles an MMA
at the GPU's boost clock (1.98 GHz on an H200), to compare with the floor's rate.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys

PROBES = ("shipped", "x-row", "no-x", "w-row", "floor")
# (batch, rows of x, splits, x slices loaded a step ahead): the batch 4-8 picks' form, then
# the batch 16-32 ones
CONFIGS = ((4, 8, 1, True), (8, 8, 1, True), (16, 16, 1, False), (16, 16, 3, False),
           (32, 32, 3, False), (32, 16, 2, False))
CLOCK_HZ = 1.98e9


def _patch(probe: str) -> list:
    """Replace the kernel's x slice loads by constants (no-x, floor) and launch it with the
    weight rows' stride 0 (w-row, floor); every launch's compiled kernel is kept in the list
    returned (for its registers and spills)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from specpilot.kernels import w12_gluon

    if probe in ("no-x", "floor"):
        @gluon.jit
        def const_x(x_ptr, x_off, col, jx2, K, EVEN: gl.constexpr):
            return gl.full(x_off.shape, 1.0, gl.bfloat16, x_off.type.layout)

        w12_gluon._xi = const_x
    kernel, handles = w12_gluon.w12_gluon_kernel, []
    names = list(inspect.signature(kernel.fn).parameters)
    strides = [names.index("stride_a"), names.index("stride_c")]  # launched positionally

    class Launcher:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                args = list(args)
                if probe in ("w-row", "floor"):
                    for i in strides:
                        args[i] = 0
                handles.append(kernel[grid](*args, **kw))
            return launch

    w12_gluon.w12_gluon_kernel = Launcher()
    return handles


def child(probe: str, shape: str) -> dict:
    import torch

    sys.path.insert(0, "benchmarks")
    from w12_bench import SHAPES, bf16_copies, w12_copies

    handles = _patch(probe)
    from specpilot.kernels import w12_gluon
    from specpilot.kernels.tuning import graph_timer

    n, k = SHAPES[shape]
    w, p, ws = w12_copies(shape)
    rot = len(ws)
    it = {"i": 0}

    def nxt(seq):
        it["i"] = (it["i"] + 1) % len(seq)
        return seq[it["i"]]

    out = {"probe": probe, "shape": shape, "w12_bytes": p.nbytes, "us": {}, "cublas": {},
           "regs": {}}
    for batch, bm, split, xpre in CONFIGS:
        x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
        if probe == "x-row":
            x = x[:1].expand(batch, k)  # row stride 0, unit column stride: launched as is
        y = torch.empty(batch, n, device="cuda", dtype=torch.bfloat16)
        t = graph_timer(lambda x=x, y=y, bm=bm, s=split, xp=xpre: w12_gluon.w12_gluon_matmul(
            x, nxt(ws), y, bm, 16, 256, s, 1, 1, xp), rot)
        key = f"b{batch} m{bm} s{split}"
        out["us"][key] = statistics.median(t)
        out["regs"][key] = [handles[-1].n_regs, handles[-1].n_spills]
        if probe == "shipped":
            wb = bf16_copies(w, rot)
            out["cublas"][key] = statistics.median(
                graph_timer(lambda x=x, y=y, wb=wb: torch.mm(x, nxt(wb).T, out=y), rot))
            del wb
    return out


def mma_rate() -> list[dict]:
    import torch
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    @gluon.jit
    def chain(out_ptr, ITERS: gl.constexpr, BM: gl.constexpr, WARPS: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0],
                                                      warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, 8])
        op_w: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
        op_x: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
        pid = gl.program_id(0)
        w = gl.full([16 * WARPS, 32], 1.0, gl.bfloat16, op_w) * (pid % 3).to(gl.bfloat16)
        x = gl.full([32, BM], 0.5, gl.bfloat16, op_x)
        acc = gl.zeros([16 * WARPS, BM], gl.float32, mma)
        for _ in range(ITERS):
            acc = mma_v2(w, x, acc)
        offs = gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(1, mma))
        gl.store(out_ptr + pid * 16 * WARPS + offs, gl.sum(acc, axis=1))

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    iters, rows = 4096, []
    for bm in (16, 32):
        for warps, per_sm in ((1, 8), (1, 16), (4, 2), (4, 8)):
            grid = sms * per_sm
            out = torch.empty(grid * 16 * warps, device="cuda")
            def f(grid=grid, out=out, bm=bm, warps=warps):
                chain[(grid,)](out, iters, bm, warps, num_warps=warps)

            f()
            torch.cuda.synchronize()
            us = triton.testing.do_bench(f, warmup=5, rep=50) * 1e3
            mmas = grid * warps * iters * 2 * (bm // 8)  # [16, 32] x [32, bm]: 2 k x bm/8 n
            rows.append({"bm": bm, "warps_per_sm": warps * per_sm, "us": us,
                         "tflops": mmas * 4096 / us / 1e6,
                         "sm_cycles_per_mma": us * 1e-6 * CLOCK_HZ / (mmas / sms)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qkv_32B,gate_up_32B,down_8B")
    ap.add_argument("--mma", action="store_true", help="also time the mma.sync rate")
    from benchmarks.w12_bench import SHAPES
    from benchmarks.w12_probe import names_in, parse_or_run_child, run_child

    a = parse_or_run_child(ap, PROBES, child)
    if a is None:
        return
    probes = names_in(a.probes, PROBES, "probe")
    shapes = names_in(a.shapes, SHAPES, "shape")

    rows = []
    for shape in shapes:
        for probe in probes:
            row = run_child(__file__, ["--child", probe, shape], f"{shape} {probe}")
            if row:
                rows.append(row)
    keys = [f"b{b} m{m} s{s}" for b, m, s, _ in CONFIGS]
    print(f"\n{'shape':12} {'probe':8} " + " ".join(f"{c:>12}" for c in keys) + "  registers")
    for r in rows:
        if r["probe"] == "shipped":
            print(f"{r['shape']:12} {'cuBLAS':8} "
                  + " ".join(f"{r['cublas'][c]:9.1f} us" for c in keys))
        regs = sorted({f"{a}/{b}" for a, b in r["regs"].values()})
        print(f"{r['shape']:12} {r['probe']:8} " + " ".join(f"{r['us'][c]:9.1f} us" for c in keys)
              + "  " + ", ".join(regs))
    if a.mma:
        print(f"\n{'rows':>4} {'warps/SM':>8} {'TFLOP/s':>8} {'SM cycles/MMA':>13}")
        for r in mma_rate():
            print(f"{r['bm']:4} {r['warps_per_sm']:8} {r['tflops']:8.0f} "
                  f"{r['sm_cycles_per_mma']:13.2f}")


if __name__ == "__main__":
    main()
