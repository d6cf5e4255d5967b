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


def forced_failures(stock, prompts, outputs):
    from benchmarks.gpu_perf import force, noise

    margin = 2 * noise(stock, [p + o for p, o in zip(prompts, outputs)])
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
        r = forced_failures(stock, prompts, outs(Engine(fused, d, k=4), prompts))
        assert r["failures"] == 0, r
    assert forced_failures(stock, prompts, ar)["failures"] == 0


def test_ragged_batch_rows_alone(models, prompts):
    stock, fused = models
    batched = outs(Engine(fused), prompts)
    alone = [outs(Engine(fused), [p])[0] for p in prompts]
    same = sum(a == b for a, b in zip(batched, alone))
    if same < len(prompts):
        assert forced_failures(stock, prompts, alone)["failures"] == 0
