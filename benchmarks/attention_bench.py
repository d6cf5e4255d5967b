"""Decode/verify attention per call: the Triton split-KV kernel vs SDPA (one device call).

    PYTHONPATH=. python3 benchmarks/attention_bench.py [--out DIR] [--e2e] [--sweep]
        [--skip-per-call] [--budget-s 240]

Per call, on the 8B (nkv 8, G 4, hd 128) and 32B (nkv 8, G 8) attention shapes, batch
1/8/32, T 1 and 9 query positions, S 256/1024/4096 attended slots (K/V slices of a larger
bf16 cache, the model's ragged causal additive mask):
  sdpa      F.scaled_dot_product_attention + the transpose copy to o_proj's layout (what
            `Attention._attend_grouped` runs on SDPA)
  triton    `attend_merged` (what it runs with the kernel: o_proj's layout directly)
  t/nosplit the kernel with one split (batch 1 only: what the split buys)
Each is timed as a CUDA graph of >= 24 calls that cycle over enough input sets to exceed
the L2 (so K/V come from HBM as in a real step), replayed 15 times; median per call. Also
the relative error of both against an fp64 reference.
With --e2e: the 8B-class random model at batch 1 (fused projections, Triton elementwise
kernels, Triton GEMV where tuned), engine AR decode with attention sdpa vs triton (A B A B),
the verify step (k = 4), the CUDA-graph cuBLAS GEMM ceiling of benchmarks/gpu_perf.py, and
the triton run's tokens forced through the SDPA model (tie-aware, its own margin).
With --sweep (first): the kernel's block shape on the many-row verify shapes.
Prints tables; writes attention_bench.json under --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from specpilot.kernels import attention as A
from specpilot.kernels.tuning import graph_timer

SHAPES = {"8b": (8, 4, 128), "32b": (8, 8, 128)}  # nkv, G, hd
L2_BYTES = 160 << 20  # input sets cycled per graph: well past the H200's 60 MB L2


def make_inputs(B, nkv, G, hd, T, S, g):
    q = torch.randn(B, nkv, T * G, hd, generator=g, device="cuda").to(torch.bfloat16)
    cache = torch.randn(2, B, nkv, S + 256, hd, generator=g, device="cuda").to(torch.bfloat16)
    last = torch.randint(T - 1, S, (B,), generator=g, device="cuda")
    last[0] = S - 1  # one row uses every slot
    pos = last[:, None] - T + 1 + torch.arange(T, device="cuda")[None]
    allowed = torch.arange(S, device="cuda")[None, None] <= pos[:, :, None]
    add = torch.zeros(allowed.shape, dtype=torch.bfloat16, device="cuda")
    add.masked_fill_(~allowed, float("-inf"))
    mask = add[:, None, :, None, :].expand(B, 1, T, G, S).reshape(B, 1, T * G, S)
    return q, cache[0, :, :, :S], cache[1, :, :, :S], mask


def sdpa_path(q, k, v, mask, G):
    B, H, M, hd = q.shape
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return y.view(B, H, M // G, G, hd).transpose(1, 2).reshape(B, M // G, H * G * hd)


def graph_us(calls, reps: int = 15) -> float:
    """Median microseconds per call of a CUDA graph that runs `calls` in order
    (`kernels.tuning.graph_timer` over the calls in turn)."""
    turn = itertools.cycle(calls)
    ts = graph_timer(lambda: next(turn)(), len(calls), reps)
    return sorted(ts)[len(ts) // 2]


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@torch.inference_mode()
def per_call(res: dict, deadline: float) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    print("\n[per call] us per attention call, CUDA graph, K/V from HBM; err = rel. error vs "
          "fp64; splits = the kernel's KV splits")
    print(f"{'model':>5}{'B':>4}{'T':>3}{'S':>6}{'sdpa us':>9}{'triton us':>10}{'speedup':>8}"
          f"{'nosplit':>8}{'splits':>7}{'sdpa err':>10}{'tri err':>10}")
    rows = []
    for name, (nkv, G, hd) in SHAPES.items():
        for B in (1, 8, 32):
            for T in (1, 9):
                for S in (256, 1024, 4096):
                    if time.perf_counter() > deadline:
                        print("(time budget spent)")
                        res["per_call"] = rows
                        return
                    per_set = 2 * B * nkv * S * hd * 2
                    n_sets = max(1, min(160, -(-L2_BYTES // per_set)))
                    sets = [make_inputs(B, nkv, G, hd, T, S, g) for _ in range(n_sets)]
                    q, k, v, m = sets[0]
                    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                         attn_mask=m.double())
                    ref = ref.view(B, nkv, T, G, hd).transpose(1, 2).reshape(B, T, -1)
                    e_s = rel(sdpa_path(q, k, v, m, G), ref)
                    e_t = rel(A.attend_merged(q, k, v, m, G), ref)
                    n = max(24, n_sets)
                    pick = [sets[i % n_sets] for i in range(n)]
                    t_s = graph_us([lambda x=x, G=G: sdpa_path(*x, G) for x in pick])
                    t_t = graph_us([lambda x=x, G=G: A.attend_merged(*x, G) for x in pick])
                    t_1 = (graph_us([lambda x=x, G=G: A.attend_merged(*x, G, splits=1)
                                     for x in pick]) if B == 1 else float("nan"))
                    sp = A.choose_splits(B * nkv * -(-T * G // A.launch_config(T * G)[
                        "BLOCK_M"]), S, A._sm_count(q.device))
                    r = {"model": name, "B": B, "T": T, "S": S, "sdpa_us": t_s,
                         "triton_us": t_t, "triton_nosplit_us": t_1, "splits": sp,
                         "sdpa_err": e_s, "triton_err": e_t, "input_sets": n_sets}
                    rows.append(r)
                    print(f"{name:>5}{B:>4}{T:>3}{S:>6}{t_s:>9.1f}{t_t:>10.1f}"
                          f"{t_s / t_t:>7.2f}x{t_1:>8.1f}{sp:>7}{e_s:>10.1e}{e_t:>10.1e}")
                    del sets, pick
    res["per_call"] = rows


# block shapes tried for the many-row shapes (T * G > 64): (BLOCK_M cap, num_warps)
VARIANTS = {"m128w8": (128, 8), "m128w4": (128, 4), "m64w4": (64, 4), "m32w4": (32, 4),
            "m16w4": (16, 4)}
SWEEP = [("32b", 1, 17, 4096), ("32b", 8, 9, 1024), ("32b", 8, 9, 4096),
         ("32b", 32, 9, 1024), ("32b", 32, 9, 4096), ("32b", 32, 17, 4096),
         ("8b", 8, 17, 4096), ("8b", 32, 17, 4096)]


@torch.inference_mode()
def sweep(res: dict, deadline: float) -> None:
    """The kernel's block shape on the shapes with many query rows per KV head."""
    g = torch.Generator(device="cuda").manual_seed(1)
    default = A.launch_config
    print("\n[sweep] us per call of the kernel by (BLOCK_M cap, warps); default = "
          "launch_config; err = rel. difference to SDPA")
    print(f"{'model':>5}{'B':>4}{'T':>3}{'S':>6}{'sdpa':>8}{'default':>9}"
          + "".join(f"{v:>9}" for v in VARIANTS) + f"{'max err':>9}")
    rows = []
    try:
        for name, B, T, S in SWEEP:
            if time.perf_counter() > deadline:
                print("(time budget spent)")
                break
            nkv, G, hd = SHAPES[name]
            per_set = 2 * B * nkv * S * hd * 2
            n_sets = max(1, min(160, -(-L2_BYTES // per_set)))
            sets = [make_inputs(B, nkv, G, hd, T, S, g) for _ in range(n_sets)]
            pick = [sets[i % n_sets] for i in range(max(24, n_sets))]
            ref = sdpa_path(*sets[0], G)
            r = {"model": name, "B": B, "T": T, "S": S,
                 "sdpa_us": graph_us([lambda x=x, G=G: sdpa_path(*x, G) for x in pick])}
            errs = []
            for vname, cfg in [("default", None), *VARIANTS.items()]:
                if cfg is None:
                    A.launch_config = default
                else:
                    A.launch_config = (lambda rows, cap=cfg[0], w=cfg[1]: {
                        "BLOCK_M": min(cap, A.block_m(rows)), "BLOCK_N": A.BLOCK_N,
                        "num_warps": w, "num_stages": 2})
                errs.append(rel(A.attend_merged(*sets[0], G), ref))
                r[vname] = graph_us([lambda x=x, G=G: A.attend_merged(*x, G) for x in pick])
            A.launch_config = default
            r["max_err_vs_sdpa"] = max(errs)
            rows.append(r)
            print(f"{name:>5}{B:>4}{T:>3}{S:>6}{r['sdpa_us']:>8.1f}{r['default']:>9.1f}"
                  + "".join(f"{r[v]:>9.1f}" for v in VARIANTS) + f"{max(errs):>9.1e}")
            del sets, pick
    finally:
        A.launch_config = default
    res["sweep"] = rows


@torch.inference_mode()
def e2e(res: dict, deadline: float) -> None:
    """8B-class batch-1 decode, attention sdpa vs triton, same model and prompts."""
    import benchmarks.gpu_perf as gp
    from specpilot.kernels.gemv_bf16 import apply_gemv
    from specpilot.runtime.generate import Engine
    from specpilot.runtime.random_model import random_transformer

    gp.ARGS = SimpleNamespace(device="cuda")  # its time_ms reads the device from ARGS
    model = random_transformer("8b", "cuda", torch.bfloat16, seed=0, fused=True)
    assert model.set_fused_kernels(True)
    rep = apply_gemv(model)
    print(f"\n[e2e] 8b random, batch 1, fused kernels on, Triton GEMV on "
          f"{len(rep.swapped)} linears; 64-token prompt, 128 new tokens, AR, CUDA graphs")
    prompts = gp.prompts_for(1, 64, model.cfg.vocab_size, 1)
    out, toks = {}, {}
    for rnd in range(2):
        for mode in ("sdpa", "triton"):
            if time.perf_counter() > deadline:
                break
            on = model.set_attention_kernel(mode == "triton")
            assert on == (mode == "triton")
            eng = Engine(model)
            gp.gen(eng, prompts, 8)  # capture
            o, gens = gp.gen(eng, prompts, 128)
            m = gens[0].metrics
            ms = m.decode_s / m.verify_steps * 1e3
            out.setdefault(mode, []).append(ms)
            toks[mode] = o[0]
            v_ms = gp.step_ms(model, 1, 5, 256)
            out.setdefault(mode + "_verify5", []).append(v_ms)
            print(f"round {rnd} {mode:>6}: step {ms:.3f} ms = {1e3 / ms:.1f} tok/s; "
                  f"verify(T=5, kv 256) step {v_ms:.3f} ms")
    model.set_attention_kernel(False)
    forced = None
    if "sdpa" in toks and "triton" in toks:  # tie-aware forcing through the SDPA model
        margin = gp.tie_margin(model, [prompts[0] + toks["sdpa"]])
        forced = gp.force(model, prompts, [toks["triton"]], margin)
        print(f"triton tokens forced through the SDPA model: {forced}")
    ceil = gp.gemm_ceiling(model, 1)
    res["e2e"] = {"steps_ms": out, "gemm_ceiling_ms": ceil,
                  "same_tokens": toks.get("sdpa") == toks.get("triton"), "forced": forced,
                  "first_diff": next((i for i, (a, b) in enumerate(
                      zip(toks.get("sdpa", []), toks.get("triton", []))) if a != b), None)}
    print(f"cuBLAS GEMM-only graph ceiling: {ceil:.3f} ms")
    for mode in ("sdpa", "triton"):
        if mode in out:
            best = min(out[mode])
            print(f"{mode:>6}: best step {best:.3f} ms = {1e3 / best:.1f} tok/s = "
                  f"{100 * ceil / best:.1f}% of the GEMM ceiling")
    print(f"greedy tokens sdpa == triton: {res['e2e']['same_tokens']} "
          f"(first difference at {res['e2e']['first_diff']})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--e2e", action="store_true", help="also the 8B batch-1 decode step")
    ap.add_argument("--sweep", action="store_true", help="also the block-shape sweep")
    ap.add_argument("--skip-per-call", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)  # before the run, not after it
    t0 = time.perf_counter()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(res)
    e2e_s = 100 if args.e2e else 0
    if args.sweep:
        sweep(res, t0 + args.budget_s - e2e_s - (0 if args.skip_per_call else 60))
    if not args.skip_per_call:
        per_call(res, t0 + args.budget_s - e2e_s)
    with open(os.path.join(args.out, "attention_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    if args.e2e:
        e2e(res, t0 + args.budget_s)
        with open(os.path.join(args.out, "attention_bench.json"), "w") as f:
            json.dump(res, f, indent=1)
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
