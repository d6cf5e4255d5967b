"""GPU checks of the fast engine (skipped without CUDA): CUDA-graph replays give the same
tokens as eager steps; speculative output equals greedy under tie-aware token forcing;
ragged batches match their rows run alone (tie-aware)."""

from __future__ import annotations

import pytest
import torch

from specpilot.runtime.config import ModelConfig
from specpilot.runtime.drafters.ngram import NgramDrafter
from specpilot.runtime.drafters.oracle import OracleDrafter
from specpilot.runtime.generate import Engine
from specpilot.runtime.random_model import random_transformer

pytestmark = pytest.mark.gpu

CFG = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536,
                  num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                  max_position_embeddings=4096)


@pytest.fixture(scope="module")
def models():
    stock = random_transformer(CFG, "cuda", "bfloat16", seed=1, std=0.05)
    fused = random_transformer(CFG, "cuda", "bfloat16", seed=1, std=0.05, fused=True)
    return stock, fused


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in (9, 40, 23, 3)]


def outs(engine, prompts, n=48):
    return [g.output_ids for g in engine.generate(prompts, n, ignore_eos=True)]


def forced_failures(stock, prompts, outputs, model=None):
    """Tie-aware token forcing against the stock model; the tie margin is the stock model's
    own (twice its shape noise, at least two bf16 steps at its largest logit), never
    widened by the engine under test (`model` is accepted for the callers' symmetry)."""
    from benchmarks.gpu_perf import force, tie_margin

    rows = [p + o for p, o in zip(prompts, outputs)]
    margin = tie_margin(stock, rows)
    return force(stock, prompts, outputs, margin)


def test_graph_equals_eager(models, prompts):
    _, fused = models
    eng = Engine(fused)
    a = outs(eng, prompts)
    assert eng.graph_stats.captures >= 1 and eng.graph_stats.replays > 10
    assert a == outs(Engine(fused, cuda_graphs=False), prompts)
    rec = {tuple(p): o for p, o in zip(prompts, a)}
    g = outs(Engine(fused, OracleDrafter(fused, 0.8, records=rec), k=4), prompts)
    e = outs(Engine(fused, OracleDrafter(fused, 0.8, records=rec), k=4, cuda_graphs=False),
             prompts)
    assert g == e


def test_spec_equals_greedy_tie_aware(models, prompts):
    stock, fused = models
    ar = outs(Engine(fused), prompts)
    rec = {tuple(p): o for p, o in zip(prompts, ar)}
    for d in (OracleDrafter(fused, 0.8, records=rec), NgramDrafter(3, 1)):
        r = forced_failures(stock, prompts, outs(Engine(fused, d, k=4), prompts), fused)
        assert r["failures"] == 0, r
    assert forced_failures(stock, prompts, ar, fused)["failures"] == 0


def test_ragged_batch_rows_alone(models, prompts):
    stock, fused = models
    batched = outs(Engine(fused), prompts)
    alone = [outs(Engine(fused), [p])[0] for p in prompts]
    same = sum(a == b for a, b in zip(batched, alone))
    if same < len(prompts):
        assert forced_failures(stock, prompts, alone, fused)["failures"] == 0


@pytest.mark.parametrize("k,bucket", [(4, 256), (8, 256), (4, 64)])
def test_oracle_tracks_the_graph_engine(models, prompts, k, bucket):
    """bf16, CUDA graphs: the oracle records on the spec engine's own path, so at alpha = 1
    every verify step accepts all k drafts (also across KV buckets: bucket 64
    with 96 new tokens), its output equals its records and passes tie-aware forcing."""
    stock, fused = models
    ora = OracleDrafter(fused, 1.0)
    eng = Engine(fused, ora, k=k, kv_bucket=bucket)
    gens = eng.generate(prompts, 96, ignore_eos=True)
    got = [g.output_ids for g in gens]
    assert got == [ora.records[tuple(p)][:96] for p in prompts]
    for g in gens:
        h, n = g.metrics.accept_hist, g.metrics.verify_steps
        assert h[k] == n, (k, bucket, h)
    r = forced_failures(stock, prompts, got, fused)
    assert r["failures"] == 0, r
    ora.alpha = 0.8  # the warm graphs follow the device-side alpha
    gens = eng.generate(prompts, 96, ignore_eos=True)
    assert [g.output_ids for g in gens] == got
    acc = judged = 0
    for g in gens:
        for n, c in enumerate(g.metrics.accept_hist):
            acc += n * c
            judged += c * (n + (n < k))
    assert abs(acc / judged - 0.8) < 0.08, acc / judged
    ora.alpha = 0.0
    gens = eng.generate(prompts, 96, ignore_eos=True)
    assert [g.output_ids for g in gens] == got
    assert all(g.metrics.accept_hist[0] == g.metrics.verify_steps for g in gens)


