"""Speedup bound of speculative decoding: tokens per step against the cost of a step.

Tokens per verify step come from a measured acceptance histogram (hist[i] = how many steps
accepted exactly i drafts) or from a per-token acceptance rate alpha:
(1 - alpha^(k+1)) / (1 - alpha). A histogram measured at k can be re-cut for any k' <= k,
since acceptance is a prefix: a step that accepted i drafts at k accepts min(i, k') at k'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..runtime.errors import SpecPilotError
from .hardware import Hardware
from .roofline import ar_step, draft_cost, verify_step
from .spec import ModelSpec


def expected_tokens(k: int, alpha: float | None = None,
                    histogram: list[float] | None = None) -> float:
    """Committed tokens per verify step (the bonus token included)."""
    if k < 0:
        raise SpecPilotError(f"k must be >= 0, not {k}")
    if histogram is not None:
        total = float(sum(histogram))
        if total <= 0 or any(c < 0 for c in histogram):
            raise SpecPilotError("an acceptance histogram needs non-negative counts, not all 0")
        if len(histogram) - 1 < k:
            raise SpecPilotError(f"the histogram covers k <= {len(histogram) - 1}, not k={k}")
        return sum(c * (min(i, k) + 1) for i, c in enumerate(histogram)) / total
    if alpha is None:
        raise SpecPilotError("give an acceptance rate alpha or an acceptance histogram")
    if not 0.0 <= alpha <= 1.0:
        raise SpecPilotError(f"alpha must lie in [0, 1], not {alpha}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class SpecRow:
    """Speculative decoding at one (batch, k) against AR at that batch."""

    batch: int
    k: int
    tokens_per_step: float
    draft_ms: float
    verify_ms: float
    step_ms: float  # expected: draft + verify, overheads included
    bound_step_ms: float  # physics floor of the step
    tok_s: float  # expected tokens/s (all sequences)
    bound_tok_s: float  # the most tokens/s physics allows at this acceptance
    ar_tok_s: float
    ar_bound_tok_s: float
    speedup: float  # tok_s / ar_tok_s (expected basis)
    bound_speedup: float  # bound_tok_s / ar_bound_tok_s

    def to_dict(self) -> dict:
        return asdict(self)


def speedup_table(target: ModelSpec, hw: Hardware, batch: int, ks: list[int],
                  context: int = 0, drafter_kind: str = "ngram",
                  drafter: ModelSpec | None = None, alpha: float | None = None,
                  histogram: list[float] | None = None, hidden_layers: int | None = None
                  ) -> list[SpecRow]:
    """One row per k: the bound and expected tokens/s of speculation against AR."""
    ar = ar_step(target, hw, batch, context)
    ar_tok = batch * 1e3 / ar.expected_ms
    ar_bound = batch * 1e3 / ar.bound_ms
    rows = []
    for k in ks:
        n = expected_tokens(k, alpha, histogram)
        v = verify_step(target, hw, batch, k, context)
        d = draft_cost(drafter_kind, hw, batch, k, context, drafter=drafter, target=target,
                       hidden_layers=hidden_layers)
        step = d.expected_ms + v.expected_ms
        bound = d.bound_ms + v.bound_ms
        tok = batch * n * 1e3 / step
        btok = batch * n * 1e3 / bound
        rows.append(SpecRow(batch, k, n, d.expected_ms, v.expected_ms, step, bound, tok, btok,
                            ar_tok, ar_bound, tok / ar_tok, btok / ar_bound))
    return rows


def best_k(target: ModelSpec, hw: Hardware, batches: list[int], ks: list[int],
           **kw) -> dict[int, SpecRow]:
    """For each batch size, the row of the k with the highest expected tokens/s."""
    return {b: max(speedup_table(target, hw, b, ks, **kw), key=lambda r: r.tok_s)
            for b in batches}
