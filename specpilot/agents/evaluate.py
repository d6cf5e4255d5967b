"""Evaluate a built candidate in isolation: bench in a child process, verify with stock code.

`Evaluator` is a Ray actor (one per evaluation slot: a CPU slot, or `num_gpus=1`). For
each request it runs `specpilot.agents.worker` in a fresh process whose PYTHONPATH starts
with the candidate's build dir, under a time limit; a crash, a hang or an exception there
is a failed candidate (`EvalResult.ok = False` with the reason), never a failed search.
The outputs then go through token forcing against the stock runtime (a reference process
the actor keeps), and the timings are checked against the cost model's physical bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class EvalRequest:
    cid: str
    hash: str
    build_path: str  # the folder holding the candidate's specpilot package
    target: str
    device: str
    dtype: str
    knobs: dict  # Knobs.to_dict() with resolved paths
    batch_sizes: list[int]
    max_new_tokens: int
    prompts: list[list[int]]
    repeats: int = 3
    gate_prompts: list[list[int]] = field(default_factory=list)
    time_limit_s: float = 300.0
    min_s_per_token: float = 0.0  # the cost model's bound; faster = measurement error


@dataclass
class EvalResult:
    cid: str
    hash: str
    ok: bool  # ran to completion and produced outputs
    reason: str = ""  # why not ok / why rejected
    verified: bool | None = None  # dev token forcing
    gate_verified: bool | None = None
    verdict: dict = field(default_factory=dict)
    gate_verdict: dict = field(default_factory=dict)
    times: list[list[float]] = field(default_factory=list)  # [repeat][batch chunk] seconds
    tokens: list[int] = field(default_factory=list)  # new tokens per chunk
    steps: list[int] = field(default_factory=list)  # verify steps per chunk
    chunk_batch: list[int] = field(default_factory=list)  # batch size of each chunk
    accept_hist: list[int] = field(default_factory=list)  # steps that accepted i drafts
    wall_s: float = 0.0

    @property
    def unit_times(self) -> np.ndarray:
        """Median over repeats of each chunk's time: the unit of the paired bootstrap."""
        return np.median(np.asarray(self.times, dtype=float), axis=0)

    @property
    def tok_s(self) -> float:
        return float(sum(self.tokens) / self.unit_times.sum()) if self.times else 0.0

    def tok_s_by_batch(self) -> dict[int, float]:
        t, out = self.unit_times, {}
        for b in sorted(set(self.chunk_batch)):
            idx = [i for i, x in enumerate(self.chunk_batch) if x == b]
            out[b] = float(sum(self.tokens[i] for i in idx) / t[idx].sum())
        return out

    @property
    def accept_length(self) -> float:
        return float(sum(self.tokens) / max(1, sum(self.steps))) if self.steps else 0.0

    @property
    def accepted(self) -> bool:
        return self.ok and bool(self.verified) and not self.reason

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EvalResult:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def speedup(base: EvalResult, cand: EvalResult, n_boot: int = 2000,
            seed: int = 0) -> tuple[float, tuple[float, float]]:
    """Time ratio base/candidate (> 1: candidate faster) and its 95% paired bootstrap CI.

    Units are the batch chunks of the dev set (same prompts in both), each the median of
    its repeats; resampling chunks keeps the pairing."""
    b, c = base.unit_times, cand.unit_times
    if len(b) != len(c) or not len(b):
        raise ValueError("speedup needs two evaluations of the same prompts")
    ratio = float(b.sum() / c.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(b), size=(n_boot, len(b)))
    boots = b[idx].sum(1) / c[idx].sum(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return ratio, (float(lo), float(hi))


def run_worker(req: EvalRequest, with_gate: bool) -> dict:
    """Run the candidate's worker process; returns its JSON or {'ok': False, 'error': ...}."""
    build = Path(req.build_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(build)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    payload = asdict(req)
    if not with_gate:
        payload["gate_prompts"] = []
    payload["package"] = str(build / "specpilot")
    with tempfile.TemporaryDirectory(prefix="specpilot-eval-") as tmp:
        rq, out, log = Path(tmp) / "req.json", Path(tmp) / "out.json", Path(tmp) / "log.txt"
        rq.write_text(json.dumps(payload))
        with open(log, "w") as logf:
            proc = subprocess.Popen([sys.executable, "-s", "-m", "specpilot.agents.worker",
                                     str(rq), str(out)], cwd=build, env=env, stdout=logf,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=req.time_limit_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return {"ok": False, "error": f"timed out after {req.time_limit_s:.0f} s (hang)"}
        if out.is_file():
            res = json.loads(out.read_text())
            if res.get("ok"):
                return res
            return {"ok": False, "error": res.get("error", "worker failed")}
        tail = [x for x in log.read_text().splitlines() if x.strip()]
        why = tail[-1] if tail else "no output"
        kind = "crashed" if rc < 0 else "raised"
        return {"ok": False, "error": f"{kind} (exit {rc}): {why[:300]}"}


def force(reference, records: list[dict], max_new_tokens: int) -> dict:
    """Token forcing of `records` against the stock reference, as a plain dict."""
    from ..forcing.verify import verify

    v = verify(records, reference, max_new_tokens=max_new_tokens)
    mism = getattr(v, "mismatches", [])
    first = mism[0] if mism else None
    return {"passed": bool(v.passed), "checked": int(getattr(v, "checked", len(records))),
            "mismatches": len(mism) if isinstance(mism, list) else int(mism),
            "ties": len(v.ties) if isinstance(getattr(v, "ties", 0), list) else int(v.ties),
            "first_mismatch": str(first)[:300] if first is not None else ""}


class EvaluatorCore:
    """One evaluation slot: the stock reference process plus the candidate runs."""

    def __init__(self, target: str, device: str, dtype: str):
        from ..forcing.reference import LocalReference

        self.reference = LocalReference(target, device, dtype)

    def evaluate(self, req: EvalRequest, with_gate: bool = False) -> EvalResult:
        import time

        t0 = time.time()
        res = EvalResult(cid=req.cid, hash=req.hash, ok=False)
        raw = run_worker(req, with_gate)
        res.wall_s = time.time() - t0
        if not raw.get("ok"):
            res.reason = raw.get("error", "failed")
            return res
        res.ok = True
        res.times, res.tokens, res.steps = raw["times"], raw["tokens"], raw["steps"]
        res.chunk_batch, res.accept_hist = raw["chunk_batch"], raw["accept_hist"]
        try:
            res.verdict = force(self.reference, raw["outputs"], req.max_new_tokens)
            res.verified = res.verdict["passed"]
            if with_gate:
                res.gate_verdict = force(self.reference, raw["gate_outputs"], req.max_new_tokens)
                res.gate_verified = res.gate_verdict["passed"]
        except Exception as e:  # noqa: BLE001 - a verifier error rejects, never crashes
            res.verified, res.reason = False, f"token forcing failed: {str(e)[:200]}"
            return res
        if not raw.get("stable", True):
            res.reason = "outputs differ between repeats (nondeterministic)"
        elif not res.verified:
            res.reason = f"not lossless: {res.verdict.get('first_mismatch', '')[:200]}"
        elif with_gate and not res.gate_verified:
            res.reason = "not lossless on the gate set"
        elif req.min_s_per_token > 0 and res.tok_s > 1.0 / req.min_s_per_token:
            res.reason = (f"{res.tok_s:.1f} tok/s beats the physical bound "
                          f"{1.0 / req.min_s_per_token:.1f} tok/s: measurement error")
        res.wall_s = time.time() - t0
        return res

    def close(self) -> None:
        self.reference.close()


def evaluator_actor(num_gpus: float):
    """The Ray actor class wrapping `EvaluatorCore` (one slot: 1 CPU, or 1 GPU)."""
    import ray

    opts = {"num_gpus": 1} if num_gpus else {"num_cpus": 1}

    @ray.remote(**opts)
    class Evaluator:
        def __init__(self, target: str, device: str, dtype: str):
            self.core = EvaluatorCore(target, device, dtype)

        def evaluate(self, req: EvalRequest, with_gate: bool = False) -> dict:
            return self.core.evaluate(req, with_gate).to_dict()

        def close(self) -> None:
            self.core.close()

    return Evaluator
