"""The end of a search: gate check, pick the final engine, promote final/stock/ar, finish.

The search's front runners (one per family: drafter kind and threads) must pass token
forcing on the gate workload, which no proposer saw. Then Ray is stopped and the survivors
are re-timed with stock and ar, interleaved chunk by chunk (`interleave`), their outputs
token-forced again: the final engine is the fastest whose CI of the ratio to stock lies
above 1 in that confirmation, else `stock` itself. results.json records the
confirmation's speedups (dev set, 95% paired bootstrap CIs) and the verdicts on dev and
gate.
"""

from __future__ import annotations

import platform
from pathlib import Path

from .. import __version__
from ..engines import promote
from ..runtime.errors import SpecPilotError
from .evaluate import speedup


def _versions() -> dict:
    import torch

    return {"specpilot": __version__, "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine()}


def results_for(search, cid: str) -> dict:
    """results.json: the confirmation's numbers (interleaved with stock and ar, outputs
    token-forced), the gate verdict, and the in-search measurement for reference."""
    st = search.st
    spec = st.specs[cid]
    res, gate = st.confirm[cid], st.gate.get(spec.hash)
    found = st.results.get(spec.hash)
    out = {"engine": cid, "hash": spec.hash, "run_id": search.run_id,
           "deployment": search.dep.name, "tok_s": res.tok_s,
           "accept_length": res.accept_length, "batch_sizes": list(search.dep.batch_sizes),
           "tok_s_by_batch": res.tok_s_by_batch(),
           "measured": {"how": "interleaved with stock and ar, chunk by chunk",
                        "rounds": search.cfg.confirm_rounds},
           "dev": {"prompts": len(search.dev), "repeats": search.cfg.confirm_rounds,
                   "verdict": res.verdict, "verified": bool(res.verified)},
           "gate": {"prompts": len(search.gate_prompts),
                    "verdict": gate.gate_verdict if gate else {},
                    "verified": bool(gate and gate.gate_verified)},
           "search": {"tok_s": found.tok_s if found else None,
                      "repeats": search.cfg.repeats},
           "environment": _versions()}
    for ref in ("stock", "ar"):
        ratio, ci = speedup(st.confirm[ref], res, seed=search.cfg.seed)
        out[f"speedup_vs_{ref}"] = {"ratio": ratio, "ci95": list(ci)}
    return out


def family(knobs) -> tuple:
    """What makes two engines different kinds of engine: drafter kind and threads."""
    return ((knobs.drafter or "none").split(":")[0], knobs.threads)


def front_runners(search) -> list[str]:
    """The best verified candidate of each family, up to `confirm_top` of them, best first.
    The search's timings are noisy and share the machine with Ray, so the final choice is
    made by the confirmation among different kinds; a family is not left out for timing
    slower than stock in the search, where one noisy measurement can sink it (a tiny-cpu
    search once timed its only n-gram candidate at 0.84x stock, which the interleaved
    timing of the same engines put at 1.41x: docs/BENCHMARKS.md)."""
    st, cfg = search.st, search.cfg
    ranked = [cid for cid, s in st.specs.items()
              if cid not in ("stock", "ar") and s.hash in st.results
              and st.results[s.hash].accepted]
    ranked.sort(key=lambda c: -st.results[st.specs[c].hash].tok_s)
    if st.best in ranked:
        ranked.remove(st.best)
        ranked.insert(0, st.best)
    out, seen = [], set()
    for cid in ranked:
        f = family(st.specs[cid].knobs)
        if f not in seen and len(out) < cfg.confirm_top:
            seen.add(f)
            out.append(cid)
    return out


def finish(search) -> dict:
    st, cfg = search.st, search.cfg
    runners = front_runners(search)
    jobs = [(c, st.specs[c]) for c in ("stock", "ar", *runners)]
    search.evaluate(jobs, gate=True)
    passed = [c for c in runners if (g := st.gate[st.specs[c].hash]).ok
              and g.gate_verified and not g.reason]
    search.release()  # time the finalists on a machine without Ray's processes
    confirmed = search.confirm(["stock", "ar", *passed])
    stock = confirmed["stock"]
    if not stock.accepted:
        raise SpecPilotError(f"the stock engine fails the confirmation: {stock.reason}")
    wins = [c for c in passed if confirmed[c].accepted
            and speedup(stock, confirmed[c], seed=cfg.seed)[1][0] > 1.0]
    final = max(wins, key=lambda c: confirmed[c].tok_s) if wins else "stock"
    summary = results_for(search, final)
    root = Path(cfg.engines_root) if cfg.engines_root else None
    if cfg.promote:
        for name, cid in (("final", final), ("stock", "stock"), ("ar", "ar")):
            spec = st.specs[cid]
            spec = type(spec)(spec.deployment, name, spec.knobs, spec.overlay, spec.parents,
                              search.run_id, spec.backend)
            path = promote(spec, results_for(search, cid), root)
            search.log("promote", cid, spec.parents, engine=name, path=str(path),
                       hash=spec.hash)
    search.log("run_finished", final, (), best=final,
               speedup_vs_stock=summary["speedup_vs_stock"]["ratio"],
               ci95=summary["speedup_vs_stock"]["ci95"],
               speedup_vs_ar=summary["speedup_vs_ar"], evaluations=st.evaluations,
               gate_verified=summary["gate"]["verified"], confirmed=list(confirmed),
               wall_s=__import__("time").time() - search.t0)
    return summary
