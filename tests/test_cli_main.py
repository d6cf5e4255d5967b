"""`specpilot`'s entry point: errors a command did not turn into SpecPilotError, and the
argument parser's own (unknown option, missing or malformed value), still end as one line
and a non-zero exit, never as a traceback or a multi-line box."""

from __future__ import annotations

import json
import sys

import pytest
import typer

from specpilot import cli
from specpilot.runtime.errors import SpecPilotError


@pytest.mark.parametrize("exc, needle", [
    (SpecPilotError("no deployment 'x': see `specpilot deployments list`"), "no deployment 'x'"),
    (PermissionError(13, "Permission denied", "/data/out.json"),
     "/data/out.json: Permission denied: check the path"),
    (IsADirectoryError(21, "Is a directory", "runs"), "runs: Is a directory"),
    (json.JSONDecodeError("Expecting value", "{x", 1), "an input file is damaged"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "damaged"),
])
def test_errors_end_as_one_line(monkeypatch, capsys, exc, needle):
    def app(**kwargs):
        raise exc

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_other_errors_still_surface(monkeypatch):
    """A bug is not dressed up as an input error."""
    def app(**kwargs):
        raise KeyError("bug")

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(KeyError):
        cli.main()


def run_main(monkeypatch, capsys, *argv) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["specpilot", *argv])
    with pytest.raises(SystemExit) as e:
        cli.main()
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize("argv, needle, where", [
    (["search", "--bogus"], "No such option: --bogus", "specpilot search --help"),
    (["w12", "stats"], "Missing option '--model'", "specpilot w12 stats --help"),
    (["nosuch"], "No such command 'nosuch'", "specpilot --help"),
    (["verify", "--max-new-tokens", "x"], "'--max-new-tokens'", "specpilot verify --help"),
    (["runs", "show"], "Missing argument", "specpilot runs show --help"),
])
def test_usage_errors_are_one_line(monkeypatch, capsys, argv, needle, where):
    rc, out, err = run_main(monkeypatch, capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: ") and needle in lines[0] and f"'{where}'" in lines[0]


def test_exit_codes_and_help_pass_through(monkeypatch, capsys):
    """A command's own exit code (verify's 1 on a mismatch) reaches the shell; success is
    0; a bare group still prints its help (exit 2, as the parser always did)."""
    rc, out, _ = run_main(monkeypatch, capsys, "version")
    assert rc == 0 and out.strip()
    rc, out, _ = run_main(monkeypatch, capsys, "w12")
    assert rc == 2 and "stats" in out
    fake = typer.Typer()

    @fake.command()
    def fails() -> None:
        raise typer.Exit(3)

    monkeypatch.setattr(cli, "app", fake)
    rc, _, _ = run_main(monkeypatch, capsys)
    assert rc == 3
