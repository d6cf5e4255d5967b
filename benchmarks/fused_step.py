"""One graphed decode step with the Triton elementwise kernels off vs on (run from the repo root):

    PYTHONPATH=. python3 benchmarks/fused_step.py [--sizes 8b,32b] [--batches 1,8,32] [--out DIR]

For each random Qwen3 preset and batch: the median ms of a CUDA-graph replay of one decode
step (`model.step`, T = 1, kv_len 256, positions ~150) with `set_fused_kernels(False)` (the
torch path, fused projections) and `(True)`, and of a graph of only that step's GEMMs (every
nn.Linear of the model on random activations: the cuBLAS ceiling), all in this run. With
--profile, the 8B-class batch-1 step is also profiled (torch.profiler over graph replays):
per-kernel count per step and total us, kernels off and on, as text tables under --out.
Writes fused_step.json under --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from specpilot.runtime.cuda_graphs import StepGraphs
from specpilot.runtime.random_model import random_transformer


def graph_ms(fn, reps: int = 5, per: int = 20) -> float:
    """Median over `reps` of the mean ms of `per` back-to-back calls (CUDA events)."""
    from specpilot.costmodel.calibrate import cuda_time

    return cuda_time(fn, per, reps) * 1e3


@torch.inference_mode()
def gemm_graph(model, B: int):
    """A replay function of a graph of every nn.Linear of the model at batch B."""
    lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = {m.in_features: torch.randn(B, m.in_features, device=model.device, dtype=model.dtype)
          for m in lins}

    def step():
        for m in lins:
            torch.nn.functional.linear(xs[m.in_features], m.weight)
    g = StepGraphs(model.device)
    g.run("g", step)
    return lambda: g.run("g", step)


@torch.inference_mode()
def step_graph(model, B: int, T: int = 1, kv_len: int = 256, pos0: int = 150):
    model.setup_cache(B, max(kv_len, pos0 + T + 1))
    g = torch.Generator(device=model.device).manual_seed(B * 100 + T)
    ids = torch.randint(0, model.cfg.vocab_size, (B, T), device=model.device, generator=g)
    pos = (pos0 + torch.arange(T, device=model.device))[None].expand(B, T).contiguous()
    g = StepGraphs(model.device)

    def fn():
        return model.step(ids, pos, kv_len=kv_len)
    first = g.run("s", fn)[0].clone()
    return (lambda: g.run("s", fn)), first, fn


def cuda_events(replay, steps: int, sync_each: bool = False) -> list:
    """The GPU kernels' profiler events of `steps` replays after a warm one (torch.profiler;
    with sync_each, a host sync after every replay, else after the last)."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            replay()
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return [e for e in prof.events()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]


def profile_table(replay, steps: int = 10) -> tuple[list[dict], float]:
    """Per-kernel rows {name, per_step, us_per_step} over `steps` replays, and the sum."""
    rows = {}
    for e in cuda_events(replay, steps):
        us = e.time_range.elapsed_us()
        r = rows.setdefault(e.name, {"name": e.name, "count": 0, "us": 0.0})
        r["count"] += 1
        r["us"] += us
    out = [{"name": r["name"], "per_step": r["count"] / steps, "us_per_step": r["us"] / steps}
           for r in rows.values()]
    out.sort(key=lambda r: -r["us_per_step"])
    return out, sum(r["us_per_step"] for r in out)


def kind(name: str) -> str:
    """gemm (cuBLAS, or SpecPilot's Triton bf16/W12 linear kernels), attention (cuDNN/flash
    SDPA, or the Triton attention kernel) or other."""
    n = name.lower()
    if any(s in n for s in ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "cublas",
                            "linear_kernel")):
        return "gemm"
    if any(s in n for s in ("fmha", "flash", "attention", "efficient", "attn")):
        return "attention"
    return "other"


def per_kind(rows: list[dict]) -> dict[str, list[float]]:
    """kind -> [us per step, kernels per step] of `profile_table` rows."""
    out: dict[str, list[float]] = {}
    for r in rows:
        k = out.setdefault(kind(r["name"]), [0.0, 0.0])
        k[0] += r["us_per_step"]
        k[1] += r["per_step"]
    return out


def write_profile(path: str, title: str, rows: list[dict], total: float, wall_us: float) -> str:
    lines = [f"{title}: kernels {total:.0f} us/step summed, graph replay {wall_us:.0f} us/step",
             f"{'us/step':>9} {'n/step':>7}  kind       kernel"]
    for r in rows:
        lines.append(f"{r['us_per_step']:>9.1f} {r['per_step']:>7.1f}  {kind(r['name']):<9}  "
                     f"{r['name'][:110]}")
    lines.append("by kind: " + ", ".join(f"{k} {v[0]:.0f} us in {v[1]:.0f} kernels"
                                          for k, v in sorted(per_kind(rows).items())))
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return lines[0] + "\n" + lines[-1]


def gaps(ref_model, prompts, outputs) -> list[float]:
    """For every committed token that is not `ref_model`'s top-1 (teacher-forced, no cache),
    its logit gap to the top-1."""
    from benchmarks.gpu_perf import forced_gaps

    return [round(g, 4) for g in forced_gaps(ref_model, prompts, outputs)]


