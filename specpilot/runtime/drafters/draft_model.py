"""`draft:DIR`: a smaller checkpoint with the target's vocabulary drafts k tokens greedily.

The draft model keeps its own static KV cache. `done[b]` counts the positions of row b it
has processed with committed tokens; each propose first catches up on the committed tokens
since then, then runs k - 1 single-token steps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..drafter import Drafter
from ..model import Transformer


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, model: Transformer):
        self.model = model
        self.done: Tensor | None = None

    def setup(self, batch_size: int, max_seq_len: int) -> None:
        self.model.setup_cache(batch_size, max_seq_len)
        self.max_seq_len = max_seq_len

    def prefill(self, prompts: list[list[int]], hidden) -> None:
        self.done = torch.zeros(len(prompts), dtype=torch.long, device=self.model.device)

    def propose(self, tokens: Tensor, lengths: Tensor, k: int) -> Tensor:
        dev = tokens.device
        B = tokens.shape[0]
        lengths = lengths.to(dev)
        # Re-run from the first unprocessed committed token; rows with less to catch up are
        # right-aligned and recompute a few already-cached positions (an exact rewrite).
        m = max(int((lengths - self.done).max()), 1)
        pos = (lengths[:, None] - m + torch.arange(m, device=dev)).clamp(min=0)
        inp = tokens.gather(1, pos)
        kv = int(lengths.max()) + k
        logits, _ = self.model(inp, pos, last_only=True, kv_len=kv)
        d = logits[:, -1].argmax(-1)
        drafts = [d]
        p = lengths.clone()
        for _ in range(k - 1):
            logits, _ = self.model(d[:, None], p[:, None], kv_len=kv)
            d = logits[:, -1].argmax(-1)
            drafts.append(d)
            p = p + 1
        self._last_k = k
        return torch.stack(drafts, dim=1).view(B, k)

    def accept(self, start: Tensor, n_accepted: Tensor, hidden) -> None:
        # Processed with committed tokens: everything up to the pending token (start),
        # plus drafts d1..d_{k-1} that were fed back, of which n_accepted are committed.
        self.done = start + 1 + torch.clamp(n_accepted, max=self._last_k - 1)
