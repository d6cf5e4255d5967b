"""The patched kernel copies behind the twenty-first to twenty-fourth W12 runs
(`benchmarks/w12_patch.py`): each kind's patch applies to today's `w12_gluon.py` (or
`w12_triton.py`, or `w12_wgmma.py`), and compiled for sm_90 (no GPU needed) each copy holds
what the run's table says it does."""

from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess

import pytest

pytest.importorskip("triton")

from benchmarks.w12_patch import _alu_asm, baseline_module, patched_module
from specpilot.kernels import w12_gluon
from tests.test_kernels_sm90 import POINTERS, TARGET

# the batch 4-8 picks' form: one warp, 16 weight rows, 8 rows of x a step ahead, 32-word steps
CONSTS = {"BM": 8, "BN": 16, "SW": 32, "GW": 64, "SPLIT_K": 1, "EVEN": True, "ECH": 8,
          "WARPS": 1, "DEPTH": 1, "XPRE": True, "ESC_EARLY": True, "PDL": False}
ALIGNED = ("K", "KW", "stride_a", "stride_c", "stride_xm", "stride_ym", "K_PER")


@functools.cache
def _compile(kernel):
    """(PTX, cubin) of the kernel for sm_90, pointers and strides 16-byte aligned as on the
    benchmark's shapes (so the loads vectorize as they do there); cached, so the shipped
    kernel is built once for all tests."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(inspect.signature(kernel.fn).parameters)
    sig = {a: "constexpr" if a in CONSTS else POINTERS.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names
             if a.endswith("_ptr") or a in ALIGNED}
    k = triton.compile(GluonASTSource(fn=kernel, signature=sig, constexprs=CONSTS, attrs=attrs),
                       target=TARGET, options={"num_warps": 1, "num_stages": 1})
    return k.asm["ptx"], k.asm["cubin"]


def _sass_ops(cubin: bytes, tmp_path) -> list[str]:
    import triton

    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                          check=True).stdout
    return re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)", sass)


def test_alu_variants_add_one_op_per_decoded_register_and_round():
    one, two = _alu_asm(1), _alu_asm(2)
    assert one.count("xor.b32") == 4 and "add.u32" not in one
    assert two.count("xor.b32") == 4 and two.count("add.u32") == 4
    assert one.index("xor.b32") < one.index("mov.b32 {$0, $1}")  # before the results leave


def test_hint_copy_issues_every_word_load_with_the_hint():
    shipped, _ = _compile(w12_gluon.w12_gluon_kernel)
    hinted, _ = _compile(patched_module("hint", "ef256").w12_gluon_kernel)
    words = shipped.count("ld.global.L1::evict_first.L2::cache_hint.v4.b32")
    assert words > 0
    assert hinted.count("ld.global.L1::evict_first.L2::256B.v4.b32") == words
    assert "ld.global.L1::evict_first.L2::cache_hint.v4.b32" not in hinted


def test_x32_copy_pairs_x_without_prmts_or_shared_memory(tmp_path):
    shipped_ptx, shipped_cubin = _compile(w12_gluon.w12_gluon_kernel)
    x32_ptx, x32_cubin = _compile(patched_module("x32", "x32").w12_gluon_kernel)
    before, after = _sass_ops(shipped_cubin, tmp_path), _sass_ops(x32_cubin, tmp_path)
    assert after.count("HMMA") == before.count("HMMA") > 0
    # the x slices' re-pairing is gone: 2.6 PRMT an MMA fewer in the run's build
    assert after.count("PRMT") <= before.count("PRMT") - 2 * before.count("HMMA")
    # the int32 slices become the B operand in registers (the layout conversion moves no data)
    assert "st.shared" not in x32_ptx and "st.shared" not in shipped_ptx


def test_nopair_copies_drop_the_weight_pairing(tmp_path):
    _, shipped = _compile(w12_gluon.w12_gluon_kernel)
    before = _sass_ops(shipped, tmp_path)
    mma = before.count("HMMA")
    for variant, fewer in (("nopair", 3), ("nopair_x32", 5)):
        _, cubin = _compile(patched_module("pairs", variant).w12_gluon_kernel)
        after = _sass_ops(cubin, tmp_path)
        assert after.count("HMMA") == mma
        assert after.count("PRMT") <= before.count("PRMT") - fewer * mma, variant


def test_xrow_copy_keeps_every_x_load_and_mma(tmp_path):
    """The xhit bound is fair only if the copy issues the shipped loads: its x offsets no
    longer depend on the batch row, and the compiler must not fold the then-equal loads."""
    _, shipped = _compile(w12_gluon.w12_gluon_kernel)
    _, xrow = _compile(patched_module("xhit", "xrow").w12_gluon_kernel)
    before, after = _sass_ops(shipped, tmp_path), _sass_ops(xrow, tmp_path)
    for op in ("HMMA", "LDG"):
        assert after.count(op) == before.count(op) > 0, op


@pytest.mark.slow
def test_tl_hint_copies_drop_the_word_loads_evict_first_policy():
    """The tl_hint copies of `w12_triton.py` (the batch-1 GEMV and sliced picks' kernel):
    every word load's policy is replaced, and compiled for sm_90 the shipped GEMV (the
    unpipelined form of the qkv 32B-class batch-1 pick; the PIPE form copies words with
    cp.async, which takes no policy) issues evict-first cache-policy loads where the `none`
    copy issues none."""
    from specpilot.kernels import w12_triton
    from tests.test_kernels_sm90 import _compile as compile_sm90

    cfg = w12_triton.KernelConfig(bm=1, bn=16, bk=512, warps=4, variant=1 | w12_triton.DEFER)
    _, consts = w12_triton.kernel_constants(4096, 4096, 64, cfg)
    none = patched_module("tl_hint", "none")
    assert "evict_first" not in inspect.getsource(none)
    ptx = {name: compile_sm90(mod.w12_linear_kernel, consts, cfg.warps, 3).asm["ptx"]
           for name, mod in (("shipped", w12_triton), ("none", none))}
    assert ptx["shipped"].count("createpolicy.fractional.L2::evict_first") >= 1
    assert "evict_first" not in ptx["none"]


def _compile_wgmma(mod, what: str = "ptx"):
    """PTX (or cubin) of a `w12_wgmma` module's kernel for sm_90 at 16 rows of x, 64 weight
    rows, 256-column steps and a ring of 2 (the ring kind's first config), its escapes' x
    values gathered from x^T (as on weights with escapes), under its own register cap; its
    pointers, M and strides divisible by 16, as Triton specializes them at 16 rows of x."""
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    _, consts = mod.wgmma_constants(4096, 64, 16, 64, 256, 1, 2, True)
    sw = consts["SW"]
    wl = gl.NVMMASharedLayout.get_default_for([64, sw], gl.int32)
    xl = gl.NVMMASharedLayout.get_default_for([16, sw], gl.bfloat16)
    descs = {"c_desc": f"tensordesc<i32[64, {sw}],{wl!r}>",
             "a_desc": f"tensordesc<i32[64, {sw}],{wl!r}>",
             "x_desc": f"tensordesc<bf16[16, {sw}],{xl!r}>"}
    names = inspect.signature(mod.w12_wgmma_kernel.fn).parameters
    sig = {a: "constexpr" if a in consts else descs.get(a) or POINTERS.get(a, "i32")
           for a in names}
    attrs = {(list(names).index(a),): [["tt.divisibility", 16]] for a in names
             if a.endswith("_ptr") or a in ("M", "stride_xm", "stride_ym")}
    k = triton.compile(GluonASTSource(fn=mod.w12_wgmma_kernel, signature=sig, constexprs=consts,
                                      attrs=attrs), target=TARGET,
                       options={"num_warps": 4, "maxnreg": mod.MAXNREG})
    return k.asm[what]


@pytest.mark.slow
def test_ring_copies_take_away_what_they_say():
    """The ring copies of `w12_wgmma.py` (twenty-fourth run), compiled for sm_90: the shipped
    kernel's 16 wgmma a step (its first 3 * ESC_R steps peeled, then the loop) and 11 TMA
    copies a step (3 word tiles, 8 x slices); `ring` keeps the
    copies and drops every wgmma and shared read, `words` also drops the 8 x copies, `l2`
    keeps both, and `words_r64` hands its consumers 104 registers instead of 232 (4 programs
    an SM instead of 2); `tiled`, `tiled_words` and `floor` keep what the kernel and `words`
    hold (they move the copies' boxes, or stop the copies after the first fill)."""
    from specpilot.kernels import w12_wgmma

    def counts(ptx):
        return (ptx.count("wgmma.mma_async"), ptx.count("cp.async.bulk.tensor"),
                ptx.count("ld.shared"), sorted(set(re.findall(r"setmaxnreg\.inc\S*\s+(\d+)",
                                                              ptx))))

    shipped = counts(_compile_wgmma(w12_wgmma))
    peeled = 3 * w12_wgmma.ESC_R.value
    assert shipped[:2] == (16 * (peeled + 1), 11) and shipped[2] > 0 and "232" in shipped[3]
    got = {v: counts(_compile_wgmma(patched_module("ring", v)))
           for v in ("ring", "words", "l2", "words_r64", "tiled", "tiled_words", "floor")}
    assert got["l2"] == shipped == got["tiled"] == got["floor"]
    assert got["tiled_words"] == got["words"]
    assert got["ring"][:2] == (0, 11) and got["words"][:2] == (0, 3)
    assert got["ring"][2] < shipped[2]  # the consumers' word reads are gone
    assert "104" in got["words_r64"][3] and "232" not in got["words_r64"][3]


def test_tiled_and_floor_copies_patch_the_copies_they_say():
    """The source behind the tiled and floor probes: tiled copies each word tile from one
    contiguous run (rows of SW words, box rows n0 * KW / SW + t * BN), and the floor's
    producer stops after one fill of the ring that its consumers then re-read."""
    tiled = inspect.getsource(patched_module("ring", "tiled"))
    assert "[n0 + (w // SW) * BN, 0]" in tiled and "[n0, w]" not in tiled
    assert "view(-1, sw)" in tiled and "view(w.n, kw)" not in tiled
    floor = inspect.getsource(patched_module("ring", "floor"))
    assert "range(gl.minimum(nsteps, STAGES))" in floor
    assert "if t < STAGES:" in floor


def _issue_order(ptx: str) -> str:
    """The PTX's global loads (L), wgmma steps (S, 16 wgmma) and grid-dependency waits (G) in
    program order."""
    marks = ["L" if "ld.global" in line else "G" if "griddepcontrol.wait" in line else "W"
             for line in ptx.splitlines()
             if "ld.global" in line or "wgmma.mma_async" in line or "griddepcontrol.wait" in line]
    return re.sub("W{16}", "S", "".join(marks))


@pytest.mark.slow
def test_escape_schedules_issue_their_round_trips_where_they_say():
    """The shipped kernel issues its escape correction's round trips between its first steps
    (the row ranges before step 0, each round's columns and values after step 3r, its x
    values after step 3r + 1); `early` issues every escape load before the main loop (the
    twenty-fifth run's form, no step peeled), `esc_r2` peels 6 steps for two rounds,
    `guarded` issues them as the shipped kernel does and `no_rest` has no rounds after the
    loop."""
    from specpilot.kernels import w12_wgmma

    order = {"shipped": _issue_order(_compile_wgmma(w12_wgmma))}
    for v in ("early", "esc_r2", "guarded"):
        order[v] = _issue_order(_compile_wgmma(patched_module("ring", v)))
    rounds = w12_wgmma.ESC_R.value
    # the peeled steps, the loop's step (and no step in the short-split branch)
    assert order["shipped"].count("S") == order["guarded"].count("S") == 3 * rounds + 1
    # ranges, step 0, a round's fetch, step 1, the wait for x^T's writer, its x values (16 rows
    # of x from x^T: 4 16-byte loads), step 2; the short-split branch waits before its x too
    assert re.match(r"L{3}SL{8}SGL{4}S", order["shipped"]), order["shipped"][:80]
    assert order["shipped"].count("G") == 2 and re.search(r"L{8}GL{4}", order["shipped"][14:])
    assert re.match(r"L{3}SL{8}S", order["guarded"]), order["guarded"][:80]
    assert order["esc_r2"].count("S") == 7
    assert re.match(r"L{3}SL{8}SGL{4}SSL{8}SL{4}S", order["esc_r2"])
    early = order["early"]
    assert early.count("S") == 1 and early.startswith("L" * 3 + "G" + "L" * (8 + 4) + "S")
    # no_rest (timing only) keeps the peeled round and drops the rounds after the loop
    no_rest = _issue_order(_compile_wgmma(patched_module("ring", "no_rest")))
    assert no_rest.count("S") == 3 * rounds + 1
    assert no_rest.startswith(order["shipped"][:order["shipped"].index("S", 6) + 1])
    assert no_rest.count("L") == order["shipped"].count("L") - (8 + 4)


def _first_waits(sass: str) -> list[int]:
    """For each global load (LDG) before the consumers' third mbarrier wait (step 2's): how
    many mbarrier waits (SYNCS...TRYWAIT) come between it and the first instruction that
    waits on its result. An sm_90 instruction's second 64-bit word holds its control bits:
    the scoreboard it sets when its result lands (bits 46-48; 7 for none) and the
    scoreboards it waits for (a mask, bits 52-57)."""
    code = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);\s*/\* 0x[0-9a-f]+ \*/\s*\n"
                      r"\s*/\* (0x[0-9a-f]+) \*/", sass)
    ops = [(text.strip(), int(hi, 16)) for text, hi in code]
    first = next(i for i, (t, _) in enumerate(ops) if "LDG" in t)
    waits = [i for i, (t, _) in enumerate(ops) if "TRYWAIT" in t and i > first]
    out = []
    for i in range(first, waits[2]):
        text, hi = ops[i]
        board = (hi >> 46) & 7
        if "LDG" not in text or board == 7:
            continue
        use = next(j for j in range(i + 1, len(ops)) if (ops[j][1] >> 52) >> board & 1)
        out.append(sum(i < w < use for w in waits))
    return out


