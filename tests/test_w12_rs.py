"""The explore-only kernel of `benchmarks/w12_rs.py` (twenty-fourth W12 run) compiles for
sm_90 on a machine without a GPU, in both loop forms, and holds what its docstring says:
its words loaded by the MMA warps (no TMA copy of a word), its x slices by TMA, and the
warpgroup MMAs reading their A operand from registers."""

from __future__ import annotations

import inspect
import re

import pytest

pytest.importorskip("triton")

from tests.test_kernels_sm90 import POINTERS, TARGET


def _ptx(overlap: int, bm: int = 16, bk: int = 128, stages: int = 3) -> str:
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.w12_rs import w12_rs_kernel

    sw = bk // 8
    xl = gl.NVMMASharedLayout.get_default_for([bm, sw], gl.bfloat16)
    consts = {"BM": bm, "BN": 64, "SW": sw, "GW": 64, "SPLIT_K": 1, "ECH": 8, "WARPS": 4,
              "STAGES": stages, "OVERLAP": overlap}
    names = inspect.signature(w12_rs_kernel.fn).parameters
    sig = {a: "constexpr" if a in consts else f"tensordesc<bf16[{bm}, {sw}],{xl!r}>"
           if a == "x_desc" else POINTERS.get(a, "i32") for a in names}
    attrs = {(list(names).index(a),): [["tt.divisibility", 16]] for a in names
             if a.endswith("_ptr") or a.startswith("stride") or a in ("KW", "K_PER")}
    k = triton.compile(GluonASTSource(fn=w12_rs_kernel, signature=sig, constexprs=consts,
                                      attrs=attrs), target=TARGET, options={"num_warps": 4})
    return k.asm["ptx"]


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [0, 1])
def test_rs_kernel_loads_words_itself_and_multiplies_from_registers(overlap):
    ptx = _ptx(overlap, stages=3)
    # the 8 x slices of a step: 2 prologue steps and the loop's refill (and no word copy)
    assert ptx.count("cp.async.bulk.tensor.2d") == 8 * 3
    # wgmma with A from registers: a {...} list for A after the accumulator's (B from shared
    # memory is a descriptor; an all-shared wgmma has the accumulator's list only)
    mmas = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
    assert len(mmas) == 8 and all(".m64n16k16." in ln and ln.count("{") == 2 for ln in mmas)
    # the three word planes, 8 bytes a load (K and the split's words 16-aligned, as on the
    # benchmark shapes)
    assert len(re.findall(r"ld\.global\.L1::evict_first\S*\.v2\.b32", ptx)) >= 3


def test_rs_matmul_rejects_unaligned_k():
    torch = pytest.importorskip("torch")
    from benchmarks.w12_rs import w12_rs_matmul
    from specpilot.kernels import w12

    w = w12.pack(torch.randn(64, 1000).to(torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of"):
        w12_rs_matmul(torch.randn(16, 1000).to(torch.bfloat16), w, None, 16, 128, 1, 3)
