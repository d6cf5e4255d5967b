"""benchmarks/w12_dynamic.py on the CPU machine: the queued and static persistent batch-1
W12 GEMV under the interpreter against the fp64 reference (the queue handed back empty for
the next launch), and its lane-0 PTX atomics compiled for sm_90."""

from __future__ import annotations

import json
import re

import pytest

from tests import test_kernels_sm90 as sm90
from tests.interpret import interpreted

CASES = [  # (N, K, (bn, bk, warps, stages, programs an SM, queue)); 2 SMs under the interpreter
    (8, 1024, (2, 512, 1, 2, 1, 1)),  # 4 tiles, 2 programs: the queue hands out 2
    (8, 1024, (2, 512, 1, 2, 1, 0)),
    (12, 2048, (1, 1024, 1, 3, 2, 1)),  # 12 tiles, 4 programs, two groups a step
    (12, 2048, (4, 1024, 1, 3, 1, 0)),
]


def _child() -> None:
    import torch

    from benchmarks.w12_dynamic import _COUNTERS, dyn_matmul
    from specpilot.kernels import w12

    g = torch.Generator().manual_seed(0)
    out = []
    for n, k, args in CASES:
        w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        w[0, 3], w[n - 1, k - 1] = 7.5, 1e-30  # escapes in the first and last tiles
        w[2, 1::5] = 3e4  # many escape chunks in one row
        p = w12.pack(w)
        for _ in range(2):  # a second launch finds the queue reset
            x = torch.randn(1, k, generator=g)
            ref = x.double() @ w.double().T
            y = torch.full((1, n), float("nan"))
            dyn_matmul(x, p, y, *args)
            terms = (x.double().abs() @ w.double().abs().T).squeeze(0)
            out.append({"case": [n, k, list(args)], "escapes": p.n_escapes,
                        "col_err": float(((y.double() - ref).abs().squeeze(0) / terms).max()),
                        "counters": _COUNTERS[torch.device("cpu"), 0][:2].tolist()})
    print("RESULT " + json.dumps(out))


@pytest.fixture(scope="module")
def results() -> list:
    return interpreted("tests.test_w12_dynamic")


def test_every_tile_of_every_launch_matches_the_reference(results):
    assert len(results) == 2 * len(CASES)
    for r in results:
        assert r["escapes"] > 0
        assert r["col_err"] < 1e-5, r  # NaN (an unwritten output) fails too
        assert r["counters"] == [0, 0], r  # the last program out reset the queue


def test_lane0_atomic_compiles_for_sm90(monkeypatch):
    from benchmarks.w12_dynamic import w12_dyn_kernel

    monkeypatch.setitem(sm90.POINTERS, "ctr_ptr", "*i32")
    consts = {"BN": 2, "NG": 2, "GS": 64, "GW": 64, "ECH": 16, "STAGES": 2}
    def atomics(queue: int) -> list[str]:
        ptx = sm90._compile(w12_dyn_kernel, {**consts, "QUEUE": queue}, 1, 2).asm["ptx"]
        assert "shfl.sync.idx.b32" in ptx  # the ticket handed to the lanes where it is used
        return re.findall(r"atom\.[\w.]+", ptx)

    # the queue's ticket by lane 0 (relaxed: the inline PTX), the reset (Triton's atomics)
    assert sorted(atomics(2)) == ["atom.global.add.u32", "atom.global.gpu.acq_rel.add.u32",
                                  "atom.global.gpu.acq_rel.exch.b32",
                                  "atom.global.gpu.acq_rel.exch.b32"]
    assert atomics(3) == ["atom.global.add.u64"]  # the never-reset 64-bit counter only
