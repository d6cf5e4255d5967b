"""CUDA graphs of whole decode/verify steps, captured lazily per key and replayed.

A step is a function of *static* tensors only: it reads and updates buffers that live as
long as the graph (the engine's state, the KV caches, the drafter's buffers) and may return
tensors, which become the graph's static outputs (valid until the next replay of any graph
here). The first call for a key runs the step eagerly on a side stream (that is the step's
real work, and warms up cuBLAS and the allocator), then captures it without running it; every
later call replays the capture. All graphs of one `StepGraphs` share one memory pool, which is
safe because they are replayed one at a time on one stream.

On a CPU (or with `enabled=False`) `run` simply calls the step, so the engine has one code
path; `emulate=True` keeps the bookkeeping (keys, counts) for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager: int = 0
    keys: list = field(default_factory=list)


class StepGraphs:
    """Keyed CUDA graphs of step functions (see the module docstring)."""

    def __init__(self, device: torch.device | str, enabled: bool = True):
        self.device = torch.device(device)
        self.enabled = enabled and self.device.type == "cuda"
        self.graphs: dict[Hashable, tuple[Any, Any]] = {}
        self.stats = GraphStats()
        self.pool = None
        self.token: Hashable = None

    def invalidate(self, token: Hashable) -> None:
        """Drop every graph when `token` (what the captured buffers depend on) changed."""
        if token != self.token:
            self.graphs.clear()
            self.pool = None
            self.token = token
            self.stats.keys = []

    def run(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        if not self.enabled:
            self.stats.eager += 1
            return fn()
        entry = self.graphs.get(key)
        if entry is not None:
            entry[0].replay()
            self.stats.replays += 1
            return entry[1]
        out = self._warm(fn)
        self.graphs[key] = self._capture(fn)
        self.stats.captures += 1
        self.stats.keys.append(key)
        return out

    def _warm(self, fn: Callable[[], Any]) -> Any:
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(s)
        return out

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = fn()
        return g, out


class AsyncFlags:
    """Reads a small device tensor one step late without stalling the device: `push` copies
    it to pinned host memory behind the step just launched; `pop` returns the values pushed
    one call earlier (waiting only for that older step). On a CPU it reads at once."""

    def __init__(self, device: torch.device, size: int, lag: int):
        self.cuda = device.type == "cuda"
        self.lag = lag
        pin = self.cuda
        self.bufs = [torch.zeros(size, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self.pushed = 0
        self.popped = 0

    def push(self, t: torch.Tensor) -> None:
        i = self.pushed % 2
        if self.cuda:
            self.bufs[i].copy_(t, non_blocking=True)
            self.events[i].record()
        else:
            self.bufs[i].copy_(t)
        self.pushed += 1

    def unread(self) -> int:
        """Steps pushed whose values have not been popped."""
        return self.pushed - self.popped

    def pop(self) -> list[int] | None:
        """The oldest unread values once `lag` newer pushes exist, else None."""
        if self.pushed - self.popped <= self.lag:
            return None
        i = self.popped % 2
        if self.cuda:
            self.events[i].synchronize()
        self.popped += 1
        return self.bufs[i].tolist()
