"""W12 on a CUDA device (skipped without one): fused kernels against the fp32 reference on
fresh inputs with NaN-poisoned outputs, device unpack bit-exact, W12Linear dispatch."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels import w12 as fmt
from specpilot.kernels.tuning import candidate_configs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,k", [(1000, 1056), (4096, 4096)])
def test_fused_kernels_match_reference(n, k):
    from specpilot.kernels.gemv_bf16 import bf16_matmul
    from specpilot.kernels.w12_triton import w12_matmul

    g = torch.Generator(device="cuda").manual_seed(n)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w[0, 0], w[n - 1, 5] = 40.0, 1e-30
    p = fmt.pack(w)
    for b in (1, 2, 4, 8, 16, 32):
        for cfg in candidate_configs(b)[:4]:
            x = torch.randn(b, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ w.float().T
            for fn, arg in ((w12_matmul, p), (bf16_matmul, w)):
                y = torch.full((b, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                fn(x, arg, cfg, out=y)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (fn.__name__, b, cfg.label, err)


def test_device_unpack_all_patterns():
    from specpilot.kernels.w12_triton import w12_unpack

    bits = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16)
    w = bits.view(256, 256).view(torch.bfloat16)
    assert torch.equal(w12_unpack(fmt.pack(w)).view(torch.int16), bits.view(256, 256))


def test_w12linear_on_cuda_small_and_large_batch():
    from specpilot.kernels.w12_linear import W12Linear

    lin = torch.nn.Linear(512, 384, bias=False, device="cuda", dtype=torch.bfloat16)
    m = W12Linear.from_linear(lin)
    for rows in (1, 7, 100):
        x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ lin.weight.float().T
        assert ((m(x).float() - ref).norm() / ref.norm()).item() < 1e-2
