"""The search's evaluation runs on the bench module: the worker calls `run_bench` per batch
size, results become per-request units, and speedups are `bench.stats`' paired bootstrap."""

from __future__ import annotations

import pytest

from specpilot.agents.evaluate import EvalResult, dev_records, speedup
from specpilot.runtime.knobs import Knobs

PROMPTS = [[5, 9, 12, 30, 7], [40, 41, 3], [8, 8, 8, 8, 21, 22]]


@pytest.fixture(scope="module")
def raw(qwen3_dir):
    from specpilot.agents.worker import run

    return run({"target": str(qwen3_dir), "device": "cpu", "dtype": "float32",
                "knobs": Knobs(drafter="ngram", k=2).to_dict(), "batch_sizes": [1, 2],
                "max_new_tokens": 6, "prompts": PROMPTS, "repeats": 2,
                "gate_prompts": PROMPTS[:1]})


def test_worker_benches_every_batch_size_with_run_bench(raw):
    assert raw["ok"] and set(raw["bench"]) == {"1", "2"}
    for b, res in raw["bench"].items():
        assert res["format"] == "specpilot.bench/1"
        assert res["settings"]["batch"] == int(b) and res["settings"]["repeats"] == 2
        assert [q["prompt_ids"] for q in res["requests"]] == PROMPTS
        assert all(len(q["timings"]) == 2 and q["time_s"] > 0 for q in res["requests"])
    assert sum(raw["accept_hist"]) > 0  # counted from the engine's own generations
    (gate,) = raw["gate_outputs"]
    assert gate["prompt_ids"] == PROMPTS[0] and 1 <= len(gate["output_ids"]) <= 6


def test_units_and_speedups(raw):
    res = EvalResult("c", "h", ok=True)
    for b in (1, 2):
        res.add_bench(b, raw["bench"][str(b)])
    assert res.batch == [1, 1, 1, 2, 2, 2]
    assert res.tokens == [q["new_tokens"] for b in ("1", "2") for q in raw["bench"][b]["requests"]]
    by = res.tok_s_by_batch()
    assert set(by) == {1, 2} and res.tok_s == pytest.approx(sum(res.tokens) / sum(res.time_s))
    assert 1.0 <= res.accept_length <= 3.0  # k=2: at most 3 tokens a step
    recs = dev_records(raw["bench"])
    assert 3 <= len(recs) <= 6
    assert {tuple(r["prompt_ids"]) for r in recs} == set(map(tuple, PROMPTS))

    ratio, (lo, hi) = speedup(res, res)
    assert ratio == pytest.approx(1.0) and lo <= 1.0 <= hi
    slow = EvalResult("s", "h2", ok=True, time_s=[2 * t for t in res.time_s],
                      tokens=list(res.tokens), steps=list(res.steps), batch=list(res.batch))
    ratio, (lo, hi) = speedup(res, slow)  # slow vs res as base: half the throughput
    assert ratio == pytest.approx(0.5) and hi < 1.0
    assert speedup(slow, res)[1][0] > 1.0
    with pytest.raises(ValueError):
        speedup(res, EvalResult("x", "h3", ok=True, time_s=[1.0], tokens=[1]))


def test_worker_times_the_drafter_on_cpu(raw):
    split = raw["split"]
    assert 0 < split["draft_s"] < split["generate_s"]


def test_cost_model_splits_the_step_into_draft_and_verify():
    from specpilot.agents.inputs import cost_model
    from specpilot.deployment import load_deployment

    dep = load_deployment("tiny-cpu")
    measured = {"stock_accept_length": 2.5, "stock_tok_s_by_batch": {1: 200.0, 4: 400.0},
                "stock_accept_hist": [10, 5, 5, 5, 5]}
    for frac, draft, verify in ((0.25, 1.25, 3.75), (None, 0.0, 5.0)):
        gaps, _, floor = cost_model(dep, {**measured, "stock_draft_fraction": frac})
        by = {g["name"]: g for g in gaps}
        assert by["draft"]["measured_ms"] == pytest.approx(draft)  # 5 ms/token at 200 tok/s
        assert by["verify"]["measured_ms"] == pytest.approx(verify)
        assert 0 < floor < 1 / 200
