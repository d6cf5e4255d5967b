"""What a plain read of a given number of bytes costs on this GPU: the size-dependent ceiling
for a weight-streaming kernel (launch, ramp-up and tail included), measured the way
`w12_bench.py` times its kernels (CUDA graph over copies rotated past the L2, medians).

    PYTHONPATH=. python3 benchmarks/stream_read.py --mb 63,79,105,393

The read kernel sums 16-byte vectors of an int32 buffer (each program BLOCK words a step,
STEPS steps, loads evict-first) into one int32 per program, so nothing is elided; the best
of a few (BLOCK, STEPS, warps) is reported. `w12_bench.py` reports each shape's W12 time
against it.
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch
import triton
import triton.language as tl

from specpilot.kernels.tuning import graph_timer

ROTATE_BYTES = 1.5e9
CONFIGS = ((2048, 4, 4), (4096, 2, 4), (4096, 4, 8), (8192, 2, 8))  # (BLOCK, STEPS, warps)


@triton.jit
def _read_kernel(src, out, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for s in tl.static_range(STEPS):
        offs = (pid * STEPS + s) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    tl.store(out + pid, tl.xor_sum(acc, axis=0))


def read_us(nbytes: int, reps: int = 25) -> tuple[float, str]:
    """(median microseconds of the best config, that config) for one read of nbytes."""
    n = max(1, nbytes // 4)
    copies = max(2, math.ceil(ROTATE_BYTES / (4 * n)))
    bufs = itertools.cycle([torch.ones(n, dtype=torch.int32, device="cuda")
                            for _ in range(copies)])
    best = (float("inf"), "")
    for block, steps, warps in CONFIGS:
        progs = triton.cdiv(n, block * steps)
        out = torch.empty(progs, dtype=torch.int32, device="cuda")

        def call(block=block, steps=steps, warps=warps, progs=progs, out=out):
            _read_kernel[(progs,)](next(bufs), out, n, BLOCK=block, STEPS=steps,
                                   num_warps=warps)

        ts = sorted(graph_timer(call, copies, reps))
        if ts[len(ts) // 2] < best[0]:
            best = (ts[len(ts) // 2], f"block{block}x{steps} w{warps}")
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", default="32,63,79,105,151,197,393,1024",
                    help="sizes in MB (1e6 bytes), comma-separated")
    a = ap.parse_args()
    print(f"{'MB':>7} {'us':>8} {'TB/s':>6}  config")
    for mb in (float(s) for s in a.mb.split(",")):
        us, cfg = read_us(int(mb * 1e6))
        print(f"{mb:7.1f} {us:8.2f} {mb * 1e6 / us / 1e6:6.2f}  {cfg}")


if __name__ == "__main__":
    main()
