"""Cost-model output: one JSON-able analysis, rich tables, and a roofline chart.

`analyze` gathers the AR step, the verify and draft steps (with k) and the speedup bound into
a plain dict; `print_tables` renders it with rich; `plot_roofline` places every operator by
arithmetic intensity against the device's bandwidth and compute ceilings (matplotlib, Agg).
"""

from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_write
from .hardware import Hardware
from .roofline import StepCost, ar_step, draft_cost, verify_step
from .spec import ModelSpec
from .speedup import best_k, speedup_table

PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # what --plot may write (matplotlib, by suffix)


def analyze(spec: ModelSpec, hw: Hardware, batch: int = 1, context: int = 0,
            k: int | None = None, drafter_kind: str = "ngram",
            drafter: ModelSpec | None = None, alpha: float = 0.7,
            histogram: list[float] | None = None, batches: list[int] | None = None) -> dict:
    """Everything the CLI shows, as plain data."""
    out: dict = {
        "model": spec.to_dict(), "params": spec.params(),
        "hardware": {"key": hw.key, "name": hw.name, "mem_bw": hw.mem_bw, "flops": hw.flops,
                     "stream_bw": hw.stream_bw, "measured_flops": hw.measured_flops,
                     "calibrated": hw.calibrated, "sources": hw.sources},
        "batch": batch, "context": context,
        "ar": ar_step(spec, hw, batch, context).to_dict(),
    }
    if k is not None:
        kw = {"context": context, "drafter_kind": drafter_kind, "drafter": drafter,
                  "alpha": None if histogram else alpha, "histogram": histogram}
        out["k"] = k
        out["drafter"] = drafter_kind
        out["alpha"] = None if histogram else alpha
        out["verify"] = verify_step(spec, hw, batch, k, context).to_dict()
        out["draft"] = draft_cost(drafter_kind, hw, batch, k, context, drafter=drafter,
                                  target=spec).to_dict()
        ks = list(range(1, max(k, 8) + 1)) if not histogram else list(range(1, len(histogram)))
        out["speedup"] = [r.to_dict() for r in speedup_table(spec, hw, batch, ks, **kw)]
        out["best_k"] = {str(b): r.to_dict() for b, r in
                         best_k(spec, hw, batches or sorted({1, 8, 32, batch}), ks,
                                **kw).items()}
    return out


def _step_table(title: str, step: dict):
    from rich.table import Table

    t = Table(title=title)
    for c in ("operator", "count", "weights MB", "KV MB", "act MB", "GFLOP", "AI", "limit",
              "bound ms", "expected ms"):
        t.add_column(c, justify="left" if c in ("operator", "limit") else "right")
    for o in step["ops"]:
        b = o["bytes"]
        t.add_row(o["name"], str(o["count"]), f"{o['weight_bytes'] / 1e6:.2f}",
                  f"{(o['kv_read_bytes'] + o['kv_write_bytes']) / 1e6:.2f}",
                  f"{o['act_bytes'] / 1e6:.2f}", f"{o['flops'] / 1e9:.3f}",
                  f"{o['flops'] / b:.1f}" if b else "-", o["limit"], f"{o['bound_ms']:.4f}",
                  f"{o['expected_ms']:.4f}")
    ops = step["ops"]
    w = sum(o["weight_bytes"] for o in ops)
    kv = sum(o["kv_read_bytes"] + o["kv_write_bytes"] for o in ops)
    act = sum(o["act_bytes"] for o in ops)
    t.add_row("total", str(step["kernels"]), f"{w / 1e6:.2f}", f"{kv / 1e6:.2f}",
              f"{act / 1e6:.2f}", f"{step['flops'] / 1e9:.3f}", "", "",
              f"{step['bound_ms']:.4f}", f"{step['expected_ms']:.4f}", style="bold")
    return t


