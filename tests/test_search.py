"""The search end to end on random tiny checkpoints: bad candidates are rejected with their
reason while the search goes on; kill -9 then --resume redoes no finished evaluation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from specpilot.agents.candidate import Candidate, Edit
from specpilot.trace import Trace, read_events
from tests.fixtures.search_env import PRED, indent_of, statement, write_deployment

GEN = "specpilot/runtime/generate.py"
NGRAM = "specpilot/runtime/drafters/ngram.py"


def bad_and_good_proposals() -> dict[str, Candidate]:
    """Round-0 proposals as an earlier run would have recorded them."""
    prop = statement(NGRAM, r"def propose\(")
    body = indent_of(prop) + "    "
    argmax = statement(GEN, PRED, last=True)
    ind = indent_of(argmax)
    t0 = statement(GEN, r"perf_counter\(\)")
    ng = {"drafter": "ngram"}
    c = {
        "raises": Candidate("", "t", ng, (Edit(NGRAM, prop, prop + f"{body}raise RuntimeError("
                                               "'candidate bug')\n"),)),
        "hangs": Candidate("", "t", ng, (Edit(NGRAM, prop, prop + f"{body}while True:\n"
                                              f"{body}    pass\n"),)),
        "wrong": Candidate("", "t", ng, (Edit(GEN, argmax,
                                              argmax + f"{ind}pred = (pred + 1) % 5\n"),)),
        "forbidden": Candidate("", "t", {}, (Edit("specpilot/forcing/verify.py", "from", "from"),)),
        "no_apply": Candidate("", "t", {}, (Edit(GEN, "not in the file\n", "x\n"),)),
        "timing": Candidate("", "t", {}, (Edit(GEN, t0, t0.replace("time.perf_counter()",
                                                                   "0.0")),)),
        "good": Candidate("", "t", {"drafter": "ngram", "k": 1}, (),
                          "stock drafts 8 tokens a random draft model rejects"),
    }
    return {k: Candidate(f"old{i}", f"t:{k}", v.knobs, v.edits, v.rationale or k, ("stock",), 0)
            for i, (k, v) in enumerate(c.items())}


@pytest.fixture(scope="module")
def search_env(tmp_path_factory, qwen3_dir, qwen3_draft_dir):
    tmp = tmp_path_factory.mktemp("search")
    dep = write_deployment(tmp / "dep", qwen3_dir, qwen3_draft_dir, max_new_tokens=12, k=8)
    old = Trace(tmp / "recorded")
    for c in bad_and_good_proposals().values():
        old.append("proposal", c.id, c.parents, proposal=c.to_dict())
    return tmp, dep, old.path


def wait_for(path, pred, timeout: float, proc) -> list[dict]:
    t = time.time()
    while time.time() - t < timeout and proc.poll() is None:
        ev = read_events(path)
        if pred(ev):
            return ev
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting on {path}: {[e['event'] for e in read_events(path)]}")


@pytest.mark.parametrize("args, needle", [
    (["--agents", "bogus"], "unknown agent 'bogus'"),
    (["--agents", "llm"], "--agents llm needs --llm"),
    (["--agents", "replay"], "--agents replay needs --replay-from"),
    (["--agents", " , "], "--agents names no proposer"),
    (["--llm", "nosuch:model"], "unknown provider 'nosuch'"),
])
def test_bad_search_input_leaves_no_run(search_env, tmp_path, args, needle):
    """Bad agent options are one-line errors found before Ray starts or the run exists."""
    _, dep, _ = search_env
    assert needle in _search_fails(str(dep), tmp_path, "--run-id", "bad", *args)


def _search_fails(dep: str, tmp_path, *args: str) -> str:
    """stderr of a search on `dep` that must fail with one line and leave no run."""
    env = os.environ | {"SPECPILOT_RUNS": str(tmp_path / "runs"),  # nothing lands in the repo
                        "SPECPILOT_DATA": str(tmp_path / "data"), "SPECPILOT_ROOT": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "specpilot", "search", "--deployment", dep,
                        "--quiet", *args], env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    return r.stderr


def test_search_refuses_a_perf_only_deployment(tmp_path):
    """The H200 presets are random weights with no workloads: the search says so at once
    (it used to fail on the missing tokenizer of "random:8b")."""
    repo = Path(__file__).resolve().parents[1]
    err = _search_fails(str(repo / "deployments" / "h200-8b-b1.toml"), tmp_path)
    assert "h200-8b-b1 is perf-only" in err and "gpu_perf.py" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_search_refuses_a_cuda_deployment_without_cuda(search_env, tmp_path):
    """Without the check a CUDA deployment's search waited forever for a GPU worker."""
    _, dep, _ = search_env
    cuda = tmp_path / "tinycuda.toml"
    cuda.write_text(dep.read_text().replace('device = "cpu"', 'device = "cuda"'))
    err = _search_fails(str(cuda), tmp_path)
    assert "runs on cuda, but this machine has no CUDA device" in err, err


