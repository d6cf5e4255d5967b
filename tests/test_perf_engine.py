"""The device-side accept/commit loop against a plain host-side reference loop (the engine as
it was before: host reads every step), for AR and every drafter, ragged, with EOS and
max_new_tokens cuts; the one-step-late flag reads of the GPU path emulated on the CPU; fused
projections; bucketed attention; knobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specpilot.runtime.cuda_graphs import AsyncFlags, StepGraphs
from specpilot.runtime.drafters.ngram import NgramDrafter
from specpilot.runtime.drafters.oracle import OracleDrafter
from specpilot.runtime.errors import SpecPilotError
from specpilot.runtime.factory import build_engine, load_drafter
from specpilot.runtime.generate import Engine
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.loader import load_model
from specpilot.runtime.random_model import random_transformer
from tests.checkpoints import make_block_drafter

ROOT = Path(__file__).resolve().parents[1]


@torch.inference_mode()
def reference_generate(target, drafter, k, prompts, max_new, eos):
    """The host-driven loop: exact kv_len, finished rows frozen, cuts applied every step."""
    B = len(prompts)
    lens = [len(p) for p in prompts]
    T = max(lens)
    S = T + max_new + 2 * k + 2
    target.setup_cache(B, S)
    S = target.max_seq_len
    if drafter is not None:
        drafter.setup(B, S)
    layers = drafter.hidden_layers if drafter is not None else ()
    inp = torch.zeros(B, T, dtype=torch.long)
    pos = torch.full((B, T), S - 1, dtype=torch.long)
    for b, p in enumerate(prompts):
        inp[b, T - len(p):] = torch.tensor(p)
        pos[b, T - len(p):] = torch.arange(len(p))
    logits, hidden = target(inp, pos, hidden_layers=layers, last_only=True)
    first = logits[:, -1].argmax(-1)
    tokens = torch.zeros(B, S, dtype=torch.long)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = torch.tensor(p)
        tokens[b, len(p)] = first[b]
    if drafter is not None:
        drafter.prefill(prompts, None if hidden is None else
                        [hidden[b, T - n:] for b, n in enumerate(lens)])
    outs = [[t] for t in first.tolist()]
    fin = [t in eos or max_new <= 1 for t in first.tolist()]
    L = [n + 1 for n in lens]
    ar = torch.arange(k + 1)
    while not all(fin):
        lengths = torch.tensor(L)
        start = lengths - 1
        x = tokens.gather(1, start[:, None])
        if k:
            drafts = drafter.propose(tokens, lengths, k)
            x = torch.cat([x, drafts], 1)
        logits, hidden = target(x, start[:, None] + ar, hidden_layers=layers, kv_len=max(L) + k)
        pred = logits.argmax(-1)
        n_acc = (drafts == pred[:, :k]).long().cumprod(1).sum(1) if k else torch.zeros(B).long()
        tokens.scatter_(1, lengths[:, None] + ar, pred)
        if drafter is not None:
            drafter.accept(start, n_acc, hidden)
        for b in range(B):
            if fin[b]:
                continue
            new = pred[b, :int(n_acc[b]) + 1].tolist()
            new = new[:max_new - len(outs[b])]
            for j, t in enumerate(new):
                if t in eos:
                    new = new[:j + 1]
                    break
            outs[b] += new
            L[b] += len(new)
            fin[b] = len(outs[b]) >= max_new or outs[b][-1] in eos
    return outs


@pytest.fixture(scope="module")
def target():
    return random_transformer("tiny", "cpu", "float32", seed=3, head_std=0.5)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 23, 11, 2)]


def drafters(target, tmp_path_factory):
    return {
        "ar": None,
        "ngram": NgramDrafter(3, 1),
        "oracle": OracleDrafter(target, 0.7),
    }


@pytest.mark.parametrize("lag", [0, 1])
@pytest.mark.parametrize("kind", ["ar", "ngram", "oracle"])
def test_matches_host_loop_with_eos_and_length(target, prompts, kind, lag, tmp_path_factory):
    d = drafters(target, tmp_path_factory)[kind]
    k = 0 if d is None else 3
    free = Engine(target).generate(prompts, 30, ignore_eos=True)
    # an EOS id the AR outputs hit mid-way in some rows, not in others
    eos = (free[1].output_ids[9],)
    eng = Engine(target, d, k=max(k, 1), eos_ids=eos)
    eng.lag = lag
    got = eng.generate(prompts, 24)
    want = reference_generate(target, d, k, prompts, 24, set(eos))
    assert [g.output_ids for g in got] == want
    assert any(g.finish_reason == "eos" for g in got)
    assert any(g.finish_reason == "length" for g in got)
    for g in got:
        m = g.metrics
        assert sum(m.accept_hist) == m.verify_steps
        if m.verify_steps:
            assert abs(m.accept_length * m.verify_steps - (m.new_tokens - 1)) < 1e-9


def test_draft_and_block_drafters_match_host_loop(qwen3_dir, qwen3_draft_dir, tmp_path):
    target = load_model(qwen3_dir)
    block = make_block_drafter(tmp_path / "block", qwen3_dir, block_size=5)
    g = torch.Generator().manual_seed(2)
    ps = [torch.randint(1, 280, (n,), generator=g).tolist() for n in (4, 15, 9)]
    for spec in (f"draft:{qwen3_draft_dir}", f"block:{block}"):
        for lag in (0, 1):
            d = load_drafter(spec, target, Knobs(), "cpu", torch.float32)
            eng = Engine(target, d, k=3)
            eng.lag = lag
            got = [x.output_ids for x in eng.generate(ps, 20, ignore_eos=True)]
            d2 = load_drafter(spec, target, Knobs(), "cpu", torch.float32)
            assert got == reference_generate(target, d2, 3, ps, 20, set()), (spec, lag)


def test_max_new_tokens_one_and_eos_first(target, prompts):
    first = Engine(target).generate(prompts, 1)
    assert all(len(g.output_ids) == 1 and g.metrics.verify_steps == 0 for g in first)
    eng = Engine(target, OracleDrafter(target, 0.9), k=4, eos_ids=(first[0].output_ids[0],))
    g = eng.generate(prompts, 10)
    assert g[0].output_ids == first[0].output_ids and g[0].finish_reason == "eos"
    assert all(len(x.output_ids) == 10 or x.finish_reason == "eos" for x in g)


def test_fused_projections_same_function(target, prompts):
    fused = random_transformer("tiny", "cpu", "float32", seed=3, head_std=0.5, fused=True)
    assert fused.fused and not hasattr(fused.model.layers[0].self_attn, "q_proj")
    assert isinstance(fused.model.layers[0].mlp.gate_up_proj, torch.nn.Linear)
    ids = torch.tensor([prompts[1]])
    pos = torch.arange(ids.shape[1])[None]
    a, _ = target(ids, pos, use_cache=False)
    b, _ = fused(ids, pos, use_cache=False)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    want = [g.output_ids for g in Engine(target).generate(prompts, 20, ignore_eos=True)]
    assert [g.output_ids for g in Engine(fused).generate(prompts, 20, ignore_eos=True)] == want


@pytest.mark.parametrize("fused", [False, True])
def test_bucketed_prefix_equals_exact_ragged(fused):
    """Attending to a longer (bucketed) prefix than needed changes nothing: stale slots past
    each row's position are masked, for rows at different positions."""
    m = random_transformer("tiny", "cpu", "float32", seed=4, fused=fused)
    m.setup_cache(2, 256)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512, (2, 40), generator=g)
    m(ids, torch.arange(40)[None].expand(2, 40))  # fill both rows to 40
    x = torch.randint(0, 512, (2, 3), generator=g)
    pos = torch.tensor([[10, 11, 12], [30, 31, 32]])  # row 0 lags: slots 13..39 are stale
    exact, _ = m(x, pos, kv_len=33)
    bucket, _ = m(x, pos, kv_len=256)
    assert torch.allclose(exact, bucket, atol=1e-5)
    fresh = random_transformer("tiny", "cpu", "float32", seed=4, fused=fused)
    fresh.setup_cache(1, 64)
    fresh(ids[:1, :10], torch.arange(10)[None])
    alone, _ = fresh(x[:1], pos[:1], kv_len=13)
    assert torch.allclose(alone[0], exact[0], atol=1e-5)


