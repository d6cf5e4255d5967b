"""Token forcing: honest outputs pass; each planted corruption is caught where it was planted.

Outputs come from the real engine (AR and speculative) on a random HF checkpoint; the
reference is the stock runtime in its own worker process, as in production.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from specpilot.forcing.reference import LocalReference
from specpilot.forcing.verify import verify
from specpilot.runtime.errors import SpecPilotError
from specpilot.runtime.factory import build_engine
from specpilot.runtime.knobs import Knobs

MNT = 10
TEXTS = ["def add(a, b):\n", "class Point:\n    x", "    return a + b\n", "y: int = 0\n",
         "def add(", "class"]


@pytest.fixture(scope="module")
def ref(qwen3_dir):
    with LocalReference(qwen3_dir) as r:
        yield r


@pytest.fixture(scope="module")
def honest(qwen3_dir):
    """Records from the speculative engine (ngram, k=3) and from AR, with finish reasons."""
    recs = []
    for knobs in (Knobs(drafter="ngram", k=3), Knobs()):
        engine, tok = build_engine(qwen3_dir, knobs)
        for g in engine.generate([tok.encode(t) for t in TEXTS], max_new_tokens=MNT):
            recs.append({"id": f"r{len(recs)}", "prompt_ids": g.prompt_ids,
                         "output_ids": g.output_ids, "finish": g.finish_reason})
    return recs


def _pick(recs, finish=None, min_len=6):
    for i, r in enumerate(recs):
        if len(r["output_ids"]) >= min_len and (finish is None or r["finish"] == finish):
            return i
    # the checkpoint and prompts are fixed: a missing case means the fixture changed
    pytest.fail(f"no record with finish={finish} and >= {min_len} tokens from this checkpoint")


def _only(v, request):
    """The failures of the verdict, all of which must belong to `request`."""
    assert not v.passed
    assert {m.request for m in v.mismatches} == {request}
    return v.mismatches


def test_honest_outputs_pass(ref, honest):
    v = verify(honest, ref, max_new_tokens=MNT)
    assert v.passed and not v.mismatches and not v.ties
    assert v.checked == sum(len(r["output_ids"]) for r in honest)
    assert v.margin == 0.0 and v.margin_source == "fp32 on CPU"
    for rv, r in zip(v.per_request, honest):
        assert rv.end == ("eos" if r["finish"] == "eos" else "length")
        assert rv.checked == len(r["output_ids"])
    assert json.loads(json.dumps(v.to_json()))["passed"] is True


def test_changed_token(ref, honest):
    recs = copy.deepcopy(honest)
    i = _pick(recs)
    orig = recs[i]["output_ids"][4]
    recs[i]["output_ids"][4] = (orig + 1) % ref.vocab_size
    m = _only(verify(recs, ref, max_new_tokens=MNT), i)[0]
    assert (m.kind, m.position, m.expected, m.got) == ("token", 4, orig, (orig + 1) % ref.vocab_size)
    assert m.id == recs[i]["id"] and m.margin > 0
    assert m.context  # decoded text before the position


def test_swapped_tokens(ref, honest):
    recs = copy.deepcopy(honest)
    i = next((j for j, r in enumerate(recs) if len(r["output_ids"]) >= 5
              and r["output_ids"][2] != r["output_ids"][3]), None)
    assert i is not None, "no record with two distinct neighbouring tokens (fixture changed?)"
    out = recs[i]["output_ids"]
    a, b = out[2], out[3]
    out[2], out[3] = b, a
    m = _only(verify(recs, ref, max_new_tokens=MNT), i)[0]
    assert (m.kind, m.position, m.expected, m.got) == ("token", 2, a, b)


def test_truncated_output(ref, honest):
    recs = copy.deepcopy(honest)
    i = _pick(recs)
    orig = list(recs[i]["output_ids"])
    recs[i]["output_ids"] = orig[:-3]
    (m,) = _only(verify(recs, ref, max_new_tokens=MNT), i)
    assert (m.kind, m.position, m.expected, m.got) == ("early_stop", len(orig) - 3,
                                                       orig[-3], None)


def test_over_long_output(ref, honest):
    recs = copy.deepcopy(honest)
    i = _pick(recs, finish="length")
    recs[i]["output_ids"] = recs[i]["output_ids"] + [5]
    (m,) = _only(verify(recs, ref, max_new_tokens=MNT), i)
    assert (m.kind, m.position, m.got, m.expected) == ("past_max", MNT, 5, None)


def test_tokens_after_eos(ref, honest):
    recs = copy.deepcopy(honest)
    i = _pick(recs, finish="length")
    eos = ref.eos_ids[0]
    recs[i]["output_ids"][3] = eos
    ms = _only(verify(recs, ref, max_new_tokens=MNT), i)
    assert [(m.kind, m.position) for m in ms if m.kind != "token"] == [("past_eos", 4)]
    assert all(m.position == 3 for m in ms if m.kind == "token")


@pytest.mark.parametrize("bad", [10**6, -1])
def test_out_of_vocab_id(ref, honest, bad):
    recs = copy.deepcopy(honest)
    i = _pick(recs)
    orig = recs[i]["output_ids"][2]
    recs[i]["output_ids"][2] = bad
    (m,) = _only(verify(recs, ref, max_new_tokens=MNT), i)
    assert (m.kind, m.position, m.got, m.expected) == ("oov", 2, bad, orig)


def test_within_margin_is_a_tie(ref, honest):
    recs = copy.deepcopy(honest)
    i = _pick(recs)
    recs[i]["output_ids"][4] = (recs[i]["output_ids"][4] + 1) % ref.vocab_size
    v = verify(recs, ref, max_new_tokens=MNT, margin=1e9)
    assert v.passed and v.ties and v.ties[0].position == 4 and v.ties[0].request == i
    assert v.per_request[i].ties >= 1 and v.margin_source == "given"


def test_without_max_new_tokens_length_is_unchecked(ref, honest):
    recs = copy.deepcopy(honest)
    i = _pick(recs, finish="length")
    recs[i]["output_ids"] = recs[i]["output_ids"][:-2]
    v = verify(recs, ref)
    assert v.passed and v.per_request[i].end == "unchecked" and v.warnings
    recs[i]["max_new_tokens"] = MNT  # a record's own limit is honoured
    assert not verify(recs, ref).passed


@pytest.mark.parametrize("records, msg", [
    ([], "no records"),
    ([{"prompt_ids": [], "output_ids": [1]}], "empty prompt"),
    ([{"prompt_ids": [1, 2]}], "output_ids"),
    ([{"prompt_ids": [1, 10**6], "output_ids": [1]}], "outside the vocabulary"),
    ([{"prompt_ids": [1, 2], "output_ids": [1], "max_new_tokens": "x"}], "max_new_tokens"),
    ([{"prompt_ids": [1, 2], "output_ids": [1], "max_new_tokens": -1}], "max_new_tokens"),
])
def test_bad_input(ref, records, msg):
    with pytest.raises(SpecPilotError, match=msg):
        verify(records, ref)


def test_reference_ignores_candidate_pythonpath(qwen3_dir, honest, tmp_path, monkeypatch):
    """A candidate package first on PYTHONPATH must not become the reference."""
    fake = tmp_path / "build" / "specpilot"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise SystemExit('candidate code ran')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "build"))
    with LocalReference(qwen3_dir) as r:
        assert verify(honest[:2], r, max_new_tokens=MNT).passed
        assert "build" not in r.package


def _cli(*args, env=None):
    return subprocess.run(check=False, args=[sys.executable, "-m", "specpilot", "verify", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_cli_exit_codes(qwen3_dir, honest, tmp_path, ref):
    bad = tmp_path / "bad.jsonl"
    recs = copy.deepcopy(honest)
    i = _pick(recs)
    recs[i]["output_ids"][1] = (recs[i]["output_ids"][1] + 1) % 300
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert verify(honest, ref, max_new_tokens=MNT).passed  # the same records, in-process
    r = _cli("--model", str(qwen3_dir), "--outputs", str(bad), "--max-new-tokens", str(MNT),
             "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert not out["passed"] and out["checked"] > 0 and out["ties"] == []
    first = out["mismatches"][0]
    assert (first["request"], first["position"], first["id"]) == (i, 1, recs[i]["id"])
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    r = _cli("--model", str(qwen3_dir), "--outputs", str(tmp_path / "junk.jsonl"))
    assert r.returncode == 2 and "not valid JSON" in r.stderr


def test_cli_model_that_is_a_file(tmp_path, honest):
    recs = tmp_path / "honest.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in honest))
    for model in (recs, tmp_path / "none"):
        r = _cli("--model", str(model), "--outputs", str(recs))
        assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip() == (f"error: checkpoint directory {tmp_path / 'none'} does not "
                                "exist: give --model the stock target's HF checkpoint")
    r = _cli("--model", str(recs), "--outputs", str(recs))
    assert r.stderr.strip() == (f"error: {recs} is a file, not a checkpoint directory: give "
                                "--model the stock target's HF checkpoint")


def test_cli_relative_model_is_the_callers(qwen3_dir, honest, tmp_path):
    """--model given relative to the caller's directory names that checkpoint, not one
    relative to the reference worker's (the stock root)."""
    (tmp_path / "ck").symlink_to(qwen3_dir, target_is_directory=True)
    recs = tmp_path / "honest.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in honest))
    r = subprocess.run(check=False, args=[sys.executable, "-m", "specpilot", "verify", "--model",
                                          "ck", "--outputs", "honest.jsonl", "--max-new-tokens",
                                          str(MNT), "--json"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["passed"]


@pytest.mark.parametrize("args, needle", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--tie-margin", "-1"], "--tie-margin must be >= 0"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--dtype", "int8"], "unknown dtype 'int8'"),
])
def test_cli_bad_options_are_input_errors(qwen3_dir, honest, tmp_path, args, needle):
    """A bad option is exit 2 with one line, never a FAILED verdict."""
    recs = tmp_path / "honest.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in honest))
    r = _cli("--model", str(qwen3_dir), "--outputs", str(recs), *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("content, needle", [
    (b"\xff\xfe\x00binary", "cannot read outputs file"),
    (b'{"requests": 5}', "not a bench result"),
    (b'{"requests": [], "settings": 3}', "not a bench result"),
])
def test_cli_damaged_outputs_file(qwen3_dir, tmp_path, content, needle):
    f = tmp_path / "out.json"
    f.write_bytes(content)
    r = _cli("--model", str(qwen3_dir), "--outputs", str(f))
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_damaged_calibration_file_is_a_clear_error(qwen3_dir, tmp_path, monkeypatch):
    from specpilot.forcing.calibrate import calibration_path, tie_margin

    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path))
    path = calibration_path("cpu", "bfloat16")
    path.parent.mkdir(parents=True)
    for text in ("{not json", '{"diffs": {}}'):
        path.write_text(text)
        with LocalReference(qwen3_dir, "cpu", "bfloat16") as r, \
                pytest.raises(SpecPilotError, match="damaged: delete it"):
            tie_margin(r)


