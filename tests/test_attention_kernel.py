"""The Triton decode/verify attention (specpilot.kernels.attention) against SDPA.

On a CPU the kernel runs under TRITON_INTERPRET=1 in a child process, in fp32 (the
interpreter mishandles bf16), on small shapes: fresh random q/k/v, additive masks that are
random, ragged (per-row lengths) and causal over T > 1 grouped query rows, forced and
automatic KV splits, several row tiles, fully masked rows, K/V sliced out of a larger
cache; and a small fused model with the kernel routed in against the same model on SDPA.
On a GPU (marked gpu) bf16 on 8B/32B attention shapes (nkv 8, G 4/8, hd 128), B 1/8/32,
T 1/5/9/17, S up to 4096 against SDPA and an fp64 reference, inside a CUDA graph, and the
engine's greedy tokens with the kernel against SDPA (tie-aware).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from specpilot.runtime.config import ModelConfig
from specpilot.runtime.errors import SpecPilotError
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.random_model import random_transformer
from tests.interpret import interpreted

TINY64 = ModelConfig(arch="qwen3", vocab_size=256, hidden_size=128, intermediate_size=96,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, rope_theta=1e4,
                     max_position_embeddings=512)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def grouped_mask(B, T, G, S, g, device, dtype, ragged=True):
    """The model's additive mask [B, 1, T * G, S]: row t * G + g at position pos[b, t] sees
    slots <= pos[b, t]; each row ends at its own random length (ragged) and its T positions
    are consecutive (causal among them)."""
    last = torch.randint(T - 1, S, (B,), generator=g) if ragged else torch.full((B,), S - 1)
    pos = (last[:, None] - T + 1 + torch.arange(T)[None]).to(device)
    allowed = torch.arange(S, device=device)[None, None] <= pos[:, :, None]  # [B, T, S]
    add = torch.zeros(allowed.shape, dtype=dtype, device=device)
    add.masked_fill_(~allowed, float("-inf"))
    return add[:, None, :, None, :].expand(B, 1, T, G, S).reshape(B, 1, T * G, S)


def qkv(B, H, M, S, hd, g, device, dtype, cache_extra=0):
    """q [B, H, M, hd]; k, v the first S slots of a cache of S + cache_extra slots whose
    other slots hold NaN (a read past S would show)."""
    q = torch.randn(B, H, M, hd, generator=g).to(device, dtype)
    kc = torch.full((B, H, S + cache_extra, hd), float("nan"), dtype=dtype, device=device)
    vc = torch.full_like(kc, float("nan"))
    kc[:, :, :S] = torch.randn(B, H, S, hd, generator=g).to(device, dtype)
    vc[:, :, :S] = torch.randn(B, H, S, hd, generator=g).to(device, dtype)
    return q, kc[:, :, :S], vc[:, :, :S]


def kernel_cases(device, dtype, seed) -> dict:
    """Kernel vs SDPA (same dtype) on small shapes; relative errors and checks."""
    from specpilot.kernels import attention as A

    g = torch.Generator().manual_seed(seed)
    out = {}
    # (B, H, T, G, S, hd, splits): one row tile / several (G 8, T 17: 136 rows), S not a
    # multiple of the block, forced splits incl. a short last one, automatic splits
    cases = [(2, 2, 1, 4, 100, 64, None), (3, 2, 5, 4, 300, 64, 3), (1, 2, 17, 8, 70, 64, 2),
             (2, 1, 9, 4, 200, 128, None), (1, 2, 1, 2, 1000, 64, None),
             (2, 2, 3, 2, 64, 64, 1),
             # the combine over more splits than it reads a step (4 at bm 16, hd 128; 1 at
             # bm 64), a split count that is not a multiple of that
             (1, 2, 1, 4, 1000, 128, 7), (1, 2, 17, 8, 700, 128, 6)]
    for i, (B, H, T, G, S, hd, sp) in enumerate(cases):
        q, k, v = qkv(B, H, T * G, S, hd, g, device, dtype, cache_extra=37)
        mask = grouped_mask(B, T, G, S, g, device, dtype)
        out[f"supported_{i}"] = A.supported(q, k)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = A.attend(q, k, v, mask, splits=sp)
        out[f"causal_ragged_{i}"] = rel(y, ref)
        ym = A.attend_merged(q, k, v, mask, G, splits=sp)
        refm = ref.view(B, H, T, G, hd).transpose(1, 2).reshape(B, T, H * G * hd)
        out[f"merged_{i}"] = rel(ym, refm)
        out[f"merged_shape_{i}"] = tuple(ym.shape) == (B, T, H * G * hd)
    # random finite additive values plus -inf holes, a mask broadcast over heads and rows
    B, H, M, S, hd = 2, 3, 6, 150, 64
    q, k, v = qkv(B, H, M, S, hd, g, device, dtype)
    mask = torch.randn(B, 1, M, S, generator=g).to(device, dtype) * 3
    mask.masked_fill_(torch.rand(B, 1, M, S, generator=g).to(device) < 0.3, float("-inf"))
    mask[..., 0] = 0.0
    out["random_additive"] = rel(A.attend(q, k, v, mask, splits=2),
                                 F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    row = mask[:, :, :1]  # [B, 1, 1, S]: one row broadcast over M
    out["broadcast_mask"] = rel(A.attend(q, k, v, row),
                                F.scaled_dot_product_attention(q, k, v, attn_mask=row))
    out["no_mask"] = rel(A.attend(q, k, v, None), F.scaled_dot_product_attention(q, k, v))
    bmask = torch.rand(B, 1, M, S, generator=g).to(device) < 0.7
    bmask[..., 0] = True
    out["bool_mask"] = rel(A.attend(q, k, v, bmask),
                           F.scaled_dot_product_attention(q, k, v, attn_mask=bmask))
    # fully masked rows (an unused batch row, one row of another): zeros like SDPA, no NaN
    dead = grouped_mask(B, 1, M, S, g, device, dtype).clone()  # at T = 1 a stride-0 view
    dead[0] = float("-inf")
    dead[1, 0, 2] = float("-inf")
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dead)
    for sp in (1, 2):
        y = A.attend(q, k, v, dead, splits=sp)
        out[f"dead_rows_zero_split{sp}"] = bool((y[0] == 0).all() and (y[1, :, 2] == 0).all())
        out[f"dead_rows_finite_split{sp}"] = bool(torch.isfinite(y).all())
        out[f"dead_rows_vs_sdpa_split{sp}"] = rel(y, ref)
    # head dims other than 64/128 fall back to SDPA itself
    q, k, v = qkv(1, 2, 4, 40, 32, g, device, dtype)
    mask = grouped_mask(1, 1, 4, 40, g, device, dtype)
    out["hd32_not_supported"] = not A.supported(q, k)
    out["hd32_fallback_exact"] = bool(torch.equal(
        A.attend(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
    return out


@torch.inference_mode()
def model_cases(device, dtype) -> dict:
    """A fused model with the attention kernel routed in vs the same model on SDPA: prefill
    (T = 9), decode steps, a verify step (T = 5), the greedy step, an uncached pass."""
    m = random_transformer(TINY64, device, dtype, seed=3, std=0.1, fused=True)
    g = torch.Generator().manual_seed(7)
    B, P = 2, 9
    ids = torch.randint(0, TINY64.vocab_size, (B, P + 8), generator=g).to(device)
    pos = torch.arange(P + 8, device=device)[None].expand(B, -1).contiguous()
    pos = pos + torch.tensor([[0], [5]], device=device)  # ragged rows

    def run():
        m.setup_cache(B, 64)
        logits = []
        lg, hid = m(ids[:, :P], pos[:, :P], hidden_layers=(0, 1))
        logits.append(lg)
        for t in range(P, P + 3):
            lg, _ = m(ids[:, t:t + 1], pos[:, t:t + 1], kv_len=32)
            logits.append(lg)
        lg, _ = m(ids[:, P + 3:P + 8], pos[:, P + 3:P + 8], kv_len=32)  # verify, T = 5
        logits.append(lg)
        toks, _ = m.step(ids[:, -1:], pos[:, -1:] + 1, kv_len=64)
        full, _ = m(ids, pos, use_cache=False)
        return torch.cat(logits, 1), hid, toks, full

    m._flag_attention(False)
    ref = run()
    m._flag_attention(True)
    got = run()
    out = {"cached_logits": rel(got[0], ref[0]), "hidden": rel(got[1], ref[1]),
           "step_tokens_equal": bool(torch.equal(got[2], ref[2])),
           "uncached_logits": rel(got[3], ref[3]),
           "flagged": all(layer.self_attn.attn_kernel for layer in m.model.layers)}
    m._flag_kernels(True)  # with the fused elementwise kernels too (q from qkv_rope)
    got = run()
    out["with_fused_kernels_logits"] = rel(got[0], ref[0])
    return out


def _child() -> None:
    res = {"kernels": [kernel_cases("cpu", torch.float32, s) for s in (0, 1)],
           "model": model_cases("cpu", torch.float32)}
    print("RESULT " + json.dumps(res))


@pytest.fixture(scope="module")
def interp() -> dict:
    pytest.importorskip("triton")
    return interpreted("tests.test_attention_kernel")


def _check(r: dict, tol: float) -> None:
    for name, v in r.items():
        if isinstance(v, bool):
            assert v, name
        else:
            assert v < tol, (name, v)


def test_kernel_matches_sdpa_fp32_interpreted(interp):
    for r in interp["kernels"]:
        assert len(r) == 44
        _check(r, 1e-5)


def test_model_with_attention_kernel_matches_sdpa_fp32_interpreted(interp):
    r = interp["model"]
    assert r["flagged"] and r["step_tokens_equal"]
    for k in ("cached_logits", "hidden", "uncached_logits", "with_fused_kernels_logits"):
        assert r[k] < 1e-5, (k, r[k])


def test_split_choice_from_shapes():
    pytest.importorskip("triton")
    from specpilot.kernels.attention import block_m, choose_splits, launch_config

    assert choose_splits(8, 4096) == 8  # batch 1, 8 KV heads: split to fill the GPU, <= 8
    assert choose_splits(8, 1024) == 4  # splits of >= 256 slots
    assert choose_splits(8, 256) == 1 and choose_splits(8, 100) == 1
    assert choose_splits(32 * 8, 4096) == 1  # enough programs without a split
    assert choose_splits(64, 4096) == 4  # <= two waves of the 132 SMs
    assert choose_splits(64, 1024) == 2  # 64 tiles fill a quarter of the SMs: >= 512 slots
    assert choose_splits(8 * 8 * 2, 4096) == 2  # B 8, G 8, T 9: two row tiles per head
    assert choose_splits(8, 4096, sm_count=16) == 4  # a small GPU: two waves of its 16 SMs
    assert launch_config(4, 64)["BLOCK_N"] == 128  # one wave: 128 slots an iteration
    assert launch_config(4, 256)["BLOCK_N"] == 64  # more programs than SMs
    assert launch_config(40, 32)["BLOCK_N"] == 64  # 64-row tiles
    assert launch_config(40, 32)["num_stages"] == 3 and launch_config(4, 256)["num_stages"] == 3
    assert launch_config(40, 256)["num_stages"] == 2  # 64-row tiles in several waves
    assert block_m(4) == 16 and block_m(36) == 64 and block_m(136) == 64


def test_attention_knob_validation():
    assert Knobs().attention == "auto"
    for v in ("auto", "sdpa", "triton"):
        assert Knobs.from_dict({"attention": v}).attention == v
    with pytest.raises(SpecPilotError, match="attention must be auto, sdpa or triton"):
        Knobs.from_dict({"attention": "flash"})


def test_attention_kernel_stays_off_on_cpu():
    """The CPU path keeps SDPA whatever the knob says."""
    from specpilot.runtime.factory import apply_attention_knob

    m = random_transformer(TINY64, "cpu", "float32", seed=0, fused=True)
    for v in ("auto", "sdpa", "triton"):
        assert apply_attention_knob(m, Knobs(attention=v)) is False
    assert not any(layer.self_attn.attn_kernel for layer in m.model.layers)
    stock = random_transformer(TINY64, "cpu", "float32", seed=0)
    assert stock.set_attention_kernel(True) is False


def test_heuristic_flips_the_attention_switch():
    from specpilot.agents.heuristic import gpu_moves

    moves = [change for _, change, _ in gpu_moves(Knobs().to_dict(), False)]
    assert {"attention": "sdpa"} in moves and {"attention": "auto"} not in moves


def test_bad_inputs_are_one_line_errors():
    pytest.importorskip("triton")
    from specpilot.kernels import attention as A

    q, k = torch.zeros(1, 2, 4, 64), torch.zeros(1, 2, 8, 64)
    with pytest.raises(ValueError, match="mask's last dim"):
        A.attend(q, k, k, torch.zeros(1, 1, 4, 7))
    with pytest.raises(ValueError, match="q \\[B, H, M, hd\\]"):
        A.attend(q, torch.zeros(1, 3, 8, 64), torch.zeros(1, 3, 8, 64), None)
    with pytest.raises(ValueError, match="multiple of groups"):
        A.attend_merged(q, k, k, None, 3)


# -- GPU ---------------------------------------------------------------------------------------

SHAPES = {"8b": (8, 4, 128), "32b": (8, 8, 128)}  # nkv, G, hd


def _ref64(q, k, v, mask):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                          attn_mask=mask.double())


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_kernel_vs_sdpa_bf16_gpu(name):
    """bf16 on real attention shapes: the kernel's error against an fp64 reference is within
    SDPA's own (x1.25 + 1e-4), under 1e-2, finite, and no slot past S is read (NaN there)."""
    from specpilot.kernels import attention as A

    nkv, G, hd = SHAPES[name]
    g = torch.Generator().manual_seed(0)
    worst = []
    for B in (1, 8, 32):
        for T in (1, 5, 9, 17):
            for S in (256, 1024, 4096):
                if B * S > 32 * 1024 and T > 1 and S > 256:  # keep the fp64 refs small
                    continue
                q, k, v = qkv(B, nkv, T * G, S, hd, g, "cuda", torch.bfloat16, cache_extra=64)
                mask = grouped_mask(B, T, G, S, g, "cuda", torch.bfloat16)
                ref = _ref64(q, k, v, mask)
                e_sdpa = rel(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), ref)
                y = A.attend_merged(q, k, v, mask, G)
                yk = y.view(B, T, nkv, G, hd).transpose(1, 2).reshape(B, nkv, T * G, hd)
                e = rel(yk, ref)
                assert torch.isfinite(y).all(), (B, T, S)
                assert e < min(1e-2, 1.25 * e_sdpa + 1e-4), (name, B, T, S, e, e_sdpa)
                worst.append((e / e_sdpa, B, T, S))
    print(name, "worst kernel/SDPA error ratio:", max(worst))


