"""Device ceilings: a datasheet table (with the source of every number) and measured overrides.

A `Hardware` says how fast a device can move bytes and do arithmetic. The datasheet entries
are peak numbers; `Ceilings` are what `specpilot costmodel calibrate` measured on a device,
stored per device under the data directory and used in place of the datasheet when present.
Only the standard library is imported here, so the cost model runs wherever Python does.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..runtime.errors import SpecPilotError

T = 1e12
G = 1e9
MB = 1e6


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device (what `calibrate` writes, one JSON file per device)."""

    device: str  # hardware-table key ("h200", "cpu", or a slug of an unknown device name)
    device_name: str  # as the driver names it
    measured_at: str  # ISO date
    copy_bw: float  # B/s, device-to-device copy, bytes read + written
    read_bw: float  # B/s, read-only streaming (a reduction)
    gemm_flops: dict[str, float]  # dtype -> FLOP/s of a large square GEMM
    skinny: list[list[float]]  # rows [weight_bytes, batch, B/s of weight bytes] for y = x @ W^T
    launch_s: float  # per-kernel launch cost, back-to-back
    step_overhead_s: float  # launch one tiny kernel and wait for it (host round trip)
    source: str = "specpilot costmodel calibrate"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Ceilings:
        return cls(**{**d, "skinny": [list(r) for r in d.get("skinny", [])]})


