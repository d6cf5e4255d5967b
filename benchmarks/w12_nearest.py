"""What a W12 layer of a shape the tuned table lacks loses: its default config vs the config
of the nearest tuned shape (`w12_linear.nearest_shape`, what `W12Linear` runs) vs the
shape's own tuned entry, on one GPU (run from the repo root):

    PYTHONPATH=. python3 benchmarks/w12_nearest.py [--shapes qkv_8B,o_8B,lm_head_8B,lm_head_32B]

Each shape is taken out of the shipped table (so its neighbours stand in for it, as for an
unseen model), then the three configs are timed like `w12_bench.py` times its kernels (CUDA
graph over weight copies rotated past the L2, medians, checked against the fp32
reference). Prints one line per (shape, batch) and the geomeans.
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.w12_bench import ALL_SHAPES, MODEL_SHAPES, make_problems, w12_copies
from specpilot.kernels.tuning import TunedTable, graph_timer, load_table, tune
from specpilot.kernels.w12_linear import nearest_shape
from specpilot.kernels.w12_triton import w12_default_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(MODEL_SHAPES))
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    args = ap.parse_args()
    names = args.shapes.split(",")
    if any(s not in ALL_SHAPES for s in names):
        ap.error(f"unknown shape in {args.shapes}; pick from {', '.join(ALL_SHAPES)}")
    shipped = load_table(torch.cuda.get_device_name())
    ratios = {"default/nearest": [], "nearest/tuned": []}
    for name in names:
        n, k = ALL_SHAPES[name]
        without = TunedTable(device=shipped.device, entries={
            key: v for key, v in shipped.entries.items() if f":{n}x{k}:" not in key})
        # only the W12 problem is timed: the bf16 weight is its reference, not rotated
        w, _, w12 = w12_copies(name, seed=sum(map(ord, name)))
        for b in map(int, args.batches.split(",")):
            prob = make_problems(n, k, b, [w], w12)["w12"]
            near = nearest_shape(without, n, k, b)
            cfgs = {"default": w12_default_config(n, k, b),
                    "nearest": without.lookup("w12", *near, b) if near else None,
                    "tuned": shipped.lookup("w12", n, k, b)}
            us = {}
            for tag, cfg in cfgs.items():
                if cfg is not None:
                    r = tune((n, k), b, [cfg], graph_timer, problem=prob)[0]
                    us[tag] = r.median_us if r.correct else None
            line = "  ".join(f"{t} {us[t]:.1f}" if us.get(t) else f"{t} -" for t in cfgs)
            print(f"{name:12s} b{b:<3} {line}  (nearest: {near})", flush=True)
            if us.get("default") and us.get("nearest"):
                ratios["default/nearest"].append(us["default"] / us["nearest"])
            if us.get("nearest") and us.get("tuned"):
                ratios["nearest/tuned"].append(us["nearest"] / us["tuned"])
        del w, w12
        torch.cuda.empty_cache()
    for key, xs in ratios.items():
        if xs:
            g = math.exp(sum(map(math.log, xs)) / len(xs))
            print(f"{key}: geomean {g:.3f} over {len(xs)}, min {min(xs):.3f}, max {max(xs):.3f}")


if __name__ == "__main__":
    main()
