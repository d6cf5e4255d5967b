"""The oracle drafter on the CPU (tiny random model, fp32): it records on the speculative
engine's own path; alpha = 1 accepts every draft, alpha = 0 none, alpha = 0.8 the geometric
law; whatever it proposes (records that lie too), the output is the greedy output."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specpilot.runtime.drafters.oracle import OracleDrafter, load_oracle, parse_oracle
from specpilot.runtime.errors import CheckpointError
from specpilot.runtime.generate import Engine
from specpilot.runtime.random_model import preset_config, random_transformer

K = 4


@pytest.fixture(scope="module")
def target():
    return random_transformer("tiny", "cpu", "float32", seed=3, head_std=0.5)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (7, 30, 12, 3, 19, 25)]


@pytest.fixture(scope="module")
def greedy(target, prompts):
    return [g.output_ids for g in Engine(target).generate(prompts, 48, ignore_eos=True)]


def run(target, prompts, alpha, n=48, **kw):
    ora = OracleDrafter(target, alpha, **kw)
    eng = Engine(target, ora, k=K)
    return ora, eng, eng.generate(prompts, n, ignore_eos=True)


def test_alpha_one_accepts_every_draft(target, prompts, greedy):
    ora, _, gens = run(target, prompts, 1.0)
    assert [g.output_ids for g in gens] == greedy
    for g in gens:
        m = g.metrics
        # every verify step accepts all k drafts (the records run k + 1 past the end)
        assert m.accept_hist[K] == m.verify_steps, m.accept_hist
        assert m.verify_steps <= -(-47 // (K + 1)) + 1
    assert ora.recordings == 1


def test_alpha_zero_accepts_nothing(target, prompts, greedy):
    _, _, gens = run(target, prompts, 0.0)
    assert [g.output_ids for g in gens] == greedy
    for g in gens:
        assert g.metrics.accept_hist[0] == g.metrics.verify_steps == 47


def test_alpha_follows_the_geometric_law(target, prompts, greedy):
    alpha = 0.8
    _, _, gens = run(target, prompts, alpha, n=96)
    assert [g.output_ids[:48] for g in gens] == greedy
    acc = judged = 0
    for g in gens:
        for n, c in enumerate(g.metrics.accept_hist):
            acc += n * c
            judged += c * (n + (n < K))
    # per-draft acceptance: ~470 judged drafts, standard error ~0.018
    assert abs(acc / judged - alpha) < 0.06, acc / judged
    mean = sum(g.metrics.accept_length for g in gens) / len(gens)
    expect = (1 - alpha ** (K + 1)) / (1 - alpha)
    assert abs(mean - expect) / expect < 0.12, (mean, expect)


def test_records_come_from_the_engine_path_and_follow_the_batch(target, prompts):
    ora = OracleDrafter(target, 0.8)
    eng = Engine(target, ora, k=K)
    calls = []
    real = eng.generate

    def spy(ps, n, ignore_eos=False):
        calls.append([tuple(p) for p in ps])
        return real(ps, n, ignore_eos=ignore_eos)

    eng.generate = spy
    eng.generate(prompts, 20, ignore_eos=True)
    # the outer call and, inside it, the recording run of the same batch on the same engine
    assert calls == [[tuple(p) for p in prompts]] * 2 and ora.recordings == 1
    eng.generate(prompts, 20, ignore_eos=True)
    eng.generate(prompts, 12, ignore_eos=True)  # shorter: the records still cover it
    assert ora.recordings == 1
    eng.generate(prompts[::-1], 20, ignore_eos=True)  # another batch order: re-recorded
    assert ora.recordings == 2
    eng.generate(prompts, 20, ignore_eos=True)  # each batch is recorded once
    eng.k = K - 1  # another verify shape: recorded again
    eng.generate(prompts, 20, ignore_eos=True)
    eng.k = K
    assert ora.recordings == 3
    ora.alpha = 1.0  # a device scalar: a warm engine (and its graphs) follows it
    gens = real(prompts[::-1], 20, ignore_eos=True)
    assert ora.recordings == 3
    assert all(g.metrics.accept_hist[K] == g.metrics.verify_steps for g in gens)


def test_lying_records_are_used_and_output_stays_greedy(target, prompts, greedy):
    lies = {tuple(p): [(t + 1) % 512 for t in o] for p, o in zip(prompts, greedy)}
    ora, _, gens = run(target, prompts, 1.0, records=lies)
    assert ora.recordings == 0  # explicit records are used as they are
    assert [g.output_ids for g in gens] == greedy
    assert all(g.metrics.accept_hist[0] == g.metrics.verify_steps for g in gens)


def test_draft_cost_model_eager_or_graphed_same_output(target, prompts, greedy):
    draft = random_transformer("tiny", "cpu", "float32", seed=11)
    for graphs in (True, False):
        ora, _, gens = run(target, prompts[:3], 0.8, draft_model=draft, draft_graphs=graphs)
        assert ora.graph_safe is graphs
        assert [g.output_ids for g in gens] == greedy[:3]


def test_draft_head_with_a_smaller_vocabulary(target, prompts, greedy):
    """An EAGLE-class head's cost: its vocabulary is smaller than the target's; it is fed the
    token ids modulo its size and its output is discarded, so the output stays greedy."""
    cfg = dataclasses.replace(preset_config("tiny"), vocab_size=64)
    draft = random_transformer(cfg, "cpu", "float32", seed=12)
    seen = []
    embed = draft.model.embed_tokens
    embed.register_forward_pre_hook(lambda m, a: seen.append(int(a[0].max())))
    _, _, gens = run(target, prompts[:3], 0.8, draft_model=draft, draft_graphs=False)
    assert [g.output_ids for g in gens] == greedy[:3]
    assert seen and max(seen) < 64


def test_load_oracle_checks_the_draft_vocabulary(target):
    with pytest.raises(CheckpointError, match="larger than the target"):
        load_oracle("oracle:draft=eagle-8b", target, None, "cpu", torch.float32)


def test_parse_oracle_args():
    a = parse_oracle("oracle:alpha=0.9,draft=0.6b,draft_graphs=0,seed=2")
    assert (a.alpha, a.draft, a.draft_graphs, a.seed) == (0.9, "0.6b", False, 2)
    assert parse_oracle("oracle").draft_graphs is True
    for bad in ("oracle:alpha=1.5", "oracle:draft_graphs=yes", "oracle:beta=1"):
        with pytest.raises(CheckpointError):
            parse_oracle(bad)
    with pytest.raises(ValueError):
        OracleDrafter(random_transformer("tiny", "cpu", "float32"), 1.2)
