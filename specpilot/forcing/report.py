"""Reading outputs files and showing verdicts: a rich table by default, JSON on request.

An outputs file is a JSONL of records ({"prompt_ids", "output_ids", optional "id" and
"max_new_tokens"}), a JSON list of such records, or a bench result JSON (its `requests`,
with max_new_tokens taken from its settings).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..runtime.errors import SpecPilotError
from .verify import KINDS, Verdict


def load_records(path: str | Path) -> tuple[list[dict], int | None]:
    """(records, max_new_tokens or None) from a JSONL / JSON list / bench result file."""
    p = Path(path)
    if not p.is_file():
        raise SpecPilotError(f"no outputs file {p}: give a JSONL of records or a bench result")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecPilotError(f"cannot read outputs file {p} ({getattr(e, 'strerror', None) or e}):"
                             " give a readable JSONL of records or a bench result") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and "requests" in data:
        settings = data.get("settings", {})
        if not isinstance(data["requests"], list) or not isinstance(settings, dict):
            raise SpecPilotError(f"{p} is not a bench result: its requests must be a list and "
                                 "its settings an object")
        return list(data["requests"]), settings.get("max_new_tokens")
    if isinstance(data, list):
        return data, None
    if isinstance(data, dict):
        return [data], None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SpecPilotError(f"{p}:{n} is not valid JSON ({e.msg}): one record a line")
    return records, None


def print_verdict(v: Verdict, console=None, limit: int = 20) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    n = len(v.per_request)
    status = "[bold green]PASSED[/]" if v.passed else "[bold red]FAILED[/]"
    console.print(f"{status}  {n} request(s), {v.checked} positions checked, "
                  f"{len(v.mismatches)} mismatch(es), {len(v.ties)} tie(s)  "
                  f"[dim]reference: {v.reference}; tie margin {v.margin:g} ({v.margin_source})[/]")
    for w in v.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    rows = sorted(v.mismatches + v.ties, key=lambda m: (m.request, m.position))
    if not rows:
        return
    t = Table(title="mismatches and ties", show_lines=False)
    for col in ("request", "id", "pos", "kind", "expected", "got", "margin", "context"):
        t.add_column(col, overflow="fold")
    for m in rows[:limit]:
        exp = "end" if m.expected is None else f"{m.expected} {m.expected_text!r}"
        got = "end" if m.got is None else f"{m.got} {m.got_text!r}" if m.got_text else str(m.got)
        t.add_row(str(m.request), m.id or "", str(m.position), m.kind, exp, got,
                  "" if m.margin is None else f"{m.margin:.4g}", repr(m.context[-40:]))
    console.print(t)
    if len(rows) > limit:
        console.print(f"... and {len(rows) - limit} more (use --json for all)")
    kinds = sorted({m.kind for m in rows})
    console.print("[dim]" + "; ".join(f"{k}: {KINDS[k]}" for k in kinds) + "[/]")


def _check_options(max_new_tokens: int | None, tie_margin: float | None, device: str,
                   dtype: str) -> None:
    """Bad options are input errors, not verdicts: reject them before any work."""
    from ..deployment import DTYPES, check_device
    from ..runtime.errors import check_cuda

    if max_new_tokens is not None and max_new_tokens < 1:
        raise SpecPilotError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if tie_margin is not None and not tie_margin >= 0:
        raise SpecPilotError(f"--tie-margin must be >= 0, got {tie_margin}")
    check_device(device)
    if dtype not in DTYPES:
        raise SpecPilotError(f"unknown dtype {dtype!r}: use {', '.join(DTYPES)}")
    check_cuda(device)


def verify_command(model: str | None, outputs: str | None, server: str | None,
                   max_new_tokens: int | None, as_json: bool, calibrate: bool, device: str,
                   dtype: str, tie_margin: float | None) -> int:
    """The body of `specpilot verify`; returns the exit code (0 passed, 1 failed)."""
    if model is None and server is None:
        raise SpecPilotError("give --model DIR (the stock target), or --server URL")
    _check_options(max_new_tokens, tie_margin, device, dtype)
    if model is not None:
        from ..runtime.errors import check_dir

        check_dir(model, "checkpoint directory", "give --model the stock target's HF checkpoint")
    if calibrate:
        from .calibrate import calibrate as run

        if model is None:
            raise SpecPilotError("--calibrate needs --model DIR")
        rec = run(model, device, dtype)
        print(json.dumps(rec, indent=1) if as_json else
              f"tie margin for {rec['device_name']}/{dtype}: {rec['margin']:.3g} "
              f"(max |logit diff| {rec['max_abs_diff']:.3g} x {rec['factor']:g}) -> {rec['path']}")
        return 0
    if outputs is None:
        raise SpecPilotError("give --outputs FILE (a JSONL of records or a bench result)")
    from .reference import LocalReference, ServerReference
    from .verify import verify

    records, file_mnt = load_records(outputs)
    mnt = max_new_tokens if max_new_tokens is not None else file_mnt
    ref = (ServerReference(server, model_dir=model) if server
           else LocalReference(model, device=device, dtype=dtype))
    with ref:
        v = verify(records, ref, max_new_tokens=mnt, margin=tie_margin)
    if as_json:
        print(json.dumps(v.to_json(), indent=1))
    else:
        print_verdict(v)
    return 0 if v.passed else 1
