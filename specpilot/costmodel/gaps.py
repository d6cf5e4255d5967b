"""Gap ranking: where a measured engine loses time against the roofline, largest first.

Input: a `Profile` (per-step ms of draft, verify, accept/commit and overhead, optional
per-operator ms, committed tokens per step) and the step bounds from `roofline`. Output: a
`GapReport` of gaps in ms per committed token, each with a reason the search's agents can
act on. A measured time below its physical floor is flagged `measurement_error`: the timer,
the workload or the output is wrong (the search's cheat detector).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..runtime.errors import SpecPilotError
from .hardware import Hardware
from .roofline import OpCost, StepCost

COMPONENTS = ("draft", "verify", "accept", "overhead")
MEASUREMENT_ERROR = "measurement_error"


@dataclass
class Profile:
    """A measured engine, per decode step (one draft + one verify for all sequences)."""

    batch_size: int
    tokens_per_step: float  # committed tokens per sequence per step (bonus included; 1 = AR)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    accept_ms: float = 0.0
    overhead_ms: float = 0.0
    k: int = 0
    context: int = 0
    ops: dict[str, float] = field(default_factory=dict)  # "verify/qkv_proj" -> ms per step

    def component_ms(self, name: str) -> float:
        return float(getattr(self, f"{name}_ms"))

    @property
    def step_ms(self) -> float:
        return sum(self.component_ms(c) for c in COMPONENTS)

    @property
    def tokens(self) -> float:
        """Committed tokens per step, all sequences."""
        return self.batch_size * self.tokens_per_step

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: str) -> Profile:
        return cls.from_dict(json.loads(s))


@dataclass
class Gap:
    """One component or operator: measured against bound, per committed token."""

    name: str  # "verify" or "verify/qkv_proj"
    measured_ms: float  # per committed token
    bound_ms: float  # per committed token
    gap_ms: float  # measured - bound, per committed token
    share: float  # of the whole gap
    reason: str
    flag: str = ""  # "" | "measurement_error"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GapReport:
    gaps: list[Gap]  # components, largest gap first
    op_gaps: list[Gap]  # operators, largest gap first (a finer cut of draft/verify)
    measured_ms_per_token: float
    bound_ms_per_token: float
    measurement_error: bool

    @property
    def efficiency(self) -> float:
        return self.bound_ms_per_token / self.measured_ms_per_token

    def to_dict(self) -> dict:
        return {"gaps": [g.to_dict() for g in self.gaps],
                "op_gaps": [g.to_dict() for g in self.op_gaps],
                "measured_ms_per_token": self.measured_ms_per_token,
                "bound_ms_per_token": self.bound_ms_per_token,
                "measurement_error": self.measurement_error}

    @classmethod
    def from_dict(cls, d: dict) -> GapReport:
        return cls(gaps=[Gap(**g) for g in d["gaps"]], op_gaps=[Gap(**g) for g in d["op_gaps"]],
                   measured_ms_per_token=d["measured_ms_per_token"],
                   bound_ms_per_token=d["bound_ms_per_token"],
                   measurement_error=d["measurement_error"])

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: str) -> GapReport:
        return cls.from_dict(json.loads(s))


def bound_ms_per_token(bounds: dict[str, StepCost], tokens: float) -> float:
    """The floor of one committed token: no engine can beat it (draft + verify floors)."""
    return sum(b.bound_ms for b in bounds.values()) / tokens


def _reason(measured_ms: float, bytes_: float, flops: float, bound_ms: float, kernels: int,
            limit: str, hw: Hardware) -> str:
    if measured_ms <= 0:
        return "not measured"
    if bytes_ == 0 and flops == 0:
        return "host-side work (no device bytes needed): overlap it with the device's work"
    s = measured_ms / 1e3
    bw_pct = 100 * bytes_ / s / hw.bound_bw
    launch_ms = kernels * hw.launch_s * 1e3
    if bound_ms < 0.5 * measured_ms and launch_ms >= 0.5 * measured_ms:
        return (f"launch-bound: ~{kernels} kernels x {hw.launch_s * 1e6:.1f} us = "
                f"{launch_ms:.3f} ms of {measured_ms:.3f} ms; fuse kernels or use a CUDA graph")
    if limit == "compute":
        rate = max(hw.bound_flops(d) for d in hw.flops)
        return f"compute-bound at {100 * flops / s / rate:.0f}% of peak FLOP/s"
    return (f"memory-bound at {bw_pct:.0f}% of bandwidth ({bytes_ / 1e9:.3g} GB, "
            f"floor {bound_ms:.3f} ms)")


def _limit(ops: list[OpCost]) -> str:
    comp = sum(o.bound_ms for o in ops if o.limit == "compute")
    return "compute" if comp > 0.5 * sum(o.bound_ms for o in ops) else "memory"


def rank_gaps(profile: Profile, bounds: dict[str, StepCost], hw: Hardware,
              tol: float = 0.03) -> GapReport:
    """Rank the measured profile's gaps against `bounds` ({"draft": .., "verify": ..}; for
    AR give the AR step as "verify"). Times below (1 - tol) x bound are measurement errors."""
    if "verify" not in bounds:
        raise SpecPilotError("rank_gaps needs a 'verify' bound (the AR step for AR engines)")
    if profile.tokens <= 0:
        raise SpecPilotError("a profile needs batch_size >= 1 and tokens_per_step > 0")
    per = 1.0 / profile.tokens
    gaps: list[Gap] = []
    for c in COMPONENTS:
        m = profile.component_ms(c)
        b = bounds.get(c)
        if b is not None:
            bound = b.bound_ms
            reason = _reason(m, b.bytes, b.flops, bound, b.kernels, _limit(b.ops), hw)
        elif c == "accept":
            bound, reason = 0.0, ("host-side accept/commit: needs no device work; fuse it "
                                  "into verify or overlap it with the next draft")
        elif c == "overhead":
            bound, reason = 0.0, ("launch/sync overhead between kernels and steps: CUDA "
                                  "graphs, fewer host syncs, overlap")
        else:
            bound, reason = 0.0, "no bound given for this component"
        gaps.append(Gap(c, m * per, bound * per, (m - bound) * per, 0.0, reason))
    op_gaps: list[Gap] = []
    for key, m in profile.ops.items():
        comp, _, name = key.rpartition("/")
        comp = comp or "verify"
        if comp not in bounds:
            raise SpecPilotError(f"profile op {key!r}: no {comp!r} bound to compare it with")
        try:
            o = bounds[comp].op(name)
        except KeyError:
            raise SpecPilotError(f"profile op {key!r}: the cost model has no operator {name!r} "
                                 f"(it has {', '.join(x.name for x in bounds[comp].ops)})"
                                 ) from None
        reason = _reason(m, o.bytes, o.flops, o.bound_ms, o.count, o.limit, hw)
        op_gaps.append(Gap(f"{comp}/{name}", m * per, o.bound_ms * per,
                           (m - o.bound_ms) * per, 0.0, reason))
    bad = False
    for g in gaps + op_gaps:
        if g.measured_ms > 0 and g.measured_ms < (1 - tol) * g.bound_ms:
            g.flag = MEASUREMENT_ERROR
            g.reason = (f"measured {g.measured_ms:.4g} ms/token is below the physical floor "
                        f"{g.bound_ms:.4g} ms/token: the timer, the workload or the output is "
                        "wrong")
            bad = True
    for lst in (gaps, op_gaps):
        total = sum(max(g.gap_ms, 0.0) for g in lst)
        for g in lst:
            g.share = max(g.gap_ms, 0.0) / total if total > 0 else 0.0
        lst.sort(key=lambda g: (g.flag != MEASUREMENT_ERROR, -g.gap_ms))
    measured = profile.step_ms * per
    floor = sum(bounds[c].bound_ms for c in ("draft", "verify") if c in bounds) * per
    if measured > 0 and measured < (1 - tol) * floor:
        bad = True
    return GapReport(gaps, op_gaps, measured, floor, bad)
