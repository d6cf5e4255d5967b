"""What the search starts from: prompts of a workload, the cost model's view, editable files.

Thin adapters over the workload registry (`specpilot.bench.workloads`) and the cost model
(`specpilot.costmodel`), so the loop sees plain lists and dicts. A workload may also be a
JSONL file (one object a line with `input_ids`, `prompt` or `messages`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..deployment import ROOT, Deployment
from ..engines import PACKAGE
from ..runtime.errors import SpecPilotError
from .checks import check_path


def _item_ids(item, tokenizer) -> list[int]:
    get = (lambda k: item.get(k)) if isinstance(item, dict) else (lambda k: getattr(item, k, None))
    for key in ("input_ids", "prompt_ids"):
        if get(key):
            return [int(t) for t in get(key)]
    if get("messages"):
        return tokenizer.encode(tokenizer.apply_chat_template(get("messages")))
    for key in ("prompt", "text"):
        if get(key):
            return tokenizer.encode(get(key))
    raise SpecPilotError(f"workload item {str(item)[:80]} has no input_ids, prompt or messages")


def load_prompts(name: str, tokenizer, limit: int | None = None) -> list[list[int]]:
    """Token ids of a workload's prompts (the first `limit` of them; None: all)."""
    if limit is not None and limit < 1:
        raise SpecPilotError(f"the prompt limit (--dev-limit) must be >= 1, got {limit}")
    if not name:
        raise SpecPilotError("the deployment names no workload: add [workloads] dev and gate")
    p = Path(name)
    p = p if p.is_absolute() else ROOT / p
    if name.endswith(".jsonl") and p.is_file():
        try:
            items = [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines()
                     if x.strip()]
        except (OSError, ValueError) as e:  # ValueError: not UTF-8, or a line not JSON
            raise SpecPilotError(f"cannot read workload {p} ({type(e).__name__}): give a "
                                 "JSONL file, one JSON object a line") from None
    else:
        try:
            from ..bench.workloads import load_workload
        except ImportError:
            raise SpecPilotError(f"workload {name!r}: not a JSONL file and no workload "
                                 "registry (specpilot.bench.workloads)") from None
        items = list(load_workload(name).items)
    prompts = [_item_ids(it, tokenizer) for it in items[:limit] if it is not None]
    if not prompts:
        raise SpecPilotError(f"workload {name!r} has no prompts")
    return prompts


def editable_files() -> dict[str, str]:
    """The runtime/kernel files a proposer may edit, by repo path."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        path = f.relative_to(PACKAGE.parent).as_posix()
        if "__pycache__" not in path and check_path(path) is None and f.stat().st_size:
            out[path] = f.read_text()
    return out


def cost_model(dep: Deployment, measured: dict) -> tuple[list[dict], dict[int, int], float]:
    """(gaps ranked by ms/token lost, predicted best k per batch size, floor in s/token).

    The floor is the cheapest a token can physically be on this device: the roofline
    bound of a verify step with free drafting and every draft accepted, at the best k and
    the largest batch. Without a usable cost model: the measured gaps alone, no floor."""
    try:
        return _roofline(dep, measured)
    except Exception as e:  # noqa: BLE001 - the search runs without a cost model
        gaps = [{"name": "cost model", "ms_per_token": 0.0,
                 "note": f"unavailable: {type(e).__name__}: {str(e)[:160]}"}]
    for name in ("stock", "ar"):
        tok_s = measured.get(f"{name}_tok_s")
        if tok_s:
            gaps.append({"name": f"{name} decode (measured)", "ms_per_token": 1000.0 / tok_s,
                         "note": f"{tok_s:.1f} tok/s"})
    return gaps, {}, 0.0


def _roofline(dep: Deployment, measured: dict) -> tuple[list[dict], dict[int, int], float]:
    from ..costmodel.gaps import Profile, rank_gaps
    from ..costmodel.hardware import get_hardware
    from ..costmodel.roofline import draft_cost, verify_step
    from ..costmodel.spec import load_spec
    from ..costmodel.speedup import best_k

    hw = get_hardware(dep.gpu or dep.device)
    spec = load_spec(dep.target)
    kind = dep.drafter.kind
    dspec = load_spec(dep.drafter.path) if dep.drafter.path else None
    stock = dep.stock_knobs()
    b = dep.batch_sizes[0]
    k = stock.k_for(b)
    bounds = {"verify": verify_step(spec, hw, b, k),
              "draft": draft_cost(kind, hw, b, k, drafter=dspec, target=spec)}
    tps = float(measured["stock_accept_length"])
    tok_s = float(measured["stock_tok_s_by_batch"][b])
    step_ms = 1000.0 * b * tps / tok_s
    # the share of the step spent proposing, timed by the evaluation worker (CPU); where it
    # is unknown (GPU: proposals run inside the step graph) the whole step counts as verify
    f = measured.get("stock_draft_fraction")
    draft_ms = step_ms * f if f is not None else 0.0
    rep = rank_gaps(Profile(batch_size=b, tokens_per_step=tps, draft_ms=draft_ms,
                            verify_ms=step_ms - draft_ms, k=k), bounds, hw)
    gaps = [{"name": g.name, "ms_per_token": g.gap_ms, "measured_ms": g.measured_ms,
             "bound_ms": g.bound_ms, "note": g.reason[:200], "flag": g.flag}
            for g in rep.gaps]
    hist = [float(x) for x in measured.get("stock_accept_hist") or []]
    ks = list(range(1, min(k, len(hist) - 1) + 1))
    pred = {}
    if ks:
        rows = best_k(spec, hw, list(dep.batch_sizes), ks, drafter_kind=kind, drafter=dspec,
                      histogram=hist)
        pred = {int(bb): int(r.k) for bb, r in rows.items()}
    floor_ms = min(verify_step(spec, hw, bb, kk).bound_ms / (bb * (kk + 1))
                   for bb in dep.batch_sizes for kk in range(1, 17))
    return gaps, pred, floor_ms / 1000.0
