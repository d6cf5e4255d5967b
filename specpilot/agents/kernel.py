"""The kernel subagent: tune the linear kernels furthest from the memory-bandwidth bound.

From the deployment's target (its linear layers, as the cost model sees them) and the
rows a step puts through them (batch x (k + 1) for a verify step), it

1. profiles every linear shape with the engine's current kernel (cuBLAS in bf16) and
   ranks the shapes by time lost per step against the cost model's per-operator bound
   ((measured - bound) x layers);
2. autotunes the Triton W12 and bf16 kernels on the `top` worst shapes with
   `kernels.tuning.tune` (block sizes, warps, stages, split-K; every config checked
   against an fp32 reference on fresh inputs, a wrong one recorded and never used),
   launched as the engine will launch them: with programmatic dependent launch when the
   best engine's `pdl` knob is on, so that each call's prologue overlaps the tail of the
   call before it in the timed graph, as a layer's does in a step (cuBLAS cannot, in the
   step or here; the isolated and the chained times: docs/BENCHMARKS.md, nineteenth W12
   run);
3. proposes one candidate: the device's tuned table (`specpilot/kernels/tuned/<device>.json`,
   which the engine's W12 layers load) carrying the new configs, with the `weights = "w12"`
   switch when W12 beats the best bf16 kernel on a tuned shape.

Every measurement (shape, config, median and spread, bandwidth and % of the bound,
correctness) goes to the trace in the agent's note. On CPU deployments, or with fp32
weights, there is nothing to tune and it proposes nothing. The timer and the problems are
pluggable (`tune_kernels`), so the mechanics run on CPU with a fake timer.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..engines import TUNED_DIR
from .candidate import Candidate, ProposalContext

MIN_GAIN = 1.05  # W12 must beat the best bf16 kernel by this much somewhere to be proposed


def tuner_available() -> bool:
    try:
        return importlib.util.find_spec("specpilot.kernels.tuning") is not None
    except ModuleNotFoundError:
        return False


@dataclass
class LinearShape:
    """One linear operator of a step: y [m, n] = x [m, k] @ W.T, `count` times per step."""

    name: str  # the cost model's operator (qkv_proj, o_proj, ...)
    n: int
    k: int
    m: int  # rows: batch x tokens per sequence in the step
    batch: int
    count: int
    bound_us: float  # the cost model's floor for one instance
    measured_us: float = 0.0  # the current kernel, one instance

    @property
    def gap_us(self) -> float:
        """Time lost per step against the bound, all instances."""
        return (self.measured_us - self.bound_us) * self.count

    def to_dict(self) -> dict:
        return {**asdict(self), "gap_us": self.gap_us}


def _dims(spec) -> dict[str, tuple[int, int]]:
    h, hd = spec.hidden_size, spec.head_dim
    out = {"qkv_proj": ((spec.num_heads + 2 * spec.num_kv_heads) * hd, h),
           "o_proj": (h, spec.num_heads * hd), "lm_head": (spec.vocab_size, h)}
    if spec.intermediate_size:
        out.update(gate_up_proj=(2 * spec.intermediate_size, h),
                   down_proj=(h, spec.intermediate_size))
    return out


def linear_shapes(spec, hw, batch_sizes: list[int],
                  k_for: Callable[[int], int]) -> list[LinearShape]:
    """The dense linear shapes of a verify step (an AR step when k is 0) at every batch
    size, with the cost model's per-instance bound (MoE experts are left out)."""
    from ..costmodel.roofline import forward_cost

    dims = _dims(spec)
    out = []
    for b in batch_sizes:
        q = k_for(b) + 1
        for op in forward_cost(spec, hw, b, q, 0).ops:
            if op.kind == "gemm" and op.name in dims and op.count:
                n, k = dims[op.name]
                out.append(LinearShape(op.name, n, k, b * q, b, op.count,
                                       1000.0 * op.bound_ms / op.count))
    return out


@dataclass
class TuningReport:
    """What `tune_kernels` found: the profile, the shapes it tuned, every record, the table."""

    shapes: list[LinearShape]
    picked: list[LinearShape]
    records: list = field(default_factory=list)  # TuningRecord
    table: object = None  # TunedTable
    gains: dict[str, float] = field(default_factory=dict)  # "name@m" -> best bf16 / W12
    skipped: list[str] = field(default_factory=list)

    def note(self) -> dict:
        return {"profile": [s.to_dict() for s in self.shapes],
                "picked": [f"{s.name} {s.n}x{s.k} m={s.m}" for s in self.picked],
                "tuning": [r.to_dict() for r in self.records], "w12_gain": self.gains,
                "skipped": self.skipped}


def tune_kernels(shapes: list[LinearShape], timer, make_problems, configs_for, table,
                 top: int = 3, bound_tbps: float | None = None,
                 kernels: tuple[str, ...] = ("w12", "bf16")) -> TuningReport:
    """Profile `shapes` with the current kernel ("cublas"), tune `kernels` on the `top`
    worst by gap, add every correct best to `table`. `make_problems(shape)` gives
    {kernel: tuning.Problem}; `configs_for(bucket, kernel)` the configs to try."""
    from ..kernels.tuning import READ_BOUND_TBPS, best, bucket, tune
    from ..kernels.w12_triton import KernelConfig

    bw = bound_tbps or READ_BOUND_TBPS
    rep = TuningReport(shapes=list(shapes), picked=[], table=table)
    measured = []
    for s in shapes:  # one shape's weights in memory at a time
        if bucket(s.m) is None:
            rep.skipped.append(f"{s.name} m={s.m}: above the skinny kernels (cuBLAS serves it)")
            continue
        cur = tune((s.n, s.k), s.m, [KernelConfig()], timer,
                   problem=make_problems(s)["cublas"], bound_tbps=bw)
        rep.records += cur
        s.measured_us = cur[0].median_us
        table.add(cur[0])
        measured.append(s)
    rep.picked = sorted(measured, key=lambda s: -s.gap_us)[:top]
    for s in rep.picked:
        found, problems = {}, make_problems(s)
        for kern in kernels:
            recs = tune((s.n, s.k), s.m, configs_for(bucket(s.m), kern), timer,
                        problem=problems[kern], bound_tbps=bw)
            rep.records += recs
            found[kern] = best(recs)
            if found[kern] is not None:
                table.add(found[kern])
        dense = [s.measured_us] + ([found["bf16"].median_us] if found.get("bf16") else [])
        if found.get("w12"):
            rep.gains[f"{s.name}@{s.m}"] = min(dense) / found["w12"].median_us
    return rep


