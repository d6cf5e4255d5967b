"""`draft:DIR`: a smaller checkpoint with the target's vocabulary drafts k tokens greedily.

The draft model keeps its own static KV cache. `prefill` runs it over the prompts. After a
verify step at most two committed tokens are new to it (the pending one, and the target's
bonus token when all k drafts were accepted), so on CUDA each propose runs a fixed
two-token catch-up window ending at the pending token (re-running an already cached
position is an exact rewrite), then k - 1 single-token steps: fixed shapes and no host
reads make a propose capturable in the engine's step graph (`graph_safe`); the attended
prefix is the engine's `kv_len`. On a CPU, where nothing is captured, the window is read
from the host instead: one token unless the bonus token is new too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..drafter import Drafter
from ..model import Transformer


class DraftModelDrafter(Drafter):
    name = "draft"
    graph_safe = True

    def __init__(self, model: Transformer):
        self.model = model
        self.kv_len: int | None = None  # set by the engine before each step
        self.graph_version = 0
        self.done: Tensor | None = None  # CPU only: positions cached with committed tokens
        self._last_k = 0

    def setup(self, batch_size: int, max_seq_len: int) -> None:
        v = self.model.cache_version
        self.model.setup_cache(batch_size, max_seq_len)
        self.graph_version += self.model.cache_version != v

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], hidden) -> None:
        """The prompts through the draft model, left-padded (pads write the last slot)."""
        dev = self.model.device
        lens = [len(p) for p in prompts]
        T = max(lens)
        inp = torch.zeros(len(prompts), T, dtype=torch.long, device=dev)
        pos = torch.full_like(inp, self.model.max_seq_len - 1)
        for b, p in enumerate(prompts):
            inp[b, T - len(p):] = torch.tensor(p, device=dev)
            pos[b, T - len(p):] = torch.arange(len(p), device=dev)
        self.model(inp, pos, last_only=True)
        # off CUDA (no step graphs) the catch-up window adapts: `done` = positions cached
        # with committed tokens, usually all but the pending one (a one-token window)
        self.done = None if dev.type == "cuda" else torch.tensor(lens, device=dev)

    def propose(self, tokens: Tensor, lengths: Tensor, k: int) -> Tensor:
        dev = tokens.device
        lengths = lengths.to(dev)
        m = 2 if self.done is None else max(int((lengths - self.done).max()), 1)
        pos = (lengths[:, None] - m + torch.arange(m, device=dev)).clamp(min=0)
        inp = tokens.gather(1, pos)
        # eager callers without an engine (no kv_len) read the exact bound from the host
        kv = self.kv_len if self.kv_len is not None else int(lengths.max()) + k
        logits, _ = self.model(inp, pos, last_only=True, kv_len=kv)
        d = logits[:, -1].argmax(-1)
        drafts = [d]
        p = lengths
        for _ in range(k - 1):
            logits, _ = self.model(d[:, None], p[:, None], kv_len=kv)
            d = logits[:, -1].argmax(-1)
            drafts.append(d)
            p = p + 1
        # Drafts d1..d_{k-1} are now cached at their positions; whatever verify accepts, the
        # next window rewrites the (at most two) positions whose cached tokens may differ.
        self._last_k = k
        return torch.stack(drafts, dim=1)

    def accept(self, start: Tensor, n_accepted: Tensor, hidden) -> None:
        if self.done is not None:  # committed and cached: up to the pending token (start)
            # plus the drafts d1..d_{k-1} fed back, of which n_accepted were committed
            self.done = start + 1 + torch.clamp(n_accepted, max=self._last_k - 1)