@pytest.mark.gpu
def test_kernel_in_cuda_graph_gpu():
    """Captured once, replayed over new inputs in the same buffers: equals eager calls."""
    from specpilot.kernels import attention as A

    g = torch.Generator().manual_seed(1)
    for B, T, S in ((1, 1, 4096), (1, 9, 1024), (8, 5, 256)):
        nkv, G, hd = SHAPES["8b"]
        q, k, v = qkv(B, nkv, T * G, S, hd, g, "cuda", torch.bfloat16)
        mask = grouped_mask(B, T, G, S, g, "cuda", torch.bfloat16).clone()  # a real buffer
        A.attend_merged(q, k, v, mask, G)  # compile, workspaces
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = A.attend_merged(q, k, v, mask, G)
        for _ in range(3):
            q.copy_(torch.randn(q.shape, generator=g).to(q))
            k.copy_(torch.randn(k.shape, generator=g).to(k))
            mask.copy_(grouped_mask(B, T, G, S, g, "cuda", torch.bfloat16))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, A.attend_merged(q, k, v, mask, G)), (B, T, S)


SMALL = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536,
                    num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                    max_position_embeddings=4096)
SMALL128 = ModelConfig(arch="qwen3", vocab_size=4096, hidden_size=1024,
                       intermediate_size=1536, num_layers=3, num_heads=32, num_kv_heads=8,
                       head_dim=128, rope_theta=1e6, max_position_embeddings=4096)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [SMALL, SMALL128], ids=["hd64", "hd128"])
