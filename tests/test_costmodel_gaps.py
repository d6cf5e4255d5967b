"""Gap ranking against the roofline, measurement-error flags, and CPU calibration."""

from __future__ import annotations

import json

import pytest

from specpilot.costmodel.gaps import MEASUREMENT_ERROR, GapReport, Profile, rank_gaps
from specpilot.costmodel.hardware import Ceilings, calibration_path, get_hardware
from specpilot.costmodel.roofline import ar_step, draft_cost, verify_step
from specpilot.costmodel.spec import load_spec
from specpilot.runtime.errors import SpecPilotError


@pytest.fixture(autouse=True)
def _data(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "data"))


def test_ar_gaps_ranked_with_reasons():
    s = load_spec("8b")
    hw = get_hardware("h200", "datasheet")
    ar = ar_step(s, hw, 1, 1024)
    p = Profile(batch_size=1, tokens_per_step=1.0, verify_ms=4.5, accept_ms=0.1,
                overhead_ms=0.5)
    rep = rank_gaps(p, {"verify": ar}, hw)
    assert [g.name for g in rep.gaps][:3] == ["verify", "overhead", "accept"]
    v = rep.gaps[0]
    assert v.gap_ms == pytest.approx(4.5 - ar.bound_ms)
    pct = round(100 * ar.bytes / 4.5e-3 / hw.mem_bw)
    assert f"memory-bound at {pct}% of bandwidth" in v.reason
    assert "launch/sync" in rep.gaps[1].reason
    assert not rep.measurement_error
    assert rep.measured_ms_per_token == pytest.approx(5.1)
    assert rep.bound_ms_per_token == pytest.approx(ar.bound_ms)
    assert sum(g.share for g in rep.gaps) == pytest.approx(1.0)


def test_spec_gaps_per_committed_token_and_ops():
    s = load_spec("8b")
    hw = get_hardware("h200", "datasheet")
    ver = verify_step(s, hw, 4, 3, 512)
    dr = draft_cost("ngram", hw, 4, 3, 512)
    p = Profile(batch_size=4, tokens_per_step=2.5, k=3, draft_ms=0.3, verify_ms=5.0,
                accept_ms=0.2, overhead_ms=0.1,
                ops={"verify/gate_up_proj": 2.4, "lm_head": 0.3, "verify/down_proj": 1.0})
    rep = rank_gaps(p, {"draft": dr, "verify": ver}, hw)
    tok = 4 * 2.5  # committed tokens per step
    g = {x.name: x for x in rep.gaps}
    assert g["verify"].measured_ms == pytest.approx(5.0 / tok)
    assert g["draft"].bound_ms == 0 and "host-side" in g["draft"].reason
    assert [x.name for x in rep.op_gaps] == ["verify/gate_up_proj", "verify/down_proj",
                                             "verify/lm_head"]
    gu = ver.op("gate_up_proj")
    assert rep.op_gaps[0].gap_ms == pytest.approx((2.4 - gu.bound_ms) / tok)
    # JSON round trip of what the agents receive
    back = GapReport.from_json(rep.to_json())
    assert back.to_dict() == rep.to_dict()
    assert Profile.from_json(p.to_json()) == p
    with pytest.raises(SpecPilotError, match="no operator"):
        rank_gaps(Profile(1, 1.0, verify_ms=5, ops={"verify/flash": 1.0}), {"verify": ver}, hw)


def test_faster_than_physics_is_flagged():
    s = load_spec("8b")
    hw = get_hardware("h200", "datasheet")
    ar = ar_step(s, hw, 1, 0)
    fake = Profile(batch_size=1, tokens_per_step=1.0, verify_ms=0.8 * ar.bound_ms,
                   overhead_ms=0.3, ops={"gate_up_proj": 0.5 * ar.op("gate_up_proj").bound_ms})
    rep = rank_gaps(fake, {"verify": ar}, hw)
    assert rep.measurement_error
    assert rep.gaps[0].name == "verify" and rep.gaps[0].flag == MEASUREMENT_ERROR
    assert "below the physical floor" in rep.gaps[0].reason
    assert rep.op_gaps[0].flag == MEASUREMENT_ERROR
    ok = Profile(batch_size=1, tokens_per_step=1.0, verify_ms=1.01 * ar.bound_ms)
    assert not rank_gaps(ok, {"verify": ar}, hw).measurement_error


def test_launch_bound_small_model():
    tiny = load_spec({"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                      "intermediate_size": 128, "torch_dtype": "bfloat16"})
    hw = get_hardware("h200", "datasheet")
    ar = ar_step(tiny, hw, 1, 16)
    rep = rank_gaps(Profile(1, 1.0, verify_ms=0.1), {"verify": ar}, hw)
    v = next(g for g in rep.gaps if g.name == "verify")
    assert v.reason.startswith("launch-bound")
    assert f"~{ar.kernels} kernels" in v.reason


def test_calibrate_cpu_small(monkeypatch):
    from specpilot.costmodel.calibrate import calibrate

    c = calibrate("cpu", shapes=((64, 64), (128, 128)), batches=(1, 4), copy_bytes=2 << 20,
                  gemm_n=64)
    p = calibration_path("cpu")
    assert p.is_file()
    assert [x.name for x in p.parent.iterdir()] == ["cpu.json"]  # no temp file left behind
    d = json.loads(p.read_text())
    assert Ceilings.from_dict(d) == c
    assert c.copy_bw > 0 and c.read_bw > 0 and c.gemm_flops["fp32"] > 0
    assert len(c.skinny) == 4 and all(r[2] > 0 for r in c.skinny)
    assert c.launch_s > 0 and c.step_overhead_s > 0
    hw = get_hardware("cpu")  # "auto" now picks the calibration up
    assert hw.calibrated == c.measured_at
    assert hw.stream_bw == max(c.copy_bw, c.read_bw)
    assert hw.step_overhead_s == c.step_overhead_s
    assert get_hardware("cpu", "datasheet").calibrated == ""
    spec = load_spec({"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2,
                      "intermediate_size": 128, "torch_dtype": "float32"})
    st = ar_step(spec, hw, 1, 8)
    # expected = skinny-GEMM table (64x64 fp32 = 16 KB, clamped) + the rest at stream bw
    qkv = st.op("qkv_proj")
    want = (qkv.weight_bytes / hw.gemm_bw(qkv.matrix_bytes, 1)
            + qkv.act_bytes / hw.achieved_bw)
    assert qkv.expected_ms == pytest.approx(max(want, qkv.flops / c.gemm_flops["fp32"]) * 1e3)
    p.write_text("{not json")
    with pytest.raises(SpecPilotError, match="not a calibration file"):
        get_hardware("cpu")
