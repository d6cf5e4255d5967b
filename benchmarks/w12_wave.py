"""Does the batch-1 W12 GEMV pay for how its programs fill the GPU? The shipped table's pick
of one shape, timed on weights of the same K and N rows around the shape's own, next to a
plain read of the same bytes: a step in the time where the programs outgrow one wave of
resident programs, a sawtooth if a part-full wave costs.

    PYTHONPATH=. python3 benchmarks/w12_wave.py [--shape qkv_32B] [--span 512] [--step 64]

Rows: N, programs (N / bn x splits), programs an SM, microseconds, microseconds per 1000
rows, the plain read's time and read / W12. Timing as in w12_bench.py (CUDA graphs over
weight copies rotated past the L2, medians); each size's output checked against the fp32
reference on a NaN-poisoned output.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics

import torch

from benchmarks.stream_read import read_us
from benchmarks.w12_bench import ALL_SHAPES, ROTATE_BYTES, llm_like
from benchmarks.w12_probe import names_in
from specpilot.kernels import w12 as fmt
from specpilot.kernels.tuning import graph_timer, load_table
from specpilot.kernels.w12_triton import launch_grid, w12_matmul


def time_rows(w: torch.Tensor, cfg) -> tuple[float, bool, int]:
    """(median us of the pick on weight w, whether its output matches the reference, the
    W12 bytes)."""
    n, k = w.shape
    p = fmt.pack(w)
    copies = [p] + [fmt.W12Weight(n, k, **{f: t.clone() for f, t in p.tensors().items()})
                    for _ in range(max(2, math.ceil(ROTATE_BYTES / p.nbytes)) - 1)]
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    y = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    w12_matmul(x, p, cfg, out=y)
    ref = x.float() @ w.float().T
    ok = bool((y.float() - ref).abs().max() / ref.abs().max() < 0.02)
    turn = itertools.cycle(copies)
    return statistics.median(graph_timer(lambda: w12_matmul(x, next(turn), cfg, out=y),
                                         len(copies))), ok, p.nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qkv_32B")
    ap.add_argument("--span", type=int, default=512, help="rows below and above the shape's N")
    ap.add_argument("--step", type=int, default=64)
    a = ap.parse_args()
    name = names_in(a.shape, ALL_SHAPES, "shape")[0]
    if a.step < 1 or a.span < 0:
        raise SystemExit(f"--step must be >= 1 and --span >= 0, got {a.step} and {a.span}")
    n0, k = ALL_SHAPES[name]
    cfg = load_table(torch.cuda.get_device_name()).lookup("w12", n0, k, 1)
    if cfg is None:
        raise SystemExit(f"{name}: the table has no batch-1 W12 pick")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    big = llm_like(n0 + a.span, k, seed=3)
    print(f"{name} (K {k}), pick {cfg.label}, {sms} SMs")
    print(f"{'N':>6s} {'progs':>6s} {'/SM':>6s} {'us':>7s} {'us/krow':>8s} {'read us':>8s} "
          f"{'read/W12':>8s} ok")
    for n in range(max(cfg.bn, n0 - a.span), n0 + a.span + 1, a.step):
        us, ok, nbytes = time_rows(big[:n].contiguous(), cfg)
        g = launch_grid(1, n, cfg)
        rd = read_us(nbytes)[0]
        print(f"{n:6d} {g[0] * g[1]:6d} {g[0] * g[1] / sms:6.2f} {us:7.2f} {1000 * us / n:8.3f} "
              f"{rd:8.2f} {rd / us:8.3f} {'yes' if ok else 'NO'}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
