"""The offline proposer: a seeded neighbourhood search over the knobs the runtime exposes.

Each round it proposes single-knob moves away from the current best engine: the other
drafters the deployment allows, the cost model's predicted best k and k +- 1/2 (per batch
size when the deployment has several), n-gram sizes for the n-gram drafter, the thread
count on CPU and, on a GPU, the engine's switches (CUDA graphs, fused projections and
kernels, the GEMV backend, W12 weights, the attention bucket and backend, PDL). k never goes
above what the drafter can propose (a block drafter's block_size - 1, from its
config.json): such moves would only fail. Moves already tried
(same resulting knobs) are skipped; the order puts the cost model's suggestions and the
largest gaps first, then a seeded shuffle. Same inputs and seed, same proposals.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from ..deployment import ROOT
from .candidate import Candidate, ProposalContext

K_MAX = 16  # the largest k the heuristic tries for drafters without a limit of their own


def k_limit(drafter: str | None) -> int:
    """The most drafts per step `drafter` can propose: block_size - 1 for a block drafter
    (read from its config.json), else K_MAX."""
    if not drafter or not drafter.startswith("block:"):
        return K_MAX
    path = Path(drafter.partition(":")[2])
    path = path if path.is_absolute() else ROOT / path
    try:
        return max(1, min(K_MAX, int(json.loads((path / "config.json").read_text())
                                     ["block_size"]) - 1))
    except (OSError, ValueError, KeyError, TypeError):
        return K_MAX


def _key(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True, default=str)


def moves(ctx: ProposalContext) -> list[tuple[int, dict, str]]:
    """(priority, knob changes, rationale) for every single-knob move from the best."""
    best = ctx.best_knobs
    out: list[tuple[int, dict, str]] = []
    gap_names = " ".join(str(g.get("name", "")) for g in ctx.gaps[:3]).lower()
    k = int(best.get("k", 4))
    per = {int(b): int(v) for b, v in (best.get("k_per_batch") or {}).items()}
    for spec in dict.fromkeys([*ctx.drafters, "ngram"]):
        if spec != best.get("drafter"):
            change: dict = {"drafter": spec}
            top = k_limit(spec)
            if k > top:
                change["k"] = top
            if any(v > top for v in per.values()):
                change["k_per_batch"] = {b: min(v, top) for b, v in per.items()}
            out.append((1, change, f"try drafter {spec.rsplit('/', 1)[-1]}"))
    if best.get("drafter"):
        top = k_limit(best.get("drafter"))
        for b in ctx.batch_sizes:
            cur = per.get(b, k)
            pred = ctx.best_k.get(b)
            cands = [(0, pred, "the cost model's predicted best k")] if pred else []
            cands += [(2, cur + d, f"k {cur}->{cur + d}") for d in (1, -1, 2, -2)]
            for prio, newk, why in cands:
                if newk is None or not 1 <= newk <= top or newk == cur:
                    continue
                if len(ctx.batch_sizes) == 1:
                    out.append((prio, {"k": newk}, why))
                else:
                    out.append((prio, {"k_per_batch": {**per, b: newk}}, f"batch {b}: {why}"))
        if best.get("drafter") == "ngram":
            lo, hi = int(best.get("ngram_min", 1)), int(best.get("ngram_max", 3))
            for nmin, nmax in ((lo, hi + 1), (lo, hi - 1), (lo + 1, hi), (lo - 1, hi)):
                if 1 <= nmin <= nmax <= 6 and (nmin, nmax) != (lo, hi):
                    out.append((2, {"ngram_min": nmin, "ngram_max": nmax},
                                f"n-gram sizes {nmin}..{nmax}"))
    if ctx.device == "cuda":
        out += gpu_moves(best, "overhead" in gap_names or "launch" in gap_names)
    if ctx.device == "cpu":
        cur = int(best.get("threads", 0))
        for t in sorted({1, 2, os.cpu_count() or 1}):
            if t != cur:
                prio = 1 if "overhead" in gap_names or "cpu" in gap_names else 3
                out.append((prio, {"threads": t}, f"{t} torch threads"))
    return out


# the GPU engine's switches, each with its alternatives (the runtime's knobs.py)
GPU_SWITCHES = {"cuda_graphs": (True, False), "fused_proj": (True, False),
                "fused_kernels": (True, False), "gemv": ("auto", "cublas"),
                "weights": ("bf16", "w12"), "kv_bucket": (128, 256, 512),
                "attention": ("auto", "sdpa"), "pdl": (True, False)}


def gpu_moves(best: dict, overhead_gap: bool) -> list[tuple[int, dict, str]]:
    """Flip one GPU switch (graphs, fusions, GEMV backend, W12 weights, attention bucket
    and backend, PDL): after drafter and k, unless the gap report blames launch/step overhead."""
    prio = 1 if overhead_gap else 3
    out = []
    for knob, values in GPU_SWITCHES.items():
        cur = best.get(knob)
        for v in values:
            if cur is not None and v != cur:
                out.append((prio, {knob: v}, f"{knob} = {v}"))
    return out


class HeuristicAgent:
    name = "heuristic"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def propose(self, ctx: ProposalContext) -> tuple[list[Candidate], list[dict]]:
        """Up to ctx.n candidates, and notes for the trace (none here)."""
        rng = random.Random(f"{self.seed}:{ctx.round}")
        tried = {_key(h["knobs_full"]) for h in ctx.history if h.get("knobs_full")}
        tried.add(_key(ctx.best_knobs))
        ranked = moves(ctx)
        rng.shuffle(ranked)
        ranked.sort(key=lambda m: m[0])  # stable: the shuffle breaks ties only
        out: list[Candidate] = []
        for _, change, why in ranked:
            full = {**ctx.best_knobs, **change}
            if "k_per_batch" in change:
                full["k_per_batch"] = {str(b): v for b, v in change["k_per_batch"].items()}
            key = _key(full)
            if key in tried:
                continue
            tried.add(key)
            out.append(Candidate(id="", agent=self.name, knobs=change, rationale=why,
                                 parents=(ctx.best_id,), round=ctx.round))
            if len(out) >= ctx.n:
                break
        return out, []
