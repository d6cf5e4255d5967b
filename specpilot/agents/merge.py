"""Merge verified winners: knob union and a line-based 3-way merge of overlay files.

Two changes conflict when they set the same knob to different values, or when their edits
to a file touch overlapping or adjacent regions of the common base. A conflict is
reported, never resolved by guessing. The lineage of a run (parent -> child, merges
included) is a networkx DAG saved next to the trace as node-link JSON.
"""

from __future__ import annotations

import difflib
import itertools
import json
from pathlib import Path

import networkx as nx

from .candidate import stock_file


class MergeConflict(Exception):
    """Two changes cannot both be kept."""


def _hunks(base: list[str], other: list[str]) -> list[tuple[int, int, tuple[str, ...]]]:
    sm = difflib.SequenceMatcher(None, base, other, autojunk=False)
    return [(i1, i2, tuple(other[j1:j2])) for tag, i1, i2, j1, j2 in sm.get_opcodes()
            if tag != "equal"]


def merge3(base: str, a: str, b: str) -> str:
    """Apply both a's and b's changes (relative to base) or raise MergeConflict."""
    if a == b or b == base:
        return a
    if a == base:
        return b
    bl = base.splitlines(keepends=True)
    hunks = sorted(set(_hunks(bl, a.splitlines(keepends=True)))
                   | set(_hunks(bl, b.splitlines(keepends=True))))
    for x, y in itertools.pairwise(hunks):
        if y[0] <= x[1]:  # overlapping or touching regions of the base
            raise MergeConflict(f"edits overlap around base line {y[0] + 1}")
    out = list(bl)
    for i1, i2, lines in reversed(hunks):
        out[i1:i2] = list(lines)
    return "".join(out)


def merge_knobs(base: dict, a: dict, b: dict) -> dict:
    """Full knob dicts: take every knob either side changed; both changed differently = conflict."""
    out = dict(base)
    for k in sorted(set(base) | set(a) | set(b)):
        va, vb, v0 = a.get(k), b.get(k), base.get(k)
        if va != v0 and vb != v0 and va != vb:
            raise MergeConflict(f"knob {k}: {va!r} vs {vb!r}")
        out[k] = va if va != v0 else vb
    return out


def merge_overlays(base: dict[str, str], a: dict[str, str], b: dict[str, str]) -> dict[str, str]:
    out = {}
    for path in sorted(set(base) | set(a) | set(b)):
        orig = base.get(path) or stock_file(path)
        try:
            merged = merge3(orig, a.get(path, orig), b.get(path, orig))
        except MergeConflict as e:
            raise MergeConflict(f"{path}: {e}") from None
        if merged != stock_file(path):
            out[path] = merged
    return out


class Lineage:
    """Parents -> children over candidate ids, with a few facts per node."""

    def __init__(self):
        self.g = nx.DiGraph()

    def add(self, cid: str, parents=(), **attrs) -> None:
        self.g.add_node(cid, **{k: v for k, v in attrs.items() if v is not None})
        for p in parents:
            if p:
                self.g.add_edge(p, cid)

    def update(self, cid: str, **attrs) -> None:
        if cid in self.g:
            self.g.nodes[cid].update({k: v for k, v in attrs.items() if v is not None})

    def ancestors(self, cid: str) -> set[str]:
        return nx.ancestors(self.g, cid)

    def save(self, path: Path) -> None:
        data = nx.node_link_data(self.g, edges="edges")
        data["edges"] = [[e["source"], e["target"]] for e in data["edges"]]
        Path(path).write_text(json.dumps(data, indent=1, default=str))

    @classmethod
    def load(cls, path: Path) -> Lineage:
        d = json.loads(Path(path).read_text())
        lin = cls()
        for n in d.get("nodes", []):
            n = dict(n)
            lin.g.add_node(n.pop("id"), **n)
        lin.g.add_edges_from(tuple(e) for e in d.get("edges", []))
        return lin
