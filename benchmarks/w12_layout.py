"""Where a W12 weight's two planes sit in memory, and what that costs the shipped kernels,
on one GPU: for each shape and batch, the shipped table's W12 pick on the same weights
stored four ways, alternating three times in one process:

  ship      as `pack` makes them: `codes` [N, Kp / 2] and `a` [N, Kp], two dense buffers
            (row strides Kp / 2 and Kp bytes: powers of two on K = 4096 and 8192)
  pad       the same planes with rows padded (codes by 128 bytes, a by 256)
  rows      one buffer of rows [codes | a], 1.5 Kp bytes a row: a row's two planes adjacent
  rows_pad  that buffer with rows padded by 256 bytes

    PYTHONPATH=. python3 benchmarks/w12_layout.py [--shapes qkv_32B,o_32B] [--batches 1,2]

The kernels take each plane's row stride (`W12Weight.row_strides`), so every layout runs
the same code; outputs must be bit-identical to `ship`'s on the same x (checked), and every
launch is checked against its fp32 reference with a NaN-poisoned output. Timing as in
w12_bench.py (CUDA graphs over weight copies rotated past the L2, medians).
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.w12_bench import ALL_SHAPES, SHAPES, make_problems, w12_copies
from benchmarks.w12_escapes import alternate
from benchmarks.w12_probe import names_in
from specpilot.kernels import w12 as fmt
from specpilot.kernels.tuning import load_table
from specpilot.kernels.w12_triton import w12_matmul

LAYOUTS = ("ship", "pad", "rows", "rows_pad")


def relayout(p: fmt.W12Weight, kind: str) -> fmt.W12Weight:
    """p's planes copied into the layout `kind` (views of new buffers; same values)."""
    if kind == "ship":
        return p
    n, kp = p.a.shape
    half = kp // 2
    if kind == "pad":
        a = torch.zeros(n, kp + 256, dtype=torch.uint8, device=p.a.device)[:, :kp]
        codes = torch.zeros(n, half + 128, dtype=torch.uint8, device=p.a.device)[:, :half]
    elif kind in ("rows", "rows_pad"):
        buf = torch.zeros(n, half + kp + (256 if kind == "rows_pad" else 0), dtype=torch.uint8,
                          device=p.a.device)
        codes, a = buf[:, :half], buf[:, half:half + kp]
    else:
        raise ValueError(f"unknown layout {kind!r}: pick one of {', '.join(LAYOUTS)}")
    a.copy_(p.a)
    codes.copy_(p.codes)
    return fmt.W12Weight(p.n, p.k, **{**p.tensors(), "a": a, "codes": codes})


def run_shape(name: str, batch: int, table, layouts: tuple[str, ...],
              rounds: int = 3) -> dict | None:
    w, _, rot = w12_copies(name)
    n, k = w.shape
    ship = table.lookup("w12", n, k, batch)
    if ship is None:
        return None
    weights = {kind: [relayout(p, kind) for p in rot] for kind in layouts}
    probs = {kind: make_problems(n, k, batch, [w], ws)["w12"] for kind, ws in weights.items()}
    x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
    want = w12_matmul(x, weights["ship"][0], ship)
    differ = [kind for kind, ws in weights.items()
              if not torch.equal(w12_matmul(x, ws[0], ship), want)]
    med, times, bad = alternate(probs, dict.fromkeys(probs, ship), rounds)
    return {"shape": name, "batch": batch, "ship": ship.label, "us": med, "runs": times,
            "failed": bad, "differ": differ}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    args = ap.parse_args()
    shapes = names_in(args.shapes, ALL_SHAPES, "shape")
    table = load_table(torch.cuda.get_device_name())
    rows = []
    others = LAYOUTS[1:]
    print(f"{'shape':12s} {'B':>2s} {'pick':26s} {'ship us':>8s} "
          + " ".join(f"{kind + '/ship':>13s}" for kind in others) + "  failed / not identical")
    for name in shapes:
        for b in (int(x) for x in args.batches.split(",")):
            r = run_shape(name, b, table, LAYOUTS)
            torch.cuda.empty_cache()
            if r is None:
                print(f"{name:12s} {b:2d} (no W12 entry in the table, skipped)")
                continue
            rows.append(r)
            us = r["us"]
            print(f"{name:12s} {b:2d} {r['ship']:26s} {us['ship']:8.2f} "
                  + " ".join(f"{us[kind] / us['ship']:13.3f}" for kind in others)
                  + f"  {r['failed'] or ''} {r['differ'] or ''}", flush=True)
    for kind in others if rows else ():
        g = math.exp(sum(math.log(r["us"][kind] / r["us"]["ship"]) for r in rows) / len(rows))
        print(f"{kind}: geomean time {g:.3f}x ship's over {len(rows)} (shape, batch) cells")


if __name__ == "__main__":
    main()
