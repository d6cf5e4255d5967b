"""The cost model prices W12 linears from the device's tuned kernel table (`w12_times.py`):
as the engine builds them (W12 only where it gains 5% at every row count of the steps)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specpilot.costmodel.hardware import get_hardware
from specpilot.costmodel.roofline import ar_step, verify_step
from specpilot.costmodel.spec import load_spec
from specpilot.costmodel.w12_times import W12Times
from specpilot.runtime.errors import SpecPilotError


@pytest.fixture(autouse=True)
def _own_data(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "data"))


def _entries(rows: dict[str, tuple[float, float, float]]) -> dict:
    """{"NxK:bB": (w12, cublas, bf16) us} as a tuned table's entries."""
    out = {}
    for key, times in rows.items():
        for kernel, us in zip(("w12", "cublas", "bf16"), times, strict=True):
            out[f"{kernel}:{key}"] = {"config": {}, "median_us": us}
    return out


def test_factor_follows_the_engines_rule():
    t = W12Times(_entries({"100x200:b1": (8.0, 12.0, 10.0), "100x200:b8": (9.0, 12.0, 11.0),
                           "100x200:b16": (12.0, 12.0, 11.6)}))
    # W12 gains >= 5% over the best bf16 kernel at 1 and 8 rows: priced at W12 / cuBLAS
    assert t.factor(100, 200, 5, (1, 5)) == pytest.approx(9.0 / 12.0)
    assert t.factor(100, 200, 1, (1, 5)) == pytest.approx(8.0 / 12.0)
    # at 9-16 rows W12 loses to bf16 (11.6 us): the engine keeps the layer bf16, even in
    # its decode steps
    assert t.factor(100, 200, 9, (1, 9)) == 1.0
    assert t.factor(100, 200, 1, (1, 9)) == 1.0
    # above 32 rows W12 unpacks to bf16, never chosen
    assert t.factor(100, 200, 1, (1, 40)) == 1.0
    # an untuned shape is priced by its nearest tuned one; no W12 entry at a bucket: unknown
    assert t.factor(110, 190, 1, (1,)) == pytest.approx(8.0 / 12.0)
    assert t.factor(100, 200, 30, (30,)) is None


def test_h200_table_prices_verify_rows_as_measured():
    """8B-class on the H200's shipped table: at 5 verify rows (k = 4) and at 9 (k = 8) every
    linear but the o projection (W12 gains under 5% there) is cheaper than bf16, as the
    engine's own choice of W12 layers measured (109 of 145 at k = 8 since the batch-16
    entries were re-tuned on the wgmma kernel: docs/BENCHMARKS.md, twenty-fifth W12 run;
    37 before, only down and the LM head)."""
    hw = get_hardware("h200", "reference")
    bf16 = load_spec("8b")
    w12 = replace(bf16, weights="w12")
    for k, cheaper in ((4, {"qkv_proj", "gate_up_proj", "down_proj", "lm_head"}),
                       (8, {"qkv_proj", "gate_up_proj", "down_proj", "lm_head"})):
        a, b = verify_step(bf16, hw, 1, k), verify_step(w12, hw, 1, k)
        gemms = [o.name for o in a.ops if o.kind == "gemm"]
        for name in gemms:
            ea, eb = a.op(name).expected_ms, b.op(name).expected_ms
            if name in cheaper:
                assert eb < 0.95 * ea, (k, name, ea, eb)
            else:
                assert eb == pytest.approx(ea), (k, name, ea, eb)
    a, b = ar_step(bf16, hw, 1), ar_step(w12, hw, 1)
    assert all(b.op(o.name).expected_ms < 0.9 * o.expected_ms for o in a.ops if o.kind == "gemm")
    assert all(o.expected_ms >= o.bound_ms for o in b.ops)  # never under the floor
    # tied embeddings: the engine keeps the shared LM head bf16
    tied = replace(bf16, tie_word_embeddings=True)
    a, b = ar_step(tied, hw, 1), ar_step(replace(tied, weights="w12"), hw, 1)
    assert b.op("lm_head").expected_ms == pytest.approx(a.op("lm_head").expected_ms)
    assert b.op("down_proj").expected_ms < 0.9 * a.op("down_proj").expected_ms


def test_without_a_table_w12_keeps_the_byte_model():
    """A device with no tuned table: W12 linears stream their 3/4 of the bytes at the
    calibrated bf16 GEMM rate (of a matrix that size), so at 9 rows, where the H200's table
    keeps qkv bf16, they still come out cheaper."""
    hw = replace(get_hardware("h200", "reference"), kernel_table="")
    bf16 = load_spec("8b")
    w12 = replace(bf16, weights="w12")
    a, b = verify_step(bf16, hw, 1, 8).op("qkv_proj"), verify_step(w12, hw, 1, 8).op("qkv_proj")
    assert b.expected_ms < 0.9 * a.expected_ms


def test_the_users_table_comes_first(tmp_path):
    """The kernel agent's table in the data folder replaces the shipped one: one where W12
    loses everywhere prices every W12 linear as bf16."""
    hw = get_hardware("h200", "reference")
    entries = {}
    bf16 = load_spec("8b")
    for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)):
        entries |= _entries({f"{n}x{k}:b{b}": (20.0, 10.0, 10.0) for b in (1, 2, 4, 8)})
    path = tmp_path / "data" / "kernels" / "nvidia-h200.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device": "NVIDIA H200", "entries": entries}))
    w12 = replace(bf16, weights="w12")
    a, b = verify_step(bf16, hw, 1, 4), verify_step(w12, hw, 1, 4)
    for o in a.ops:
        if o.kind == "gemm":
            assert b.op(o.name).expected_ms == pytest.approx(o.expected_ms), o.name


@pytest.mark.parametrize("text", ["{not json", '["a list"]',
                                  '{"entries": {"w12:1x1:b1": {"median_us": "x"}}}',
                                  '{"entries": {"w12:1by1:b1": {"median_us": 1.0}}}',
                                  '{"entries": {"w12:1x1:b1": {"config": {}}}}'])
def test_a_broken_table_is_a_clear_error(tmp_path, text):
    path = tmp_path / "data" / "kernels" / "nvidia-h200.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    w12 = replace(load_spec("8b"), weights="w12")
    with pytest.raises(SpecPilotError, match="not a readable tuned kernel table"):
        ar_step(w12, get_hardware("h200", "reference"), 1)


def test_copies_agree_with_the_kernels():
    """The cost model keeps standard-library copies of the kernels' constants."""
    import inspect

    from specpilot.costmodel import w12_times
    from specpilot.kernels import tuning
    from specpilot.kernels.w12_linear import apply_w12

    assert w12_times.BUCKETS == tuning.BUCKETS
    assert w12_times.SHIPPED == tuning.SHIPPED.resolve()
    assert w12_times.MIN_GAIN == inspect.signature(apply_w12).parameters["min_gain"].default
