"""Run traces: `runs/<run-id>/trace.jsonl`, one JSON event a line, appended and flushed.

Every event carries `event`, `time`, `candidate` and `parents`. A run killed at any moment
leaves at worst a torn last line, which `read_events` skips, so a resumed run sees every
event that was fully written. `candidates/<id>/` holds each candidate's knobs and overlay.
Secrets never reach a trace: `scrub` masks anything that looks like an API key.
`list_runs`, `show_run` and `write_report` are the `specpilot runs` commands.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .deployment import ROOT
from .runtime.errors import SpecPilotError

EVENTS = ("run_started", "gaps", "proposal", "build", "bench", "verify", "merge", "confirm",
          "promote", "run_finished")
_SECRET = re.compile(r"(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|(?i:bearer)\s+\S{8,})")
_SECRET_KEYS = ("api_key", "apikey", "authorization", "x-api-key")


def runs_dir() -> Path:
    """`$SPECPILOT_RUNS`, or `runs/` in the project root."""
    return Path(os.environ.get("SPECPILOT_RUNS", ROOT / "runs"))


def new_run_id(prefix: str = "") -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{prefix}{stamp}-{os.urandom(2).hex()}"


def scrub(obj):
    """A copy of `obj` with API-key-like strings and secret-named fields masked."""
    if isinstance(obj, dict):
        return {k: ("***" if str(k).lower() in _SECRET_KEYS else scrub(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v) for v in obj]
    if isinstance(obj, str):
        out = _SECRET.sub("***", obj)
        for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
            key = os.environ.get(name)
            if key and len(key) >= 6:
                out = out.replace(key, "***")
        return out
    return obj


class Trace:
    """Append-only event log of one run."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "trace.jsonl"
        self._repair()

    def _repair(self) -> None:
        """A torn last line (kill -9 mid-write) gets a newline so new events start clean."""
        if self.path.is_file() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                last = f.read(1)
            if last != b"\n":
                with open(self.path, "ab") as f:
                    f.write(b"\n")

    def append(self, event: str, candidate: str | None = None, parents=(), **data) -> dict:
        if event not in EVENTS:
            raise ValueError(f"unknown trace event {event!r}")
        rec = {"event": event, "time": time.time(), "candidate": candidate,
               "parents": list(parents), **scrub(data)}
        line = json.dumps(rec, sort_keys=False, default=str)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        return rec

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in read_events(self.path) if kind is None or e["event"] == kind]

    def save_candidate(self, cid: str, record: dict, overlay: dict[str, str]) -> Path:
        d = self.dir / "candidates" / cid
        (d / "overlay").mkdir(parents=True, exist_ok=True)
        (d / "candidate.json").write_text(json.dumps(scrub(record), indent=1, default=str))
        for path, text in overlay.items():
            f = d / "overlay" / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        return d


def read_events(path: Path) -> list[dict]:
    out = []
    if not Path(path).is_file():
        return out
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn line from a killed run
    return out


def open_run(run_id: str) -> Trace:
    d = runs_dir() / run_id
    if not (d / "trace.jsonl").is_file():
        raise SpecPilotError(f"no run {run_id!r} in {runs_dir()}: see `specpilot runs list`")
    return Trace(d)


# --- summaries -------------------------------------------------------------------------

@dataclass
class RunSummary:
    run_id: str
    deployment: str
    started: float
    finished: bool
    evaluations: int
    best: str
    best_speedup: float | None
    ci95: tuple[float, float] | None


def candidate_table(events: list[dict]) -> dict[str, dict]:
    """Per candidate id: proposal, build, bench and verify facts merged (in trace order)."""
    rows: dict[str, dict] = {}
    for e in events:
        cid = e.get("candidate")
        if not cid or e["event"] not in ("proposal", "build", "bench", "verify", "merge"):
            continue
        r = rows.setdefault(cid, {"id": cid, "parents": e.get("parents", []), "status": ""})
        if e["event"] in ("proposal", "merge"):
            r.update(agent=e.get("agent", "merge"), summary=e.get("summary", ""),
                     rationale=e.get("rationale", ""), round=e.get("round"))
            if e.get("rejected"):
                r["status"], r["reason"] = "rejected", e["rejected"]
        elif e["event"] == "build":
            r["hash"] = e.get("hash")
            if not e.get("ok", True):
                r["status"], r["reason"] = "rejected", e.get("reason", "")
        elif e["event"] == "bench":
            r.update(tok_s=e.get("tok_s"), accept_length=e.get("accept_length"),
                     speedup_vs_stock=e.get("speedup_vs_stock"), ci95=e.get("ci95"))
            if not e.get("ok", True):
                r["status"], r["reason"] = "failed", e.get("reason", "")
        elif e["event"] == "verify" and e.get("set", "dev") == "dev":
            r["verified"] = e.get("passed")
            r["status"] = e.get("status", r["status"])
            if e.get("reason"):
                r["reason"] = e["reason"]
    return rows


