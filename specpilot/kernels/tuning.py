"""Autotuning mechanics for the linear kernels, and the per-device table of tuned configs.

`tune(shape, batch, configs, timer)` runs every config on one problem (fresh random inputs,
output poisoned with NaN before each check), checks it against an fp32 reference, times it
with a pluggable `timer` and returns one `TuningRecord` per config, fastest correct first.
The timer is any ``timer(fn, rotations) -> list of microseconds per call``: a CUDA-graph
timer on a GPU (benchmarks/w12_bench.py), a fake one in CPU tests.

`TunedTable` is the JSON the kernels load (``$SPECPILOT_DATA/kernels/<device>.json``, else
the copy shipped in ``specpilot/kernels/tuned/``): per (kernel, N, K, batch bucket), the
best config. Buckets are 1, 2, 4, 8, 16, 32; larger batches unpack and call cuBLAS.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .w12_triton import PIPE, KernelConfig

BUCKETS = (1, 2, 4, 8, 16, 32)
READ_BOUND_TBPS = 4.57  # measured read-only streaming limit of the H200 (shared/measurements)

Timer = Callable[[Callable[[], object], int], list[float]]


def bucket(m: int) -> int | None:
    """The batch bucket of m rows (None: larger than the skinny kernels serve)."""
    return next((b for b in BUCKETS if m <= b), None)


@dataclass
class TuningRecord:
    """One config measured on one (kernel, shape, batch)."""

    kernel: str  # "w12" | "bf16"
    n: int
    k: int
    batch: int
    config: dict
    median_us: float
    spread_us: float  # 80th minus 20th percentile
    nbytes: int  # bytes the call must read (weights + activations) and write
    tbps: float
    pct_of_bound: float
    correct: bool
    rel_error: float
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Problem:
    """What `tune` runs: `call(cfg, x, out)` writes y = x @ w.T into out (rotating over
    `rotations` weight copies), `reference(x)` is the fp32 answer for the first copy."""

    kernel: str
    n: int
    k: int
    batch: int
    nbytes: int
    rotations: int
    make_x: Callable[[int], torch.Tensor]  # seed -> fresh x [batch, k]
    call: Callable[[KernelConfig, torch.Tensor, torch.Tensor], object]
    reference: Callable[[torch.Tensor], torch.Tensor]
    first: Callable[[KernelConfig, torch.Tensor, torch.Tensor], object] | None = None


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.float()
    if not torch.isfinite(y).all():
        return float("inf")
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def tune(shape: tuple[int, int], batch: int, configs: list[KernelConfig], timer: Timer, *,
         problem: Problem, tol: float = 1e-2, checks: int = 2,
         bound_tbps: float = READ_BOUND_TBPS) -> list[TuningRecord]:
    """Check and time every config on `problem`; records sorted fastest correct first."""
    n, k = shape
    if (problem.n, problem.k, problem.batch) != (n, k, batch):
        raise ValueError("problem does not match the shape/batch being tuned")
    first = problem.first or problem.call
    records = []
    for cfg in configs:
        err, note = 0.0, ""
        try:
            for seed in range(checks):
                x = problem.make_x(seed)
                out = torch.full((batch, n), float("nan"), dtype=x.dtype, device=x.device)
                first(cfg, x, out)
                err = max(err, rel_error(out, problem.reference(x)))
            x = problem.make_x(checks)
            out = torch.empty(batch, n, dtype=x.dtype, device=x.device)
            times = timer(lambda c=cfg, x=x, o=out: problem.call(c, x, o), problem.rotations)
        # a config that does not compile or launch is recorded, not fatal
        except Exception as e:  # noqa: BLE001
            records.append(TuningRecord(problem.kernel, n, k, batch, cfg.to_dict(), float("inf"),
                                        0.0, problem.nbytes, 0.0, 0.0, False, float("inf"),
                                        f"{type(e).__name__}: {str(e)[:120]}"))
            continue
        med = statistics.median(times)
        tbps = problem.nbytes / (med * 1e-6) / 1e12 if med > 0 else 0.0
        records.append(TuningRecord(
            problem.kernel, n, k, batch, cfg.to_dict(), med,
            _percentile(times, 0.8) - _percentile(times, 0.2), problem.nbytes, tbps,
            100.0 * tbps / bound_tbps, err <= tol, err, note if err <= tol else "wrong result"))
    records.sort(key=lambda r: (not r.correct, r.median_us))
    return records


def best(records: list[TuningRecord]) -> TuningRecord | None:
    """The fastest correct record, or None."""
    ok = [r for r in records if r.correct]
    return min(ok, key=lambda r: r.median_us) if ok else None


def candidate_configs(bucket_m: int) -> list[KernelConfig]:
    """The search grid for one batch bucket (kept small: every config is a compile).
    bk is a multiple of 128 (the W12 kernel steps K by whole code-pairing groups)."""
    K = KernelConfig
    if bucket_m <= 4:
        grid = [(4, 1024, 1, 4), (8, 512, 1, 4), (16, 256, 1, 4), (16, 512, 1, 8),
                (8, 1024, 1, 8), (4, 512, 2, 4), (8, 256, 2, 4), (32, 256, 1, 8)]
        cfgs = [K(bm=bucket_m, bn=bn, bk=bk, split_k=s, warps=w) for bn, bk, s, w in grid]
        cfgs += [K(bm=bucket_m, bn=4, bk=1024, variant=0), K(bm=bucket_m, bn=8, bk=512, variant=0)]
        if bucket_m == 1:  # the loop pipelined through shared memory (as the W12 GEMV's PIPE)
            cfgs += [K(bm=1, bn=4, bk=1024, variant=v | PIPE) for v in (0, 1)]
            cfgs.append(K(bm=1, bn=8, bk=512, variant=1 | PIPE))
        if bucket_m >= 2:
            cfgs += [K(bm=16, bn=32, bk=128, dot=True), K(bm=16, bn=64, bk=128, dot=True)]
        return cfgs
    bm = 16 if bucket_m <= 16 else 32
    grid = [(32, 128, 1, 4, 3), (16, 256, 1, 4, 3), (64, 128, 1, 4, 3), (64, 256, 1, 4, 3),
            (128, 128, 1, 8, 3), (32, 128, 2, 4, 4), (32, 256, 1, 4, 3)]
    cfgs = [K(bm=bm, bn=bn, bk=bk, split_k=s, warps=w, stages=p, dot=True)
            for bn, bk, s, w, p in grid]
    return cfgs


def default_config(n: int, k: int, m: int) -> KernelConfig:
    """An untuned but reasonable config (used when the table has no entry)."""
    b = bucket(m) or 32
    if b <= 4:
        return KernelConfig(bm=b, bn=4 if b == 1 else 8, bk=1024 if b == 1 else 512, warps=4)
    return KernelConfig(bm=16 if b <= 16 else 32, bn=64, bk=128, split_k=1, warps=4, dot=True)
    # (defaults are overridden by the tuned table; see candidate_configs for the grid)


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def _key(kernel: str, n: int, k: int, b: int) -> str:
    return f"{kernel}:{n}x{k}:b{b}"


@dataclass
class TunedTable:
    """Per-device best configs: key 'kernel:NxK:bB' -> {'config': ..., 'median_us': ...}."""

    device: str
    entries: dict[str, dict] = field(default_factory=dict)

    def add(self, rec: TuningRecord) -> None:
        key = _key(rec.kernel, rec.n, rec.k, bucket(rec.batch) or rec.batch)
        old = self.entries.get(key)
        if rec.correct and (old is None or rec.median_us < old["median_us"]):
            self.entries[key] = {"config": rec.config, "median_us": rec.median_us,
                                 "tbps": rec.tbps}

    def lookup(self, kernel: str, n: int, k: int, m: int) -> KernelConfig | None:
        b = bucket(m)
        hit = self.entries.get(_key(kernel, n, k, b)) if b else None
        return KernelConfig.from_dict(hit["config"]) if hit else None

    def median_us(self, kernel: str, n: int, k: int, m: int) -> float | None:
        b = bucket(m)
        hit = self.entries.get(_key(kernel, n, k, b)) if b else None
        return hit["median_us"] if hit else None

    def to_json(self) -> str:
        return json.dumps({"device": self.device, "entries": self.entries}, indent=1,
                          sort_keys=True)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> TunedTable:
        d = json.loads(Path(path).read_text())
        return cls(device=d["device"], entries=dict(d.get("entries", {})))


def table_path(device_name: str, data_dir: str | Path | None = None) -> Path:
    root = Path(data_dir or os.environ.get("SPECPILOT_DATA", "~/.cache/specpilot")).expanduser()
    return root / "kernels" / f"{device_slug(device_name)}.json"


SHIPPED = Path(__file__).parent / "tuned"


def load_table(device_name: str, data_dir: str | Path | None = None) -> TunedTable:
    """The device's table: the user's tuned one, else the shipped one, else empty."""
    for path in (table_path(device_name, data_dir), SHIPPED / f"{device_slug(device_name)}.json"):
        if path.is_file():
            return TunedTable.load(path)
    return TunedTable(device=device_name)


def linear_problems(w: torch.Tensor, batch: int, rotations: int = 1,
                    f32_dot: bool = False) -> dict[str, Problem]:
    """The problems of one linear layer y = x @ w.T (w bf16 [N, K]) for `tune`: "cublas"
    (torch.mm), "bf16" (the Triton bf16 kernel) and "w12" (the fused W12 kernel). Each call
    cycles through `rotations` copies of the weights (enough to stream past the L2 on a
    GPU). On a GPU activations are bf16; elsewhere (TRITON_INTERPRET=1) they are fp32 and
    the dense weights too, since the interpreter mishandles bf16."""
    from . import w12 as fmt
    from .gemv_bf16 import bf16_matmul
    from .w12_triton import w12_matmul

    n, k = w.shape
    dense = w if w.is_cuda else w.float()
    packed = fmt.pack(w)
    ws = [dense] + [dense.clone() for _ in range(rotations - 1)]
    ps = [packed] + [fmt.W12Weight(n, k, **{f: t.clone() for f, t in packed.tensors().items()})
                     for _ in range(rotations - 1)]
    act = batch * (k + n) * 2
    turn = {"i": 0}

    def nxt(seq):
        turn["i"] = (turn["i"] + 1) % len(seq)
        return seq[turn["i"]]

    def make_x(seed: int) -> torch.Tensor:
        g = torch.Generator(device=w.device).manual_seed(1000 + seed)
        x = torch.randn(batch, k, device=w.device, generator=g)
        return x.to(torch.bfloat16) if w.is_cuda else x

    ref_w = w.float()

    def ref(x: torch.Tensor) -> torch.Tensor:
        return x.float() @ ref_w.T

    return {
        "cublas": Problem("cublas", n, k, batch, n * k * 2 + act, rotations, make_x,
                          lambda c, x, o: torch.mm(x, nxt(ws).T, out=o), ref,
                          first=lambda c, x, o: torch.mm(x, ws[0].T, out=o)),
        "bf16": Problem("bf16", n, k, batch, n * k * 2 + act, rotations, make_x,
                        lambda c, x, o: bf16_matmul(x, nxt(ws), c, out=o, f32_dot=f32_dot), ref,
                        first=lambda c, x, o: bf16_matmul(x, ws[0], c, out=o, f32_dot=f32_dot)),
        "w12": Problem("w12", n, k, batch, packed.nbytes + act, rotations, make_x,
                       lambda c, x, o: w12_matmul(x, nxt(ps), c, out=o, f32_dot=f32_dot), ref,
                       first=lambda c, x, o: w12_matmul(x, ps[0], c, out=o, f32_dot=f32_dot)),
    }


def graph_timer(fn: Callable[[], object], rotations: int, reps: int = 25) -> list[float]:
    """A CUDA `Timer`: `rotations` calls captured in one CUDA graph, the graph replayed
    `reps` times between events; microseconds per call, one value per replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (and compile) outside the capture
        for _ in range(rotations):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rotations):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        t0.record()
        graph.replay()
        t1.record()
        t1.synchronize()
        out.append(t0.elapsed_time(t1) * 1e3 / rotations)
    return out
