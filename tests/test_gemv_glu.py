"""The Triton bf16 GEMV with silu(gate) * up folded into its activation loads (`glu`): the
same output, bit for bit, as `fused.silu_mul` followed by the plain kernel, for every
kernel path (per-row GEMV, broadcast GEMV, tl.dot, split-K); under TRITON_INTERPRET=1 on
the CPU in fp32, and in bf16 on a GPU, where the MLP of a model routes through it."""

from __future__ import annotations

import json

import pytest
import torch

from tests.interpret import interpreted

CONFIGS = [dict(bm=1, bn=4, bk=64, variant=0), dict(bm=2, bn=8, bk=64, variant=1),
           dict(bm=16, bn=16, bk=64, dot=True), dict(bm=16, bn=16, bk=64, dot=True, split_k=2),
           dict(bm=4, bn=8, bk=32, split_k=3)]


def glu_cases(device: str, dtype: torch.dtype, n: int, k: int, ms: tuple[int, ...],
              f32_dot: bool) -> list[dict]:
    from specpilot.kernels.fused import silu_mul
    from specpilot.kernels.gemv_bf16 import bf16_matmul
    from specpilot.kernels.w12_triton import KernelConfig

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
    out = []
    for c in CONFIGS:
        cfg = KernelConfig(**c)
        for m in ms:
            gu = (torch.randn(m, 2 * k, generator=g) * 2).to(device, dtype)
            one = bf16_matmul(gu, w, cfg, f32_dot=f32_dot, glu=True)
            two = bf16_matmul(silu_mul(gu), w, cfg, f32_dot=f32_dot)
            ref = (torch.nn.functional.silu(gu[:, :k].float()) * gu[:, k:].float()) @ w.float().T
            out.append({"config": c, "m": m, "equal": bool(torch.equal(one, two)),
                        "rel_to_fp32": float((one.float() - ref).norm() / ref.norm())})
    return out


def _child() -> None:
    print("RESULT " + json.dumps(glu_cases("cpu", torch.float32, 40, 192, (1, 3), True)))


def _check(rows: list[dict], tol: float) -> None:
    assert len(rows) >= len(CONFIGS)
    for r in rows:
        assert r["equal"], r
        assert r["rel_to_fp32"] < tol, r


def test_glu_equals_silu_mul_then_linear_interpreted():
    pytest.importorskip("triton")
    _check(interpreted("tests.test_gemv_glu"), 1e-5)


def test_glu_refuses_a_wrong_width():
    pytest.importorskip("triton")
    from specpilot.kernels.gemv_bf16 import bf16_matmul
    from specpilot.kernels.w12_triton import KernelConfig

    with pytest.raises(ValueError, match="twice as many"):
        bf16_matmul(torch.zeros(1, 10), torch.zeros(4, 10), KernelConfig(), glu=True)


@pytest.mark.gpu
def test_glu_bf16_bit_identical_gpu():
    """8B-class down_proj (4096 x 12288) at decode and verify row counts."""
    _check(glu_cases("cuda", torch.bfloat16, 4096, 12288, (1, 5, 9), False), 2e-2)


@pytest.mark.gpu
def test_mlp_routes_through_glu_gpu():
    """A fused model with the kernels and the GEMV backend: its MLPs take the one-launch
    path, and the decoder output equals the two-launch path bit for bit."""
    from specpilot.kernels.gemv_bf16 import GemvLinear
    from specpilot.kernels.w12_triton import KernelConfig
    from specpilot.runtime.config import ModelConfig
    from specpilot.runtime.random_model import random_transformer

    cfg = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536,
                      num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                      max_position_embeddings=4096)
    m = random_transformer(cfg, "cuda", "bfloat16", seed=1, std=0.05, fused=True)
    assert m.set_fused_kernels(True)
    for layer in m.model.layers:
        layer.mlp.down_proj = GemvLinear(layer.mlp.down_proj,
                                         {1: KernelConfig(bm=1, bn=4, bk=256, variant=0)})
    x = torch.randn(1, 1, 512, device="cuda", dtype=torch.bfloat16)
    mlp = m.model.layers[0].mlp
    calls = []
    mlp.down_proj.register_forward_hook(lambda *a: calls.append(1))
    with torch.inference_mode():
        one = mlp(x)
        assert not calls  # down_proj's own forward (the two-launch path) never ran
        from specpilot.kernels.fused import silu_mul

        two = mlp.down_proj(silu_mul(mlp.gate_up_proj(x)))
    assert torch.equal(one, two)
