"""The Triton kernels (W12 fused linear, W12 unpack, bf16 linear, the wgmma kernel's x^T)
and `tune` on a real kernel, run under TRITON_INTERPRET=1 on small shapes.

The interpreter must be chosen before the kernels are defined, so the checks run once in a
child process (`_child`) that prints JSON; the tests assert on its results. Activations
and outputs are fp32 there (the interpreter mishandles bf16); weights are W12/bf16 bits.
"""

from __future__ import annotations

import json

import pytest

from tests.interpret import interpreted

CASES = [  # (N, K, M, config kwargs); W12 steps K by multiples of 128
    (24, 200, 1, {"bm": 1, "bn": 8, "bk": 128}),
    (24, 200, 3, {"bm": 4, "bn": 8, "bk": 128, "split_k": 2}),
    (16, 256, 2, {"bm": 2, "bn": 4, "bk": 256, "split_k": 1}),
    (40, 384, 5, {"bm": 16, "bn": 16, "bk": 128, "dot": True}),
    (40, 640, 7, {"bm": 16, "bn": 32, "bk": 256, "split_k": 2, "dot": True}),
    (8, 1000, 1, {"bm": 1, "bn": 8, "bk": 256, "split_k": 4}),
    (24, 200, 3, {"bm": 4, "bn": 8, "bk": 128, "split_k": 2, "variant": 0}),
    (40, 130, 9, {"bm": 16, "bn": 32, "bk": 128, "split_k": 2, "dot": True}),
    (24, 2048, 2, {"bm": 2, "bn": 8, "bk": 1024, "split_k": 2}),  # 64-word groups, two per step
    (64, 1024, 11, {"bm": 16, "bn": 32, "bk": 512, "dot": True, "variant": 3}),  # W x^T orientation
    (16, 1536, 4, {"bm": 16, "bn": 16, "bk": 1024, "split_k": 2, "dot": True, "variant": 2}),  # uneven split
    (16, 2048, 1, {"bm": 1, "bn": 8, "bk": 128, "split_k": 3}),  # steps of 16 words inside a group
    (32, 1536, 9, {"bm": 16, "bn": 32, "bk": 256, "split_k": 2, "dot": True, "variant": 3}),
    (8, 1000, 2, {"bm": 2, "bn": 8, "bk": 256, "split_k": 3}),  # the last split has no K step
    # sliced tensor-core path (variant bit 2): one dot per weight index on contiguous slices
    (40, 384, 5, {"bm": 16, "bn": 16, "bk": 128, "dot": True, "variant": 4}),  # x W^T, 16-word slices
    (40, 130, 9, {"bm": 16, "bn": 32, "bk": 128, "split_k": 2, "dot": True, "variant": 6}),  # ragged K
    (32, 1536, 9, {"bm": 16, "bn": 32, "bk": 256, "split_k": 2, "dot": True, "variant": 6}),  # W x^T
    (16, 1536, 4, {"bm": 16, "bn": 16, "bk": 1024, "split_k": 2, "dot": True, "variant": 6}),  # 2 groups/step
    (24, 200, 2, {"bm": 16, "bn": 16, "bk": 256, "split_k": 3, "dot": True, "variant": 4}),  # empty split
    # several row tiles (the last one partial) with split-K
    (24, 200, 5, {"bm": 1, "bn": 8, "bk": 128, "split_k": 2}),
    (24, 200, 6, {"bm": 4, "bn": 8, "bk": 128, "split_k": 3}),
    (40, 640, 37, {"bm": 16, "bn": 32, "bk": 256, "split_k": 2, "dot": True, "variant": 4}),
    # the GEMV pipelined through shared memory (variant bit 4, PIPE): 2-4 stages, ragged
    # K, uneven and empty splits, two groups a step, several rows of x
    (24, 200, 1, {"bm": 1, "bn": 8, "bk": 128, "variant": 16}),
    (40, 384, 1, {"bm": 1, "bn": 16, "bk": 128, "variant": 16}),
    (8, 1000, 1, {"bm": 1, "bn": 8, "bk": 256, "split_k": 4, "stages": 4, "variant": 16}),
    (16, 2048, 1, {"bm": 1, "bn": 8, "bk": 128, "split_k": 3, "stages": 2, "variant": 16}),
    (24, 2048, 1, {"bm": 1, "bn": 8, "bk": 1024, "variant": 16}),
    (24, 200, 5, {"bm": 1, "bn": 8, "bk": 128, "split_k": 2, "variant": 16}),
    (24, 200, 3, {"bm": 4, "bn": 8, "bk": 128, "split_k": 2, "variant": 17}),
    # the GEMV's first escape chunk deferred (variant bit 5, DEFER): splits of many steps, of
    # one (table, x and terms after the loop) and of none; with PIPE too
    (16, 2048, 1, {"bm": 1, "bn": 8, "bk": 128, "split_k": 3, "variant": 33}),
    (24, 200, 3, {"bm": 4, "bn": 8, "bk": 128, "split_k": 2, "variant": 33}),
    (8, 1000, 2, {"bm": 2, "bn": 8, "bk": 256, "split_k": 3, "variant": 33}),
    (24, 2048, 1, {"bm": 1, "bn": 8, "bk": 256, "stages": 2, "variant": 49}),
    (24, 200, 5, {"bm": 1, "bn": 8, "bk": 128, "split_k": 2, "variant": 49}),
]


