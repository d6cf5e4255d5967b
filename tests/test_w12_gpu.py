"""W12 on a CUDA device (skipped without one): fused kernels against the fp32 reference on
fresh inputs with NaN-poisoned outputs, device unpack bit-exact, W12Linear dispatch."""

from __future__ import annotations

import itertools

import pytest
import torch

from specpilot.kernels import w12 as fmt
from specpilot.kernels.tuning import candidate_configs
from specpilot.kernels.w12_triton import GLUON, PIPE, WGMMA, XT, KernelConfig, w12_candidates

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,k", [(1000, 1056), (1000, 4000), (4096, 4096)])
def test_fused_kernels_match_reference(n, k):
    from specpilot.kernels.gemv_bf16 import bf16_matmul
    from specpilot.kernels.w12_triton import w12_matmul

    g = torch.Generator(device="cuda").manual_seed(n)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w[0, 0], w[n - 1, 5] = 40.0, 1e-30
    w[3, 7], w[5, 9] = 0.0, -0.0  # zeros are escapes too
    p = fmt.pack(w)
    for b in (1, 2, 3, 4, 8, 16, 32):
        runs = [(w12_matmul, p, c) for c in w12_candidates(b if b != 3 else 4)]
        bf16_grid = candidate_configs(b if b != 3 else 4)  # the first 4, and every PIPE one
        runs += [(bf16_matmul, w, c) for i, c in enumerate(bf16_grid) if i < 4 or c.variant & PIPE]
        for fn, arg, cfg in runs:
            x = torch.randn(b, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ w.float().T
            y = torch.full((b, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            if fn is w12_matmul and cfg.variant & (GLUON | WGMMA) and p.gw < cfg.bk // 8:
                # the Gluon kernels step 32-word column groups: a clear refusal, which the
                # tuner records as a failed config for this shape
                with pytest.raises(ValueError, match="W12 kernel steps"):
                    fn(x, arg, cfg, out=y)
                continue
            fn(x, arg, cfg, out=y)
            err = ((y.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (fn.__name__, b, cfg.label, err)


@pytest.mark.parametrize("cfg", [KernelConfig(bm=1, bn=32, bk=512),
                                 KernelConfig(bm=4, bn=16, bk=512, split_k=2),
                                 KernelConfig(bm=16, bn=64, bk=512, dot=True),
                                 KernelConfig(bm=16, bn=64, bk=512, dot=True, variant=3),
                                 KernelConfig(bm=16, bn=64, bk=128, dot=True, variant=7),
                                 KernelConfig(bm=16, bn=64, bk=256, split_k=2, dot=True,
                                              variant=5)])
def test_ptx_decode_equals_plain_decode(cfg):
    """The byte-permute (PTX) decode and the plain-op decode feed the same numbers to the
    same sums: outputs are bit-identical."""
    from specpilot.kernels.w12_triton import w12_matmul

    g = torch.Generator(device="cuda").manual_seed(11)
    w = (torch.randn(768, 2048, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w[1, 2], w[700, 1000] = -65.0, 0.0
    p = fmt.pack(w)
    x = torch.randn(3 if not cfg.dot else 13, 2048, device="cuda", generator=g)
    x = x.to(torch.bfloat16)
    ys = [w12_matmul(x, p, KernelConfig(**{**cfg.to_dict(), "variant": cfg.variant & ~1 | v}))
          for v in (0, 1)]
    assert torch.equal(ys[0].view(torch.int16), ys[1].view(torch.int16))


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


# -- the engine with W12 weights and with the Triton-GEMV backend ------------------------------

def _small_model(seed: int = 1):
    from specpilot.runtime.config import ModelConfig
    from specpilot.runtime.random_model import random_transformer

    cfg = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536,
                      num_layers=4, num_heads=8, num_kv_heads=4, head_dim=64, rope_theta=1e6,
                      max_position_embeddings=4096)
    return random_transformer(cfg, "cuda", "bfloat16", seed=seed, std=0.05, fused=True)


def _prompts(n_rows: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (length - 3 * i,), generator=g).tolist()
            for i in range(n_rows)]


def _margin(stock, rows: list[list[int]]) -> float:
    """The stock model's tie margin (benchmarks/gpu_perf.py): twice its own logit noise
    across shapes, at least two bf16 steps at its largest logit."""
    from benchmarks.gpu_perf import tie_margin

    return tie_margin(stock, rows)


def _force(stock, prompts, outputs, margin: float) -> dict:
    from benchmarks.gpu_perf import force

    return force(stock, prompts, outputs, margin)


def _outputs(engine, prompts, n=48):
    return [g.output_ids for g in engine.generate(prompts, n, ignore_eos=True)]


def test_engine_with_w12_weights_forces_against_bf16():
    from specpilot.kernels.w12_linear import W12Linear, apply_w12
    from specpilot.runtime.drafters.ngram import NgramDrafter
    from specpilot.runtime.generate import Engine

    stock = _small_model()
    model = _small_model()
    rep = apply_w12(model, min_gain=0.0)  # every eligible layer, whatever the table says
    assert rep.applied == len(rep.layers) > 0
    assert all(isinstance(m, W12Linear) for m in (model.lm_head, model.model.layers[0].mlp
                                                   .down_proj))
    prompts = _prompts(3, 40, model.cfg.vocab_size)
    ref = _outputs(Engine(stock), prompts)
    margin = _margin(stock, [p + o for p, o in zip(prompts, ref)])
    eng = Engine(model)
    graph = _outputs(eng, prompts)
    st = eng.graph_stats
    assert st.captures > 0 and st.replays > 0  # W12 decode steps were captured and replayed
    eager = _outputs(Engine(model, cuda_graphs=False), prompts)
    assert graph == eager  # same kernels, no host sync: the capture computes the same thing
    spec = _outputs(Engine(model, NgramDrafter(3, 1), k=4), prompts)  # verify rows 5..15
    for name, outs in (("stock engine", ref), ("graph", graph), ("ngram", spec)):
        r = _force(stock, prompts, outs, margin)
        assert r["failures"] == 0, (name, r, margin)


def _table_forcing_triton(n_k: list[tuple[int, int]]):
    from specpilot.kernels.tuning import BUCKETS, TunedTable, TuningRecord, default_config

    t = TunedTable("test")
    for n, k in n_k:
        for b in BUCKETS:
            cfg = default_config(n, k, b)
            for kern, us in (("bf16", 1.0), ("cublas", 2.0)):
                t.add(TuningRecord(kern, n, k, b, cfg.to_dict(), us, 0.0, 1, 1.0, 1.0, True, 0.0))
    return t


def test_engine_with_triton_gemv_backend_forces_against_cublas():
    from specpilot.kernels.gemv_bf16 import GemvLinear, apply_gemv
    from specpilot.runtime.drafters.ngram import NgramDrafter
    from specpilot.runtime.generate import Engine

    stock = _small_model()
    model = _small_model()
    shapes = {(m.out_features, m.in_features) for m in model.modules()
              if isinstance(m, torch.nn.Linear)}
    rep = apply_gemv(model, _table_forcing_triton(sorted(shapes)))
    lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert lins and all(type(m) is GemvLinear for m in lins) and len(rep.swapped) == len(lins)
    for rows in (1, 3, 8, 20, 100):  # GEMV, dot buckets and the cuBLAS fallback
        lin = model.model.layers[0].mlp.down_proj
        x = torch.randn(rows, lin.in_features, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ lin.weight.float().T
        assert ((lin(x).float() - ref).norm() / ref.norm()).item() < 1e-2
    prompts = _prompts(3, 40, model.cfg.vocab_size)
    ref = _outputs(Engine(stock), prompts)
    margin = _margin(stock, [p + o for p, o in zip(prompts, ref)])
    eng = Engine(model)
    graph = _outputs(eng, prompts)
    assert eng.graph_stats.replays > 0
    assert graph == _outputs(Engine(model, cuda_graphs=False), prompts)
    spec = _outputs(Engine(model, NgramDrafter(3, 1), k=4), prompts)
    for name, outs in (("stock engine", ref), ("graph", graph), ("ngram", spec)):
        r = _force(stock, prompts, outs, margin)
        assert r["failures"] == 0, (name, r, margin)


def test_build_engine_with_linear_knobs_on_cuda():
    from specpilot.runtime.factory import build_engine
    from specpilot.runtime.knobs import Knobs

    eng, _ = build_engine("random:tiny", Knobs(weights="w12", gemv="auto"), "cuda", "bfloat16")
    rep = eng.target.w12_report  # decided by the device's tuned table (may swap none)
    assert len(rep.layers) > 0 and eng.target.gemv_report is not None
    out = eng.generate([[1, 2, 3, 4, 5]], 8, ignore_eos=True)[0].output_ids
    assert len(out) == 8


def test_build_engine_linear_knobs_reach_the_draft_model(tmp_path, qwen3_draft_dir):
    from specpilot.kernels.gemv_bf16 import GemvLinear
    from specpilot.kernels.w12_linear import W12Linear
    from specpilot.runtime.factory import build_engine
    from specpilot.runtime.knobs import Knobs
    from tests.checkpoints import make_checkpoint

    # head_dim 32: the CUDA fused q/k-norm + RoPE kernel takes power-of-two head dims only
    qwen3_dir = make_checkpoint(tmp_path / "target", "qwen3", seed=0, head_dim=32)
    stock, _ = build_engine(qwen3_dir, Knobs(gemv="cublas"), "cuda", "bfloat16")
    knobs = Knobs(drafter=f"draft:{qwen3_draft_dir}", k=3, weights="w12", gemv="auto")
    eng, _ = build_engine(qwen3_dir, knobs, "cuda", "bfloat16")
    draft = eng.drafter.model
    assert draft.w12_report is not None and draft.gemv_report is not None
    n_fast = sum(isinstance(m, (W12Linear, GemvLinear)) for m in draft.modules())
    assert n_fast == len(draft.w12_report.layers)  # every linear is W12 or Triton-GEMV
    prompts = [[5, 17, 42, 7, 99, 3, 11, 12], [8, 9, 10, 2, 4]]
    outs = _outputs(eng, prompts, 24)
    rows = [p + o for p, o in zip(prompts, _outputs(stock, prompts, 24))]
    margin = _margin(stock.target, [r[:min(map(len, rows))] for r in rows])
    r = _force(stock.target, prompts, outs, margin)
    assert r["failures"] == 0, (r, margin)


@pytest.mark.parametrize("n,k", [(333, 2048), (1000, 4000)])
def test_stream_k_kernel_sums_pieces_in_order(n, k):
    """Stream-K with few programs (1-3 an SM: a tile in 2-3 pieces, a program over several
    tiles) and with 8: matches the fp32 reference (ragged N, padded K, escapes) and is
    bit-identical from call to call (pieces are summed in program order, not by atomics)."""
    from specpilot.kernels.w12_triton import SK, XPRE, w12_matmul

    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w[0, 0], w[n - 1, 5], w[3, 7] = 40.0, 1e-30, -0.0
    p = fmt.pack(w)
    for b, bm, extra in ((5, 8, XPRE), (13, 16, 0), (32, 16, 0)):
        for per_sm, depth in ((1, 1), (3, 2 if bm == 16 else 1), (8, 1)):
            cfg = KernelConfig(bm=bm, bn=16, bk=256, split_k=per_sm, warps=1, stages=depth,
                               dot=True, variant=GLUON | SK | extra)
            x = torch.randn(b, k, device="cuda", generator=g).to(torch.bfloat16)
            ys = []
            for _ in range(2):
                ys.append(torch.full((b, n), float("nan"), device="cuda", dtype=torch.bfloat16))
                w12_matmul(x, p, cfg, out=ys[-1])
            ref = x.float() @ w.float().T
            err = ((ys[0].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (b, cfg.label, err)
            assert torch.equal(ys[0].view(torch.int16), ys[1].view(torch.int16)), cfg.label


def test_wgmma_kernel_takes_x_views_tma_cannot_read():
    """x rows TMA cannot read (a view starting 2 bytes into its storage, a row stride not a
    multiple of 16 bytes) are copied first: the same products as from a contiguous x."""
    from specpilot.kernels.w12_triton import w12_matmul

    n, k = 1000, 1056
    g = torch.Generator(device="cuda").manual_seed(3)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w[5, ::37] = 3e4
    p = fmt.pack(w)
    wide = torch.randn(16, k + 3, device="cuda", generator=g).to(torch.bfloat16)
    for variant, x in itertools.product((WGMMA, WGMMA | XT),
                                        (wide[:, 1:k + 1], wide[:, :k], wide[1:, :k])):
        cfg = KernelConfig(bm=16, bn=64, bk=128, split_k=2, warps=4, stages=2, dot=True,
                           variant=variant)
        assert x.data_ptr() % 16 or x.stride(0) % 8  # not a TMA-readable x
        y = torch.full((x.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
        w12_matmul(x, p, cfg, out=y)
        want = torch.full_like(y, float("nan"))
        w12_matmul(x.contiguous(), p, cfg, out=want)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16))
        ref = x.float() @ w.float().T
        assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("xt", [False, True])
@pytest.mark.parametrize("n,k", [(1000, 1056), (1000, 4000), (4096, 4096)])
def test_wgmma_kernel_matches_reference(n, k, xt):
    """The warp-specialized TMA + wgmma kernel (the tuning grid's batch 9-32 configs are
    checked in test_fused_kernels_match_reference): ragged N and K (TMA zero-fills past the ends), split-K (5 splits of
    4096 columns leave one without a step: dropped), rings of 2-4 steps, escapes (row 5 holds
    one every 37 columns: more than one round of the row-parallel correction, `_esc_rows`,
    in every split), batches of two row tiles (9 rows in tiles of 8, 20 in tiles of 16: x^T's
    second tile); the escapes' x values gathered from x and (xt) from x^T; every output
    column checked on its own, against its sum of |x * w| terms (row 5's large escapes would
    hide the other rows in one norm); a weight too narrow for its step is refused with a
    clear error."""
    from specpilot.kernels.w12_triton import w12_matmul

    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w[0, 0], w[n - 1, 5], w[3, 7] = 40.0, 1e-30, -0.0
    w[5, ::37] = 3e4
    p = fmt.pack(w)
    for b, bm in ((2, 8), (8, 8), (9, 8), (13, 16), (20, 16), (32, 32)):
        for bn, bk, split, stages in ((64, 256, 1, 2), (128, 128, 3, 4), (64, 128, 2, 4),
                                      (64, 256, 5, 3)):
            cfg = KernelConfig(bm=bm, bn=bn, bk=bk, split_k=split, warps=bn // 16,
                               stages=stages, dot=True, variant=WGMMA | (XT if xt else 0))
            x = torch.randn(b, k, device="cuda", generator=g).to(torch.bfloat16)
            y = torch.full((b, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            if bk // 8 > p.gw:
                with pytest.raises(ValueError, match="wgmma W12 kernel steps"):
                    w12_matmul(x, p, cfg, out=y)
                continue
            w12_matmul(x, p, cfg, out=y)
            ref = x.float() @ w.float().T
            err = ((y.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (b, cfg.label, err)
            terms = (x.float().abs() @ w.float().abs().T).norm(dim=0)
            col_err = ((y.float() - ref).norm(dim=0) / terms).max().item()
            assert col_err < 1e-2, (b, cfg.label, col_err)
