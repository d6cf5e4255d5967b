"""End to end: AR decode with bf16 cuBLAS, bf16 + the Triton GEMV backend, and W12 weights,
on one random-weight model in one device call (run from the repo root):

    PYTHONPATH=. python3 benchmarks/w12_e2e.py [--preset 8b] [--batches 1,8] [--kernels]
        [--release on|off] [--out DIR]
    .venv/bin/python benchmarks/w12_e2e.py --smoke     # CPU, tiny model: exercises the code

For each batch size: tokens/s of the engine (CUDA graphs, fused projections) with

- `cublas`: every linear through `F.linear` (the stock engine);
- `gemv`:   `apply_gemv` (knob gemv = "auto") with the device's tuned table, extended here by
            tuning the model's linear shapes the table lacks at batch 1 (`--tune`);
- `w12`:    `apply_w12(min_gain=0)`: every eligible linear in W12 form, whatever it costs.

With `--kernels` every engine also runs the fused Triton norm/RoPE+cache/silu kernels and the
Triton attention kernel (the engine's GPU defaults; PDL is on either way).

Every engine's greedy output is checked by tie-aware token forcing against the bf16 model
(no cache, one row at a time; margin = 2 x the stock model's own cached-vs-uncached logit
noise), and the logits of each model are compared with the bf16 model's on the same tokens
(no-cache: W12 must be bit-identical there; cached decode: accumulation order only). Resident weight memory is `torch.cuda.memory_allocated` after the model is built,
bf16 vs after the W12 swap. Prints a table; writes w12_e2e.json (and the tuned records)
under --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_perf import force, noise, prompts_for

from specpilot.kernels import tuning, w12_wgmma
from specpilot.kernels.gemv_bf16 import apply_gemv
from specpilot.kernels.w12_linear import apply_w12
from specpilot.kernels.w12_triton import KernelConfig
from specpilot.runtime.generate import Engine
from specpilot.runtime.random_model import random_transformer

LOG: dict = {}


def save(out: str) -> None:
    """LOG as out/w12_e2e.json (written whole, then renamed)."""
    path = os.path.join(out, "w12_e2e.json")
    with open(path + ".tmp", "w") as f:
        json.dump(LOG, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def allocated(dev: str) -> int:
    if dev != "cuda":
        return 0
    torch.cuda.synchronize()
    gc.collect()
    return torch.cuda.memory_allocated()


def linear_shapes(model) -> list[tuple[int, int]]:
    return sorted({(m.out_features, m.in_features) for m in model.modules()
                   if isinstance(m, torch.nn.Linear)})


B1_CONFIGS = [KernelConfig(bm=1, bn=4, bk=1024, variant=0), KernelConfig(bm=1, bn=4, bk=1024),
              KernelConfig(bm=1, bn=8, bk=512, variant=0), KernelConfig(bm=1, bn=8, bk=1024,
                                                                        warps=8)]


def tune_missing(model, table: tuning.TunedTable, out: str) -> list[dict]:
    """Tune the Triton bf16 GEMV (a small grid) and time cuBLAS at batch 1 on the model's
    linear shapes that the table lacks; the records go into `table`."""
    recs = []
    for n, k in linear_shapes(model):
        if table.median_us("bf16", n, k, 1) and table.median_us("cublas", n, k, 1):
            continue
        g = torch.Generator(device="cuda").manual_seed(n + k)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        rot = max(1, -(-200_000_000 // (n * k * 2)))  # >= 200 MB of weights: past the L2
        probs = tuning.linear_problems(w, 1, rotations=rot)
        for kern, cfgs in (("cublas", B1_CONFIGS[:1]), ("bf16", B1_CONFIGS)):
            for r in tuning.tune((n, k), 1, cfgs, tuning.graph_timer, problem=probs[kern]):
                table.add(r)
                recs.append(r.to_dict())
                print(f"tuned {kern:6} {n}x{k} b1 {r.config['bn']}/{r.config['bk']}/"
                      f"v{r.config['variant']}/w{r.config['warps']}: {r.median_us:.1f} us "
                      f"({r.tbps:.2f} TB/s) {'ok' if r.correct else r.note}", flush=True)
        del w, probs
        torch.cuda.empty_cache()
    with open(os.path.join(out, "w12_e2e_tuned.json"), "w") as f:
        json.dump(recs, f, indent=1)
    return recs


@torch.inference_mode()
def logit_diffs(model, stock, rows: list[list[int]], tail: int = 16) -> dict:
    """max |logits(model) - logits(stock)| over the same tokens: a no-cache pass (every
    linear sees > 32 rows: W12 unpacks its exact bf16 weights, so this should be 0) and a
    prefill + `tail` one-token cached decode steps (the skinny kernels the engine runs)."""
    full = dec = 0.0
    for r in rows[:2]:
        ids = torch.tensor([r], device=stock.device)
        pos = torch.arange(len(r), device=stock.device)[None]
        a, _ = model(ids, pos, use_cache=False)
        b, _ = stock(ids, pos, use_cache=False)
        full = max(full, float((a.float() - b.float()).abs().max()))
        steps = []
        for m in (model, stock):
            m.setup_cache(1, len(r) + 8)
            m(ids[:, :-tail], pos[:, :-tail])
            steps.append(torch.cat([m(ids[:, t:t + 1], pos[:, t:t + 1], kv_len=t + 1)[0][0]
                                    for t in range(len(r) - tail, len(r))]).float())
        dec = max(dec, float((steps[0] - steps[1]).abs().max()))
    return {"nocache_max_diff": full, "decode_max_diff": dec}


@torch.inference_mode()
def measure(model, batches: list[int], n_new: int, plen: int, name: str,
            kernels: bool = False) -> dict:
    """tok/s and outputs per batch size with the engine as the model is now; with
    `kernels`, the engine's other GPU defaults too (the fused Triton norm/RoPE+cache/silu
    kernels and the Triton attention kernel), switched off again afterwards so that the
    logit comparisons run the same torch ops on every model."""
    res = {}
    V = model.cfg.vocab_size
    if kernels:
        on = model.set_fused_kernels(True), model.set_attention_kernel(True)
        print(f"[{name}] fused kernels {'on' if on[0] else 'off'}, attention kernel "
              f"{'on' if on[1] else 'off'}", flush=True)
    for B in batches:
        prompts = prompts_for(B, plen, V, B)
        eng = Engine(model)
        eng.generate(prompts, 8, ignore_eos=True)  # capture
        gens = eng.generate(prompts, n_new, ignore_eos=True)
        m = gens[0].metrics
        ms = m.decode_s / m.verify_steps * 1e3
        res[B] = {"tok_s": B * 1e3 / ms, "step_ms": ms, "prompts": prompts,
                  "outputs": [g.output_ids for g in gens]}
        print(f"[{name}] batch {B}: {B * 1e3 / ms:.1f} tok/s ({ms:.2f} ms/step)", flush=True)
    if kernels:
        model.set_fused_kernels(False)
        model.set_attention_kernel(False)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="8b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--no-tune", action="store_true", help="use the shipped table as it is")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, fp32")
    ap.add_argument("--kernels", action="store_true",
                    help="decode with the engine's fused Triton kernels and attention kernel")
    ap.add_argument("--release", choices=("on", "off"), default="on",
                    help="the wgmma W12 kernel releases the next kernel after its loop "
                    "(w12_wgmma.RELEASE_DEPENDENTS; off: as before the twenty-ninth run)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)  # before the run, not after it
    w12_wgmma.RELEASE_DEPENDENTS = args.release == "on"
    dev = "cpu" if args.smoke else "cuda"
    dt = "float32" if args.smoke else "bfloat16"
    preset = "tiny" if args.smoke else args.preset
    batches = [int(b) for b in args.batches.split(",")]
    n_new = 8 if args.smoke else args.new_tokens
    t0 = time.perf_counter()
    LOG.update(preset=preset, batches=batches, new_tokens=n_new, prompt_len=args.prompt_len,
               kernels=args.kernels, release=args.release,
               device=torch.cuda.get_device_name() if dev == "cuda" else "cpu")

    base = allocated(dev)
    stock = random_transformer(preset, dev, dt, seed=0, fused=dev == "cuda")
    mem_bf16 = allocated(dev) - base
    LOG["memory"] = {"bf16_bytes": mem_bf16}
    rows = {"cublas": measure(stock, batches, n_new, args.prompt_len, "cublas", args.kernels)}
    ref = rows["cublas"]
    margin = {B: 2 * noise(stock, [p + o for p, o in zip(r["prompts"], r["outputs"])])
              for B, r in ref.items()}
    LOG["margin"] = margin

    if dev == "cuda":
        table = tuning.load_table(torch.cuda.get_device_name())
        LOG["tuned"] = [] if args.no_tune else tune_missing(stock, table, args.out)
        gemv = random_transformer(preset, dev, dt, seed=0, fused=True)
        rep = apply_gemv(gemv, table)
        LOG["gemv_swapped"] = rep.swapped
        print(f"gemv backend: {len(rep.swapped)} layers swapped, {len(rep.kept)} kept",
              flush=True)
        rows["gemv"] = measure(gemv, batches, n_new, args.prompt_len, "gemv", args.kernels)
    else:
        table = gemv = None

    base = allocated(dev)
    w12 = random_transformer(preset, dev, "bfloat16" if dev == "cuda" else dt, seed=0,
                             fused=dev == "cuda")
    t = time.perf_counter()
    wrep = apply_w12(w12, min_gain=0.0, table=table)
    LOG["w12_pack_s"] = time.perf_counter() - t
    mem_w12 = allocated(dev) - base
    LOG["memory"].update(w12_bytes=mem_w12, ratio=mem_w12 / max(1, mem_bf16),
                         w12_layers=wrep.applied, weight_bytes_before=wrep.bytes_before,
                         weight_bytes_after=wrep.bytes_after)
    if dev == "cuda":
        rows["w12"] = measure(w12, batches, n_new, args.prompt_len, "w12", args.kernels)

    r1 = ref[batches[0]]
    check_rows = [p + o for p, o in zip(r1["prompts"], r1["outputs"])]
    LOG["logit_scale"] = float(stock(torch.tensor([check_rows[0]], device=stock.device),
                                     torch.arange(len(check_rows[0]), device=stock.device)[None],
                                     use_cache=False)[0].float().std())
    LOG["logit_diffs"] = {name: logit_diffs(m, stock, check_rows)
                          for name, m in (("gemv", gemv), ("w12", w12)) if m is not None
                          and name in rows}
    LOG["rows"] = {}
    for name, res in rows.items():
        for B, r in res.items():
            f = force(stock, r["prompts"], r["outputs"], margin[B])
            same = sum(a == b for a, b in zip(r["outputs"], ref[B]["outputs"]))
            LOG["rows"][f"{name}:b{B}"] = {
                "engine": name, "batch": B, "tok_s": r["tok_s"], "step_ms": r["step_ms"],
                "vs_cublas": r["tok_s"] / ref[B]["tok_s"], "equal_rows": same, **f}
    LOG["wall_s"] = time.perf_counter() - t0
    save(args.out)

    print(f"\nW12 e2e, {preset} random Qwen3 ({LOG['device']}), {n_new} new tokens after "
          f"{args.prompt_len}-token prompts, CUDA graphs; tie margins "
          + ", ".join(f"b{B} {m:.3f}" for B, m in margin.items()))
    print(f"{'engine':<8}{'batch':>6}{'tok/s':>9}{'ms/step':>9}{'x cuBLAS':>9}{'==rows':>8}"
          f"{'ties':>6}{'fails':>6}")
    for r in LOG["rows"].values():
        print(f"{r['engine']:<8}{r['batch']:>6}{r['tok_s']:>9.1f}{r['step_ms']:>9.2f}"
              f"{r['vs_cublas']:>9.3f}{r['equal_rows']:>8}{r['ties']:>6}{r['failures']:>6}")
    m = LOG["memory"]
    print(f"resident weights: bf16 {m['bf16_bytes'] / 1e9:.2f} GB, W12 {m['w12_bytes'] / 1e9:.2f}"
          f" GB (x{m['ratio']:.3f}; {m['w12_layers']} W12 layers; linear weights "
          f"{m['weight_bytes_before'] / 1e9:.2f} -> {m['weight_bytes_after'] / 1e9:.2f} GB)")
    print(f"logit std {LOG['logit_scale']:.2f}; max |logit - bf16 cuBLAS logit| on the same "
          "tokens: " + "; ".join(f"{n} no-cache {d['nocache_max_diff']:.4g}, decode "
                                 f"{d['decode_max_diff']:.4g}"
                                 for n, d in LOG["logit_diffs"].items()))
    fails = sum(r["failures"] for r in LOG["rows"].values())
    print("verdict:", "PASS" if fails == 0 else f"FAIL ({fails} forced failures)")
    return 0 if fails == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
