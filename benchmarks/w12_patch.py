"""Experiments on source-patched copies of the shipped Gluon W12 kernel (`w12_gluon.py`; of the
Triton one, `w12_triton.py`, for tl_hint), each timed against the shipped pick of every
(shape, batch) whose pick is that kernel (of the TMA + wgmma one, `w12_wgmma.py`, for ring,
timed beside the shipped pick).

    PYTHONPATH=. python3 benchmarks/w12_patch.py [--kind hint|alu|x32|pairs|xhit|tl_hint|ring]
        [--shapes ...] [--batches 4,8,16] [--variants ...] [--no-escapes] [--baseline DIR]

Each variant is a copy of `w12_gluon.py` with a few source lines replaced, compiled as its
own module, launched with the pick's config; every variant is checked against the fp32
reference with a NaN-poisoned output (those of the timing-only kinds, `pairs` and `xhit`,
only for every element written), then A/B-timed against the shipped pick
(`w12_ksplit.bench_shape`: CUDA graphs, weights rotated past the L2). Writes
w12_patch_<kind>.json under $OUT. Measured in docs/BENCHMARKS.md, twenty-first to
twenty-fourth W12 runs; of the variants only `ef` is in the engine (as the Gluon kernel's
`L1EF` configs, twenty-third run).

--kind hint: the size of the DRAM fetches behind the word loads. At batch 4-8 the picks'
words alone stream at 94-95% of a plain read, but with the math the kernel gets 62.7% of
DRAM peak where cuBLAS gets 77% (`w12_ncu.py`). A warp reads 16 rows x 128 bytes of each
plane a step, rows 2.5-12 KB apart; a load's `.L2::128B` / `.L2::256B` qualifier asks the
L2 to fetch that much around each miss, so the row's next step comes with this one at no
extra instruction (the seventh run's `prefetch.global.L2` instructions cost instructions and
were slower). The unmasked word loads become one inline-PTX 16-byte load each,
`ld.global.<variant>.v4.b32`:
  ef      .L1::evict_first (the shipped L1 policy without the L2 evict-first policy: the
          control)
  ef128   .L1::evict_first.L2::128B
  ef256   .L1::evict_first.L2::256B
  nc256   .nc.L1::no_allocate.L2::256B (the read-only path)
(the shipped loads are `ld.global.L1::evict_first.L2::cache_hint`, an L2 evict-first policy).

--kind alu: what the decode's integer work costs. The compiled batch 4-8 kernel holds 11.3
PRMT, 2.2 LOP3 and 1.1 SHF an MMA (10.6 PRMT in its main loop): the decode takes 7 for the 8
weights of a word; the rest pair the weights of adjacent words (4) and x's halves (2.6 in
the loop, see x32) into the MMA's bf16x2 registers. A word format whose decode wrote those
pairs would save the weights' pairing; before building one, this measures the time of more
such work: each decoded register XORed with (and for alu8 also added to) a zero the compiler
cannot see (K >> 30): `alu4` / `alu8` add 4 / 8 ops an MMA. Products stay exact.

--kind x32: x slices carried as int32 pairs. Triton holds a bf16 tensor as 16-bit scalars,
so the x slices that XPRE carries across the loop's back edge reach ptxas as 16-bit
registers, and it re-pairs the halves into the MMA's bf16x2 B registers with PRMTs: of the
loop's 10.6 PRMT an MMA, 2.6. Here x loads through an int32 view ([SW / 2, BM] tiles, 16
bytes a thread as before) and each slice becomes the B operand right before its MMA (an asm
split into halves, a join and a reshape whose layout equals the operand's, so no data
moves): the loop holds 8.0 PRMT an MMA (the decode's 4 and the weight pairing's 4). 8 rows
of x and an even K only.

--kind pairs: timing only, wrong products. What a word format whose decode writes the MMA's
bf16x2 pairs could gain at most: `nopair` decodes two adjacent words a call and hands their
8 decoded registers to the 8 tiles as they are (the same decode work, no re-pairing),
`nopair_x32` does that on the x32 copy. The products are wrong on purpose; every element is
still checked to be written (`bench_shape`'s timing_only).

--kind tl_hint: the Triton kernel's word loads (the batch 1-2 GEMV and the sliced
tensor-core picks) without their evict-first policy: `none` (no cache hint) and `cg`
(`.cg`: cached in L2 only). The loop pipelined through shared memory (`PIPE`) copies words
with cp.async, which takes no policy; `cg` makes those copies skip L1 too.

--kind ring: timing only, wrong products. What bounds the TMA + wgmma kernel
(`w12_wgmma.py`) at batch 16-32: its configs (64 weight rows, 256-column steps, rings of 2-3,
1-2 splits) launched from the shipped module (with x^T, `XT`, and without) and from copies
(with XT) with its work taken away part by part: `ring` (the consumers only wait for each
stage and release it: no shared reads, decode or MMAs; the TMA ring alone), `words` (`ring`
without the x copies: the words alone), `l2` (every step re-reads its split's first step:
the same copies and math, fed from L2),
`words_r64` and `words_r80` (`words` under a launch register cap of 64 or 80 instead of
128: 4 or 3 programs an SM instead of 2); `tiled` and `tiled_words` (the kernel, and `words`,
with each word tile copied as one contiguous 8 KB box, as a tile-major storage layout would
hold it: what such a format could stream), `floor` (the producer fills the ring once and the
consumers re-read it: the consumers' own time), `no_rest` (the escape correction's peeled
first round only: rows with more than ESC_R * ESC_U escapes in a split stay partly
uncorrected, so the tile's fullest rows add no rounds after the main loop), `no_xs` (`no_rest`
without the peeled round's x loads: its columns taken as -1, so the loads are masked off and
compiled away, and with them the columns' loads, then unused; its values are still fetched).
Three more ring variants compute the real products (checked against the fp32 reference):
the shipped kernel with its escape correction scheduled otherwise: `early` (all of it before
the main loop, the twenty-fifth run's form), `esc_r2` (two rounds in flight under the first
steps instead of ESC_R's one) and `guarded` (each peeled step guarded by its own `if`, as in
the twenty-sixth run, the rest of this kernel kept: ptxas then hoists the ranges' first use
above step 0, so that round trip waits exposed, as `tests/test_w12_patch.py` checks in the
SASS).

--kind xhit: timing only, wrong products. What x's loads cost the picks beyond their
instructions: `xrow` gives every batch row of the tile x's first row (the x offsets' row
stride 0), so each x load is the same instruction and nearly always an L1 hit (one row of x,
K * 2 bytes). The thirteenth run measured this on fixed configs (17% at batch 16 on gate_up
32B-class, one split); here it bounds, per pick, what x held in shared memory could gain.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

HINTS = {
    "ef": "L1::evict_first",
    "ef128": "L1::evict_first.L2::128B",
    "ef256": "L1::evict_first.L2::256B",
    "nc256": "nc.L1::no_allocate.L2::256B",
}
# the Triton kernel's word loads (GEMV and sliced tensor-core path), and what replaces them
_TL_WORDS = 'eviction_policy="evict_first"'
TL_HINTS = {"none": 'eviction_policy=""', "cg": 'cache_modifier=".cg"'}  # (.cs: loads refuse)
X32 = ("x32",)
PAIRS = ("nopair", "nopair_x32")  # timing only: wrong products
XHIT = ("xrow",)  # timing only: wrong products
RING = ("ring", "words", "l2", "words_r64", "words_r80",  # timing only: wrong products
        "tiled", "tiled_words", "floor", "no_rest", "no_xs")
# the shipped kernel with its escape correction scheduled otherwise (real products)
RING_EXACT = ("early", "esc_r2", "guarded")
# w12_wgmma: the consumers' shared reads, decode and MMAs; the producer's x copies
_MATH = ("    w0, w1, w2, w3, w4, w5, w6, w7 = _decode(c_s.index(s).load(op_w), a0_s.index(s)",
         "acc = warpgroup_mma_wait(0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]\n")
_XCOPY = ("        colb = w + 7 * (w // GW) * GW\n", "x_s.index(s * 8 + i))\n")
_XBYTES = ("3 * c_desc.block_type.nbytes + 8 * x_desc.block_type.nbytes",
           "3 * c_desc.block_type.nbytes")
_STEP = ("        w = w_lo + t * SW\n", "        w = w_lo\n")
# tiled: each (64-row tile, step) word tile read as one contiguous 8 KB box (the words viewed
# as rows of SW words, the tile's box at row n0 * KW / SW + t * BN of the codes, twice that
# of A), as a tile-major storage layout would hold them
_COPIES = """\
        tma.async_copy_global_to_shared(c_desc, [n0, w], bar, c_s.index(s))
        tma.async_copy_global_to_shared(a_desc, [n0, wa], bar, a0_s.index(s))
        tma.async_copy_global_to_shared(a_desc, [n0, wa + GW], bar, a1_s.index(s))
