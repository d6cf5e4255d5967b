"""The native server over real HTTP: SGLang /generate (outputs, logprobs, stop strings),
OpenAI /v1 with the real `openai` client, concurrent clients, and bad input -> 400."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import torch

from specpilot.runtime.factory import build_engine
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.server import start_server

PROMPTS = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45, 46], [100, 17, 3], [7, 7, 7, 7, 7, 9]]


@pytest.fixture(scope="module")
def reference(qwen3_dir):
    """A plain greedy AR engine, separate from the server's engine."""
    return build_engine(qwen3_dir, Knobs())


def greedy(reference, prompt, n, ignore_eos=False):
    engine, _ = reference
    return engine.generate([prompt], n, ignore_eos)[0]


@pytest.fixture(scope="module")
def server(qwen3_dir, qwen3_draft_dir):
    engine, tok = build_engine(qwen3_dir, Knobs(drafter=f"draft:{qwen3_draft_dir}", k=3))
    handle = start_server(engine, tok, port=0, max_batch=8, model_path=str(qwen3_dir))
    yield handle
    handle.stop()
    assert not handle.thread.is_alive()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def server_model_path(server) -> str:
    return server.app.state.model_path


def post(http, path, body):
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_equals_greedy_engine(http, reference):
    tok = reference[1]
    for p in PROMPTS:
        ref = greedy(reference, p, 12)
        out = post(http, "/generate", {"input_ids": p, "sampling_params": {"max_new_tokens": 12}})
        assert out["output_ids"] == ref.output_ids
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == len(p)
        assert meta["completion_tokens"] == len(ref.output_ids)
        assert meta["cached_tokens"] == 0
        want = "stop" if ref.finish_reason == "eos" else "length"
        assert meta["finish_reason"]["type"] == want
        assert meta["spec_verify_ct"] >= 1
        assert meta["spec_accept_length"] == pytest.approx(
            (len(ref.output_ids) - 1) / meta["spec_verify_ct"])
        shown = ref.output_ids[:-1] if ref.finish_reason == "eos" else ref.output_ids
        assert out["text"] == tok.decode(shown)
    # a batch (list of lists) answers a list in the same order
    outs = post(http, "/generate", {"input_ids": PROMPTS, "sampling_params": {
        "max_new_tokens": 9, "ignore_eos": True}})
    assert [o["output_ids"] for o in outs] == [
        greedy(reference, p, 9, ignore_eos=True).output_ids for p in PROMPTS]