@dataclass(frozen=True)
class Hardware:
    """Ceilings of one device. Rates in B/s and FLOP/s; `sources` names where each came from."""

    key: str
    name: str
    mem_bw: float  # B/s, peak memory bandwidth (datasheet)
    flops: dict[str, float]  # dtype ("bf16", "fp16", "fp8", "fp32") -> dense FLOP/s
    l2_bytes: float
    sm_count: int
    launch_s: float = 4e-6  # per kernel (assumed until calibrated)
    step_overhead_s: float = 20e-6  # per decode step: host sync + bookkeeping (assumed)
    sources: dict[str, str] = field(default_factory=dict)
    gemm_table: tuple[tuple[float, float, float], ...] = ()  # measured skinny-GEMM bandwidth
    calibrated: str = ""  # date of the measurement the ceilings came from, "" = datasheet
    stream_bw: float = 0.0  # measured streaming bandwidth (0 = not measured)
    measured_flops: dict[str, float] = field(default_factory=dict)  # measured GEMM rates
    kernel_table: str = ""  # the tuned kernel table measured on this device ("" = none)

    # The floor (`bound`) never uses less than the datasheet: a measured ceiling is what one
    # library reached, and a better kernel may beat it; `achieved` is what to expect.
    @property
    def bound_bw(self) -> float:
        return max(self.mem_bw, self.stream_bw)

    def bound_flops(self, dtype: str) -> float:
        return max(self.peak_flops(dtype), self.measured_flops.get(dtype, 0.0))

    @property
    def achieved_bw(self) -> float:
        return self.stream_bw or self.mem_bw

    def achieved_flops(self, dtype: str) -> float:
        return self.measured_flops.get(dtype) or self.peak_flops(dtype)

    def peak_flops(self, dtype: str) -> float:
        """Dense matrix rate for `dtype`; fp8 falls back to bf16 where the device has none."""
        if dtype in self.flops:
            return self.flops[dtype]
        if dtype == "fp8":
            return self.flops["bf16"]
        return self.flops.get("bf16", self.flops["fp32"])

    def gemm_bw(self, weight_bytes: float, tokens: float) -> float:
        """Achieved weight bandwidth of a skinny GEMM (measured table, interpolated on
        log(size) and log(tokens), clamped); the streaming bandwidth when not calibrated."""
        if not self.gemm_table:
            return self.achieved_bw
        sizes = sorted({r[0] for r in self.gemm_table})
        batches = sorted({r[1] for r in self.gemm_table})
        table = {(r[0], r[1]): r[2] for r in self.gemm_table}

        def around(xs: list[float], x: float) -> tuple[float, float, float]:
            if x <= xs[0]:
                return xs[0], xs[0], 0.0
            if x >= xs[-1]:
                return xs[-1], xs[-1], 0.0
            for lo, hi in itertools.pairwise(xs):
                if lo <= x <= hi:
                    return lo, hi, (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
            raise AssertionError("unreachable")

        s0, s1, fs = around(sizes, weight_bytes)
        b0, b1, fb = around(batches, max(tokens, 1.0))

        def at(s: float, b: float) -> float:
            if (s, b) in table:
                return table[(s, b)]
            # a missing cell: the nearest batch measured for that size
            row = [(abs(math.log(bb) - math.log(b)), v) for (ss, bb), v in table.items() if ss == s]
            return min(row)[1]

        lo = at(s0, b0) * (1 - fb) + at(s0, b1) * fb
        hi = at(s1, b0) * (1 - fb) + at(s1, b1) * fb
        return lo * (1 - fs) + hi * fs

    def with_ceilings(self, c: Ceilings) -> Hardware:
        """This device with measured ceilings beside the datasheet's (which stay the floor)."""
        src = f"measured {c.measured_at} ({c.source})"
        sources = dict(self.sources)
        sources.update({"stream_bw": src, "launch_s": src, "step_overhead_s": src,
                        "gemm_table": src, **{f"measured_flops.{k}": src for k in c.gemm_flops}})
        return replace(self, stream_bw=max(c.copy_bw, c.read_bw),
                       measured_flops=dict(c.gemm_flops), launch_s=c.launch_s,
                       step_overhead_s=c.step_overhead_s, sources=sources,
                       gemm_table=tuple((float(a), float(b), float(v)) for a, b, v in c.skinny),
                       calibrated=c.measured_at)


_H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet (SXM5; dense = half the sparse figure)"
_H100_WP = "NVIDIA H100 (Hopper) architecture whitepaper"

TABLE: dict[str, Hardware] = {
    "h100": Hardware(
        "h100", "NVIDIA H100 SXM5 80GB", 3.35 * T,
        {"bf16": 989 * T, "fp16": 989 * T, "fp8": 1979 * T, "fp32": 67 * T}, 50 * MB, 132,
        sources={"mem_bw": _H100_SHEET, "flops": _H100_SHEET, "l2_bytes": _H100_WP,
                 "sm_count": _H100_WP}),
    "h200": Hardware(
        "h200", "NVIDIA H200 SXM 141GB", 4.8 * T,
        {"bf16": 989 * T, "fp16": 989 * T, "fp8": 1979 * T, "fp32": 67 * T}, 60 * MB, 132,
        sources={"mem_bw": "NVIDIA H200 Tensor Core GPU datasheet (HBM3e 4.8 TB/s)",
                 "flops": "NVIDIA H200 datasheet (same rates as H100 SXM; dense)",
                 "l2_bytes": "torch device properties on an H200 here (KINDS.md, 2026-10-28)",
                 "sm_count": "torch device properties on an H200 here (measurements, 2026-11-29)",
                 "kernel_table": "specpilot/kernels/tuned/nvidia-h200.json (w12_bench.py)"},
        kernel_table="nvidia-h200"),
    "a100": Hardware(
        "a100", "NVIDIA A100 SXM4 80GB", 2.039 * T,
        {"bf16": 312 * T, "fp16": 312 * T, "fp32": 19.5 * T}, 40 * MB, 108,
        sources={"mem_bw": "NVIDIA A100 datasheet (80GB SXM, 2,039 GB/s)",
                 "flops": "NVIDIA A100 datasheet (dense; no fp8 units: fp8 runs at bf16 rate)",
                 "l2_bytes": "NVIDIA A100 (Ampere) architecture whitepaper",
                 "sm_count": "NVIDIA A100 (Ampere) architecture whitepaper"}),
    "l40s": Hardware(
        "l40s", "NVIDIA L40S 48GB", 0.864 * T,
        {"bf16": 362 * T, "fp16": 362 * T, "fp8": 733 * T, "fp32": 91.6 * T}, 96 * MB, 142,
        sources={"mem_bw": "NVIDIA L40S datasheet (GDDR6, 864 GB/s)",
                 "flops": "NVIDIA L40S datasheet (dense = half the sparse figure)",
                 "l2_bytes": "NVIDIA Ada Lovelace architecture whitepaper (AD102)",
                 "sm_count": "NVIDIA L40S datasheet"}),
    "b200": Hardware(
        "b200", "NVIDIA B200 180GB", 8.0 * T,
        {"bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T, "fp32": 75 * T}, 126 * MB, 148,
        sources={"mem_bw": "NVIDIA HGX B200 datasheet (per GPU, HBM3e 8 TB/s)",
                 "flops": "NVIDIA HGX B200 datasheet / 8 GPUs, dense = half the sparse figure",
                 "l2_bytes": "approximate: not on the datasheet (two dies)",
                 "sm_count": "torch device properties reported for B200 (148)"}),
    "rtx-pro-6000": Hardware(
        "rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell 96GB", 1.792 * T,
        {"bf16": 500 * T, "fp16": 500 * T, "fp8": 1000 * T, "fp32": 125 * T}, 128 * MB, 188,
        sources={"mem_bw": "NVIDIA RTX PRO 6000 Blackwell datasheet (GDDR7, 1,792 GB/s)",
                 "flops": "derived from the datasheet's 4,000 AI TOPS (FP4, sparse): /2 for "
                          "dense, /2 per doubling of precision; fp32 from the datasheet",
                 "l2_bytes": "NVIDIA RTX Blackwell (GB202) architecture whitepaper",
                 "sm_count": "NVIDIA RTX PRO 6000 Blackwell datasheet (188 SMs)"}),
    "cpu": Hardware(
        "cpu", "generic x86 CPU (2 cores)", 20 * G,
        {"bf16": 100 * G, "fp16": 100 * G, "fp32": 100 * G}, 32 * MB, 2,
        launch_s=2e-6, step_overhead_s=50e-6,
        sources={"mem_bw": "placeholder for a small cloud VM: run `specpilot costmodel "
                           "calibrate`", "flops": "placeholder (2 cores, AVX2 FMA, fp32)",
                 "l2_bytes": "placeholder", "sm_count": "cores"}),
}
for _hw in TABLE.values():  # the overhead terms are assumptions until calibrated
    _hw.sources.setdefault("launch_s", "assumed until calibrated")
    _hw.sources.setdefault("step_overhead_s", "assumed until calibrated")

ALIASES = {
    "h100-sxm": "h100", "h100sxm": "h100", "nvidia-h100": "h100", "nvidia-h100-80gb-hbm3": "h100",
    "h200-sxm": "h200", "nvidia-h200": "h200", "a100-80gb": "a100", "a100-sxm4-80gb": "a100",
    "nvidia-a100-sxm4-80gb": "a100", "nvidia-l40s": "l40s", "nvidia-b200": "b200",
    "rtx-pro-6000-blackwell": "rtx-pro-6000", "rtxpro6000": "rtx-pro-6000",
    "nvidia-rtx-pro-6000-blackwell-workstation-edition": "rtx-pro-6000",
    "nvidia-rtx-pro-6000-blackwell-server-edition": "rtx-pro-6000",
}


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def device_key(name: str) -> str:
    """The table key for a device name ("NVIDIA H200" -> "h200"); a slug when unknown."""
    s = slug(name)
    if s in TABLE:
        return s
    return ALIASES.get(s, s)


def calibration_path(key: str) -> Path:
    from ..deployment import data_dir

    return data_dir() / "calibration" / f"{key}.json"


def load_calibration(key: str) -> Ceilings | None:
    p = calibration_path(key)
    if not p.is_file():
        return None
    try:
        return Ceilings.from_dict(json.loads(p.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise SpecPilotError(f"{p} is not a calibration file ({e}): delete it and run "
                             "`specpilot costmodel calibrate` again") from None


def get_hardware(name: str, ceilings: str = "auto") -> Hardware:
    """The device `name` from the table. `ceilings`: "datasheet"; "calibrated" (the device's
    calibration file, an error if none); "reference" (the measured H200 numbers that ship
    with the project); "auto" (calibrated when a file exists, else datasheet)."""
    key = device_key(name)
    if key not in TABLE:
        raise SpecPilotError(f"unknown gpu {name!r}: use one of {', '.join(sorted(TABLE))}")
    hw = TABLE[key]
    if ceilings == "datasheet":
        return hw
    if ceilings == "reference":
        from .reference import REFERENCE

        if key not in REFERENCE:
            raise SpecPilotError(f"no reference measurement ships for {key!r}: "
                                 f"have {sorted(REFERENCE)}; use datasheet or calibrated")
        return hw.with_ceilings(REFERENCE[key])
    if ceilings not in ("auto", "calibrated"):
        raise SpecPilotError(f"ceilings must be auto, datasheet, calibrated or reference, "
                             f"not {ceilings!r}")
    cal = load_calibration(key)
    if cal is None:
        if ceilings == "calibrated":
            raise SpecPilotError(f"no calibration for {key!r} at {calibration_path(key)}: run "
                                 "`specpilot costmodel calibrate` on that device")
        return hw
    return hw.with_ceilings(cal)