"""
_TILED_COPIES = """\
        tma.async_copy_global_to_shared(c_desc, [n0 + (w // SW) * BN, 0], bar, c_s.index(s))
        tma.async_copy_global_to_shared(a_desc, [2 * n0 + (wa // SW) * BN, 0], bar,
                                        a0_s.index(s))
        tma.async_copy_global_to_shared(a_desc, [2 * n0 + ((wa + GW) // SW) * BN, 0], bar,
                                        a1_s.index(s))
"""
_TILED = (
    (_COPIES, _TILED_COPIES),
    ("GW: gl.constexpr, SW: gl.constexpr, STAGES: gl.constexpr):",
     "GW: gl.constexpr, SW: gl.constexpr, STAGES: gl.constexpr,\n             BN: gl.constexpr):"),
    ("n0, pid_m * BM, PDL, GW, SW, STAGES)),",
     "n0 * (KW // SW), pid_m * BM, PDL, GW, SW, STAGES, BN)),"),
    ("w.codes.view(torch.int32).view(w.n, kw)", "w.codes.view(torch.int32).view(-1, sw)"),
    ("w.a.view(torch.int32).view(w.n, 2 * kw)", "w.a.view(torch.int32).view(-1, sw)"),
)
# early: the whole escape correction before the main loop (the twenty-fifth run's form);
# esc_r2: two rounds in flight under the first 6 steps instead of ESC_R's one
_ESC_R = "ESC_R = gl.constexpr(1)"
_ESC_ZERO = "    esc = gl.zeros([BM, BN], gl.float32, gl.SliceLayout(2, _lr(BM, WARPS, ESC_U)))\n"
_ESC_FIRST = """\
    if XT:
        _gdc("griddepcontrol.wait;")
    esc = _esc_rows(lo, hi, base, pid_k, x_ptr, ecol_ptr, ebits_ptr, M, stride_xm, pid_m, BM, BN,
                    SPLIT_K, WARPS, ESC_U, XT)
"""
# guarded: the peeled steps each under its own `if 3 * r + k < nsteps`, not under one test
_PEELED = "    if nsteps >= 3 * ESC_R:"
_PEELED_XS = "            x3 = _gather(col, x_ptr, M, stride_xm, pid_m, BM, WARPS, r == 0, XT)\n"
_PEELED_STEP = "            acc = _step(c_s, a0_s, a1_s, x_s, ready, empty, 3 * r{k}, acc, STAGES)\n"
_ESC_REST = ("    # rows with more than ESC_R * ESC_U escapes in this split\n",
             "stride_xm, pid_m, BM, BN, SPLIT_K, WARPS, ESC_U, XT)\n")
# floor: the producer fills the ring once and the consumers wait only for that fill, then
# re-read its stages: the consumers' own time (shared reads, decode, MMAs, epilogue)
_FLOOR = (
    ("    for t in range(nsteps):\n        s = t % STAGES\n        mbarrier.wait(empty",
     "    for t in range(gl.minimum(nsteps, STAGES)):\n        s = t % STAGES\n        mbarrier.wait(empty"),
    ("    mbarrier.wait(ready.index(s), (t // STAGES) & 1)\n",
     "    if t < STAGES:\n        mbarrier.wait(ready.index(s), 0)\n"),
)
_XROW = ("    x_off = gl.expand_dims(ma, 0) * stride_xm + jx2",
         "    x_off = gl.expand_dims(ma, 0) * 0 + jx2")
# the unmasked word loads of w12_gluon._words, each replaced by a hinted one
_LOADS = ('gl.load(c_ptr + c_off + w, eviction_policy="evict_first")',
          'gl.load(a_ptr + a_off + wa, eviction_policy="evict_first")',
          'gl.load(a_ptr + a_off + wa + GW, eviction_policy="evict_first")')
_LDH = '''

@gluon.jit
def _ldh(p):
    """int32 words at pointers p, 16 bytes a load from the first of each 4 of a thread's
    consecutive words (contiguous and 16-byte aligned in the operand layout on aligned
    shapes; the reference check would catch any other)."""
    return gl.inline_asm_elementwise(
        asm="ld.global.{hint}.v4.b32 {{$0, $1, $2, $3}}, [$4];",
        constraints="=r,=r,=r,=r,l,l,l,l", args=[p.to(gl.int64, bitcast=True)],
        dtype=gl.int32, is_pure=False, pack=4)
'''
ALU = {"alu4": 1, "alu8": 2}  # rounds of one op over the 4 decoded registers of a word
_DECODE_CALL = "_decode(buf[0], buf[1], buf[2])"
_DECODE_PATCHED = '''

@gluon.jit
def _decode_patched(c, a0, a1, K):
    """{doc}"""
    z = gl.full(c.shape, 0, gl.int32, c.type.layout) + (K >> 30)  # 0, unknown to the compiler
    b0, b1, b2, b3, b4, b5, b6, b7 = gl.inline_asm_elementwise(
        asm=_PATCHED_ASM, constraints=_PATCHED_CONSTRAINTS,
        args=[c, a0, a1, gl.full(c.shape, H_MASK4, gl.int32, c.type.layout),
              gl.full(c.shape, H_CONST4, gl.int32, c.type.layout), z],
        dtype=(gl.int16,) * 8, is_pure=True, pack={pack})
    return (b0.to(gl.bfloat16, bitcast=True), b1.to(gl.bfloat16, bitcast=True),
            b2.to(gl.bfloat16, bitcast=True), b3.to(gl.bfloat16, bitcast=True),
            b4.to(gl.bfloat16, bitcast=True), b5.to(gl.bfloat16, bitcast=True),
            b6.to(gl.bfloat16, bitcast=True), b7.to(gl.bfloat16, bitcast=True))


_PATCHED_ASM = gl.constexpr({asm!r})
_PATCHED_CONSTRAINTS = gl.constexpr({constraints!r})
'''
_ALU_DOC = ("`_decode`'s 8 weights, each decoded register put through {rounds} more op(s) "
            "with z = K >> 30 (zero for every K a weight has).")
_NOPAIR_DOC = ("Timing only, wrong products: two adjacent words a call (pack 2), their 8 "
               "decoded bf16x2 registers handed to the 8 tiles as their register pairs, no "
               "re-pairing (tile i takes register i % 4 of the first word if i < 4, else of "
               "the second).")


_X_OFFSETS = ('''    ja = gl.arange(0, SW, layout=gl.SliceLayout(1, op_x))
    ma = gl.minimum(pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, op_x)), M - 1)
    jx2 = gl.expand_dims(ja, 1)
    x_off = gl.expand_dims(ma, 0) * stride_xm + jx2''', '''    lx: gl.constexpr = gl.BlockedLayout([4, 1], [4, 8], [1, WARPS], [0, 1])
    ja = gl.arange(0, SW // 2, layout=gl.SliceLayout(1, lx))
    ma = gl.minimum(pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, lx)), M - 1)
    jx2 = gl.expand_dims(ja, 1)
    x_off = gl.expand_dims(ma, 0) * (stride_xm // 2) + jx2''')
_X_LOAD = ('''    if EVEN:
        return gl.load(x_ptr + x_off + col, eviction_policy="evict_last")
    else:
        return gl.load(x_ptr + x_off + col, mask=col + jx2 < K, other=0.0,
                       eviction_policy="evict_last")''', '''    x32 = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    if EVEN:
        return gl.load(x32 + x_off + (col >> 1), eviction_policy="evict_last")
    else:  # K is even on every benchmark shape
        return gl.load(x32 + x_off + (col >> 1), mask=(col >> 1) + jx2 < (K >> 1), other=0,
                       eviction_policy="evict_last")''')
_XB = '''

@gluon.jit
def _xb(t, acc):
    """int32 x^T pairs [SW / 2, BM] -> the bf16 B operand [SW, BM] of acc's MMA (element k
    is half k % 2 of pair k // 2: the column order of the bf16 slice)."""
    lo, hi = gl.inline_asm_elementwise(asm="mov.b32 {$0, $1}, $2;", constraints="=h,=h,r",
                                       args=[t], dtype=(gl.int16, gl.int16), is_pure=True,
                                       pack=1)
    v = gl.join(lo.to(gl.bfloat16, bitcast=True), hi.to(gl.bfloat16, bitcast=True))
    v = gl.reshape(gl.permute(v, (0, 2, 1)), (2 * t.shape[0], t.shape[1]))
    return gl.convert_layout(v, gl.DotOperandLayout(operand_index=1, parent=acc.type.layout,
                                                    k_width=8))
'''


_NOPAIR_ASM = "".join(
    f"lop3.b32 h, ${8 + w}, ${14 + w}, ${16 + w}, 0xEA;\n"
    f"shf.r.wrap.b32 r, ${8 + w}, ${8 + w}, 4;\n"
    f"lop3.b32 g, r, ${14 + w}, ${16 + w}, 0xEA;\n"
    f"prmt.b32 ${4 * w}, ${10 + w}, h, 0x5140;\n"
    f"prmt.b32 ${4 * w + 1}, ${10 + w}, h, 0x7362;\n"
    f"prmt.b32 ${4 * w + 2}, ${12 + w}, g, 0x5140;\n"
    f"prmt.b32 ${4 * w + 3}, ${12 + w}, g, 0x7362;\n" for w in (0, 1))

def _alu_asm(rounds: int) -> str:
    """The shipped decode asm with each of p0..p3 XORed with $13 (and, with 2 rounds, $13
    added to it) before the results are moved out."""
    from specpilot.kernels.w12_triton import DECODE_BF16_ASM

    asm = DECODE_BF16_ASM.value
    at = asm.index("mov.b32 {$0, $1}")
    ops = ("xor.b32", "add.u32")[:rounds]  # not two XORs: ptxas folds them into one LOP3
    extra = "".join(f"{op} p{i}, p{i}, $13;\n    " for op in ops for i in range(4))
    return asm[:at] + extra + asm[at:]


def _replace(src: str, old: str, new: str) -> str:
    if src.count(old) != 1:
        raise SystemExit(f"w12_gluon.py no longer has {old!r} once: update w12_patch.py")
    return src.replace(old, new)


def _cut(src: str, first: str, last: str) -> str:
    """src without the text from the line `first` through `last` (each there once)."""
    if src.count(first) != 1 or src.count(last) != 1 or src.index(last) < src.index(first):
        raise SystemExit(f"the kernel no longer has {first.strip()!r} .. {last.strip()!r} "
                         "once: update w12_patch.py")
    return src[:src.index(first)] + src[src.index(last) + len(last):]


def _ring_source(src: str, variant: str) -> str:
    """`w12_wgmma.py`'s source with the work of `variant` (RING) taken away, or its escape
    correction scheduled as `variant` (RING_EXACT) says."""
    if variant == "l2":
        return _replace(src, *_STEP)
    if variant == "esc_r2":
        return _replace(src, _ESC_R, "ESC_R = gl.constexpr(2)")
    if variant == "guarded":
        src = _replace(src, _PEELED, "    if nsteps >= 0:")
        for k in ("", " + 1", " + 2"):
            step = _PEELED_STEP.format(k=k)
            src = _replace(src, step, f"            if 3 * r{k} < nsteps:\n    " + step)
        return src
    if variant == "early":
        src = _replace(_replace(src, _ESC_R, "ESC_R = gl.constexpr(0)"), _ESC_ZERO, _ESC_FIRST)
        return _cut(src, *_ESC_REST)
    if variant == "no_rest":
        return _cut(src, *_ESC_REST)
    if variant == "no_xs":
        return _replace(_cut(src, *_ESC_REST), _PEELED_XS,
                        _PEELED_XS.replace("(col,", "(col * 0 - 1,"))
    if variant == "floor":
        for old, new in _FLOOR:
            src = _replace(src, old, new)
        return src
    if variant.startswith("tiled"):
        for old, new in _TILED:
            src = _replace(src, old, new)
        if variant == "tiled":
            return src
    src = _cut(src, *_MATH)
    if variant.startswith("words") or variant == "tiled_words":
        src = _replace(_cut(src, *_XCOPY), *_XBYTES)
    if variant.startswith("words_r"):
        src = _replace(src, "MAXNREG = 128", "MAXNREG = " + variant[len("words_r"):])
    return src


def patched_module(kind: str, variant: str):
    """A copy of `specpilot.kernels.w12_gluon` (of `w12_triton` for tl_hint, of `w12_wgmma`
    for ring) patched for `variant` of `kind`."""
    import specpilot.kernels.w12_gluon as gluon_mod
    import specpilot.kernels.w12_triton as triton_mod
    import specpilot.kernels.w12_wgmma as wgmma_mod
    from specpilot.kernels.w12_triton import DECODE_BF16_CONSTRAINTS

    shipped = {"tl_hint": triton_mod, "ring": wgmma_mod}.get(kind, gluon_mod)
    stem = shipped.__name__.rsplit(".", 1)[1]
    with open(shipped.__file__) as f:
        src = f.read()
    if kind == "tl_hint":
        if src.count(_TL_WORDS) < 6:
            raise SystemExit("w12_triton.py's word loads changed: update w12_patch.py")
        src = src.replace(_TL_WORDS, TL_HINTS[variant])
    if kind == "hint":
        for load in _LOADS:
            src = _replace(src, load, "_ldh(" + load[len("gl.load("):load.index(",")] + ")")
        src += _LDH.format(hint=HINTS[variant])
    if kind == "x32" or variant == "nopair_x32":
        src = _replace(_replace(src, *_X_OFFSETS), *_X_LOAD)
        for i in range(8):
            src = _replace(src, f"acc = mma_v2(w{i}, xs[{i}], acc)",
                           f"acc = mma_v2(w{i}, _xb(xs[{i}], acc), acc)")
        src += _XB
    if kind == "xhit":
        src = _replace(src, *_XROW)
    if kind == "ring":
        src = _ring_source(src, variant)
    if kind in ("pairs", "alu"):
        src = _replace(src, _DECODE_CALL, "_decode_patched(buf[0], buf[1], buf[2], K)")
    if kind == "pairs":
        src += _DECODE_PATCHED.format(doc=_NOPAIR_DOC, pack=2,
                                      asm="{ .reg .b32 r, h, g;\n" + _NOPAIR_ASM + "}",
                                      constraints=",".join(["=r"] * 8 + ["r"] * 12))
    if kind == "alu":
        src += _DECODE_PATCHED.format(doc=_ALU_DOC.format(rounds=ALU[variant]), pack=1,
                                      asm=_alu_asm(ALU[variant]),
                                      constraints=DECODE_BF16_CONSTRAINTS.value + ",r")
    return module_from_source(src, f"{stem}_{variant}")


def module_from_source(src: str, stem: str):
    """`src` imported as the module `specpilot.kernels.<stem>` (from a temporary file)."""
    path = os.path.join(tempfile.mkdtemp(prefix="w12_patch_"), stem + ".py")
    with open(path, "w") as f:
        f.write(src)
    name = f"specpilot.kernels.{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # the copy's dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def baseline_module(folder: str):
    """`w12_wgmma` as an earlier checkout held it: its w12_gluon.py and w12_wgmma.py copied into
    folder (`git show REV:specpilot/kernels/w12_wgmma.py > folder/w12_wgmma.py`, the same for
    w12_gluon.py), imported as their own modules beside the shipped ones."""
    mods = {}
    for stem in ("w12_gluon", "w12_wgmma"):
        path = os.path.join(folder, stem + ".py")
        if not os.path.isfile(path):
            raise SystemExit(f"--baseline {folder} holds no {stem}.py: copy it there from the "
                             "checkout to compare against")
        with open(path) as f:
            src = f.read().replace("from .w12_gluon import", "from .w12_gluon_baseline import")
        mods[stem] = module_from_source(src, stem + "_baseline")
    return mods["w12_wgmma"]


def _tl_configs(mods: dict):
    """(x, y, packed, ship, b) -> the shipped pick, then the pick launched from each patched
    `w12_triton` copy (nothing more where the pick is a Gluon kernel)."""
    from specpilot.kernels.w12_triton import GLUON, WGMMA, w12_matmul

    def configs(x, y, packed, ship, b):
        out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
        if ship.variant & (GLUON | WGMMA):
            return out
        for variant, mod in mods.items():
            out.append((variant, lambda p, mod=mod: mod.w12_matmul(x, p, ship, out=y)))
        return out

    return configs


def _ring_configs(mods: dict):
    """(x, y, packed, ship, b) -> the shipped pick, then each TMA + wgmma config launched
    from the shipped module (without and with `XT`) and from each patched copy (with XT
    where its kernel takes it: an earlier checkout's may not)."""
    import inspect

    from specpilot.kernels.w12_triton import WGMMA, XT, KernelConfig, w12_matmul

    def xt_kw(mod) -> dict:
        return {"xt": True} if "xt" in inspect.signature(mod.w12_wgmma_matmul).parameters \
            else {}

    def configs(x, y, packed, ship, b):
        out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
        bm = 8 if b <= 8 else 16 if b <= 16 else 32
        for split, stages in ((1, 2), (1, 3), (2, 2)):
            for xt in (0, XT):
                c = KernelConfig(bm=bm, bn=64, bk=256, split_k=split, warps=4, stages=stages,
                                 dot=True, variant=WGMMA | xt)
                out.append((c.label, lambda p, c=c: w12_matmul(x, p, c, out=y)))
            for variant, mod in mods.items():
                out.append((f"{variant} {c.label}", lambda p, c=c, mod=mod: mod.w12_wgmma_matmul(
                    x, p, y, c.bm, c.bn, c.bk, c.split_k, c.stages, **xt_kw(mod))))
        return out

    return configs


def _configs(mods: dict, bm8: bool, hint: bool):
    """(x, y, packed, ship, b) -> the shipped pick, then the pick launched from each patched
    module (nothing more where the pick is not the Gluon register kernel, or with bm8 does
    not take 8 rows of x); with the pick's word-load policy (`L1EF`), except for a hint
    variant, which replaces the word loads of the L2-policy path."""
    from specpilot.kernels.w12_triton import GLUON, L1EF, SK, WGMMA, XPRE, w12_matmul

    def configs(x, y, packed, ship, b):
        out = [("shipped " + ship.label, lambda p: w12_matmul(x, p, ship, out=y))]
        if not ship.dot or not ship.variant & GLUON or ship.variant & WGMMA or \
                (bm8 and ship.bm != 8):
            return out
        for variant, mod in mods.items():
            run = mod.w12_gluon_sk_matmul if ship.variant & SK else mod.w12_gluon_matmul
            out.append((variant, lambda p, run=run: run(
                x, p, y, ship.bm, ship.bn, ship.bk, ship.split_k, ship.warps, ship.stages,
                bool(ship.variant & XPRE), bool(ship.variant & L1EF) and not hint)))
        return out

    return configs


def main() -> None:
    from benchmarks.w12_bench import SHAPES
    from benchmarks.w12_ksplit import run_shapes

    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("hint", "alu", "x32", "pairs", "xhit", "tl_hint", "ring"),
                    default="hint")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="4,8,16")
    ap.add_argument("--variants", default="", help="default: every variant of the kind")
    ap.add_argument("--reps", type=int, default=3, help="A/B alternations per config")
    ap.add_argument("--baseline", default="", metavar="DIR",
                    help="ring: also time the kernel of the w12_gluon.py and w12_wgmma.py in "
                         "DIR (an earlier checkout's), as variant `baseline`")
    ap.add_argument("--no-escapes", action="store_true",
                    help="every config on the same weights with an empty escape table (the "
                         "escapes decode as their placeholder, the reference is that weight): "
                         "what each costs without its escape correction")
    args = ap.parse_args()
    known = {"hint": HINTS, "alu": ALU, "x32": X32, "pairs": PAIRS, "xhit": XHIT,
             "tl_hint": TL_HINTS, "ring": RING + RING_EXACT}[args.kind]
    variants = args.variants.split(",") if args.variants else list(known)
    bad = [v for v in variants if v not in known]
    if bad:
        raise SystemExit(f"unknown {args.kind} variant(s) {','.join(bad)}: choose from "
                         f"{','.join(known)}")
    mods = {v: patched_module(args.kind, v) for v in variants}
    if args.baseline:
        if args.kind != "ring":
            raise SystemExit("--baseline compares the TMA + wgmma kernel: use it with --kind ring")
        mods["baseline"] = baseline_module(args.baseline)
    if args.kind in ("tl_hint", "ring"):
        configs = {"tl_hint": _tl_configs, "ring": _ring_configs}[args.kind](mods)
    else:
        configs = _configs(mods, args.kind in ("x32", "pairs"), args.kind == "hint")
    run_shapes(args.shapes, args.batches, args.reps, configs, f"w12_patch_{args.kind}.json",
               {"pairs": PAIRS, "xhit": XHIT, "ring": RING}.get(args.kind, ()), args.no_escapes)


if __name__ == "__main__":
    main()
