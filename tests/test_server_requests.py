"""What the native server does with a request's fields, over real HTTP (and the real
`openai` client): stop ids and stop strings end decoding as soon as they match (also in a
shared batch) and the metrics count only the returned tokens; fields that would change the
output and are not implemented are refused; a bad field gets one line that names it."""

from __future__ import annotations

import threading

import httpx
import pytest

from specpilot.runtime.factory import build_engine
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.server import start_server

PROMPTS = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45, 46], [100, 17, 3], [7, 7, 7, 7, 7, 9]]


@pytest.fixture(scope="module")
def reference(qwen3_dir):
    """A plain greedy AR engine, separate from the server's engine."""
    return build_engine(qwen3_dir, Knobs())


def greedy(reference, prompt: list[int], n: int, ignore_eos: bool = True) -> list[int]:
    return reference[0].generate([prompt], n, ignore_eos)[0].output_ids


@pytest.fixture(scope="module")
def server(qwen3_dir, qwen3_draft_dir):
    engine, tok = build_engine(qwen3_dir, Knobs(drafter=f"draft:{qwen3_draft_dir}", k=3))
    handle = start_server(engine, tok, port=0, max_batch=8, model_path=str(qwen3_dir))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def post(http, path: str, body) -> dict:
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def check_meta(out: dict) -> None:
    """The metrics describe the returned tokens: the first from prefill, the rest committed
    by spec_verify_ct verify steps, a step in histogram bin n having accepted n drafts (only
    the last may run past the end)."""
    m, n = out["meta_info"], len(out["output_ids"])
    h = m["spec_accept_histogram"]
    assert m["completion_tokens"] == n
    assert sum(h) == m["spec_verify_ct"] <= n - 1
    assert 0 <= sum((i + 1) * c for i, c in enumerate(h)) - (n - 1) < len(h)
    if m["spec_verify_ct"]:
        assert m["spec_accept_length"] == pytest.approx((n - 1) / m["spec_verify_ct"])


@pytest.fixture(scope="module")
def stop_case(reference) -> tuple[list[int], list[int], int]:
    """A prompt, its greedy output (EOS honoured) and a token it produces a few tokens in,
    before any EOS."""
    eos = set(reference[0].eos_ids)
    for p in PROMPTS:
        ref = greedy(reference, p, 40, ignore_eos=False)
        for i in range(3, len(ref) - 1):
            if ref[i] not in eos and ref.index(ref[i]) == i:
                return p, ref, ref[i]
    raise AssertionError("no prompt has a usable stop token")


@pytest.fixture(scope="module")
def stop_string(reference) -> tuple[str, list[int], str]:
    """A text prompt, its greedy output over 300 tokens and a 2-character piece of that
    output's text that first appears a few tokens in."""
    tok = reference[1]
    text = "def add(a, b):\n"
    ref = greedy(reference, tok.encode(text), 300)
    full = tok.decode(ref)
    start = len(tok.decode(ref[:4]))
    stop = next(full[i:i + 2] for i in range(start, len(full) - 1)
                if "\ufffd" not in full[i:i + 2] and full.find(full[i:i + 2]) == i)
    return text, ref, stop


def test_stop_token_ids_end_the_output(http, reference, stop_case):
    p, ref, stop_id = stop_case
    at = ref.index(stop_id) + 1
    out = post(http, "/generate", {"input_ids": p, "sampling_params": {
        "max_new_tokens": 40, "stop_token_ids": [stop_id, 12345],
        "top_p": 0.9, "top_k": 5, "seed": 1, "min_new_tokens": 0}})  # harmless: ignored
    assert out["output_ids"] == ref[:at]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["text"] == reference[1].decode(ref[: at - 1])  # the stop token is not shown
    check_meta(out)
    # SGLang's rule: ignore_eos turns stop_token_ids off too
    out = post(http, "/generate", {"input_ids": p, "sampling_params": {
        "max_new_tokens": 40, "stop_token_ids": [stop_id], "ignore_eos": True}})
    assert out["output_ids"] == greedy(reference, p, 40)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 40}


