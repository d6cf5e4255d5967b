"""The embedded deployment `tiny-cpu` and `specpilot deployments list | show`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot.bench.workloads import resolve
from specpilot.deployment import load_deployment
from specpilot.runtime.errors import SpecPilotError

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specpilot", *args], check=False,
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_tiny_cpu_points_at_shipped_parts():
    d = load_deployment("tiny-cpu")
    assert d.device == "cpu" and d.dtype == "float32" and d.batch_sizes == (1, 4)
    assert d.max_new_tokens == 128 and d.knobs.threads == 2 and d.knobs.k == 4
    assert d.drafter.kind == "block"
    assert [a.kind for a in d.alternatives] == ["draft", "ngram"]
    for p in (d.target, d.drafter.path, d.alternatives[0].path):
        assert (Path(p) / "config.json").is_file() and (Path(p) / "model.safetensors").is_file()
    assert resolve(d.dev_workload).suffix == ".toml"
    assert resolve(d.gate_workload).suffix == ".toml"
    assert d.dev_workload != d.gate_workload
    assert d.stock_knobs().drafter == f"block:{d.drafter.path}"


def test_stock_knobs_build_an_engine():
    from specpilot.runtime.factory import build_engine

    d = load_deployment("tiny-cpu")
    engine, tok = build_engine(d.target, d.stock_knobs(), d.device, d.dtype)
    gen = engine.generate([tok.encode("def main():\n")], max_new_tokens=8)[0]
    assert len(gen.output_ids) >= 1 and engine.k == 4


def test_cli_list_and_show():
    r = _cli("deployments", "list")
    assert r.returncode == 0, r.stderr
    assert "tiny-cpu" in r.stdout and "block:models/tiny-pycode/block" in r.stdout
    r = _cli("deployments", "show", "tiny-cpu")
    assert r.returncode == 0, r.stderr
    for s in ("models/tiny-pycode/target", "draft:models/tiny-pycode/draft", "ngram",
              "tiny-pycode-gate", "k=4", "threads=2", "1, 4"):
        assert s in r.stdout


def test_unknown_deployment_is_one_line():
    with pytest.raises(SpecPilotError):
        load_deployment("no-such-deployment")
    r = _cli("deployments", "show", "no-such-deployment")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0


def test_every_shipped_deployment_is_valid():
    from specpilot.deployment import list_deployments

    names = {d.name for d in list_deployments()}
    assert "tiny-cpu" in names and len(names) == len(list((ROOT / "deployments").glob("*.toml")))
    for name in names:
        r = _cli("deployments", "show", name)
        assert r.returncode == 0, r.stderr


BASE = ('name = "t"\ndevice = "cpu"\nbatch_sizes = [1, 4]\nmax_new_tokens = 8\n'
        '[target]\npath = "models/tiny-pycode/target"\n[drafter]\nkind = "ngram"\n')


@pytest.mark.parametrize("change, want", [
    (('device = "cpu"', 'device = "tpu"'), "device 'tpu' is not supported"),
    (('device = "cpu"', 'device = "cpu"\ndtype = "int3"'), "dtype 'int3'"),
    (("batch_sizes = [1, 4]", "batch_sizes = [0, -4]"), "batch_sizes must be a non-empty"),
    (("batch_sizes = [1, 4]", "batch_sizes = []"), "batch_sizes must be a non-empty"),
    (("max_new_tokens = 8", "max_new_tokens = -1"), "max_new_tokens must be >= 1"),
    (('kind = "ngram"', 'kind = "bogus"'), "unknown drafter kind 'bogus'"),
    (('kind = "ngram"', 'kind = "draft"'), "a draft drafter needs a 'path'"),
    (('[target]\npath = "models/tiny-pycode/target"\n', ""),
     "t.toml: missing required key 'target'"),
    (('path = "models/tiny-pycode/target"', 'name = "x"'),
     "t.toml: [target] needs a 'path' (a checkpoint) or a 'random' preset"),
    (("[target]", '[knobs]\nk = "four"\n[target]'),
     "t.toml: knob k must be an integer, got 'four'"),
])
def test_bad_fields_are_one_line_errors(tmp_path, change, want):
    p = tmp_path / "t.toml"
    p.write_text(BASE.replace(*change))
    with pytest.raises(SpecPilotError, match=re.escape(want)):
        load_deployment(str(p))
    r = _cli("deployments", "show", str(p))
    assert r.returncode == 2 and want in r.stderr and r.stderr.strip().count("\n") == 0


def test_bench_and_costmodel_stop_at_a_bad_deployment(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text(BASE.replace("batch_sizes = [1, 4]", "batch_sizes = []"))
    for args in (["bench", "--deployment", str(p), "--out", str(tmp_path / "o.json")],
                 ["costmodel", "--deployment", str(p)]):
        r = _cli(*args)
        assert r.returncode == 2 and "batch_sizes" in r.stderr and "Traceback" not in r.stderr


def test_unreadable_deployment_is_one_line(tmp_path, deny_read):
    p = tmp_path / "t.toml"
    p.write_text(BASE)
    deny_read(lambda f: f == p)
    with pytest.raises(SpecPilotError, match="cannot read deployment .*Permission denied"):
        load_deployment(str(p))


def test_data_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    from specpilot.deployment import data_dir

    f = tmp_path / "data"
    f.write_text("not a folder")
    monkeypatch.setenv("SPECPILOT_DATA", str(f))
    with pytest.raises(SpecPilotError, match="SPECPILOT_DATA"):
        data_dir()
    monkeypatch.setenv("SPECPILOT_DATA", str(f / "sub"))
    with pytest.raises(SpecPilotError, match="is not a folder"):
        data_dir()


def test_deployment_dtypes_are_the_runtimes():
    """deployment.py names the dtypes without importing torch; they must stay the loader's."""
    from specpilot import deployment
    from specpilot.runtime import loader

    assert deployment.DTYPES == tuple(loader.DTYPES)
