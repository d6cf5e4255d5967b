"""Candidates: what a proposer returns — knob changes, SEARCH/REPLACE edits, a rationale.

A candidate is relative to a *base* (the engine it was proposed against: knobs and
overlay). `materialize` applies it: knob changes over the base knobs, edits over the base
overlay (or the stock file when the base does not override it), then `files` (whole data
files: the kernel subagent's tuned tables) over that. An edit whose SEARCH text is missing
or ambiguous raises `PatchError` — the candidate is rejected, never guessed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..engines import PACKAGE, is_tuned_table
from ..runtime.errors import SpecPilotError
from ..runtime.knobs import Knobs


class PatchError(SpecPilotError):
    """An edit does not apply to the file it names."""


@dataclass(frozen=True)
class Edit:
    path: str  # repo path, e.g. specpilot/runtime/generate.py
    search: str
    replace: str


@dataclass(frozen=True)
class Candidate:
    id: str
    agent: str
    knobs: dict = field(default_factory=dict)  # knob name -> new value
    edits: tuple[Edit, ...] = ()
    rationale: str = ""
    parents: tuple[str, ...] = ()
    round: int = 0
    files: dict = field(default_factory=dict)  # repo path -> whole text (tuned tables only)

    def summary(self) -> str:
        parts = [f"{k}={str(v).rsplit('/', 1)[-1] if k == 'drafter' else v}"
                 for k, v in sorted(self.knobs.items())]
        names = sorted({e.path.rsplit("/", 1)[-1] for e in self.edits})
        if names:
            parts.append(f"{len(self.edits)} edit(s) in {', '.join(names)}")
        if self.files:
            parts.append(f"file(s) {', '.join(sorted(p.rsplit('/', 1)[-1] for p in self.files))}")
        return ", ".join(parts) or "(no change)"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["edits"] = [asdict(e) for e in self.edits]
        d["parents"] = list(self.parents)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Candidate:
        edits = tuple(Edit(str(e["path"]), str(e["search"]), str(e["replace"]))
                      for e in d.get("edits", []))
        return cls(id=str(d["id"]), agent=str(d.get("agent", "")), knobs=dict(d.get("knobs", {})),
                   edits=edits, rationale=str(d.get("rationale", "")),
                   parents=tuple(d.get("parents", ())), round=int(d.get("round", 0)),
                   files={str(p): str(t) for p, t in (d.get("files") or {}).items()})

    @property
    def paths(self) -> list[str]:
        """Every repo path the candidate changes."""
        return sorted({e.path for e in self.edits} | set(self.files))


def stock_file(path: str) -> str:
    """The stock text of a package file ("" for a tuned table the stock package lacks)."""
    f = PACKAGE.parent / path
    if is_tuned_table(path) and ".." not in Path(path).parts and not f.exists():
        return ""
    if not path.startswith("specpilot/") or ".." in Path(path).parts or not f.is_file():
        raise PatchError(f"{path}: not a file of the stock specpilot package")
    return f.read_text()


def apply_edit(text: str, edit: Edit) -> str:
    if not edit.search:
        raise PatchError(f"{edit.path}: an edit needs a non-empty SEARCH block")
    n = text.count(edit.search)
    if n == 0:
        raise PatchError(f"{edit.path}: SEARCH block not found in the file")
    if n > 1:
        raise PatchError(f"{edit.path}: SEARCH block matches {n} places; make it unique")
    return text.replace(edit.search, edit.replace, 1)


def apply_edits(base_overlay: dict[str, str], edits: tuple[Edit, ...]) -> dict[str, str]:
    """The overlay after `edits`: each edit applies to the base overlay's file or the stock one."""
    overlay = dict(base_overlay)
    for e in edits:
        text = overlay[e.path] if e.path in overlay else stock_file(e.path)
        overlay[e.path] = apply_edit(text, e)
    # an overlay file equal to the stock file is no overlay at all
    return {p: t for p, t in overlay.items() if t != stock_file(p)}


def materialize(cand: Candidate, base_knobs: Knobs,
                base_overlay: dict[str, str]) -> tuple[Knobs, dict[str, str]]:
    """(knobs, overlay) of `cand` applied to its base; raises SpecPilotError/PatchError."""
    knobs = base_knobs.with_(**cand.knobs) if cand.knobs else base_knobs
    overlay = apply_edits(base_overlay, cand.edits)
    for path, text in cand.files.items():
        if not is_tuned_table(path):
            raise PatchError(f"{path}: only kernel tables (specpilot/kernels/tuned/*.json) "
                             "may be given as whole files; use SEARCH/REPLACE edits")
        if text != stock_file(path):
            overlay[path] = text
        else:
            overlay.pop(path, None)
    return knobs, overlay


@dataclass
class ProposalContext:
    """What every proposer sees. Never the gate set: only dev-set facts reach it."""

    deployment: str
    device: str
    batch_sizes: list[int]
    drafters: list[str]  # the drafter specs the deployment allows
    round: int
    best_id: str
    best_knobs: dict  # full knob dict of the current best engine
    best_overlay: dict[str, str]  # its overlay files
    best_tok_s: float = 0.0
    gaps: list[dict] = field(default_factory=list)
    best_k: dict[int, int] = field(default_factory=dict)  # cost model's predicted best k
    history: list[dict] = field(default_factory=list)  # earlier candidates (dev facts only)
    editable_files: dict[str, str] = field(default_factory=dict)
    n: int = 4
    seed: int = 0
