"""The engine's linear knobs on CPU: `weights = "w12"` is a one-line error off CUDA/bf16,
`gemv = "auto"` is a no-op there, and the Triton-GEMV backend (`GemvLinear`) keeps the
torch path's outputs; `gemv_configs` follows the tuned table."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specpilot.kernels.gemv_bf16 import GemvLinear, apply_gemv, gemv_configs
from specpilot.kernels.tuning import TunedTable, TuningRecord
from specpilot.kernels.w12_linear import W12Linear
from specpilot.kernels.w12_triton import KernelConfig
from specpilot.runtime.cli_commands import resolve_spec
from specpilot.runtime.errors import SpecPilotError
from specpilot.runtime.factory import apply_linear_knobs, build_engine
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.loader import load_model

PROMPT = [5, 17, 42, 7, 99, 3]


def test_w12_on_cpu_fp32_is_a_one_line_error(qwen3_dir):
    with pytest.raises(SpecPilotError) as e:
        build_engine(qwen3_dir, Knobs(weights="w12"), "cpu", "float32")
    msg = str(e.value)
    assert "\n" not in msg and "w12" in msg and "cuda" in msg and "bfloat16" in msg


def test_w12_on_a_cpu_bf16_model_is_refused_too(qwen3_dir):
    model = load_model(qwen3_dir, dtype="bfloat16")
    with pytest.raises(SpecPilotError, match="w12"):
        apply_linear_knobs(model, Knobs(weights="w12"))
    assert not any(isinstance(m, W12Linear) for m in model.modules())


def test_gemv_knob_is_validated():
    with pytest.raises(SpecPilotError, match="gemv"):
        Knobs(gemv="triton").validate()
    assert Knobs().gemv == "auto" and Knobs().with_(gemv="cublas").gemv == "cublas"


def test_gemv_auto_is_a_no_op_on_cpu(qwen3_dir):
    ref, _ = build_engine(qwen3_dir, Knobs(gemv="cublas"))
    eng, _ = build_engine(qwen3_dir, Knobs(gemv="auto"))
    assert not any(isinstance(m, GemvLinear) for m in eng.target.modules())
    a = ref.generate([PROMPT], 12, ignore_eos=True)[0].output_ids
    b = eng.generate([PROMPT], 12, ignore_eos=True)[0].output_ids
    assert a == b


def test_resolve_spec_takes_weights_flag(qwen3_dir):
    spec = resolve_spec(qwen3_dir, None, None, None, None, None, None, None, weights="w12")
    assert spec.knobs.weights == "w12"
    with pytest.raises(SpecPilotError, match="weights"):
        resolve_spec(qwen3_dir, None, None, None, None, None, None, None, weights="int4")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_linear_keeps_the_torch_path_on_cpu(dtype):
    torch.manual_seed(0)
    lin = nn.Linear(64, 24, bias=True).to(dtype)
    g = GemvLinear(lin, {1: KernelConfig(bm=1, bn=4, bk=1024, variant=0)})
    assert g.weight is lin.weight and g.bias is lin.bias  # shared, so ties survive
    for shape in [(1, 64), (3, 5, 64), (40, 64)]:
        x = torch.randn(*shape).to(dtype)
        assert torch.equal(g(x), lin(x))


def test_apply_gemv_leaves_a_cpu_model_alone(qwen3_dir):
    model = load_model(qwen3_dir, dtype="bfloat16")
    rep = apply_gemv(model, TunedTable("fake"))
    assert not rep.swapped and rep.kept
    assert not any(isinstance(m, GemvLinear) for m in model.modules())


def _rec(kernel, n, k, b, us, cfg=None):
    cfg = cfg or KernelConfig(bm=b, bn=4, bk=1024)
    return TuningRecord(kernel, n, k, b, cfg.to_dict(), us, 0.1, 1, 1.0, 10.0, True, 1e-3)


def test_gemv_configs_follow_the_table():
    t = TunedTable("fake")
    win = KernelConfig(bm=1, bn=4, bk=1024, variant=0)
    other = KernelConfig(bm=1, bn=8, bk=512)
    # three shapes at batch 1: Triton wins on two (one config twice), loses on one
    for (n, k), tri, cub, cfg in [((64, 128), 10.0, 12.0, win), ((96, 256), 20.0, 23.0, win),
                                  ((32, 512), 30.0, 29.0, other)]:
        t.add(_rec("bf16", n, k, 1, tri, cfg))
        t.add(_rec("cublas", n, k, 1, cub))
    # batch 8: cuBLAS wins everywhere it was measured
    t.add(_rec("bf16", 64, 128, 8, 15.0))
    t.add(_rec("cublas", 64, 128, 8, 12.0))
    assert gemv_configs(64, 128, t) == {1: win}  # measured: Triton at b1, cuBLAS at b8
    assert gemv_configs(32, 512, t) == {}  # measured loss at b1; b8 median gain < 1
    # unmeasured shape: b1 median gain 1.15 >= 1.02, with the config that won most often
    assert gemv_configs(1000, 1000, t) == {1: win}
    assert gemv_configs(1000, 1000, t, min_gain=1.3) == {}
    assert gemv_configs(1000, 1000, TunedTable("empty")) == {}
