"""What bounds the W12 GEMV at batch 1 on the shapes where it stays short of its plain read:
the shipped table's pick with its instruction work taken away part by part, each probe in a
fresh process, next to a plain read of the same bytes and the best bf16 kernel.

    PYTHONPATH=. python3 benchmarks/w12_gemv_floor.py [--shapes o_32B,qkv_8B]
        [--probes shipped,no-decode,no-x,bare]

Probes:
  shipped    the pick as the engine launches it
  no-decode  the 8 weights of a word are the three loaded words reinterpreted (no byte
             permutes or masks): the same loads and FMAs, next to no decode
  no-x       x values are constants: no x loads or bf16 -> fp32 conversions
  bare       both: weight loads and FMAs only
The stand-ins give wrong products on purpose; only time is measured (the kernel as shipped
is checked by w12_bench.py and the GPU tests). Timing as in w12_bench.py: CUDA graphs over
weight copies rotated past the L2, medians. If `bare` lands on the plain read, the gap of the
shipped pick is its instructions; if not, it is the loop's latency structure.
"""

from __future__ import annotations

import argparse
import statistics

PROBES = ("shipped", "no-decode", "no-x", "bare")


def _patch(probe: str) -> None:
    import triton
    import triton.language as tl

    from specpilot.kernels import w12_triton

    if probe in ("no-decode", "bare"):
        @triton.jit
        def words_as_weights(c, a0, a1, USE_ASM: tl.constexpr):
            f = c.to(tl.float32, bitcast=True)
            g = a0.to(tl.float32, bitcast=True)
            h = a1.to(tl.float32, bitcast=True)
            return f, g, h, f, g, h, f, g

        w12_triton._decode_f32 = words_as_weights
    if probe in ("no-x", "bare"):
        @triton.jit
        def const_x(xp, m, M, cols, K, EVEN: tl.constexpr):
            return tl.full(cols.shape, 1.0, tl.float32)

        w12_triton._xload = const_x


def child(probe: str, shape: str) -> dict:
    import torch

    from benchmarks.stream_read import read_us
    from benchmarks.w12_bench import ALL_SHAPES, bf16_copies, w12_copies

    _patch(probe)
    from specpilot.kernels.gemv_bf16 import bf16_matmul
    from specpilot.kernels.tuning import graph_timer, load_table
    from specpilot.kernels.w12_triton import w12_matmul

    n, k = ALL_SHAPES[shape]
    table = load_table(torch.cuda.get_device_name())
    cfg = table.lookup("w12", n, k, 1)
    if cfg is None or cfg.dot:
        raise SystemExit(f"{shape}: the table's batch-1 W12 pick is not a GEMV")
    w, p, ws = w12_copies(shape)
    it = {"i": 0}

    def nxt(seq):
        it["i"] = (it["i"] + 1) % len(seq)
        return seq[it["i"]]

    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    us = statistics.median(graph_timer(lambda: w12_matmul(x, nxt(ws), cfg, out=y), len(ws)))
    out = {"probe": probe, "shape": shape, "config": cfg.label, "us": us}
    if probe == "shipped":
        out["read_us"] = read_us(p.nbytes)[0]
        bcfg = table.lookup("bf16", n, k, 1)
        if bcfg is not None:
            wb = bf16_copies(w, len(ws))
            out["bf16_us"] = statistics.median(graph_timer(
                lambda: bf16_matmul(x, nxt(wb), bcfg, out=y), len(wb)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qkv_32B,o_32B,down_32B,down_8B,qkv_8B,o_8B")
    from benchmarks.w12_bench import ALL_SHAPES
    from benchmarks.w12_probe import names_in, parse_or_run_child, run_child

    a = parse_or_run_child(ap, PROBES, child)
    if a is None:
        return
    probes = names_in(a.probes, PROBES, "probe")
    shapes = names_in(a.shapes, ALL_SHAPES, "shape")

    rows = {}
    for shape in shapes:
        for probe in probes:
            row = run_child(__file__, ["--child", probe, shape], f"{shape} {probe}")
            if row:
                rows[(shape, probe)] = row
    print(f"\n{'shape':12} {'pick':26} {'read us':>8} {'bf16 us':>8} "
          + " ".join(f"{p:>10}" for p in probes))
    for shape in shapes:
        ship = rows.get((shape, "shipped"), {})
        cells = [f"{rows[(shape, p)]['us']:10.2f}" if (shape, p) in rows else f"{'-':>10}"
                 for p in probes]
        print(f"{shape:12} {ship.get('config', '-'):26} {ship.get('read_us', 0):8.2f} "
              f"{ship.get('bf16_us', 0):8.2f} " + " ".join(cells))


if __name__ == "__main__":
    main()
