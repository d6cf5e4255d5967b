"""Run traces: append/flush, torn lines after kill -9, secrets, runs list/show/report."""

from __future__ import annotations

import json

import pytest

from specpilot.agents.merge import Lineage
from specpilot.trace import Trace, candidate_table, list_runs, open_run, read_events, write_report


def sample_run(root, run_id="r1") -> Trace:
    tr = Trace(root / run_id)
    tr.append("run_started", None, (), deployment="dep", config={"budget": 2})
    tr.append("gaps", None, (), gaps=[{"name": "verify", "ms_per_token": 2.5, "note": "x"}])
    tr.append("proposal", "c001", ("stock",), agent="heuristic", summary="k=3", round=0)
    tr.append("build", "c001", ("stock",), hash="abc", ok=True)
    tr.append("bench", "c001", ("stock",), hash="abc", ok=True, tok_s=120.0,
              accept_length=2.5, speedup_vs_stock=1.4, ci95=[1.2, 1.6])
    tr.append("verify", "c001", ("stock",), set="dev", passed=True, status="accepted")
    tr.append("proposal", "c002", ("stock",), agent="llm:openai", summary="1 edit",
              round=0, rejected="edits specpilot/forcing/verify.py, outside the editable files")
    tr.append("run_finished", "c001", (), best="c001", speedup_vs_stock=1.4, ci95=[1.2, 1.6])
    lin = Lineage()
    lin.add("stock")
    lin.add("c001", ["stock"], status="accepted")
    lin.add("c002", ["stock"], status="rejected")
    lin.save(tr.dir / "lineage.json")
    return tr


def test_events_carry_the_contract_fields(tmp_path):
    tr = sample_run(tmp_path)
    ev = tr.events()
    assert [e["event"] for e in ev][:3] == ["run_started", "gaps", "proposal"]
    for e in ev:
        assert {"event", "time", "candidate", "parents"} <= set(e)
    with pytest.raises(ValueError):
        tr.append("made_up")


def test_torn_last_line_is_skipped_and_repaired(tmp_path):
    tr = sample_run(tmp_path)
    n = len(tr.events())
    with open(tr.path, "a") as f:
        f.write('{"event": "bench", "candidate": "c0')  # kill -9 mid-write
    assert len(read_events(tr.path)) == n
    tr2 = Trace(tr.dir)  # a resumed run appends cleanly after the torn line
    tr2.append("bench", "c003", (), ok=True)
    ev = read_events(tr.path)
    assert len(ev) == n + 1 and ev[-1]["candidate"] == "c003"


def test_secrets_never_reach_the_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "my-very-secret-key-123")
    tr = Trace(tmp_path / "r")
    tr.append("proposal", None, (), api_key="abc", prompt="key my-very-secret-key-123 here",
              headers={"Authorization": "Bearer xyzxyzxyzxyz", "x-api-key": "sk-ant-abcdefghijk"},
              response="sk-proj-abcdefghijklmnop")
    text = tr.path.read_text()
    for s in ("my-very-secret-key-123", "xyzxyzxyzxyz", "sk-ant-abcdefghijk", "abcdefghijklmnop"):
        assert s not in text
    assert json.loads(text)["prompt"] == "key *** here"


def test_candidate_table_and_runs_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path))
    sample_run(tmp_path, "r1")
    rows = candidate_table(open_run("r1").events())
    assert rows["c001"]["status"] == "accepted" and rows["c001"]["tok_s"] == 120.0
    assert rows["c002"]["status"] == "rejected" and "forcing" in rows["c002"]["reason"]
    runs = list_runs()
    assert [r.run_id for r in runs] == ["r1"] and runs[0].best == "c001" and runs[0].finished
    from rich.console import Console

    con = Console(record=True, width=200)
    from specpilot.trace import show_run

    show_run("r1", con)
    out = con.export_text()
    assert "c002" in out and "outside the editable" in out and "stock -> c001" in out
    html = write_report("r1", tmp_path / "r.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "c002" in html


def test_cli_runs_list_and_missing_run(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path))
    sample_run(tmp_path, "r9")
    out = subprocess.run([sys.executable, "-m", "specpilot", "runs", "list"],
                         check=False, capture_output=True, text=True)
    assert out.returncode == 0 and "r9" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "specpilot", "runs", "show", "nope"],
                         check=False, capture_output=True, text=True)
    assert bad.returncode == 2 and "no run 'nope'" in bad.stderr