def test_stop_ends_decoding_early(server, http, reference, stop_string, monkeypatch):
    """A stop string 300 tokens before max_new_tokens: the engine stops at the step that
    completes it, and the metrics count the returned tokens only."""
    text, ref, stop = stop_string
    engine = server.worker.engine
    steps = []
    step = engine._step
    monkeypatch.setattr(engine, "_step", lambda *a: (steps.append(1), step(*a))[1])
    out = post(http, "/generate", {"text": text, "sampling_params": {
        "max_new_tokens": 300, "ignore_eos": True, "stop": [stop]}})
    got = out["output_ids"]
    assert got == ref[: len(got)] and len(got) < 20
    assert stop in reference[1].decode(got) and stop not in reference[1].decode(got[:-1])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    check_meta(out)
    assert len(steps) == out["meta_info"]["spec_verify_ct"]


def test_stops_in_a_shared_batch(server, reference, stop_case, stop_string):
    """Requests with and without stops decode in one batch; each ends where it would alone."""
    p, ref, stop_id = stop_case
    text, _, stop = stop_string
    plain = [{"input_ids": q, "sampling_params": {"max_new_tokens": 30}} for q in PROMPTS]
    by_id = {"input_ids": p, "sampling_params": {"max_new_tokens": 30,
                                                 "stop_token_ids": [stop_id]}}
    by_text = {"text": text, "sampling_params": {"max_new_tokens": 30, "stop": [stop]}}
    bodies = [*plain, by_id, by_text, by_id, by_text]
    with httpx.Client(base_url=server.url, timeout=120) as c:
        alone = [post(c, "/generate", b) for b in bodies]
    before = len(server.worker.batch_sizes)
    results: list = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def one(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            barrier.wait()
            results[i] = c.post("/generate", json=bodies[i]).json()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(server.worker.batch_sizes[before:]) > 1  # they really shared batches
    for r, a in zip(results, alone, strict=True):
        assert r["output_ids"] == a["output_ids"] and r["text"] == a["text"]
        assert r["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        check_meta(r)
    for r, q in zip(results, PROMPTS):
        assert r["output_ids"] == greedy(reference, q, 30, ignore_eos=False)
    assert results[4]["output_ids"] == ref[: ref.index(stop_id) + 1]
    assert results[5]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_openai_stop_token_ids_and_stop(client, server, reference, stop_case, stop_string):
    p, ref, stop_id = stop_case
    name = server.app.state.model_path
    c = client.completions.create(model=name, prompt=p, max_tokens=40,
                                  extra_body={"stop_token_ids": [stop_id]})
    at = ref.index(stop_id) + 1
    assert c.choices[0].finish_reason == "stop" and c.usage.completion_tokens == at
    assert c.choices[0].text == reference[1].decode(ref[: at - 1])
    text, sref, stop = stop_string
    c = client.completions.create(model=name, prompt=text, max_tokens=300, stop=[stop],
                                  extra_body={"ignore_eos": True})
    full = reference[1].decode(sref)
    assert c.choices[0].finish_reason == "stop"
    assert c.choices[0].text == full[: full.find(stop)]


REFUSED = [
    ("/generate", {"sampling_params": {"min_new_tokens": 4}}, "sampling_params.min_new_tokens"),
    ("/generate", {"sampling_params": {"repetition_penalty": 1.2}},
     "sampling_params.repetition_penalty"),
    ("/generate", {"sampling_params": {"frequency_penalty": 0.5}},
     "sampling_params.frequency_penalty"),
    ("/generate", {"sampling_params": {"presence_penalty": -1}},
     "sampling_params.presence_penalty"),
    ("/generate", {"sampling_params": {"regex": "[a-z]+"}}, "sampling_params.regex"),
    ("/generate", {"sampling_params": {"json_schema": "{}"}}, "sampling_params.json_schema"),
    ("/generate", {"sampling_params": {"ebnf": "root ::= 'a'"}}, "sampling_params.ebnf"),
    ("/v1/completions", {"logit_bias": {"5": 100}}, "logit_bias"),
    ("/v1/completions", {"frequency_penalty": 0.3}, "frequency_penalty"),
    ("/v1/completions", {"presence_penalty": 0.3}, "presence_penalty"),
    ("/v1/completions", {"logprobs": 2}, "logprobs"),
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/chat/completions", {"logit_bias": {"5": -100}}, "logit_bias"),
    ("/v1/chat/completions", {"presence_penalty": 1.0}, "presence_penalty"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
]
BASE = {"/generate": {"input_ids": [5, 6, 7]},
        "/v1/completions": {"prompt": "def f(", "max_tokens": 4},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 4}}


@pytest.mark.parametrize("path,extra,field", REFUSED, ids=[f[2] for f in REFUSED])
def test_unimplemented_fields_are_refused(http, path, extra, field):
    body = {**BASE[path], **extra}
    if "sampling_params" in extra:
        body["sampling_params"] = {"max_new_tokens": 4, **extra["sampling_params"]}
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert msg.startswith(f"{field}=") and "not supported" in msg and "\n" not in msg


def test_harmless_fields_are_ignored_and_the_client_sees_refusals(client, server, reference):
    import openai

    name, tok = server.app.state.model_path, reference[1]
    want = tok.decode(greedy(reference, tok.encode("def f("), 6))
    c = client.completions.create(model=name, prompt="def f(", max_tokens=6, top_p=0.5,
                                  seed=3, user="u", frequency_penalty=0, presence_penalty=0,
                                  logit_bias={}, best_of=1, echo=False,
                                  extra_body={"top_k": 5, "ignore_eos": True})
    assert c.choices[0].text == want
    with pytest.raises(openai.BadRequestError, match=r"logprobs=1 is not supported"):
        client.completions.create(model=name, prompt="def f(", max_tokens=6, logprobs=1)
    with pytest.raises(openai.BadRequestError, match=r"frequency_penalty=0.5 is not supported"):
        client.chat.completions.create(model=name, max_tokens=4, frequency_penalty=0.5,
                                       messages=[{"role": "user", "content": "hi"}])


MESSAGES = [
    ("/generate", {"text": 5}, "text: expected str or list[str], got 5"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "ten"}},
     'sampling_params.max_new_tokens: Input should be a valid integer, got "ten"'),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}},
     "sampling_params.max_new_tokens must be at least 1, got 0"),
    ("/generate", {"input_ids": [5] * 400, "sampling_params": {"max_new_tokens": 200}},
     ("the prompt has 400 tokens and sampling_params.max_new_tokens=200: that needs 400 + 200 "
      "= 600 positions but the model's context is 512: ask for at most 112 new tokens or "
      "shorten the prompt")),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens must be at least 1, got 0"),
    ("/v1/completions", {"model": "m"}, "prompt is required"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 0},
     "max_completion_tokens must be at least 1, got 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages[0].content: expected str or list[object], got 5"),
]


@pytest.mark.parametrize("path,body,message", MESSAGES, ids=[m[2][:30] for m in MESSAGES])
def test_a_bad_field_is_named_as_sent(http, path, body, message):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_says_so(http, content_type):
    r = http.post("/generate", content='{"text": "a"}', headers={"content-type": content_type})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == (
        f"the body must be JSON (got Content-Type {content_type}): send it with "
        "Content-Type: application/json")


def test_context_edge_is_served_and_greedy(http, reference):
    """3 + 509 = 512 positions, the whole context, with k = 3 drafts verified past it."""
    out = post(http, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 509, "ignore_eos": True}})
    assert out["output_ids"] == greedy(reference, [5, 6, 7], 509)
    check_meta(out)
