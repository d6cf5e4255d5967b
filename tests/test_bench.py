"""Bench: the result JSON has its fields, its outputs pass token forcing, the server runner
matches the local one, and an engine with an overlay is benched with its own code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specpilot.bench.bench import run_bench
from specpilot.bench.runners import LocalRunner, ServerRunner
from specpilot.bench.workloads import load_workload
from specpilot.forcing.reference import LocalReference
from specpilot.forcing.verify import verify
from specpilot.runtime.knobs import Knobs

MNT = 12
PROMPTS = ["def add(a, b):\n", "class Point:\n    x", "    return a + b\n", "y: int = 0\n",
           "def add(", "class Point:\n"]


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("wl") / "mini.jsonl"
    p.write_text("".join(json.dumps({"id": f"q{i}", "dataset": f"set{i % 2}/f.py",
                                     "prompt": t, "reference": "x"}) + "\n"
                         for i, t in enumerate(PROMPTS)))
    return p


@pytest.fixture(scope="module")
def spec_result(qwen3_dir, workload_file):
    runner = LocalRunner(qwen3_dir, Knobs(drafter="ngram", k=3))
    wl = load_workload(str(workload_file), runner.tokenizer)
    return run_bench(runner, wl, runner.tokenizer, batch=4, max_new_tokens=MNT, repeats=2,
                     meta={"engine": "test"})


def test_result_has_the_fields(spec_result, workload_file):
    r = spec_result
    assert r["format"] == "specpilot.bench/1"
    env = r["environment"]
    for k in ("device", "torch", "python", "git_commit", "engine_hash", "deployment"):
        assert k in env
    assert env["device"] == "cpu" and env["engine"] == "test"
    s = r["settings"]
    assert s["workload"]["name"] == "mini" and len(s["workload"]["hash"]) == 64
    assert (s["batch"], s["max_new_tokens"], s["repeats"]) == (4, MNT, 2)
    assert s["knobs"]["drafter"] == "ngram" and s["knobs"]["k"] == 3
    assert [q["id"] for q in r["requests"]] == [f"q{i}" for i in range(len(PROMPTS))]
    for q in r["requests"]:
        assert q["new_tokens"] == len(q["output_ids"]) >= 1
        # the engine's acceptance counts tokens of verify steps (not the prefill token)
        assert q["verify_steps"] >= 1 and q["accept_length"] == pytest.approx(
            (q["new_tokens"] - 1) / q["verify_steps"])
        assert q["latency_s"] > 0 and 0 < q["time_s"] <= q["latency_s"]
        assert len(q["timings"]) == 2 and q["dataset"].startswith("set")
        assert q["prompt_ids"] and isinstance(q["output_text"], str)
    t = r["totals"]
    assert t["new_tokens"] == sum(q["new_tokens"] for q in r["requests"])
    assert t["tokens_per_s"] == pytest.approx(t["new_tokens"] / t["time_s"])
    assert t["outputs_stable"] is True and len(t["tokens_per_s_per_repeat"]) == 2


def test_outputs_pass_token_forcing(spec_result, qwen3_dir):
    with LocalReference(qwen3_dir) as ref:
        v = verify(spec_result["requests"], ref, max_new_tokens=MNT)
    assert v.passed and v.checked == spec_result["totals"]["new_tokens"]


def test_server_runner_matches_local(spec_result, qwen3_dir, workload_file):
    from specpilot.runtime.factory import build_engine
    from specpilot.runtime.server import start_server

    engine, tok = build_engine(qwen3_dir, Knobs(drafter="ngram", k=3))
    with start_server(engine, tok, port=0, model_path=str(qwen3_dir)) as h:
        runner = ServerRunner(h.url)
        res = run_bench(runner, load_workload(str(workload_file), tok), tok, batch=3,
                        max_new_tokens=MNT)
        runner.close()
    got = {q["id"]: q for q in res["requests"]}
    for q in spec_result["requests"]:
        assert got[q["id"]]["output_ids"] == q["output_ids"]
        assert got[q["id"]]["verify_steps"] >= 1
    assert res["settings"]["runner"] == "server" and res["totals"]["tokens_per_s"] > 0


def test_cli_bench_engine_dir_with_overlay(qwen3_dir, workload_file, tmp_path):
    """--engine PATH with an overlay runs in a child process on the engine's build dir."""
    from specpilot.engines import PACKAGE, EngineSpec, promote

    dep = tmp_path / "mini.toml"
    dep.write_text(f'name = "mini"\ndevice = "cpu"\nmax_new_tokens = {MNT}\n'
                   f'batch_sizes = [2]\n[target]\npath = "{qwen3_dir}"\n'
                   f'[drafter]\nkind = "ngram"\n[workloads]\ndev = "{workload_file}"\n'
                   '[knobs]\nk = 2\n')
    src = (PACKAGE / "runtime" / "generate.py").read_text()
    spec = EngineSpec("mini", "cand", Knobs(drafter="ngram", k=2),
                      {"specpilot/runtime/generate.py": src + "\n# candidate overlay\n"})
    eng = promote(spec, {}, engines_root=tmp_path / "engines")
    out = tmp_path / "res.json"
    env = {**__import__("os").environ, "SPECPILOT_DATA": str(tmp_path / "data")}
    r = subprocess.run(check=False, args=[sys.executable, "-m", "specpilot", "bench", "--deployment", str(dep),
                        "--engine", str(eng), "--limit", "4", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["environment"]["package"].startswith(str(tmp_path / "data" / "builds"))
    assert res["environment"]["engine_hash"] == spec.hash
    assert res["environment"]["deployment"] == "mini"
    assert len(res["requests"]) == 4 and res["settings"]["batch"] == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".res.json")] == []


