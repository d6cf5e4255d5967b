"""The embedded deployment `tiny-cpu` and `specpilot deployments list | show`."""

from __future__ import annotations

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
