"""Issue 7's W12 kernel targets, scored on one `w12_bench.py` run (its w12_bench.json).

    python3 benchmarks/w12_targets.py w12_bench.json [more.json ...]

The targets: W12 `linear` at least 1.25x faster than the best bf16 kernel (cuBLAS or our
Triton bf16 kernel, whichever is faster) on every shape at batch 1-16, at least 1.15x at
batch 32, and a geometric mean of at least 1.4x over cuBLAS at batch 1.

W12 reads 3/4 of the bf16 bytes, so no W12 kernel can be more than 4/3 faster than a bf16
kernel that streams as efficiently. Each row also says what a target asks of the kernel in
those terms: the speed the target needs, as a share of the speed of a plain read of the
W12 bytes (a 16-byte, evict-first Triton reduction over as many bytes, launch and tail
included: `stream_read.py`), next to the share the shipped pick reaches and the share the
best bf16 kernel reaches of a plain read of its own bytes. Where the first and the last
are close, the target asks the W12 kernel, which also decodes and corrects escapes, to
stream its bytes as efficiently as the best bf16 kernel streams its own.
"""

from __future__ import annotations

import json
import math
import sys

TARGET_SMALL = 1.25  # batch 1-16
TARGET_32 = 1.15
TARGET_GEOMEAN_B1 = 1.4


def target(batch: int) -> float:
    return TARGET_SMALL if batch <= 16 else TARGET_32


def score(res: dict) -> dict:
    """Per (shape, batch) row: the target, whether it is met, and what it asks (see the
    module docstring); then the counts per batch group and the batch-1 geomean."""
    reads = {s["shape"]: s for s in res["shapes"]}
    rows = []
    for r in res["rows"]:
        if r.get("vs_best_bf16") is None:
            continue
        best_bf16 = min(v for v in (r["cublas_us"], r["tbf16_us"]) if v is not None)
        t = target(r["batch"])
        need_us = best_bf16 / t
        read = reads[r["shape"]]
        rows.append({
            "shape": r["shape"], "batch": r["batch"], "target": t,
            "ratio": r["vs_best_bf16"], "met": r["vs_best_bf16"] >= t,
            "w12_us": r["w12_us"], "need_us": need_us,
            "need_read": read["read_w12_us"] / need_us,  # share of a plain read it asks for
            "at_read": read["read_w12_us"] / r["w12_us"],  # ... and the one the pick gets
            "bf16_at_read": read["read_bf16_us"] / best_bf16,  # the best bf16 kernel's own
        })
    groups = {"batch 1": [1], "batch 2-16": [2, 4, 8, 16], "batch 32": [32]}
    counts = {}
    for name, batches in groups.items():
        g = [x for x in rows if x["batch"] in batches]
        if g:
            counts[name] = {"met": sum(x["met"] for x in g), "of": len(g)}
    b1 = [r["vs_cublas"] for r in res["rows"] if r["batch"] == 1 and r.get("vs_cublas")]
    geo = math.exp(sum(map(math.log, b1)) / len(b1)) if b1 else None
    return {"rows": rows, "counts": counts, "geomean_vs_cublas_b1": geo,
            "geomean_met": geo is not None and geo >= TARGET_GEOMEAN_B1}


def print_score(sc: dict) -> None:
    print(f"{'shape':12} {'B':>3} {'target':>6} {'W12/best':>8} {'met':>3} {'W12 us':>7} "
          f"{'need us':>7} {'need %read':>10} {'at %read':>8} {'bf16 %read':>10}")
    for x in sc["rows"]:
        print(f"{x['shape']:12} {x['batch']:>3} {x['target']:6.2f} {x['ratio']:8.3f} "
              f"{'yes' if x['met'] else 'no':>3} {x['w12_us']:7.1f} {x['need_us']:7.1f} "
              f"{100 * x['need_read']:10.0f} {100 * x['at_read']:8.0f} "
              f"{100 * x['bf16_at_read']:10.0f}")
    for name, c in sc["counts"].items():
        print(f"{name}: target met on {c['met']} of {c['of']}")
    if sc["geomean_vs_cublas_b1"] is not None:
        print(f"batch-1 geomean W12 vs cuBLAS {sc['geomean_vs_cublas_b1']:.3f} "
              f"(target {TARGET_GEOMEAN_B1}): {'met' if sc['geomean_met'] else 'not met'}")


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: w12_targets.py W12_BENCH_JSON [...]", file=sys.stderr)
        return 2
    for p in paths:
        try:
            with open(p) as f:
                res = json.load(f)
            sc = score(res)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {p} is not a readable w12_bench.json ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 2
        print(f"{p}: {res.get('device')} {res.get('date')}")
        print_score(sc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
