"""Roofline of one decoding step: bytes, FLOPs and the time floor of every operator.

A forward pass over `batch` sequences with `q` new tokens each, on top of `context` cached
tokens, is a list of operators. Each operator's floor is max(bytes / bandwidth, FLOPs / rate);
the step's floor (`bound_ms`) is their sum. `expected_ms` uses the measured skinny-GEMM
efficiency of the device when it is calibrated, plus the per-step overhead: what a good
stock engine should reach, where `bound_ms` is what no engine can beat. W12 linears are
priced from the device's tuned kernel table where it has one (`w12_times.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..runtime.errors import SpecPilotError
from .hardware import Hardware
from .spec import ModelSpec
from .w12_times import W12Times

GEMM_KINDS = ("gemm", "experts")


@dataclass
class OpCost:
    """One operator summed over its `count` instances in the step (e.g. all layers)."""

    name: str
    kind: str  # gemm | experts | attention | embed | norm | elementwise | hidden
    count: int
    weight_bytes: float = 0.0
    act_bytes: float = 0.0
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    flops: float = 0.0
    bound_ms: float = 0.0
    expected_ms: float = 0.0
    limit: str = "memory"  # which ceiling sets bound_ms: memory | compute
    matrix_bytes: float = 0.0  # bytes of one weight matrix (for the skinny-GEMM table)
    tokens: float = 0.0  # rows of the GEMM (tokens through one instance)
    n: int = 0  # one weight matrix's shape [n, k] (linears)
    k: int = 0

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.act_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes": self.bytes}

    @classmethod
    def from_dict(cls, d: dict) -> OpCost:
        return cls(**{k: v for k, v in d.items() if k != "bytes"})


@dataclass
class StepCost:
    """A step (or the sum of several, e.g. k draft steps) and its floor."""

    name: str
    batch: int
    q: int  # new tokens per sequence in one pass
    context: int
    passes: int = 1  # sequential forward passes (k for a draft model)
    ops: list[OpCost] = field(default_factory=list)
    overhead_ms: float = 0.0

    @property
    def bytes(self) -> float:
        return sum(o.bytes for o in self.ops)

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops)

    @property
    def bound_ms(self) -> float:
        return sum(o.bound_ms for o in self.ops)

    @property
    def expected_ms(self) -> float:
        return sum(o.expected_ms for o in self.ops) + self.overhead_ms

    @property
    def kernels(self) -> int:
        return sum(o.count for o in self.ops)

    def op(self, name: str) -> OpCost:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"name": self.name, "batch": self.batch, "q": self.q, "context": self.context,
                "passes": self.passes, "bytes": self.bytes, "flops": self.flops,
                "bound_ms": self.bound_ms, "expected_ms": self.expected_ms,
                "overhead_ms": self.overhead_ms, "kernels": self.kernels,
                "ops": [o.to_dict() for o in self.ops]}

    @classmethod
    def from_dict(cls, d: dict) -> StepCost:
        return cls(name=d["name"], batch=d["batch"], q=d["q"], context=d["context"],
                   passes=d.get("passes", 1), overhead_ms=d.get("overhead_ms", 0.0),
                   ops=[OpCost.from_dict(o) for o in d.get("ops", [])])


def _linear(name: str, spec: ModelSpec, n: int, k: int, tokens: int, count: int) -> OpCost:
    mb = spec.fmt.matrix_bytes(n, k)
    a = spec.act_bytes
    return OpCost(name, "gemm", count, weight_bytes=mb * count,
                  act_bytes=tokens * (k + n) * a * count, flops=2.0 * tokens * n * k * count,
                  matrix_bytes=mb, tokens=tokens, n=n, k=k)


def expected_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Experts a batch of `tokens` tokens is expected to touch: E * (1 - (1 - k/E)^T)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def _ops(spec: ModelSpec, batch: int, q: int, context: int) -> list[OpCost]:
    t = batch * q
    h, hd, a = spec.hidden_size, spec.head_dim, spec.act_bytes
    nh, nkv, nl = spec.num_heads, spec.num_kv_heads, spec.num_layers
    n_moe = spec.moe_layers
    n_dense = nl - n_moe
    ops = [OpCost("embed", "embed", 1, weight_bytes=t * h * a, act_bytes=t * h * a)]
    ops.append(OpCost("norm", "norm", 2 * nl + 1, weight_bytes=h * a * (2 * nl + 1),
                      act_bytes=2 * t * h * a * (2 * nl + 1), flops=4.0 * t * h * (2 * nl + 1)))
    ops.append(_linear("qkv_proj", spec, (nh + 2 * nkv) * hd, h, t, nl))
    # each new token i attends to context + i + 1 positions; the cache is read once per row
    span = q * context + q * (q + 1) / 2
    ops.append(OpCost(
        "attention", "attention", nl,
        kv_read_bytes=batch * (context + q) * 2 * nkv * hd * a * nl,
        kv_write_bytes=batch * q * 2 * nkv * hd * a * nl,
        act_bytes=2 * t * nh * hd * a * nl,
        flops=4.0 * batch * nh * hd * span * nl))
    ops.append(_linear("o_proj", spec, h, nh * hd, t, nl))
    if n_dense:
        i = spec.intermediate_size
        ops.append(_linear("gate_up_proj", spec, 2 * i, h, t, n_dense))
        ops.append(OpCost("mlp_act", "elementwise", n_dense, act_bytes=3 * t * i * a * n_dense,
                          flops=5.0 * t * i * n_dense))
        ops.append(_linear("down_proj", spec, h, i, t, n_dense))
    if n_moe:
        e, k, mi = spec.num_experts, spec.experts_per_tok, spec.moe_intermediate_size
        touched = expected_experts(e, k, t)
        ops.append(_linear("router", spec, e, h, t, n_moe))
        for name, n, kk in (("experts_gate_up", 2 * mi, h), ("experts_down", h, mi)):
            mb = spec.fmt.matrix_bytes(n, kk)
            ops.append(OpCost(name, "experts", n_moe, weight_bytes=touched * mb * n_moe,
                              act_bytes=t * k * (n + kk) * a * n_moe,
                              flops=2.0 * t * k * n * kk * n_moe, matrix_bytes=mb,
                              tokens=t * k / touched))
        ops.append(OpCost("experts_act", "elementwise", n_moe,
                          act_bytes=3 * t * k * mi * a * n_moe, flops=5.0 * t * k * mi * n_moe))
        si = spec.shared_expert_intermediate_size
        if si:
            ops.append(_linear("shared_gate_up", spec, 2 * si, h, t, n_moe))
            ops.append(_linear("shared_down", spec, h, si, t, n_moe))
    ops.append(_linear("lm_head", spec, spec.vocab_size, h, t, 1))
    return ops


def _time(op: OpCost, hw: Hardware, compute: str) -> None:
    """Fill bound_ms / expected_ms / limit of `op` in place. GEMMs run on the matrix units in
    the weights' compute dtype, attention in bf16 there too (fp32 models: fp32); the rest on
    the plain fp32 units."""
    if op.kind in GEMM_KINDS:
        dtype = compute
    elif op.kind == "attention":
        dtype = "fp32" if compute == "fp32" else "bf16"
    else:
        dtype = "fp32"
    mem_s = op.bytes / hw.bound_bw
    flop_s = op.flops / hw.bound_flops(dtype)
    op.limit = "compute" if flop_s > mem_s else "memory"
    op.bound_ms = max(mem_s, flop_s) * 1e3
    rate_s = op.flops / hw.achieved_flops(dtype)
    if op.kind in GEMM_KINDS:
        per = op.weight_bytes / op.count if op.count else 0.0
        stream_s = _gemm_s(hw, op.weight_bytes, op.matrix_bytes or per, op.tokens,
                           op.bytes - op.weight_bytes)
        op.expected_ms = max(stream_s, rate_s) * 1e3
    else:
        op.expected_ms = max(op.bytes / hw.achieved_bw, rate_s) * 1e3


def _gemm_s(hw: Hardware, weight_bytes: float, matrix_bytes: float, tokens: float,
            other_bytes: float) -> float:
    """Seconds a GEMM streams its weights (at the measured skinny-GEMM rate of a matrix this
    size, when calibrated) and its other bytes."""
    w_bw = hw.gemm_bw(matrix_bytes, tokens or 1.0) if hw.gemm_table else hw.achieved_bw
    return weight_bytes / w_bw + other_bytes / hw.achieved_bw


def _price_w12(op: OpCost, hw: Hardware, f: float) -> None:
    """A W12 linear's expected time as the engine builds it (`w12_times`): its bf16 time,
    times f (W12's measured time over cuBLAS's, or 1 where the engine keeps it bf16), and
    never under its floor (the table's cuBLAS can be slower than the calibrated one)."""
    mb = 2.0 * op.n * op.k
    stream_s = _gemm_s(hw, mb * op.count, mb, op.tokens, op.bytes - op.weight_bytes)
    bf16_ms = max(stream_s, op.flops / hw.achieved_flops("bf16")) * 1e3
    op.expected_ms = max(bf16_ms * f, op.bound_ms)


def forward_cost(spec: ModelSpec, hw: Hardware, batch: int, q: int, context: int,
                 name: str = "forward") -> StepCost:
    """One forward pass: `batch` sequences, `q` new tokens each, over `context` cached."""
    if batch < 1 or q < 1 or context < 0:
        raise SpecPilotError(f"batch and tokens must be >= 1 and context >= 0 "
                             f"(got batch={batch}, q={q}, context={context})")
    ops = _ops(spec, batch, q, context)
    times = W12Times.load(hw.kernel_table) if spec.fmt.name == "w12" and hw.kernel_table else None
    for op in ops:
        _time(op, hw, spec.fmt.compute)
        if times is not None and op.kind == "gemm":
            # a tied LM head shares the embedding's weights: the engine keeps it bf16
            tied = op.name == "lm_head" and spec.tie_word_embeddings
            f = 1.0 if tied else times.factor(op.n, op.k, round(op.tokens),
                                              tuple(sorted({batch, batch * q})))
            if f is not None:
                _price_w12(op, hw, f)
    return StepCost(name, batch, q, context, ops=ops, overhead_ms=hw.step_overhead_s * 1e3)


def ar_step(spec: ModelSpec, hw: Hardware, batch: int = 1, context: int = 0) -> StepCost:
    """Autoregressive decode: one token per sequence."""
    return forward_cost(spec, hw, batch, 1, context, name="ar")


def verify_step(spec: ModelSpec, hw: Hardware, batch: int, k: int, context: int = 0) -> StepCost:
    """The target checks k drafts: k + 1 tokens per sequence in one pass."""
    return forward_cost(spec, hw, batch, k + 1, context, name="verify")


def draft_cost(kind: str, hw: Hardware, batch: int, k: int, context: int = 0,
               drafter: ModelSpec | None = None, target: ModelSpec | None = None,
               hidden_layers: int | None = None) -> StepCost:
    """What proposing k tokens costs. draft: k sequential one-token steps of the draft
    model; block: one pass over k + 1 positions plus reading the target's hidden states of
    `hidden_layers` layers (default: the drafter config's `target_layers`, else 1) and
    projecting them to the drafter's width; ngram / oracle: host-side lookups, ~0 work."""
    if kind in ("ngram", "oracle", "none", ""):
        return StepCost(f"draft({kind or 'none'})", batch, k, context, passes=0)
    if drafter is None:
        raise SpecPilotError(f"a {kind!r} drafter needs its config: pass --drafter-config")
    if kind == "draft":
        one = forward_cost(drafter, hw, batch, 1, context)
        ops = [OpCost.from_dict({**o.to_dict(), "count": o.count * k,
                                 **{f: getattr(o, f) * k for f in (
                                     "weight_bytes", "act_bytes", "kv_read_bytes",
                                     "kv_write_bytes", "flops", "bound_ms", "expected_ms")}})
               for o in one.ops]
        return StepCost("draft(draft)", batch, 1, context, passes=k, ops=ops,
                        overhead_ms=one.overhead_ms * k)
    if kind == "block":
        step = forward_cost(drafter, hw, batch, k + 1, context, name="draft(block)")
        h = (target or drafter).hidden_size
        n = hidden_layers or drafter.target_layers or 1
        t = batch * (k + 1)
        hid = OpCost("target_hidden", "hidden", 1, act_bytes=t * h * n * drafter.act_bytes)
        fc = _linear("hidden_fc", drafter, drafter.hidden_size, n * h, t, 1)
        for op in (hid, fc):
            _time(op, hw, drafter.fmt.compute)
        step.ops[0:0] = [hid, fc]
        return step
    raise SpecPilotError(f"unknown drafter kind {kind!r}: use draft, block or ngram")