def test_teacher_forced_top1_equals_greedy(http, reference, qwen3_dir):
    """The forcing recipe: prompt + output in, top-1 of each input position == output."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32)
    for p in PROMPTS[:3]:
        ref = greedy(reference, p, 11, ignore_eos=True).output_ids
        out, nxt = ref[:10], ref[10]
        body = {"input_ids": p + out, "return_logprob": True, "top_logprobs_num": 2,
                "logprob_start_len": len(p) - 1,
                "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}
        meta = post(http, "/generate", body)["meta_info"]
        tops, toks = meta["input_top_logprobs"], meta["input_token_logprobs"]
        assert len(tops) == len(toks) == len(out) + 1
        assert tops[0] is None and toks[0][0] is None and toks[0][1] == p[-1]
        for k in range(1, len(out) + 1):
            assert tops[k][0][1] == out[k - 1], f"position {k}"
            assert toks[k][1] == out[k - 1]
            assert toks[k][0] == pytest.approx(tops[k][0][0])
            assert tops[k][0][0] >= tops[k][1][0]
        assert meta["output_top_logprobs"][0][0][1] == nxt
        assert meta["output_token_logprobs"][0][1] == nxt
        # the values are the target's log-probabilities (transformers as the reference)
        with torch.no_grad():
            logits = hf(torch.tensor([p + out + [nxt]])).logits[0]
        lp = torch.log_softmax(logits.float(), -1)
        start = len(p) - 1
        for k in range(1, len(out) + 1):
            pos = start + k - 1
            assert toks[k][0] == pytest.approx(lp[pos, out[k - 1]].item(), abs=1e-4)
        assert meta["output_token_logprobs"][0][0] == pytest.approx(
            lp[len(p) + len(out) - 1, nxt].item(), abs=1e-4)


def test_logprob_defaults_and_text(http, reference):
    p = PROMPTS[0]
    body = {"input_ids": p, "return_logprob": True, "return_text_in_logprobs": True,
            "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    meta = post(http, "/generate", body)["meta_info"]
    tok = reference[1]
    # logprob_start_len -1: a single (null) input entry; no top logprobs asked
    assert meta["input_token_logprobs"] == [[None, p[-1], tok.decode([p[-1]])]]
    assert meta["input_top_logprobs"] == [None]
    assert [e[1] for e in meta["output_token_logprobs"]] == greedy(
        reference, p, 3, ignore_eos=True).output_ids
    assert all(e[2] == tok.decode([e[1]]) and e[0] <= 0 for e in meta["output_token_logprobs"])
    assert meta["output_top_logprobs"] == [[], [], []]


def test_text_prompt_and_stop_string(http, reference):
    tok = reference[1]
    text = "def add(a, b):\n"
    ids = tok.encode(text)
    ref = greedy(reference, ids, 16, ignore_eos=True).output_ids
    full = tok.decode(ref)
    out = post(http, "/generate", {"text": text, "sampling_params": {
        "max_new_tokens": 16, "ignore_eos": True}})
    assert out["output_ids"] == ref and out["text"] == full
    # stop on a piece of the text that starts a few tokens in
    start = len(tok.decode(ref[:4]))
    stop = next(full[i:i + 2] for i in range(start, len(full) - 1)
                if "\ufffd" not in full[i:i + 2] and full.find(full[i:i + 2]) == i)
    out = post(http, "/generate", {"text": text, "sampling_params": {
        "max_new_tokens": 16, "ignore_eos": True, "stop": [stop]}})
    got = out["output_ids"]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert got == ref[: len(got)] and len(got) < len(ref)
    assert stop in tok.decode(got) and stop not in tok.decode(got[:-1])
    assert out["text"] == full[: full.find(stop)]
    assert out["meta_info"]["completion_tokens"] == len(got)


def test_openai_client_completions_and_chat(server, reference):
    import openai

    tok = reference[1]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == [server_model_path(server)]
    name = models.data[0].id

    prompt = "class Point:\n"
    ref = greedy(reference, tok.encode(prompt), 10)
    shown = ref.output_ids[:-1] if ref.finish_reason == "eos" else ref.output_ids
    c = client.completions.create(model=name, prompt=prompt, max_tokens=10, temperature=0)
    assert c.choices[0].text == tok.decode(shown)
    assert c.choices[0].finish_reason == ("stop" if ref.finish_reason == "eos" else "length")
    assert c.usage.completion_tokens == len(ref.output_ids)
    streamed = client.completions.create(model=name, prompt=prompt, max_tokens=10, stream=True)
    chunks = list(streamed)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == \
        c.choices[0].finish_reason

    messages = [{"role": "user", "content": "add two numbers"}]
    ids = tok.encode(tok.apply_chat_template(messages))
    ref = greedy(reference, ids, 8, ignore_eos=True)
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=8,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == tok.decode(ref.output_ids)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model=name, messages=messages, max_tokens=8,
                                            stream=True, extra_body={"ignore_eos": True})
    parts = list(stream)
    assert "".join(p.choices[0].delta.content or "" for p in parts) == r.choices[0].message.content
    assert parts[-1].choices[0].finish_reason == "length"

    with pytest.raises(openai.BadRequestError, match="greedy only"):
        client.completions.create(model=name, prompt=prompt, max_tokens=4, temperature=0.8)


def test_concurrent_clients_match_sequential(server, http):
    jobs = [(p, n) for n in (6, 10) for p in PROMPTS]  # 8 clients, two max_new_tokens
    bodies = [{"input_ids": p, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
              for p, n in jobs]
    sequential = [post(http, "/generate", b)["output_ids"] for b in bodies]
    before = len(server.worker.batch_sizes)
    results: list = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def client(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            barrier.wait()
            results[i] = c.post("/generate", json=bodies[i]).json()["output_ids"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == sequential
    sizes = server.worker.batch_sizes[before:]
    assert sum(sizes) == len(bodies) and max(sizes) > 1  # they really shared batches


def test_model_info_and_health(http, server):
    info = http.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"] == server_model_path(server)
    assert info["k"] == 3 and info["drafter"] == "draft"
    assert http.get("/health").status_code == 200


TOO_LONG = list(range(1, 250)) * 2
BAD = [
    ("/generate", "{bad json"),
    ("/generate", {"input_ids": "not ids"}),
    ("/generate", {"input_ids": [1, "x", 3]}),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "ten"}}),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}}),
    ("/generate", {"input_ids": [1, 2, 100000]}),
    ("/generate", {"input_ids": [1, -3]}),
    ("/generate", {"input_ids": []}),
    ("/generate", {"text": ""}),
    ("/generate", {"input_ids": TOO_LONG}),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"temperature": 0.7}}),
    ("/generate", {"text": "hi", "input_ids": [1]}),
    ("/generate", {}),
    ("/generate", [1, 2, 3]),
    ("/generate", {"input_ids": [[1, 2], [3, 99999]]}),
    ("/generate", {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 5}),
    ("/generate", {"input_ids": [1, 2], "return_logprob": True, "top_logprobs_num": 10**6}),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"stop": [""]}}),
    ("/generate", {"input_ids": [1, 2], "stream": True}),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10**9}}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "temperature": 1.0}),
    ("/v1/completions", {"model": "m", "prompt": {"a": 1}}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "n": 3}),
    ("/v1/chat/completions", {"model": "m", "messages": []}),
    ("/v1/chat/completions", {"model": "m", "messages": "hello"}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": 5}]}),
]


@pytest.mark.parametrize("path,body", BAD, ids=[f"{i}:{b}"[:40] for i, (_, b) in enumerate(BAD)])
def test_bad_input_is_400_and_server_keeps_serving(http, path, body):
    if isinstance(body, str):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert "\n" not in err["message"]
    assert http.get("/health").status_code == 200
    ok = post(http, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
    assert len(ok["output_ids"]) >= 1


def test_serve_command(qwen3_dir, qwen3_draft_dir):
    """`specpilot serve` as a real process: it answers, a taken port is a one-line exit 2,
    and Ctrl-C stops it cleanly."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    root = Path(__file__).resolve().parents[1]
    args = [sys.executable, "-m", "specpilot", "serve", "--model", str(qwen3_dir),
            "--drafter", "ngram", "--max-batch", "4"]
    proc = subprocess.Popen([*args, "--port", "0"], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" on ")[-1].strip()
        r = httpx.post(f"{url}/generate", json={"input_ids": [5, 6, 7],
                                                "sampling_params": {"max_new_tokens": 4}},
                       timeout=60)
        assert r.status_code == 200 and len(r.json()["output_ids"]) >= 1
        assert httpx.get(f"{url}/get_model_info").json()["drafter"] == "ngram"
        port = url.rsplit(":", 1)[1]
        taken = subprocess.run([*args, "--port", port], check=False, cwd=root, env=env, text=True,
                               capture_output=True, timeout=300)
        assert taken.returncode == 2
        assert taken.stderr.strip().splitlines()[-1].startswith("error: cannot listen")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode in (0, 130)  # newer uvicorn re-raises the SIGINT it handled
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.parametrize("port", [-1, 70000])
def test_out_of_range_port_is_a_one_line_error(port):
    from specpilot.runtime.errors import SpecPilotError
    from specpilot.runtime.server import bind

    with pytest.raises(SpecPilotError, match=rf"--port must be in 1\.\.65535 .*got {port}"):
        bind("127.0.0.1", port)
    bind("127.0.0.1", 0).close()  # 0 stays valid: any free port


def test_serve_command_rejects_an_out_of_range_port(qwen3_dir):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "specpilot", "serve", "--model", str(qwen3_dir),
                          "--port", "70000"], check=False, capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: --port must be in 1..65535")
