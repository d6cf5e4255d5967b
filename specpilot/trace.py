"""Run traces: `runs/<run-id>/trace.jsonl`, one JSON event a line, appended and flushed.

Every event carries `event`, `time`, `candidate` and `parents`. A run killed at any moment
leaves at worst a torn last line (the start of an event), which `read_events` skips, so a
resumed run sees every event that was fully written; a line that parses but is not an event
(hand-edited, damaged) is skipped too, and `runs list`/`runs show` name it; a line that is
neither (not JSON, not UTF-8) is a one-line error: the file is damaged, not torn. Reading a
run never writes to it: only `append` repairs a torn last line. `candidates/<id>/` holds
each candidate's knobs and overlay. Secrets never reach a trace: `scrub` masks anything
that looks like an API key. `list_runs`, `show_run` and `write_report` are the
`specpilot runs` commands.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_write
from .deployment import ROOT
from .runtime.errors import SpecPilotError, check_dir

EVENTS = ("run_started", "gaps", "proposal", "build", "bench", "verify", "merge", "confirm",
          "promote", "run_finished")
_SECRET = re.compile(r"(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|(?i:bearer)\s+\S{8,})")
_SECRET_KEYS = ("api_key", "apikey", "authorization", "x-api-key")
_EVENT_START = '{"event": '  # how every line `Trace.append` writes begins


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
        self._repaired = False  # repaired on the first append: reading never writes

    def _repair(self) -> None:
        """A torn last line (kill -9 mid-write) gets a newline so new events start clean."""
        self._repaired = True
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
        if not self._repaired:
            self._repair()
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


def _torn(line: str) -> bool:
    """Whether an unparsable line is the start of an event cut short by a killed run."""
    return line.startswith(_EVENT_START) or _EVENT_START.startswith(line)


def read_events(path: Path, damaged: list[int] | None = None) -> list[dict]:
    """The events of a trace in order. Lines torn by a killed run are skipped; lines that
    parse but are not an event object are skipped and their numbers (from 1) appended to
    `damaged`. An unreadable file, or a line that is neither (not UTF-8, not JSON), is a
    one-line SpecPilotError naming the file and the line."""
    out = []
    if not Path(path).is_file():
        return out
    try:  # bytes that are not UTF-8 become lone surrogates, found line by line below
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise SpecPilotError(f"cannot read {path} ({e.strerror}): check its permissions") from None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            line.encode()
        except UnicodeEncodeError:
            raise SpecPilotError(f"{path} line {n}: not UTF-8 text: the trace is damaged; "
                                 "restore it or delete the line") from None
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if _torn(line):
                continue  # a torn line from a killed run
            raise SpecPilotError(f"{path} line {n}: not valid JSON ({e.msg}): the trace is "
                                 "damaged; restore it or delete the line") from None
        if isinstance(rec, dict) and isinstance(rec.get("event"), str):
            out.append(rec)
        elif damaged is not None:
            damaged.append(n)
    return out


def _damage_note(path: Path, lines: list[int]) -> str:
    shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
    return (f"{path}: line{'s' if len(lines) > 1 else ''} {shown} "
            f"{'are' if len(lines) > 1 else 'is'} not a trace event; skipped")


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
    damaged: tuple[int, ...] = ()  # trace lines that are not events (skipped)


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
    damaged: list[int] = []
    ev = read_events(run_dir / "trace.jsonl", damaged)
    start = next((e for e in ev if e["event"] == "run_started"), {})
    fin = next((e for e in reversed(ev) if e["event"] == "run_finished"), None)
    return RunSummary(
        run_id=run_dir.name, deployment=start.get("deployment", "?"),
        started=start.get("time", 0.0), finished=fin is not None,
        evaluations=sum(1 for e in ev if e["event"] == "bench"),
        best=(fin or {}).get("best", ""), best_speedup=(fin or {}).get("speedup_vs_stock"),
        ci95=tuple((fin or {}).get("ci95") or ()) or None, damaged=tuple(damaged))


def list_runs() -> list[RunSummary]:
    """Every run's summary; a damaged or unreadable run is named on stderr, not fatal."""
    root = runs_dir()
    if not root.exists():  # no search has run yet (the first one makes it)
        return []
    check_dir(root, "runs folder", "point SPECPILOT_RUNS at a folder")
    out = []
    for d in sorted(root.iterdir()):
        if not (d / "trace.jsonl").is_file():
            continue
        try:
            s = summarize(d)
        except SpecPilotError as e:
            print(f"warning: run {d.name} skipped: {e}", file=sys.stderr)
            continue
        if s.damaged:
            print(f"warning: run {d.name}: {_damage_note(d / 'trace.jsonl', list(s.damaged))}",
                  file=sys.stderr)
        out.append(s)
    return out


def read_lineage(run_dir: Path) -> dict | None:
    """A run's lineage.json ({"nodes", "edges"}), None if it has none; a corrupt one is a
    one-line SpecPilotError naming the file."""
    f = Path(run_dir) / "lineage.json"
    if not f.is_file():
        return None
    try:
        d = json.loads(f.read_text())
    except OSError as e:
        raise SpecPilotError(f"cannot read {f} ({e.strerror}): check its permissions") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecPilotError(f"{f} is not valid JSON ({e}): restore or delete it") from None
    edges = d.get("edges", []) if isinstance(d, dict) else None
    if not (isinstance(edges, list) and isinstance(d.get("nodes", []), list)
            and all(isinstance(e, list) and len(e) == 2 for e in edges)):
        raise SpecPilotError(f"{f} is not a lineage (an object with node and [from, to] edge "
                             "lists): restore or delete it")
    return d


def show_run(run_id: str, console=None) -> None:
    """Print the gap table, every candidate and the lineage of a run."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    tr = open_run(run_id)
    damaged: list[int] = []
    ev = read_events(tr.path, damaged)
    s = summarize(tr.dir)
    lineage = read_lineage(tr.dir)
    if damaged:
        console.print(f"[yellow]warning:[/] {_damage_note(tr.path, damaged)}")
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
    if lineage is not None:
        edges = [f"{a} -> {b}" for a, b in lineage.get("edges", [])]
        console.print("lineage: " + ("; ".join(edges) if edges else "(no merges)"))
    if s.finished:
        ci = f" CI95 [{s.ci95[0]:.2f}, {s.ci95[1]:.2f}]" if s.ci95 else ""
        sp = f"{s.best_speedup:.2f}x" if s.best_speedup else "-"
        console.print(f"best: {s.best} {sp} vs stock{ci}")


def write_report(run_id: str, out: Path | None = None) -> Path:
    """A self-contained HTML report of a run (plots embedded as base64 PNG), written to a
    temporary file beside `out` and renamed into place: never half-written."""
    from .agents.report import render_report

    tr = open_run(run_id)
    out = Path(out) if out else tr.dir / "report.html"
    if out.is_dir():
        raise SpecPilotError(f"--out {out} is a directory: give a file path, e.g. "
                             f"{out / 'report.html'}")
    check_dir(out.parent, "directory", "choose another path", f"--out {out}: ")
    read_lineage(tr.dir)  # a corrupt lineage.json is a one-line error, not a traceback
    html = render_report(run_id, tr.events(), tr.dir)
    try:
        with atomic_write(out) as f:
            f.write(html)
    except OSError as e:
        raise SpecPilotError(f"cannot write {out} ({e.strerror}): choose another --out") from None
    return out
