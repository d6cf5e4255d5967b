"""The wire formats the native server speaks: SGLang's `/generate` and OpenAI's `/v1`.

Request bodies are pydantic models (unknown fields are ignored, wrong types rejected, and
the few fields that would change the output that SpecPilot does not implement refused), and
the pure functions here make a request's stop rule (stop ids and strings, which the engine
applies as it decodes) and turn an engine result into responses: finish reasons, SGLang's
`meta_info` with the logprob arrays used for teacher forcing, and OpenAI's completion
objects and stream chunks.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from .errors import RequestError

if TYPE_CHECKING:
    from .generate import Engine, RequestMetrics, Stop
    from .tokenizer import Tokenizer

Ids = list[StrictInt]
_PENALTIES = {"frequency_penalty": (0,), "presence_penalty": (0,)}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # kept aside (`model_extra`) and ignored, but:
    #: fields that would change the output (or ask for what is not returned) and that
    #: SpecPilot does not implement, with the values that mean "off" (and null): any other
    #: value is refused rather than silently ignored
    refused: ClassVar[dict[str, tuple]] = {}

    def refuse_unsupported(self, where: str = "") -> None:
        for name, off in self.refused.items():
            v = (self.model_extra or {}).get(name)
            if v is not None and v not in off:
                shown = f" (or send {json.dumps(off[0])})" if off else ""
                raise RequestError(f"{where}{name}={json.dumps(v)} is not supported by this "
                                   f"server (plain greedy decoding): leave it out{shown}")


class SamplingParams(_Body):
    max_new_tokens: StrictInt = 128
    temperature: float | None = None
    ignore_eos: StrictBool = False  # as in SGLang, it turns stop_token_ids off too
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: Ids | None = None
    refused: ClassVar = {"min_new_tokens": (0,), "repetition_penalty": (1,), **_PENALTIES,
                         "regex": (), "json_schema": (), "ebnf": ()}


class GenerateRequest(_Body):
    """SGLang's `POST /generate` body (the fields SpecPilot honours)."""

    text: StrictStr | list[StrictStr] | None = None
    input_ids: Ids | list[Ids] | None = None
    sampling_params: SamplingParams = SamplingParams()
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt = -1
    top_logprobs_num: StrictInt = 0
    return_text_in_logprobs: StrictBool = False
    stream: StrictBool = False


class CompletionRequest(_Body):
    model: StrictStr | None = None
    prompt: StrictStr | list[StrictStr] | Ids | list[Ids]
    max_tokens: StrictInt | None = 16
    temperature: float | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    n: StrictInt = 1
    ignore_eos: StrictBool = False  # SGLang's extension, handy for benchmarks
    stop_token_ids: Ids | None = None  # SGLang's extension
    refused: ClassVar = {"logit_bias": ({},), **_PENALTIES, "logprobs": (), "echo": (False,),
                         "best_of": (1,)}


class ChatMessage(_Body):
    role: StrictStr
    content: StrictStr | list[dict] | None = None

    def text(self) -> str:
        """Plain text of the message; content parts other than text are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for p in self.content:
            if p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise RequestError("only text content parts are supported in chat messages")
            parts.append(p["text"])
        return "".join(parts)


class ChatRequest(_Body):
    model: StrictStr | None = None
    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: float | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    n: StrictInt = 1
    ignore_eos: StrictBool = False
    stop_token_ids: Ids | None = None
    refused: ClassVar = {"logit_bias": ({},), **_PENALTIES, "logprobs": (False,),
                         "top_logprobs": (0,)}


def check_prompt(engine: Engine, ids: list[int], max_new_tokens: int, label: str,
                 name: str = "max_new_tokens") -> None:
    """The engine's own request checks (empty, out of vocabulary, too long) for one prompt,
    so a bad prompt is refused alone instead of failing the batch it would join; `name`:
    the request's field for max_new_tokens."""
    try:
        engine._check([ids], max_new_tokens, name)
    except RequestError as e:
        msg = str(e).replace("prompt 0", "the prompt", 1)
        raise RequestError(f"{label}: {msg}" if label else msg) from None


