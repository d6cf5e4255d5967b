"""`specpilot compare score`: a sanity check of answers, not an accuracy benchmark.

Each request of a bench result is scored by what its workload item's `reference` holds:
- `{"answer": X}`: the last `\\boxed{...}` in the output must equal X (after trimming
  spaces, `$` and a final period; numbers compare as numbers);
- `{"tests": CODE[, "entry_point": NAME]}`: the program (the output's first fenced code
  block, else prompt + output) followed by the tests must exit 0 in the sandbox
  (`sandbox.run_python`: temp dir, CPU/memory/time limits, no network), with
  `check(NAME)` appended when the tests define `check`;
- a plain string (e.g. the true continuation of a code prompt): the output's first
  non-empty line must equal the reference's.
Items without a reference are not scored. A lossless engine scores what stock scores;
a difference is a red flag worth a look.
"""

from __future__ import annotations

import json
import re

from ..runtime.errors import SpecPilotError
from .compare import dataset_group, load_result
from .sandbox import run_python

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} in `text` (nested braces allowed)."""
    at = text.rfind("\\boxed{")
    if at < 0:
        return None
    i, depth = at + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def _norm(s: str) -> str:
    s = s.strip().strip("$").strip().rstrip(".").replace(" ", "")
    try:
        return repr(float(s.replace(",", "")))
    except ValueError:
        return s


def _first_line(s: str) -> str:
    return next((x.strip() for x in s.splitlines() if x.strip()), "")


def program(prompt: str, output: str) -> str:
    m = _FENCE.search(output)
    return m.group(1) if m else prompt + output


def score_request(req: dict, timeout: float = 10.0) -> dict | None:
    """{kind, correct, why} for one bench request, or None when it has no reference."""
    ref = req.get("reference")
    out = req.get("output_text")
    if ref is None:
        return None
    if out is None:
        raise SpecPilotError("the bench result has no output_text: re-run bench with a model")
    if isinstance(ref, dict) and "answer" in ref:
        got = last_boxed(out)
        ok = got is not None and _norm(got) == _norm(str(ref["answer"]))
        return {"kind": "boxed", "correct": ok, "why": "no \\boxed{}" if got is None else got}
    if isinstance(ref, dict) and "tests" in ref:
        code = program(req.get("prompt", ""), out) + "\n\n" + ref["tests"] + "\n"
        if ref.get("entry_point") and "def check" in ref["tests"]:
            code += f"\ncheck({ref['entry_point']})\n"
        r = run_python(code, timeout=timeout)
        why = "timed out" if r.timed_out else (r.stderr.strip().splitlines() or [""])[-1][:200]
        return {"kind": "tests", "correct": r.ok, "why": "" if r.ok else why}
    if isinstance(ref, str):
        ok = _first_line(out) == _first_line(ref) != ""
        return {"kind": "next-line", "correct": ok, "why": ""}
    return None


def score_result(result: dict, timeout: float = 10.0) -> dict:
    items, per = {}, {}
    for q in result["requests"]:
        s = score_request(q, timeout)
        if s is None:
            continue
        items[q["id"]] = s
        d = per.setdefault(dataset_group(q.get("dataset", "")), {"scored": 0, "correct": 0, "kinds": []})
        d["scored"] += 1
        d["correct"] += int(s["correct"])
        if s["kind"] not in d["kinds"]:
            d["kinds"].append(s["kind"])
    for d in per.values():
        d["accuracy"] = d["correct"] / d["scored"]
    return {"per_dataset": per, "items": items}


def compare_score(final: dict, stock: dict, timeout: float = 10.0) -> dict:
    hf, hs = final["settings"]["workload"]["hash"], stock["settings"]["workload"]["hash"]
    if hf != hs:
        raise SpecPilotError(f"cannot compare scores: the results are of different workloads "
                             f"({final['settings']['workload']['name']} {hf[:12]} vs "
                             f"{stock['settings']['workload']['name']} {hs[:12]})")
    f, s = score_result(final, timeout), score_result(stock, timeout)
    if not f["items"]:
        raise SpecPilotError("no request has a reference to score against: this workload "
                             "has no answers or tests (score needs items with `reference`)")
    rows = {}
    for ds in sorted(set(f["per_dataset"]) | set(s["per_dataset"])):
        a, b = f["per_dataset"].get(ds), s["per_dataset"].get(ds)
        rows[ds] = {"final": a, "stock": b,
                    "difference": (a["accuracy"] if a else 0.0) - (b["accuracy"] if b else 0.0)}
    differ = sorted(i for i in f["items"]
                    if i in s["items"] and f["items"][i]["correct"] != s["items"][i]["correct"])
    return {"workload": final["settings"]["workload"], "per_dataset": rows,
            "items_that_differ": differ, "final_items": f["items"], "stock_items": s["items"]}


def score_command(final: str, stock: str, as_json: bool) -> dict:
    c = compare_score(load_result(final), load_result(stock))
    if as_json:
        print(json.dumps(c, indent=1))
        return c
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"score: {c['workload']['name']} (a sanity check, not a benchmark)")
    for col in ("dataset", "kind", "final", "stock", "difference"):
        t.add_column(col)
    for ds, r in c["per_dataset"].items():
        a, b = r["final"], r["stock"]
        kinds = ",".join((a or b)["kinds"])
        t.add_row(ds, kinds, f"{a['correct']}/{a['scored']}" if a else "-",
                  f"{b['correct']}/{b['scored']}" if b else "-", f"{r['difference']:+.1%}")
    Console().print(t)
    if c["items_that_differ"]:
        print(f"items scored differently: {', '.join(c['items_that_differ'][:20])}")
    return c