@torch.inference_mode()
def lossless_check(seeds=(0, 1, 2)) -> list[dict]:
    """Small Qwen3 (tests/test_perf_gpu.py's): AR outputs of the fused model with the kernels
    off and on, teacher-forced through the stock (unfused) model and through the fused model's
    torch path; each with the reference's own noise margin (benchmarks/gpu_perf.noise)."""
    from benchmarks.gpu_perf import noise
    from specpilot.runtime.config import ModelConfig
    from specpilot.runtime.generate import Engine

    cfg = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536,
                      num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                      max_position_embeddings=4096)
    stock = random_transformer(cfg, "cuda", "bfloat16", seed=1, std=0.05)
    fused = random_transformer(cfg, "cuda", "bfloat16", seed=1, std=0.05, fused=True)
    rows = []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
                   for n in (9, 40, 23, 3)]
        outs = {}
        for on in (False, True):
            fused.set_fused_kernels(on)
            outs[on] = [x.output_ids for x in Engine(fused).generate(prompts, 48,
                                                                      ignore_eos=True)]
        fused.set_fused_kernels(False)
        same = sum(a == b for a, b in zip(outs[False], outs[True]))
        r = {"seed": seed, "rows_equal_off_on": same}
        for ref_name, ref in (("stock", stock), ("fused_torch", fused)):
            margin = 2 * noise(ref, [p + o for p, o in zip(prompts, outs[True])])
            for on in (False, True):
                gs = gaps(ref, prompts, outs[on])
                r[f"{ref_name}_ref_kernels_{'on' if on else 'off'}"] = {
                    "margin": round(margin, 4), "mismatch_gaps": gs,
                    "failures": sum(x > margin for x in gs)}
        rows.append(r)
        print("lossless check", json.dumps(r))
    fused.set_fused_kernels(True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8b,32b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--verify-k", type=int, default=8, help="also time a verify step (T = k+1)"
                    " at batch 1; 0 = skip")
    ap.add_argument("--check", action="store_true", help="only the small-model lossless check")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    os.makedirs(a.out, exist_ok=True)
    log = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    rows = log["rows"]
    if a.check:
        log["lossless_check"] = lossless_check()
        with open(os.path.join(a.out, "fused_check.json"), "w") as f:
            json.dump(log, f, indent=1)
        return 0
    for preset in a.sizes.split(","):
        model = random_transformer(preset, "cuda", torch.bfloat16, seed=0, fused=True)
        assert model.set_fused_kernels(True), "the fused kernels did not switch on"
        for B in [int(b) for b in a.batches.split(",")]:
            ceil = graph_ms(gemm_graph(model, B))
            r = {"preset": preset, "batch": B, "gemm_graph_ms": ceil}
            toks = {}
            for on in (False, True):
                model.set_fused_kernels(on)
                replay, toks[on], eager = step_graph(model, B)
                r["on_ms" if on else "off_ms"] = graph_ms(replay)
                if a.profile and preset == "8b" and B == 1:
                    prof, total = profile_table(replay)
                    if total == 0:  # the profiler saw no kernels in graph replays
                        print("profiling the eager step instead of graph replays")
                        prof, total = profile_table(eager)
                    tag = "on" if on else "off"
                    print(write_profile(os.path.join(a.out, f"profile_8b_b1_{tag}.txt"),
                                        f"8b b1 kernels {tag}", prof, total,
                                        1e3 * r["on_ms" if on else "off_ms"]))
                    log[f"profile_8b_b1_{tag}"] = prof
                if a.verify_k and B == 1:
                    vr, _, _ = step_graph(model, 1, T=a.verify_k + 1)
                    r[f"verify{a.verify_k}_{'on' if on else 'off'}_ms"] = graph_ms(vr)
            r["same_tokens"] = f"{int((toks[False] == toks[True]).all(-1).sum())}/{B}"
            rows.append(r)
            with open(os.path.join(a.out, "fused_step.json"), "w") as f:
                json.dump(log, f, indent=1)
        del model
        torch.cuda.empty_cache()
    print(f"\n{log['device']}, torch {log['torch']}, {log['date']}; one decode step, CUDA graph,"
          " kv_len 256")
    print(f"{'model':>5}{'B':>4}{'gemm ms':>9}{'off ms':>8}{'on ms':>8}{'off %':>7}{'on %':>7}"
          f"{'tok/s off':>10}{'tok/s on':>10}{'==tokens':>9}")
    for r in rows:
        B = r["batch"]
        print(f"{r['preset']:>5}{B:>4}{r['gemm_graph_ms']:>9.2f}{r['off_ms']:>8.2f}"
              f"{r['on_ms']:>8.2f}{100 * r['gemm_graph_ms'] / r['off_ms']:>6.0f}%"
              f"{100 * r['gemm_graph_ms'] / r['on_ms']:>6.0f}%{B * 1e3 / r['off_ms']:>10.1f}"
              f"{B * 1e3 / r['on_ms']:>10.1f}{r['same_tokens']:>9}")
        k = a.verify_k
        if f"verify{k}_on_ms" in r:
            print(f"      verify(k={k}) / AR step: off {r[f'verify{k}_off_ms'] / r['off_ms']:.2f}"
                  f", on {r[f'verify{k}_on_ms'] / r['on_ms']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
