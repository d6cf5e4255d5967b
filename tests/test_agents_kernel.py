"""The kernel subagent's mechanics on CPU: profile -> pick the worst shapes by gap -> tune
(a fake timer; a config with a bug is rejected) -> a candidate carrying the tuned table and
the W12 switch. One run uses the real Triton kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.agents.candidate import ProposalContext, materialize
from specpilot.agents.checks import check_overlay
from specpilot.agents.kernel import KernelAgent, linear_shapes
from specpilot.engines import EngineSpec, build
from specpilot.kernels.tuning import Problem
from specpilot.kernels.w12_triton import KernelConfig
from specpilot.runtime.knobs import Knobs
from tests.interpret import interpreted

CUBLAS_US = {"o_proj": 50.0, "down_proj": 40.0}  # the two shapes furthest from the bound
CONFIGS = [KernelConfig(bm=4, bn=8, bk=128), KernelConfig(bm=4, bn=16, bk=128),
           KernelConfig(bm=4, bn=8, bk=128, split_k=2)]  # split_k=2: the buggy one


def ctx(**kw) -> ProposalContext:
    base = {"deployment": "t", "device": "cuda", "batch_sizes": [1], "drafters": ["ngram"],
            "round": 0, "best_id": "c004", "best_knobs": Knobs(drafter="ngram", k=3).to_dict(),
            "best_overlay": {}}
    return ProposalContext(**{**base, **kw})


class FakeKernels:
    """CPU stand-ins for cuBLAS / Triton bf16 / W12 and a timer keyed on the last call."""

    def __init__(self, w12_factor: float = 0.6):
        self.last: dict = {}
        self.w12_factor = w12_factor

    def problems(self, s) -> dict[str, Problem]:
        w = torch.randn(s.n, s.k, generator=torch.Generator().manual_seed(s.n * 7 + s.k)) * 0.02

        def make_x(seed: int) -> torch.Tensor:
            return torch.randn(s.m, s.k, generator=torch.Generator().manual_seed(seed))

        def kernel(name: str):
            def call(cfg, x, out):
                self.last = {"kernel": name, "shape": s.name, "cfg": cfg}
                half = s.k // 2 if name == "w12" and cfg.split_k == 2 else s.k  # the bug
                out.copy_(x[:, :half] @ w[:, :half].T)
            return call

        return {k: Problem(k, s.n, s.k, s.m, s.n * s.k * 2, 1, make_x, kernel(k),
                           lambda x: x @ w.T) for k in ("cublas", "bf16", "w12")}

    def timer(self, fn, rotations: int) -> list[float]:
        fn()
        base = CUBLAS_US.get(self.last["shape"], 5.0)
        kern, cfg = self.last["kernel"], self.last["cfg"]
        if kern == "bf16":
            base *= 0.9
        elif kern == "w12":
            base = 0.1 if cfg.split_k == 2 else base * self.w12_factor * (1 + (cfg.bn == 16))
        return [base - 1.0, base, base + 1.0]


def agent(qwen3_dir, fake: FakeKernels, top: int = 2) -> KernelAgent:
    return KernelAgent("bfloat16", target=str(qwen3_dir), gpu="h200", top=top,
                       timer=fake.timer, make_problems=fake.problems,
                       configs_for=lambda b, kern: CONFIGS, device_name="Fake GPU X")


def test_shapes_come_from_the_cost_model(qwen3_dir):
    from specpilot.costmodel.hardware import get_hardware
    from specpilot.costmodel.spec import load_spec

    shapes = linear_shapes(load_spec(qwen3_dir), get_hardware("h200"), [1, 4],
                           Knobs(drafter="ngram", k=3).k_for)
    by = {(s.name, s.batch): s for s in shapes}
    assert by[("qkv_proj", 1)].n == 192 and by[("qkv_proj", 1)].k == 64  # (4 + 2*2) x 24
    assert by[("down_proj", 4)].m == 16 and by[("down_proj", 4)].k == 128
    assert by[("o_proj", 1)].count == 2 and by[("lm_head", 1)].count == 1
    # the bound is bytes over bandwidth: a bigger matrix never has a smaller floor
    assert by[("gate_up_proj", 1)].bound_us > by[("o_proj", 1)].bound_us > 0


def test_tunes_the_worst_shapes_rejects_a_wrong_config_and_proposes_the_table(qwen3_dir):
    fake = FakeKernels()
    cands, notes = agent(qwen3_dir, fake).tune_and_propose(ctx())
    note = notes[0]
    assert note["picked"] == ["o_proj 64x96 m=4", "down_proj 64x128 m=4"]
    gaps = {p["name"]: p["gap_us"] for p in note["profile"]}
    assert gaps["o_proj"] > gaps["down_proj"] > max(v for k, v in gaps.items()
                                                     if k not in CUBLAS_US)
    recs = note["tuning"]
    tuned = [r for r in recs if r["kernel"] != "cublas"]
    assert {(r["n"], r["k"]) for r in tuned} == {(64, 96), (64, 128)}  # only the picked
    assert len(tuned) == 2 * 2 * len(CONFIGS)
    bad = [r for r in tuned if r["config"]["split_k"] == 2 and r["kernel"] == "w12"]
    assert len(bad) == 2 and not any(r["correct"] for r in bad)
    assert all(r["rel_error"] > 0.1 and r["note"] == "wrong result" for r in bad)
    good = [r for r in tuned if r not in bad]
    assert all(r["correct"] and r["rel_error"] < 1e-5 for r in good)
    for r in recs:  # every record: shape, config, median and spread, bandwidth, % of bound
        assert {"n", "k", "batch", "config", "median_us", "spread_us", "tbps",
                "pct_of_bound", "correct"} <= set(r)
        assert r["spread_us"] == pytest.approx(2.0)
    assert note["w12_gain"] == {"o_proj@4": pytest.approx(45 / 30),
                                "down_proj@4": pytest.approx(36 / 24)}

    (cand,) = cands
    assert cand.agent == "kernel" and cand.knobs == {"weights": "w12"}
    assert cand.parents == ("c004",)
    path = "specpilot/kernels/tuned/fake-gpu-x.json"
    table = json.loads(cand.files[path])
    assert table["device"] == "Fake GPU X"
    e = table["entries"]
    # the fastest *correct* config wins; the faster wrong one never reaches the table
    assert e["w12:64x96:b4"]["config"]["bn"] == 8 and e["w12:64x96:b4"]["config"]["split_k"] == 1
    assert e["w12:64x96:b4"]["median_us"] == pytest.approx(30.0)
    assert "w12:192x64:b4" not in e and "cublas:192x64:b4" in e  # profiled, not tuned
    # the candidate passes the static checks and builds
    knobs, overlay = materialize(cand, Knobs(drafter="ngram", k=3), {})
    assert knobs.weights == "w12" and list(overlay) == [path]
    assert check_overlay(overlay) == []
    spec = EngineSpec("t", cand.id or "k", knobs, overlay)
    assert spec.hash != EngineSpec("t", "k", knobs, {}).hash


@pytest.mark.parametrize("on", [True, False])
def test_kernels_are_timed_with_the_best_engines_pdl_knob(qwen3_dir, on):
    """The engine launches its Triton kernels with PDL when its `pdl` knob is on: the
    tuner times them so (the scope the launchers read), and only then."""
    from specpilot.kernels import pdl

    fake = FakeKernels()
    seen = []
    timer = fake.timer
    fake.timer = lambda fn, rotations: (seen.append(pdl._ON[0]), timer(fn, rotations))[1]
    knobs = Knobs(drafter="ngram", k=3, pdl=on).to_dict()
    _, notes = agent(qwen3_dir, fake).tune_and_propose(ctx(best_knobs=knobs))
    assert seen and set(seen) == {on}
    assert notes[0]["pdl"] is on
    assert pdl._ON[0] is False  # the scope ends with the tuning


def test_no_candidate_when_w12_does_not_win(qwen3_dir):
    cands, notes = agent(qwen3_dir, FakeKernels(w12_factor=1.5)).tune_and_propose(ctx())
    assert cands == [] and "not faster" in notes[0]["note"]
    assert notes[0]["tuning"]  # the measurements are still recorded


def test_a_bad_table_is_rejected_by_the_checks(tmp_path):
    path = "specpilot/kernels/tuned/fake-gpu-x.json"
    bad = {"device": "x", "entries": {"w12:64x64:b4": {"config": {"bm": 1, "evil": 1},
                                                        "median_us": 1.0}}}
    assert "not a valid tuned kernel table" in check_overlay({path: json.dumps(bad)})[0]
    assert check_overlay({path: "not json"})
    ok = {"device": "x", "entries": {"w12:64x64:b4": {"config": KernelConfig().to_dict(),
                                                       "median_us": 1.0}}}
    assert check_overlay({path: json.dumps(ok)}) == []
    assert build(EngineSpec("t", "k", Knobs(), {path: json.dumps(ok)}), tmp_path).path.is_dir()


def _interpret_child() -> None:
    """Run under TRITON_INTERPRET=1: tune_kernels with the real Triton kernels."""
    from specpilot.agents.kernel import LinearShape, tune_kernels
    from specpilot.kernels.tuning import TunedTable, linear_problems

    w = (torch.randn(16, 256, generator=torch.Generator().manual_seed(0)) * 0.02)
    w = w.to(torch.bfloat16)
    w[0, 5] = 9.0  # an escape
    shapes = [LinearShape("o_proj", 16, 256, 1, 1, 2, 0.001)]
    fake_us = iter(range(100, 0, -7))

    def timer(fn, rotations):
        fn()
        t = float(next(fake_us))
        return [t, t, t]

    cfgs = [KernelConfig(bm=1, bn=8, bk=128), KernelConfig(bm=1, bn=8, bk=96)]  # 96: no build
    rep = tune_kernels(shapes, timer, lambda s: linear_problems(w, s.m, 1, f32_dot=True),
                       lambda b, kern: cfgs, TunedTable("cpu-interpreter"), top=1)
    print("RESULT " + json.dumps({"records": [r.to_dict() for r in rep.records],
                                  "table": rep.table.entries, "gains": rep.gains}))


def test_tuning_real_kernels_in_the_interpreter():
    res = interpreted("tests.test_agents_kernel", "_interpret_child")
    by = {(r["kernel"], r["config"]["bk"]): r for r in res["records"]}
    assert by[("cublas", 512)]["correct"]
    for kern in ("w12", "bf16"):
        assert by[(kern, 128)]["correct"] and by[(kern, 128)]["rel_error"] < 1e-5
        assert not by[(kern, 96)]["correct"] and by[(kern, 96)]["note"]
    assert set(res["table"]) == {"cublas:16x256:b1", "bf16:16x256:b1", "w12:16x256:b1"}
    assert res["table"]["w12:16x256:b1"]["config"]["bk"] == 128
    assert set(res["gains"]) == {"o_proj@1"}


def test_w12_tunes_on_its_own_grid():
    pytest.importorskip("triton")
    from specpilot.agents.kernel import search_grid
    from specpilot.kernels.tuning import candidate_configs
    from specpilot.kernels.w12_triton import w12_candidates

    for b in (1, 2, 16):
        assert search_grid(b, "w12") == w12_candidates(b)
        assert search_grid(b, "bf16") == candidate_configs(b)
    assert search_grid(1, "w12") != search_grid(1, "bf16")
