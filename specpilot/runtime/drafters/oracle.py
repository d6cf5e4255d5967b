"""`oracle[:ARGS]`: a drafter with controlled acceptance, for perf runs on random weights.

It replays the target's own greedy continuation of each prompt and corrupts each drafted
token with probability 1 - alpha, so a step accepts n drafts with the geometric law of rate
alpha. Whether the draft at position p of a prompt is corrupted is a fixed hash of
(seed, prompt, p): the same on CPU and GPU, eagerly or in a CUDA graph, with no RNG state.

The continuation is recorded on the exact path the speculative run takes: `prepare` runs the
engine that will use the oracle (same batch and row order, same k, CUDA graphs, KV bucket and
captured graphs) once with every draft rejected, so each position's logits come from the same
kernels and shapes as in the run. (A separate AR engine differs in the last bits of bf16
logits and, at near-ties, in the token, after which the replayed drafts go off-track.) Each
batch (its prompts in order) is recorded once per engine and k. Records given explicitly
(constructor or file) are used as they are; only prompts missing from them are recorded.

Drafting cost is modelled by running k one-token steps of a random draft model of a preset
size (`draft=0.6b`, or an EAGLE-class head `draft=eagle-8b` whose smaller vocabulary is
fed the token ids modulo its size) each propose and discarding their output; with `draft_graphs` (default)
they are captured in the engine's step graph per (batch, k, KV bucket) like a real draft
model's steps, else they run eagerly before the graphed verify. The target still verifies
every draft, so the output is the target's greedy output whatever the oracle proposes.

ARGS: comma-separated `alpha=0.8`, `seed=0`, `draft=none|0.6b|1.7b|eagle-8b|...`,
`draft_graphs=1|0` and optionally a path to a JSON records file (`[{"prompt": [...], "output": [...]}, ...]`).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..drafter import Drafter
from ..errors import CheckpointError
from ..model import Transformer

M31 = 0x7FFFFFFF


@dataclass(frozen=True)
class OracleArgs:
    alpha: float = 0.8
    seed: int = 0
    draft: str = "none"
    records: str = ""
    draft_graphs: bool = True


def parse_oracle(spec: str) -> OracleArgs:
    """`oracle`, `oracle:alpha=0.9,draft=0.6b`, `oracle:/path/records.json,alpha=0.7`."""
    kind, _, rest = spec.partition(":")
    if kind != "oracle":
        raise CheckpointError(f"not an oracle drafter spec: {spec!r}")
    vals: dict = {}
    for part in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, val = part.partition("=")
        if not eq:
            vals["records"] = part
            continue
        try:
            if key == "alpha":
                vals["alpha"] = float(val)
            elif key == "seed":
                vals["seed"] = int(val)
            elif key == "draft":
                vals["draft"] = val
            elif key == "draft_graphs":
                vals["draft_graphs"] = {"1": True, "0": False}[val]
            else:
                raise KeyError(key)
        except (ValueError, KeyError):
            raise CheckpointError(f"bad oracle argument {part!r}: use alpha=0..1, seed=INT, "
                                  f"draft=PRESET, draft_graphs=0|1 or a records file path"
                                  ) from None
    args = OracleArgs(**vals)
    if not 0.0 <= args.alpha <= 1.0:
        raise CheckpointError(f"oracle alpha={args.alpha} must lie in [0, 1]")
    return args


def _mix(x: Tensor) -> Tensor:
    """A 31-bit integer hash (products stay below 2**62: no overflow in int64)."""
    for _ in range(3):
        x = (x * 1103515245 + 12345) & M31
        x = x ^ (x >> 13)
    return x


def prompt_key(prompt: list[int]) -> int:
    return zlib.crc32(json.dumps(list(prompt)).encode()) & M31


class OracleDrafter(Drafter):
    name = "oracle"

    def __init__(self, target: Transformer, alpha: float = 0.8, seed: int = 0,
                 draft_model: Transformer | None = None,
                 records: dict[tuple[int, ...], list[int]] | None = None,
                 draft_graphs: bool = True):
        self.target = target
        self.seed = int(seed)
        self.draft_model = draft_model
        self.records: dict[tuple[int, ...], list[int]] = dict(records or {})
        self.fixed_records = records is not None
        # propose/accept only read and update persistent buffers: capturable in the step graph
        self.graph_safe = bool(draft_graphs)
        self.kv_len: int | None = None  # set by the engine before each step
        self.graph_version = 0
        self._alpha = torch.zeros((), dtype=torch.float32, device=target.device)
        self.alpha = alpha
        self._bufs: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor]] = {}
        self._cur: tuple[Tensor, Tensor, Tensor] | None = None
        self._recorder = None
        self._recording = False
        # exact-path records per (engine, k, knobs, batch): a bench cycling over batches
        # records each once; `_active` is the current batch's (None: `records`)
        self._by_sig: dict[tuple, dict[tuple[int, ...], list[int]]] = {}
        self._active: dict[tuple[int, ...], list[int]] | None = None
        self.recordings = 0  # recording runs made (for tests and benchmarks)

    @property
    def alpha(self) -> float:
        return self._alpha_host

    @alpha.setter
    def alpha(self, value: float) -> None:
        """Settable between generate calls: a device scalar, so captured graphs follow it."""
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"oracle alpha={value} must lie in [0, 1]")
        self._alpha_host = float(value)
        self._alpha.fill_(self._alpha_host)

    # -- records --------------------------------------------------------------------------

    def prepare(self, prompts: list[list[int]], max_new_tokens: int, engine=None) -> None:
        """Record the target's greedy continuation on `engine`'s own path (see the module
        docstring); without an engine, on a plain AR engine of the target."""
        if self._recording:
            return
        keys = [tuple(p) for p in prompts]
        self._active = None
        if self.fixed_records or engine is None:
            missing = [p for p in dict.fromkeys(keys)
                       if len(self.records.get(p, ())) < max_new_tokens]
            if missing:
                self._record(engine, [list(p) for p in missing], max_new_tokens)
            return
        sig = (id(engine), engine.k, engine.kv_bucket, engine.cuda_graphs, tuple(keys))
        got = self._by_sig.get(sig)
        if got is None or any(len(got[p]) < max_new_tokens for p in keys):
            # k + 1 more than asked, when the context allows: the run's last step drafts
            # past max_new_tokens, and those drafts should be as good as the others
            room = self.target.cfg.max_position_embeddings - max(map(len, keys)) - engine.k - 2
            n = max(max_new_tokens, min(max_new_tokens + engine.k + 1, room))
            self._record(engine, [list(p) for p in prompts], n)
            if len(self._by_sig) >= 1024:  # bounded: a server sees ever new batches
                self._by_sig.pop(next(iter(self._by_sig)))
            self._by_sig[sig] = {p: self.records[p] for p in keys}
        self._active = self._by_sig[sig]

    def _record(self, engine, prompts: list[list[int]], max_new_tokens: int) -> None:
        if engine is None:
            if self._recorder is None:
                from ..generate import Engine

                self._recorder = Engine(self.target)
            engine = self._recorder
        self._recording = True
        try:
            gens = engine.generate(prompts, max_new_tokens, ignore_eos=True)
        finally:
            self._recording = False
        for p, g in zip(prompts, gens):
            self.records[tuple(p)] = g.output_ids
        self.recordings += 1

    def save_records(self, path: str | Path) -> None:
        rows = [{"prompt": list(p), "output": o} for p, o in self.records.items()]
        Path(path).write_text(json.dumps(rows))

    @staticmethod
    def load_records(path: str | Path) -> dict[tuple[int, ...], list[int]]:
        try:
            rows = json.loads(Path(path).read_text())
            return {tuple(r["prompt"]): list(r["output"]) for r in rows}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"oracle records {path} unreadable ({e}): expected a JSON "
                                  f"list of {{prompt, output}}") from None

    # -- the Drafter interface ------------------------------------------------------------

    def setup(self, batch_size: int, max_seq_len: int) -> None:
        key = (batch_size, max_seq_len)
        if key not in self._bufs:
            dev = self.target.device
            self._bufs[key] = (torch.zeros(batch_size, max_seq_len, dtype=torch.long, device=dev),
                               torch.zeros(batch_size, dtype=torch.long, device=dev),
                               torch.zeros(batch_size, dtype=torch.long, device=dev))
        self._cur = self._bufs[key]
        if self.draft_model is not None:
            v = self.draft_model.cache_version
            self.draft_model.setup_cache(batch_size, max_seq_len)
            self.graph_version += self.draft_model.cache_version != v

    def prefill(self, prompts: list[list[int]], hidden) -> None:
        ref, ref_len, row_key = self._cur
        S = ref.shape[1]
        ref.zero_()
        lens, keys = [], []
        for b, p in enumerate(prompts):
            recs = self.records if self._active is None else self._active
            rec = [] if self._recording else recs.get(tuple(p), [])
            seq = (list(p) + rec)[:S]  # while recording: no record, every draft rejected
            ref[b, : len(seq)] = torch.tensor(seq, device=ref.device)
            lens.append(len(seq))
            keys.append(prompt_key(p) ^ (self.seed * 7919 & M31))
        ref_len[: len(prompts)] = torch.tensor(lens, device=ref.device)
        row_key[: len(prompts)] = torch.tensor(keys, device=ref.device)

    def propose(self, tokens: Tensor, lengths: Tensor, k: int) -> Tensor:
        ref, ref_len, row_key = self._cur
        B = tokens.shape[0]
        V = self.target.cfg.vocab_size
        p = lengths[:, None] + torch.arange(k, device=tokens.device)  # draft positions
        true = ref[:B].gather(1, p.clamp(max=ref.shape[1] - 1))
        h = _mix((row_key[:B, None] * 31 + p) & M31)
        u = (h >> 11).float() * (1.0 / (1 << 20))  # uniform in [0, 1)
        bad = (u >= self._alpha) | (p >= ref_len[:B, None])
        alt = (true + 1 + _mix(h) % (V - 1)) % V  # never the recorded token
        drafts = torch.where(bad, alt, true)
        if self.draft_model is not None:
            self._draft_cost(tokens, lengths, drafts)
        return drafts

    def _draft_cost(self, tokens: Tensor, lengths: Tensor, drafts: Tensor) -> None:
        """k sequential one-token steps of the draft model (outputs discarded)."""
        m = self.draft_model
        kv = self.kv_len if self.kv_len is not None else m.max_seq_len
        kv = min(kv, m.max_seq_len)
        x = tokens.gather(1, (lengths - 1)[:, None])
        pos = (lengths - 1)[:, None]
        Vd = m.cfg.vocab_size  # a draft head with a smaller vocabulary (EAGLE-3-class)
        if Vd < self.target.cfg.vocab_size:  # reads one embedding row per token either way
            x, drafts = x % Vd, drafts % Vd
        for j in range(drafts.shape[1]):
            m.step(x, pos + j, kv_len=kv)
            x = drafts[:, j: j + 1]


def load_oracle(spec: str, target: Transformer, knobs, device, dtype) -> OracleDrafter:
    """The oracle of a drafter spec; its draft model (if any) is random, on the target's
    device and dtype, fused like the target."""
    args = parse_oracle(spec)
    draft = None
    if args.draft not in ("", "none"):
        from ..random_model import preset_config, random_transformer

        cfg = preset_config(args.draft)
        if cfg.vocab_size > target.cfg.vocab_size:
            raise CheckpointError(f"oracle draft preset {args.draft!r} has vocabulary "
                                  f"{cfg.vocab_size}, larger than the target's "
                                  f"{target.cfg.vocab_size}: pick a smaller draft preset")
        draft = random_transformer(cfg, target.device, target.dtype, seed=args.seed + 1,
                                   fused=target.fused)
    records = OracleDrafter.load_records(args.records) if args.records else None
    return OracleDrafter(target, args.alpha, args.seed, draft, records,
                         draft_graphs=args.draft_graphs)
