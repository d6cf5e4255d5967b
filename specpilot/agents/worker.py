"""The candidate side of an evaluation: `python -m specpilot.agents.worker REQ.json OUT.json`.

Started with a build dir first on PYTHONPATH, so `specpilot.runtime` here is the
candidate's code. It builds the engine, warms it up, generates the dev prompts `repeats`
times (timing each batch with a wall clock around the whole `generate` call, the device
synchronised on both sides) and, when asked, the gate prompts once; then writes every
output and timing as JSON. It never judges anything: the parent, running stock code,
verifies the outputs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _generate(engine, prompts, batch, max_new_tokens, device, hist=None):
    outs, times, steps, tokens = [], [], [], []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        _sync(device)
        t0 = time.perf_counter()
        gens = engine.generate(chunk, max_new_tokens=max_new_tokens)
        _sync(device)
        times.append(time.perf_counter() - t0)
        outs += [{"prompt_ids": g.prompt_ids, "output_ids": g.output_ids,
                  "finish_reason": g.finish_reason} for g in gens]
        steps.append(sum(g.metrics.verify_steps for g in gens))
        for g in gens if hist is not None else ():
            h = g.metrics.accept_hist
            hist.extend([0] * (len(h) - len(hist)))
            for i, c in enumerate(h):
                hist[i] += c
        tokens.append(sum(len(g.output_ids) for g in gens))
    return outs, times, steps, tokens


def run(req: dict) -> dict:
    import specpilot
    from specpilot.runtime.factory import build_engine
    from specpilot.runtime.knobs import Knobs

    pkg = str(Path(specpilot.__file__).resolve().parent)
    want = req.get("package")
    if want and Path(want).resolve() != Path(pkg):
        return {"ok": False, "error": f"imported specpilot from {pkg}, not the build {want}"}
    knobs = Knobs.from_dict(req["knobs"])
    batches, device = [int(b) for b in req["batch_sizes"]], req["device"]
    engine, _ = build_engine(req["target"], knobs, device, req["dtype"], batches[0])
    prompts, mnt = req["prompts"], int(req["max_new_tokens"])
    engines = {}
    for b in batches:  # one engine per batch size: k may differ (k_per_batch)
        engines[b] = engine if b == batches[0] else type(engine)(
            engine.target, engine.drafter, knobs.k_for(b) if engine.drafter else 0,
            engine.eos_ids)
        _generate(engines[b], prompts[:b], b, min(mnt, 8), device)  # warm-up
    reps, hist, chunk_batch = [], [], []
    for r in range(int(req["repeats"])):
        rep = {"outputs": [], "times": [], "steps": [], "tokens": []}
        for b in batches:
            outs, times, steps, tokens = _generate(engines[b], prompts, b, mnt, device,
                                                   hist if r == 0 else None)
            for key, val in zip(("outputs", "times", "steps", "tokens"),
                                (outs, times, steps, tokens)):
                rep[key] += val
            if r == 0:
                chunk_batch += [b] * len(times)
        reps.append(rep)
    first = reps[0]["outputs"]
    stable = all(r["outputs"] == first for r in reps[1:])
    res = {"ok": True, "package": pkg, "outputs": first, "stable": stable,
           "times": [r["times"] for r in reps], "steps": reps[0]["steps"],
           "tokens": reps[0]["tokens"], "chunk_batch": chunk_batch, "accept_hist": hist}
    if req.get("gate_prompts"):
        b = batches[-1]
        res["gate_outputs"] = _generate(engines[b], req["gate_prompts"], b, mnt, device)[0]
    return res


def _exit_with_parent() -> None:
    """Die when the evaluating process dies (a killed search leaves no orphans)."""
    import os
    import threading

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str]) -> int:
    _exit_with_parent()
    req = json.loads(Path(argv[0]).read_text())
    res = run(req)
    Path(argv[1]).write_text(json.dumps(res))
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
