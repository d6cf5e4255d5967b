"""benchmarks/w12_lockstep.py on the CPU machine: the one-program-an-SM batch-1 W12 GEMV
under the interpreter against the fp64 reference (row blocks of unequal size, the rows past
a block masked off), and its per-step barrier compiled for sm_90."""

from __future__ import annotations

import json
import re

import pytest

from tests import test_kernels_sm90 as sm90
from tests.interpret import interpreted

CASES = [  # (N, K, (bk, warps, stages, programs an SM, sync)); 2 SMs under the interpreter
    (11, 1024, (512, 2, 0, 1, True)),  # blocks of 5 and 6 rows in 8-row tiles
    (11, 1024, (512, 2, 2, 1, False)),
    (13, 2048, (1024, 1, 3, 2, True)),  # 4 blocks of 3-4 rows, two groups a step
]


def _child() -> None:
    import torch

    from benchmarks.w12_lockstep import lock_matmul
    from specpilot.kernels import w12

    g = torch.Generator().manual_seed(0)
    out = []
    for n, k, args in CASES:
        w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        w[0, 3], w[n - 1, k - 1] = 7.5, 1e-30  # escapes in the first and last blocks
        w[5, 1::5] = 3e4  # many escape chunks in one row, at a block's edge
        p = w12.pack(w)
        x = torch.randn(1, k, generator=g)
        ref = x.double() @ w.double().T
        y = torch.full((1, n + 3), float("nan"))  # 3 columns past N must stay unwritten
        lock_matmul(x, p, y[:, :n], *args)
        terms = (x.double().abs() @ w.double().abs().T).squeeze(0)
        out.append({"case": [n, k, list(args)], "escapes": p.n_escapes,
                    "col_err": float(((y[:, :n].double() - ref).abs().squeeze(0) / terms).max()),
                    "past_n": bool(torch.isnan(y[:, n:]).all())})
    print("RESULT " + json.dumps(out))


@pytest.fixture(scope="module")
def results() -> list:
    return interpreted("tests.test_w12_lockstep")


def test_every_row_block_matches_the_reference(results):
    assert len(results) == len(CASES)
    for r in results:
        assert r["escapes"] > 0
        assert r["col_err"] < 1e-5, r  # NaN (an unwritten output) fails too
        assert r["past_n"], r  # nothing stored past the last block


def test_sync_puts_a_barrier_in_the_loop_for_sm90():
    from benchmarks.w12_lockstep import w12_lock_kernel

    consts = {"BN": 64, "NG": 2, "GS": 64, "GW": 64, "ECH": 16, "STAGES": None}

    def barriers(sync: bool) -> int:
        ptx = sm90._compile(w12_lock_kernel, {**consts, "SYNC": sync}, 16, 1).asm["ptx"]
        return len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx))

    assert barriers(True) == barriers(False) + 1
