"""Cost model: spec parsing, roofline hand counts, step scaling, drafter costs, speedup bound."""

from __future__ import annotations

import json

import pytest

from specpilot.costmodel.hardware import TABLE, Hardware, get_hardware
from specpilot.costmodel.roofline import (
    StepCost,
    ar_step,
    draft_cost,
    expected_experts,
    forward_cost,
    verify_step,
)
from specpilot.costmodel.spec import ModelSpec, load_spec
from specpilot.costmodel.speedup import best_k, expected_tokens, speedup_table
from specpilot.runtime.errors import SpecPilotError

DENSE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1000,
             "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16"}
MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1000,
           "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "torch_dtype": "bfloat16"}
# a device with round numbers: 1 TB/s, 100 TFLOP/s for everything
TOY = Hardware("toy", "toy", 1e12, {"bf16": 100e12, "fp32": 100e12}, 1e6, 1,
               step_overhead_s=0.0)


@pytest.fixture(autouse=True)
def _no_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "data"))


def test_dense_gqa_hand_count():
    s = ModelSpec.from_hf(DENSE)
    assert (s.num_kv_heads, s.head_dim, s.weights) == (2, 16, "bf16")
    st = ar_step(s, TOY, batch=1, context=10)
    # qkv: N = (4 + 2*2) * 16 = 128, K = 64, bf16, 2 layers
    assert st.op("qkv_proj").weight_bytes == 128 * 64 * 2 * 2 == 32768
    assert st.op("qkv_proj").flops == 2 * 1 * 128 * 64 * 2 == 32768
    assert st.op("qkv_proj").act_bytes == 1 * (64 + 128) * 2 * 2 == 768
    assert st.op("o_proj").weight_bytes == 64 * 64 * 2 * 2 == 16384
    assert st.op("gate_up_proj").weight_bytes == 256 * 64 * 2 * 2 == 65536
    assert st.op("down_proj").weight_bytes == 64 * 128 * 2 * 2 == 32768
    assert st.op("lm_head").weight_bytes == 1000 * 64 * 2 == 128000
    assert st.op("lm_head").flops == 2 * 1000 * 64 == 128000
    # embedding: only the looked-up row (1 token x 64 x 2 bytes)
    assert st.op("embed").weight_bytes == 1 * 64 * 2 == 128
    att = st.op("attention")
    # KV read: (context 10 + 1 new) rows x K,V x 2 kv heads x 16 x 2 bytes x 2 layers
    assert att.kv_read_bytes == 11 * 2 * 2 * 16 * 2 * 2 == 2816
    assert att.kv_write_bytes == 1 * 2 * 2 * 16 * 2 * 2 == 256
    # QK^T and PV: 4 FLOPs x 4 heads x 16 dims x 11 positions x 2 layers
    assert att.flops == 4 * 4 * 16 * 11 * 2 == 5632
    # the bound of a memory-bound op is bytes / bandwidth
    o = st.op("lm_head")
    assert o.limit == "memory"
    assert o.bound_ms == pytest.approx((128000 + (64 + 1000) * 2) / 1e12 * 1e3)
    assert st.bound_ms == pytest.approx(sum(x.bound_ms for x in st.ops))
    # params: per layer attn 64*128 + 64*64, mlp 3*64*128; embeddings twice (untied)
    assert s.params() == 2 * (8192 + 4096 + 24576) + 2 * 1000 * 64 == 201728
    tied = ModelSpec.from_hf({**DENSE, "tie_word_embeddings": True})
    assert tied.params() == 201728 - 64000


def test_moe_hand_count():
    s = ModelSpec.from_hf(MOE)
    assert s.num_experts == 8 and s.experts_per_tok == 2 and s.moe_layers == 2
    # 4 tokens, top-2 of 8: 8 * (1 - 0.75^4) = 5.46875 experts expected per layer
    assert expected_experts(8, 2, 4) == pytest.approx(5.46875)
    assert expected_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts(8, 2, 1000) == pytest.approx(8.0)
    st = ar_step(s, TOY, batch=4, context=0)
    names = [o.name for o in st.ops]
    assert "gate_up_proj" not in names and "router" in names
    # gate_up of one expert: [64, 64] bf16 = 8192 bytes; x 5.46875 experts x 2 layers
    assert st.op("experts_gate_up").weight_bytes == pytest.approx(5.46875 * 8192 * 2)
    assert st.op("experts_down").weight_bytes == pytest.approx(5.46875 * 4096 * 2)
    # every token runs 2 experts: 2 * 4 tokens * 2 experts * 64 * 64 * 2 layers
    assert st.op("experts_gate_up").flops == 2 * 4 * 2 * 64 * 64 * 2 == 131072
    assert st.op("experts_down").flops == 2 * 4 * 2 * 64 * 32 * 2 == 65536
    assert st.op("router").weight_bytes == 8 * 64 * 2 * 2 == 2048
    # one dense layer among them
    mixed = ModelSpec.from_hf({**MOE, "mlp_only_layers": [1]})
    assert mixed.moe_layers == 1
    m = ar_step(mixed, TOY, 4, 0)
    assert m.op("gate_up_proj").count == 1 and m.op("experts_down").count == 1


