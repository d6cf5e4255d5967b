"""LLM providers: one small module per API, each turning a prompt into a tool-call reply.

A provider has `complete(system, user, tool) -> LLMReply`, where `tool` is
{"name", "description", "schema"} and the reply carries the tool's parsed arguments.
`with_retries` retries transient failures (connection errors, 408/409/429/5xx) with
exponential backoff; anything else is returned as an error reply, never raised.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class LLMReply:
    payload: dict | None  # the tool's arguments, None when the answer was unusable
    text: str  # the raw answer, for the trace
    input_tokens: int = 0
    output_tokens: int = 0
    error: str = ""
    attempts: int = 1


def retryable(exc: Exception) -> bool:
    status = getattr(exc, "status_code", None)
    if status is not None:
        return status in (408, 409, 429) or status >= 500
    return type(exc).__name__ in ("APIConnectionError", "APITimeoutError")


def with_retries(call, retries: int = 3, backoff_s: float = 1.0) -> tuple[object, int]:
    """(result of call(), attempts); re-raises the last error when retries run out."""
    for attempt in range(retries + 1):
        try:
            return call(), attempt + 1
        except Exception as e:
            if attempt >= retries or not retryable(e):
                raise
            time.sleep(backoff_s * (2 ** attempt))
    raise AssertionError("unreachable")


def make_provider(spec: str, base_url: str | None = None, retries: int = 3,
                  backoff_s: float = 1.0):
    """`anthropic:MODEL` or `openai:MODEL`; keys come from the SDKs' environment variables."""
    from ...runtime.errors import SpecPilotError

    kind, _, model = spec.partition(":")
    if not model:
        raise SpecPilotError(f"--llm {spec!r}: use anthropic:MODEL or openai:MODEL")
    if kind == "anthropic":
        from .anthropic_provider import AnthropicProvider

        return AnthropicProvider(model, base_url=base_url, retries=retries, backoff_s=backoff_s)
    if kind == "openai":
        from .openai_provider import OpenAIProvider

        return OpenAIProvider(model, base_url=base_url, retries=retries, backoff_s=backoff_s)
    raise SpecPilotError(f"--llm {spec!r}: unknown provider {kind!r} (anthropic or openai)")