def confirmations(events: list[dict]) -> list[dict]:
    """The confirmation rows (stock, ar and the front runners, timed interleaved)."""
    return [e for e in events if e["event"] == "confirm"]


def _speed(sp, ci) -> str:
    return f"{sp:.2f} [{ci[0]:.2f},{ci[1]:.2f}]" if sp and ci else "-"


def summarize(run_dir: Path) -> RunSummary:
    ev = read_events(run_dir / "trace.jsonl")
    start = next((e for e in ev if e["event"] == "run_started"), {})
    fin = next((e for e in reversed(ev) if e["event"] == "run_finished"), None)
    return RunSummary(
        run_id=run_dir.name, deployment=start.get("deployment", "?"),
        started=start.get("time", 0.0), finished=fin is not None,
        evaluations=sum(1 for e in ev if e["event"] == "bench"),
        best=(fin or {}).get("best", ""), best_speedup=(fin or {}).get("speedup_vs_stock"),
        ci95=tuple((fin or {}).get("ci95") or ()) or None)


def list_runs() -> list[RunSummary]:
    root = runs_dir()
    if not root.is_dir():
        return []
    return [summarize(d) for d in sorted(root.iterdir()) if (d / "trace.jsonl").is_file()]


def show_run(run_id: str, console=None) -> None:
    """Print the gap table, every candidate and the lineage of a run."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    tr = open_run(run_id)
    ev = tr.events()
    s = summarize(tr.dir)
    console.print(f"[bold]run {run_id}[/] deployment {s.deployment}, {s.evaluations} "
                  f"evaluations, {'finished' if s.finished else 'unfinished'}")
    gaps = next((e for e in ev if e["event"] == "gaps"), None)
    if gaps and gaps.get("gaps"):
        t = Table(title="gaps (ms/token lost)")
        for c in ("part", "ms/token", "note"):
            t.add_column(c)
        for g in gaps["gaps"]:
            t.add_row(str(g.get("name", "")), f"{g.get('ms_per_token', 0):.3f}",
                      str(g.get("note", "")))
        console.print(t)
    t = Table(title="candidates")
    for c in ("id", "agent", "change", "tok/s", "accept", "vs stock [CI95]", "verdict", "why"):
        numeric = c in ("id", "tok/s", "accept", "vs stock [CI95]", "verdict")
        t.add_column(c, no_wrap=numeric, overflow="fold", max_width=None if numeric else 40)
    for r in candidate_table(ev).values():
        sp, ci = r.get("speedup_vs_stock"), r.get("ci95")
        t.add_row(r["id"], str(r.get("agent", "")), str(r.get("summary", ""))[:60],
                  f"{r['tok_s']:.1f}" if r.get("tok_s") else "-",
                  f"{r['accept_length']:.2f}" if r.get("accept_length") else "-",
                  _speed(sp, ci), str(r.get("status", "")), str(r.get("reason", ""))[:80])
    console.print(t)
    conf = confirmations(ev)
    if conf:
        t = Table(title="confirmation (interleaved with stock and ar, Ray stopped)")
        for c in ("id", "tok/s", "accept", "vs stock [CI95]", "verified", "why"):
            t.add_column(c)
        for e in conf:
            t.add_row(e["candidate"], f"{e.get('tok_s') or 0:.1f}",
                      f"{e.get('accept_length') or 0:.2f}",
                      _speed(e.get("speedup_vs_stock"), e.get("ci95")),
                      "yes" if e.get("passed") else "no", str(e.get("reason", ""))[:80])
        console.print(t)
    lin = tr.dir / "lineage.json"
    if lin.is_file():
        d = json.loads(lin.read_text())
        edges = [f"{a} -> {b}" for a, b in d.get("edges", [])]
        console.print("lineage: " + ("; ".join(edges) if edges else "(no merges)"))
    if s.finished:
        ci = f" CI95 [{s.ci95[0]:.2f}, {s.ci95[1]:.2f}]" if s.ci95 else ""
        sp = f"{s.best_speedup:.2f}x" if s.best_speedup else "-"
        console.print(f"best: {s.best} {sp} vs stock{ci}")


def write_report(run_id: str, out: Path | None = None) -> Path:
    """A self-contained HTML report of a run (plots embedded as base64 PNG)."""
    from .agents.report import render_report

    tr = open_run(run_id)
    out = Path(out) if out else tr.dir / "report.html"
    out.write_text(render_report(run_id, tr.events(), tr.dir))
    return out
