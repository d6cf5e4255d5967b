"""benchmarks/w12_timeline.py on the CPU machine: its stamped kernel copies compile for sm_90
with their two timer reads, and its summary reads made-up stamps right."""

from __future__ import annotations

import pytest
import torch

from benchmarks.w12_timeline import stamped, summary
from specpilot.kernels.w12 import group_words
from specpilot.kernels.w12_triton import KernelConfig
from tests import test_kernels_sm90 as sm90


@pytest.fixture()
def pointers(monkeypatch):
    monkeypatch.setitem(sm90.POINTERS, "tl_ptr", "*i64")
    monkeypatch.setitem(sm90.POINTERS, "src", "*i32")
    monkeypatch.setitem(sm90.POINTERS, "out", "*i32")


def _timer_reads(kernel) -> tuple[int, int]:
    ptx = kernel.asm["ptx"]
    return ptx.count("%globaltimer;"), ptx.count("%smid;")


def test_stamped_kernels_compile_with_a_start_and_an_end_stamp(pointers):
    w12 = stamped("w12")
    cfg = KernelConfig(bm=1, bn=2, bk=1024, warps=1, stages=2, variant=17 | 32)
    _, consts = w12.kernel_constants(8192, 8192, group_words(8192), cfg, use_pdl=True)
    assert _timer_reads(sm90._compile(w12.w12_linear_kernel, consts, 1, 2)) == (2, 1)
    bf16 = stamped("bf16")
    _, consts = bf16.kernel_constants(8192, KernelConfig(bm=1, bn=4, bk=1024, variant=0))
    assert _timer_reads(sm90._compile(bf16.bf16_linear_kernel, consts, 4, 3)) == (2, 1)
    read = stamped("read")
    assert _timer_reads(sm90._compile(read._read_kernel, {"BLOCK": 2048, "STEPS": 4}, 4,
                                      1)) == (2, 1)


def test_summary_of_made_up_stamps():
    # two launches of four programs (ns): SM 0 runs three of them, SM 1 one
    first = [[0, 900, 0], [0, 900, 0], [0, 900, 0], [0, 900, 1]]
    second = [[1000, 3000, 0], [1000, 4000, 0], [1200, 5000, 0], [1400, 2400, 1]]
    s = summary([torch.tensor([first, second])])
    assert s["span"] == pytest.approx(4.0)  # 5000 - 1000
    assert s["ramp"] == pytest.approx(0.4)  # last start 1400
    assert s["end50"] == pytest.approx(2.0)  # torch's median: the lower middle, 3000
    assert s["tail"] == pytest.approx(2.0)
    assert s["prog"] == pytest.approx(2.0)  # durations 2000, 3000, 3800, 1000
    assert s["gap"] == pytest.approx(0.1)  # 1000 - 900
    assert s["uneven"] == pytest.approx(2.6)  # SM 0 ends at 4000, SM 1 at 1400
    assert (s["programs"], s["per_sm"], s["sms"]) == (4, [1, 3], 2)
    # ends 2000, 3000, 4000, 1400 after t0: variance 980000 ns^2, of which 480000 between
    # the SMs' means (3000, 1400); against the program index 0..3, correlation -400 / 4427
    assert s["end_sd"] == pytest.approx(0.98995, abs=1e-4)
    assert s["by_sm"] == pytest.approx(480000 / 980000)
    assert s["by_pid"] == pytest.approx(-400 / (5 * 3920000) ** 0.5)