@pytest.mark.slow
def test_escape_loads_are_waited_on_only_under_a_later_step(tmp_path):
    """Where the compiled code first waits on each escape load (the SASS's scoreboards): in
    the shipped kernel every one of them (the ranges, a round's columns and values, its x
    values) only after the next step's mbarrier wait, so its round trip runs under a step.
    With each peeled step guarded by its own `if` (`guarded`: the twenty-sixth run's guards,
    the rest of this kernel kept), ptxas hoists the ranges' first use above step 0 and that
    round trip waits exposed. Compiled as `_compile_wgmma` builds it (16-byte vector x^T
    gathers, as at 16 and 32 rows of x)."""
    import triton

    from specpilot.kernels import w12_wgmma

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    got = {}
    for name, mod in (("shipped", w12_wgmma), ("guarded", patched_module("ring", "guarded"))):
        path = tmp_path / f"{name}.cubin"
        path.write_bytes(_compile_wgmma(mod, "cubin"))
        got[name] = _first_waits(subprocess.run([tool, "-sass", str(path)], capture_output=True,
                                                text=True, check=True).stdout)
    assert len(got["shipped"]) == 3 + 8 + 4, got["shipped"]
    assert min(got["shipped"]) >= 1, got["shipped"]
    assert min(got["guarded"]) == 0, got["guarded"]


def test_baseline_loads_an_earlier_checkouts_kernel_beside_the_shipped_one(tmp_path):
    """`--baseline DIR`: the w12_gluon.py / w12_wgmma.py in DIR import as their own modules
    (the copy's w12_wgmma takes its helpers from the copy's w12_gluon, not the shipped one);
    a DIR without them is a one-line error."""
    import shutil

    from specpilot.kernels import w12_gluon as shipped_gluon
    from specpilot.kernels import w12_wgmma

    for mod in (shipped_gluon, w12_wgmma):
        shutil.copy(mod.__file__, tmp_path)
    base = baseline_module(str(tmp_path))
    assert base is not w12_wgmma and base.__name__.endswith("_baseline")
    assert base._esc_fetch is not w12_wgmma._esc_fetch  # from the copied w12_gluon
    assert callable(base.w12_wgmma_matmul)
    with pytest.raises(SystemExit, match="holds no w12_gluon.py"):
        baseline_module(str(tmp_path / "missing"))
