"""The end of a search: gate check, pick the final engine, promote final/stock/ar, finish.

The best engine of the search must also pass token forcing on the gate workload (which no
proposer saw); if it does not, the next best verified engine that is faster than stock is
tried, and `stock` itself is the last resort. results.json records the speedups (dev set,
95% paired bootstrap CIs) and the forcing verdicts on dev and gate.
"""

from __future__ import annotations

import platform
from pathlib import Path

from .. import __version__
from ..engines import promote
from .evaluate import speedup


def _versions() -> dict:
    import torch

    return {"specpilot": __version__, "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine()}


def results_for(search, cid: str) -> dict:
    st = search.st
    spec = st.specs[cid]
    res, gate = st.results[spec.hash], st.gate.get(spec.hash)
    out = {"engine": cid, "hash": spec.hash, "run_id": search.run_id,
           "deployment": search.dep.name, "tok_s": res.tok_s,
           "accept_length": res.accept_length, "batch_sizes": list(search.dep.batch_sizes),
           "tok_s_by_batch": res.tok_s_by_batch(),
           "dev": {"prompts": len(search.dev), "repeats": search.cfg.repeats,
                   "verdict": res.verdict, "verified": bool(res.verified)},
           "gate": {"prompts": len(search.gate_prompts),
                    "verdict": gate.gate_verdict if gate else {},
                    "verified": bool(gate and gate.gate_verified)},
           "environment": _versions()}
    for ref in ("stock", "ar"):
        base = st.results[st.specs[ref].hash]
        ratio, ci = speedup(base, res, seed=search.cfg.seed)
        out[f"speedup_vs_{ref}"] = {"ratio": ratio, "ci95": list(ci)}
    return out


def finish(search) -> dict:
    st, cfg = search.st, search.cfg
    stock = st.results[st.specs["stock"].hash]
    ranked = [cid for cid, s in st.specs.items()
              if cid not in ("stock", "ar") and s.hash in st.results
              and st.results[s.hash].accepted
              and speedup(stock, st.results[s.hash], seed=cfg.seed)[1][0] > 1.0]
    ranked.sort(key=lambda c: -st.results[st.specs[c].hash].tok_s)
    if st.best in ranked:
        ranked.remove(st.best)
        ranked.insert(0, st.best)
    # the front runner's gate check runs beside stock's and ar's; the others only if needed
    first = [(cid, st.specs[cid]) for cid in ranked[:1]]
    search.evaluate([("stock", st.specs["stock"]), ("ar", st.specs["ar"]), *first], gate=True)
    final = "stock"
    for cid in ranked:
        search.evaluate([(cid, st.specs[cid])], gate=True)  # cached for the front runner
        g = st.gate[st.specs[cid].hash]
        if g.ok and g.gate_verified and not g.reason:
            final = cid
            break
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
               gate_verified=summary["gate"]["verified"],
               wall_s=__import__("time").time() - search.t0)
    return summary
