"""What the W12 kernels' escape correction costs, and what deferring the GEMV's first chunk
saves, on one GPU: for each shape and batch, the shipped table's W12 pick launched three ways
(two for a tensor-core pick, which has no `DEFER` bit), alternating three times in one
process:

  ship     the pick as the table has it
  flip     the same config with the `DEFER` bit flipped (the first escape chunk spread over
           the first two K steps, or done inside the first step)
  no-esc   the pick on the same weights with an empty escape table (escapes decode as their
           placeholder): the escape path's whole cost, compared against its own reference

    PYTHONPATH=. python3 benchmarks/w12_escapes.py [--shapes qkv_32B,o_32B] [--batches 1,2]

Timing as in w12_bench.py (CUDA graphs over weight copies rotated past the L2, medians);
every launch is checked against its fp32 reference, NaN-poisoned outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

import torch

from benchmarks.w12_bench import ALL_SHAPES, SHAPES, make_problems, w12_copies
from benchmarks.w12_probe import names_in
from specpilot.kernels import w12 as fmt
from specpilot.kernels.tuning import graph_timer, load_table, tune
from specpilot.kernels.w12_triton import DEFER


def no_escapes(p: fmt.W12Weight) -> fmt.W12Weight:
    """p with an empty escape table (its escapes then decode as the placeholder)."""
    none = {"esc_rowptr": torch.zeros_like(p.esc_rowptr), "esc_row": p.esc_row[:0],
            "esc_col": p.esc_col[:0], "esc_bits": p.esc_bits[:0]}
    return fmt.W12Weight(p.n, p.k, **{**p.tensors(), **none})


def alternate(probs: dict, cfgs: dict, rounds: int = 3) -> tuple[dict, dict, list]:
    """Each problem of `probs` checked and timed with its config `cfgs[key]`, the problems
    alternating `rounds` times (so drift hits them alike): (median us per key, every
    round's us per key, the keys that failed a check)."""
    times = {key: [] for key in probs}
    bad = []
    for _ in range(rounds):
        for key, prob in probs.items():
            r = tune((prob.n, prob.k), prob.batch, [cfgs[key]], graph_timer, problem=prob,
                     checks=1)[0]
            times[key].append(r.median_us)
            if not r.correct:
                bad.append(key)
    return {key: statistics.median(v) for key, v in times.items()}, times, bad


def run_shape(name: str, batch: int, table, rounds: int = 3) -> dict | None:
    w, _, rot = w12_copies(name)
    n, k = w.shape
    ship = table.lookup("w12", n, k, batch)
    if ship is None:
        return None
    empty = [no_escapes(p) for p in rot]
    probs = {"ship": make_problems(n, k, batch, [w], rot)["w12"]}
    cfgs = {"ship": ship, "no-esc": ship}
    if not ship.dot:  # the GEMV: also its DEFER bit flipped
        probs["flip"] = probs["ship"]
        cfgs["flip"] = dataclasses.replace(ship, variant=ship.variant ^ DEFER)
    probs["no-esc"] = make_problems(n, k, batch, [fmt.unpack(empty[0])], empty)["w12"]
    med, times, bad = alternate(probs, cfgs, rounds)
    return {"shape": name, "batch": batch, "ship": ship.label,
            "flip": cfgs["flip"].label if "flip" in cfgs else None, "us": med, "runs": times,
            "failed": bad}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,2")
    args = ap.parse_args()
    shapes = names_in(args.shapes, ALL_SHAPES, "shape")
    table = load_table(torch.cuda.get_device_name())
    rows = []
    print(f"{'shape':12s} {'B':>2s} {'ship':26s} {'us':>7s} {'flip us':>8s} {'flip/ship':>9s} "
          f"{'no-esc us':>9s} {'esc cost':>8s}  failed")
    for name in shapes:
        for b in (int(x) for x in args.batches.split(",")):
            r = run_shape(name, b, table)
            torch.cuda.empty_cache()
            if r is None:
                print(f"{name:12s} {b:2d} (no W12 entry in the table, skipped)")
                continue
            rows.append(r)
            us = r["us"]
            flip = (f"{us['flip']:8.2f} {us['flip'] / us['ship']:9.3f}" if "flip" in us
                    else f"{'-':>8s} {'-':>9s}")
            print(f"{name:12s} {b:2d} {r['ship']:26s} {us['ship']:7.2f} {flip} "
                  f"{us['no-esc']:9.2f} {us['ship'] / us['no-esc'] - 1:8.1%}  "
                  f"{r['failed'] or ''}", flush=True)
    flips = [r for r in rows if "flip" in r["us"]]
    if flips:
        g = math.exp(sum(math.log(r["us"]["flip"] / r["us"]["ship"]) for r in flips) / len(flips))
        print(f"flipping DEFER on the shipped picks: geomean time {g:.3f}x")


if __name__ == "__main__":
    main()
