"""GPU performance of the native engine in one device call (run from the repo root):

    PYTHONPATH=. python3 benchmarks/gpu_perf.py [--budget-s 270] [--out DIR]
        [--sections check,ar,verify,spec,attn] [--sizes 8b,32b] [--batches 1,8,32] [--kernels]
        [--gemv] [--attention triton|sdpa] [--drafts 0.6b,eagle] [--weights bf16|w12]
        [--k K] [--pdl on|off|both]
    .venv/bin/python benchmarks/gpu_perf.py --smoke      # CPU, tiny model: exercises the code

Sections (--sections, a comma list, default all), in order, each skipped once the time
budget is spent (the JSON is rewritten after each, so a cut run keeps what it measured):
  check   small random Qwen3, ragged batch: CUDA-graph == eager tokens (AR and oracle); the
          oracle at alpha 1 / 0 accepts every / no draft; fused == stock and speculative ==
          greedy under tie-aware token forcing.
  ar      AR tokens/s at batch 1/8/32 for 8B- and 32B-class random models (engine, graphs)
          vs the cost model's roofline bound and a CUDA-graph cuBLAS ceiling (every GEMM of
          one decode step, captured and replayed) measured here; with --pdl both, also the
          same engine without programmatic dependent launch.
  verify  verify(k) step / AR step for k = 2..16 at batch 1/8/32 (graph replays).
  spec    speculative tokens/s vs AR of the same prompts (measured in the section) with the
          oracle drafter (recorded on each spec engine's own path), alpha 0.6/0.8/0.9/1.0 at
          the cost model's best k (batch 1: also k = 4..8 at alpha 0.8; --k: one k for every
          run), drafting cost none, a
          0.6B-class draft model or an EAGLE-class head of the target's width (--drafts;
          graphed, eager, with the fused kernels); accept length vs
          the geometric expectation; every output token-forced against the stock target.
  attn    decode step vs attended cache prefix (kv_len) at batch 8.
  peer    HF transformers generate() on the same 8B-class config (benchmarks/hf_peer.py).
Prints a table per section; writes gpu_perf.json under --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch

from specpilot.runtime.cuda_graphs import StepGraphs
from specpilot.runtime.drafters.oracle import OracleDrafter
from specpilot.runtime.generate import Engine
from specpilot.runtime.random_model import DRAFT_PRESETS, preset_config, random_transformer

T0 = time.perf_counter()
LOG: dict = {}
ARGS = None


SECTIONS = ("check", "ar", "verify", "spec", "attn")


def want(section: str) -> bool:
    return section in ARGS.sections


def left() -> float:
    return ARGS.budget_s - (time.perf_counter() - T0)


def save() -> None:
    with open(os.path.join(ARGS.out, "gpu_perf.json"), "w") as f:
        json.dump(LOG, f, indent=1, default=str)


def sync() -> None:
    if ARGS.device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median ms of fn() (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        if ARGS.device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[len(ts) // 2]


def prompts_for(B: int, n: int, vocab: int, seed: int, ragged: bool = False) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = [max(3, n - (7 * i) % n) if ragged else n for i in range(B)]
    return [torch.randint(0, vocab, (m,), generator=g).tolist() for m in lens]


# -- token forcing (tie-aware) ---------------------------------------------------------------

@torch.inference_mode()
def forced_gaps(stock, prompts, outputs) -> list[float]:
    """Teacher-force prompt+output through `stock` (no cache, one row at a time): for every
    committed token that is not the top-1, top-1 minus its logit."""
    out = []
    dev = stock.device
    for p, o in zip(prompts, outputs):
        ids = torch.tensor([p + o], device=dev)
        lg, _ = stock(ids, torch.arange(ids.shape[1], device=dev)[None], use_cache=False)
        pred = lg[0, len(p) - 1: -1].float()
        o_t = torch.tensor(o, device=dev)
        gap = pred.max(-1).values - pred.gather(1, o_t[:, None])[:, 0]
        out += [float(gap[i]) for i in (pred.argmax(-1) != o_t).nonzero().flatten().tolist()]
    return out


def force(stock, prompts, outputs, margin: float) -> dict:
    """Tie-aware token forcing: a committed token that is not the stock top-1 is a tie when
    top-1 minus its logit <= margin, else a failure."""
    gaps = forced_gaps(stock, prompts, outputs)
    ties = [g for g in gaps if g <= margin]
    fails = [g for g in gaps if g > margin]
    return {"mismatches": len(gaps), "ties": len(ties), "failures": len(fails),
            "worst_tie": round(max(ties, default=0.0), 4),
            "worst_failure": round(max(fails, default=0.0), 4), "margin": round(margin, 4)}


@torch.inference_mode()
def noise(stock, rows: list[list[int]], tail: int = 16, max_rows: int = 4) -> float:
    """Numeric noise of the stock model: max |logit difference| between passes over the same
    tokens with other shapes: batch 1 vs batched (no cache), and one full pass vs a cached
    prefill followed by `tail` one-token decode steps (the kernels a decode uses)."""
    L = min(len(r) for r in rows)
    ids = torch.tensor([r[:L] for r in rows], device=stock.device)
    pos = torch.arange(L, device=stock.device)[None].expand_as(ids)
    big, _ = stock(ids, pos, use_cache=False)
    worst = 0.0
    stock.setup_cache(1, L + 8)
    for i in range(min(ids.shape[0], max_rows)):
        one, _ = stock(ids[i:i + 1], pos[:1], use_cache=False)
        worst = max(worst, float((one[0] - big[i]).abs().max()))
        pre, _ = stock(ids[i:i + 1, :L - tail], pos[:1, :L - tail])
        steps = [pre[0]]
        for t in range(L - tail, L):
            lg, _ = stock(ids[i:i + 1, t:t + 1], pos[:1, t:t + 1], kv_len=t + 1)
            steps.append(lg[0])
        worst = max(worst, float((torch.cat(steps) - one[0]).abs().max()))
    return worst


@torch.inference_mode()
def deviation(model, stock, rows: list[list[int]]) -> float:
    """max |logit difference| between `model` (e.g. the fused layout) and `stock` over the
    same tokens (one full pass each, no cache): reported, never part of the margin (a
    broken engine must not widen its own tie margin)."""
    L = min(len(r) for r in rows)
    ids = torch.tensor([r[:L] for r in rows], device=stock.device)
    pos = torch.arange(L, device=stock.device)[None].expand_as(ids)
    a, _ = model(ids, pos, use_cache=False)
    b, _ = stock(ids, pos, use_cache=False)
    return float((a.float() - b.float()).abs().max())


@torch.inference_mode()
def ulp_floor(stock, rows: list[list[int]]) -> float:
    """Two steps of the logits' dtype at the largest |logit| of one pass: two correctly
    rounded computations of the same logit may differ by that much whatever the shapes."""
    L = min(len(r) for r in rows)
    ids = torch.tensor([r[:L] for r in rows], device=stock.device)
    lg, _ = stock(ids, torch.arange(L, device=stock.device)[None].expand_as(ids),
                  use_cache=False)
    top = float(lg.float().abs().max())
    if stock.dtype == torch.float32 or top == 0.0:
        return 0.0
    mant = 7 if stock.dtype == torch.bfloat16 else 10  # the model's dtype: logits may be fp32
    return 2 * 2.0 ** (math.floor(math.log2(top)) - mant)


def tie_margin(stock, rows: list[list[int]]) -> float:
    """Twice the stock model's own shape noise, at least two dtype steps at its largest
    logit: a committed token within this of the top-1 is reported as a tie. It is a
    property of the stock model alone, whatever engine is being checked."""
    return max(2 * noise(stock, rows), ulp_floor(stock, rows))


def gen(engine, prompts, n):
    gens = engine.generate(prompts, n, ignore_eos=True)
    return [g.output_ids for g in gens], gens


# -- sections ----------------------------------------------------------------------------------

def rows_full(g, k: int, alpha: float) -> bool:
    """alpha = 1: every verify step accepted all k drafts; alpha = 0: none."""
    h, n = g.metrics.accept_hist, g.metrics.verify_steps
    if alpha == 1.0:
        return h[k] == n
    if alpha == 0.0:
        return h[0] == n
    return True


@torch.inference_mode()
def check(dt) -> None:
    cfg = preset_config("tiny") if ARGS.smoke else None
    if cfg is None:
        from specpilot.runtime.config import ModelConfig

        cfg = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536,
                          num_layers=6, num_heads=8, num_kv_heads=4, head_dim=64,
                          rope_theta=1e6, max_position_embeddings=4096)
    dev = ARGS.device
    stock = random_transformer(cfg, dev, dt, seed=1, std=0.05)
    fused = random_transformer(cfg, dev, dt, seed=1, std=0.05, fused=dev == "cuda")
    prompts = prompts_for(8, 48, cfg.vocab_size, 0, ragged=True)
    N = 64
    ref, _ = gen(Engine(stock, cuda_graphs=False), prompts, N)
    margin = tie_margin(stock, [p + o for p, o in zip(prompts, ref)])
    dev_fused = deviation(fused, stock, [p + o for p, o in zip(prompts, ref)])
    rows = []

    def row(name, outs, gens=None, base=None):
        acc = (sum(g.metrics.accept_length for g in gens) / len(gens)) if gens else 1.0
        r = {"engine": name, "accept": round(acc, 2),
             "equal_to_base": sum(a == b for a, b in zip(outs, base or ref)),
             **force(stock, prompts, outs, margin)}
        rows.append(r)
        return r

    row("AR stock eager", ref)
    ar_g, _ = gen(Engine(fused, cuda_graphs=True), prompts, N)
    ar_e, _ = gen(Engine(fused, cuda_graphs=False), prompts, N)
    row("AR fused graph", ar_g)
    row("AR fused eager (base: graph)", ar_e, base=ar_g)
    ar_n, _ = gen(Engine(fused, cuda_graphs=True, pdl=False), prompts, N)
    row("AR fused graph, no PDL (base: graph)", ar_n, base=ar_g)
    # the oracle records on the spec engine's own path (graphs, k, batch): alpha = 1 must
    # accept every draft, alpha = 0 none; its records are that engine's greedy output
    full = {}
    for alpha, graphs in ((1.0, True), (0.0, True), (0.8, True), (0.8, False)):
        ora = OracleDrafter(fused, alpha)
        o, gs = gen(Engine(fused, ora, k=4, cuda_graphs=graphs), prompts, N)
        name = f"oracle a={alpha} {'graph' if graphs else 'eager'}"
        r = row(name + " (base: own records)", o, gs,
                base=[ora.records[tuple(p)][:N] for p in prompts])
        full[name] = sum(rows_full(g, 4, alpha) for g in gs)
        r["rows_at_expected_accept"] = full[name]
    from specpilot.runtime.drafters.ngram import NgramDrafter

    ng, gn = gen(Engine(fused, NgramDrafter(3, 1), k=4), prompts, N)
    row("ngram graph(verify)", ng, gn)
    single = [gen(Engine(fused), [p], N)[0][0] for p in prompts[:3]]
    row("AR graph, rows alone (base: batched)", single, base=ar_g[:3])
    ok = all(r["failures"] == 0 for r in rows)
    ok &= all(r["equal_to_base"] == len(prompts) for r in rows
              if "eager" in r["engine"] or "oracle" in r["engine"] or "PDL" in r["engine"])
    ok &= all(v == len(prompts) for k, v in full.items() if "a=1.0" in k or "a=0.0" in k)
    print(f"\n[check] {cfg.hidden_size}x{cfg.num_layers} {dt} ragged batch {len(prompts)}, "
          f"{N} new, tie margin {margin:.4f}, fused-vs-stock logit deviation {dev_fused:.4f}")
    print(f"{'engine':<44}{'acc':>6}{'==base':>8}{'mism':>6}{'ties':>6}{'fails':>6}"
          f"{'full/none acc rows':>20}")
    for r in rows:
        print(f"{r['engine']:<44}{r['accept']:>6}{r['equal_to_base']:>8}{r['mismatches']:>6}"
              f"{r['ties']:>6}{r['failures']:>6}{r.get('rows_at_expected_accept', ''):>20}")
    print("verdict:", "PASS" if ok else "FAIL")
    LOG["check"] = {"margin": margin, "fused_deviation": dev_fused, "rows": rows, "passed": ok}


@torch.inference_mode()
def gemm_ceiling(model, B: int) -> float:
    """ms of every GEMM of one decode step (the model's own weights) replayed in a graph."""
    x = torch.zeros(B, model.cfg.hidden_size, device=model.device, dtype=model.dtype)
    lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    bufs = {}
    for m in lins:
        bufs.setdefault(m.in_features, torch.zeros(B, m.in_features, device=x.device,
                                                   dtype=x.dtype))

    def step():
        for m in lins:
            torch.nn.functional.linear(bufs[m.in_features], m.weight)
    g = StepGraphs(model.device)
    g.run("gemms", step)
    return time_ms(lambda: g.run("gemms", step))


def bound_ms(preset: str, B: int, q: int, context: int) -> float | None:
    try:
        from specpilot.costmodel.hardware import get_hardware
        from specpilot.costmodel.roofline import forward_cost
        from specpilot.costmodel.spec import load_spec

        try:
            hw = get_hardware("h200", "reference")
        except Exception:  # noqa: BLE001 (no shipped reference: the datasheet numbers)
            hw = get_hardware("h200", "datasheet")
        return forward_cost(load_spec(preset), hw, B, q, context).bound_ms
    except Exception as e:  # noqa: BLE001 (reported, the measurement still stands)
        print(f"cost model unavailable: {e}")
        return None


def best_k(preset: str, B: int, alpha: float, draft: str) -> int:
    try:
        from specpilot.costmodel.hardware import get_hardware
        from specpilot.costmodel.spec import load_spec
        from specpilot.costmodel.speedup import best_k as bk

        hw = get_hardware("h200", "reference")
        kw = {"drafter_kind": "oracle"} if draft == "none" else {
            "drafter_kind": "draft",
            "drafter": load_spec({**DRAFT_PRESETS[draft], "torch_dtype": "bfloat16"})}
        return bk(load_spec(preset), hw, [B], list(range(1, 17)), alpha=alpha, **kw)[B].k
    except Exception as e:  # noqa: BLE001
        print(f"cost model best k unavailable ({e}): k=6")
        return 6


@torch.inference_mode()
def step_ms(model, B: int, T: int, kv_len: int, pos0: int = 150) -> float:
    model.setup_cache(B, max(kv_len, pos0 + T + 1))
    ids = torch.randint(0, model.cfg.vocab_size, (B, T), device=model.device)
    pos = (pos0 + torch.arange(T, device=model.device))[None].expand(B, T).contiguous()
    g = StepGraphs(model.device)

    def fn():
        return model.step(ids, pos, kv_len=kv_len)
    with pdl_scope(ARGS.pdl != "off"):
        g.run((B, T, kv_len), fn)
    return time_ms(lambda: g.run((B, T, kv_len), fn))


def pdl_scope(on: bool):
    """Programmatic dependent launch of the Triton kernels inside (as the engine's knob)."""
    if ARGS.device != "cuda":
        return contextlib.nullcontext()
    from specpilot.kernels import pdl

    return pdl.scope(on)


def step_rows(preset: str, batches: list[int]) -> tuple[int, ...]:
    """Rows the target's linears see per step in this run: each batch (decode) and, with
    the spec section, batch x (k + 1) for every k its runs use (verify)."""
    rows = set(batches)
    if want("spec"):
        names = ["none"] + [d.replace("eagle", f"eagle-{preset}")
                            for d in ARGS.drafts.split(",") if d]
        rows |= {B * (k + 1) for B in batches for d in names
                 for k, _, _ in spec_plan(preset, B, d)}
    return tuple(sorted(rows))


def apply_weights(model, preset: str, batches: list[int]) -> str:
    """--weights w12: W12 layers where the tuned table says W12 wins at every row count the
    run's steps put through them (`step_rows`, as `weights = w12` does for an engine).
    Returns a one-line summary."""
    if ARGS.weights != "w12" or ARGS.device != "cuda":
        return ""
    from specpilot.kernels.w12_linear import apply_w12

    rows = step_rows(preset, batches)
    rep = apply_w12(model, rows=rows)
    on = [d for d in rep.layers if d.applied]
    return (f"W12 weights (rows {','.join(map(str, rows))}): {len(on)} of {len(rep.layers)} "
            f"linears, linears' bytes {rep.bytes_after / max(rep.bytes_before, 1):.3f}x")


def engine_defaults(model, attention: bool) -> tuple[bool, object]:
    """The engine's other GPU defaults on a fused model, as the flags ask: the Triton
    attention kernel (with `attention`) and the Triton GEMV backend (--gemv, CUDA).
    Returns (attention kernel on, the GEMV report or None)."""
    on = attention and ARGS.attention == "triton" and getattr(
        model, "set_attention_kernel", lambda on: False)(True)
    if not (ARGS.gemv and ARGS.device == "cuda"):
        return on, None
    from specpilot.kernels.gemv_bf16 import apply_gemv

    return on, apply_gemv(model)


@torch.inference_mode()
def size_sections(preset: str, dt, batches: list[int], stock_check: bool) -> None:
    dev = ARGS.device
    t = time.perf_counter()
    model = random_transformer(preset, dev, dt, seed=0, fused=dev == "cuda")
    if ARGS.kernels:
        on = getattr(model, "set_fused_kernels", lambda on: False)(True)
        print(f"[{preset}] fused Triton elementwise kernels: {'on' if on else 'unavailable'}")
    w12 = apply_weights(model, preset, batches)
    if w12:
        print(f"[{preset}] {w12}")
    on, rep = engine_defaults(model, attention=ARGS.kernels)
    if ARGS.kernels:
        print(f"[{preset}] decode/verify attention: {'Triton kernel' if on else 'SDPA'}")
    if rep is not None:
        print(f"[{preset}] Triton bf16 GEMV backend: {len(rep.swapped)} linears swapped, "
              f"{len(rep.kept)} kept on cuBLAS")
    sync()
    res = LOG.setdefault(preset, {"build_s": round(time.perf_counter() - t, 1)})
    V = model.cfg.vocab_size
    n_new, plen = ARGS.new_tokens, 64
    ar = {}
    if want("ar"):
        from specpilot.kernels.w12_linear import W12Linear

        w12 = sum(m.in_features * m.out_features for m in model.modules()
                  if isinstance(m, W12Linear))  # its weights are buffers, not params
        print(f"\n[ar] {preset}: {(sum(p.numel() for p in model.parameters()) + w12) / 1e9:.2f} B "
              f"weights, {n_new} new tokens after {plen}-token prompts")
        print(f"{'batch':>5}{'tok/s':>9}{'step ms':>9}{'no-PDL tok/s':>13}{'gemm-graph ms':>15}"
              f"{'bound ms':>10}{'% of gemm':>10}{'% of bound':>11}")
    for B in batches if want("ar") else []:
        if left() < 20:
            break
        prompts = prompts_for(B, plen, V, B)
        modes = {"both": (False, True), "on": (True,), "off": (False,)}[ARGS.pdl]
        step = {}
        for on in modes:  # the same model and prompts, PDL off then on
            eng = Engine(model, pdl=on)
            gen(eng, prompts, 8)  # capture
            _, gens = gen(eng, prompts, n_new)
            m = gens[0].metrics
            step[on] = m.decode_s / m.verify_steps * 1e3
        ms = step[modes[-1]]
        off = B * 1e3 / step[False] if False in step else None
        # the cuBLAS ceiling is of the bf16 linears: none left in a W12 model
        ceil = gemm_ceiling(model, B) if ARGS.weights == "bf16" else float("nan")
        bnd = bound_ms(preset, B, 1, plen + n_new // 2)
        ar[B] = {"tok_s": B * 1e3 / ms, "step_ms": ms, "pdl": modes[-1], "no_pdl_tok_s": off,
                 "gemm_graph_ms": ceil, "bound_ms": bnd}
        print(f"{B:>5}{B * 1e3 / ms:>9.1f}{ms:>9.2f}{(off or 0):>13.1f}{ceil:>15.2f}"
              f"{(bnd or 0):>10.2f}{100 * ceil / ms:>9.0f}%{100 * (bnd or 0) / ms:>10.0f}%")
    res["ar"] = ar
    save()
    if want("ar") and stock_check and left() > 60 and dev == "cuda":
        # graph vs eager on the big model, 16 tokens
        p = prompts_for(1, plen, V, 5)
        a, _ = gen(Engine(model), p, 16)
        b, _ = gen(Engine(model, cuda_graphs=False), p, 16)
        res["graph_equals_eager_b1"] = a == b
        print(f"graph == eager tokens (b1, 16 new): {a == b}")

    ks = [2, 3, 4, 5, 6, 8, 10, 12, 16] if preset != "32b" else [2, 4, 8, 16]
    if want("verify"):
        print(f"\n[verify] {preset}: verify(k) step / AR step (graph replays, kv_len 256)")
        print(f"{'batch':>5}{'AR ms':>8}" + "".join(f"{'k=' + str(k):>7}" for k in ks))
    ver = {}
    for B in batches if want("verify") else []:
        if left() < 30:
            break
        base = step_ms(model, B, 1, 256)
        ratios = {k: step_ms(model, B, k + 1, 256) / base for k in ks}
        ver[B] = {"ar_ms": base, "ratio": ratios}
        print(f"{B:>5}{base:>8.2f}" + "".join(f"{ratios[k]:>7.2f}" for k in ks))
    if want("verify"):
        res["verify"] = ver
        save()
    if want("spec"):
        spec_section(model, preset, dt, batches, stock_check, ar)
    if preset == "8b" and want("attn") and left() > 30:
        print(f"\n[attn] {preset}: one decode step at batch 8 vs attended prefix kv_len")
        model.setup_cache(8, 8192)
        att = {}
        for kv in (256, 1024, 4096, 8192):
            att[kv] = step_ms(model, 8, 1, kv, pos0=kv - 10)  # all rows at the end
            print(f"kv_len {kv:>5}: {att[kv]:.2f} ms")
        res["attn_b8"] = att
        save()
    del model
    import gc

    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()


def expected_accept(alpha: float, k: int) -> float:
    """Tokens per verify step when each draft survives with probability alpha (capped at k)."""
    return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def alpha_hat(gens, k: int) -> tuple[float, float]:
    """Per-draft acceptance estimated from the accept histograms (accepted drafts over drafts
    judged: a step that accepted n < k judged n + 1) and its standard error."""
    acc = judged = 0
    for g in gens:
        for n, c in enumerate(g.metrics.accept_hist):
            acc += n * c
            judged += c * (n + (n < k))
    if not judged:
        return float("nan"), float("nan")
    a = acc / judged
    return a, (a * (1 - a) / judged) ** 0.5


def spec_plan(preset: str, B: int, dname: str) -> list[tuple[int, list[float], bool]]:
    """(k, alphas, draft_graphs) runs: the cost model's best k per alpha (every run at k =
    --k when given); at batch 1 also k = 4..8 at alpha 0.8 and, with a draft model, its
    steps run eagerly for comparison."""
    alphas = [0.6, 0.8, 0.9] if dname == "none" else [0.8]
    if preset == "32b" or ARGS.smoke:
        alphas = [0.8]
    if ARGS.k:
        runs = [(ARGS.k, alphas + [1.0] * (dname == "none"), True)]
        if B == 1 and dname != "none" and not dname.endswith("+kern"):
            runs.append((ARGS.k, [0.8], False))
        return runs
    plan: dict[int, list[float]] = {}
    for a in alphas:
        plan.setdefault(best_k(preset, B, a, dname.removesuffix("+kern")), []).append(a)
    if dname == "none":  # alpha = 1: every draft must be accepted (the records track the run)
        plan[best_k(preset, B, 0.8, dname)].append(1.0)
    if B == 1 and dname == "none" and not ARGS.smoke:
        for k in range(4, 9):
            if 0.8 not in plan.setdefault(k, []):
                plan[k].append(0.8)
    runs = [(k, sorted(v), True) for k, v in sorted(plan.items())]
    if B == 1 and dname != "none" and not dname.endswith("+kern"):
        runs.append((best_k(preset, B, 0.8, dname), [0.8], False))
    return runs


@torch.inference_mode()
def spec_section(model, preset: str, dt, batches: list[int], stock_check: bool, ar: dict) -> None:
    """Speculative decoding with the oracle drafter vs AR decoding of the same prompts, in
    the same run. Each (batch, draft, k) engine records its oracle continuation on its own
    path (first generate), then every alpha is timed on the warm engine."""
    dev = ARGS.device
    res = LOG[preset]
    V = model.cfg.vocab_size
    n_new, plen = ARGS.new_tokens, 64
    stock = None
    if stock_check and left() > 60:
        stock = random_transformer(preset, dev, dt, seed=0, fused=False)
    drafts: dict = {"none": None}
    names = ["tiny"] if ARGS.smoke else [d.replace("eagle", f"eagle-{preset}")
                                        for d in ARGS.drafts.split(",") if d]
    for dp in names:
        if left() < 60:
            break
        drafts[dp] = random_transformer(dp, dev, dt, seed=9, fused=model.fused)
        if dev == "cuda" and model.fused:  # the draft model with the fused Triton kernels
            dk = random_transformer(dp, dev, dt, seed=9, fused=True)
            if getattr(dk, "set_fused_kernels", lambda on: False)(True):
                engine_defaults(dk, attention=True)
                drafts[dp + "+kern"] = dk
    print(f"\n[spec] {preset}: oracle drafter vs AR of the same prompts ({n_new} new tokens); "
          f"k = {ARGS.k or 'cost model best'}; expect = (1-a^(k+1))/(1-a); a^ = measured per-draft rate")
    hdr = (f"{'batch':>5}{'draft':>10}{'graph':>6}{'alpha':>6}{'k':>3}{'accept':>7}{'expect':>7}"
           f"{'a^':>7}{'+-':>6}{'tok/s':>9}{'AR':>8}{'speedup':>8}{'step/AR':>8}{'==rec':>7}"
           f"{'fails':>6}{'ties':>5}")
    print(hdr)
    spec, costs, forced = [], {}, {}
    margin = None
    for B in batches:
        if left() < 30:
            break
        prompts = prompts_for(B, plen, V, B)
        eng_ar = Engine(model)
        gen(eng_ar, prompts, n_new)
        ar_outs, g_ar = gen(eng_ar, prompts, n_new)
        m = g_ar[0].metrics
        ar_ms = m.decode_s / m.verify_steps * 1e3
        ar_tok = B * 1e3 / ar_ms
        if stock is not None and margin is None:
            margin = tie_margin(stock, [p + o for p, o in zip(prompts, ar_outs)][:4])
        for dname, dm in drafts.items():
            c_ms = step_ms(dm, B, 1, 256) if dm is not None else 0.0
            costs[f"{B}/{dname}"] = {"draft_step_ms": c_ms, "ar_step_ms": ar_ms,
                                     "draft_over_ar": c_ms / ar_ms}
            if dname.endswith("+kern") and B != 1:
                continue
            for k, alphas, dg in spec_plan(preset, B, dname):
                if left() < 25:
                    break
                ora = OracleDrafter(model, alphas[0], draft_model=dm, draft_graphs=dg)
                eng = Engine(model, ora, k=k)
                t = time.perf_counter()
                gen(eng, prompts, n_new)  # records on this engine's path, captures graphs
                rec_s = time.perf_counter() - t
                recs = [ora.records[tuple(p)][:n_new] for p in prompts]
                for alpha in alphas:
                    ora.alpha = alpha
                    caps = eng.graph_stats.captures if eng.graph_stats else 0
                    outs, gens = gen(eng, prompts, n_new)
                    caps = (eng.graph_stats.captures if eng.graph_stats else 0) - caps
                    steps = max(g.metrics.verify_steps for g in gens)
                    dec = gens[0].metrics.decode_s
                    tok = sum(len(o) - 1 for o in outs) / dec
                    acc = sum(g.metrics.accept_length for g in gens) / len(gens)
                    ah, se = alpha_hat(gens, k)
                    r = {"batch": B, "draft": dname, "draft_graphs": dg, "alpha": alpha, "k": k,
                         "accept": acc, "expected_accept": expected_accept(alpha, k),
                         "alpha_hat": ah, "alpha_hat_se": se, "tok_s": tok, "ar_tok_s": ar_tok,
                         "speedup": tok / ar_tok, "step_ms": dec / steps * 1e3,
                         "step_over_ar": dec / steps * 1e3 / ar_ms,
                         "equal_to_records": sum(a == b for a, b in zip(outs, recs)),
                         "equal_to_ar_engine": sum(a == b for a, b in zip(outs, ar_outs)),
                         "record_s": rec_s, "captures_in_timed_run": caps}
                    if stock is not None:
                        key = tuple(map(tuple, outs))
                        if key not in forced:
                            forced[key] = force(stock, prompts, outs, margin)
                        r.update(forced[key])
                    spec.append(r)
                    print(f"{B:>5}{dname:>10}{'y' if dg else 'n':>6}{alpha:>6}{k:>3}{acc:>7.2f}"
                          f"{r['expected_accept']:>7.2f}{ah:>7.3f}{se:>6.3f}{tok:>9.1f}"
                          f"{ar_tok:>8.1f}{r['speedup']:>7.2f}x{r['step_over_ar']:>8.2f}"
                          f"{r['equal_to_records']:>4}/{B:<2}{r.get('failures', '-'):>6}"
                          f"{r.get('ties', '-'):>5}")
                    res["spec"] = spec
                    save()
    print("draft model step (graph replay, kv 256) vs AR step: " + ", ".join(
        f"b{k.split('/')[0]} {v['draft_step_ms']:.2f}/{v['ar_step_ms']:.2f} ms"
        for k, v in costs.items() if not k.endswith("/none")))
    res["spec"] = spec
    res["spec_costs"] = costs
    res["tie_margin"] = margin
    save()
    del stock




def main() -> int:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=270)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny presets: exercise the code")
    ap.add_argument("--sizes", default="8b,32b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma list of {','.join(SECTIONS)} (default all)")
    ap.add_argument("--kernels", action="store_true",
                    help="ar/verify/spec/attn targets use the fused Triton elementwise kernels")
    ap.add_argument("--gemv", action="store_true",
                    help="ar/verify/spec/attn targets use the Triton bf16 GEMV backend (knob "
                         "gemv = auto) where the tuned table says it beats cuBLAS")
    ap.add_argument("--attention", choices=("triton", "sdpa"), default="triton",
                    help="with --kernels: decode/verify attention through the Triton kernel "
                         "(knob attention = auto on CUDA) or SDPA")
    ap.add_argument("--drafts", default="0.6b,eagle",
                    help="spec: draft-model presets whose cost the oracle pays (eagle = the "
                         "EAGLE-class head of the target's size, eagle-8b / eagle-32b)")
    ap.add_argument("--weights", choices=("bf16", "w12"), default="bf16",
                    help="w12: W12 linears where the tuned table says they win at every row "
                         "count of the run's decode and speculative verify steps (not with "
                         "the verify section, whose k sweep would rule W12 out)")
    ap.add_argument("--k", type=int, default=0,
                    help="spec: every run at this k (default: the cost model's best per "
                         "alpha, and k = 4..8 at batch 1)")
    ap.add_argument("--pdl", choices=("on", "off", "both"), default="both",
                    help="programmatic dependent launch of the Triton kernels (ar: both = "
                         "off and on side by side; other sections: on unless off)")
    ap.add_argument("--peer", action="store_true", help="also run benchmarks/hf_peer.py (8b)")
    ARGS = ap.parse_args()
    ARGS.sections = [x.strip() for x in ARGS.sections.split(",") if x.strip()]
    os.makedirs(ARGS.out, exist_ok=True)
    ARGS.device = "cpu" if ARGS.smoke else "cuda"
    if ARGS.smoke:
        ARGS.sizes, ARGS.batches, ARGS.new_tokens = "tiny", "1,2", 16
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke on a CPU)")
        return 2
    dt = torch.float32 if ARGS.smoke else torch.bfloat16
    LOG.update({"device": torch.cuda.get_device_name() if ARGS.device == "cuda" else "cpu",
                "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                "command": " ".join(sys.argv)})
    print(f"{LOG['device']}, torch {LOG['torch']}, {LOG['date']}")
    batches = [int(b) for b in ARGS.batches.split(",")]
    bad = set(ARGS.sections) - set(SECTIONS)
    if bad:
        print(f"unknown --sections {sorted(bad)}: pick from {','.join(SECTIONS)}")
        return 2
    if ARGS.weights == "w12" and want("verify"):
        print("--weights w12 picks W12 layers for the row counts of the run's decode and spec "
              "steps, not for the verify section's k = 2..16 sweep: leave verify out of "
              "--sections")
        return 2
    if ARGS.k < 0 or ARGS.k > 16:
        print(f"--k must be 1..16 (0: the cost model's best), got {ARGS.k}")
        return 2
    if want("check"):
        check(dt)
        save()
    for i, preset in enumerate(ARGS.sizes.split(",")):
        if left() < 40:
            print(f"\n(time budget spent: {preset} skipped)")
            break
        size_sections(preset, dt, batches, stock_check=i == 0)
    if ARGS.peer and left() > 40:
        from benchmarks.hf_peer import run_peer

        LOG["peer"] = run_peer("tiny" if ARGS.smoke else "8b", ARGS.device, dt,
                               n_new=16 if ARGS.smoke else 64, budget_s=left() - 10)
        save()
    print(f"\ntotal {time.perf_counter() - T0:.0f} s")
    return 0 if LOG.get("check", {}).get("passed", not want("check")) else 1


if __name__ == "__main__":
    sys.exit(main())