def _child() -> None:
    import torch

    from specpilot.kernels import w12
    from specpilot.kernels.gemv_bf16 import bf16_matmul
    from specpilot.kernels.splitk import _WORKSPACES
    from specpilot.kernels.tuning import Problem, tune
    from specpilot.kernels.w12_triton import KernelConfig, w12_matmul, w12_unpack

    out: dict = {"w12": [], "bf16": []}
    g = torch.Generator().manual_seed(0)
    for n, k, m, kw in CASES:
        cfg = KernelConfig(**kw)
        w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        w[0, 3], w[n - 1, k - 1], w[n // 2, 0] = 7.5, 1e-30, -3e-33  # escapes
        w[1, : min(k, 70)] = 0.0  # zeros escape too: more than one epilogue chunk
        w[2, 1::5] = 3e4  # large escapes across the row: many chunks, each one visible
        p = w12.pack(w)
        for seed in range(2):  # fresh inputs, poisoned outputs
            x = torch.randn(m, k, generator=g)
            ref = x.double() @ w.double().T
            y = torch.full((m, n), float("nan"))
            w12_matmul(x, p, cfg, out=y, f32_dot=True)
            err = float((y.double() - ref).norm() / ref.norm())
            # per output column (weight row): row 2's large escapes must not hide the others.
            # Relative to the column's sum of |x * w| terms (the scale fp32 rounding errors
            # have; with one row of x a column's plain sum can cancel to near zero)
            terms = (x.double().abs() @ w.double().abs().T).norm(dim=0)
            col_err = float(((y.double() - ref).norm(dim=0) / terms).max())
            out["w12"].append({"case": [n, k, m, cfg.label], "escapes": p.n_escapes,
                               "finite": bool(torch.isfinite(y).all()), "err": err,
                               "col_err": col_err})
            wf = w.float()
            y2 = torch.full((m, n), float("nan"))
            bf16_matmul(x, wf, cfg, out=y2, f32_dot=True)
            err2 = float((y2.double() - ref).norm() / ref.norm())
            out["bf16"].append({"case": [n, k, m, cfg.label],
                                "finite": bool(torch.isfinite(y2).all()), "err": err2})
    _, cnt = _WORKSPACES[torch.device("cpu")]
    out["counters_reset"] = int(cnt.abs().sum()) == 0

    allbits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(256, 256)
    pa = w12.pack(allbits.view(torch.bfloat16))
    out["unpack_all_patterns"] = bool(torch.equal(w12_unpack(pa).view(torch.int16), allbits))
    odd = (torch.randn(19, 300, generator=g) * 0.05).to(torch.bfloat16)
    out["unpack_odd_shape"] = bool(torch.equal(w12_unpack(w12.pack(odd)).view(torch.int16),
                                               odd.view(torch.int16)))

    # planes stored as row views of larger buffers (benchmarks/w12_layout.py): the kernels
    # take each plane's row stride, so outputs are bit-identical to the dense planes'
    from benchmarks.w12_layout import LAYOUTS, relayout

    w = (torch.randn(24, 2048, generator=g) * 0.02).to(torch.bfloat16)
    w[3, 5] = 0.0
    p = w12.pack(w)
    x = torch.randn(3, 2048, generator=g)
    out["layouts"] = {}
    for kind in LAYOUTS[1:]:
        q = relayout(p, kind)
        same = []
        for kw in ({"bm": 4, "bn": 8, "bk": 1024}, {"bm": 4, "bn": 8, "bk": 256, "variant": 49},
                   {"bm": 16, "bn": 16, "bk": 256, "dot": True, "variant": 6}):
            cfg = KernelConfig(**kw)
            same.append(bool(torch.equal(w12_matmul(x, q, cfg, f32_dot=True),
                                         w12_matmul(x, p, cfg, f32_dot=True))))
        out["layouts"][kind] = {
            "strided": q.a.stride(0) != q.kp, "linear": same,
            "triton_unpack": bool(torch.equal(w12_unpack(q).view(torch.int16),
                                              w.view(torch.int16))),
            "torch_unpack": bool(torch.equal(w12.unpack(q).view(torch.int16),
                                             w.view(torch.int16)))}

    # tune() on the real interpreted kernel, with a fake timer keyed on the config
    n, k, m = 16, 256, 1
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    p = w12.pack(w)
    fake_us = {8: [30.0, 31.0, 29.0], 4: [20.0, 22.0, 21.0], 16: [25.0, 25.0, 26.0]}
    current = {}

    def call(cfg, x, o):
        current["bn"] = cfg.bn
        w12_matmul(x, p, cfg, out=o, f32_dot=True)

    def timer(fn, rotations):
        fn()
        return fake_us[current["bn"]]

    prob = Problem("w12", n, k, m, p.nbytes + k * 4 + n * 4, 1,
                   lambda s: torch.randn(m, k, generator=torch.Generator().manual_seed(s)),
                   call, lambda x: x.double().float() @ w.float().T)
    cfgs = [KernelConfig(bm=1, bn=b, bk=128) for b in (8, 4, 16)]
    cfgs.append(KernelConfig(bm=1, bn=8, bk=96))  # not a power of two: fails to build
    recs = tune((n, k), m, cfgs, timer, problem=prob)
    out["tune"] = [r.to_dict() for r in recs]
    from specpilot.kernels.w12_wgmma import transposed  # the wgmma kernel's x^T, fp32 here

    out["transpose"] = []
    for m, k in ((1, 64), (9, 200), (16, 4000), (20, 96), (32, 130)):
        x = torch.randn(m, k, generator=g)
        xt = transposed(x)
        out["transpose"].append([list(xt.shape), bool(torch.equal(xt[:, :m], x.T))])
    print("RESULT " + json.dumps(out))


@pytest.fixture(scope="module")
def results() -> dict:
    return interpreted("tests.test_w12_interpret")


def test_w12_kernel_matches_reference(results):
    assert len(results["w12"]) == 2 * len(CASES)
    for r in results["w12"]:
        assert r["escapes"] >= 3
        assert r["finite"], r
        assert r["err"] < 1e-5 and r["col_err"] < 1e-5, r


def test_bf16_kernel_matches_reference(results):
    for r in results["bf16"]:
        assert r["finite"], r
        assert r["err"] < 1e-5, r


def test_split_k_counters_return_to_zero(results):
    assert results["counters_reset"]


def test_triton_unpack_is_bit_exact(results):
    assert results["unpack_all_patterns"]
    assert results["unpack_odd_shape"]


def test_planes_as_row_views_give_identical_results(results):
    """`benchmarks/w12_layout.py`'s layouts (padded rows; a row's codes and A words in one
    buffer): the fused kernel (GEMV, pipelined GEMV, sliced tensor-core path) is bit-identical
    to the dense planes', and both unpacks are bit-exact."""
    assert sorted(results["layouts"]) == ["pad", "rows", "rows_pad"]
    for kind, r in results["layouts"].items():
        assert r == {"strided": True, "linear": [True, True, True], "triton_unpack": True,
                     "torch_unpack": True}, kind


def test_transposed_x_for_the_wgmma_gathers(results):
    """The wgmma kernel's x^T (`w12_wgmma.transposed`): [K, M rounded up to 16], its first M
    columns exactly x^T, for 1-32 rows and ragged K."""
    assert [shape for shape, _ in results["transpose"]] == [[64, 16], [200, 16], [4000, 16],
                                                           [96, 32], [130, 32]]
    assert all(equal for _, equal in results["transpose"])


def test_tune_ranks_with_timer_and_flags_failures(results):
    recs = results["tune"]
    assert [r["config"]["bn"] for r in recs[:3]] == [4, 16, 8]  # fake medians 21, 25, 30
    assert [r["median_us"] for r in recs[:3]] == [21.0, 25.0, 30.0]
    assert all(r["correct"] and r["rel_error"] < 1e-5 for r in recs[:3])
    assert recs[0]["spread_us"] == pytest.approx(2.0)  # p80 - p20 of 20, 21, 22 (3 samples)
    bad = recs[3]
    assert bad["config"]["bk"] == 96 and not bad["correct"] and bad["note"]
    assert recs[0]["tbps"] == pytest.approx(recs[0]["nbytes"] / 21e-6 / 1e12)
