"""`specpilot w12 stats --model DIR`: how well a checkpoint's matrices fit the W12 format.

Per 2-D float tensor (stored in bf16 for the measurement, as W12 would): exponent coverage
of the per-row window, escape rate, distinct exponents, bits per weight; then totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..runtime.errors import CheckpointError
from . import w12 as fmt


@dataclass
class TensorStats:
    name: str
    shape: tuple[int, int]
    coverage: float
    escape_rate: float
    distinct_exponents: int
    bits_per_weight: float
    nbytes: int


def checkpoint_stats(model_dir: str | Path) -> list[TensorStats]:
    """W12 statistics of every 2-D float tensor of an HF safetensors checkpoint."""
    from ..runtime.errors import check_dir
    from ..runtime.loader import read_tensors

    path = check_dir(model_dir, "checkpoint directory", error=CheckpointError)
    out = []
    for name, t in sorted(read_tensors(path).items()):
        if t.dim() != 2 or not t.is_floating_point():
            continue
        s = fmt.stats(t.to(torch.bfloat16))
        out.append(TensorStats(name, tuple(s["shape"]), s["coverage"], s["escape_rate"],
                               s["distinct_exponents"], s["bits_per_weight"], s["nbytes"]))
    if not out:
        raise CheckpointError(f"{path} holds no 2-D float tensors to measure")
    return out


def print_stats(rows: list[TensorStats]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="W12 fit per tensor")
    for col in ("tensor", "shape", "coverage", "escape rate", "exponents", "bits/weight"):
        table.add_column(col, justify="left" if col == "tensor" else "right")
    for r in rows:
        table.add_row(r.name, f"{r.shape[0]}x{r.shape[1]}", f"{100 * r.coverage:.4f}%",
                      f"{r.escape_rate:.2e}", str(r.distinct_exponents),
                      f"{r.bits_per_weight:.3f}")
    weights = sum(r.shape[0] * r.shape[1] for r in rows)
    nbytes = sum(r.nbytes for r in rows)
    table.add_row("total", f"{weights} weights", "", "", "", f"{8 * nbytes / weights:.3f}")
    Console().print(table)
