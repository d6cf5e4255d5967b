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


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "specpilot", *args], check=False,
                          capture_output=True, text=True)


def test_a_line_that_is_not_an_event_is_skipped_and_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path))
    sample_run(tmp_path, "r1")
    bad = sample_run(tmp_path, "r2")
    lines = bad.path.read_text().splitlines()
    bad.path.write_text("\n".join([lines[0], '{"foo": 1}', "42", *lines[1:]]) + "\n")
    runs = list_runs()
    assert [r.run_id for r in runs] == ["r1", "r2"] and runs[1].finished
    assert runs[1].damaged == (2, 3) and runs[0].damaged == ()
    assert "run r2" in capsys.readouterr().err
    from rich.console import Console

    from specpilot.trace import show_run

    con = Console(record=True, width=200)
    show_run("r2", con)
    out = con.export_text()
    assert "lines 2, 3 are not a trace event" in out and "c001" in out
    res = _cli("runs", "list")
    assert res.returncode == 0 and "r1" in res.stdout and "r2" in res.stdout
    assert "Traceback" not in res.stderr and "run r2" in res.stderr


def test_reading_a_run_never_writes_its_trace(tmp_path, monkeypatch):
    from rich.console import Console

    from specpilot.trace import show_run

    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path))
    tr = sample_run(tmp_path, "r1")
    with open(tr.path, "a") as f:
        f.write('{"event": "bench", "candidate": "c0')  # torn by a kill -9
    before = tr.path.read_bytes()
    show_run("r1", Console(record=True, width=200))
    list_runs()
    write_report("r1", tmp_path / "r.html")
    open_run("r1").events()
    assert tr.path.read_bytes() == before


def test_corrupt_lineage_is_a_one_line_error(tmp_path, monkeypatch):
    from specpilot.runtime.errors import SpecPilotError
    from specpilot.trace import show_run

    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path))
    tr = sample_run(tmp_path, "r1")
    (tr.dir / "lineage.json").write_text('{"nodes": [')
    with pytest.raises(SpecPilotError, match="lineage.json is not valid JSON"):
        show_run("r1")
    with pytest.raises(SpecPilotError, match="lineage.json is not valid JSON"):
        write_report("r1", tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()
    (tr.dir / "lineage.json").write_text("[1, 2]")
    with pytest.raises(SpecPilotError, match="is not a lineage"):
        show_run("r1")
    for cmd in (("runs", "show", "r1"), ("runs", "report", "r1")):
        res = _cli(*cmd)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert res.stderr.strip().splitlines() == [res.stderr.strip()]
        assert res.stderr.startswith("error: ") and "lineage.json" in res.stderr


def test_unreadable_trace_is_a_one_line_error(tmp_path, monkeypatch, capsys, deny_read):
    from specpilot.runtime.errors import SpecPilotError
    from specpilot.trace import show_run

    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path))
    sample_run(tmp_path, "r1")
    sample_run(tmp_path, "r2")
    deny_read(lambda f: f.name == "trace.jsonl" and f.parent.name == "r2")
    with pytest.raises(SpecPilotError, match=r"cannot read .*r2/trace.jsonl \(Permission denied"):
        show_run("r2")
    assert [r.run_id for r in list_runs()] == ["r1"]
    assert "run r2 skipped: cannot read" in capsys.readouterr().err


def test_report_out_is_checked_and_written_atomically(tmp_path, monkeypatch):
    import os
    import tempfile

    from specpilot.runtime.errors import SpecPilotError

    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path / "runs"))
    sample_run(tmp_path / "runs", "r1")
    with pytest.raises(SpecPilotError, match="is a directory"):
        write_report("r1", tmp_path)
    with pytest.raises(SpecPilotError, match="does not exist"):
        write_report("r1", tmp_path / "no" / "r.html")
    out = tmp_path / "r.html"
    out.write_text("old report")

    def denied(*a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", denied)  # fails after the temp file is written
    with pytest.raises(SpecPilotError, match=r"cannot write .*r.html \(Permission denied"):
        write_report("r1", out)
    monkeypatch.setattr(tempfile, "mkstemp", denied)  # a read-only directory
    with pytest.raises(SpecPilotError, match="cannot write"):
        write_report("r1", out)
    assert out.read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "runs"]
    monkeypatch.undo()
    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path / "runs"))
    assert "data:image/png" in write_report("r1", out).read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "runs"]
    assert os.stat(out).st_mode & 0o777 == 0o644
    res = _cli("runs", "report", "r1", "--out", str(tmp_path / "no" / "r.html"))
    assert res.returncode == 2 and res.stderr.startswith("error: --out")
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("bad, want", [
    (b"garbage{", "line 3: not valid JSON"),
    (b"[1, 2", "line 3: not valid JSON"),
    (b"\xff\xfe\x80", "line 3: not UTF-8 text"),
])
def test_a_damaged_line_is_a_one_line_error(tmp_path, monkeypatch, capsys, bad, want):
    """Not a torn last line (skipped) nor a JSON line that is not an event (named): the
    file is damaged, so show and report stop, and report writes nothing."""
    from specpilot.runtime.errors import SpecPilotError
    from specpilot.trace import show_run

    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path))
    r1 = sample_run(tmp_path, "r1")
    n = len(r1.events())
    for torn in ('{"event": "bench", "cand', '{"ev'):  # killed, then resumed: mid-file
        with open(r1.path, "a") as f:
            f.write(torn)
        Trace(r1.dir).append("bench", "c009", (), ok=True)
    assert len(read_events(r1.path)) == n + 2
    tr = sample_run(tmp_path, "r2")
    lines = tr.path.read_bytes().splitlines()
    tr.path.write_bytes(b"\n".join([*lines[:2], bad, *lines[2:]]) + b"\n")
    with pytest.raises(SpecPilotError, match=f"r2/trace.jsonl {want}"):
        show_run("r2")
    with pytest.raises(SpecPilotError, match=want):
        write_report("r2", tmp_path / "r.html")
    assert [r.run_id for r in list_runs()] == ["r1"]
    assert "run r2 skipped" in capsys.readouterr().err
    for cmd in (("runs", "show", "r2"), ("runs", "report", "r2")):
        res = _cli(*cmd)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines() == [res.stderr.strip()] and want in res.stderr
    assert not (tmp_path / "r.html").exists() and not (tr.dir / "report.html").exists()


def test_a_runs_folder_that_is_a_file(tmp_path, monkeypatch):
    from specpilot.runtime.errors import SpecPilotError

    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path / "none-yet"))
    assert list_runs() == []  # before the first search: nothing to list
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("SPECPILOT_RUNS", str(f))
    with pytest.raises(SpecPilotError, match=f"{f} is a file, not a runs folder: point "
                                             "SPECPILOT_RUNS at a folder"):
        list_runs()
    res = _cli("runs", "list")
    assert res.returncode == 2 and res.stdout == "" and "not a runs folder" in res.stderr


def test_report_out_under_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_RUNS", str(tmp_path / "runs"))
    sample_run(tmp_path / "runs", "r1")
    f = tmp_path / "afile"
    f.write_text("x")
    res = _cli("runs", "report", "r1", "--out", str(f / "r.html"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"error: --out {f / 'r.html'}: {f} is a file, not a "
                                  "directory: choose another path")
