"""Greedy and speculative decoding over a batch of prompts.

prefill -> loop { drafter proposes k tokens; the target verifies [pending, drafts] in one
pass; commit the agreeing prefix + the target's own next token }. With no drafter (k = 0)
the same loop is plain greedy AR decoding. Every committed token is the target's argmax
given the committed prefix, so the output equals greedy decoding by construction.

A step never waits for the host: acceptance, commit (tokens, lengths), the per-row finished
flag (EOS or max_new_tokens reached) and each step's commit count are updated on the device
in persistent buffers. Finished rows keep running harmlessly (their length stops advancing).
The host learns "all finished" and the longest row one step late (`AsyncFlags`), which also
bounds the attended cache prefix (`kv_bucket` multiples) so that one CUDA graph per (batch, k,
bucket) serves every step (`StepGraphs`). On a CPU the flags are read at once and the
attended prefix is exact. A request's own stop rule (stop ids, stop strings: `Stop`) runs on
the host after every step, on the rows that have one, and marks a row finished once it
fires. Outputs are cut at the first EOS / max_new_tokens / stop at the end, and the metrics
count the steps that returned tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from .cuda_graphs import AsyncFlags, StepGraphs
from .drafter import Drafter
from .errors import RequestError
from .model import Transformer


@dataclass
class RequestMetrics:
    prompt_tokens: int
    new_tokens: int
    verify_steps: int
    accept_length: float  # tokens committed by verify steps / verify steps (bonus included)
    accept_hist: list[int]  # accept_hist[n]: verify steps (that returned a token) accepting n drafts
    prefill_s: float
    decode_s: float


@dataclass
class Generation:
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str  # "eos" | "stop" (the request's own Stop) | "length"
    metrics: RequestMetrics

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _State:
    """Per-(batch, k) device buffers the steps (and their CUDA graphs) read and update."""

    tokens: Tensor  # [B, S] committed tokens (+ scratch beyond lengths)
    lengths: Tensor  # [B] committed length; the last committed token is pending
    prompt_lens: Tensor  # [B]
    done: Tensor  # [B] bool
    steps: Tensor  # [B] verify steps while live
    commits: Tensor  # [B, S]: tokens committed by each of those steps
    drafts: Tensor  # [B, max(k, 1)]
    eos: Tensor  # [E] EOS ids (-1 = none)
    max_new: Tensor  # [] max_new_tokens
    stats: Tensor  # [2]: all done, longest row


#: A request's own stop rule: given its output so far, the length to cut it to once it must
#: end (a stop id or a stop string reached; the server's `protocol.stop_rule`), else None.
Stop = Callable[[list[int]], int | None]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _step_metrics(commits: list[int], n_out: int, width: int) -> tuple[int, list[int]]:
    """Verify steps and accept histogram of an output of `n_out` tokens (the first one from
    prefill), from each step's commit count: the steps that returned a token, each in the
    bin of the drafts it accepted (the drafter's acceptance, which the acceptance estimates
    read: a last step cut by the output's end still counts what it accepted), so
    0 <= sum((n + 1) * hist[n]) - (n_out - 1) < width."""
    hist, left = [0] * width, n_out - 1
    for c in commits:
        if left <= 0:
            break
        hist[c - 1] += 1
        left -= c
    return sum(hist), hist


@dataclass
class Engine:
    """A target model, an optional drafter and the decoding knobs.

    `cuda_graphs` (CUDA only): capture each step once per (batch, k, attended prefix) and
    replay it. `kv_bucket` (CUDA only): attend to the cache prefix rounded up to this many
    slots (0: the whole static cache). `pdl` (CUDA, compute capability 9.0+): launch the
    step's Triton kernels with programmatic dependent launch (`kernels/pdl.py`)."""

    target: Transformer
    drafter: Drafter | None = None
    k: int = 4
    eos_ids: tuple[int, ...] = field(default_factory=tuple)
    cuda_graphs: bool = True
    kv_bucket: int = 256
    pdl: bool = True

    def __post_init__(self) -> None:
        if not self.eos_ids:
            self.eos_ids = self.target.cfg.eos_token_ids
        if self.drafter is None:
            self.k = 0
        self._check_k()
        self._states: dict[tuple[int, int, int], _State] = {}
        self._graphs: StepGraphs | None = None
        self.lag: int | None = None  # flag-read lag; None = 1 on CUDA, 0 on CPU

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

    @property
    def graph_stats(self):
        return None if self._graphs is None else self._graphs.stats

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int = 128,
                 ignore_eos: bool = False,
                 stops: list[Stop | None] | None = None) -> list[Generation]:
        """Greedy outputs of `prompts`; `stops[b]`, if given, is prompt b's own stop rule."""
        if not prompts:
            return []
        if self.pdl and self.target.device.type == "cuda":
            from ..kernels import pdl

            with pdl.scope(True):
                return self._generate(prompts, max_new_tokens, ignore_eos, stops)
        return self._generate(prompts, max_new_tokens, ignore_eos, stops)

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool,
                  stops: list[Stop | None] | None) -> list[Generation]:
        self._check(prompts, max_new_tokens)
        stops = stops or [None] * len(prompts)
        prepare = getattr(self.drafter, "prepare", None)
        if prepare is not None:
            prepare(prompts, max_new_tokens, self)  # may call generate (oracle recording)
        dev = self.target.device
        cuda = dev.type == "cuda"
        B, k = len(prompts), self.k
        lens = [len(p) for p in prompts]
        T = max(lens)
        # finished rows may sit k past max_new_tokens and still verify k ahead; +1 scratch
        need = T + max_new_tokens + 2 * k + 2
        bucket = self.kv_bucket if cuda else 0
        self.target.setup_cache(B, _round_up(need, bucket) if bucket else need)
        S = self.target.max_seq_len  # the scratch slot S - 1 takes prefill padding
        if self.drafter is not None:
            self.drafter.setup(B, S)
        layers = self.drafter.hidden_layers if self.drafter is not None else ()
        graphs = self._graphs_for(dev)

        # Prefill, left-padded: pad columns write to the scratch slot S-1.
        t0 = time.perf_counter()
        inp = torch.zeros(B, T, dtype=torch.long, device=dev)
        pos = torch.full((B, T), S - 1, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            inp[b, T - len(p):] = torch.tensor(p, device=dev)
            pos[b, T - len(p):] = torch.arange(len(p), device=dev)
        pred, hidden = self.target.step(inp, pos, hidden_layers=layers, last_only=True)
        first = pred[:, -1]
        st = self._state(B, k, S, dev)
        st.tokens.zero_()
        for b, p in enumerate(prompts):
            st.tokens[b, : len(p)] = inp[b, T - len(p):]
        plens = torch.tensor(lens, device=dev)
        st.tokens[torch.arange(B, device=dev), plens] = first
        st.prompt_lens.copy_(plens)
        st.lengths.copy_(plens + 1)
        st.steps.zero_()
        st.commits.zero_()
        eos = [] if ignore_eos else list(self.eos_ids)
        st.eos.fill_(-1)
        if eos:
            st.eos[: len(eos)] = torch.tensor(eos, device=dev)
        st.max_new.fill_(max_new_tokens)
        st.done.copy_((first[:, None] == st.eos).any(1) | (max_new_tokens <= 1))
        if self.drafter is not None:
            rows = None if hidden is None else [hidden[b, T - n:] for b, n in enumerate(lens)]
            self.drafter.prefill(prompts, rows)
        stopping = [b for b in range(B) if stops[b] is not None]  # rows a Stop may end
        all_done = self._stop_rows(st, stops, stopping, lens) if stopping else bool(st.done.all())
        prefill_s = time.perf_counter() - t0

        t1 = time.perf_counter()
        flags = AsyncFlags(dev, 2, self.lag if self.lag is not None else int(cuda))
        known_max = max(lens) + 1
        while not all_done:
            # longest row now <= known_max + (k+1) per step launched since that reading
            bound = min(known_max + flags.unread() * (k + 1) + k, S)
            kv_len = min(_round_up(bound, bucket), S) if bucket else bound
            self._step(st, graphs, kv_len)
            flags.push(st.stats)
            got = flags.pop()
            if got is not None:
                all_done, known_max = bool(got[0]), got[1]
            if stopping:  # a sync per step, only for batches with a request's own stops
                all_done = self._stop_rows(st, stops, stopping, lens) or all_done
        tokens, lengths = st.tokens.tolist(), st.lengths.tolist()
        commits = st.commits[:, :max_new_tokens].tolist()
        decode_s = time.perf_counter() - t1

        out = []
        eos_set = set(eos)
        for b in range(B):
            ids = tokens[b][lens[b]: lengths[b]][:max_new_tokens]
            reason = "length"
            for j, t in enumerate(ids):
                if t in eos_set:
                    ids, reason = ids[: j + 1], "eos"
                    break
            cut = stops[b](ids) if stops[b] is not None else None
            if cut is not None:
                ids, reason = ids[:cut], "stop"
            steps, hist = _step_metrics(commits[b], len(ids), k + 1)
            out.append(Generation(
                prompt_ids=list(prompts[b]),
                output_ids=ids,
                finish_reason=reason,
                metrics=RequestMetrics(
                    prompt_tokens=lens[b],
                    new_tokens=len(ids),
                    verify_steps=steps,
                    accept_length=(len(ids) - 1) / steps if steps else 0.0,
                    accept_hist=hist,
                    prefill_s=prefill_s,
                    decode_s=decode_s,
                ),
            ))
        return out

    def _stop_rows(self, st: _State, stops: list[Stop | None], rows: list[int],
                   lens: list[int]) -> bool:
        """Mark finished the `rows` whose stop rule fires on their output so far (rows that
        finished are dropped from `rows`); returns whether every row is finished."""
        done, lengths = st.done.tolist(), st.lengths.tolist()
        for b in list(rows):
            if not done[b] and stops[b](st.tokens[b, lens[b]: lengths[b]].tolist()) is None:
                continue
            if not done[b]:
                st.done[b] = True
                done[b] = True
            rows.remove(b)
        return all(done)

    # -- the device-side step -------------------------------------------------------------

    def _graphs_for(self, dev: torch.device) -> StepGraphs:
        if self._graphs is None or self._graphs.device != dev:
            self._graphs = StepGraphs(dev, enabled=self.cuda_graphs)
        token = (self.target.cache_version, getattr(self.drafter, "graph_version", 0))
        if token != self._graphs.token:
            self._states.clear()  # buffers and graphs are re-made together
        self._graphs.invalidate(token)
        return self._graphs

    def _state(self, B: int, k: int, S: int, dev: torch.device) -> _State:
        key = (B, k, S)
        st = self._states.get(key)
        if st is None:
            def z(*shape, dtype=torch.long):
                return torch.zeros(shape, dtype=dtype, device=dev)

            st = _State(tokens=z(B, S), lengths=z(B), prompt_lens=z(B),
                        done=z(B, dtype=torch.bool), steps=z(B), commits=z(B, S),
                        drafts=z(B, max(k, 1)), eos=z(max(len(self.eos_ids), 1)),
                        max_new=z(), stats=z(2))
            self._states[key] = st
        return st

    def _step(self, st: _State, graphs: StepGraphs, kv_len: int) -> None:
        k, d = self.k, self.drafter
        key = (st.tokens.shape[0], k, kv_len, id(st))
        if d is not None and hasattr(d, "kv_len"):
            d.kv_len = kv_len  # the attended prefix for a drafter with its own cache
        if d is None or getattr(d, "graph_safe", False):
            graphs.run(key, lambda: self._whole_step(st, kv_len))
            return
        st.drafts.copy_(d.propose(st.tokens, st.lengths, k))
        start, n_acc, hidden = graphs.run(key, lambda: self._verify_commit(st, kv_len))
        d.accept(start, n_acc, hidden)

    def _whole_step(self, st: _State, kv_len: int) -> None:
        d = self.drafter
        if d is not None:
            st.drafts.copy_(d.propose(st.tokens, st.lengths, self.k))
        start, n_acc, hidden = self._verify_commit(st, kv_len)
        if d is not None:
            d.accept(start, n_acc, hidden)

    def _verify_commit(self, st: _State, kv_len: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Verify [pending, drafts], commit on the device; returns (start, n_accepted, hidden)."""
        k = self.k
        ar = torch.arange(k + 1, device=st.tokens.device)
        start = st.lengths - 1
        inp = st.tokens.gather(1, start[:, None])
        if k:
            inp = torch.cat([inp, st.drafts], dim=1)
        layers = self.drafter.hidden_layers if self.drafter is not None else ()
        pred, hidden = self.target.step(inp, start[:, None] + ar, hidden_layers=layers,
                                        kv_len=kv_len)  # [B, k+1]
        if k:
            n_acc = (st.drafts == pred[:, :k]).long().cumprod(1).sum(1)
        else:
            n_acc = torch.zeros_like(start)
        live = (~st.done).long()
        st.tokens.scatter_(1, st.lengths[:, None] + ar, pred)
        hit = ((pred[:, :, None] == st.eos).any(-1) & (ar <= n_acc[:, None])).any(1)
        st.commits.scatter_(1, st.steps[:, None], (live * (n_acc + 1))[:, None])
        st.steps.add_(live)
        st.lengths.add_(live * (n_acc + 1))
        st.done.logical_or_(hit | (st.lengths - st.prompt_lens >= st.max_new))
        st.stats.copy_(torch.stack([st.done.all().long(), st.lengths.max()]))
        return start, n_acc, hidden

    def _check(self, prompts: list[list[int]], max_new_tokens: int,
               name: str = "max_new_tokens") -> None:
        """Refuse a request the engine cannot serve; `name`: what the caller calls
        max_new_tokens (an API's own field)."""
        cfg = self.target.cfg
        ctx = cfg.max_position_embeddings
        self._check_k()
        if max_new_tokens < 1:
            raise RequestError(f"{name} must be at least 1, got {max_new_tokens}")
        for i, p in enumerate(prompts):
            if not p:
                raise RequestError(f"prompt {i} is empty: give at least one token")
            bad = [t for t in p if not 0 <= t < cfg.vocab_size]
            if bad:
                raise RequestError(
                    f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {cfg.vocab_size})"
                )
            # every returned token sits at a position < len(p) + max_new_tokens; drafts verified
            # past it are never returned (and the cache has room for them)
            if len(p) + max_new_tokens > ctx:
                fix = (f"ask for at most {ctx - len(p)} new tokens or shorten the prompt"
                       if len(p) < ctx else f"shorten the prompt to under {ctx} tokens")
                raise RequestError(
                    f"prompt {i} has {len(p)} tokens and {name}={max_new_tokens}: that needs "
                    f"{len(p)} + {max_new_tokens} = {len(p) + max_new_tokens} positions but the "
                    f"model's context is {ctx}: {fix}"
                )
