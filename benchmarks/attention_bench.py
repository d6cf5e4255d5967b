"""Decode/verify attention per call: the Triton split-KV kernel vs SDPA (one device call).

    PYTHONPATH=. python3 benchmarks/attention_bench.py [--out DIR] [--e2e] [--sweep [--no-grid]]
        [--ab] [--baseline FILE] [--skip-per-call] [--budget-s 240]

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
With --sweep (first): every launch of a grid (BLOCK_N, warps, stages, KV splits) on 36
decode/verify shapes (both models, batch 1/8/32, T 1/5, S 256/1024/4096) beside the kernel's
own launch and, with --baseline FILE, an earlier attention.py's
(`git show REV:specpilot/kernels/attention.py > FILE`); --no-grid: those alone;
--lengths, --chunks and --blocks narrow or widen it (S values; KV slots a split;
BLOCK_N).
With --ab (needs --baseline): the 8B-class engine's graphed step (T 1/5, batch 1-32, kv_len
256-4096) with the earlier kernel and with this one, alternated.
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
from triton.runtime.errors import OutOfResources

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
                    sp = A.choose_splits(B * nkv * -(-T * G // A.block_m(T * G)), S,
                                         A._sm_count(q.device))
                    r = {"model": name, "B": B, "T": T, "S": S, "sdpa_us": t_s,
                         "triton_us": t_t, "triton_nosplit_us": t_1, "splits": sp,
                         "sdpa_err": e_s, "triton_err": e_t, "input_sets": n_sets}
                    rows.append(r)
                    print(f"{name:>5}{B:>4}{T:>3}{S:>6}{t_s:>9.1f}{t_t:>10.1f}"
                          f"{t_s / t_t:>7.2f}x{t_1:>8.1f}{sp:>7}{e_s:>10.1e}{e_t:>10.1e}")
                    del sets, pick
    res["per_call"] = rows


# the launch grid swept per shape: (BLOCK_N, num_warps, num_stages) x KV slots a split
def tile_grid(blocks=(64, 128)) -> list[tuple[int, int, int]]:
    """(BLOCK_N, warps, stages) of the sweep grid."""
    return [(bn, w, st) for bn in blocks for w in (4, 8) for st in (2, 3)]


TILES = tile_grid()
CHUNKS = (128, 256, 512, 1024, None)  # None: one split
SWEEP = [(name, B, T, S) for name in SHAPES for B in (1, 8, 32) for T in (1, 5)
         for S in (256, 1024, 4096)]


def split_count(S: int, chunk: int | None) -> int:
    return 1 if chunk is None else max(1, -(-S // chunk))


@torch.inference_mode()
def sweep(res: dict, deadline: float, base, save, grid: bool = True, shapes=SWEEP,
          chunks=CHUNKS, tiles=TILES) -> None:
    """Every (BLOCK_N, warps, stages, split) of the grid on each decode/verify shape, beside
    the kernel's own choice, `base`'s (an earlier attention.py, or None) and SDPA."""
    g = torch.Generator(device="cuda").manual_seed(1)
    print("\n[sweep] us per call; default = the kernel's own launch; best = the fastest of the "
          "grid (BLOCK_N, warps, stages, splits); err = max rel. difference to SDPA")
    print(f"{'model':>5}{'B':>4}{'T':>3}{'S':>6}{'sdpa':>8}{'base':>8}{'default':>9}"
          f"{'best':>8}  {'best config':<18}{'base/best':>10}{'max err':>9}")
    rows = []
    for name, B, T, S in shapes:
        if time.perf_counter() > deadline:
            print("(time budget spent)")
            break
        nkv, G, hd = SHAPES[name]
        per_set = 2 * B * nkv * S * hd * 2
        n_sets = max(1, min(160, -(-L2_BYTES // per_set)))
        sets = [make_inputs(B, nkv, G, hd, T, S, g) for _ in range(n_sets)]
        pick = [sets[i % n_sets] for i in range(max(24, n_sets))]
        ref = sdpa_path(*sets[0], G)
        r = {"model": name, "B": B, "T": T, "S": S, "grid": {},
             "sdpa_us": graph_us([lambda x=x, G=G: sdpa_path(*x, G) for x in pick])}
        errs = [rel(A.attend_merged(*sets[0], G), ref)]
        r["default_us"] = graph_us([lambda x=x, G=G: A.attend_merged(*x, G) for x in pick])
        if base is not None:
            errs.append(rel(base.attend_merged(*sets[0], G), ref))
            r["base_us"] = graph_us([lambda x=x, G=G: base.attend_merged(*x, G)
                                     for x in pick])
        for (bn, w, st), chunk in itertools.product(tiles, chunks) if grid else ():
            sp = split_count(S, chunk)
            key = f"n{bn}w{w}s{st}x{sp}"
            if key in r["grid"]:
                continue
            cfg = {"BLOCK_N": bn, "num_warps": w, "num_stages": st}
            try:
                errs.append(rel(A.attend_merged(*sets[0], G, splits=sp, config=cfg), ref))
            except OutOfResources:  # e.g. 64 x 128 tiles three stages deep: too much smem
                continue
            r["grid"][key] = graph_us([
                lambda x=x, G=G, sp=sp, cfg=cfg: A.attend_merged(*x, G, splits=sp, config=cfg)
                for x in pick])
        r["grid"].setdefault("default", r["default_us"])
        r["best"] = min(r["grid"], key=r["grid"].get)
        r["max_err_vs_sdpa"] = max(errs)
        rows.append(r)
        res["sweep"] = rows
        save()
        bt = r["grid"][r["best"]]
        b_us = r.get("base_us", float("nan"))
        print(f"{name:>5}{B:>4}{T:>3}{S:>6}{r['sdpa_us']:>8.1f}{b_us:>8.1f}{r['default_us']:>9.1f}"
              f"{bt:>8.1f}  {r['best']:<18}{b_us / bt:>9.2f}x{max(errs):>9.1e}", flush=True)
        del sets, pick


AB_STEPS = [(1, 1, 256), (1, 1, 1024), (1, 1, 4096), (1, 5, 1024), (1, 5, 4096), (8, 5, 1024),
            (16, 1, 256), (32, 1, 256), (32, 1, 1024)]  # (batch, T, kv_len)


@torch.inference_mode()
def step_ab(res: dict, deadline: float, base) -> None:
    """The 8B-class engine's graphed step (fused kernels, Triton GEMV where tuned, PDL) with
    this attention kernel and with `base`'s, alternated base, new, base, new per shape."""
    import benchmarks.gpu_perf as gp
    from specpilot.kernels.gemv_bf16 import apply_gemv
    from specpilot.runtime.random_model import random_transformer

    gp.ARGS = SimpleNamespace(device="cuda", pdl="on")
    model = random_transformer("8b", "cuda", torch.bfloat16, seed=0, fused=True)
    assert model.set_fused_kernels(True) and model.set_attention_kernel(True)
    apply_gemv(model)
    shipped = A.attend_merged
    print("\n[step A/B] 8b random, graphed step ms (kernels, GEMV, PDL): base vs this kernel")
    print(f"{'B':>4}{'T':>3}{'kv':>6}{'base ms':>10}{'new ms':>10}{'base/new':>10}")
    rows = []
    try:
        for B, T, kv in AB_STEPS:
            if time.perf_counter() > deadline:
                print("(time budget spent)")
                break
            t = {"base": [], "new": []}
            for _ in range(2):
                for name, fn in (("base", base.attend_merged), ("new", shipped)):
                    A.attend_merged = fn  # the model looks it up on the module at each call
                    t[name].append(gp.step_ms(model, B, T, kv))
            b, n = min(t["base"]), min(t["new"])
            rows.append({"B": B, "T": T, "kv_len": kv, "base_ms": t["base"], "new_ms": t["new"]})
            print(f"{B:>4}{T:>3}{kv:>6}{b:>10.3f}{n:>10.3f}{b / n:>9.3f}x", flush=True)
    finally:
        A.attend_merged = shipped
    res["step_ab"] = rows


