"""The native HTTP server: SGLang's `/generate` and OpenAI's `/v1` in front of one Engine.

Requests are validated on the event loop, then queued; ONE worker thread owns the engine
and serves the queue a batch at a time (the waiting requests that share max_new_tokens and
ignore_eos, up to max_batch, in one Engine.generate). `start_server` runs the whole thing
in-process on a free port for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Self

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from . import protocol as P
from .errors import RequestError, SpecPilotError
from .generate import Engine
from .tokenizer import Tokenizer


@dataclass(eq=False)
class Job:
    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = False
    stops: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()
    logprob_start: int | None = None  # None: no logprobs
    top_logprobs: int = 0
    logprob_text: bool = False
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple[int, bool]:
        return (self.max_new_tokens, self.ignore_eos)


@torch.inference_mode()
def teacher_forced_logprobs(engine: Engine, ids: list[int]) -> torch.Tensor:
    """log_softmax (fp32, on CPU) of the target's logits over `ids` in one cache-free pass."""
    dev = engine.target.device
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    pos = torch.arange(len(ids), device=dev)[None]
    logits, _ = engine.target(x, pos, use_cache=False)
    return torch.log_softmax(logits[0].float(), dim=-1).cpu()


class BatchWorker:
    """The one thread that touches the engine."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, max_batch: int = 8):
        if max_batch < 1:
            raise SpecPilotError(f"--max-batch must be >= 1, got {max_batch}")
        self.engine, self.tokenizer, self.max_batch = engine, tokenizer, max_batch
        self.batch_sizes: list[int] = []  # size of every batch run, for tests and stats
        self._jobs: deque[Job] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="specpilot-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._closed = True
            left, self._jobs = list(self._jobs), deque()
            self._cv.notify_all()
        for job in left:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(RequestError("the server is shutting down"))
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> Future:
        with self._cv:
            if self._closed:
                raise RequestError("the server is shutting down")
            self._jobs.append(job)
            self._cv.notify()
        return job.future

    def _take(self) -> list[Job]:
        with self._cv:
            while not self._jobs and not self._closed:
                self._cv.wait()
            if self._closed:
                return []
            key = self._jobs[0].key
            batch = [j for j in self._jobs if j.key == key][: self.max_batch]
            for j in batch:
                self._jobs.remove(j)
            return batch

    def _loop(self) -> None:
        while batch := self._take():
            live = [j for j in batch if j.future.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                results = self._serve(live)
            except Exception as e:  # noqa: BLE001 -- handed to each request; the worker lives
                for j in live:
                    j.future.set_exception(e)
                continue
            for j, r in zip(live, results, strict=True):
                j.future.set_result(r)

    def _serve(self, jobs: list[Job]) -> list[P.Result]:
        self.batch_sizes.append(len(jobs))
        decode = self.tokenizer.decode
        gens = self.engine.generate([j.prompt_ids for j in jobs], jobs[0].max_new_tokens,
                                    jobs[0].ignore_eos,
                                    [P.stop_rule(j.stop_ids, j.stops, decode) for j in jobs])
        results = []
        for j, g in zip(jobs, gens, strict=True):
            fin = P.finish(g.output_ids, g.finish_reason, j.stops, decode,
                           tuple(self.engine.eos_ids) + j.stop_ids)
            res = P.Result(g.prompt_ids, fin, g.metrics)
            if j.logprob_start is not None:
                lp = teacher_forced_logprobs(self.engine, g.prompt_ids + fin.output_ids)
                text_of = self._token_text if j.logprob_text else _no_text
                res.logprobs = P.logprob_arrays(lp, g.prompt_ids, fin.output_ids,
                                                j.logprob_start, j.top_logprobs, text_of)
            results.append(res)
        return results

    def _token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])


def _no_text(token: int) -> None:
    return None


def _sent(err: dict, body) -> tuple[str, object, str | None]:
    """Where a validation error is in the body as the client sent it (`a.b[0].c`: pydantic's
    union member names dropped), the value sent there, and the union member the error is
    about (None if none)."""
    where, cur, loc = "", body, err["loc"][1:]  # loc[0] is "body"
    for i, x in enumerate(loc):
        missing = err.get("type") == "missing" and i == len(loc) - 1
        if isinstance(cur, dict) and isinstance(x, str) and (x in cur or missing):
            where, cur = f"{where}.{x}" if where else x, cur.get(x)
        elif isinstance(cur, list) and isinstance(x, int) and x < len(cur):
            where, cur = f"{where}[{x}]", cur[x]
        else:
            return where, cur, str(x)
    return where, cur, None


def _validation_message(exc: RequestValidationError, content_type: str) -> str:
    """One line for a body pydantic refused: the field as sent, what it should be, the
    value sent."""
    errs = exc.errors()
    if not errs:
        return "invalid request body"
    e = errs[0]
    if e.get("type") == "json_invalid":
        return f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}"
    where, value, _ = _sent(e, exc.body)
    if not where:
        if not isinstance(exc.body, dict | list | str | int | float | bool | None):
            return (f"the body must be JSON (got Content-Type {content_type or 'none'}): "
                    "send it with Content-Type: application/json")
        return f"the body must be a JSON object, got {_short(value)}"
    sent = [_sent(x, exc.body) for x in errs]
    here = [x for x, s in zip(errs, sent, strict=True) if s[0] == where]
    members = list(dict.fromkeys(s[2].replace("dict[any,any]", "object")
                                 for s in sent if s[0] == where and s[2]))
    if e.get("type") == "missing":
        what = " is required"
    elif len(here) > 1 and len(members) > 1:
        what = f": expected {' or '.join(members)}, got {_short(value)}"
    else:
        what = f": {e.get('msg', 'invalid value')}, got {_short(value)}"
    others = len({s[0] for s in sent} - {where})
    more = f" (and {others} more field(s) wrong)" if others else ""
    return f"{where}{what}{more}"


def _short(value: object) -> str:
    s = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


def create_app(engine: Engine, tokenizer: Tokenizer, *, model_path: str = "",
               max_batch: int = 8, default_max_tokens: int = 128) -> FastAPI:
    """The FastAPI app; its lifespan starts and stops the engine's worker thread."""
    worker = BatchWorker(engine, tokenizer, max_batch)
    model_name = model_path or "specpilot"
    context = engine.target.cfg.max_position_embeddings
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="SpecPilot native server", lifespan=lifespan)
    app.state.worker = worker
    app.state.model_path = model_path

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        msg = _validation_message(exc, request.headers.get("content-type", ""))
        return JSONResponse(P.error_body(msg), status_code=400)

    @app.exception_handler(SpecPilotError)
    async def _bad_request(request: Request, exc: SpecPilotError) -> JSONResponse:
        return JSONResponse(P.error_body(str(exc)), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(P.error_body(str(exc.detail), kind, exc.status_code),
                            status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        msg = f"internal error: {type(exc).__name__}: {exc}"
        return JSONResponse(P.error_body(msg, "server_error", 500), status_code=500)

    def job(ids: list[int], max_new: int, ignore_eos: bool, stops: tuple[str, ...],
            stop_ids: list[int] | None, label: str, name: str, **logprob) -> Job:
        P.check_prompt(engine, ids, max_new, label, name)
        stop_ids = () if ignore_eos else tuple(stop_ids or ())  # SGLang's rule
        return Job(list(ids), max_new, ignore_eos, stops, stop_ids, **logprob)

    async def run(jobs: list[Job]) -> list[P.Result]:
        futures = [asyncio.wrap_future(worker.submit(j)) for j in jobs]
        return list(await asyncio.gather(*futures))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/get_model_info")
    async def model_info() -> dict:
        return {
            "model_path": model_path, "tokenizer_path": model_path, "is_generation": True,
            "preferred_sampling_params": None, "vocab_size": engine.target.cfg.vocab_size,
            "context_length": context, "drafter": getattr(engine.drafter, "name", None),
            "k": engine.k, "max_batch": max_batch,
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created,
            "owned_by": "specpilot", "root": model_name, "max_model_len": context}]}

    @app.post("/generate")
    async def generate(req: P.GenerateRequest):
        if req.stream:
            raise RequestError("stream is not supported on /generate: use /v1/completions")
        sp = req.sampling_params
        sp.refuse_unsupported("sampling_params.")
        P.check_greedy(sp.temperature)
        vocab = engine.target.cfg.vocab_size
        if not 0 <= req.top_logprobs_num <= vocab:
            raise RequestError(f"top_logprobs_num must be in [0, {vocab}], got "
                               f"{req.top_logprobs_num}")
        prompts, batched = P.generate_prompts(req, tokenizer)
        stops = P.stop_list(sp.stop)
        jobs = []
        for i, ids in enumerate(prompts):
            lp = {}
            if req.return_logprob:
                lp = {"logprob_start": P.logprob_start(req.logprob_start_len, len(ids)),
                      "top_logprobs": req.top_logprobs_num,
                      "logprob_text": req.return_text_in_logprobs}
            label = f"prompt {i}" if batched else ""
            jobs.append(job(ids, sp.max_new_tokens, sp.ignore_eos, stops, sp.stop_token_ids,
                            label, "sampling_params.max_new_tokens", **lp))
        out = [P.sglang_response(r) for r in await run(jobs)]
        return out if batched else out[0]

    @app.post("/v1/completions")
    async def completions(req: P.CompletionRequest):
        req.refuse_unsupported()
        P.check_greedy(req.temperature, req.n)
        prompts = P.completion_prompts(req.prompt, tokenizer)
        max_new = req.max_tokens if req.max_tokens is not None else 16
        stops = P.stop_list(req.stop)
        label = len(prompts) > 1
        jobs = [job(ids, max_new, req.ignore_eos, stops, req.stop_token_ids,
                    f"prompt {i}" if label else "", "max_tokens")
                for i, ids in enumerate(prompts)]
        cid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            return _sse(run(jobs), lambda rs: P.completion_chunks(cid, model_name, rs, tokenizer))
        results = await run(jobs)
        return {
            "id": cid, "object": "text_completion", "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": i, "text": r.finished.text, "logprobs": None,
                         "finish_reason": r.finished.openai_reason}
                        for i, r in enumerate(results)],
            "usage": P.usage(results),
        }

    @app.post("/v1/chat/completions")
    async def chat(req: P.ChatRequest):
        req.refuse_unsupported()
        P.check_greedy(req.temperature, req.n)
        if not req.messages:
            raise RequestError("messages is empty: send at least one message")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            rendered = tokenizer.apply_chat_template(messages)
        except Exception as e:  # noqa: BLE001 -- a template may raise anything on odd input
            raise RequestError(f"the chat template rejected these messages: "
                               f"{type(e).__name__}: {e}") from None
        ids = tokenizer.encode(rendered)
        if req.max_completion_tokens is not None:
            name, max_new = "max_completion_tokens", req.max_completion_tokens
        else:
            name = "max_tokens"
            max_new = req.max_tokens if req.max_tokens is not None else default_max_tokens
        jobs = [job(ids, max_new, req.ignore_eos, P.stop_list(req.stop), req.stop_token_ids,
                    "", name)]
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return _sse(run(jobs), lambda rs: P.chat_chunks(cid, model_name, rs[0], tokenizer))
        (r,) = await run(jobs)
        return {
            "id": cid, "object": "chat.completion", "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "finish_reason": r.finished.openai_reason,
                         "message": {"role": "assistant", "content": r.finished.text},
                         "logprobs": None}],
            "usage": P.usage([r]),
        }

    return app


