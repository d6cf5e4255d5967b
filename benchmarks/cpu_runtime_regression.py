"""tiny-cpu: this tree's runtime against an earlier commit's, engine by engine, on this CPU.

    .venv/bin/python benchmarks/cpu_runtime_regression.py --base REV [--limit 8] [--rounds 2]

For each engine (stock, draft model, ngram, ar with the deployment's knobs) it builds the
current engine, and a copy of it whose `specpilot/runtime` and `specpilot/kernels` come from
`git archive REV`, so both use this tree's harness. All are timed interleaved chunk by
chunk (`agents.interleave`) on the dev workload; prints tok/s, the paired-bootstrap ratio
new / old with its CI95, and whether the outputs are identical. Not a test: numbers go to
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from specpilot.agents.evaluate import speedup
from specpilot.agents.inputs import load_prompts
from specpilot.agents.interleave import Entrant, interleaved
from specpilot.deployment import ROOT, load_deployment
from specpilot.engines import EngineSpec, build
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.tokenizer import Tokenizer

RUNTIME = ("specpilot/runtime", "specpilot/kernels")


def old_runtime(rev: str, into: Path) -> Path:
    tar = subprocess.run(["git", "archive", rev, *RUNTIME], cwd=ROOT, capture_output=True,
                         check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit whose runtime is compared")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    dep = load_deployment("tiny-cpu")
    dev = load_prompts(dep.dev_workload, Tokenizer(dep.target), args.limit)
    stock = dep.stock_knobs()
    engines = {"stock": stock, "draft": stock.with_(drafter=f"draft:{ROOT}/models/tiny-pycode/draft"),
               "ngram": stock.with_(drafter="ngram"), "ar": stock.with_(drafter=None)}
    old_fields = None
    with tempfile.TemporaryDirectory() as tmp:
        src = old_runtime(args.base, Path(tmp) / "src")
        entrants = []
        for name, knobs in engines.items():
            spec = EngineSpec(dep.name, name, knobs)
            new = build(spec)
            old = Path(tmp) / name
            shutil.copytree(new.path, old)
            for d in RUNTIME:
                shutil.rmtree(old / d)
                shutil.copytree(src / d, old / d)
            if old_fields is None:  # knobs the old runtime knows (newer ones are dropped)
                text = (src / "specpilot/runtime/knobs.py").read_text()
                old_fields = {f for f in Knobs.__dataclass_fields__ if f"    {f}:" in text}
            kd = {k: v for k, v in knobs.to_dict().items() if k in old_fields}
            entrants += [Entrant(f"old-{name}", "old", str(old), kd),
                         Entrant(f"new-{name}", spec.hash, str(new.path), knobs.to_dict())]
        t = interleaved(entrants, dep.target, dep.device, dep.dtype, dev,
                        list(dep.batch_sizes), dep.max_new_tokens, rounds=args.rounds)
    rows = {}
    print(f"runtime of {args.base} (old) vs this tree (new), tiny-cpu dev x {args.limit}, "
          f"batch {dep.batch_sizes}, {args.rounds} interleaved rounds")
    for name in engines:
        o, n = t[f"old-{name}"], t[f"new-{name}"]
        if not (o.result.ok and n.result.ok):
            print(f"{name:6} failed: {o.result.reason or n.result.reason}")
            continue
        r, ci = speedup(o.result, n.result)
        same = o.records == n.records
        rows[name] = {"old_tok_s": o.result.tok_s, "new_tok_s": n.result.tok_s,
                      "new_vs_old": r, "ci95": list(ci), "same_outputs": same}
        print(f"{name:6} old {o.result.tok_s:7.1f}  new {n.result.tok_s:7.1f} tok/s  new/old "
              f"{r:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]  same outputs: {same}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
