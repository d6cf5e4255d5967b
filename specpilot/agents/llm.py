"""The LLM proposer: gaps, the best engine, editable files and history in; candidates out.

The model answers through one tool, `propose_candidates` (knob changes and SEARCH/REPLACE
edits, each with a rationale). A malformed answer yields no candidates and a note saying
why; edits that do not apply are rejected later, at build. Every call is recorded (prompt,
answer, tokens, dollars) for the trace; API keys never are. A run has a budget in tokens
and dollars; once spent, the agent stops asking.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .candidate import Candidate, Edit, ProposalContext

SYSTEM = """You tune a speculative-decoding engine for one deployment. Decoding is greedy
and must stay LOSSLESS: every committed token must be the target model's argmax; any
change in output is rejected by token forcing on a hidden set. Make it faster.
You may change knobs and edit the runtime files shown, with SEARCH/REPLACE edits: SEARCH
must match the current file exactly once. Never touch timing, synchronisation, streams,
try/except, file or process access, or the benchmark/forcing harness: such edits are
rejected. Answer only by calling the tool propose_candidates."""

TOOL = {
    "name": "propose_candidates",
    "description": "Propose candidate engines: knob changes and/or SEARCH/REPLACE edits.",
    "schema": {
        "type": "object",
        "properties": {"candidates": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "rationale": {"type": "string"},
                "knobs": {"type": "object", "description": "knob name -> new value"},
                "edits": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "search": {"type": "string"},
                                   "replace": {"type": "string"}},
                    "required": ["path", "search", "replace"]}},
            },
            "required": ["rationale"]}}},
        "required": ["candidates"],
    },
}

#: US dollars per million (input, output) tokens, by model-name prefix; unknown = 0
PRICES = {"claude-opus": (15.0, 75.0), "claude-sonnet": (3.0, 15.0), "claude-haiku": (1.0, 5.0),
          "gpt-4o-mini": (0.15, 0.6), "gpt-4o": (2.5, 10.0), "gpt-4.1": (2.0, 8.0),
          "o3": (2.0, 8.0), "gpt-5": (1.25, 10.0)}


def price(model: str, tokens_in: int, tokens_out: int) -> float:
    for prefix, (pi, po) in sorted(PRICES.items(), key=lambda kv: -len(kv[0])):
        if model.startswith(prefix):
            return (tokens_in * pi + tokens_out * po) / 1e6
    return 0.0


@dataclass
class Budget:
    max_tokens: int = 400_000
    max_dollars: float = 5.0
    tokens: int = 0
    dollars: float = 0.0

    @property
    def spent(self) -> bool:
        return self.tokens >= self.max_tokens or self.dollars >= self.max_dollars


def build_prompt(ctx: ProposalContext, max_file_chars: int = 12_000) -> str:
    hist = [{k: h.get(k) for k in ("id", "agent", "summary", "status", "reason", "tok_s")}
            for h in ctx.history[-20:]]
    parts = [
        f"Deployment {ctx.deployment} on {ctx.device}, batch sizes {ctx.batch_sizes}.",
        f"Allowed drafters: {ctx.drafters + ['ngram']}.",
        (f"Round {ctx.round}. Current best engine {ctx.best_id}: {ctx.best_tok_s:.1f} tok/s, "
        f"knobs {json.dumps(ctx.best_knobs)}; overlay files {sorted(ctx.best_overlay)}."),
        f"Cost-model gaps (ms/token lost, largest first): {json.dumps(ctx.gaps[:8])}",
        f"Cost model's best k per batch size: {json.dumps(ctx.best_k)}",
        f"Earlier candidates: {json.dumps(hist)}",
        f"Propose up to {ctx.n} candidates. Editable files follow.",
    ]
    for path, text in sorted(ctx.editable_files.items()):
        body = ctx.best_overlay.get(path, text)
        if len(body) > max_file_chars:
            body = body[:max_file_chars] + "\n# ... (truncated)"
        parts.append(f"=== {path} ===\n{body}")
    return "\n\n".join(parts)


def parse_candidates(payload: dict | None, ctx: ProposalContext,
                     agent: str) -> tuple[list[Candidate], str]:
    """Candidates from a tool payload, and an error when it is malformed (then none)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("candidates"), list):
        return [], "malformed answer: no 'candidates' list"
    out = []
    for i, c in enumerate(payload["candidates"][: ctx.n]):
        try:
            knobs = c.get("knobs") or {}
            edits = tuple(Edit(str(e["path"]), str(e["search"]), str(e["replace"]))
                          for e in c.get("edits") or [])
            if not isinstance(knobs, dict):
                raise TypeError("knobs is not an object")
        except (AttributeError, KeyError, TypeError) as e:
            return [], f"malformed answer: candidate {i}: {type(e).__name__}: {e}"
        out.append(Candidate(id="", agent=agent, knobs=dict(knobs), edits=edits,
                             rationale=str(c.get("rationale", ""))[:2000],
                             parents=(ctx.best_id,), round=ctx.round))
    return out, ""


class LLMAgent:
    """Proposals from an LLM provider (anthropic_provider / openai_provider)."""

    def __init__(self, provider, model: str, budget: Budget | None = None):
        self.provider, self.model = provider, model
        self.name = f"llm:{provider.name}"
        self.budget = budget or Budget()

    def propose(self, ctx: ProposalContext) -> tuple[list[Candidate], list[dict]]:
        if self.budget.spent:
            return [], [{"agent": self.name, "note": "budget spent", "tokens": self.budget.tokens,
                         "dollars": round(self.budget.dollars, 4)}]
        prompt = build_prompt(ctx)
        reply = self.provider.complete(SYSTEM, prompt, TOOL)
        cost = price(self.model, reply.input_tokens, reply.output_tokens)
        self.budget.tokens += reply.input_tokens + reply.output_tokens
        self.budget.dollars += cost
        cands, err = ([], reply.error) if reply.error else parse_candidates(
            reply.payload, ctx, self.name)
        note = {"agent": self.name, "model": self.model, "prompt": prompt, "system": SYSTEM,
                "response": reply.text, "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens, "dollars": round(cost, 6),
                "attempts": reply.attempts, "error": err, "candidates": len(cands)}
        return cands, [note]
