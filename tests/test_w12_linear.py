"""W12Linear / apply_w12 on a real (random) checkpoint, the tuned-config table, and the
`specpilot w12 stats` command."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from specpilot.kernels import w12 as fmt
from specpilot.kernels.tuning import (
    TunedTable,
    TuningRecord,
    best,
    bucket,
    candidate_configs,
    default_config,
    load_table,
    table_path,
)
from specpilot.kernels.w12_linear import W12Linear, apply_w12, nearest_shape, predicted_gain
from specpilot.kernels.w12_triton import (
    GLUON,
    WGMMA,
    KernelConfig,
    w12_default_config,
    w12_matmul,
)
from specpilot.runtime.loader import load_model


def test_w12linear_matches_linear_with_bias():
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=True).to(torch.bfloat16)
    m = W12Linear.from_linear(lin)
    x = torch.randn(2, 3, 96).to(torch.bfloat16)
    ref = (x.float() @ lin.weight.float().T + lin.bias.float())
    y = m(x)
    assert y.shape == (2, 3, 40) and y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2)
    assert torch.equal(fmt.unpack(m.w12).view(torch.int16), lin.weight.view(torch.int16))
    assert m.weight.dtype == torch.bfloat16 and m.weight.numel() == 0


def test_w12linear_rejects_fp32():
    with pytest.raises(ValueError):
        W12Linear.from_linear(nn.Linear(8, 8))


def test_apply_w12_on_checkpoint_keeps_logits(qwen3_dir):
    model = load_model(qwen3_dir, dtype="bfloat16")
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    pos = torch.arange(ids.shape[1])[None]
    ref, _ = model(ids, pos, use_cache=False)
    rep = apply_w12(model, min_gain=0.0)  # tiny K pads to 128: W12 is not smaller here
    n_linear = 2 * 7 + 1  # q k v o gate up down per layer, and lm_head
    assert rep.applied == n_linear == len(rep.layers)
    mods = [m for m in model.modules() if isinstance(m, W12Linear)]
    assert len(mods) == n_linear
    assert rep.bytes_after == sum(m.w12.nbytes for m in mods)
    assert model.dtype == torch.bfloat16  # the lm_head stand-in keeps this working
    out, _ = model(ids, pos, use_cache=False)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, ref, atol=0.05 * ref.abs().max().item())


def test_apply_w12_skips_tied_and_slow_layers(llama_dir):
    model = load_model(llama_dir, dtype="bfloat16")  # tied lm_head / embeddings
    mlp = model.model.layers[0].mlp
    with torch.no_grad():  # a wide exponent spread: many escapes -> predicted slower
        vals = torch.logspace(-30, 30, mlp.down_proj.weight.numel(), base=2.0)
        perm = torch.randperm(vals.numel(), generator=torch.Generator().manual_seed(0))
        mlp.down_proj.weight.copy_(vals[perm].view_as(mlp.down_proj.weight))
    rep = apply_w12(model, min_gain=0.5)  # K=64 layers pad to 128 (predicted ~0.65x)
    by_name = {d.name: d for d in rep.layers}
    assert "lm_head" not in by_name  # tied: replacing it would duplicate the embedding
    assert not isinstance(model.lm_head, W12Linear)
    down = by_name["model.layers.0.mlp.down_proj"]
    assert not down.applied and down.escape_rate > 0.1 and down.predicted_gain < 0.5
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)
    assert isinstance(model.model.layers[0].mlp.up_proj, W12Linear)


def test_apply_w12_ignores_fp32_models(qwen3_dir):
    model = load_model(qwen3_dir, dtype="float32")
    assert apply_w12(model).layers == []


def _rec(kernel, n, k, batch, us, correct=True, bn=8):
    return TuningRecord(kernel, n, k, batch, KernelConfig(bn=bn).to_dict(), us, 0.1, 1000,
                        1.0, 20.0, correct, 0.0 if correct else 1.0)


def test_table_keeps_fastest_correct_and_round_trips(tmp_path):
    t = TunedTable(device="NVIDIA H200")
    for r in [_rec("w12", 64, 128, 1, 9.0, bn=4), _rec("w12", 64, 128, 1, 5.0, False, bn=16),
              _rec("w12", 64, 128, 1, 7.0, bn=8), _rec("w12", 64, 128, 3, 11.0, bn=32)]:
        t.add(r)
    assert t.lookup("w12", 64, 128, 1).bn == 8
    assert t.lookup("w12", 64, 128, 4).bn == 32  # batch 3 and 4 share bucket 4
    assert t.lookup("w12", 64, 128, 64) is None and t.lookup("bf16", 64, 128, 1) is None
    path = table_path("NVIDIA H200", tmp_path)
    assert path.name == "nvidia-h200.json"
    t.save(path)
    loaded = load_table("NVIDIA H200", tmp_path)
    assert loaded.lookup("w12", 64, 128, 1) == KernelConfig(bn=8)
    assert json.loads(path.read_text())["device"] == "NVIDIA H200"
    assert load_table("Some Other GPU", tmp_path).entries == {}


def test_best_and_buckets():
    recs = [_rec("w12", 1, 1, 1, 3.0, False), _rec("w12", 1, 1, 1, 4.0)]
    assert best(recs).median_us == 4.0
    assert best([_rec("w12", 1, 1, 1, 3.0, False)]) is None
    assert [bucket(m) for m in (1, 2, 3, 5, 9, 17, 32, 33)] == [1, 2, 4, 8, 16, 32, 32, None]
    for b in (1, 2, 4, 8, 16, 32):
        cfgs = candidate_configs(b)
        assert len(set(cfgs)) == len(cfgs) >= 6
        assert all(c.bm >= b and c.bk % 128 == 0 for c in cfgs)
        assert default_config(4096, 4096, b).bm >= b


def test_predicted_gain_prefers_measurements():
    p = fmt.pack((torch.randn(64, 128) * 0.02).to(torch.bfloat16))
    assert 1.2 < predicted_gain(p) < 16 / 12
    t = TunedTable(device="x")
    t.add(_rec("w12", 64, 128, 1, 10.0))
    t.add(_rec("bf16", 64, 128, 1, 8.0))
    assert predicted_gain(p, t) == pytest.approx(0.8)
    other = fmt.pack((torch.randn(32, 256) * 0.02).to(torch.bfloat16))
    assert predicted_gain(other, t) == pytest.approx(0.8)  # nearest evidence: same bucket
    assert predicted_gain(other, t, m=16) == predicted_gain(other)  # none: byte model


def test_untuned_shape_runs_the_nearest_tuned_shapes_config():
    t = TunedTable(device="x")
    t.add(_rec("w12", 4096, 4096, 1, 10.0, bn=4))
    t.add(_rec("w12", 10240, 5120, 1, 20.0, bn=16))
    t.add(_rec("w12", 4096, 1152, 1, 5.0, bn=32))  # K 1152: 16-word column groups
    t.add(_rec("w12", 6144, 4096, 8, 12.0, bn=8))  # another batch bucket
    assert nearest_shape(t, 6144, 4096, 1) == (4096, 4096)  # ln 1.5 < ln 1.67 + ln 1.25
    assert nearest_shape(t, 8192, 5120, 1) == (10240, 5120)
    # (4096, 4096) is nearer, but its configs step 64-word groups: K 3968 has 16-word ones
    assert nearest_shape(t, 4096, 3968, 1) == (4096, 1152)
    assert nearest_shape(t, 4096, 4096, 2) is None and nearest_shape(t, 4096, 4096, 64) is None
    lin = W12Linear(fmt.pack((torch.randn(96, 4096) * 0.02).to(torch.bfloat16)), table=t)
    assert lin._config(1).bn == 4  # (4096, 4096)'s entry
    assert lin._config(2) == w12_default_config(96, 4096, 2)  # nothing tuned at bucket 2
    # its predicted gain is the nearest shape's measured ratio, not the table's median
    t.add(_rec("bf16", 4096, 4096, 1, 12.0))
    t.add(_rec("bf16", 10240, 5120, 1, 30.0))
    assert predicted_gain(lin.w12, t) == pytest.approx(1.2)


def test_shipped_h200_table_loads():
    from specpilot.kernels.tuning import SHIPPED, TunedTable

    t = TunedTable.load(SHIPPED / "nvidia-h200.json")
    cfg = t.lookup("w12", 24576, 4096, 1)
    assert cfg is not None and not cfg.dot
    assert t.median_us("cublas", 24576, 4096, 1) > 0


def test_stats_command(qwen3_dir):
    from specpilot.cli import app

    res = CliRunner().invoke(app, ["w12", "stats", "--model", str(qwen3_dir)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "model.layers.0.mlp.down_proj.weight" in res.output
    assert "total" in res.output


def test_stats_command_bad_dir(tmp_path):
    from specpilot.kernels.stats import checkpoint_stats
    from specpilot.runtime.errors import SpecPilotError

    with pytest.raises(SpecPilotError):
        checkpoint_stats(tmp_path / "missing")


def test_predicted_gain_discounts_heavy_escapes():
    # zero rows (padded vocabularies) escape: the measured ratio of LLM-like layers must
    # not be applied unchanged to them
    t = TunedTable(device="x")
    t.add(_rec("w12", 64, 256, 1, 8.0))
    t.add(_rec("bf16", 64, 256, 1, 10.0))
    w = (torch.randn(64, 256) * 0.02).to(torch.bfloat16)
    assert predicted_gain(fmt.pack(w), t) == pytest.approx(1.25)
    w[:8] = 0.0  # 1/8 of the weights escape
    heavy = fmt.pack(w)
    assert heavy.escape_rate > 0.1
    assert predicted_gain(heavy, t) < 0.1


def test_apply_w12_checks_every_step_row_count(qwen3_dir):
    """A layer goes W12 only where it wins at every row count of the engine's steps: a
    table where W12 wins at batch 1 but loses at 5 rows (a k = 4 verify step) keeps it bf16
    for a speculative engine, and above the skinny buckets (unpack + cuBLAS) it never wins."""
    model = load_model(qwen3_dir, "cpu", "bfloat16")
    lin = model.model.layers[0].mlp.down_proj
    n, k = lin.weight.shape
    t = TunedTable(device="x")
    for kern, b, us in (("bf16", 1, 10.0), ("w12", 1, 8.0), ("bf16", 8, 10.0), ("w12", 8, 20.0)):
        t.entries[f"{kern}:{n}x{k}:b{b}"] = {"config": {}, "median_us": us, "tbps": 1.0}
    p = fmt.pack(lin.weight.detach())
    assert predicted_gain(p, t, 1) == pytest.approx(1.25)
    assert predicted_gain(p, t, 5) == pytest.approx(0.5)
    assert predicted_gain(p, t, 40) < 0.4  # unpack to bf16, then cuBLAS
    ar = apply_w12(load_model(qwen3_dir, "cpu", "bfloat16"), table=t, rows=(1,))
    spec = apply_w12(load_model(qwen3_dir, "cpu", "bfloat16"), table=t, rows=(1, 5))
    name = "model.layers.0.mlp.down_proj"
    assert {d.name: d.applied for d in ar.layers}[name] is True
    assert {d.name: d.applied for d in spec.layers}[name] is False


def test_step_rows_follow_k_and_batch():
    from specpilot.runtime.factory import step_rows
    from specpilot.runtime.knobs import Knobs

    assert step_rows(Knobs(), 1) == (1,)
    assert step_rows(Knobs(drafter="ngram", k=4), 1) == (1, 5)
    assert step_rows(Knobs(drafter="ngram", k=4, k_per_batch={8: 2}), 8) == (8, 24)
    # an engine run at several batch sizes: every row count of every one of them
    assert step_rows(Knobs(drafter="ngram", k=4, k_per_batch={8: 2}), (1, 8)) == (1, 5, 8, 24)
    assert step_rows(Knobs(), (1, 8, 32)) == (1, 8, 32)


@pytest.mark.parametrize("variant", [GLUON, WGMMA])
def test_gluon_kernels_refuse_cpu_tensors(variant):
    """The Gluon kernels (register and TMA + wgmma) are CUDA-only: on CPU tensors the
    dispatcher says so instead of failing inside Triton."""
    w = fmt.pack((torch.randn(64, 512) * 0.02).to(torch.bfloat16))
    cfg = KernelConfig(bm=8, bn=64, bk=256, warps=4, stages=2, dot=True, variant=variant)
    with pytest.raises(ValueError, match="run on a CUDA device"):
        w12_matmul(torch.randn(2, 512).to(torch.bfloat16), w, cfg)


@pytest.mark.parametrize("bm,depth", [(16, 1), (8, 2)])
def test_gluon_x_prefetch_refuses_configs_that_spill(bm, depth):
    """x slices prefetched with the words fit the registers only for 8 rows of x at depth 1
    (246-250 registers on sm_90; 16 rows or depth 2 spill): other configs get a clear error."""
    from specpilot.kernels.w12_gluon import gluon_constants

    _, consts = gluon_constants(4096, 4096, 64, 8, 16, 256, 1, 1, 1, True)
    assert consts["XPRE"] is True and consts["BM"] == 8
    with pytest.raises(ValueError, match="prefetches x slices for 8 rows of x at depth 1"):
        gluon_constants(4096, 4096, 64, bm, 16, 256, 1, 1, depth, True)


@pytest.mark.parametrize("tiles,steps,programs", [
    (320, 32, 1056), (640, 20, 1056), (1536, 16, 1056), (3200, 20, 1056), (3, 16, 5),
    (7, 3, 100), (5, 7, 33), (1, 1, 8)])
def test_stream_k_plan_partitions_units_and_bounds_pieces(tiles, steps, programs):
    """The stream-K launch: programs take contiguous, non-empty runs of the tiles x steps
    units; the kernel's closed forms for the first and last program of a tile agree with
    walking the runs, and no tile has more pieces than the plan's partial slots."""
    from specpilot.kernels.w12_gluon import stream_k_plan

    t, s, units, p, slots = stream_k_plan(tiles * 16, 8, steps * 32, 8, 16, 32, programs)
    assert (t, s, units, p) == (tiles, steps, tiles * steps, min(programs, tiles * steps))
    owners = [[] for _ in range(tiles)]
    covered = 0
    for q in range(p):
        lo, hi = q * units // p, (q + 1) * units // p
        assert hi > lo and lo == covered
        covered = hi
        for tile in range(lo // s, (hi + s - 1) // s):
            owners[tile].append(q)
    assert covered == units
    for tile, own in enumerate(owners):
        assert own[0] == ((tile * s + 1) * p - 1) // units
        assert own[-1] == ((tile + 1) * s * p - 1) // units
        assert own == list(range(own[0], own[-1] + 1))
    assert max(map(len, owners)) <= slots
