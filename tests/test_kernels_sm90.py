"""The linear kernels compile for Hopper (sm_90) on a machine without a GPU.

The interpreter, the CPU tests' other check of the Triton kernels, runs them as Python: a
kernel can pass there and still not compile (code after an early `return` under a
constexpr `if` runs in Python but is built, and type-checked, by the compiler). Here the
configs of the engine's tuning grids are compiled to cubins for sm_90 with Triton's own
compiler and ptxas, with the constexprs the launchers pass (PDL on, as on an H200), on
an aligned and a ragged K (bf16: the ragged one, whose masked loads hold the aligned path's);
configs that differ only in split count or pipeline depth share one build (`_unique`).
"""

from __future__ import annotations

import inspect

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

from specpilot.kernels import gemv_bf16, w12_gluon, w12_triton, w12_wgmma
from specpilot.kernels.tuning import BUCKETS, candidate_configs
from specpilot.kernels.w12 import group_words

POINTERS = {  # argument -> element type; every other non-constexpr argument is an i32
    "x_ptr": "*bf16", "y_ptr": "*bf16", "w_ptr": "*bf16", "a_ptr": "*i32", "c_ptr": "*i32",
    "base_ptr": "*u8", "rowptr_ptr": "*i32", "erow_ptr": "*i32", "ecol_ptr": "*i32",
    "ebits_ptr": "*i16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
}
TARGET = GPUTarget("cuda", 90, 32)


def _compile(kernel, consts: dict, warps: int, stages: int):
    names = inspect.signature(kernel.fn).parameters
    sig = {a: "constexpr" if a in consts else POINTERS.get(a, "i32") for a in names}
    source = GluonASTSource if isinstance(kernel, GluonJITFunction) else triton.compiler.ASTSource
    src = source(fn=kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=TARGET, options={"num_warps": warps,
                                                       "num_stages": stages})


def _unique(builds):
    """One build per kernel code: the split count (beyond 1 or not) and the pipeline depth
    change no code the frontend builds (CI time: each build is a cold compile of about a
    second)."""
    seen, out = set(), []
    for kernel, consts, warps, stages, label in builds:
        code = {**consts, "SPLIT_K": consts.get("SPLIT_K", 1) > 1}
        key = (kernel.fn.__name__, tuple(sorted(code.items())), warps)
        if key not in seen:
            seen.add(key)
            out.append((kernel, consts, warps, stages, label))
    return out


