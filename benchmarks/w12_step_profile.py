"""Where a W12 decode step's time goes on the GPU, kernel by kernel (run from the repo root):

    PYTHONPATH=. python3 benchmarks/w12_step_profile.py [--preset 8b] [--batches 16,32]
        [--table FILE] [--release on,off] [--out DIR]

The engine's step (random Qwen3, every eligible linear in W12 form with the device's kernel
table or --table, fused projections, the fused Triton norm/RoPE+cache/silu kernels and the
Triton attention kernel; T = 1, kv_len 256), one CUDA graph per batch size, PDL setting
and (--release) whether the wgmma W12 kernel releases the next kernel after its loop. For
each: the graph-replay ms, and a profile of its replays (torch.profiler) laid out on the
GPU's timeline: each kernel is charged its *share*, the time from where the kernel before
it ended (or its own start, if later) to its own end, so that overlapping launches (PDL)
are not counted twice and the shares plus the idle gaps between kernels add up to the
step. Shares are summed per group (the W12 linears, the x^T kernels ahead of the wgmma W12
kernel, attention, the rest) and per W12 shape (its x^T kernels included), and each
shape's share is set against the same calls timed alone in this run (the engine's config
on copies of the layer's own weights rotated past the L2, same PDL setting): what a linear
costs inside the step against what it costs by itself. Writes w12_step_profile.json under
--out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch

from benchmarks.fused_step import cuda_events, graph_ms, kind, step_graph
from specpilot.kernels import pdl, w12_wgmma
from specpilot.kernels.tuning import TunedTable, bucket, graph_timer, load_table
from specpilot.kernels.w12 import W12Weight
from specpilot.kernels.w12_linear import W12Linear, apply_w12
from specpilot.kernels.w12_triton import w12_matmul
from specpilot.runtime.random_model import random_transformer

ROTATE_BYTES = 1_500_000_000


def group(name: str) -> str:
    n = name.lower()
    if "transpose" in n:
        return "x^T"
    if "w12" in n:
        return "w12"
    return kind(name)


def linear_order(model, B: int) -> list[tuple[int, int]]:
    """The (N, K) of each W12 linear in the order one eager decode step calls them."""
    _, _, fn = step_graph(model, B)
    order: list[tuple[int, int]] = []
    hooks = [m.register_forward_pre_hook(lambda m, a: order.append((m.out_features,
                                                                     m.in_features)))
             for m in model.modules() if isinstance(m, W12Linear)]
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    return order


def alone_us(mod: W12Linear, B: int, on: bool) -> float:
    """Median us of the layer's engine config timed alone (PDL `on`, as in the step) on
    copies of its own W12 weights rotated past the L2, random x of B rows."""
    w = mod.w12
    copies = max(2, -(-ROTATE_BYTES // w.nbytes))
    ws = [W12Weight(w.n, w.k, **{f: t.clone() for f, t in w.tensors().items()})
          for _ in range(copies)]
    x = torch.randn(B, w.k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(B, w.n, device="cuda", dtype=torch.bfloat16)
    cfg, nxt = mod._config(bucket(B)), itertools.cycle(ws)
    with pdl.scope(on):
        ts = sorted(graph_timer(lambda: w12_matmul(x, next(nxt), cfg, out=y), copies))
    return ts[len(ts) // 2]


def timeline(replay, steps: int) -> list[list[dict]]:
    """Per replay, its kernels in start order: {name, start, end} in us."""
    evs = sorted((e.time_range.start, e.time_range.end, e.name)
                 for e in cuda_events(replay, steps, sync_each=True))
    return split_replays(evs, steps)


def split_replays(evs: list[tuple[float, float, str]], steps: int) -> list[list[dict]]:
    """(start, end, name) events of `steps` replays, in start order, cut into the replays:
    each ended in a host sync, so the cuts are the steps - 1 longest idle gaps."""
    if not evs:
        return []
    gaps = sorted(range(1, len(evs)), key=lambda i: evs[i][0] - evs[i - 1][1], reverse=True)
    cuts = sorted(gaps[:steps - 1])
    out, lo = [], 0
    for c in cuts + [len(evs)]:
        out.append([{"name": n, "start": s, "end": e} for s, e, n in evs[lo:c]])
        lo = c
    return out


def shares(step: list[dict]) -> tuple[list[float], float]:
    """Each kernel's share of the step and the idle time between kernels (us)."""
    out, idle, last = [], 0.0, step[0]["start"]
    for k in step:
        idle += max(0.0, k["start"] - last)
        out.append(max(0.0, k["end"] - max(k["start"], last)))
        last = max(last, k["end"])
    return out, idle