def check_greedy(temperature: float | None, n: int = 1) -> None:
    if temperature is not None and temperature > 0:
        raise RequestError(
            f"temperature={temperature}: this server decodes greedy only; send temperature 0 "
            "or leave it out"
        )
    if temperature is not None and temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {temperature}")
    if n != 1:
        raise RequestError(f"n={n}: greedy decoding gives one choice per prompt; send n=1")


def stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in stops):
        raise RequestError("stop strings must be non-empty")
    return stops


def error_body(message: str, kind: str = "invalid_request_error", code: int = 400) -> dict:
    return {"error": {"message": message, "type": kind, "code": code}}


def stop_len(ids: list[int], stop_ids: frozenset[int], stops: tuple[str, ...],
             decode: Callable[[list[int]], str]) -> int | None:
    """Length of the shortest prefix of `ids` that ends on a stop id or whose text holds a
    stop string; None when neither occurs."""
    n = next((j + 1 for j, t in enumerate(ids) if t in stop_ids), None)
    head = ids if n is None else ids[:n]
    if not stops or not any(s in decode(head) for s in stops):
        return n
    lo, hi = 1, len(head)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(head[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo


def stop_rule(stop_ids: tuple[int, ...], stops: tuple[str, ...],
              decode: Callable[[list[int]], str]) -> Stop | None:
    """A request's own stop rule for `Engine.generate` (None without stop ids or strings):
    the output ends with the first stop id, or with the token that completes a stop string."""
    if not stop_ids and not stops:
        return None
    ids = frozenset(stop_ids)
    return lambda out: stop_len(out, ids, stops, decode)


@dataclass
class Finished:
    """What the client sees of one generation after EOS and stop handling."""

    output_ids: list[int]
    text: str
    finish_reason: dict  # SGLang: {"type": "stop", "matched": ...} | {"type": "length", ...}

    @property
    def openai_reason(self) -> str:
        return self.finish_reason["type"]


def finish(output_ids: list[int], engine_reason: str, stops: tuple[str, ...],
           decode: Callable[[list[int]], str], eos_ids: tuple[int, ...]) -> Finished:
    """Render an output the engine ended (with `stop_rule(stop ids, stops)` where there are
    any): text cut before the first stop string; a final EOS or stop id (in `eos_ids`) is
    not shown."""
    ids = list(output_ids)
    text = decode(ids)
    hits = [(text.find(s), s) for s in stops if s in text]
    if hits:
        at, matched = min(hits)
        return Finished(ids, text[:at], {"type": "stop", "matched": matched})
    if engine_reason in ("eos", "stop"):
        shown = ids[:-1] if ids and ids[-1] in eos_ids else ids
        return Finished(ids, decode(shown), {"type": "stop", "matched": ids[-1]})
    return Finished(ids, text, {"type": "length", "length": len(ids)})


def logprob_start(start: int, n_input: int) -> int:
    """SGLang's rule: -1 means only the last input token (so one null input entry)."""
    if start == -1:
        return n_input - 1
    if not 0 <= start < n_input:
        raise RequestError(
            f"logprob_start_len={start} must be -1 or in [0, {n_input}) for a prompt of "
            f"{n_input} tokens"
        )
    return start


def logprob_arrays(logprobs: torch.Tensor, prompt_ids: list[int], output_ids: list[int],
                   start: int, top_n: int, text_of: Callable[[int], str | None]) -> dict:
    """SGLang's four logprob arrays from one teacher-forced pass.

    `logprobs` is [len(prompt) + len(output), V] (log_softmax of the target's logits over
    prompt + output): row t is the distribution of the token at t + 1. Input entry 0 has a
    null logprob (and input_top_logprobs[0] is null); input entry k >= 1 scores
    prompt[start + k]; output entry i scores output[i].
    """
    seq = prompt_ids + output_ids
    P = len(prompt_ids)
    top_v, top_i = (torch.topk(logprobs, top_n, dim=-1) if top_n > 0 else (None, None))
    tv = top_v.tolist() if top_v is not None else None
    ti = top_i.tolist() if top_i is not None else None

    def entry(row: int) -> list:
        tok = seq[row + 1]
        return [float(logprobs[row, tok]), tok, text_of(tok)]

    def tops(row: int) -> list:
        if tv is None:
            return []
        return [[v, i, text_of(i)] for v, i in zip(tv[row], ti[row])]

    input_rows = range(start, P - 1)  # row r scores seq[r + 1], i.e. input entries 1..
    return {
        "input_token_logprobs": [[None, prompt_ids[start], text_of(prompt_ids[start])]]
        + [entry(r) for r in input_rows],
        "input_top_logprobs": [None] + [tops(r) for r in input_rows],
        "output_token_logprobs": [entry(P - 1 + i) for i in range(len(output_ids))],
        "output_top_logprobs": [tops(P - 1 + i) for i in range(len(output_ids))],
    }


def text_pieces(decode: Callable[[list[int]], str], ids: list[int], text: str) -> list[str]:
    """Split `text` (the shown text of `ids`) at token boundaries for streaming; bytes of a
    character split across tokens are held back until the character is whole."""
    cuts = [0]
    for n in range(1, len(ids) + 1):
        prefix = decode(ids[:n])
        if prefix.endswith("\ufffd"):
            continue
        cut = min(len(prefix), len(text))
        if cut > cuts[-1]:
            cuts.append(cut)
    if cuts[-1] < len(text):
        cuts.append(len(text))
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


@dataclass
class Result:
    """One served request: the engine's generation after stop handling, with logprobs."""

    prompt_ids: list[int]
    finished: Finished
    metrics: RequestMetrics
    logprobs: dict | None = None


def generate_prompts(req: GenerateRequest, tok: Tokenizer) -> tuple[list[list[int]], bool]:
    """The prompts of a /generate body as ids, and whether it was a batch (list answer)."""
    if (req.text is None) == (req.input_ids is None):
        raise RequestError("send exactly one of text or input_ids")
    if req.text is not None:
        if isinstance(req.text, str):
            return [tok.encode(req.text)], False
        prompts, batched = [tok.encode(t) for t in req.text], True
    elif req.input_ids and isinstance(req.input_ids[0], list):
        prompts, batched = req.input_ids, True
    else:
        return [req.input_ids], False
    if not prompts:
        raise RequestError("the batch is empty: send at least one prompt")
    return prompts, batched


def completion_prompts(prompt, tok: Tokenizer) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tok.encode(prompt)]
    if not prompt:
        raise RequestError("prompt is empty")
    if isinstance(prompt[0], str):
        return [tok.encode(p) for p in prompt]
    if isinstance(prompt[0], list):
        return prompt
    return [prompt]


def sglang_response(r: Result) -> dict:
    m, f = r.metrics, r.finished
    meta = {
        "id": uuid.uuid4().hex, "finish_reason": f.finish_reason,
        "prompt_tokens": len(r.prompt_ids), "completion_tokens": len(f.output_ids),
        "cached_tokens": 0, "spec_verify_ct": m.verify_steps,
        "spec_accept_length": m.accept_length,
        "spec_accept_histogram": m.accept_hist,
    }
    if r.logprobs is not None:
        meta.update(r.logprobs)
    return {"text": f.text, "output_ids": f.output_ids, "meta_info": meta}


def usage(results: list[Result]) -> dict:
    p = sum(len(r.prompt_ids) for r in results)
    c = sum(len(r.finished.output_ids) for r in results)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def completion_chunks(cid: str, model: str, results: list[Result],
                      tok: Tokenizer) -> Iterator[dict]:
    """OpenAI `text_completion` stream chunks: text pieces, a finish chunk, then usage."""
    base = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model}
    for i, r in enumerate(results):
        for piece in text_pieces(tok.decode, r.finished.output_ids, r.finished.text):
            yield {**base, "choices": [{"index": i, "text": piece, "logprobs": None,
                                        "finish_reason": None}]}
        yield {**base, "choices": [{"index": i, "text": "", "logprobs": None,
                                    "finish_reason": r.finished.openai_reason}]}
    yield {**base, "choices": [], "usage": usage(results)}


def chat_chunks(cid: str, model: str, r: Result, tok: Tokenizer) -> Iterator[dict]:
    """OpenAI `chat.completion.chunk`s: the role, content pieces, then the finish reason."""
    base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}

    def chunk(delta: dict, reason: str | None = None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": reason}]}

    yield chunk({"role": "assistant", "content": ""})
    for piece in text_pieces(tok.decode, r.finished.output_ids, r.finished.text):
        yield chunk({"content": piece})
    yield chunk({}, r.finished.openai_reason)
