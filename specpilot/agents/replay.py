"""The replay proposer: re-issues the proposals recorded in an earlier run's trace.

Round r of the new run gets the candidates that round r of the old run proposed (their
knobs, edits, rationale and agent), so a run is reproducible without any LLM. A trace
file path works as well as a run id (tests use recorded fixture traces).
"""

from __future__ import annotations

from pathlib import Path

from ..runtime.errors import SpecPilotError
from ..trace import read_events, runs_dir
from .candidate import Candidate, ProposalContext


def recorded_proposals(source: str) -> dict[int, list[Candidate]]:
    p = Path(source)
    path = p if p.suffix == ".jsonl" else runs_dir() / source / "trace.jsonl"
    if not path.is_file():
        raise SpecPilotError(f"replay: no trace at {path}: give a run id or a trace.jsonl path")
    rounds: dict[int, list[Candidate]] = {}
    for e in read_events(path):
        if e["event"] == "proposal" and e.get("proposal"):
            c = Candidate.from_dict(e["proposal"])
            rounds.setdefault(c.round, []).append(c)
    return rounds


class ReplayAgent:
    name = "replay"

    def __init__(self, source: str):
        self.source = source
        self.rounds = recorded_proposals(source)

    def propose(self, ctx: ProposalContext) -> tuple[list[Candidate], list[dict]]:
        out = [Candidate(id="", agent=f"replay:{c.agent}", knobs=c.knobs, edits=c.edits,
                         rationale=c.rationale, parents=(ctx.best_id,), round=ctx.round,
                         files=dict(c.files))
               for c in self.rounds.get(ctx.round, [])]
        return out, [{"agent": self.name, "source": self.source, "candidates": len(out)}]