def summarize(steps: list[list[dict]], order: list[tuple[int, int]]) -> dict:
    """Median over replays of each group's and each W12 shape's summed share."""
    per: dict[str, list[float]] = {}
    counts: dict[str, int] = {}  # kernels over all replays
    matched = 0
    for step in steps:
        sh, idle = shares(step)
        tot: dict[str, float] = {"idle": idle, "span": step[-1]["end"] - step[0]["start"]}
        w12 = [i for i, k in enumerate(step) if group(k["name"]) == "w12"]
        shape_of = dict(zip(w12, order)) if len(w12) == len(order) else {}
        matched += bool(shape_of)
        pending = 0.0  # an x^T kernel's share, charged to the W12 linear that follows it
        for i, (k, s) in enumerate(zip(step, sh)):
            g = group(k["name"])
            tot[g] = tot.get(g, 0.0) + s
            counts[g] = counts.get(g, 0) + 1
            if g == "x^T":
                pending += s
            if i in shape_of:
                n, kk = shape_of[i]
                key = f"w12 {n}x{kk}"
                tot[key] = tot.get(key, 0.0) + s + pending
                counts[key] = counts.get(key, 0) + 1
                pending = 0.0
        for key, v in tot.items():
            per.setdefault(key, []).append(v)
    med = {k: sorted(v)[len(v) // 2] for k, v in per.items()}
    return {"us": med, "count": {k: v / len(steps) for k, v in counts.items()},
            "replays": len(steps), "shapes_matched": matched}


@torch.inference_mode()
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="8b")
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--table", default="", help="a kernel table JSON instead of the device's")
    ap.add_argument("--release", default="on", help="on, off or on,off: the wgmma W12 "
                    "kernel releases the next kernel after its loop (under PDL)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    os.makedirs(a.out, exist_ok=True)
    model = random_transformer(a.preset, "cuda", torch.bfloat16, seed=0, fused=True)
    table = (TunedTable.load(a.table) if a.table else load_table(torch.cuda.get_device_name()))
    rep = apply_w12(model, min_gain=0.0, table=table)
    assert model.set_fused_kernels(True) and model.set_attention_kernel(True)
    log = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "preset": a.preset,
           "w12_layers": rep.applied, "runs": {}}
    for B in (int(b) for b in a.batches.split(",")):
        order = linear_order(model, B)
        mods = {(m.out_features, m.in_features): m for m in model.modules()
                if isinstance(m, W12Linear)}
        for on, rel in [(on, rel) for rel in a.release.split(",") for on in (True, False)
                        if on or rel == "on"]:
            w12_wgmma.RELEASE_DEPENDENTS = rel == "on"
            one = {shape: alone_us(mods[shape], B, on) for shape in sorted(set(order))}
            alone = {}  # the isolated time of each call of the step, summed per shape
            for n, k in order:
                alone[f"w12 {n}x{k}"] = alone.get(f"w12 {n}x{k}", 0.0) + one[(n, k)]
            with pdl.scope(on):
                replay, _, _ = step_graph(model, B)
                ms = graph_ms(replay)
                s = summarize(timeline(replay, a.replays), order)
            log["runs"][f"b{B}:pdl={'on' if on else 'off'}:release={rel}"] = {
                "batch": B, "pdl": on, "release": rel, "step_ms": ms, **s,
                "alone_us": alone, "configs": {f"{n}x{k}": mods[(n, k)]._config(
                    bucket(B)).label for n, k in sorted(set(order))}}
            print(json.dumps({"batch": B, "pdl": on, "release": rel, "step_ms": ms}),
                  flush=True)
    with open(os.path.join(a.out, "w12_step_profile.json"), "w") as f:
        json.dump(log, f, indent=1)

    print(f"\n{log['device']}, torch {log['torch']}, {log['date']}, {a.preset} W12 "
          f"({rep.applied} linears), shares of the step in us (median of {a.replays} replays)")
    for key, r in log["runs"].items():
        u, c = r["us"], r["count"]
        print(f"\n{key}: graph replay {r['step_ms'] * 1e3:.0f} us, profiled span "
              f"{u['span']:.0f} us, idle {u['idle']:.0f} us, W12 shapes matched in "
              f"{r['shapes_matched']}/{r['replays']} replays")
        print(f"{'group':<22}{'kernels':>8}{'us':>9}{'alone us':>10}{'step/alone':>11}")
        for g in sorted((k for k in u if k not in ("idle", "span")), key=lambda k: -u[k]):
            al = r["alone_us"].get(g)
            ratio = f"{u[g] / al:>11.3f}" if al else f"{'':>11}"
            print(f"{g:<22}{c.get(g, 0):>8.0f}{u[g]:>9.1f}"
                  f"{(f'{al:.1f}' if al else ''):>10}{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
