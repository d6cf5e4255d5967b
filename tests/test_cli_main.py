"""`specpilot`'s entry point: errors a command did not turn into SpecPilotError still end
as one line and exit 2, never as a traceback."""

from __future__ import annotations

import json

import pytest

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
    def app():
        raise exc

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_other_errors_still_surface(monkeypatch):
    """A bug is not dressed up as an input error."""
    def app():
        raise KeyError("bug")

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(KeyError):
        cli.main()