def test_cache_grows_only_and_bumps_version(target):
    target.setup_cache(4, 300)
    v = target.cache_version
    target.setup_cache(2, 100)
    assert (target.batch_size, target.max_seq_len, target.cache_version) == (4, 300, v)
    target.setup_cache(2, 400)
    assert (target.batch_size, target.max_seq_len, target.cache_version) == (4, 400, v + 1)


def test_async_flags_lag_one_on_cpu():
    f = AsyncFlags(torch.device("cpu"), 2, lag=1)
    t = torch.tensor([0, 5])
    f.push(t)
    assert f.pop() is None and f.unread() == 1
    t[:] = torch.tensor([1, 9])
    f.push(t)
    assert f.pop() == [0, 5] and f.unread() == 1
    g = StepGraphs("cpu")
    assert not g.enabled and g.run("k", lambda: 3) == 3 and g.stats.eager == 1


def test_knobs_and_random_target_engine():
    k = Knobs.from_dict({"drafter": "oracle:alpha=0.9,draft=none", "cuda_graphs": False,
                         "kv_bucket": 512})
    assert k.kv_bucket == 512 and not k.cuda_graphs
    with pytest.raises(SpecPilotError):
        Knobs.from_dict({"kv_bucket": 100})
    with pytest.raises(SpecPilotError):
        Knobs.from_dict({"drafter": "magic"})
    eng, tok = build_engine("random:tiny", Knobs(drafter="oracle:alpha=0.9", k=3), "cpu",
                            "float32")
    assert tok is None and isinstance(eng.drafter, OracleDrafter) and eng.drafter.alpha == 0.9
    out = eng.generate([[1, 2, 3]], 12, ignore_eos=True)[0]
    assert out.output_ids == Engine(eng.target).generate([[1, 2, 3]], 12,
                                                         ignore_eos=True)[0].output_ids


