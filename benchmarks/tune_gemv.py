"""Tune the Triton bf16 GEMV/GEMM against cuBLAS on a random preset's linear shapes (GPU):

    PYTHONPATH=. python3 benchmarks/tune_gemv.py [--presets 8b,32b] [--buckets 1,2,4,8,16,32]
        [--missing] [--out DIR]

For every linear shape of each preset (qkv, o, gate_up, down, LM head) and batch bucket,
times cuBLAS and every Triton candidate of the bucket (`kernels.tuning.candidate_configs`;
each checked against an fp32 reference on fresh inputs) at M = the bucket's size, weights
rotated past the L2. The engine's GEMV backend (`gemv = auto`) reads the result: a bucket
runs Triton only where it beat cuBLAS on that shape. With --missing, only (shape, bucket)
pairs the shipped table lacks are tuned. Writes <device>.json (the shipped table with the
new entries merged, the faster of old and new kept) and tune_gemv.json (every record)
under --out (default $OUT or .); copy the former to specpilot/kernels/tuned/ to ship it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from specpilot.kernels.gemv_bf16 import bf16_matmul
from specpilot.kernels.tuning import (
    SHIPPED,
    Problem,
    TunedTable,
    best,
    candidate_configs,
    device_slug,
    graph_timer,
    tune,
)
from specpilot.runtime.random_model import preset_config

L2_BYTES = 50 * 2**20


def linear_shapes(preset: str) -> list[tuple[int, int]]:
    """(N, K) of the fused qkv, o, gate_up, down and LM head of a preset."""
    c = preset_config(preset)
    hd = c.head_dim
    return [((c.num_heads + 2 * c.num_kv_heads) * hd, c.hidden_size),
            (c.hidden_size, c.num_heads * hd), (2 * c.intermediate_size, c.hidden_size),
            (c.hidden_size, c.intermediate_size), (c.vocab_size, c.hidden_size)]


def problems(ws: list[torch.Tensor], M: int) -> dict[str, Problem]:
    """cuBLAS and Triton bf16 problems of y = x @ w.T, cycling through the weight copies."""
    n, k = ws[0].shape
    turn = {"i": 0}

    def nxt():
        turn["i"] = (turn["i"] + 1) % len(ws)
        return ws[turn["i"]]

    def make_x(seed: int) -> torch.Tensor:
        g = torch.Generator(device=ws[0].device).manual_seed(1000 + seed)
        return torch.randn(M, k, device=ws[0].device, generator=g).to(torch.bfloat16)

    ref_w = ws[0].float()

    def ref(x: torch.Tensor) -> torch.Tensor:
        return x.float() @ ref_w.T

    nbytes = n * k * 2 + M * (n + k) * 2
    return {"cublas": Problem("cublas", n, k, M, nbytes, len(ws), make_x,
                              lambda c, x, o: torch.mm(x, nxt().T, out=o), ref,
                              first=lambda c, x, o: torch.mm(x, ws[0].T, out=o)),
            "bf16": Problem("bf16", n, k, M, nbytes, len(ws), make_x,
                            lambda c, x, o: bf16_matmul(x, nxt(), c, out=o), ref,
                            first=lambda c, x, o: bf16_matmul(x, ws[0], c, out=o))}


def copies(w: torch.Tensor) -> list[torch.Tensor]:
    """`w` and enough copies of it to stream past the L2 when cycled (at least 2 in all)."""
    return [w] + [w.clone() for _ in range(max(2, -(-4 * L2_BYTES // (w.numel() * 2))) - 1)]


def rotated(n: int, k: int, seed: int) -> list[torch.Tensor]:
    """`copies` of an N(0, 0.02) bf16 [n, k] weight."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return copies((torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="8b,32b")
    ap.add_argument("--buckets", default="1,2,4,8,16,32")
    ap.add_argument("--missing", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    os.makedirs(a.out, exist_ok=True)
    dev = torch.cuda.get_device_name()
    path = SHIPPED / f"{device_slug(dev)}.json"
    shipped = TunedTable.load(path) if path.is_file() else TunedTable(device=dev)
    table = TunedTable(device=shipped.device, entries=dict(shipped.entries))
    buckets = [int(b) for b in a.buckets.split(",")]
    records, rows = [], []
    for preset in a.presets.split(","):
        for i, (n, k) in enumerate(linear_shapes(preset)):
            todo = [b for b in buckets if not a.missing
                    or shipped.median_us("bf16", n, k, b) is None
                    or shipped.median_us("cublas", n, k, b) is None]
            if not todo:
                continue
            ws = rotated(n, k, seed=i)
            for b in todo:
                probs = problems(ws, b)
                cub = best(tune((n, k), b, [candidate_configs(b)[0]], graph_timer,
                                problem=probs["cublas"]))
                recs = tune((n, k), b, candidate_configs(b), graph_timer, problem=probs["bf16"])
                tri = best(recs)
                for r in [cub, *recs]:
                    if r is not None:
                        records.append(r.to_dict())
                        table.add(r)
                row = {"preset": preset, "n": n, "k": k, "bucket": b,
                       "cublas_us": cub.median_us if cub else None,
                       "triton_us": tri.median_us if tri else None,
                       "triton_config": tri.config if tri else None,
                       "failed_configs": sum(not r.correct for r in recs)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            del ws
            torch.cuda.empty_cache()
    path = table.save(os.path.join(a.out, f"{device_slug(dev)}.json"))
    with open(os.path.join(a.out, "tune_gemv.json"), "w") as f:
        json.dump({"device": dev, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "rows": rows, "records": records}, f, indent=1)
    print(f"\n{dev}, {time.strftime('%Y-%m-%d')}; merged table: {path}")
    print(f"{'preset':>6}{'n x k':>14}{'M':>4}{'cuBLAS us':>10}{'triton us':>10}{'gain':>6}")
    for r in rows:
        g = (r["cublas_us"] / r["triton_us"]) if r["cublas_us"] and r["triton_us"] else 0
        print(f"{r['preset']:>6}{r['n']:>8}x{r['k']:<5}{r['bucket']:>4}{r['cublas_us'] or 0:>10.1f}"
              f"{r['triton_us'] or 0:>10.1f}{g:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
