"""`specpilot deployments list | show NAME`: print what `deployments/*.toml` define."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from .deployment import ROOT, Deployment, list_deployments, load_deployment


def _short(p: str) -> str:
    try:
        return str(Path(p).relative_to(ROOT))
    except ValueError:
        return p


def _drafter(d) -> str:
    return d.kind if not d.path else f"{d.kind}:{_short(d.path)}"


def list_command() -> None:
    t = Table(title=f"deployments in {_short(str(ROOT / 'deployments'))}/")
    for c in ("name", "device", "dtype", "target", "drafter", "batch sizes", "dev / gate"):
        t.add_column(c)
    for d in list_deployments():
        t.add_row(d.name, d.device + (f" ({d.gpu})" if d.gpu else ""), d.dtype,
                  _short(d.target), _drafter(d.drafter), ",".join(map(str, d.batch_sizes)),
                  f"{d.dev_workload} / {d.gate_workload}")
    console = Console()
    if not console.is_terminal:  # piped: don't squeeze paths into 80 columns
        console = Console(width=160)
    console.print(t)


def show_lines(d: Deployment) -> list[str]:
    k = d.knobs.to_dict()
    knobs = ", ".join(f"{n}={v}" for n, v in k.items() if v not in (None, {}, ""))
    return [
        f"name            {d.name}",
        f"description     {d.description}",
        f"source          {_short(d.source)}",
        f"device          {d.device}" + (f" ({d.gpu})" if d.gpu else ""),
        f"dtype           {d.dtype}",
        f"target          {_short(d.target)}",
        f"drafter         {_drafter(d.drafter)}",
        f"alternatives    {', '.join(_drafter(a) for a in d.alternatives) or '-'}",
        f"batch sizes     {', '.join(map(str, d.batch_sizes))}",
        f"max_new_tokens  {d.max_new_tokens}",
        f"workloads       dev {d.dev_workload or '-'}, gate {d.gate_workload or '-'}",
        f"stock knobs     {knobs}",
    ]


def show_command(name: str) -> None:
    print("\n".join(show_lines(load_deployment(name))))