def test_gpu_perf_smoke_runs_on_cpu(tmp_path):
    """The one-device-call script's code paths, on a tiny model on the CPU."""
    r = subprocess.run([sys.executable, "benchmarks/gpu_perf.py", "--smoke", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"}, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "verdict: PASS" in r.stdout and (tmp_path / "gpu_perf.json").is_file()


def test_w12_e2e_smoke_writes_its_report_into_a_new_folder(tmp_path):
    """benchmarks/w12_e2e.py's code paths on the CPU, its --out folder made before the run
    (a missing one used to fail only when the report was written, after the runs)."""
    out = tmp_path / "new" / "dir"
    r = subprocess.run([sys.executable, "benchmarks/w12_e2e.py", "--smoke", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"}, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "verdict: PASS" in r.stdout
    assert json.loads((out / "w12_e2e.json").read_text())["rows"]
    assert [p.name for p in out.iterdir()] == ["w12_e2e.json"]  # no temporary left


def test_gpu_perf_spec_at_one_k_and_its_bad_flags(tmp_path):
    """--k runs every spec row at that k (the oracle's outputs still token-forced: no
    failures); a k out of range and W12 weights with the verify sweep are one-line refusals."""
    def run(*args):
        return subprocess.run([sys.executable, "benchmarks/gpu_perf.py", "--smoke", "--out",
                               str(tmp_path), *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
                              check=False)
    r = run("--sections", "spec", "--k", "3")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu_perf.json").read_text())["tiny"]["spec"]
    assert rows and {row["k"] for row in rows} == {3}
    assert {row["alpha"] for row in rows if row["draft"] == "none"} == {0.8, 1.0}
    assert all(row["failures"] == 0 for row in rows)
    for args, msg in ((("--k", "17"), "--k must be 1..16"),
                      (("--weights", "w12", "--sections", "ar,verify"), "leave verify out")):
        r = run(*args)
        assert r.returncode == 2 and msg in r.stdout.strip().splitlines()[-1], r.stdout
        assert "Traceback" not in r.stderr