def _w12_builds():
    for k in (4096, 4000):  # aligned; ragged (padded to 4096: not EVEN)
        kp = -(-k // 128) * 128
        for b in BUCKETS:
            for cfg in w12_triton.w12_candidates(b):
                if cfg.variant & w12_triton.WGMMA:  # built by test_wgmma_kernel_compiles...
                    continue
                if cfg.variant & w12_triton.SK:
                    consts = w12_gluon.sk_constants(
                        k, kp, group_words(kp), cfg.bm, cfg.bn, cfg.bk, cfg.warps, cfg.stages,
                        bool(cfg.variant & w12_triton.XPRE), use_pdl=True,
                        l1ef=bool(cfg.variant & w12_triton.L1EF))
                    yield (w12_gluon.w12_gluon_sk_kernel, consts, cfg.warps, 1,
                           f"w12 gluon stream-K K={k} b{b} {cfg.label}")
                    continue
                if cfg.variant & w12_triton.GLUON:
                    _, consts = w12_gluon.gluon_constants(
                        k, kp, group_words(kp), cfg.bm, cfg.bn, cfg.bk, cfg.split_k, cfg.warps,
                        cfg.stages, bool(cfg.variant & w12_triton.XPRE), use_pdl=True,
                        l1ef=bool(cfg.variant & w12_triton.L1EF))
                    yield (w12_gluon.w12_gluon_kernel, consts, cfg.warps, 1,
                           f"w12 gluon K={k} b{b} {cfg.label}")
                    continue
                _, consts = w12_triton.kernel_constants(k, kp, group_words(kp), cfg,
                                                        use_pdl=True)
                yield (w12_triton.w12_linear_kernel, consts, cfg.warps, cfg.stages,
                       f"w12 K={k} b{b} {cfg.label}")


def _bf16_builds():
    for k in (4000,):
        for b in BUCKETS:
            for cfg in candidate_configs(b):
                _, consts = gemv_bf16.kernel_constants(k, cfg, use_pdl=True)
                yield (gemv_bf16.bf16_linear_kernel, consts, cfg.warps, cfg.stages,
                       f"bf16 K={k} b{b} {cfg.label}")


@pytest.mark.slow
@pytest.mark.parametrize("builds", [_w12_builds, _bf16_builds], ids=["w12", "bf16"])
def test_every_tuning_config_compiles_for_sm90(builds):
    failed = []
    todo = _unique(builds())
    assert len(todo) > 20  # the grids are real, not empty
    for kernel, consts, warps, stages, label in todo:
        try:
            k = _compile(kernel, consts, warps, stages)
        except Exception as e:  # noqa: BLE001 (collect every failure with its config)
            while e.__cause__ is not None:  # the compiler's own reason, under its wrappers
                e = e.__cause__
            failed.append(f"{label}: {type(e).__name__}: {str(e).strip()[-200:]}")
            continue
        assert k.asm["cubin"], label
        if consts.get("PDL"):
            assert "griddepcontrol.wait" in k.asm["ptx"], label
        if isinstance(kernel, GluonJITFunction) and consts["EVEN"]:
            # the word loads: L1 hint only (EVEN 2) or L1 + L2 evict-first policy (EVEN 1)
            plain = k.asm["ptx"].count("ld.global.L1::evict_first.v4.b32")
            assert (plain >= 3) == (consts["EVEN"] == 2), label
    assert not failed, "\n".join(failed)


_WGMMA_GRID = sorted({(c.bm, c.bn, c.bk, min(c.split_k, 2), c.stages,
                       bool(c.variant & w12_triton.XT))
                      for b in BUCKETS for c in w12_triton.w12_candidates(b)
                      if c.variant & w12_triton.WGMMA})


@pytest.mark.slow
@pytest.mark.parametrize("bm,bn,bk,split,stages,xt,use_pdl",
                         [(8, 64, 256, 1, 2, False, False), (32, 128, 128, 3, 4, True, False),
                          (16, 64, 256, 2, 3, False, True), (32, 128, 256, 1, 2, True, True)]
                         + [c + (False,) for c in _WGMMA_GRID])
def test_wgmma_kernel_compiles_for_sm90(bm, bn, bk, split, stages, xt, use_pdl):
    """The warp-specialized TMA + wgmma W12 kernel builds for sm_90, every config of the
    tuning grid among them (with x^T where the config asks, as on weights with escapes):
    its tensor descriptors are typed by their block shape and shared layout; its escape
    correction (`_esc_rows`, global loads) starts before its main loop's MMAs; launched
    with PDL (behind its x^T kernel, or behind x's writer) it waits for that kernel
    (`griddepcontrol.wait`) and releases the next one, and launched without it does
    neither."""
    from triton.experimental.gluon import language as gl

    _, consts = w12_wgmma.wgmma_constants(4096, 64, bm, bn, bk, split, stages, xt, use_pdl)
    sw = consts["SW"]
    wl = gl.NVMMASharedLayout.get_default_for([bn, sw], gl.int32)
    xl = gl.NVMMASharedLayout.get_default_for([bm, sw], gl.bfloat16)
    descs = {"c_desc": f"tensordesc<i32[{bn}, {sw}],{wl!r}>",
             "a_desc": f"tensordesc<i32[{bn}, {sw}],{wl!r}>",
             "x_desc": f"tensordesc<bf16[{bm}, {sw}],{xl!r}>"}
    kernel = w12_wgmma.w12_wgmma_kernel
    names = inspect.signature(kernel.fn).parameters
    sig = {a: "constexpr" if a in consts else descs.get(a) or POINTERS.get(a, "i32")
           for a in names}
    k = triton.compile(GluonASTSource(fn=kernel, signature=sig, constexprs=consts),
                       target=TARGET, options={"num_warps": bn // 16,
                                               "maxnreg": w12_wgmma.MAXNREG})
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor.2d" in ptx and "wgmma.mma_async" in ptx
    assert "setmaxnreg" in ptx  # the producer warp gives its registers to the consumers
    assert f"m64n{bm}k16" in ptx
    assert ptx.index("ld.global") < ptx.index("wgmma.mma_async")  # escapes first
    assert ("griddepcontrol.wait" in ptx) == (xt or use_pdl)
    assert ("griddepcontrol.launch_dependents" in ptx) == (xt or use_pdl)
    assert len(_WGMMA_GRID) >= 8  # the grid holds the kernel at both batch buckets