def test_oracle_draft_cost_graphed_and_eager(models, prompts):
    """The draft-cost model's steps inside the step graph or eager: same tokens."""
    _, fused = models
    draft = random_transformer(CFG, "cuda", "bfloat16", seed=7, std=0.05, fused=True)
    out = {}
    for dg in (True, False):
        ora = OracleDrafter(fused, 1.0, draft_model=draft, draft_graphs=dg)
        eng = Engine(fused, ora, k=4)
        gens = eng.generate(prompts, 48, ignore_eos=True)
        out[dg] = [g.output_ids for g in gens]
        assert out[dg] == [ora.records[tuple(p)][:48] for p in prompts]
        assert all(g.metrics.accept_hist[4] == g.metrics.verify_steps for g in gens)
        assert eng.graph_stats.replays > 0
    assert out[True] == out[False]


def test_draft_model_drafter_in_step_graph(models, prompts):
    """DraftModelDrafter is captured in the step graph: a draft model with the target's own
    weights drafts (nearly) the target's tokens; graphed and eager drafting give the same
    tokens, which pass tie-aware forcing."""
    from specpilot.runtime.drafters.draft_model import DraftModelDrafter

    stock, fused = models
    twin = random_transformer(CFG, "cuda", "bfloat16", seed=1, std=0.05, fused=True)
    out = {}
    for graphed in (True, False):
        d = DraftModelDrafter(twin)
        d.graph_safe = graphed
        eng = Engine(fused, d, k=4)
        gens = eng.generate(prompts, 48, ignore_eos=True)
        out[graphed] = [g.output_ids for g in gens]
        acc = sum(g.metrics.accept_length for g in gens) / len(gens)
        assert acc > 4.0, acc  # k + 1 = 5 when every draft matches
    assert out[True] == out[False]
    r = forced_failures(stock, prompts, out[True], fused)
    assert r["failures"] == 0, r


@pytest.mark.parametrize("drafter", ["oracle", "ngram", None])
def test_stop_rules_with_graphs_and_late_flags(models, prompts, drafter):
    """Stop rules on the CUDA-graph engine (flags read a step late): each row ends where
    its rule says, a row without one runs on unchanged, decoding stops once all have ended,
    and the metrics count the steps that returned tokens."""
    _, fused = models
    d = {"oracle": lambda: OracleDrafter(fused, 0.8), "ngram": lambda: NgramDrafter(3, 1),
         None: lambda: None}[drafter]()
    eng = Engine(fused, d, k=4)
    full = eng.generate(prompts, 96, ignore_eos=True)
    steps = []
    step = eng._step
    eng._step = lambda *a: (steps.append(1), step(*a))[1]
    stop_id = full[0].output_ids[9]
    at = full[0].output_ids.index(stop_id) + 1

    def on_id(ids):
        return ids.index(stop_id) + 1 if stop_id in ids else None

    def at_seven(ids):
        return 7 if len(ids) >= 7 else None

    for rules, cut in (([on_id, None, at_seven, at_seven], [at, 96, 7, 7]),
                       ([on_id, at_seven, at_seven, at_seven], [at, 7, 7, 7])):
        steps.clear()
        gens = eng.generate(prompts, 96, ignore_eos=True, stops=rules)
        assert [g.output_ids for g in gens] == [f.output_ids[:n] for f, n in zip(full, cut)]
        for g, n in zip(gens, cut):
            h, m = g.metrics.accept_hist, g.metrics
            assert g.finish_reason == ("length" if n == 96 else "stop")
            assert sum(h) == m.verify_steps
            assert 0 <= sum((i + 1) * c for i, c in enumerate(h)) - (n - 1) <= 4
        assert gens[1].metrics.accept_hist == full[1].metrics.accept_hist or cut[1] == 7
    # all rows stopped early: decoding ended within a step of the last stop
    assert len(steps) <= max(g.metrics.verify_steps for g in gens) + 1 < full[0].metrics.verify_steps
