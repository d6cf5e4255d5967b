"""`specpilot compare speed`: speedups between bench results, with paired bootstrap CIs.

Results are compared only when they measured the same thing: the same workload (hash),
batch, max_new_tokens, limit, dtype and device; otherwise `compare` refuses with a one-line
error. Requests are paired by id. Each ratio is total throughput a / total throughput b
with a 95% interval from a seeded paired bootstrap over requests (10,000 resamples),
overall and per dataset. Output consistency against `ar` (exact-match rate, first
divergence) is informational: losslessness is token forcing's verdict, not this.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ..runtime.errors import SpecPilotError
from .bench import FORMAT
from .stats import paired_bootstrap_ratio, throughput

MUST_MATCH = (("settings", "workload", "hash"), ("settings", "batch"),
              ("settings", "max_new_tokens"), ("settings", "limit"), ("settings", "dtype"),
              ("environment", "device"))


def dataset_group(name: str) -> str:
    """The dataset a request counts under: its name up to the first '/' (stdlib/x.py -> stdlib)."""
    return (name or "").split("/", 1)[0]


def load_result(path: str | Path) -> dict:
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 JSON"
        raise SpecPilotError(f"cannot read bench result {p} ({why}): give a file written by "
                             "`specpilot bench --out`") from None
    wrong = _malformed(d)
    if wrong:
        raise SpecPilotError(f"{p} is not a bench result ({wrong}): make one with "
                             "`specpilot bench --out`")
    d["_path"] = str(p)
    return d


def _malformed(d) -> str:
    """What is missing from (or impossible in) a bench result for compare, or "" if
    nothing is: another format, a request without a positive, finite time."""
    if not isinstance(d, dict):
        return "not a JSON object"
    fmt = d.get("format")
    if fmt != FORMAT:
        return f"format is {fmt!r}, not {FORMAT!r}" if "format" in d else "no format"
    for key in ("environment", "settings", "totals"):
        if not isinstance(d.get(key), dict):
            return f"no {key}"
    if not isinstance(d["settings"].get("workload"), dict):
        return "no settings.workload"
    reqs = d.get("requests")
    if not isinstance(reqs, list) or not reqs:
        return "no requests"
    for n, q in enumerate(reqs):
        if not isinstance(q, dict) or "id" not in q:
            return f"request {n} has no id"
        for key, kind in (("time_s", (int, float)), ("new_tokens", int), ("output_ids", list)):
            if not isinstance(q.get(key), kind) or isinstance(q.get(key), bool):
                return f"request {q['id']!r} has no {key}"
        if not (math.isfinite(q["time_s"]) and q["time_s"] > 0):
            return (f"request {q['id']!r} has time_s {q['time_s']!r}, not a positive "
                    "number of seconds")
        if q["new_tokens"] < 0:
            return f"request {q['id']!r} has new_tokens {q['new_tokens']}, fewer than 0"
    return ""


def _field(d: dict, keys: tuple[str, ...]):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def check_comparable(results: dict[str, dict]) -> None:
    """Raise a one-line SpecPilotError unless all results measured the same thing."""
    (n0, r0), *rest = results.items()
    for keys in MUST_MATCH:
        for n, r in rest:
            a, b = _field(r0, keys), _field(r, keys)
            if a != b:
                what = ".".join(keys[1:]) if keys[0] == "settings" else keys[-1]
                raise SpecPilotError(f"cannot compare {n} with {n0}: {what} differs ({b!r} vs "
                                     f"{a!r}); bench both with the same workload and settings")
    ids0 = [q["id"] for q in r0["requests"]]
    for n, r in rest:
        if sorted(q["id"] for q in r["requests"]) != sorted(ids0):
            raise SpecPilotError(f"cannot compare {n} with {n0}: they hold different requests")


def _ratio(a: dict, b: dict, ids: list[str], n: int, seed: int) -> dict:
    qa, qb = [a[i] for i in ids], [b[i] for i in ids]
    ta, tb = [q["time_s"] for q in qa], [q["time_s"] for q in qb]
    ka, kb = [q["new_tokens"] for q in qa], [q["new_tokens"] for q in qb]
    ratio, lo, hi = paired_bootstrap_ratio(ta, tb, ka, kb, n=n, seed=seed)
    return {"ratio": ratio, "ci95": [lo, hi], "tok_s": [throughput(ka, ta), throughput(kb, tb)],
            "requests": len(ids)}


def consistency(base: dict, other: dict, ids: list[str]) -> dict:
    """Exact-match rate of outputs against `base`, and where differing outputs diverge."""
    firsts = []
    for i in ids:
        x, y = base[i]["output_ids"], other[i]["output_ids"]
        if x != y:
            firsts.append(next((j for j, (s, t) in enumerate(zip(x, y)) if s != t),
                               min(len(x), len(y))))
    return {"exact_match": 1 - len(firsts) / len(ids), "diverged": len(firsts),
            "first_divergence_min": min(firsts) if firsts else None,
            "first_divergence_median": statistics.median(firsts) if firsts else None}


def compare_speed(ar: dict, stock: dict, final: dict | None = None, n: int = 10_000,
                  seed: int = 0) -> dict:
    """Pairwise speedups (final_vs_stock, final_vs_ar, stock_vs_ar) with CIs."""
    named = {"ar": ar, "stock": stock, **({"final": final} if final else {})}
    check_comparable(named)
    by = {k: {q["id"]: q for q in r["requests"]} for k, r in named.items()}
    ids = [q["id"] for q in ar["requests"]]
    pairs = [("final", "stock"), ("final", "ar"), ("stock", "ar")] if final else [("stock", "ar")]
    out: dict = {"workload": ar["settings"]["workload"], "device": ar["environment"]["device"],
                 "batch": ar["settings"]["batch"],
                 "max_new_tokens": ar["settings"]["max_new_tokens"], "resamples": n,
                 "seed": seed, "files": {k: r.get("_path", "") for k, r in named.items()}}
    group = {i: dataset_group(by["ar"][i].get("dataset", "")) for i in ids}
    datasets = sorted(set(group.values()))
    for a, b in pairs:
        row = _ratio(by[a], by[b], ids, n, seed)
        row["per_dataset"] = {
            ds: _ratio(by[a], by[b], [i for i in ids if group[i] == ds],
                       n, seed) for ds in datasets} if len(datasets) > 1 else {}
        out[f"{a}_vs_{b}"] = row
    out["accept_length"] = {k: r["totals"].get("accept_length") for k, r in named.items()}
    out["tokens_per_s"] = {k: r["totals"].get("tokens_per_s") for k, r in named.items()}
    out["consistency_vs_ar"] = {k: consistency(by["ar"], by[k], ids) for k in named if k != "ar"}
    return out


def print_speed(c: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title=f"speed: {c['workload']['name']} on {c['device']}, batch {c['batch']}, "
                    f"{c['max_new_tokens']} new tokens")
    for col in ("comparison", "dataset", "ratio", "95% CI", "tok/s (a)", "tok/s (b)", "n"):
        t.add_column(col, justify="right" if col not in ("comparison", "dataset") else "left")
    for key in ("final_vs_stock", "final_vs_ar", "stock_vs_ar"):
        if key not in c:
            continue
        rows = [("all", c[key])] + list(c[key]["per_dataset"].items())
        for ds, r in rows:
            t.add_row(key if ds == "all" else "", ds, f"{r['ratio']:.3f}x",
                      f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]", f"{r['tok_s'][0]:.1f}",
                      f"{r['tok_s'][1]:.1f}", str(r["requests"]))
    console.print(t)
    acc = ", ".join(f"{k} {v:.2f}" for k, v in c["accept_length"].items() if v is not None)
    console.print(f"acceptance length: {acc}")
    for k, v in c["consistency_vs_ar"].items():
        console.print(f"{k} vs ar outputs: {v['exact_match']:.1%} identical"
                      + (f", first divergence at token {v['first_divergence_min']} (min)"
                         if v["diverged"] else "") + " [dim](informational)[/]")


def speed_command(ar: str, stock: str, final: str | None, as_json: bool) -> dict:
    c = compare_speed(load_result(ar), load_result(stock),
                      load_result(final) if final else None)
    if as_json:
        print(json.dumps(c, indent=1))
    else:
        print_speed(c)
    return c
