"""The kernel proposer: where the kernel subagent (W12 tuning) plugs into the search.

It proposes knob changes that switch kernels on (`weights = "w12"` on CUDA deployments
in bf16) once `specpilot.kernels.tuning.tune` exists and the device can run it; on CPU
deployments, or without the tuner, there is nothing to tune and it says so.
"""

from __future__ import annotations

import importlib.util

from .candidate import Candidate, ProposalContext


def tuner_available() -> bool:
    try:
        return importlib.util.find_spec("specpilot.kernels.tuning") is not None
    except ModuleNotFoundError:
        return False


class KernelAgent:
    name = "kernel"

    def __init__(self, dtype: str = "float32"):
        self.dtype = dtype

    def propose(self, ctx: ProposalContext) -> tuple[list[Candidate], list[dict]]:
        if ctx.device != "cuda" or self.dtype == "float32":
            return [], [{"agent": self.name, "note": f"nothing to tune on {ctx.device} "
                                                     f"({self.dtype} weights)"}]
        if not tuner_available():
            return [], [{"agent": self.name, "note": "no kernel tuner (specpilot.kernels.tuning)"}]
        if ctx.best_knobs.get("weights") == "w12":
            return [], [{"agent": self.name, "note": "w12 already on"}]
        cand = Candidate(id="", agent=self.name, knobs={"weights": "w12"},
                         rationale="12-bit weights: 3/4 of the bytes of bf16 per GEMM",
                         parents=(ctx.best_id,), round=ctx.round)
        return [cand], []
