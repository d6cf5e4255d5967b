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
