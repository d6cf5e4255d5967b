"""OpenAI Chat Completions (and compatible local servers) through the `openai` SDK.

The answer is a forced function call; a server that ignores tools and answers with a JSON
object in the message text is accepted too.
"""

from __future__ import annotations

import json
import os

from . import LLMReply, with_retries


class OpenAIProvider:
    name = "openai"

    def __init__(self, model: str, base_url: str | None = None, retries: int = 3,
                 backoff_s: float = 1.0, max_tokens: int = 4096, api_key: str | None = None):
        import openai

        from ...runtime.errors import SpecPilotError

        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key or os.environ.get("OPENAI_API_KEY") or ("local" if base_url else None)
        if not key:
            raise SpecPilotError("--llm openai:... needs OPENAI_API_KEY (or a base_url of a "
                                 "local OpenAI-compatible server)")
        self.client = openai.OpenAI(api_key=key, base_url=base_url, max_retries=0)
        self.model, self.retries, self.backoff_s = model, retries, backoff_s
        self.max_tokens = max_tokens

    def complete(self, system: str, user: str, tool: dict) -> LLMReply:
        def call():
            return self.client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens,
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": user}],
                tools=[{"type": "function", "function": {
                    "name": tool["name"], "description": tool["description"],
                    "parameters": tool["schema"]}}],
                tool_choice={"type": "function", "function": {"name": tool["name"]}},
            )

        try:
            resp, attempts = with_retries(call, self.retries, self.backoff_s)
        except Exception as e:  # noqa: BLE001 - an API failure is a reply, not a crash
            return LLMReply(None, "", error=f"{type(e).__name__}: {str(e)[:300]}",
                            attempts=self.retries + 1)
        usage = getattr(resp, "usage", None)
        reply = LLMReply(None, "", getattr(usage, "prompt_tokens", 0) or 0,
                         getattr(usage, "completion_tokens", 0) or 0, attempts=attempts)
        if not resp.choices:
            reply.error = "the answer has no choices"
            return reply
        msg = resp.choices[0].message
        raw = ""
        for tc in msg.tool_calls or []:
            if tc.function.name == tool["name"]:
                raw = tc.function.arguments or ""
                break
        if not raw:
            raw = (msg.content or "").strip()
            if raw.startswith("```"):
                raw = raw.strip("`").removeprefix("json").strip()
        reply.text = raw
        try:
            payload = json.loads(raw)
        except json.JSONDecodeError as e:
            reply.error = f"the answer is not valid JSON ({e.msg} at char {e.pos})"
            return reply
        if not isinstance(payload, dict):
            reply.error = "the answer is JSON but not an object"
            return reply
        reply.payload = payload
        return reply
