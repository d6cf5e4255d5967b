"""Programmatic dependent launch (PDL) for the Triton kernels of decode and verify steps.

A decode step is ~10 kernel launches per layer, most of them 2-40 us long, so the gap
between two kernels (the last wave of one draining while the next is launched and ramps
up) is a visible share of the step. With PDL (compute capability 9.0+) a kernel may start
while the kernel before it in the stream is still finishing: its blocks take the SMs that
the earlier kernel's last wave leaves idle, run their prologue, then wait in
`griddepcontrol.wait` until the earlier kernel has finished and its writes are visible.

The contract every kernel here keeps: it waits (`enter`) before touching any tensor that
another kernel writes or reads (loads and stores alike; only constant data such as weights
may be read before), and releases its dependents (`release`) once its bulk of work is
done. Kernels of other libraries (cuBLAS, torch) are launched as usual and waited for in
full. CUDA graphs keep the programmatic edges of a captured step.

PDL is off unless a caller turns it on for a region (`scope`); the engine does so around
its steps when its `pdl` knob is on. One pair uses it whatever the region: the W12 wgmma
kernel behind its own x^T kernel (`w12_wgmma.transposed`), launched back to back in one
call. The x^T kernel releases it only after its own `enter`, so x is written when the wgmma
kernel starts, and that kernel reads x (never a tensor the x^T kernel writes) before its
wait; nothing may be launched between the two. (Inside the region the wgmma kernel without
x^T is launched with PDL behind x's writer and keeps the contract like the others.)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from . import interpreting

_ON = [False]


@contextmanager
def scope(on: bool) -> Iterator[None]:
    """Launch this module's kernels with PDL inside the block (where the device allows)."""
    before = _ON[0]
    _ON[0] = bool(on)
    try:
        yield
    finally:
        _ON[0] = before


def supported(device: torch.device) -> bool:
    """Compute capability 9.0+ and a Triton that compiles the grid-dependency controls."""
    if device.type != "cuda" or interpreting():
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _capable(index: int) -> bool:
    cuda = getattr(getattr(tl, "extra", None), "cuda", None)
    return hasattr(cuda, "gdc_wait") and torch.cuda.get_device_capability(index)[0] >= 9


def active(device: torch.device) -> bool:
    """Whether a launch on `device` now uses PDL: pass it as the kernel's `PDL` and add
    `launch(on)` to the launch's keyword arguments."""
    return _ON[0] and supported(device)


def launch(on: bool) -> dict:
    """Launch keyword arguments for a kernel launched with PDL `on`."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def enter(PDL: tl.constexpr):
    """Wait until the kernels this one depends on have finished and their writes are
    visible. Code above this call may only read constant data (weights). (Prefetching a
    linear's first weight tile into L2 there measured slower: 8B-class batch-1 step 4.51
    vs 4.36 ms bf16, 4.08 vs 3.89 ms W12.)"""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release(PDL: tl.constexpr):
    """Let the next kernel launch: called once this kernel's bulk of work is done (after a
    linear's main loop, after an elementwise kernel's loads). Released at the start
    instead, the next kernels' blocks took SM slots early and an 8B-class decode step ran
    7% slower than without PDL; released here, 3% faster (docs/BENCHMARKS.md)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


__all__ = ["active", "enter", "launch", "release", "scope", "supported"]
