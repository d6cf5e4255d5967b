"""The drafter interface: what the speculative loop asks of any drafter.

The engine keeps the committed sequences in `tokens [B, S]` with `lengths [B]`: row b's
committed tokens are `tokens[b, :lengths[b]]`, and the last of them (position
`lengths[b] - 1`) is *pending*: the target has not processed it yet. Each step the drafter
proposes k tokens to follow it; the target verifies `[pending, d1..dk]` at positions
`lengths-1 .. lengths-1+k`, commits the agreeing prefix plus its own next token, and tells
the drafter how many drafts each row accepted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor


class Drafter(ABC):
    #: target decoder layers whose outputs the drafter reads (block drafters); () for none
    hidden_layers: tuple[int, ...] = ()
    name: str = "drafter"
    #: the most drafts one propose can return (block drafters: block_size - 1); None = any
    max_k: int | None = None

    def prepare(self, prompts: list[list[int]], max_new_tokens: int, engine) -> None:
        """Called first in `engine.generate` (the oracle records its continuations here, on
        the engine's own path)."""

    def setup(self, batch_size: int, max_seq_len: int) -> None:
        """Allocate per-batch state before a generate call (static caches)."""

    def prefill(self, prompts: list[list[int]], hidden: list[Tensor] | None) -> None:
        """Called after the target's prefill; `hidden[b]` is [len(prompts[b]), D] when
        `hidden_layers` is non-empty."""

    @abstractmethod
    def propose(self, tokens: Tensor, lengths: Tensor, k: int) -> Tensor:
        """k draft tokens per row, [B, k] long, on the target's device."""

    def accept(self, start: Tensor, n_accepted: Tensor, hidden: Tensor | None) -> None:
        """After verify: row b's verify input started at position `start[b]` and
        `n_accepted[b]` drafts were accepted; `hidden` is the target's [B, k+1, D] hidden
        states of the verify input (when `hidden_layers` is non-empty)."""
