"""Wall-clock tokens/s of greedy AR vs each drafter of the tiny zoo on this CPU (batch 1).

    .venv/bin/python benchmarks/tiny_cpu_speed.py --limit 12 --repeats 3

Engines are timed in interleaved rounds (AR, then every drafter config, repeated), so slow
phases of a shared machine hit all of them alike; the table shows the median round. Every
speculative output is checked against AR's (lossless). Not a test: numbers go to
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from specpilot.bench.workloads import load_workload
from specpilot.runtime.factory import build_engine
from specpilot.runtime.knobs import Knobs

ZOO = Path(__file__).resolve().parents[1] / "models" / "tiny-pycode"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="tiny-pycode-dev")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="ar,block:3,block:4,block:5,block:7,draft:2,draft:3,"
                                         "draft:4,ngram:4")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    engines = {}
    for c in a.configs.split(","):
        kind, _, k = c.partition(":")
        spec = None if kind == "ar" else ("ngram" if kind == "ngram" else f"{kind}:{ZOO / kind}")
        engines[c], tok = build_engine(ZOO / "target", Knobs(drafter=spec, k=int(k or 4),
                                                              threads=a.threads))
    wl = load_workload(a.workload, tok)
    prompts = wl.prompt_ids(tok)[: a.limit]
    for e in engines.values():  # warm-up
        e.generate(prompts[:1], 16)
    times = {c: [] for c in engines}
    outs, acc = {}, {}
    for _ in range(a.repeats):
        for c, e in engines.items():
            t0 = time.perf_counter()
            gens = [e.generate([p], a.max_new_tokens)[0] for p in prompts]
            times[c].append(time.perf_counter() - t0)
            outs[c] = [g.output_ids for g in gens]
            acc[c] = sum(g.metrics.accept_length for g in gens) / len(gens)
    n_tok = sum(len(o) for o in outs["ar"])
    ar_s = statistics.median(times["ar"])
    rows = []
    print(f"{wl.name} ({wl.hash[:12]}), {len(prompts)} prompts, {a.max_new_tokens} new tokens,"
          f" batch 1, {a.threads} threads, {a.repeats} rounds, {platform.processor() or ''}")
    print(f"{'engine':10} {'accept':>7} {'tok/s':>8} {'speedup':>8} {'lossless':>8}")
    for c in engines:
        s = statistics.median(times[c])
        lossless = outs[c] == outs["ar"]
        rows.append({"engine": c, "accept_length": acc[c], "tok_per_s": n_tok / s,
                     "speedup": ar_s / s, "lossless": lossless, "seconds": times[c]})
        print(f"{c:10} {acc[c]:7.2f} {n_tok / s:8.1f} {ar_s / s:7.2f}x {lossless!s:>8}")
    if a.json:
        Path(a.json).write_text(json.dumps({"workload": wl.name, "hash": wl.hash,
                                            "date": time.strftime("%Y-%m-%d"), "rows": rows},
                                           indent=1))


if __name__ == "__main__":
    main()
