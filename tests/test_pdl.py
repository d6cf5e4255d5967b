"""Programmatic dependent launch: the knob, the switch, and (on a GPU) that a step launched
with PDL computes exactly what the same step computes without it, and that the W12 kernels
wait for the kernel that writes their input."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from specpilot.kernels import pdl
from specpilot.runtime.errors import SpecPilotError
from specpilot.runtime.knobs import Knobs


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _late_copy(src, dst, n, DELAY_NS: tl.constexpr, BLOCK: tl.constexpr):
    """dst = src, written DELAY_NS after the kernel released its dependents (at its start)."""
    tl.extra.cuda.gdc_launch_dependents()
    t0 = _now()
    t = t0
    while t - t0 < DELAY_NS:
        t = _now()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _eager_copy(src, dst, n, BLOCK: tl.constexpr):
    """dst = src with no wait for the kernel before: the control that sees the race."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


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
    W12 and bf16 GEMV layers, the attention kernel; on sm_90 the verify step's W12 layers
    on the TMA + wgmma kernel, with and without x^T, which release the kernel after them
    early) gives the same logits, bit for bit, as without: PDL changes when blocks start,
    never what they compute."""
    from specpilot.kernels.gemv_bf16 import apply_gemv
    from specpilot.kernels.tuning import TunedTable
    from specpilot.kernels.w12_linear import apply_w12
    from specpilot.kernels.w12_triton import WGMMA, XT, KernelConfig
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
    table = None
    if torch.cuda.get_device_capability()[0] >= 9:  # 10 rows (T = 5): the wgmma kernel
        table = TunedTable(device="test")
        for n, xt in ((768, XT), (512, 0), (4096, XT)):  # qkv, o (without x^T), LM head
            kc = KernelConfig(bm=16, bn=64, bk=128, stages=2, dot=True, variant=WGMMA | xt)
            table.entries[f"w12:{n}x512:b16"] = {"config": kc.to_dict(), "median_us": 1.0}
    apply_w12(model, min_gain=0.0, skip=("mlp",), table=table)  # attention and head in W12
    if table is not None:
        assert all(m._config(16).variant & WGMMA for m in model.modules()
                   if type(m).__name__ == "W12Linear")
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


@pytest.mark.gpu
def test_w12_kernels_wait_for_the_kernel_that_writes_x():
    """Under PDL a W12 kernel may start while the kernel before it still runs; it must read
    x only after that kernel is done. Here the kernel before releases its dependents at once,
    then waits 1 ms before it writes x over a NaN-poisoned buffer. A control consumer that
    never waits does read the poison (so the race is real on this device), and every Gluon
    and TMA + wgmma config of the W12 grid (batch 2-32; the wgmma kernel behind its x^T
    kernel, the weight holding escapes, and each such config also without x^T: then
    launched with PDL behind the writer itself) and each batch's first Triton config still
    match the fp32 reference."""
    from dataclasses import replace

    from specpilot.kernels import w12 as fmt
    from specpilot.kernels.w12_triton import GLUON, WGMMA, XT, w12_candidates, w12_matmul

    if not pdl.supported(torch.device("cuda")):
        pytest.skip("PDL needs compute capability 9.0+")

    def behind_late_writer(x, consume, out):
        """consume(x written by the late writer, out): nothing but the writer runs between
        (out and x's buffer are poisoned before it; a torch launch in between would wait)."""
        consume(x, torch.empty_like(out))  # compiled and warm: launched within the delay
        xbuf = torch.full_like(x, float("nan"))
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        _late_copy[(triton.cdiv(x.numel(), 1024),)](x, xbuf, x.numel(), DELAY_NS=1_000_000,
                                                   BLOCK=1024, launch_pdl=True)
        consume(xbuf, out)
        torch.cuda.synchronize()
        return out

    n, k = 1000, 4000
    g = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w[0, 0], w[3, 7] = 40.0, -0.0
    p = fmt.pack(w)
    x = torch.randn(32, k, device="cuda", generator=g).to(torch.bfloat16)

    def control(xbuf, out):
        _eager_copy[(triton.cdiv(xbuf.numel(), 1024),)](xbuf, out, xbuf.numel(), BLOCK=1024,
                                                       launch_pdl=True)
    seen = behind_late_writer(x, control, torch.empty_like(x))
    assert seen.isnan().any(), "no race to guard against"

    kinds = set()
    for b in (1, 2, 4, 8, 16, 32):
        ref = x[:b].float() @ w.float().T
        grid = w12_candidates(b)
        cfgs = [c for i, c in enumerate(grid) if i == 0 or c.variant & (GLUON | WGMMA)]
        cfgs += [replace(c, variant=c.variant & ~XT) for c in cfgs if c.variant & XT]
        for cfg in cfgs:
            def run(xbuf, y, cfg=cfg, b=b):
                with pdl.scope(True):
                    w12_matmul(xbuf[:b], p, cfg, out=y)
            y = behind_late_writer(x, run, torch.empty(b, n, device="cuda",
                                                       dtype=torch.bfloat16))
            err = ((y.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (b, cfg.label, err)
            kinds |= {k for k, bit in (("gluon", GLUON), ("wgmma", WGMMA), ("xt", XT))
                      if cfg.variant & bit}
            kinds |= {"wgmma without x^T"} if cfg.variant & (WGMMA | XT) == WGMMA else set()
    assert kinds == {"gluon", "wgmma", "xt", "wgmma without x^T"}  # each kind was among them
