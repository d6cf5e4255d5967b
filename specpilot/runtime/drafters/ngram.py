"""Prompt / self lookup: draft the tokens that followed the latest earlier occurrence of the
sequence's own suffix. No weights; a miss drafts a repeat of the last token (still verified)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..drafter import Drafter


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("ngram sizes need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens: Tensor, lengths: Tensor, k: int) -> Tensor:
        rows = [tokens[b, :n].tolist() for b, n in enumerate(lengths.tolist())]
        out = [lookup(seq, k, self.max_ngram, self.min_ngram) for seq in rows]
        return torch.tensor(out, dtype=torch.long, device=tokens.device)


def lookup(seq: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The k tokens after the most recent earlier match of the longest suffix n-gram."""
    L = len(seq)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        suffix = seq[L - n:]
        for i in range(L - n - 1, -1, -1):  # most recent match first, excluding the suffix
            if seq[i:i + n] == suffix:
                cont = seq[i + n:i + n + k]
                if cont:
                    return cont + [cont[-1]] * (k - len(cont))
    return [seq[-1]] * k