def search_grid(bucket_m: int, kernel: str) -> list:
    """The configs tried per kernel: W12's own grid (its decode has its own sweet spots),
    the shared skinny-GEMM grid for the bf16 kernel."""
    from ..kernels import tuning
    from ..kernels.w12_triton import w12_candidates

    return w12_candidates(bucket_m) if kernel == "w12" else tuning.candidate_configs(bucket_m)


class KernelAgent:
    name = "kernel"

    def __init__(self, dtype: str = "float32", target: str = "", gpu: str = "", top: int = 3,
                 timer=None, make_problems=None, configs_for=None, device_name: str = ""):
        self.dtype, self.target, self.gpu, self.top = dtype, target, gpu, top
        self.timer, self.make_problems, self.configs_for = timer, make_problems, configs_for
        self.device_name = device_name
        self.proposed = False

    def propose(self, ctx: ProposalContext) -> tuple[list[Candidate], list[dict]]:
        if ctx.device != "cuda" or self.dtype not in ("bfloat16", "bf16"):
            return [], [{"agent": self.name, "note": f"nothing to tune on {ctx.device} "
                                                     f"({self.dtype} weights)"}]
        if not tuner_available():
            return [], [{"agent": self.name, "note": "no kernel tuner (specpilot.kernels.tuning)"}]
        if self.proposed:
            return [], [{"agent": self.name, "note": "kernels already tuned in this run"}]
        cands, notes = self.tune_and_propose(ctx)
        self.proposed = bool(cands)
        return cands, notes

    def tune_and_propose(self, ctx: ProposalContext) -> tuple[list[Candidate], list[dict]]:
        """The work behind `propose`, without the device check (tests call it on CPU)."""
        from ..costmodel.hardware import get_hardware
        from ..costmodel.spec import load_spec
        from ..kernels import pdl, tuning
        from ..runtime.knobs import Knobs

        dev = self.device_name or _cuda_name()
        spec = load_spec(self.target)
        hw = get_hardware(self.gpu or dev)
        knobs = Knobs.from_dict(ctx.best_knobs)
        shapes = linear_shapes(spec, hw, list(ctx.batch_sizes), knobs.k_for)
        path = f"{TUNED_DIR}{tuning.device_slug(dev)}.json"
        table = base_table(ctx, path, dev)
        with pdl.scope(knobs.pdl):  # our kernels timed as the engine will launch them
            rep = tune_kernels(shapes, self.timer or tuning.graph_timer,
                               self.make_problems or _gpu_problems,
                               self.configs_for or search_grid, table, self.top,
                               bound_tbps=hw.bound_bw / 1e12)
        note = {"agent": self.name, "device": dev, "pdl": knobs.pdl, **rep.note()}
        wins = {k: g for k, g in rep.gains.items() if g >= MIN_GAIN}
        w12_on = ctx.best_knobs.get("weights") == "w12"
        if not wins and not w12_on:
            note["note"] = "W12 is not faster than the best bf16 kernel on the worst shapes"
            return [], [note]
        if not rep.picked:
            note["note"] = "no linear shape to tune"
            return [], [note]
        why = (f"tuned {len(rep.picked)} linear shape(s) furthest from the bandwidth bound"
               + (f"; W12 beats bf16 on {', '.join(sorted(wins))}" if wins else ""))
        note["note"] = why
        cand = Candidate(id="", agent=self.name, knobs={} if w12_on else {"weights": "w12"},
                         rationale=why, parents=(ctx.best_id,), round=ctx.round,
                         files={path: table.to_json()})
        return [cand], [note]


def base_table(ctx: ProposalContext, path: str, device: str):
    """The table the new configs go into: the best engine's own, else the shipped one."""
    import json

    from ..kernels.tuning import TunedTable
    from .candidate import stock_file

    text = ctx.best_overlay.get(path) or stock_file(path)
    if text:
        d = json.loads(text)
        return TunedTable(device=d["device"], entries=dict(d.get("entries", {})))
    return TunedTable(device=device)


def _cuda_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def _gpu_problems(s: LinearShape) -> dict:
    """Random LLM-like bf16 weights of the shape on the GPU, rotated past the L2."""
    import math

    import torch

    from ..kernels.tuning import linear_problems

    g = torch.Generator(device="cuda").manual_seed(s.n * 31 + s.k)
    w = torch.randn(s.n, s.k, device="cuda", generator=g) * 0.02
    rare = torch.rand(s.n, s.k, device="cuda", generator=g) < 1e-4
    w = torch.where(rare, w * 30.0, w).to(torch.bfloat16)
    rotations = max(2, math.ceil(1.5e9 / (s.n * s.k * 2)))
    return linear_problems(w, s.m, rotations)
