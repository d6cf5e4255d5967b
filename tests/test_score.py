"""Score: \\boxed{} answers and code tests in the sandbox; the sandbox's limits hold."""

from __future__ import annotations

import json
import socket
import time

import pytest

from specpilot.bench.sandbox import run_python
from specpilot.bench.score import compare_score, last_boxed, score_request
from specpilot.bench.workloads import load_workload
from specpilot.runtime.errors import SpecPilotError


def test_sandbox_kills_an_infinite_loop():
    t0 = time.monotonic()
    r = run_python("while True:\n    pass\n", timeout=2)
    assert not r.ok and r.returncode != 0
    assert time.monotonic() - t0 < 8


def test_sandbox_cannot_write_outside_its_dir(tmp_path):
    target = tmp_path / "escaped.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')",
                 f"import os; os.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))",
                 f"import shutil; shutil.copyfile(__file__, {str(target)!r})",
                 f"import os; os.system('touch {target}')",
                 f"import subprocess; subprocess.run(check=False, args=['touch', {str(target)!r}])"):
        r = run_python(code, timeout=10)
        assert not r.ok and "sandbox" in r.stderr, code
        assert not target.exists(), code


def test_sandbox_can_work_in_its_dir_and_sees_no_secrets(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    r = run_python("import os\nopen('out.txt', 'w').write('hi')\nos.mkdir('sub')\n"
                   "print(open('out.txt').read(), os.environ.get('ANTHROPIC_API_KEY'),"
                   " os.getcwd() == os.environ['HOME'])\n")
    assert r.ok, r.stderr
    assert r.stdout.split() == ["hi", "None", "True"]


def test_sandbox_has_no_network():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = run_python(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), 2)\n"
                       "print('connected')\n", timeout=10)
    finally:
        srv.close()
    assert not r.ok and "connected" not in r.stdout


def test_sandbox_memory_limit():
    r = run_python("x = bytearray(2 * 1024 ** 3)\n", memory_mb=256)
    assert not r.ok and "MemoryError" in r.stderr


def test_last_boxed():
    assert last_boxed(r"so \boxed{1} then \boxed{\frac{3}{4}} done") == r"\frac{3}{4}"
    assert last_boxed(r"\boxed{unclosed") is None and last_boxed("none") is None


def _bench(items, outputs, h="h" * 64):
    reqs = [{"id": it.id, "dataset": it.dataset, "prompt": it.prompt,
             "reference": it.reference, "output_text": out, "prompt_ids": [1],
             "output_ids": [1], "new_tokens": 1, "time_s": 1.0}
            for it, out in zip(items, outputs)]
    return {"settings": {"workload": {"name": "score-sanity", "hash": h}}, "requests": reqs}


def test_compare_score_on_the_sanity_workload():
    wl = load_workload("score-sanity")
    assert all(isinstance(it.reference, dict) for it in wl.items)
    good = {"math-1": r"6*7 = \boxed{42}.", "math-2": r"\boxed{0.750}",
            "math-3": r"\boxed{\frac{3}{4}}",
            "code-1": "    return a + b\n",
            "code-2": "```python\ndef is_even(n):\n    return n % 2 == 0\n```",
            "code-3": "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                      "    return a\n"}
    bad = dict(good, **{"math-1": r"\boxed{41}", "math-3": "3/4 without a box",
                        "code-1": "    return a - b\n",
                        "code-3": "    while True:\n        pass\n"})
    final = _bench(wl.items, [good[it.id] for it in wl.items], wl.hash)
    stock = _bench(wl.items, [bad[it.id] for it in wl.items], wl.hash)
    c = compare_score(final, stock, timeout=2)
    assert c["per_dataset"]["math"]["final"]["correct"] == 3
    assert c["per_dataset"]["math"]["stock"]["correct"] == 1
    assert c["per_dataset"]["code"]["final"]["correct"] == 3
    assert c["per_dataset"]["code"]["stock"]["correct"] == 1
    assert c["per_dataset"]["code"]["difference"] == pytest.approx(2 / 3)
    assert c["items_that_differ"] == ["code-1", "code-3", "math-1", "math-3"]
    assert c["stock_items"]["code-3"]["why"] == "timed out"
    json.dumps(c)
    with pytest.raises(SpecPilotError, match="different workloads"):
        compare_score(final, _bench(wl.items, [""] * len(wl.items), "z" * 64))


def test_continuation_reference_scores_the_next_line():
    q = {"reference": "\n    return x\nmore", "output_text": "    return x  \n"}
    assert score_request(q)["correct"] and score_request(q)["kind"] == "next-line"
    assert not score_request({**q, "output_text": "pass"})["correct"]
    assert score_request({"output_text": "x"}) is None
