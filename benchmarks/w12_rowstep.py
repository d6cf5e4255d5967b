"""Batch-1 W12 GEMV configs whose programs hold a whole row (or half of one) in flight at
once: K steps of 2048-8192 columns over 1-4 weight rows, 1-8 warps, so that a shape runs
as many short programs in several waves (as the plain read does) instead of one wave of
long ones, each timed against the shipped pick on the same weights.

    PYTHONPATH=. python3 benchmarks/w12_rowstep.py [--shapes qkv_32B,o_32B] [--reps 3]

The thirty-first W12 run (docs/BENCHMARKS.md) found the one-wave batch-1 picks losing the
spread of their programs' ends (1-2 us, 8-13% of a call) to a plain read of their bytes,
which ends balanced because the hardware hands its many short programs to SMs as others
finish. The engine's grid and the explore grid step K by at most 2048 columns. Checks and
timing are `w12_ksplit.bench_shape`'s (fp32 reference, NaN-poisoned output; CUDA graphs
over weight copies rotated past the L2; configs alternated `reps` times). Writes
w12_rowstep.json under $OUT.
"""

from __future__ import annotations

import argparse

from benchmarks.w12_ksplit import run_shapes
from specpilot.kernels.w12_triton import DEFER, KernelConfig, w12_matmul

# (bn, bk, warps): int32 words a thread loads a step = 3 * bn * bk / (8 * 32 * warps)
ROWSTEP_GRID = [(1, 2048, 1), (1, 4096, 2), (1, 4096, 4), (1, 8192, 4), (1, 8192, 8),
                (2, 2048, 2), (2, 4096, 4), (2, 4096, 8), (2, 8192, 8), (4, 2048, 4),
                (4, 4096, 8)]


def rowstep_configs(b: int) -> list[KernelConfig]:
    """The grid above, each with its first escape chunk in the first step and deferred."""
    return [KernelConfig(bm=b, bn=bn, bk=bk, warps=w, variant=v)
            for bn, bk, w in ROWSTEP_GRID for v in (1, 1 | DEFER)]


def _configs(x, y, packed, ship, b: int) -> list[tuple[str, object]]:
    out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
    for cfg in rowstep_configs(b):
        if cfg.bk < 2 * packed.kp:  # more than half of a step real columns
            out.append((cfg.label, lambda p, c=cfg: w12_matmul(x, p, c, out=y)))
    return out


def main() -> None:
    from benchmarks.w12_bench import SHAPES

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1")
    ap.add_argument("--reps", type=int, default=3, help="A/B alternations per config")
    args = ap.parse_args()
    run_shapes(args.shapes, args.batches, args.reps, _configs, "w12_rowstep.json")


if __name__ == "__main__":
    main()