def _key(v):
    return (v.passed, v.checked, [(m.request, m.position, m.kind, m.expected, m.got)
                                  for m in v.mismatches + v.ties])


def test_server_mode_gives_the_local_verdict(ref, honest, qwen3_dir):
    """The same records checked over SGLang's /generate (the native server) and locally."""
    from specpilot.forcing.reference import ServerReference
    from specpilot.runtime.server import start_server

    recs = copy.deepcopy(honest)
    i = _pick(recs)
    recs[i]["output_ids"][3] = (recs[i]["output_ids"][3] + 7) % ref.vocab_size
    j = _pick(recs, finish="length")
    recs[j]["output_ids"] = recs[j]["output_ids"][:-1] if j != i else recs[j]["output_ids"]
    recs.append({"prompt_ids": honest[0]["prompt_ids"], "output_ids": [1, 10**6, 2]})
    engine, tok = build_engine(qwen3_dir, Knobs())
    with start_server(engine, tok, port=0, model_path=str(qwen3_dir)) as h:
        server = ServerReference(h.url, model_dir=qwen3_dir)
        for records in (honest, recs):
            remote = verify(records, server, max_new_tokens=MNT)
            local = verify(records, ref, max_new_tokens=MNT)
            assert _key(remote) == _key(local)
            for a, b in zip(remote.mismatches, local.mismatches):
                if a.margin is not None:  # log-prob and logit differences agree
                    assert a.margin == pytest.approx(b.margin, abs=1e-3)
    assert not remote.passed and remote.mismatches[0].request == i


def test_calibrate_stores_a_margin_per_device_and_dtype(qwen3_dir, tmp_path, monkeypatch):
    from specpilot.forcing.calibrate import calibrate, calibration_path, tie_margin

    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path))
    rec = calibrate(str(qwen3_dir), "cpu", "bfloat16", n=3, length=24)
    path = calibration_path("cpu", "bfloat16")
    assert rec["path"] == str(path) and path.is_file()
    stored = json.loads(path.read_text())
    # bf16 logits from token-by-token cached decoding differ from the one-pass logits
    assert stored["diffs"]["incremental"] > 0 and stored["max_abs_diff"] >= stored["diffs"]["batched"]
    assert stored["margin"] == pytest.approx(stored["factor"] * stored["max_abs_diff"])
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    with LocalReference(qwen3_dir, "cpu", "bfloat16") as r:
        assert tie_margin(r) == (stored["margin"], str(path))
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "empty"))
    with LocalReference(qwen3_dir, "cpu", "bfloat16") as r:
        margin, source = tie_margin(r)
    assert margin == 0.0 and source.startswith("uncalibrated")
