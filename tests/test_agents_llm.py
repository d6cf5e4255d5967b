"""The LLM proposer through the real anthropic/openai SDKs against local recorded servers."""

from __future__ import annotations

import json

import pytest

from specpilot.agents.candidate import PatchError, ProposalContext, materialize
from specpilot.agents.checks import check_overlay
from specpilot.agents.llm import Budget, LLMAgent
from specpilot.agents.providers import make_provider
from specpilot.runtime.knobs import Knobs
from specpilot.trace import Trace
from tests.fixtures.llm_server import LLMServer, recorded

SECRET = "sk-test-0123456789abcdef"


def ctx(n: int = 4) -> ProposalContext:
    return ProposalContext(deployment="t", device="cpu", batch_sizes=[1],
                           drafters=["draft:/x/draft"], round=0, best_id="stock",
                           best_knobs=Knobs(drafter="ngram").to_dict(), best_overlay={},
                           best_tok_s=50.0, gaps=[{"name": "verify", "ms_per_token": 3.0}],
                           history=[{"id": "c001", "summary": "k=3", "status": "accepted"}],
                           editable_files={"specpilot/runtime/drafters/ngram.py": "# file"}, n=n)


def agent(kind: str, url: str, monkeypatch, model: str) -> LLMAgent:
    if kind == "anthropic":
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        prov = make_provider(f"anthropic:{model}", base_url=url, backoff_s=0.01)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        prov = make_provider(f"openai:{model}", base_url=url + "/v1", backoff_s=0.01)
    return LLMAgent(prov, model)


MODELS = {"anthropic": "claude-sonnet-test", "openai": "gpt-4o"}


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_llm_proposals_apply_and_pass_checks(kind, monkeypatch, tmp_path):
    with LLMServer([recorded(f"{kind}_ok.json")]) as srv:
        a = agent(kind, srv.url, monkeypatch, MODELS[kind])
        cands, notes = a.propose(ctx())
    req = srv.requests[0]
    assert req["path"] == ("/v1/messages" if kind == "anthropic" else "/v1/chat/completions")
    body = req["body"]
    tools = body["tools"]
    assert (tools[0].get("name") or tools[0]["function"]["name"]) == "propose_candidates"
    assert "Deployment t on cpu" in json.dumps(body)
    assert len(cands) == 2 and cands[0].knobs == {"drafter": "ngram", "k": 3}
    assert cands[0].agent == f"llm:{kind}" and cands[0].parents == ("stock",)
    _knobs, overlay = materialize(cands[1], Knobs(drafter="ngram"), {})
    assert list(overlay) == ["specpilot/runtime/drafters/ngram.py"]
    assert '# tuned' in overlay["specpilot/runtime/drafters/ngram.py"]
    assert check_overlay(overlay) == []
    note = notes[0]
    assert note["input_tokens"] > 0 and note["dollars"] > 0 and note["error"] == ""
    # the trace records prompt and response, never the key
    tr = Trace(tmp_path / "run")
    tr.append("proposal", None, (), **note, headers=req["headers"])
    text = (tmp_path / "run" / "trace.jsonl").read_text()
    rec = json.loads(text)
    assert rec["prompt"] == note["prompt"] and "Deployment t on cpu" in rec["prompt"]
    assert rec["response"] == note["response"] and "ngram" in rec["response"]
    assert SECRET not in text


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_malformed_answer_is_rejected_cleanly(kind, monkeypatch):
    with LLMServer([recorded(f"{kind}_malformed.json")]) as srv:
        cands, notes = agent(kind, srv.url, monkeypatch, MODELS[kind]).propose(ctx())
    assert cands == []
    assert "malformed" in notes[0]["error"] or "not valid JSON" in notes[0]["error"]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_patch_that_does_not_apply_is_rejected(kind, monkeypatch):
    with LLMServer([recorded(f"{kind}_bad_patch.json")]) as srv:
        cands, _ = agent(kind, srv.url, monkeypatch, MODELS[kind]).propose(ctx())
    assert len(cands) == 1
    with pytest.raises(PatchError, match="not found"):
        materialize(cands[0], Knobs(), {})


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_retries_with_backoff_then_succeeds(kind, monkeypatch):
    with LLMServer([500, 429, recorded(f"{kind}_ok.json")]) as srv:
        cands, notes = agent(kind, srv.url, monkeypatch, MODELS[kind]).propose(ctx())
    assert len(srv.requests) == 3 and notes[0]["attempts"] == 3 and len(cands) == 2


def test_gives_up_after_retries_without_crashing(monkeypatch):
    with LLMServer([503] * 10) as srv:
        cands, notes = agent("openai", srv.url, monkeypatch, "gpt-4o").propose(ctx())
    assert cands == [] and "InternalServerError" in notes[0]["error"]
    assert len(srv.requests) == 4  # 1 + 3 retries


def test_budget_stops_the_agent(monkeypatch):
    with LLMServer([recorded("anthropic_ok.json")] * 3) as srv:
        a = agent("anthropic", srv.url, monkeypatch, "claude-sonnet-test")
        a.budget = Budget(max_tokens=1000)
        first, _ = a.propose(ctx())
        second, notes = a.propose(ctx())
    assert first and second == [] and notes[0]["note"] == "budget spent"
    assert len(srv.requests) == 1


def test_provider_needs_a_key(monkeypatch):
    from specpilot.runtime.errors import SpecPilotError

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(SpecPilotError, match="ANTHROPIC_API_KEY"):
        make_provider("anthropic:claude-sonnet-test")
    with pytest.raises(SpecPilotError, match="unknown provider"):
        make_provider("mistral:large")