def test_weight_formats():
    base = ar_step(ModelSpec.from_hf(DENSE), TOY, 1, 0).op("down_proj")
    w12 = ar_step(ModelSpec.from_hf(DENSE, weights="w12"), TOY, 1, 0).op("down_proj")
    fp8 = ar_step(ModelSpec.from_hf(DENSE, weights="fp8"), TOY, 1, 0).op("down_proj")
    fp32 = ar_step(ModelSpec.from_hf({**DENSE, "torch_dtype": "float32"}), TOY, 1, 0)
    # 12 bits a weight + (row base byte + int32 row pointer) a row + escape allowance
    assert w12.weight_bytes == 2 * (64 * 128 * 1.5 + 64 * 5 + 512)
    assert fp8.weight_bytes == 2 * (64 * 128 * 1 + 64 * 4)  # 1 byte + fp32 scale per row
    assert base.weight_bytes == 2 * 64 * 128 * 2
    assert fp32.op("down_proj").weight_bytes == 2 * 64 * 128 * 4
    assert fp32.op("attention").kv_write_bytes == 2 * 2 * 16 * 4 * 2  # fp32 KV cache
    with pytest.raises(SpecPilotError):
        ModelSpec.from_hf(DENSE, weights="int3")


def test_verify_is_k_plus_one_flops_and_one_times_bytes():
    s = load_spec("8b")
    hw = get_hardware("h200", "datasheet")
    ar = ar_step(s, hw, 1, 1024)
    for k in (1, 4, 8):
        v = verify_step(s, hw, 1, k, 1024)
        assert v.flops / ar.flops == pytest.approx(k + 1, rel=0.01)
        assert v.bytes / ar.bytes == pytest.approx(1.0, abs=0.01)
        assert v.bound_ms / ar.bound_ms < 1.02


def test_batch_and_context_scaling():
    s = load_spec("8b")
    hw = get_hardware("h200", "datasheet")
    a1, a8 = ar_step(s, hw, 1, 1024), ar_step(s, hw, 8, 1024)
    w = lambda st: sum(o.weight_bytes for o in st.ops if o.kind == "gemm")
    assert w(a8) == w(a1)  # weights are read once per step whatever the batch
    assert a8.op("attention").kv_read_bytes == 8 * a1.op("attention").kv_read_bytes
    assert a8.op("down_proj").flops == 8 * a1.op("down_proj").flops
    assert a1.bound_ms < a8.bound_ms < 2 * a1.bound_ms  # memory-bound: batching is cheap
    big = ar_step(s, hw, 512, 1024)
    assert big.op("gate_up_proj").limit == "compute"  # 512 tokens pass the ridge (~206)
    c2 = ar_step(s, hw, 1, 2048)
    # 1024 more cached tokens: x K,V x 8 kv heads x 128 x 2 bytes x 36 layers
    assert (c2.op("attention").kv_read_bytes - a1.op("attention").kv_read_bytes
            == 1024 * 2 * 8 * 128 * 2 * 36)
    with pytest.raises(SpecPilotError):
        forward_cost(s, hw, 0, 1, 0)


def test_drafter_costs():
    target = ModelSpec.from_hf(DENSE)
    small = ModelSpec.from_hf({**DENSE, "num_hidden_layers": 1, "hidden_size": 32,
                               "intermediate_size": 64})
    ng = draft_cost("ngram", TOY, 2, 4)
    assert ng.bytes == 0 and ng.bound_ms == 0
    d = draft_cost("draft", TOY, 2, 4, 16, drafter=small)
    one = ar_step(small, TOY, 2, 16)
    assert d.bytes == pytest.approx(4 * one.bytes)  # k sequential one-token steps
    assert d.bound_ms == pytest.approx(4 * one.bound_ms)
    assert d.passes == 4
    block = ModelSpec.from_hf({**DENSE, "num_hidden_layers": 1, "target_layers": [0, 1, 1]})
    assert block.target_layers == 3
    b = draft_cost("block", TOY, 2, 4, 16, drafter=block, target=target)
    fwd = forward_cost(block, TOY, 2, 5, 16)
    # one pass over k+1 positions + the target's hidden states (2 x 5 tokens x 64 x 3 layers
    # x 2 B) + the fc projecting them [64, 192] (weights 64*192*2 B, in 192 + out 64 a token)
    fc = 64 * 192 * 2 + 2 * 5 * (192 + 64) * 2
    assert b.bytes == pytest.approx(fwd.bytes + 2 * 5 * 64 * 3 * 2 + fc)
    assert b.op("hidden_fc").flops == 2 * 10 * 64 * 192
    with pytest.raises(SpecPilotError):
        draft_cost("draft", TOY, 1, 4)
    with pytest.raises(SpecPilotError):
        draft_cost("medusa", TOY, 1, 4, drafter=small)