@pytest.mark.slow
def test_search_rejects_bad_candidates_and_resumes_after_kill(search_env, ray_address,
                                                             monkeypatch):
    from specpilot.agents.loop import SearchConfig, run_search

    tmp, dep, recorded = search_env
    runs = tmp / "runs"
    monkeypatch.setenv("SPECPILOT_RUNS", str(runs))
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp / "data"))
    address = ray_address
    env = os.environ | {"SPECPILOT_ROOT": str(tmp)}
    cmd = [sys.executable, "-m", "specpilot", "search", "--deployment", str(dep),
           "--agents", "replay", "--replay-from", str(recorded), "--budget", "6",
           "--workers", "2", "--ray-address", address, "--run-id", "r1", "--repeats", "1",
           "--dev-limit", "4", "--eval-timeout", "20", "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    trace = runs / "r1" / "trace.jsonl"
    try:
        wait_for(trace, lambda ev: sum(e["event"] == "bench" for e in ev) >= 3, 240,
                          proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate()[0].decode()
    assert proc.returncode == -signal.SIGKILL, out
    done_before = {e["hash"] for e in read_events(trace) if e["event"] == "bench"}
    n_before = len(read_events(trace))
    assert not any(e["event"] == "run_finished" for e in read_events(trace))

    seen = []
    summary = run_search(SearchConfig(deployment="", run_id="r1", resume=True, workers=2,
                                      engines_root=str(tmp / "engines")),
                         on_event=seen.append)
    ev = read_events(trace)
    after = ev[n_before:]
    # no finished evaluation was redone, and no hash was ever benched twice
    assert not {e["hash"] for e in after if e["event"] == "bench"} & done_before
    assert all(n == 1 for n in Counter(e["hash"] for e in ev if e["event"] == "bench").values())

    by_agent = {}
    for e in ev:
        if e["event"] == "proposal" and e.get("agent", "").startswith("replay:t:"):
            by_agent[e["agent"].split(":")[-1]] = e["candidate"]
    assert len(by_agent) == 7
    facts = {}
    for e in ev:
        if e.get("candidate") in by_agent.values():
            f = facts.setdefault(e["candidate"], {})
            if e.get("rejected"):
                f["rejected"] = e["rejected"]
            if e["event"] == "bench":
                f["ok"], f["reason"] = e["ok"], e.get("reason", "")
            if e["event"] == "verify" and e.get("set") == "dev":
                f["status"], f["reason"] = e["status"], e.get("reason") or f.get("reason", "")
    f = {k: facts[v] for k, v in by_agent.items()}
    assert "outside the editable" in f["forbidden"]["rejected"]
    assert "not found" in f["no_apply"]["rejected"]
    assert "timing" in f["timing"]["rejected"]
    assert f["raises"]["ok"] is False and "candidate bug" in f["raises"]["reason"]
    assert f["hangs"]["ok"] is False and "timed out" in f["hangs"]["reason"]
    assert f["wrong"]["status"] == "rejected" and "not lossless" in f["wrong"]["reason"]
    assert f["good"]["status"] == "accepted"

    # the good candidate ships: verified on dev and gate, faster than stock with CI above 1
    assert summary["engine"] == by_agent["good"]
    assert summary["dev"]["verified"] and summary["gate"]["verified"]
    assert summary["speedup_vs_stock"]["ci95"][0] > 1.0
    final = tmp / "engines" / "tinytest" / "final"
    assert {p.name for p in final.iterdir()} >= {"engine.toml", "overlay", "results.json"}
    assert (tmp / "engines" / "tinytest" / "stock" / "engine.toml").is_file()
    res = json.loads((final / "results.json").read_text())
    assert res["gate"]["verified"] and "ci95" in res["speedup_vs_ar"]
    assert ev[-1]["event"] == "run_finished" and ev[-1]["best"] == by_agent["good"]
    # the shipped numbers come from the confirmation: stock, ar and the final re-timed
    # side by side after Ray stopped, outputs token-forced again
    conf = {e["candidate"]: e for e in ev if e["event"] == "confirm"}
    assert {"stock", "ar", by_agent["good"]} <= set(conf)
    assert all(c["passed"] and not c["reason"] for c in conf.values())
    assert res["measured"]["how"].startswith("interleaved")
    assert res["speedup_vs_stock"]["ci95"] == conf[by_agent["good"]]["ci95"]
    assert (runs / "r1" / "lineage.json").is_file()
    assert (runs / "r1" / "candidates" / by_agent["good"] / "candidate.json").is_file()
    # gate results never reach a proposer: only the final checks see the gate set
    gate_times = [e["time"] for e in ev if e["event"] == "verify" and e.get("set") == "gate"]
    prop_times = [e["time"] for e in ev if e["event"] == "proposal"]
    assert min(gate_times) > max(prop_times)

    # `specpilot replay` rebuilds the promoted engine, re-verifies and re-benchmarks it
    (tmp / "deployments").mkdir(exist_ok=True)
    (tmp / "deployments" / "tinytest.toml").write_text(dep.read_text())
    rep = subprocess.run([sys.executable, "-m", "specpilot", "replay", str(final), "--json",
                          "--rounds", "1", "--dev-limit", "4"], env=env, capture_output=True,
                         text=True, check=False, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    out = json.loads(rep.stdout)
    assert out["hash_matches"] and out["verified"]
    assert set(out["speedup_vs_stock"]) >= {"ratio", "ci95"} and out["speedup_vs_ar"]["ratio"] > 0
