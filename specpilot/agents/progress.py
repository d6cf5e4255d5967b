"""Live progress of a search in the terminal (rich): round, in flight, best so far, rejects."""

from __future__ import annotations

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


class SearchProgress:
    """Feed it trace events (`on_event`); it redraws a small status panel."""

    def __init__(self, run_id: str = "", enabled: bool = True):
        self.run_id, self.round, self.evals = run_id, 0, 0
        self.in_flight: set[str] = set()
        self.best = ("stock", 1.0, None)
        self.rejected: list[tuple[str, str]] = []
        self.live = Live(self.render(), refresh_per_second=4, transient=False) if enabled else None

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)

    def on_event(self, e: dict) -> None:
        ev, cid = e["event"], e.get("candidate")
        if ev == "run_started":
            self.run_id = e.get("config", {}).get("run_id") or self.run_id
        if ev in ("proposal", "merge") and e.get("round") is not None:
            self.round = e["round"]
        if ev == "proposal" and e.get("rejected"):
            self.rejected.append((cid or "?", e["rejected"]))
        if ev in ("build", "merge") and cid:
            self.in_flight.add(cid)
        if ev == "bench":
            self.in_flight.discard(cid)
            self.evals += 1
            if not e.get("ok", True):
                self.rejected.append((cid, e.get("reason", "")))
        if ev == "verify" and e.get("set") == "dev" and e.get("reason"):
            self.rejected.append((cid, e["reason"]))
        if ev == "bench" and e.get("ok") and e.get("speedup_vs_stock"):
            sp = e["speedup_vs_stock"]
            if sp > self.best[1] and (e.get("ci95") or [0])[0] > 1.0:
                self.best = (cid, sp, e.get("ci95"))
        if self.live:
            self.live.update(self.render())

    def render(self):
        cid, sp, ci = self.best
        cis = f" CI95 [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        head = Text(f"search {self.run_id}  round {self.round}  evaluations {self.evals}  "
                    f"in flight {len(self.in_flight)}  best {cid} {sp:.2f}x vs stock{cis}")
        t = Table(title="rejected (latest)", show_header=False, expand=True)
        t.add_column("id", width=8)
        t.add_column("why", overflow="fold")
        for c, why in self.rejected[-5:]:
            t.add_row(str(c), str(why)[:160])
        return Group(head, t) if self.rejected else head
