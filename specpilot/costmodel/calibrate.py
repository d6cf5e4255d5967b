"""Measure the current device's ceilings and store them for later cost-model runs.

Measures a large copy, a read-only reduction, a large square GEMM, skinny GEMMs y = x @ W^T
at batch 1-32 on several weight sizes (back to back over rotating weights, in a CUDA graph on
a GPU, as a decode step runs them), a per-kernel launch cost and a per-step sync round trip.
The result is a `Ceilings` JSON under `data_dir()/calibration/<device>.json` (atomic write).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from ..atomic import write_json_atomic
from .hardware import Ceilings, calibration_path, device_key

# (N, K) weight shapes: 8B / 32B-class projections and an lm_head
GPU_SHAPES = ((4096, 4096), (6144, 4096), (4096, 12288), (24576, 4096), (5120, 25600),
              (51200, 5120), (151936, 4096))
CPU_SHAPES = ((256, 256), (512, 512), (1024, 1024))
BATCHES = (1, 2, 4, 8, 16, 32)


def _median_time(fn: Callable[[], object], sync: Callable[[], None], reps: int,
                 trials: int = 5) -> float:
    """Median over `trials` of the mean seconds per call of `reps` back-to-back calls."""
    fn()
    sync()
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out)


def cuda_time(fn: Callable[[], object], reps: int, trials: int = 5) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3 / reps)
    return statistics.median(out)


def _graph(fn: Callable[[], object]):
    """Capture `fn` in a CUDA graph; returns the replay callable."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay, g


def calibrate(device: str = "auto", shapes: tuple[tuple[int, int], ...] | None = None,
              batches: tuple[int, ...] = BATCHES, copy_bytes: int | None = None,
              gemm_n: int | None = None, save: bool = True,
              log: Callable[[str], None] | None = None) -> Ceilings:
    """Measure `device` ("auto" | "cpu" | "cuda") and, with `save`, store the result. A
    device that is not here, or a data folder the result cannot go to, is a one-line error
    before anything is measured."""
    import torch

    from ..runtime.errors import check_cuda, check_dir

    check_cuda(device)
    folder = calibration_path("cpu").parent  # every device's; data_dir() checks SPECPILOT_DATA
    if save and folder.exists():
        check_dir(folder, "folder", "move it away or point SPECPILOT_DATA at another folder")
    say = log or (lambda s: None)
    cuda = (device == "cuda") or (device == "auto" and torch.cuda.is_available())
    dev = "cuda" if cuda else "cpu"
    if cuda:
        name = torch.cuda.get_device_name(0)
        props = torch.cuda.get_device_properties(0)
        l2 = getattr(props, "L2_cache_size", 50 << 20)
        dtype, dname = torch.bfloat16, "bf16"
        shapes = shapes or GPU_SHAPES
        copy_bytes = copy_bytes or (1 << 31)
        gemm_n = gemm_n or 8192

        def sync() -> None:
            torch.cuda.synchronize()

        def timer(fn: Callable[[], object], reps: int) -> float:
            return cuda_time(fn, reps)
    else:
        name = "cpu"
        l2 = 32 << 20
        dtype, dname = torch.float32, "fp32"
        shapes = shapes or CPU_SHAPES
        copy_bytes = copy_bytes or (64 << 20)
        gemm_n = gemm_n or 512

        def sync() -> None:
            pass

        def timer(fn: Callable[[], object], reps: int) -> float:
            return _median_time(fn, sync, reps)

    esize = torch.finfo(dtype).bits // 8
    # 1. copy (read + write) and a read-only reduction
    n = copy_bytes // esize
    a = torch.randn(n, device=dev, dtype=dtype)
    b = torch.empty_like(a)
    reps = 20 if cuda else 3
    copy_bw = 2 * n * esize / timer(lambda a=a, b=b: b.copy_(a), reps)
    read_bw = n * esize / timer(lambda a=a: a.sum(), reps)
    say(f"copy {copy_bw / 1e9:.1f} GB/s (read+write), read {read_bw / 1e9:.1f} GB/s")
    del a, b
    # 2. a large square GEMM
    x = torch.randn(gemm_n, gemm_n, device=dev, dtype=dtype)
    y = torch.randn(gemm_n, gemm_n, device=dev, dtype=dtype)
    gemm = 2 * gemm_n**3 / timer(lambda x=x, y=y: x @ y, 10 if cuda else 2)
    say(f"gemm {dname} {gemm / 1e12:.2f} TFLOP/s")
    del x, y
    # 3. skinny GEMMs, back to back over rotating weights (past the L2)
    skinny: list[list[float]] = []
    F = torch.nn.functional
    for nn_, kk in shapes:
        wbytes = nn_ * kk * esize
        nw = max(2, min(16, math.ceil(3 * l2 / wbytes)))
        ws = [torch.randn(nn_, kk, device=dev, dtype=dtype) for _ in range(nw)]
        for bsz in batches:
            xb = torch.randn(bsz, kk, device=dev, dtype=dtype)

            def run(ws=ws, xb=xb) -> None:
                for w in ws:
                    F.linear(xb, w)

            if cuda:
                fn, _keep = _graph(run)
                t = timer(fn, 10) / nw
            else:
                t = timer(run, 3) / nw
            skinny.append([float(wbytes), float(bsz), wbytes / t])
        say(f"skinny [{nn_}x{kk}] " + " ".join(
            f"B{int(r[1])}:{r[2] / 1e9:.0f}" for r in skinny[-len(batches):]) + " GB/s")
        del ws
    if cuda:
        torch.cuda.empty_cache()
    # 4. launch cost per kernel, and a one-kernel step with a host sync
    z = torch.zeros(1, device=dev)
    many = 200
    launch = timer(lambda: [z.add_(1) for _ in range(many)], 3) / many

    def one_step() -> None:
        z.add_(1)
        sync()

    overhead = _median_time(one_step, sync, 50)
    say(f"launch {launch * 1e6:.1f} us/kernel, step round trip {overhead * 1e6:.1f} us")
    c = Ceilings(device=device_key(name), device_name=name,
                 measured_at=_dt.date.today().isoformat(), copy_bw=copy_bw, read_bw=read_bw,
                 gemm_flops={dname: gemm}, skinny=skinny, launch_s=launch,
                 step_overhead_s=overhead,
                 source=f"specpilot costmodel calibrate (torch {torch.__version__})")
    if save:
        save_ceilings(c)
    return c


def save_ceilings(c: Ceilings, path: Path | None = None) -> Path:
    """Write `c` atomically (temp file + rename) to its device's calibration file."""
    path = path or calibration_path(c.device)
    write_json_atomic(path, c.to_dict())
    return path
