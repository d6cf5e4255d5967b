"""`specpilot runs report`: one self-contained HTML page of a run, plots as base64 PNG.

Plots: best speedup vs stock over evaluations, speed against acceptance length of every
candidate, the lineage graph and the cost model's gaps. Tables: every candidate with its
change, speed, verdict and the reason it was rejected.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import networkx as nx

from ..trace import candidate_table, confirmations


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def plot_progress(events: list[dict]) -> str:
    xs, best, ys = [], [], []
    cur = 1.0
    for e in events:
        if e["event"] != "bench":
            continue
        sp, ci = e.get("speedup_vs_stock"), e.get("ci95")
        ok = e.get("ok") and sp
        if ok and ci and ci[0] > 1.0 and sp > cur:
            cur = sp
        xs.append(len(xs) + 1)
        ys.append(sp if ok else float("nan"))
        best.append(cur)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(xs, ys, "o", alpha=0.5, label="candidate")
    ax.step(xs, best, where="post", label="best (CI above 1)")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("evaluation")
    ax.set_ylabel("speedup vs stock")
    ax.legend()
    return _png(fig)


def plot_speed_acceptance(rows: dict[str, dict]) -> str:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for r in rows.values():
        if r.get("tok_s") and r.get("accept_length"):
            color = "tab:green" if r.get("status") == "accepted" else "tab:red"
            ax.scatter(r["accept_length"], r["tok_s"], c=color)
            ax.annotate(r["id"], (r["accept_length"], r["tok_s"]), fontsize=7)
    ax.set_xlabel("acceptance length (tokens / verify step)")
    ax.set_ylabel("tok/s")
    return _png(fig)


def plot_lineage(run_dir: Path, rows: dict[str, dict]) -> str:
    f = run_dir / "lineage.json"
    g = nx.DiGraph()
    if f.is_file():
        d = json.loads(f.read_text())
        g.add_nodes_from(n["id"] for n in d.get("nodes", []))
        g.add_edges_from(tuple(e) for e in d.get("edges", []))
    fig, ax = plt.subplots(figsize=(7, 4))
    if g.number_of_nodes():
        try:
            layers = {n: len(nx.ancestors(g, n)) for n in g}
            nx.set_node_attributes(g, layers, "layer")
            pos = nx.multipartite_layout(g, subset_key="layer")
        except nx.NetworkXException:
            pos = nx.spring_layout(g, seed=0)
        colors = ["tab:green" if rows.get(n, {}).get("status") == "accepted" else "tab:red"
                  for n in g]
        nx.draw_networkx(g, pos, ax=ax, node_color=colors, node_size=300, font_size=7,
                         arrows=True)
    ax.set_axis_off()
    return _png(fig)


def plot_gaps(events: list[dict]) -> str:
    gaps = next((e.get("gaps") or [] for e in events if e["event"] == "gaps"), [])
    fig, ax = plt.subplots(figsize=(6, 3))
    names = [str(g.get("name", ""))[:30] for g in gaps]
    ax.barh(names[::-1], [float(g.get("ms_per_token", 0)) for g in gaps][::-1])
    ax.set_xlabel("ms / token lost")
    return _png(fig)


def render_report(run_id: str, events: list[dict], run_dir: Path) -> str:
    rows = candidate_table(events)
    fin = next((e for e in reversed(events) if e["event"] == "run_finished"), {})
    start = next((e for e in events if e["event"] == "run_started"), {})
    head = (f"<h1>SpecPilot run {html.escape(run_id)}</h1><p>deployment "
            f"{html.escape(str(start.get('deployment', '?')))}; final "
            f"<b>{html.escape(str(fin.get('best', '(unfinished)')))}</b>")
    if fin.get("speedup_vs_stock"):
        ci = fin.get("ci95") or [0, 0]
        head += f", {fin['speedup_vs_stock']:.2f}x vs stock (CI95 {ci[0]:.2f}-{ci[1]:.2f})"
    head += "</p>"
    trs = []
    for r in rows.values():
        cells = [r["id"], r.get("agent", ""), r.get("summary", ""),
                 f"{r['tok_s']:.1f}" if r.get("tok_s") else "-",
                 f"{r['accept_length']:.2f}" if r.get("accept_length") else "-",
                 f"{r['speedup_vs_stock']:.2f}" if r.get("speedup_vs_stock") else "-",
                 r.get("status", ""), r.get("reason", "")]
        trs.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    table = ("<table border=1 cellspacing=0 cellpadding=3><tr><th>id</th><th>agent</th>"
             "<th>change</th><th>tok/s</th><th>accept</th><th>vs stock</th><th>verdict</th>"
             "<th>why</th></tr>" + "".join(trs) + "</table>")
    conf = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            e["candidate"], f"{e.get('tok_s') or 0:.1f}",
            f"{e['speedup_vs_stock']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}]"
            if e.get("speedup_vs_stock") else "-", "yes" if e.get("passed") else "no",
            e.get("reason", ""))) + "</tr>" for e in confirmations(events))
    if conf:
        head += ("<h2>Confirmation</h2><p>The front runners re-timed with stock and ar, "
                 "interleaved chunk by chunk, after Ray stopped; the final engine and its "
                 "numbers come from here.</p><table border=1 cellspacing=0 cellpadding=3>"
                 "<tr><th>id</th><th>tok/s</th><th>vs stock [CI95]</th><th>verified</th>"
                 "<th>why</th></tr>" + conf + "</table>")
    body = "".join([
        head, "<h2>Best speedup over evaluations</h2>", plot_progress(events),
        "<h2>Speed vs acceptance</h2>", plot_speed_acceptance(rows),
        "<h2>Lineage</h2>", plot_lineage(run_dir, rows),
        "<h2>Cost-model gaps</h2>", plot_gaps(events), "<h2>Candidates</h2>", table])
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(run_id)}"
            f"</title></head><body style='font-family:sans-serif'>{body}</body></html>")
