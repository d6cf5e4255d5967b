"""Programmatic dependent launch: the knob, the switch, and (on a GPU) that a step launched
with PDL computes exactly what the same step computes without it."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels import pdl
from specpilot.runtime.errors import SpecPilotError
from specpilot.runtime.knobs import Knobs


def test_knob_defaults_on_and_rejects_non_bool():
    assert Knobs().pdl is True
    assert Knobs.from_dict({"pdl": False}).pdl is False
    with pytest.raises(SpecPilotError, match="pdl must be true or false"):
        Knobs.from_dict({"pdl": "yes"})


def test_scope_switches_and_restores():
    assert not pdl._ON[0]
    with pdl.scope(True):
        assert pdl._ON[0]
        with pdl.scope(False):
            assert not pdl._ON[0]
        assert pdl._ON[0]
    with pytest.raises(RuntimeError), pdl.scope(True):
        raise RuntimeError("boom")
    assert not pdl._ON[0]


def test_never_active_on_cpu():
    with pdl.scope(True):
        assert not pdl.active(torch.device("cpu"))
    assert pdl.launch(False) == {} and pdl.launch(True) == {"launch_pdl": True}


@pytest.mark.gpu
def test_pdl_step_equals_plain_step_bit_for_bit():
    """Every Triton kernel of a decode and a verify step launched with PDL (CUDA graph,
    W12 and bf16 GEMV layers, the attention kernel) gives the same logits, bit for bit,
    as without: PDL changes when blocks start, never what they compute."""
    from specpilot.kernels.gemv_bf16 import apply_gemv
    from specpilot.kernels.w12_linear import apply_w12
    from specpilot.runtime.config import ModelConfig
    from specpilot.runtime.cuda_graphs import StepGraphs
    from specpilot.runtime.generate import Engine
    from specpilot.runtime.random_model import random_transformer

    dev = torch.device("cuda")
    if torch.cuda.get_device_capability()[0] >= 9:
        assert pdl.supported(dev)  # else this test would compare plain with plain
    cfg = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536,
                      num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                      max_position_embeddings=4096)
    model = random_transformer(cfg, "cuda", "bfloat16", seed=3, std=0.05, fused=True)
    model.set_attention_kernel(True)
    apply_w12(model, min_gain=0.0, skip=("mlp",))  # attention projections and head in W12
    apply_gemv(model)
    assert any(type(m).__name__ == "W12Linear" for m in model.modules())
    for T in (1, 5):
        model.setup_cache(2, 512)
        ids = torch.randint(0, cfg.vocab_size, (2, T), device=dev)
        pos = (100 + torch.arange(T, device=dev))[None].expand(2, T).contiguous()
        logits = {}
        def step(ids=ids, pos=pos):
            return model.head(model.body(ids, pos, kv_len=256)[0])

        for on in (False, True):
            g = StepGraphs(dev)
            with pdl.scope(on):
                g.run(0, step)  # eager, then capture
                logits[on] = g.run(0, step).clone()  # a replay
        assert torch.equal(logits[False], logits[True]), T
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (9, 40, 3)]
    a, b = (Engine(model, pdl=on).generate(prompts, 32, ignore_eos=True) for on in (False, True))
    assert [x.output_ids for x in a] == [x.output_ids for x in b]
