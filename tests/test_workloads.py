"""Workloads: recipes materialise deterministically from held-out stdlib files, dev and gate
share no file, JSONL workloads load as written, and bad names fail in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot.bench.workloads import (
    Recipe,
    WorkloadItem,
    cut_points,
    items_hash,
    load_workload,
    write_jsonl,
)
from specpilot.runtime.errors import SpecPilotError
from specpilot.zoo.corpus import split_of

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def test_recipes_materialise_deterministically(data):
    a = load_workload("tiny-pycode-dev")
    b = load_workload("tiny-pycode-dev")
    assert a.hash == b.hash and a.items == b.items
    assert len(a.items) == 32 and len({i.id for i in a.items}) == 32
    f = Path(a.path)
    assert f.parent == data / "workloads" and f.name == f"tiny-pycode-dev-{a.hash[:12]}.jsonl"
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    assert items_hash([WorkloadItem(**r) for r in rows]) == a.hash
    assert not list(f.parent.glob(".*"))  # the atomic write left no temporary file


def test_prompts_come_from_heldout_files_cut_at_boundaries(data):
    for name in ("tiny-pycode-dev", "tiny-pycode-gate"):
        r = Recipe.from_toml(ROOT / "workloads" / f"{name}.toml")
        for it in load_workload(name).items:
            rel = it.dataset.removeprefix("stdlib/")
            assert split_of(rel) == "heldout"
            assert not rel.startswith("encodings/")
            assert r.min_prompt_chars <= len(it.prompt) <= r.max_prompt_chars
            assert it.prompt.endswith("\n")
            first = it.reference.splitlines()[0].lstrip()
            after_blank = it.prompt.endswith("\n\n") or it.prompt.rstrip(" \t").endswith("\n\n")
            assert after_blank or first.startswith(("def ", "class ", "async def")), it.id


def test_dev_and_gate_share_no_file(data):
    dev, gate = load_workload("tiny-pycode-dev"), load_workload("tiny-pycode-gate")
    dev_files = {i.dataset for i in dev.items}
    gate_files = {i.dataset for i in gate.items}
    assert len(dev_files) >= 8 and len(gate_files) >= 8
    assert not dev_files & gate_files
    assert dev.hash != gate.hash


def test_cut_points_rule():
    text = "import os\n\nx = 1\ndef f():\n    pass\n    def g(): pass\nclass C:\n    y = 2\n"
    pts = cut_points(text, "def-class-blank")
    starts = [text[p:].split("\n")[0] for p in pts]
    assert starts == ["x = 1", "def f():", "    def g(): pass", "class C:"]
    assert [text[p:].split("\n")[0] for p in cut_points(text, "def-class")] == starts[1:]


def test_jsonl_workload_by_path_and_its_hash(tmp_path, data):
    items = [WorkloadItem("a", "mine", "def f(x):\n"), WorkloadItem("b", "mine", "class A:\n")]
    p = tmp_path / "mine.jsonl"
    write_jsonl(items, p)
    w = load_workload(str(p))
    assert w.name == "mine" and w.items == items and w.hash == items_hash(items)
    write_jsonl(items[:1], p)
    assert load_workload(str(p)).hash != w.hash


def test_bad_workloads_fail_in_one_line(tmp_path, data):
    with pytest.raises(SpecPilotError) as e:
        load_workload("no-such-workload")
    assert "\n" not in str(e.value) and "tiny-pycode-dev" in str(e.value)
    bad = tmp_path / "bad.toml"
    bad.write_text('seed = 1\ncount = 3\nparts = ["dev", "gate"]\npart = "other"\n')
    with pytest.raises(SpecPilotError, match="part"):
        load_workload(str(bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"id": "x"}\n')
    with pytest.raises(SpecPilotError, match="prompt"):
        load_workload(str(empty))


def test_missing_required_keys_are_named(tmp_path, data):
    recipe = tmp_path / "r.toml"
    recipe.write_text('count = 3\nparts = ["dev", "gate"]\n')
    with pytest.raises(SpecPilotError) as e:
        load_workload(str(recipe))
    assert str(e.value) == f"{recipe}: missing required key 'seed'"
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "prompt": "x"}\n{"prompt": "y"}\n')
    with pytest.raises(SpecPilotError) as e:
        load_workload(str(rows))
    assert str(e.value) == f"{rows} line 2: missing required field 'id'"


def test_cli_bad_workload_is_one_line_exit_2(data):
    r = subprocess.run([sys.executable, "-m", "specpilot", "zoo", "eval", "--workload", "nope",
                        "--no-heldout"], check=False, capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: no workload")


def test_unreadable_workloads_fail_in_one_line(tmp_path, data, deny_read):
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x80")
    with pytest.raises(SpecPilotError, match="not a UTF-8 text file"):
        load_workload(str(binary))
    recipe = tmp_path / "r.toml"
    recipe.write_text("seed = 1\ncount = 3\n")
    deny_read(lambda f: f == recipe)
    with pytest.raises(SpecPilotError) as e:
        load_workload(str(recipe))
    assert "cannot read workload recipe" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("limit", [-5, 0])
def test_prompt_limit_below_one_is_an_error(data, limit):
    """`replay --dev-limit -5` ran 27 of 32 prompts; 0 and below are errors, None is all."""
    from specpilot.agents.inputs import load_prompts

    with pytest.raises(SpecPilotError, match=f"must be >= 1, got {limit}"):
        load_prompts("tiny-pycode-dev", None, limit)


def test_binary_jsonl_prompts_for_the_search_fail_in_one_line(tmp_path):
    from specpilot.agents.inputs import load_prompts

    p = tmp_path / "bin.jsonl"
    p.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(SpecPilotError, match="cannot read workload"):
        load_prompts(str(p), None, 4)


def test_cli_bench_binary_workload_is_one_line(tmp_path, data):
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x80")
    r = subprocess.run([sys.executable, "-m", "specpilot", "bench", "--deployment", "tiny-cpu",
                        "--workload", str(binary), "--out", str(tmp_path / "o.json")],
                       check=False, capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**__import__("os").environ, "SPECPILOT_DATA": str(data)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "not a UTF-8 text file" in r.stderr
