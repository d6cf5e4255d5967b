"""The shipped tiny zoo: checkpoints load, transformers agrees with the runtime, the tokenizer
round-trips Python, the drafters are lossless and accept well; the recipe is seeded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from specpilot.runtime.loader import load_model
from specpilot.runtime.tokenizer import Tokenizer
from specpilot.zoo.corpus import EOT, MASK, corpus_texts, list_files

ZOO = Path(__file__).resolve().parents[1] / "models" / "tiny-pycode"
SOURCE = '''import os
from dataclasses import dataclass


@dataclass
class Point:
    """A point in the plane."""

    x: float = 0.0
    y: float = 0.0

    def norm(self) -> float:
        return (self.x ** 2 + self.y ** 2) ** 0.5


def walk(root: str) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                out.append(os.path.join(dirpath, name))
    return out
'''


def test_checkpoints_load_and_fit_the_size_budget():
    target = load_model(ZOO / "target")
    draft = load_model(ZOO / "draft")
    from specpilot.runtime.drafters.block import load_block_drafter

    block = load_block_drafter(ZOO / "block", target)
    n_target = sum(p.numel() for p in target.parameters())  # tied head counted once
    n_draft = sum(p.numel() for p in draft.parameters())
    assert 4.5e6 <= n_target <= 10e6  # "roughly 5-10M": the shipped target has 4.72M
    assert n_draft < 1.0e6
    assert draft.cfg.vocab_size == target.cfg.vocab_size == 4096
    assert block.model.cfg.block_size >= 8
    assert target.cfg.arch == draft.cfg.arch == "qwen3"
    weights = sum(f.stat().st_size for f in ZOO.rglob("*.safetensors"))
    assert weights <= 25 * 2**20
    for d in ("target", "draft", "block"):
        assert (ZOO / d / "tokenizer.json").read_bytes() == (ZOO / "target" /
                                                             "tokenizer.json").read_bytes()


def test_transformers_agrees_with_runtime_on_target_logits():
    import transformers

    tok = Tokenizer(ZOO / "target")
    ids = torch.tensor([tok.encode(SOURCE)])
    T = ids.shape[1]
    ours = load_model(ZOO / "target", "cpu", "float32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(ZOO / "target", dtype=torch.float32)
    hf.eval()
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got, _ = ours(ids, torch.arange(T)[None], use_cache=False)
        ours.setup_cache(1, T + 8)
        cached, _ = ours(ids, torch.arange(T)[None])
    for out in (got, cached):
        rel = ((out - ref).norm() / ref.norm()).item()
        assert rel <= 1e-5, rel
    # a trained model: it predicts held-out-like Python far better than chance (ln 4096 = 8.3)
    loss = torch.nn.functional.cross_entropy(ref[0, :-1], ids[0, 1:]).item()
    assert loss < 3.5, loss


def test_tokenizer_round_trips_python_source():
    tok = Tokenizer(ZOO / "target")
    cfg = json.loads((ZOO / "target" / "config.json").read_text())
    assert tok.token_to_id(EOT) == cfg["eos_token_id"] == 0
    assert tok.token_to_id(MASK) == 1
    assert tok.vocab_size == 4096
    texts = [SOURCE, "s = 'ünïcødé ✓ 中文'\t# tabs\r\n\n\n    x = {1: [2, (3,)]}\n"]
    texts += [t for _, t in corpus_texts(list_files(), "heldout")[:20]]
    for text in texts:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert 0 not in ids and 1 not in ids  # special tokens never come from plain text
    assert len(tok.encode(SOURCE)) < len(SOURCE) / 2.5  # BPE merges, not bytes


def test_drafters_are_lossless_and_accept_on_heldout_prompts():
    from specpilot.bench.workloads import load_workload
    from specpilot.runtime.factory import build_engine
    from specpilot.runtime.knobs import Knobs

    engine, tok = build_engine(ZOO / "target", Knobs(threads=2))
    prompts = load_workload("tiny-pycode-dev", tok).prompt_ids(tok)[:3]
    ref = engine.generate(prompts, max_new_tokens=40)
    accept = {}
    for spec, k in ((f"draft:{ZOO / 'draft'}", 4), (f"block:{ZOO / 'block'}", 7)):
        eng, _ = build_engine(ZOO / "target", Knobs(drafter=spec, k=k, threads=2))
        gens = eng.generate(prompts, max_new_tokens=40)
        assert [g.output_ids for g in gens] == [r.output_ids for r in ref]
        accept[spec.split(":")[0]] = sum(g.metrics.accept_length for g in gens) / len(gens)
    # random drafters accept ~1.0; trained ones well above
    assert accept["draft"] > 1.8, accept
    assert accept["block"] > 1.8, accept


def _digest(d: Path) -> dict[str, str]:
    return {f.relative_to(d).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(d.rglob("*")) if f.suffix in (".safetensors", ".json")
            and f.name != "training.json"}


def test_recipe_runs_on_cpu_and_is_seeded(tmp_path):
    from specpilot.zoo.train import main

    a = main(["--preset", "tiny", "--out", str(tmp_path / "a"), "--device", "cpu"])
    main(["--preset", "tiny", "--out", str(tmp_path / "b"), "--device", "cpu",
          "--stages", "target,draft,block"])
    main(["--preset", "tiny", "--out", str(tmp_path / "c"), "--device", "cpu", "--seed", "1",
          "--stages", "target"])
    assert [r.stage for r in a] == ["tokenizer", "target", "draft", "block"]
    da, db = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert {"target/model.safetensors", "draft/model.safetensors",
            "block/model.safetensors", "target/tokenizer.json"} <= set(da)
    assert da == db
    dc = _digest(tmp_path / "c")
    assert dc["target/model.safetensors"] != da["target/model.safetensors"]
    # what it wrote loads in the runtime and in transformers
    import transformers

    load_model(tmp_path / "a" / "target")
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "draft")
    meta = json.loads((tmp_path / "a" / "target" / "training.json").read_text())
    assert meta["seed"] == 0 and meta["stage"]["steps"] == 6


def test_zoo_train_rejects_a_missing_stdlib(tmp_path):
    from specpilot.runtime.errors import SpecPilotError
    from specpilot.zoo.train import main

    with pytest.raises(SpecPilotError, match="no Python standard library"):
        main(["--preset", "tiny", "--out", str(tmp_path), "--stdlib", str(tmp_path / "no")])


@pytest.mark.parametrize("ks,batch_size,threads,match", [
    ("2,x", 1, 2, r"--ks must be comma-separated integers in 1\.\.32"),
    ("0,4", 1, 2, r"--ks must be integers in 1\.\.32"),
    ("2,4", 0, 2, "--batch-size must be >= 1, got 0"),
    ("2,4", 1, -1, "--threads must be >= 0, got -1"),
])
def test_zoo_eval_rejects_bad_options_before_loading(tmp_path, ks, batch_size, threads, match):
    from specpilot.runtime.errors import SpecPilotError
    from specpilot.zoo.evaluate import acceptance, main

    with pytest.raises(SpecPilotError, match=match):  # tmp_path has no models: checked first
        main(str(tmp_path), "tiny-pycode-dev", ks, 8, batch_size, threads)
    if ks != "2,x":
        with pytest.raises(SpecPilotError, match=match.replace("comma-separated ", "")):
            acceptance(ZOO, "tiny-pycode-dev", tuple(map(int, ks.split(","))), 8, batch_size,
                       threads)


def test_zoo_eval_bad_ks_is_one_line_on_the_cli():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "specpilot", "zoo", "eval", "--ks", "2,x"],
                         check=False, capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == ("error: --ks must be comma-separated integers in 1..32, "
                                  "e.g. 2,4,8; got '2,x'")


@pytest.mark.parametrize("args,match", [
    (["--stages", "bogus"], "--stages bogus: use a comma-separated subset of target,draft"),
    (["--stages", ""], r"--stages \(empty\)"),
    (["--stages", "draft,block"], "needs a trained target in"),
    (["--target-steps", "0"], "--target-steps must be >= 1, got 0"),
])
def test_zoo_train_checks_its_options_before_creating_anything(tmp_path, args, match):
    from specpilot.runtime.errors import SpecPilotError
    from specpilot.zoo.train import main

    out = tmp_path / "x"
    with pytest.raises(SpecPilotError, match=match):
        main(["--preset", "tiny", "--out", str(out), "--device", "cpu", *args])
    assert not out.exists()


class _FakeModel:
    """Stands in for a transformers model: save_pretrained writes one file, or fails midway."""

    def __init__(self, text: str, fail: bool = False):
        self.text, self.fail = text, fail

    def to(self, *args):
        return self

    def save_pretrained(self, path, safe_serialization=True):
        (Path(path) / "model.safetensors").write_text(self.text)
        if self.fail:
            raise KeyboardInterrupt  # interrupted after part of the checkpoint is written


def test_save_checkpoint_replaces_the_old_one_only_when_complete(tmp_path):
    from specpilot.zoo.train import save_checkpoint

    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tok / name).write_text("{}")
    ckpt = tmp_path / "out" / "draft"
    save_checkpoint(_FakeModel("old"), ckpt, tok, {"v": 1})
    (ckpt / "stale.bin").write_text("from an older layout")
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(_FakeModel("new", fail=True), ckpt, tok, {"v": 2})
    assert (ckpt / "model.safetensors").read_text() == "old"
    assert json.loads((ckpt / "training.json").read_text()) == {"v": 1}
    assert [p.name for p in ckpt.parent.iterdir()] == ["draft"]  # no temp dir left behind
    save_checkpoint(_FakeModel("new"), ckpt, tok, {"v": 2})
    assert (ckpt / "model.safetensors").read_text() == "new"
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.safetensors", "tokenizer.json",
                                                      "tokenizer_config.json", "training.json"]
    assert [p.name for p in ckpt.parent.iterdir()] == ["draft"]
