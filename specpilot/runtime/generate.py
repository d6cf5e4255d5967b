"""Greedy and speculative decoding over a batch of prompts.

prefill -> loop { drafter proposes k tokens; the target verifies [pending, drafts] in one
pass; commit the agreeing prefix + the target's own next token }. With no drafter (k = 0)
the same loop is plain greedy AR decoding. Every committed token is the target's argmax
given the committed prefix, so the output equals greedy decoding by construction.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from .drafter import Drafter
from .errors import RequestError
from .model import Transformer


@dataclass
class RequestMetrics:
    prompt_tokens: int
    new_tokens: int
    verify_steps: int
    accept_length: float  # tokens committed by verify steps / verify steps (bonus included)
    accept_hist: list[int]  # accept_hist[n]: verify steps that accepted n drafted tokens
    prefill_s: float
    decode_s: float


@dataclass
class Generation:
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str  # "eos" | "length"
    metrics: RequestMetrics

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Engine:
    """A target model, an optional drafter and the decoding knobs."""

    target: Transformer
    drafter: Drafter | None = None
    k: int = 4
    eos_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.eos_ids:
            self.eos_ids = self.target.cfg.eos_token_ids
        if self.drafter is None:
            self.k = 0
        self._check_k()

    def _check_k(self) -> None:
        if self.drafter is None:
            return
        if self.k < 1:
            raise RequestError(f"k={self.k}: a drafter needs k >= 1 (no drafter means AR)")
        mk = self.drafter.max_k
        if mk is not None and self.k > mk:
            raise RequestError(
                f"k={self.k} but the {self.drafter.name} drafter proposes at most {mk} tokens "
                f"per step: use k <= {mk}"
            )

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int = 128,
                 ignore_eos: bool = False) -> list[Generation]:
        if not prompts:
            return []
        self._check(prompts, max_new_tokens)
        dev = self.target.device
        B, k = len(prompts), self.k
        lens = [len(p) for p in prompts]
        T = max(lens)
        S = T + max_new_tokens + k + 2  # +1 scratch slot (S-1) for prefill padding
        self.target.setup_cache(B, S)
        if self.drafter is not None:
            self.drafter.setup(B, S)
        layers = self.drafter.hidden_layers if self.drafter is not None else ()
        eos = set() if ignore_eos else set(self.eos_ids)

        # Prefill, left-padded: pad columns write to the scratch slot S-1.
        t0 = time.perf_counter()
        inp = torch.zeros(B, T, dtype=torch.long, device=dev)
        pos = torch.full((B, T), S - 1, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            inp[b, T - len(p):] = torch.tensor(p, device=dev)
            pos[b, T - len(p):] = torch.arange(len(p), device=dev)
        logits, hidden = self.target(inp, pos, hidden_layers=layers, last_only=True)
        first = logits[:, -1].argmax(-1)
        tokens = torch.zeros(B, S, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = inp[b, T - len(p):]
        tokens[torch.arange(B, device=dev), torch.tensor(lens, device=dev)] = first
        if self.drafter is not None:
            rows = None if hidden is None else [hidden[b, T - n:] for b, n in enumerate(lens)]
            self.drafter.prefill(prompts, rows)
        first_host = first.tolist()
        prefill_s = time.perf_counter() - t0

        outputs = [[t] for t in first_host]
        finish = ["" for _ in range(B)]
        for b in range(B):
            if first_host[b] in eos:
                finish[b] = "eos"
            elif max_new_tokens <= 1:
                finish[b] = "length"
        lengths_host = [n + 1 for n in lens]
        steps = [0] * B
        committed = [0] * B
        hist = [[0] * (k + 1) for _ in range(B)]
        ar = torch.arange(k + 1, device=dev)

        t1 = time.perf_counter()
        while not all(finish):
            lengths = torch.tensor(lengths_host, device=dev)
            start = lengths - 1
            pending = tokens.gather(1, start[:, None])
            if k:
                drafts = self.drafter.propose(tokens, lengths, k)
                inp = torch.cat([pending, drafts], dim=1)
            else:
                inp = pending
            vpos = start[:, None] + ar
            logits, hidden = self.target(inp, vpos, hidden_layers=layers,
                                         kv_len=max(lengths_host) + k)
            pred = logits.argmax(-1)  # [B, k+1]
            if k:
                n_acc = (drafts == pred[:, :k]).long().cumprod(1).sum(1)
            else:
                n_acc = torch.zeros(B, dtype=torch.long, device=dev)
            tokens.scatter_(1, lengths[:, None] + ar, pred)
            if self.drafter is not None:
                self.drafter.accept(start, n_acc, hidden)
            pred_host, n_host = pred.tolist(), n_acc.tolist()
            for b in range(B):
                if finish[b]:
                    continue
                new = pred_host[b][: n_host[b] + 1]
                steps[b] += 1
                hist[b][n_host[b]] += 1
                room = max_new_tokens - len(outputs[b])
                if len(new) >= room:
                    new, finish[b] = new[:room], "length"
                for j, t in enumerate(new):
                    if t in eos:
                        new, finish[b] = new[: j + 1], "eos"
                        break
                outputs[b].extend(new)
                committed[b] += len(new)
                lengths_host[b] += len(new)
        decode_s = time.perf_counter() - t1

        return [
            Generation(
                prompt_ids=list(prompts[b]),
                output_ids=outputs[b],
                finish_reason=finish[b],
                metrics=RequestMetrics(
                    prompt_tokens=lens[b],
                    new_tokens=len(outputs[b]),
                    verify_steps=steps[b],
                    accept_length=committed[b] / steps[b] if steps[b] else 0.0,
                    accept_hist=hist[b],
                    prefill_s=prefill_s,
                    decode_s=decode_s,
                ),
            )
            for b in range(B)
        ]

    def _check(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        cfg = self.target.cfg
        self._check_k()
        if max_new_tokens < 1:
            raise RequestError("max_new_tokens must be at least 1")
        for i, p in enumerate(prompts):
            if not p:
                raise RequestError(f"prompt {i} is empty: give at least one token")
            bad = [t for t in p if not 0 <= t < cfg.vocab_size]
            if bad:
                raise RequestError(
                    f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {cfg.vocab_size})"
                )
            if len(p) + max_new_tokens + self.k + 2 > cfg.max_position_embeddings:
                raise RequestError(
                    f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it "
                    f"exceeds the model's context of {cfg.max_position_embeddings}: shorten it"
                )