def test_expected_tokens():
    assert expected_tokens(4, alpha=0.5) == pytest.approx((1 - 0.5**5) / 0.5)  # 1.9375
    assert expected_tokens(3, alpha=1.0) == 4.0
    assert expected_tokens(3, alpha=0.0) == 1.0
    hist = [1, 1, 2]  # steps that accepted 0, 1, 2 drafts (measured at k=2)
    assert expected_tokens(2, histogram=hist) == pytest.approx((1 * 1 + 1 * 2 + 2 * 3) / 4)
    assert expected_tokens(1, histogram=hist) == pytest.approx((1 * 1 + 1 * 2 + 2 * 2) / 4)
    with pytest.raises(SpecPilotError):
        expected_tokens(3, histogram=hist)
    with pytest.raises(SpecPilotError):
        expected_tokens(3, alpha=1.5)


def test_speedup_and_best_k():
    s = load_spec("8b")
    hw = get_hardware("h200", "datasheet")
    rows = speedup_table(s, hw, 1, [1, 2, 4], context=512, alpha=0.8)
    ar = ar_step(s, hw, 1, 512)
    for r in rows:
        # batch 1 is memory-bound: a verify costs about an AR step, so speedup ~ tokens/step
        assert r.bound_speedup == pytest.approx(r.tokens_per_step, rel=0.05)
        assert r.ar_bound_tok_s == pytest.approx(1e3 / ar.bound_ms)
    assert rows[0].tok_s < rows[1].tok_s < rows[2].tok_s
    best = best_k(s, hw, [1, 256], list(range(1, 9)), context=512, alpha=0.8)
    # large batches are compute-bound: drafting more tokens stops paying
    assert best[1].k > best[256].k
    assert best[256].speedup < best[1].speedup


def test_json_round_trip_and_loading(tmp_path):
    s = ModelSpec.from_hf(MOE)
    assert ModelSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    st = verify_step(s, TOY, 2, 3, 100)
    back = StepCost.from_dict(json.loads(json.dumps(st.to_dict())))
    assert back.to_dict() == st.to_dict()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(DENSE))
    assert load_spec(tmp_path / "m").hidden_size == 64
    assert load_spec(str(tmp_path / "m" / "config.json")).name == "m"
    assert load_spec("random:32b").num_layers == 64
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(SpecPilotError, match="missing"):
        load_spec(tmp_path / "bad.json")
    with pytest.raises(SpecPilotError):
        load_spec(tmp_path / "nope")


def test_real_checkpoint_config(qwen3_dir, llama_dir):
    from specpilot.runtime.config import ModelConfig

    for d in (qwen3_dir, llama_dir):
        s = load_spec(d)
        c = ModelConfig.from_file(d)
        assert (s.hidden_size, s.num_kv_heads, s.head_dim, s.vocab_size) == (
            c.hidden_size, c.num_kv_heads, c.head_dim, c.vocab_size)
        assert s.tie_word_embeddings == c.tie_word_embeddings
        assert s.weights == "fp32"


def test_hardware_table():
    for key, hw in TABLE.items():
        assert hw.mem_bw > 0 and hw.flops["bf16"] > 0
        for f in ("mem_bw", "flops", "l2_bytes", "sm_count"):
            assert hw.sources.get(f), (key, f)  # every number names its source
    assert get_hardware("NVIDIA H200").key == "h200"
    assert get_hardware("a100").peak_flops("fp8") == TABLE["a100"].flops["bf16"]
    with pytest.raises(SpecPilotError, match="unknown gpu"):
        get_hardware("tpu-v9")
    with pytest.raises(SpecPilotError, match="no calibration"):
        get_hardware("h100", "calibrated")
    ref = get_hardware("h200", "reference")
    # measured ceilings predict; the datasheet stays the floor
    assert ref.bound_bw == TABLE["h200"].mem_bw
    assert ref.achieved_bw < ref.bound_bw
    s = load_spec("8b")
    st = ar_step(s, ref, 1, 0)
    assert st.expected_ms > st.bound_ms
    # the interpolated skinny-GEMM bandwidth stays within the measured range
    assert 2.3e12 < ref.gemm_bw(70e6, 3) < 4.3e12
    assert ref.gemm_bw(1e3, 1) == ref.gemm_bw(33554432.0, 1)  # clamped below
