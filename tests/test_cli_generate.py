"""`specpilot generate` run as a real subprocess: text, --json, prompts files, and every
bad-input case exits 2 with one line on stderr and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot.runtime.factory import build_engine
from specpilot.runtime.knobs import Knobs
from tests.checkpoints import make_checkpoint

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8", "HF_HUB_OFFLINE": "1",
       "OMP_NUM_THREADS": "1"}


def cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specpilot", *map(str, args)], cwd=ROOT,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            encoding="utf-8")


def run(*args: str) -> subprocess.CompletedProcess:
    p = cli(*args)
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.fixture(scope="module")
def reference(qwen3_dir):
    return build_engine(qwen3_dir, Knobs())


def greedy(reference, prompt: list[int], n: int) -> tuple[list[int], str, str]:
    engine, tok = reference
    g = engine.generate([prompt], n)[0]
    shown = g.output_ids[:-1] if g.finish_reason == "eos" else g.output_ids
    return g.output_ids, g.finish_reason, tok.decode(shown)


def test_text_prompt_prints_the_greedy_text(qwen3_dir, reference):
    prompt = "def add(a, b):\n"
    r = run("generate", "--model", qwen3_dir, "--prompt", prompt, "--max-new-tokens", 12,
            "--threads", 1)
    assert r.returncode == 0, r.stderr
    _, _, text = greedy(reference, reference[1].encode(prompt), 12)
    assert r.stdout == text + "\n"


def test_json_with_draft_model_equals_greedy(qwen3_dir, qwen3_draft_dir, reference):
    r = run("generate", "--model", qwen3_dir, "--drafter", f"draft:{qwen3_draft_dir}",
            "--k", 3, "--input-ids", "5,6,7,8", "--max-new-tokens", 10, "--json")
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    row = json.loads(line)
    ids, reason, text = greedy(reference, [5, 6, 7, 8], 10)
    assert row["prompt_ids"] == [5, 6, 7, 8]
    assert row["output_ids"] == ids and row["finish_reason"] == reason and row["text"] == text
    m = row["metrics"]
    assert m["new_tokens"] == len(ids) and m["prompt_tokens"] == 4
    assert m["verify_steps"] >= 1 and len(m["accept_hist"]) == 4
    assert sum(m["accept_hist"]) == m["verify_steps"]
    assert 0 <= sum((n + 1) * c for n, c in enumerate(m["accept_hist"])) - (len(ids) - 1) <= 3
    assert m["accept_length"] == pytest.approx((len(ids) - 1) / m["verify_steps"])
    assert m["prefill_s"] > 0 and m["decode_s"] > 0


def test_prompts_file_in_batches(qwen3_dir, reference, tmp_path):
    tok = reference[1]
    rows = [{"id": "a", "input_ids": [40, 41, 42]}, {"prompt": "class Point:"},
            {"id": 7, "input_ids": [9, 8, 7, 6, 5]}]
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    r = run("generate", "--model", qwen3_dir, "--drafter", "ngram", "--prompts-file", f,
            "--max-new-tokens", 8, "--ignore-eos", "--batch", 2, "--json")
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [g["id"] for g in got] == ["a", 1, 7]
    engine = reference[0]
    for row, g in zip(rows, got):
        ids = row.get("input_ids") or tok.encode(row["prompt"])
        want = engine.generate([ids], 8, ignore_eos=True)[0]
        assert g["prompt_ids"] == ids and g["output_ids"] == want.output_ids
        assert g["finish_reason"] == "length"


@pytest.mark.parametrize("n, batch, sizes", [(3, 2, (1, 2)), (4, 2, (2,)), (3, None, (3,))])
def test_generate_builds_for_every_batch_size_it_runs(qwen3_dir, monkeypatch, capsys, n,
                                                      batch, sizes):
    """The last batch may be smaller: the engine is built for it too (W12 layers are
    chosen per row count)."""
    from specpilot.runtime import cli_commands, factory

    built = []

    def spy(*args):
        built.append(args[4])
        return build_engine(*args)

    monkeypatch.setattr(factory, "build_engine", spy)
    items = [cli_commands.PromptItem(str(i), f"p{i}", ids=[5 + i, 6]) for i in range(n)]
    spec = cli_commands.EngineSpec(str(qwen3_dir), Knobs(), "cpu", "float32", 2)
    cli_commands.run_generate(spec, items, batch=batch, as_json=True)
    assert built == [sizes] and len(capsys.readouterr().out.splitlines()) == n


@pytest.fixture(scope="module")
def bad_vocab_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("bad_vocab"), "qwen3", seed=3,
                           vocab_size=320, hidden_size=32, num_hidden_layers=1,
                           intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=16)


def bad_cases(qwen3_dir, bad_vocab_dir, d: Path) -> dict[str, list]:
    (d / "broken.jsonl").write_text('{"input_ids": [1, 2]}\n{not json\n')
    (d / "wrong.jsonl").write_text('{"input_ids": "1,2"}\n')
    (d / "empty.jsonl").write_text("\n")
    corrupt = d / "corrupt"
    corrupt.mkdir(exist_ok=True)
    (corrupt / "config.json").write_text("{ nope")
    m = ["generate", "--model", qwen3_dir]
    return {
        # these fail once the model is loaded
        "missing checkpoint": ["generate", "--model", d / "nowhere", "--prompt", "hi"],
        "corrupt checkpoint": ["generate", "--model", corrupt, "--prompt", "hi"],
        "missing drafter dir": [*m, "--prompt", "hi", "--drafter", f"draft:{d}/none"],
        "vocab mismatch": [*m, "--prompt", "hi", "--drafter", f"draft:{bad_vocab_dir}"],
        "prompt too long": [*m, "--input-ids", ",".join(["5"] * 500)],
        "out of vocabulary": [*m, "--input-ids", "1,2,100000"],
        "empty prompt": [*m, "--prompt", ""],
        "bad dtype": [*m, "--prompt", "hi", "--dtype", "float8"],
        # these fail before torch is imported
        "bad drafter kind": [*m, "--prompt", "hi", "--drafter", "magic:x"],
        "bad ids": [*m, "--input-ids", "1,two,3"],
        "both prompts": [*m, "--prompt", "hi", "--input-ids", "1,2"],
        "no prompt": [*m],
        "unreadable file": [*m, "--prompts-file", d / "absent.jsonl"],
        "broken file": [*m, "--prompts-file", d / "broken.jsonl"],
        "wrong field type": [*m, "--prompts-file", d / "wrong.jsonl"],
        "empty file": [*m, "--prompts-file", d / "empty.jsonl"],
        "bad device": [*m, "--prompt", "hi", "--device", "tpu"],
        "unknown deployment": ["generate", "--deployment", "no-such-deployment", "--prompt", "x"],
        "usage: unknown option": [*m, "--prompt", "hi", "--bogus"],
        "usage: bad int": [*m, "--prompt", "hi", "--k", "many"],
    }


# Loading torch costs seconds per process on a 2-core machine: these run through the same
# entry point (specpilot.cli.main) in this process; everything else in a subprocess.
IN_PROCESS = {"missing checkpoint", "corrupt checkpoint", "missing drafter dir",
              "prompt too long", "out of vocabulary", "empty prompt", "bad dtype"}


@pytest.fixture(scope="module")
def cases(qwen3_dir, bad_vocab_dir, tmp_path_factory):
    return bad_cases(qwen3_dir, bad_vocab_dir, tmp_path_factory.mktemp("bad"))


@pytest.fixture(scope="module")
def bad_runs(cases):
    """The subprocess cases, started at once (they are mostly interpreter start-up)."""
    procs = {name: cli(*args) for name, args in cases.items() if name not in IN_PROCESS}
    return {name: (p.wait(timeout=300), *p.communicate()) for name, p in procs.items()}


def run_in_process(args: list, capsys, monkeypatch) -> tuple[int, str, str]:
    from specpilot import cli as cli_module

    monkeypatch.setattr(sys, "argv", ["specpilot", *map(str, args)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli_module.main()
    out, err = capsys.readouterr()
    return exc.value.code, out, err


BAD_CASES = ["missing checkpoint", "corrupt checkpoint", "bad drafter kind",
             "missing drafter dir", "vocab mismatch", "prompt too long", "out of vocabulary",
             "bad ids", "empty prompt", "both prompts", "no prompt", "unreadable file",
             "broken file", "wrong field type", "empty file", "bad dtype", "bad device",
             "unknown deployment"]
WORDS = {"vocab mismatch": "vocabulary", "prompt too long": "context",
         "out of vocabulary": "100000", "empty prompt": "empty", "broken file": "line 2",
         "missing checkpoint": "does not exist", "both prompts": "exactly one",
         "bad dtype": "float8"}


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_exits_2_with_one_line(cases, bad_runs, case, capsys, monkeypatch):
    if case in IN_PROCESS:
        rc, out, err = run_in_process(cases[case], capsys, monkeypatch)
    else:
        rc, out, err = bad_runs[case]
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and out == ""
    assert WORDS.get(case, "") in lines[0]


def test_context_limit_is_prompt_plus_new_tokens(qwen3_dir, reference, capsys, monkeypatch):
    """A 512-position model serves 3 + 509 tokens, with a drafter too (drafts verified past
    the end are never returned), and says what fits when asked for one more."""
    base = ["generate", "--model", qwen3_dir, "--input-ids", "5,6,7", "--ignore-eos", "--json"]
    want = reference[0].generate([[5, 6, 7]], 509, ignore_eos=True)[0].output_ids
    for drafter in ("none", "ngram"):
        rc, out, err = run_in_process([*base, "--max-new-tokens", 509, "--drafter", drafter],
                                      capsys, monkeypatch)
        assert rc in (0, None), err
        assert json.loads(out)["output_ids"] == want
    rc, out, err = run_in_process([*base, "--max-new-tokens", 510, "--drafter", "none"],
                                  capsys, monkeypatch)
    assert rc == 2 and out == ""
    assert err.strip() == ("error: --input-ids: the prompt has 3 tokens and max_new_tokens=510: "
                           "that needs 3 + 510 = 513 positions but the model's context is 512: "
                           "ask for at most 509 new tokens or shorten the prompt")


@pytest.mark.parametrize("case", ["usage: unknown option", "usage: bad int"])
def test_usage_errors_exit_2(bad_runs, case):
    rc, out, err = bad_runs[case]
    assert rc == 2 and "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "generate --help" in lines[0]


def test_deployment_defaults_and_flag_overrides(qwen3_dir, reference, tmp_path, capsys,
                                                monkeypatch):
    """--deployment supplies model, drafter, knobs and max_new_tokens; flags override."""
    dep = tmp_path / "tiny.toml"
    dep.write_text(f'name = "tiny"\ndevice = "cpu"\nmax_new_tokens = 5\n'
                   f'target = {{ path = "{qwen3_dir}" }}\ndrafter = {{ kind = "ngram" }}\n'
                   f'knobs = {{ k = 2 }}\n')
    base = ["generate", "--deployment", dep, "--input-ids", "5,6,7", "--ignore-eos", "--json"]
    want = reference[0].generate([[5, 6, 7]], 7, ignore_eos=True)[0].output_ids
    for extra, n, k in (([], 5, 2), (["--max-new-tokens", 7, "--k", 3], 7, 3)):
        rc, out, err = run_in_process([*base, *extra], capsys, monkeypatch)
        assert rc in (0, None), err
        row = json.loads(out)
        assert row["output_ids"] == want[:n]
        assert len(row["metrics"]["accept_hist"]) == k + 1  # the ngram drafter, k drafts
    rc, out, _ = run_in_process([*base, "--drafter", "none"], capsys, monkeypatch)
    assert len(json.loads(out)["metrics"]["accept_hist"]) == 1  # AR: no drafts
