"""The block (DFlash-style) drafter: checkpoint round trip and checks, the cached inference
path equal to the batched training path, and a training loss that a few steps lower while
the trained drafter stays lossless in the engine."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.runtime.drafters.block import (
    BlockDrafter,
    block_logits,
    block_training_loss,
    default_target_layers,
    init_block_drafter,
    load_block_drafter,
    load_block_model,
    save_block_drafter,
)
from specpilot.runtime.errors import CheckpointError, SpecPilotError
from specpilot.runtime.factory import build_engine
from specpilot.runtime.generate import Engine
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.loader import load_model
from tests.checkpoints import make_block_drafter, make_checkpoint


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def target(qwen3_dir):
    return load_model(qwen3_dir)


def test_default_target_layers():
    assert default_target_layers(36, 5) == (0, 8, 17, 26, 34)
    assert default_target_layers(2) == (0,)
    assert default_target_layers(6, 3) == (0, 2, 4)


def test_save_load_round_trip(tmp_path, target):
    model = init_block_drafter(target.cfg, target_layers=(0, 1), block_size=5,
                               num_hidden_layers=2, seed=3, std=0.1)
    save_block_drafter(model, tmp_path / "b")
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg["architectures"] == ["SpecPilotBlockDrafter"]
    assert cfg["target_layers"] == [0, 1] and cfg["block_size"] == 5
    loaded = load_block_model(tmp_path / "b")
    assert loaded.cfg == model.cfg
    names = {n for n, _ in loaded.named_parameters()}
    assert not any("embed" in n or "lm_head" in n for n in names)  # the target's are reused
    for (n, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, q), n


def test_cached_path_equals_training_path(qwen3_dir, target, tmp_path):
    """After an engine run (prefill + verify steps with rejections), the drafter's logits from
    its K/V cache equal block_logits computed from one no-cache target pass."""
    path = make_block_drafter(tmp_path / "b", qwen3_dir, block_size=6, num_hidden_layers=2)
    engine, _ = build_engine(qwen3_dir, Knobs(drafter=f"block:{path}", k=3))
    drafter = engine.drafter
    assert isinstance(drafter, BlockDrafter)
    prompts = [[5, 9, 17, 33, 2, 8, 8, 41], [7, 3, 250, 11]]
    outs = engine.generate(prompts, 20, ignore_eos=True)
    assert any(o.metrics.accept_hist[0] for o in outs)  # there were rejected drafts
    seqs = [p + o.output_ids for p, o in zip(prompts, outs)]
    S = drafter.cache[0][0].shape[2]
    tokens = torch.zeros(2, S, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    cached = drafter.logits(tokens, lengths)  # [2, 5, V]
    for b, s in enumerate(seqs):
        ids = torch.tensor([s])
        T = ids.shape[1]
        _, hid = target(ids, torch.arange(T)[None], hidden_layers=drafter.hidden_layers,
                        use_cache=False)
        ref = block_logits(drafter.model, target, ids, torch.tensor([[T - 1]]), hid)[0, 0]
        err = (cached[b] - ref).norm() / ref.norm()
        assert err <= 1e-5, (b, float(err))


def test_block_size_bounds_k(qwen3_dir, tmp_path):
    path = make_block_drafter(tmp_path / "b", qwen3_dir, block_size=4)
    build_engine(qwen3_dir, Knobs(drafter=f"block:{path}", k=3))
    with pytest.raises(SpecPilotError, match="at most 3"):
        build_engine(qwen3_dir, Knobs(drafter=f"block:{path}", k=4))


def _write_cfg(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("changes,match", [
    ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, "not a block drafter"),
    ({"target_layers": [0, 7]}, "target layer 7 is out of range"),
    ({"vocab_size": 999}, "vocab_size"),
    ({"mask_token_id": 100000}, "mask_token_id"),
    ({"block_size": "many"}, "bad field"),
])
def test_bad_block_config(qwen3_dir, target, tmp_path, changes, match):
    good = make_block_drafter(tmp_path / "good", qwen3_dir, block_size=4)
    bad = _write_cfg(good, tmp_path / "bad", **changes)
    with pytest.raises(CheckpointError, match=match) as e:
        load_block_drafter(bad, target)
    assert "\n" not in str(e.value)


def test_block_drafter_for_another_target(qwen3_dir, qwen3_draft_dir, tmp_path):
    """A drafter made for a hidden size of 64 does not fit a target of hidden size 32."""
    path = make_block_drafter(tmp_path / "b", qwen3_dir, block_size=4)
    with pytest.raises(CheckpointError, match="hidden_size 64 != the target's 32"):
        build_engine(qwen3_draft_dir, Knobs(drafter=f"block:{path}", k=2))


def test_corrupt_block_weights(qwen3_dir, target, tmp_path):
    path = make_block_drafter(tmp_path / "b", qwen3_dir, block_size=4)
    (path / "model.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_block_drafter(path, target)


def test_training_lowers_the_loss_and_stays_lossless(tmp_path):
    torch.manual_seed(0)
    tdir = make_checkpoint(tmp_path / "t", "qwen3", seed=5, num_hidden_layers=3)
    target = load_model(tdir)
    block = init_block_drafter(target.cfg, block_size=5, seed=1, std=0.05)
    assert block.cfg.target_layers == (0, 1)
    block.train().requires_grad_(True)
    # training data: the target's own greedy continuations of random prompts
    engine = Engine(target)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 280, (4,), generator=g).tolist() for _ in range(16)]
    outs = engine.generate(prompts, 28, ignore_eos=True)
    ids = torch.tensor([p + o.output_ids for p, o in zip(prompts, outs)])  # [16, 32]

    def fixed_loss() -> float:  # the same anchors every time
        with torch.no_grad():
            return float(block_training_loss(block, target, ids, n_blocks=8,
                                             generator=torch.Generator().manual_seed(99)))

    before = fixed_loss()
    opt = torch.optim.AdamW(block.parameters(), lr=1e-2)
    for step in range(40):
        loss = block_training_loss(block, target, ids, n_blocks=6,
                                   generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is None for p in target.parameters())
    assert block.fc.weight.grad is not None and block.layers[0].mlp.up_proj.weight.grad is not None
    after = fixed_loss()
    assert after < 0.6 * before, (before, after)

    path = save_block_drafter(block.eval(), tmp_path / "trained")
    spec, _ = build_engine(tdir, Knobs(drafter=f"block:{path}", k=4))
    starts = [p + o.output_ids[:3] for p, o in zip(prompts[:6], outs[:6])]
    ref = engine.generate(starts, 24, ignore_eos=True)
    got = spec.generate(starts, 24, ignore_eos=True)
    assert [o.output_ids for o in got] == [o.output_ids for o in ref]
    mean_acc = sum(o.metrics.accept_length for o in got) / len(got)
    assert mean_acc > 1.5, mean_acc  # it learned the sequences it was trained on


def test_training_loss_labels_default_to_the_targets_argmax(target):
    block = init_block_drafter(target.cfg, block_size=4, seed=2, std=0.1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 280, (3, 20), generator=g)
    T = ids.shape[1]
    logits, _ = target(ids, torch.arange(T)[None].expand(3, T), use_cache=False)
    labels = logits.argmax(-1)
    a = block_training_loss(block, target, ids, None, 4, torch.Generator().manual_seed(1))
    b = block_training_loss(block, target, ids, labels, 4, torch.Generator().manual_seed(1))
    c = block_training_loss(block, target, ids, ids, 4, torch.Generator().manual_seed(1))
    assert torch.allclose(a, b) and not torch.allclose(a, c)
