"""The candidate side of an evaluation: `python -m specpilot.agents.worker REQ.json OUT.json`.

Started with a build dir first on PYTHONPATH, so `specpilot.runtime` (and the bench code
it imports) is the candidate's copy. It times nothing itself: it builds the bench's
`LocalRunner` and calls `run_bench` once per batch size of the deployment (a warm-up
batch, then `repeats` passes with per-request timings), then, when asked, generates the
gate prompts once. It writes the bench results and gate outputs as JSON and never judges
anything: the parent, running stock code, verifies the outputs and compares the timings.

`python -m specpilot.agents.worker --serve REQ.json` keeps the engine loaded and answers
one JSON line per command read from stdin (`{"prompts": [...], "max_new_tokens": n}` ->
`{"ok": true, "results": [...]}` with the runner's per-request outputs and times), so a
parent can time several engines chunk by chunk in alternation (`agents.interleave`).
Replies go to the original stdout only; anything the engine prints goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def count_accepts(runner) -> list[int]:
    """A histogram (steps that accepted i drafts) fed by every generate call of `runner`'s
    engine from now on; the runner's own timing is untouched."""
    hist: list[int] = []
    engine = runner.engine
    generate = engine.generate

    def counted(*args, **kwargs):
        gens = generate(*args, **kwargs)
        for g in gens:
            h = g.metrics.accept_hist or []
            hist.extend([0] * (len(h) - len(hist)))
            for i, c in enumerate(h):
                hist[i] += c
        return gens

    engine.generate = counted
    return hist


def time_drafts(runner) -> dict:
    """On a CPU, the wall time of the drafter's proposals and of the generate calls they
    belong to, from now on ({"draft_s", "generate_s"}, summed): the draft/verify split the
    cost model's gap table needs. On a GPU proposals run inside captured step graphs, so
    nothing is timed there (the dict stays empty)."""
    acc: dict = {}
    engine, drafter = runner.engine, runner.engine.drafter
    if drafter is None or runner.device != "cpu":
        return acc
    acc.update(draft_s=0.0, generate_s=0.0)

    def timed(fn, key: str):
        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - t
        return call

    drafter.propose = timed(drafter.propose, "draft_s")
    engine.generate = timed(engine.generate, "generate_s")
    return acc


def outputs(runner, prompts: list[list[int]], batch: int, max_new_tokens: int) -> list[dict]:
    """Untimed generation of `prompts` in batches: records for token forcing."""
    out = []
    for s in range(0, len(prompts), batch):
        chunk = prompts[s:s + batch]
        for p, r in zip(chunk, runner.generate(chunk, max_new_tokens)):
            out.append({"prompt_ids": p, "output_ids": r["output_ids"],
                        "finish_reason": r["finish_reason"]})
    return out


def run(req: dict) -> dict:
    import specpilot
    from specpilot.bench.bench import PromptSet, run_bench
    from specpilot.bench.runners import LocalRunner
    from specpilot.runtime.knobs import Knobs

    pkg = str(Path(specpilot.__file__).resolve().parent)
    want = req.get("package")
    if want and Path(want).resolve() != Path(pkg):
        return {"ok": False, "error": f"imported specpilot from {pkg}, not the build {want}"}
    batches, mnt = [int(b) for b in req["batch_sizes"]], int(req["max_new_tokens"])
    runner = LocalRunner(req["target"], Knobs.from_dict(req["knobs"]), req["device"],
                         req["dtype"], tuple(batches))
    split = time_drafts(runner)
    hist = count_accepts(runner)
    res: dict = {"ok": True, "package": pkg, "bench": {}, "accept_hist": hist, "split": split}
    if req["prompts"]:
        dev = PromptSet("dev", "", [{"id": str(i), "prompt_ids": p}
                                    for i, p in enumerate(req["prompts"])])
        for b in batches:
            res["bench"][str(b)] = run_bench(runner, dev, None, b, mnt,
                                             repeats=int(req["repeats"]))
    if req.get("gate_prompts"):
        res["gate_outputs"] = outputs(runner, req["gate_prompts"], batches[-1], mnt)
    return res


def serve(req: dict, proto) -> int:
    """Answer timing commands from stdin on `proto` until EOF or `{"quit": true}`."""
    from specpilot.bench.runners import LocalRunner
    from specpilot.runtime.knobs import Knobs

    runner = LocalRunner(req["target"], Knobs.from_dict(req["knobs"]), req["device"],
                         req["dtype"], tuple(int(b) for b in req.get("batch_sizes", [1])))
    proto.write(json.dumps({"ok": True, "ready": True}) + "\n")
    proto.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        try:
            out = {"ok": True, "results": runner.generate(cmd["prompts"],
                                                          int(cmd["max_new_tokens"]))}
        except Exception as e:  # noqa: BLE001 - reported to the parent, which rejects
            out = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        proto.write(json.dumps(out) + "\n")
        proto.flush()
        if not out["ok"]:
            return 1
    return 0


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
    if argv and argv[0] == "--serve":
        import os

        proto = os.fdopen(os.dup(1), "w")  # the replies' channel ...
        os.dup2(2, 1)  # ... and whatever the engine prints goes to the log
        return serve(json.loads(Path(argv[1]).read_text()), proto)
    req = json.loads(Path(argv[0]).read_text())
    res = run(req)
    Path(argv[1]).write_text(json.dumps(res))
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
