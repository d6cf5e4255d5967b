"""Evaluate a built candidate in isolation: bench in a child process, verify with stock code.

`Evaluator` is a Ray actor (one per evaluation slot: a CPU slot, or `num_gpus=1`). For
each request it runs `specpilot.agents.worker` in a fresh process whose PYTHONPATH starts
with the candidate's build dir, under a time limit; a crash, a hang or an exception there
is a failed candidate (`EvalResult.ok = False` with the reason), never a failed search.
The timing is the bench module's (`run_bench`, per-request times), the comparison its
paired bootstrap (`bench.stats`). The outputs then go through token forcing against the
stock runtime (a reference process the actor keeps), and the timings are checked against
the cost model's physical bound.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..bench.stats import paired_bootstrap_ratio, throughput
from ..engines import run_in_build


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
    prompts: list[list[int]]  # the dev prompts to bench (empty: gate outputs only)
    repeats: int = 3
    gate_prompts: list[list[int]] = field(default_factory=list)
    time_limit_s: float = 300.0
    min_s_per_token: float = 0.0  # the cost model's bound; faster = measurement error


@dataclass
class EvalResult:
    """One evaluation. Units are (batch size, dev request) pairs, in request order per
    batch size; `time_s` is each unit's share of its batch's wall time (median over the
    repeats), as `run_bench` reports it."""

    cid: str
    hash: str
    ok: bool  # ran to completion and produced outputs
    reason: str = ""  # why not ok / why rejected
    verified: bool | None = None  # dev token forcing
    gate_verified: bool | None = None
    verdict: dict = field(default_factory=dict)
    gate_verdict: dict = field(default_factory=dict)
    time_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # new tokens per unit
    steps: list[int] = field(default_factory=list)  # verify steps per unit
    batch: list[int] = field(default_factory=list)  # batch size of each unit
    accept_hist: list[int] = field(default_factory=list)  # steps that accepted i drafts
    draft_fraction: float | None = None  # of generate time spent proposing (CPU only)
    wall_s: float = 0.0

    @property
    def tok_s(self) -> float:
        return throughput(self.tokens, self.time_s) if self.time_s else 0.0

    def tok_s_by_batch(self) -> dict[int, float]:
        out = {}
        for b in sorted(set(self.batch)):
            idx = [i for i, x in enumerate(self.batch) if x == b]
            out[b] = throughput([self.tokens[i] for i in idx], [self.time_s[i] for i in idx])
        return out

    @property
    def accept_length(self) -> float:
        """Tokens committed by verify steps / verify steps, as the runtime's metric: each
        request's first token comes from prefill, not from a verify step."""
        if not self.steps:
            return 0.0
        return float((sum(self.tokens) - len(self.tokens)) / max(1, sum(self.steps)))

    @property
    def accepted(self) -> bool:
        return self.ok and bool(self.verified) and not self.reason

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EvalResult:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})

    def add_bench(self, batch: int, result: dict) -> None:
        """Append the units of one `run_bench` result (one batch size)."""
        for q in result["requests"]:
            self.time_s.append(float(q["time_s"]))
            self.tokens.append(int(q["new_tokens"]))
            self.steps.append(int(q["verify_steps"]))
            self.batch.append(int(batch))


def speedup(base: EvalResult, cand: EvalResult, seed: int = 0,
            n_boot: int = 10_000) -> tuple[float, tuple[float, float]]:
    """Throughput ratio candidate / base (> 1: candidate faster) and its 95% paired
    bootstrap CI over the shared units (`bench.stats.paired_bootstrap_ratio`)."""
    if len(base.time_s) != len(cand.time_s) or not base.time_s:
        raise ValueError("speedup needs two evaluations of the same prompts")
    ratio, lo, hi = paired_bootstrap_ratio(cand.time_s, base.time_s, cand.tokens, base.tokens,
                                           n=n_boot, seed=seed)
    return ratio, (lo, hi)


def run_worker(req: EvalRequest, with_gate: bool) -> dict:
    """Run the candidate's worker process; returns its JSON or {'ok': False, 'error': ...}."""
    build = Path(req.build_path)
    payload = asdict(req)
    if not with_gate:
        payload["gate_prompts"] = []
    payload["package"] = str(build / "specpilot")
    with tempfile.TemporaryDirectory(prefix="specpilot-eval-") as tmp:
        rq, out, log = Path(tmp) / "req.json", Path(tmp) / "out.json", Path(tmp) / "log.txt"
        rq.write_text(json.dumps(payload))
        # one evaluation slot is one CPU (as Ray gives its actors) unless the knobs set
        # threads: evaluations in the search and in replay time the same way
        rc = run_in_build(build, "specpilot.agents.worker", [str(rq), str(out)], log,
                          req.time_limit_s,
                          env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        if rc is None:
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


def dev_records(benches: dict[str, dict]) -> list[dict]:
    """The distinct (prompt, output) pairs of every batch size's bench: what forcing checks."""
    seen, out = set(), []
    for res in benches.values():
        for q in res["requests"]:
            key = (tuple(q["prompt_ids"]), tuple(q["output_ids"]))
            if key not in seen:
                seen.add(key)
                out.append({"prompt_ids": q["prompt_ids"], "output_ids": q["output_ids"],
                            "finish_reason": q["finish_reason"]})
    return out


def rejection(res: EvalResult, stable: bool, dev: bool, gate: bool,
              min_s_per_token: float = 0.0) -> str:
    """Why a run that produced outputs is rejected ("" when it is not): nondeterminism,
    a token forcing failure on dev or gate, or a speed beyond the physical bound."""
    if dev and not stable:
        return "outputs differ between repeats (nondeterministic)"
    if dev and not res.verified:
        return f"not lossless: {res.verdict.get('first_mismatch', '')[:200]}"
    if gate and not res.gate_verified:
        return "not lossless on the gate set"
    if dev and min_s_per_token > 0 and res.tok_s > 1.0 / min_s_per_token:
        return (f"{res.tok_s:.1f} tok/s beats the physical bound "
                f"{1.0 / min_s_per_token:.1f} tok/s: measurement error")
    return ""


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
        res.accept_hist = raw.get("accept_hist") or []
        split = raw.get("split") or {}
        if split.get("generate_s"):
            res.draft_fraction = split["draft_s"] / split["generate_s"]
        benches = raw.get("bench") or {}
        for b in req.batch_sizes:
            if str(b) in benches:
                res.add_bench(b, benches[str(b)])
        try:
            if req.prompts:
                res.verdict = force(self.reference, dev_records(benches), req.max_new_tokens)
                res.verified = res.verdict["passed"]
            if with_gate:
                res.gate_verdict = force(self.reference, raw["gate_outputs"], req.max_new_tokens)
                res.gate_verified = res.gate_verdict["passed"]
        except Exception as e:  # noqa: BLE001 - a verifier error rejects, never crashes
            res.verified, res.reason = False, f"token forcing failed: {str(e)[:200]}"
            return res
        stable = all(r["totals"].get("outputs_stable", True) for r in benches.values())
        res.reason = rejection(res, stable, bool(req.prompts), with_gate, req.min_s_per_token)
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