def print_tables(a: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console(width=max(Console().width, 132))
    hw = a["hardware"]
    m = a["model"]
    con.print(f"[bold]{m['name']}[/] ({a['params'] / 1e9:.2f}B params, {m['weights']}) on "
              f"{hw['name']} ({hw['mem_bw'] / 1e12:.2f} TB/s datasheet, "
              f"{'calibrated ' + hw['calibrated'] if hw['calibrated'] else 'datasheet'}); "
              f"batch {a['batch']}, context {a['context']}; expected = bound with measured "
              f"GEMM efficiency + {a['ar']['overhead_ms']:.3f} ms step overhead")
    con.print(_step_table("AR step", a["ar"]))
    if "verify" in a:
        con.print(_step_table(f"verify step (k={a['k']})", a["verify"]))
        d = a["draft"]
        con.print(f"draft ({a['drafter']}, k={a['k']}): bound {d['bound_ms']:.4f} ms, "
                  f"expected {d['expected_ms']:.4f} ms, {d['bytes'] / 1e6:.1f} MB")
        t = Table(title=f"speedup bound (alpha={a['alpha']}), batch {a['batch']}")
        for c in ("k", "tok/step", "step ms", "tok/s", "AR tok/s", "speedup", "bound tok/s",
                  "bound speedup"):
            t.add_column(c, justify="right")
        for r in a["speedup"]:
            t.add_row(str(r["k"]), f"{r['tokens_per_step']:.2f}", f"{r['step_ms']:.3f}",
                      f"{r['tok_s']:.0f}", f"{r['ar_tok_s']:.0f}", f"{r['speedup']:.2f}x",
                      f"{r['bound_tok_s']:.0f}", f"{r['bound_speedup']:.2f}x")
        con.print(t)
        t = Table(title="best k per batch size")
        for c in ("batch", "k", "tok/s", "speedup"):
            t.add_column(c, justify="right")
        for b, r in a["best_k"].items():
            t.add_row(b, str(r["k"]), f"{r['tok_s']:.0f}", f"{r['speedup']:.2f}x")
        con.print(t)


def plot_roofline(steps: list[StepCost] | list[dict], hw: Hardware, path: str | Path,
                  dtype: str = "bf16") -> Path:
    """Operators at (FLOP/byte, FLOP/s at their floor) under the device's roofline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peak = hw.bound_flops(dtype)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ridge = peak / hw.bound_bw
    xs = [1e-2, ridge, 1e5]
    ax.plot(xs, [min(peak, x * hw.bound_bw) for x in xs], "k-",
            label=f"{hw.name}: {hw.bound_bw / 1e12:.2f} TB/s, {peak / 1e12:.0f} TFLOP/s {dtype}")
    if hw.calibrated:
        got = hw.achieved_flops(dtype)
        xr = [1e-2, got / hw.achieved_bw, 1e5]
        ax.plot(xr, [min(got, x * hw.achieved_bw) for x in xr], "b--", lw=1,
                label=f"measured {hw.calibrated}: {hw.achieved_bw / 1e12:.2f} TB/s, "
                      f"{got / 1e12:.0f} TFLOP/s")
    if "fp32" in hw.flops and dtype != "fp32":
        ax.axhline(hw.flops["fp32"], color="grey", ls=":", lw=1, label="fp32 (non-matrix)")
    markers = "os^Dv"
    for i, st in enumerate(steps):
        d = st if isinstance(st, dict) else st.to_dict()
        pts = [(o["flops"] / o["bytes"], o["flops"] / (o["bound_ms"] / 1e3), o["name"])
               for o in d["ops"] if o["bytes"] and o["flops"] and o["bound_ms"]]
        if not pts:
            continue
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                   label=f"{d['name']} (batch {d['batch']} x {d['q']} tok)", zorder=3)
        labels: dict[tuple[float, float], list[str]] = {}
        for x, y, n in pts:  # operators of one shape share a point: one label for them
            labels.setdefault((round(x, 2), round(y, -9)), []).append(n)
        for (x, y), names in labels.items():
            ax.annotate(", ".join(names), (x, y), fontsize=7, xytext=(4, -9),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s at the operator's floor")
    ax.set_title("roofline: operators of one decoding step")
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=8, loc="lower right")
    path = Path(path)
    try:
        with atomic_write(path, "wb") as f:
            fig.savefig(f, format=path.suffix.lstrip(".").lower() or "png", dpi=120,
                        bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