def test_engine_with_attention_kernel_gpu(cfg):
    """Graph decode with the kernel: the same greedy tokens as SDPA, or every difference a
    tie within the SDPA model's own margin (benchmarks/gpu_perf.py's forcing); graph ==
    eager with the kernel; verify steps (oracle drafter, k = 4) forced the same way."""
    from benchmarks.gpu_perf import force, tie_margin
    from specpilot.runtime.drafters.oracle import OracleDrafter
    from specpilot.runtime.generate import Engine

    m = random_transformer(cfg, "cuda", "bfloat16", seed=1, std=0.05, fused=True)
    m.set_fused_kernels(True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
               for n in (9, 300, 23, 3)]

    def outs(engine):
        return [x.output_ids for x in engine.generate(prompts, 48, ignore_eos=True)]

    assert m.set_attention_kernel(False) is False
    ref = outs(Engine(m))
    assert m.set_attention_kernel(True) is True
    eng = Engine(m)
    got = outs(eng)
    assert eng.graph_stats.replays > 10
    assert got == outs(Engine(m, cuda_graphs=False))
    rec = {tuple(p): o for p, o in zip(prompts, got)}
    spec = outs(Engine(m, OracleDrafter(m, 0.8, records=rec), k=4))
    m.set_attention_kernel(False)  # the SDPA model judges
    margin = tie_margin(m, [p + o for p, o in zip(prompts, ref)])
    same = sum(a == b for a, b in zip(got, ref))
    print(f"kernel vs SDPA: {same}/{len(prompts)} rows equal, margin {margin:.4f}")
    for name, o in (("ar", got), ("spec", spec)):
        r = force(m, prompts, o, margin)
        print(name, "forced through SDPA:", r)
        assert r["failures"] == 0, (name, r)
    assert math.isfinite(margin)
