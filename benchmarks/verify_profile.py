"""Where a verify step's extra time goes at batch 1 (run from the repo root on a GPU):

    PYTHONPATH=. python3 benchmarks/verify_profile.py [--preset 8b] [--ts 1,5,9,17] [--tune]
        [--out DIR]

The engine's own step (fused projections, fused Triton kernels, the Triton attention
kernel, Triton GEMV backend where the tuned table says it wins), batch 1, kv_len 256, for T = 1 (AR) and T = k + 1 (verify):
1. the graph-replay ms of each T and a profile of its kernels (torch.profiler over graph
   replays), summed per kind, and the kernels whose time grows most from T = 1 to the
   largest T;
2. per linear shape and row count M: cuBLAS vs the Triton kernel with the engine's config
   for M's batch bucket (what the engine runs is marked), weights rotated past the L2;
   with --tune, the Triton candidates of M's bucket are re-timed at that exact M.
Writes verify_profile.json under --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from benchmarks.fused_step import graph_ms, per_kind, profile_table, step_graph
from benchmarks.tune_gemv import copies, problems
from specpilot.kernels.gemv_bf16 import GemvLinear, apply_gemv
from specpilot.kernels.tuning import Problem, best, bucket, candidate_configs, graph_timer, tune
from specpilot.runtime.random_model import random_transformer


def timed(prob: Problem, cfg, x: torch.Tensor, out: torch.Tensor) -> float:
    """Median us per call, weights rotated."""
    ts = graph_timer(lambda: prob.call(cfg, x, out), prob.rotations)
    return sorted(ts)[len(ts) // 2]


@torch.inference_mode()
def linear_table(model, ms: list[int], tune_configs: bool) -> list[dict]:
    shapes = {}
    for m in model.modules():
        if isinstance(m, GemvLinear):
            shapes.setdefault(tuple(m.weight.shape), m)
    rows = []
    for (n, k), mod in sorted(shapes.items()):
        ws = copies(mod.weight.detach())
        for M in ms:
            probs = problems(ws, M)
            x = probs["cublas"].make_x(0)
            out = torch.empty(M, n, dtype=x.dtype, device=x.device)
            r = {"n": n, "k": k, "m": M, "bucket": bucket(M),
                 "cublas_us": timed(probs["cublas"], None, x, out)}
            cfg = mod.configs.get(bucket(M))
            r["engine"] = "triton" if cfg is not None else "cublas"
            if cfg is not None:
                r["triton_us"] = timed(probs["bf16"], cfg, x, out)
                r["triton_config"] = cfg.to_dict()
            if tune_configs and M > 1:
                b = best(tune((n, k), M, candidate_configs(bucket(M) or 32), graph_timer,
                              problem=probs["bf16"]))
                if b is not None:
                    r["tuned_us"], r["tuned_config"] = b.median_us, b.config
            rows.append(r)
            print(json.dumps(r))
        del ws
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="8b")
    ap.add_argument("--ts", default="1,5,9,17")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    os.makedirs(a.out, exist_ok=True)
    ts = [int(t) for t in a.ts.split(",")]
    model = random_transformer(a.preset, "cuda", torch.bfloat16, seed=0, fused=True)
    assert model.set_fused_kernels(True), "the fused kernels did not switch on"
    model.set_attention_kernel(True)  # the engine's default (knob attention = auto)
    report = apply_gemv(model)
    log = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "preset": a.preset,
           "gemv_layers": len(report.swapped), "steps": {}}
    profiles = {}
    for T in ts:
        replay, _, _ = step_graph(model, 1, T)
        ms = graph_ms(replay)
        rows, total = profile_table(replay)
        profiles[T] = {r["name"]: r for r in rows}
        log["steps"][T] = {"ms": ms, "kernels_us": total, "per_kind": per_kind(rows),
                           "kernels": rows[:40]}
    t_hi = ts[-1]
    base = profiles[ts[0]]
    growth = []
    for name, r in profiles[t_hi].items():
        b = base.get(name, {"us_per_step": 0.0, "per_step": 0.0})
        growth.append((r["us_per_step"] - b["us_per_step"], r["per_step"] - b["per_step"], name))
    growth.sort(reverse=True)
    log["growth"] = [{"us": g, "count": c, "name": n} for g, c, n in growth[:25]]
    log["linears"] = linear_table(model, ts, a.tune)
    with open(os.path.join(a.out, "verify_profile.json"), "w") as f:
        json.dump(log, f, indent=1)
    ar = log["steps"][ts[0]]["ms"]
    print(f"\n{log['device']}, torch {log['torch']}, {log['date']}, {a.preset} batch 1")
    print(f"{'T':>3}{'ms':>8}{'/AR':>6}  per kind us (kernels)")
    for T in ts:
        s = log["steps"][T]
        kinds = ", ".join(f"{k} {v[0]:.0f} ({v[1]:.0f})" for k, v in sorted(s["per_kind"].items()))
        print(f"{T:>3}{s['ms']:>8.3f}{s['ms'] / ar:>6.2f}  {kinds}")
    print(f"\nkernels growing most from T={ts[0]} to T={t_hi} (us/step, count)")
    for g in log["growth"][:12]:
        print(f"{g['us']:>8.1f}{g['count']:>5.0f}  {g['name'][:100]}")
    print(f"\n{'n x k':>14}{'M':>4}{'cuBLAS':>9}{'triton':>9}{'tuned':>9}  engine")
    for r in log["linears"]:
        print(f"{r['n']:>8}x{r['k']:<5}{r['m']:>4}{r['cublas_us']:>9.1f}"
              f"{r.get('triton_us', float('nan')):>9.1f}{r.get('tuned_us', float('nan')):>9.1f}"
              f"  {r['engine']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
