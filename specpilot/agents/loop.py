"""The search: start -> propose -> build -> evaluate -> merge, round after round -> promote.

Proposers run as Ray actors in parallel; evaluations go to `Evaluator` actors (one per
CPU slot or GPU). Everything is appended to the run's trace as it happens, and finished
evaluations are cached by candidate hash in it: `resume=True` replays the trace (recorded
proposals, results) and redoes no finished evaluation. The gate workload is only ever
seen by the final checks before promotion, never by a proposer.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..deployment import check_searchable, load_deployment
from ..engines import EngineSpec, build
from ..runtime.errors import SpecPilotError
from ..runtime.knobs import Knobs
from ..runtime.tokenizer import Tokenizer
from ..trace import Trace, new_run_id, read_events, runs_dir
from .candidate import Candidate, PatchError, ProposalContext, materialize
from .checks import check_edit_paths, check_overlay
from .evaluate import (
    EvalRequest,
    EvalResult,
    EvaluatorCore,
    evaluator_actor,
    force,
    rejection,
    speedup,
)
from .inputs import cost_model, editable_files, load_prompts
from .interleave import Entrant, interleaved
from .merge import Lineage, MergeConflict, merge_knobs, merge_overlays
from .promotion import finish
from .ray_env import agent_actor, make_agent, start_ray


@dataclass
class SearchConfig:
    deployment: str
    budget: int = 24  # evaluations of proposed candidates (ar/stock/gate not counted)
    time_limit_min: float = 14.0
    agents: tuple[str, ...] = ("heuristic",)
    llm: str | None = None  # anthropic:MODEL | openai:MODEL
    llm_base_url: str | None = None
    replay_from: str | None = None  # run id or trace.jsonl for the replay agent
    workers: int = 1
    ray_address: str | None = None
    run_id: str | None = None
    resume: bool = False
    seed: int = 0
    per_round: int = 4
    repeats: int = 2
    dev_limit: int | None = 8
    gate_limit: int | None = 8
    eval_time_limit_s: float = 0.0  # 0: 10x the stock evaluation, at least 60 s
    engines_root: str | None = None
    promote: bool = True
    confirm_top: int = 3  # front runners re-timed against stock and ar before promotion
    confirm_rounds: int = 2


@dataclass
class State:
    """What the loop knows; rebuilt from the trace on resume."""

    results: dict[str, EvalResult] = field(default_factory=dict)  # hash -> dev result
    gate: dict[str, EvalResult] = field(default_factory=dict)  # hash -> gate result
    confirm: dict[str, EvalResult] = field(default_factory=dict)  # id -> confirmation
    specs: dict[str, EngineSpec] = field(default_factory=dict)  # candidate id -> spec
    ids: dict[str, str] = field(default_factory=dict)  # candidate id -> hash
    proposals: dict[int, list[Candidate]] = field(default_factory=dict)  # recorded rounds
    seen: set[tuple] = field(default_factory=set)  # (event, candidate, set) in the trace
    agents: dict[str, str] = field(default_factory=dict)  # candidate id -> agent
    history: list[dict] = field(default_factory=list)
    best: str = "stock"
    evaluations: int = 0


class Search:
    def __init__(self, cfg: SearchConfig, on_event=None):
        if cfg.resume:
            cfg = resumed_config(cfg)
        self.cfg, self.on_event = cfg, on_event or (lambda rec: None)
        self.dep = load_deployment(cfg.deployment)
        check_searchable(self.dep)
        self.run_id = cfg.run_id or new_run_id(f"{self.dep.name}-")
        run_dir = runs_dir() / self.run_id
        if cfg.resume and not (run_dir / "trace.jsonl").is_file():
            raise SpecPilotError(f"nothing to resume: no trace in {run_dir}")
        if not cfg.resume and (run_dir / "trace.jsonl").is_file():
            raise SpecPilotError(f"run {self.run_id} exists: use --resume {self.run_id}")
        # every input is checked before the run directory exists: bad input leaves no run
        if not cfg.agents:
            raise SpecPilotError("--agents names no proposer: use heuristic, llm, replay or kernel")
        for kind in cfg.agents:  # built here once, so a bad one fails here, not in its actor
            make_agent(kind, cfg, self.dep)
        tok = Tokenizer(self.dep.target)
        self.dev = load_prompts(self.dep.dev_workload, tok, cfg.dev_limit)
        self.gate_prompts = load_prompts(self.dep.gate_workload, tok, cfg.gate_limit)
        self.trace = Trace(run_dir)
        self.st = State()
        self.lineage = Lineage()
        self.t0 = time.time()
        self.batch = self.dep.batch_sizes[0]

    # --- trace -------------------------------------------------------------------------
    def log(self, event: str, candidate: str | None = None, parents=(), **data) -> None:
        if candidate and (event, candidate, data.get("set") or data.get("engine")) in self.st.seen:
            return
        rec = self.trace.append(event, candidate, parents, **data)
        self.on_event(rec)

    def _load_trace(self) -> None:
        for e in self.trace.events():
            cid = e.get("candidate")
            if e["event"] == "bench" and e.get("result"):
                self.st.results[e["hash"]] = EvalResult.from_dict(e["result"])
            elif e["event"] == "verify" and e.get("set") == "gate" and e.get("result"):
                self.st.gate[e["hash"]] = EvalResult.from_dict(e["result"])
            elif e["event"] == "confirm" and e.get("result"):
                self.st.confirm[cid] = EvalResult.from_dict(e["result"])
            elif e["event"] == "proposal" and e.get("proposal"):
                c = Candidate.from_dict(e["proposal"])
                self.st.proposals.setdefault(c.round, []).append(c)
            if cid:
                self.st.seen.add((e["event"], cid, e.get("set") or e.get("engine")))

    # --- evaluation --------------------------------------------------------------------
    def request(self, cid: str, spec: EngineSpec, gate: bool = False) -> EvalRequest:
        b = build(spec)
        return EvalRequest(
            cid=cid, hash=spec.hash, build_path=str(b.path), target=self.dep.target,
            device=self.dep.device, dtype=self.dep.dtype, knobs=spec.knobs.to_dict(),
            batch_sizes=list(self.dep.batch_sizes), max_new_tokens=self.dep.max_new_tokens,
            prompts=[] if gate else self.dev, repeats=self.cfg.repeats,
            gate_prompts=self.gate_prompts if gate else [], time_limit_s=self.limit_s,
            min_s_per_token=self.bound)

    def evaluate(self, jobs: list[tuple[str, EngineSpec]], gate: bool = False) -> None:
        """Evaluate (id, spec) pairs on the actors, logging bench/verify as each finishes."""
        import ray

        cache = self.st.gate if gate else self.st.results
        todo = [(cid, s) for cid, s in jobs if s.hash not in cache]
        for cid, s in jobs:
            if s.hash in cache and not gate:
                r = cache[s.hash]
                self.lineage.add(cid, s.parents, tok_s=r.tok_s or None,
                                 status="accepted" if r.accepted else "rejected")
        free, running = list(self.actors), {}
        while todo or running:
            while todo and free:
                cid, spec = todo.pop(0)
                actor = free.pop()
                ref = actor.evaluate.remote(self.request(cid, spec, gate), gate)
                running[ref] = (cid, spec, actor)
            done = []
            while not done:  # short waits, so Ctrl-C reaches Python promptly
                done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            cid, spec, actor = running.pop(done[0])
            free.append(actor)
            try:
                res = EvalResult.from_dict(ray.get(done[0]))
            except Exception as e:  # noqa: BLE001 - a lost actor fails one candidate
                res = EvalResult(cid, spec.hash, ok=False, reason=f"evaluator lost: {e}"[:300])
                self.actors.remove(actor)
                self.actors.append(self.new_actor())
                free = [a for a in free if a is not actor] + [self.actors[-1]]
            self.record(cid, spec, res, gate)

    def record(self, cid: str, spec: EngineSpec, res: EvalResult, gate: bool) -> None:
        if gate:
            self.st.gate[spec.hash] = res
            self.log("verify", cid, spec.parents, set="gate", hash=spec.hash,
                     passed=bool(res.gate_verified), status="gate",
                     verdict=res.gate_verdict, reason=res.reason, result=res.to_dict())
            return
        self.st.results[spec.hash] = res
        sp = ci = None
        base = self.st.results.get(self.st.ids.get("stock", ""))
        if res.ok and base is not None and base.ok:
            sp, ci = speedup(base, res, seed=self.cfg.seed)
        status = "accepted" if res.accepted else ("failed" if not res.ok else "rejected")
        self.log("bench", cid, spec.parents, hash=spec.hash, ok=res.ok, tok_s=res.tok_s,
                 accept_length=res.accept_length, speedup_vs_stock=sp, ci95=ci,
                 wall_s=res.wall_s, reason="" if res.ok else res.reason, result=res.to_dict())
        if res.ok:
            self.log("verify", cid, spec.parents, set="dev", hash=spec.hash,
                     passed=bool(res.verified), status=status, verdict=res.verdict,
                     reason=res.reason)
        self.lineage.add(cid, spec.parents, status=status, tok_s=res.tok_s or None,
                         speedup=sp)

    def confirm(self, cids: list[str]) -> dict[str, EvalResult]:
        """Re-time `cids` (stock and ar among them) side by side, interleaved chunk by
        chunk (`interleave`), after Ray is down, and token-force their outputs: what the
        final choice and the shipped numbers rest on. Recorded, so a resume reuses it."""
        if all(c in self.st.confirm for c in cids):
            return self.st.confirm
        dep, specs = self.dep, [self.st.specs[c] for c in cids]
        entrants = [Entrant(c, s.hash, str(build(s).path), s.knobs.to_dict())
                    for c, s in zip(cids, specs)]
        timed = interleaved(entrants, dep.target, dep.device, dep.dtype, self.dev,
                            list(dep.batch_sizes), dep.max_new_tokens,
                            rounds=self.cfg.confirm_rounds, limit_s=self.limit_s)
        core = EvaluatorCore(dep.target, dep.device, dep.dtype)
        try:
            for c, s in zip(cids, specs):
                t = timed[c]
                res = t.result
                if res.ok:
                    res.verdict = force(core.reference, t.records, dep.max_new_tokens)
                    res.verified = res.verdict["passed"]
                    res.reason = rejection(res, t.stable, True, False, self.bound)
                self.st.confirm[c] = res
        finally:
            core.close()
        base = self.st.confirm["stock"]
        for c, s in zip(cids, specs):
            res = self.st.confirm[c]
            sp, ci = speedup(base, res, seed=self.cfg.seed) if res.ok and base.ok else (None, None)
            self.log("confirm", c, s.parents, hash=s.hash, ok=res.ok, tok_s=res.tok_s,
                     accept_length=res.accept_length, speedup_vs_stock=sp, ci95=ci,
                     passed=bool(res.verified), reason=res.reason, result=res.to_dict())
        return self.st.confirm

    def release(self) -> None:
        """Stop this run's actors, and Ray when this run started it (idempotent)."""
        import ray

        actors, agents = getattr(self, "actors", []), getattr(self, "agents", [])
        if actors or agents:
            with contextlib.suppress(Exception):  # best effort; the actors are killed next
                ray.get([a.close.remote() for a in actors], timeout=30)
            for a in actors + agents:
                ray.kill(a)
        self.actors, self.agents = [], []
        if getattr(self, "started_ray", False):
            ray.shutdown()
            self.started_ray = False

    def new_actor(self):
        cls = evaluator_actor(1 if self.dep.device == "cuda" else 0)
        return cls.remote(self.dep.target, self.dep.device, self.dep.dtype)

    # --- the rounds --------------------------------------------------------------------
    def context(self, rnd: int, n: int) -> ProposalContext:
        best = self.st.specs[self.st.best]
        res = self.st.results[best.hash]
        return ProposalContext(
            deployment=self.dep.name, device=self.dep.device,
            batch_sizes=list(self.dep.batch_sizes),
            drafters=[d.spec for d in self.dep.drafters], round=rnd, best_id=self.st.best,
            best_knobs=best.knobs.to_dict(), best_overlay=dict(best.overlay),
            best_tok_s=res.tok_s, gaps=self.gaps, best_k=self.best_k,
            history=list(self.st.history), editable_files=self.editable,
            n=max(1, min(n, self.cfg.budget - self.st.evaluations)),
            seed=self.cfg.seed)

    def propose(self, rnd: int, n: int) -> list[Candidate]:
        import ray

        if rnd in self.st.proposals:
            return self.st.proposals[rnd]
        ctx = self.context(rnd, n)
        replies = ray.get([a.propose.remote(ctx) for a in self.agents])
        out = []
        for cands, notes in replies:
            for note in notes:
                self.log("proposal", None, (), round=rnd, **note)
            out += cands
        n0 = sum(len(v) for v in self.st.proposals.values())
        out = [Candidate(**{**c.__dict__, "id": f"c{n0 + i + 1:03d}"}) for i, c in enumerate(out)]
        self.st.proposals[rnd] = out
        return out

    def admit(self, c: Candidate) -> EngineSpec | None:
        """Static checks and build of a proposal; None (and a logged reason) when rejected."""
        base = self.st.specs[c.parents[0]] if c.parents and c.parents[0] in self.st.specs \
            else self.st.specs[self.st.best]
        rec = {"round": c.round, "agent": c.agent, "summary": c.summary(), "rationale": c.rationale,
                   "proposal": c.to_dict()}
        why = check_edit_paths(c.paths)
        spec = None
        if not why:
            try:
                knobs, overlay = materialize(c, base.knobs, base.overlay)
                why = check_overlay(overlay)
                spec = EngineSpec(self.dep.name, c.id, knobs, overlay, c.parents, self.run_id)
            except (PatchError, SpecPilotError) as e:
                why = [str(e)]
        if why:
            self.log("proposal", c.id, c.parents, rejected="; ".join(why)[:500], **rec)
            self.st.history.append({"id": c.id, "agent": c.agent, "summary": c.summary(),
                                    "status": "rejected", "reason": "; ".join(why)[:300]})
            self.lineage.add(c.id, c.parents, status="rejected")
            return None
        self.log("proposal", c.id, c.parents, **rec)
        self.trace.save_candidate(c.id, c.to_dict() | {"knobs_full": spec.knobs.to_dict()},
                                  spec.overlay)
        self.log("build", c.id, c.parents, hash=spec.hash, ok=True,
                 overlay=sorted(spec.overlay), knobs=spec.knobs.to_dict())
        return spec

    def consider(self, cid: str, spec: EngineSpec, agent: str) -> None:
        res = self.st.results[spec.hash]
        self.st.history.append({"id": cid, "agent": agent, "summary": spec_summary(spec),
                                "knobs_full": spec.knobs.to_dict(), "tok_s": res.tok_s,
                                "status": "accepted" if res.accepted else "rejected",
                                "reason": res.reason})
        if not res.accepted:
            return
        best = self.st.results[self.st.specs[self.st.best].hash]
        _ratio, ci = speedup(best, res, seed=self.cfg.seed)
        if ci[0] > 1.0:
            self.st.best = cid

    def round(self, rnd: int, n: int) -> bool:
        cands = self.propose(rnd, n)
        if not cands:
            return False
        jobs = []
        for c in cands:
            spec = self.admit(c)
            self.st.agents[c.id] = c.agent
            if spec is not None:
                self.st.specs[c.id], self.st.ids[c.id] = spec, spec.hash
                jobs.append((c.id, spec))
        room = self.cfg.budget - self.st.evaluations
        jobs = jobs[:max(0, room)]
        self.st.evaluations += len(jobs)
        self.evaluate(jobs)
        base = self.st.best
        for cid, spec in jobs:
            self.consider(cid, spec, self.st.agents.get(cid, ""))
        self.merge_round(rnd, base, [cid for cid, _ in jobs])
        return True

    def merge_round(self, rnd: int, base_id: str, cids: list[str]) -> None:
        base = self.st.specs[base_id]
        b_res = self.st.results[base.hash]
        wins = [c for c in cids if self.st.results[self.st.ids[c]].accepted
                and speedup(b_res, self.st.results[self.st.ids[c]])[0] > 1.0]
        wins.sort(key=lambda c: -self.st.results[self.st.ids[c]].tok_s)
        if len(wins) < 2 or self.st.evaluations >= self.cfg.budget:
            return
        knobs, overlay, parents = base.knobs.to_dict(), dict(base.overlay), []
        for c in wins:
            s = self.st.specs[c]
            try:
                k2 = merge_knobs(base.knobs.to_dict(), knobs, s.knobs.to_dict())
                o2 = merge_overlays(base.overlay, overlay, s.overlay)
            except MergeConflict as e:
                self.log("merge", None, (c,), round=rnd, conflict=str(e))
                continue
            knobs, overlay, parents = k2, o2, parents + [c]
        if len(parents) < 2:
            return
        cid = f"m{rnd:03d}"
        spec = EngineSpec(self.dep.name, cid, Knobs.from_dict(knobs), overlay, tuple(parents),
                          self.run_id)
        self.st.specs[cid], self.st.ids[cid] = spec, spec.hash
        self.log("merge", cid, parents, round=rnd, hash=spec.hash, knobs=knobs,
                 overlay=sorted(overlay), summary=spec_summary(spec))
        self.st.evaluations += 1
        self.evaluate([(cid, spec)])
        self.consider(cid, spec, "merge")

    def round_size(self, eval_s: float) -> int:
        """Proposals an agent may make in the next round: the most, up to `per_round`, whose
        evaluations (every agent's n, and a merge), the final gate checks and the
        confirmation still fit in the time limit at the stock evaluation's wall time (the
        confirmation times each of its engines about as long as one evaluation); 0 when not
        even one does. On a slow machine a smaller round still runs where a full one would
        not fit."""
        w, left = max(1, self.cfg.workers), self.cfg.time_limit_min * 60 - (time.time() - self.t0)
        for n in range(self.cfg.per_round, 0, -1):
            jobs = n * len(self.cfg.agents)
            jobs += jobs >= 2  # a merge needs two winners
            if (-(-jobs // w) + 3 + self.cfg.confirm_top + 2) * eval_s < left:
                return n
        return 0

    # --- the whole run -----------------------------------------------------------------
    def run(self) -> dict:

        cfg, dep = self.cfg, self.dep
        self.started_ray = start_ray(cfg.ray_address)
        try:
            if cfg.resume:
                self._load_trace()
            self.log("run_started", None, (), deployment=dep.name, config=cfg.__dict__,
                     device=dep.device, target=dep.target, pid=os.getpid(),
                     resumed=cfg.resume)
            self.limit_s, self.bound = cfg.eval_time_limit_s or 600.0, 0.0
            self.actors = [self.new_actor() for _ in range(max(1, cfg.workers))]
            stock = EngineSpec(dep.name, "stock", dep.stock_knobs(), run_id=self.run_id)
            ar = EngineSpec(dep.name, "ar", dep.knobs.with_(drafter=None), run_id=self.run_id)
            for s in (stock, ar):
                self.st.specs[s.name], self.st.ids[s.name] = s, s.hash
            # with a given time limit ar and stock run side by side; else stock's wall
            # time sets the limit of every later evaluation, ar included
            self.evaluate([("stock", stock)] + ([("ar", ar)] if cfg.eval_time_limit_s else []))
            sres = self.st.results[stock.hash]
            if not sres.accepted:
                raise SpecPilotError(f"the stock engine fails its own evaluation: {sres.reason}")
            if not cfg.eval_time_limit_s:
                self.limit_s = max(60.0, 10 * sres.wall_s)
                self.evaluate([("ar", ar)])
            measured = {"stock_tok_s": sres.tok_s, "ar_tok_s": self.st.results[ar.hash].tok_s,
                        "stock_accept_length": sres.accept_length,
                        "stock_accept_hist": sres.accept_hist,
                        "stock_draft_fraction": sres.draft_fraction,
                        "stock_steps": sum(sres.steps), "stock_s": float(sum(sres.time_s)),
                        "stock_tokens": sum(sres.tokens),
                        "stock_tok_s_by_batch": sres.tok_s_by_batch(),
                        "ar_tok_s_by_batch": self.st.results[ar.hash].tok_s_by_batch()}
            self.gaps, self.best_k, self.bound = cost_model(dep, measured)
            if not any(e["event"] == "gaps" for e in self.trace.events()):
                self.log("gaps", None, (), gaps=self.gaps, best_k=self.best_k,
                         min_s_per_token=self.bound, measured=measured)
            self.editable = editable_files()
            self.agents = [agent_actor(a, cfg, dep) for a in cfg.agents]
            rnd = 0
            while self.st.evaluations < cfg.budget:
                n = self.round_size(sres.wall_s)
                if not n:
                    break
                if n < cfg.per_round and rnd not in self.st.proposals:
                    self.log("proposal", None, (), round=rnd, agent="search",
                             note=f"this round takes {n} of the {cfg.per_round} proposals an "
                                  "agent: a full round no longer fits the time limit")
                if not self.round(rnd, n):
                    break
                rnd += 1
                self.lineage.save(self.trace.dir / "lineage.json")
            return finish(self)
        finally:
            self.lineage.save(self.trace.dir / "lineage.json")
            self.release()


def resumed_config(cfg: SearchConfig) -> SearchConfig:
    """The configuration a run started with (from its trace), with this call's Ray
    address and workers: a resumed run proposes and measures as the original would."""
    if not cfg.run_id:
        raise SpecPilotError("--resume needs the run id to resume")
    f = runs_dir() / cfg.run_id / "trace.jsonl"
    start = next((e for e in read_events(f) if e["event"] == "run_started"), None)
    if start is None:
        raise SpecPilotError(f"nothing to resume: no started run in {f}")
    keep = {"ray_address": cfg.ray_address, "workers": cfg.workers, "resume": True,
            "run_id": cfg.run_id}
    if cfg.engines_root:
        keep["engines_root"] = cfg.engines_root
    old = {k: v for k, v in start["config"].items() if k in SearchConfig.__dataclass_fields__}
    old["agents"] = tuple(old.get("agents", ("heuristic",)))
    return SearchConfig(**{**old, **keep})


def spec_summary(spec: EngineSpec) -> str:
    k = spec.knobs
    s = f"drafter={(k.drafter or 'none').rsplit('/', 1)[-1]} k={k.k}"
    if k.k_per_batch:
        s += f" k_per_batch={k.k_per_batch}"
    if k.drafter == "ngram":
        s += f" ngram={k.ngram_min}..{k.ngram_max}"
    if k.threads:
        s += f" threads={k.threads}"
    if spec.overlay:
        s += f" overlay={','.join(p.rsplit('/', 1)[-1] for p in sorted(spec.overlay))}"
    return s


def run_search(cfg: SearchConfig, on_event=None) -> dict:
    """Run (or resume) a search; returns the summary that `run_finished` records."""
    return Search(cfg, on_event).run()


__all__ = ["Path", "Search", "SearchConfig", "run_search"]