def test_local_runner_builds_for_its_batch_sizes(monkeypatch, qwen3_dir):
    """The engine is built for every batch size the runner will time (W12 layers are
    chosen where they win at all of them: `factory.step_rows`)."""
    from specpilot.runtime import factory

    seen = []
    real = factory.build_engine
    monkeypatch.setattr(factory, "build_engine",
                        lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    LocalRunner(qwen3_dir, Knobs(), batch_sizes=(1, 8))
    LocalRunner(qwen3_dir, Knobs())
    assert seen == [(1, 8), (1,)]


# --- bad input: one line, exit 2, found before any work, nothing half-written -----------

def _bench_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    from specpilot.deployment import ROOT

    return subprocess.run([sys.executable, "-m", "specpilot", "bench", *args], check=False,
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def _one_line_error(r: subprocess.CompletedProcess, *want: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in want:
        assert w in r.stderr, r.stderr


@pytest.mark.parametrize("flag, value, want", [
    ("--max-new-tokens", "0", "--max-new-tokens must be >= 1, got 0"),
    ("--batch", "0", "--batch must be >= 1, got 0"),
    ("--k", "0", "--k must be in 1..32, got 0"),
    ("--limit", "-1", "--limit must be >= 1, got -1"),
    ("--limit", "0", "--limit must be >= 1, got 0"),
    ("--repeats", "0", "--repeats must be >= 1, got 0"),
    ("--device", "tpu", "unknown device 'tpu'"),
])
def test_cli_bench_out_of_range_flags_are_errors(flag, value, want, tmp_path):
    out = tmp_path / "o.json"
    r = _bench_cli("--deployment", "tiny-cpu", flag, value, "--out", str(out),
                   env={"SPECPILOT_DATA": str(tmp_path / "data")})
    _one_line_error(r, want)
    assert not out.exists()


def test_bench_checks_out_before_the_work(tmp_path):
    from specpilot.bench.bench import bench_command, check_out_path
    from specpilot.runtime.errors import SpecPilotError

    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, want in [(tmp_path, "is a folder"), (afile / "o.json", "is not a folder")]:
        # a deployment that does not exist: the --out check comes before it is looked up
        with pytest.raises(SpecPilotError, match=want):
            bench_command("no-such-deployment", None, None, None, None, None, None, None,
                          None, None, 1, str(out), None, None, progress=False)
    assert check_out_path(tmp_path / "new" / "o.json", "--out", ())  # made later
    assert check_out_path(tmp_path / "o.txt", "--out", ())  # any name
    with pytest.raises(SpecPilotError, match="must end in .png"):
        check_out_path(tmp_path / "o.txt", "--plot", (".png",))


def test_bench_refuses_a_read_only_folder(tmp_path, monkeypatch):
    from specpilot.bench import bench
    from specpilot.runtime.errors import SpecPilotError

    # tests may run as root, whom permissions do not stop: the check is what is tested
    monkeypatch.setattr(bench.os, "access", lambda path, mode: False)
    with pytest.raises(SpecPilotError, match="permission denied"):
        bench.check_out_path(tmp_path / "o.json", "--out", ())


def test_cli_bench_engine_of_another_deployment(tmp_path):
    from specpilot.engines import EngineSpec, promote

    spec = EngineSpec("nope", "cand", Knobs(drafter="ngram", k=2), {})
    eng = promote(spec, {}, engines_root=tmp_path / "engines")
    out = tmp_path / "o.json"
    r = _bench_cli("--deployment", "tiny-cpu", "--engine", str(eng), "--limit", "1",
                   "--out", str(out), env={"SPECPILOT_DATA": str(tmp_path / "data")})
    _one_line_error(r, "'nope'", "not 'tiny-cpu'", "--deployment nope")
    assert not out.exists()


@pytest.mark.parametrize("args, want", [
    (["--deployment", "tiny-cpu", "--engine", "stock", "--drafter", "ngram"],
     "--drafter only with --model"),
    (["--deployment", "tiny-cpu", "--drafter", "ngram"], "--drafter only with --model"),
    (["--deployment", "tiny-cpu", "--engine", "ar", "--k", "3"], "--k needs a drafter"),
    (["--model", "models/tiny-pycode/target", "--k", "3", "--workload", "tiny-pycode-dev"],
     "--k needs a drafter"),
    (["--deployment", "tiny-cpu", "--engine", "engines/tiny-cpu/final", "--k", "3"],
     "--k does not apply to engine engines/tiny-cpu/final"),
    (["--server", "http://127.0.0.1:9", "--model", "models/tiny-pycode/target",
      "--drafter", "ngram", "--device", "cpu"],
     "--drafter, --device cannot change a --server"),
    (["--deployment", "tiny-cpu", "--engine", "nope"],
     "no engine 'nope': give ar or stock (the built-in engines) or an engine folder"),
    (["--deployment", "tiny-cpu", "--engine", "engines/tiny-cpu/final/engine.toml"],
     "give the engine's folder (engines/tiny-cpu/final), not its engine.toml"),
])
def test_cli_bench_refuses_flags_its_mode_ignores(args, want, tmp_path):
    """A flag bench would not apply (or whose result would misname the engine) is an error
    before any work, not a result of something else."""
    out = tmp_path / "o.json"
    r = _bench_cli(*args, "--limit", "1", "--max-new-tokens", "4", "--out", str(out),
                   env={"SPECPILOT_DATA": str(tmp_path / "data")})
    _one_line_error(r, want)
    assert not out.exists()


def test_cli_bench_model_without_workload_names_no_deployment(tmp_path):
    r = _bench_cli("--model", "models/tiny-pycode/target", "--out", str(tmp_path / "o.json"))
    _one_line_error(r, "give --workload NAME|FILE")
    assert "deployment" not in r.stderr


@pytest.fixture
def fake_server():
    """A local HTTP server answering every GET and POST with one set (status, body)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answer = {"status": 200, "body": b"", "type": "application/json"}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self):
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            self.send_response(answer["status"])
            self.send_header("Content-Type", answer["type"])
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            self.wfile.write(answer["body"])

        do_GET = do_POST = _reply

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()

    def serve(status: int, body: bytes, ctype: str = "application/json") -> str:
        answer.update(status=status, body=body, type=ctype)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield serve
    srv.shutdown()
    srv.server_close()


HTML = b"<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n" + b"x" * 500 + b"\n</html>\n"


@pytest.mark.parametrize("status, body, ctype, want", [
    (200, b"<html>not json</html>", "text/html", "not JSON"),
    (200, b'{"x": 1}', "application/json", "expected SGLang /generate JSON"),
    (502, HTML, "text/html", "answered HTTP 502"),
])
def test_server_runner_bad_answers_are_one_line(fake_server, status, body, ctype, want):
    from specpilot.runtime.errors import SpecPilotError

    url = fake_server(status, body, ctype)
    runner = ServerRunner(url)
    with pytest.raises(SpecPilotError) as e:
        runner.generate([[1, 2, 3]], 4)
    runner.close()
    msg = str(e.value)
    assert want in msg and f"{url}/generate" in msg and "output_ids and meta_info" in msg
    assert "\n" not in msg and len(msg) < 400


def test_cli_bench_server_answering_non_json(fake_server, qwen3_dir, workload_file, tmp_path):
    url = fake_server(200, b"hello, not json", "text/plain")
    out = tmp_path / "o.json"
    r = _bench_cli("--server", url, "--model", str(qwen3_dir), "--workload", str(workload_file),
                   "--out", str(out), env={"SPECPILOT_DATA": str(tmp_path / "data")})
    _one_line_error(r, f"{url}/generate", "not JSON")
    assert not out.exists()