@torch.inference_mode()
def e2e(res: dict, deadline: float) -> None:
    """8B-class batch-1 decode, attention sdpa vs triton, same model and prompts."""
    import benchmarks.gpu_perf as gp
    from specpilot.kernels.gemv_bf16 import apply_gemv
    from specpilot.runtime.generate import Engine
    from specpilot.runtime.random_model import random_transformer

    gp.ARGS = SimpleNamespace(device="cuda", pdl="on")  # what its time_ms and step_ms read
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
    ap.add_argument("--sweep", action="store_true", help="also the launch-grid sweep")
    ap.add_argument("--baseline", help="an earlier attention.py to time beside (--sweep, --ab)")
    ap.add_argument("--no-grid", action="store_true", help="--sweep without the grid")
    ap.add_argument("--ab", action="store_true", help="engine steps, --baseline's kernel vs this")
    ap.add_argument("--skip-per-call", action="store_true")
    ap.add_argument("--lengths", default="256,1024,4096", help="--sweep: attended slots S")
    ap.add_argument("--chunks", default="128,256,512,1024",
                    help="--sweep: KV slots a split (and one split) in the grid")
    ap.add_argument("--blocks", default="64,128", help="--sweep: BLOCK_N values in the grid")
    args = ap.parse_args()
    if args.ab and not args.baseline:
        raise SystemExit("--ab compares against --baseline FILE: give one")
    if args.baseline and not os.path.isfile(args.baseline):
        raise SystemExit(f"--baseline {args.baseline}: no such file (git show "
                         "REV:specpilot/kernels/attention.py > FILE makes one)")
    os.makedirs(args.out, exist_ok=True)  # before the run, not after it
    base = None
    if args.baseline:
        from benchmarks.w12_patch import module_from_source
        with open(args.baseline) as f:
            base = module_from_source(f.read(), "attention_base")
    t0 = time.perf_counter()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(res)
    e2e_s = 100 if args.e2e else 0

    def save() -> None:  # through a temporary file: a killed run leaves the last whole one
        path = os.path.join(args.out, "attention_bench.json")
        with open(path + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(path + ".tmp", path)

    if args.sweep:
        lengths = {int(v) for v in args.lengths.split(",")}
        chunks = tuple(int(v) for v in args.chunks.split(",")) + (None,)
        sweep(res, t0 + args.budget_s - e2e_s - (0 if args.skip_per_call else 60), base, save,
              grid=not args.no_grid, shapes=[r for r in SWEEP if r[3] in lengths],
              chunks=chunks, tiles=tile_grid([int(bn) for bn in args.blocks.split(",")]))
    if args.ab:
        step_ab(res, t0 + args.budget_s - e2e_s, base)
        save()
    if not args.skip_per_call:
        per_call(res, t0 + args.budget_s - e2e_s)
    save()
    if args.e2e:
        e2e(res, t0 + args.budget_s)
        save()
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