def _sse(pending: Awaitable[list[P.Result]],
         chunks: Callable[[list[P.Result]], Iterator[dict]]) -> StreamingResponse:
    """Server-sent events: the chunks of the results once they are ready, then [DONE]."""

    async def body():
        try:
            for c in chunks(await pending):
                yield f"data: {json.dumps(c)}\n\n"
        except Exception as e:  # noqa: BLE001 -- the status line is sent: report in-band
            kind = "invalid_request_error" if isinstance(e, SpecPilotError) else "server_error"
            yield f"data: {json.dumps(P.error_body(str(e), kind))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


@dataclass
class ServerHandle:
    """A server running in a background thread; `stop()` shuts it down."""

    url: str
    host: str
    port: int
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def worker(self) -> BatchWorker:
        return self.app.state.worker

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise SpecPilotError(f"--port must be in 1..65535 (or 0 for any free port), got {port}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), or a one-line error if it is taken."""
    check_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # clients queue from now on, even before uvicorn accepts
    except OSError as e:
        sock.close()
        raise SpecPilotError(f"cannot listen on {host}:{port} ({e.strerror}): pick another "
                             "--port or --host") from None
    return sock


def start_server(engine: Engine, tokenizer: Tokenizer, port: int = 0, host: str = "127.0.0.1",
                 *, max_batch: int = 8, model_path: str = "", log_level: str = "warning",
                 timeout: float = 30.0) -> ServerHandle:
    """Serve `engine` from a background thread; returns once it accepts connections."""
    app = create_app(engine, tokenizer, model_path=model_path, max_batch=max_batch)
    sock = bind(host, port)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=f"specpilot-http-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise SpecPilotError(f"the server on {host}:{port} did not start")
        time.sleep(0.02)
    shown = f"[{host}]" if ":" in host else host
    return ServerHandle(f"http://{shown}:{port}", host, port, app, server, thread)


def serve_forever(engine: Engine, tokenizer: Tokenizer, host: str, port: int, *,
                  max_batch: int = 8, model_path: str = "", default_max_tokens: int = 128) -> None:
    """Serve in the foreground until interrupted (the `specpilot serve` command)."""
    app = create_app(engine, tokenizer, model_path=model_path, max_batch=max_batch,
                     default_max_tokens=default_max_tokens)
    sock = bind(host, port)
    print(f"specpilot: serving {model_path} on http://{host}:{sock.getsockname()[1]}",
          flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="info", lifespan="on")).run(sockets=[sock])
