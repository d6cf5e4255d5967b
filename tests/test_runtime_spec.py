"""Speculative decoding is lossless: for every drafter and several k, batched and ragged,
with and without EOS, the engine's output equals an independent greedy reference (a plain
no-cache argmax loop over the transformers model), and the metrics add up."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specpilot.runtime.factory import build_engine
from specpilot.runtime.generate import Generation
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.tokenizer import Tokenizer
from tests.checkpoints import TEXT, make_block_drafter, perturb_checkpoint

N_NEW = 32


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one thread; two spin against each other on a busy box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def prompts(qwen3_dir) -> list[list[int]]:
    text_ids = Tokenizer(qwen3_dir).encode(TEXT)
    g = torch.Generator().manual_seed(7)
    return [text_ids[:30],
            torch.randint(1, 280, (7,), generator=g).tolist(),
            torch.randint(1, 280, (19,), generator=g).tolist()]


@pytest.fixture(scope="module")
def reference(qwen3_dir, prompts) -> list[list[int]]:
    """Greedy continuations by transformers itself, one full causal pass per token."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for p in prompts:
            seq = list(p)
            for _ in range(N_NEW):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            out.append(seq[len(p):])
    return out


@pytest.fixture(scope="module")
def drafters(qwen3_dir, qwen3_draft_dir, tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("drafters")
    return {
        "ngram": "ngram",
        "draft-small": f"draft:{qwen3_draft_dir}",
        "draft-near": f"draft:{perturb_checkpoint(qwen3_dir, tmp / 'near', 0.2)}",
        "block": f"block:{make_block_drafter(tmp / 'block', qwen3_dir, block_size=6)}",
    }


def check_metrics(g: Generation, max_new: int, k: int) -> None:
    m = g.metrics
    assert m.new_tokens == len(g.output_ids) <= max_new
    assert m.prompt_tokens == len(g.prompt_ids)
    assert sum(m.accept_hist) == m.verify_steps
    assert len(m.accept_hist) == k + 1
    # the steps that returned tokens, each as accepted (only the last may run past the end)
    assert 0 <= sum((n + 1) * c for n, c in enumerate(m.accept_hist)) - (m.new_tokens - 1) <= k
    # the first token comes from prefill; every other one from a verify step
    if m.verify_steps:
        assert abs(m.accept_length * m.verify_steps - (m.new_tokens - 1)) < 1e-9
        assert 1.0 <= m.accept_length <= k + 1
    else:
        assert m.new_tokens == 1
    assert g.finish_reason in ("eos", "stop", "length")
    if g.finish_reason == "length":
        assert len(g.output_ids) == max_new
    assert m.prefill_s >= 0 and m.decode_s >= 0


def test_ar_equals_reference_batched(qwen3_dir, prompts, reference):
    engine, _ = build_engine(qwen3_dir)
    outs = engine.generate(prompts, N_NEW, ignore_eos=True)
    assert [o.output_ids for o in outs] == reference
    for o in outs:
        check_metrics(o, N_NEW, 0)
        assert o.metrics.accept_length == 1.0
        assert o.metrics.verify_steps == N_NEW - 1
        assert o.finish_reason == "length"


@pytest.mark.parametrize("name,k", [("ngram", 1), ("ngram", 4), ("draft-small", 3),
                                    ("draft-near", 1), ("draft-near", 4), ("block", 2),
                                    ("block", 5)])
def test_speculative_equals_greedy(qwen3_dir, prompts, reference, drafters, name, k):
    engine, _ = build_engine(qwen3_dir, Knobs(drafter=drafters[name], k=k))
    batched = engine.generate(prompts, N_NEW, ignore_eos=True)
    assert [o.output_ids for o in batched] == reference
    for o in batched:
        check_metrics(o, N_NEW, k)
    if k > 1:  # batch 1 gives the same per-sequence output as the batch
        single = [engine.generate([p], N_NEW, ignore_eos=True)[0] for p in prompts]
        assert [o.output_ids for o in single] == reference
    if name == "draft-near":  # a near drafter does accept, and not everything
        acc = [o.metrics.accept_length for o in batched]
        assert all(1.0 < a < k + 1 for a in acc), acc


def test_ragged_acceptance_in_one_batch(qwen3_dir, prompts, reference, drafters):
    engine, _ = build_engine(qwen3_dir, Knobs(drafter=drafters["draft-near"], k=4))
    outs = engine.generate(prompts, N_NEW, ignore_eos=True)
    assert [o.output_ids for o in outs] == reference
    hists = [tuple(o.metrics.accept_hist) for o in outs]
    assert len(set(hists)) == len(hists), hists  # rows advanced differently
    steps = [o.metrics.verify_steps for o in outs]
    assert len(set(steps)) > 1, steps


@pytest.mark.parametrize("name", [None, "ngram", "draft-near", "block"])
def test_eos_stops_each_row_where_greedy_would(qwen3_dir, prompts, reference, drafters, name):
    knobs = Knobs(drafter=drafters[name] if name else None, k=3)
    engine, _ = build_engine(qwen3_dir, knobs)
    eos = reference[0][12]  # a token greedy decoding does produce
    engine.eos_ids = (eos,)
    outs = engine.generate(prompts, N_NEW)
    k = engine.k
    for o, ref in zip(outs, reference):
        check_metrics(o, N_NEW, k)
        if eos in ref:
            assert o.output_ids == ref[: ref.index(eos) + 1]
            assert o.finish_reason == "eos"
        else:
            assert o.output_ids == ref and o.finish_reason == "length"
    assert outs[0].finish_reason == "eos" and len(outs[0].output_ids) <= 13
    # ignore_eos runs through it
    outs = engine.generate(prompts, N_NEW, ignore_eos=True)
    assert [o.output_ids for o in outs] == reference


def test_eos_as_first_token(qwen3_dir, prompts, reference, drafters):
    engine, _ = build_engine(qwen3_dir, Knobs(drafter=drafters["draft-near"], k=3))
    engine.eos_ids = (reference[1][0],)
    outs = engine.generate(prompts, N_NEW)
    o = outs[1]
    assert o.output_ids == [reference[1][0]] and o.finish_reason == "eos"
    assert o.metrics.verify_steps == 0 and o.metrics.new_tokens == 1
    for o, ref in zip(outs, reference):
        check_metrics(o, N_NEW, 3)
        first = ref.index(reference[1][0]) if reference[1][0] in ref else None
        assert o.output_ids == (ref if first is None else ref[: first + 1])


@pytest.mark.parametrize("max_new", [1, 2, 5, 11])
def test_max_new_tokens_is_respected_mid_step(qwen3_dir, prompts, reference, drafters, max_new):
    engine, _ = build_engine(qwen3_dir, Knobs(drafter=drafters["draft-near"], k=5))
    outs = engine.generate(prompts, max_new, ignore_eos=True)
    for o, ref in zip(outs, reference):
        assert o.output_ids == ref[:max_new] and o.finish_reason == "length"
        check_metrics(o, max_new, 5)


@pytest.mark.parametrize("name", ["draft-near", "block"])
def test_engine_reuse_across_calls(qwen3_dir, prompts, reference, drafters, name):
    """Caches left by a longer / larger call must not leak into the next one."""
    engine, _ = build_engine(qwen3_dir, Knobs(drafter=drafters[name], k=3))
    engine.generate(prompts, N_NEW, ignore_eos=True)
    short = engine.generate([prompts[2], prompts[1], prompts[0]], 9, ignore_eos=True)
    assert [o.output_ids for o in short] == [reference[2][:9], reference[1][:9],
                                             reference[0][:9]]
    one = engine.generate([prompts[1]], N_NEW, ignore_eos=True)
    assert one[0].output_ids == reference[1]


def test_stop_rules_end_rows_early_in_a_batch(qwen3_dir, prompts, reference, drafters):
    """A request's own stop rule ends its row as it decodes (the others run on, unchanged),
    decoding stops once every row has ended, and the metrics count the returned tokens."""
    engine, _ = build_engine(qwen3_dir, Knobs(drafter=drafters["draft-near"], k=4))
    steps = []
    step = engine._step
    engine._step = lambda *a: (steps.append(1), step(*a))[1]
    full = engine.generate(prompts, N_NEW, ignore_eos=True)
    n_full = len(steps)
    stop_id = reference[0][6]
    at = reference[0].index(stop_id) + 1

    def on_id(ids):
        return ids.index(stop_id) + 1 if stop_id in ids else None

    def at_five(ids):
        return 5 if len(ids) >= 5 else None

    steps.clear()
    outs = engine.generate(prompts, N_NEW, ignore_eos=True, stops=[on_id, None, at_five])
    assert [o.output_ids for o in outs] == [reference[0][:at], reference[1], reference[2][:5]]
    assert [o.finish_reason for o in outs] == ["stop", "length", "stop"]
    m = outs[1].metrics  # row 1 ran to the end as it does alone
    assert m == dataclasses.replace(full[1].metrics, prefill_s=m.prefill_s, decode_s=m.decode_s)
    assert len(steps) == m.verify_steps
    for o in outs:
        check_metrics(o, N_NEW, 4)
    steps.clear()
    outs = engine.generate(prompts, N_NEW, ignore_eos=True, stops=[on_id, at_five, at_five])
    assert [o.output_ids for o in outs] == [reference[0][:at], reference[1][:5],
                                            reference[2][:5]]
    assert len(steps) == max(o.metrics.verify_steps for o in outs) < n_full
    for o in outs:
        check_metrics(o, N_NEW, 4)
