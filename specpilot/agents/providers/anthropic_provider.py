"""Anthropic Messages API through the `anthropic` SDK: the answer is a forced tool call."""

from __future__ import annotations

import json
import os

from . import LLMReply, with_retries


class AnthropicProvider:
    name = "anthropic"

    def __init__(self, model: str, base_url: str | None = None, retries: int = 3,
                 backoff_s: float = 1.0, max_tokens: int = 4096, api_key: str | None = None):
        import anthropic

        from ...runtime.errors import SpecPilotError

        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise SpecPilotError("--llm anthropic:... needs ANTHROPIC_API_KEY in the environment")
        base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL")
        self.client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0)
        self.model, self.retries, self.backoff_s = model, retries, backoff_s
        self.max_tokens = max_tokens

    def complete(self, system: str, user: str, tool: dict) -> LLMReply:
        def call():
            return self.client.messages.create(
                model=self.model, max_tokens=self.max_tokens, system=system,
                messages=[{"role": "user", "content": user}],
                tools=[{"name": tool["name"], "description": tool["description"],
                        "input_schema": tool["schema"]}],
                tool_choice={"type": "tool", "name": tool["name"]},
            )

        try:
            msg, attempts = with_retries(call, self.retries, self.backoff_s)
        except Exception as e:  # noqa: BLE001 - an API failure is a reply, not a crash
            return LLMReply(None, "", error=f"{type(e).__name__}: {str(e)[:300]}",
                            attempts=self.retries + 1)
        usage = getattr(msg, "usage", None)
        reply = LLMReply(None, "", getattr(usage, "input_tokens", 0) or 0,
                         getattr(usage, "output_tokens", 0) or 0, attempts=attempts)
        texts = []
        for block in msg.content:
            if block.type == "tool_use" and block.name == tool["name"]:
                reply.payload = block.input if isinstance(block.input, dict) else None
                texts.append(json.dumps(block.input, default=str))
            elif block.type == "text":
                texts.append(block.text)
        reply.text = "\n".join(texts)
        if reply.payload is None:
            reply.error = "the answer has no usable tool call"
        return reply
