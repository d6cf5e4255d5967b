"""Bad input gives a SpecPilotError subclass with a one-line message that names the problem."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specpilot.runtime.errors import CheckpointError, RequestError, SpecPilotError
from specpilot.runtime.factory import build_engine
from specpilot.runtime.knobs import Knobs
from specpilot.runtime.loader import load_model
from tests.checkpoints import make_checkpoint


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one thread; two spin against each other on a busy box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert isinstance(e.value, SpecPilotError)
    assert msg and "\n" not in msg and "Traceback" not in msg
    return msg


def copy(src, tmp_path, name="ck"):
    return shutil.copytree(src, tmp_path / name)


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    for k, v in list(cfg.items()):
        if v is None and k in changes:
            del cfg[k]
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError) as e:
        build_engine(tmp_path / "nope")
    assert "does not exist" in one_line(e)


def test_a_file_where_a_directory_belongs(qwen3_dir, tmp_path):
    """A file is not reported as missing: the message says it is a file."""
    from specpilot.kernels.stats import checkpoint_stats

    f = tmp_path / "afile"
    f.write_text("not a checkpoint")
    for call, what in [(lambda: load_model(f), "checkpoint directory"),
                       (lambda: checkpoint_stats(f), "checkpoint directory"),
                       (lambda: build_engine(qwen3_dir, Knobs(drafter=f"block:{f}", k=2)),
                        "block drafter directory"),
                       (lambda: build_engine(qwen3_dir, Knobs(drafter=f"draft:{f}", k=2)),
                        "checkpoint directory")]:
        with pytest.raises(CheckpointError) as e:
            call()
        assert one_line(e) == f"{f} is a file, not a {what}"


def test_bad_k_values_are_printed_plainly():
    with pytest.raises(SpecPilotError) as e:
        Knobs.from_dict({"k": 0})
    assert one_line(e) == "knob k must be an integer in 1..32, got 0"
    with pytest.raises(SpecPilotError) as e:
        Knobs.from_dict({"k": 4, "k_per_batch": {"1": 6, "8": 40}})
    assert one_line(e) == "knob k_per_batch[8] must be an integer in 1..32, got 40"


def test_missing_config(qwen3_dir, tmp_path):
    p = copy(qwen3_dir, tmp_path)
    (p / "config.json").unlink()
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert "no config.json" in one_line(e)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_corrupt_config(qwen3_dir, tmp_path, text):
    p = copy(qwen3_dir, tmp_path)
    (p / "config.json").write_text(text)
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert "config.json" in one_line(e)


@pytest.mark.parametrize("changes,needle", [
    ({"hidden_size": None}, "hidden_size"),
    ({"num_attention_heads": "four"}, "bad field"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"hidden_size": 96}, "do not match config.json"),
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "unsupported architecture"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     "unsupported rope scaling 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "factor"),
])
def test_bad_config_fields(qwen3_dir, tmp_path, changes, needle):
    p = edit_config(copy(qwen3_dir, tmp_path), **changes)
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert needle in one_line(e)


def test_corrupt_safetensors(qwen3_dir, tmp_path):
    p = copy(qwen3_dir, tmp_path)
    (p / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert "safetensors" in one_line(e)


def test_truncated_safetensors(qwen3_dir, tmp_path):
    p = copy(qwen3_dir, tmp_path)
    data = (p / "model.safetensors").read_bytes()
    (p / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert "safetensors" in one_line(e)


def test_missing_weights_file_and_tensor(qwen3_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    p = copy(qwen3_dir, tmp_path)
    state = load_file(str(p / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(p / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert "model.layers.1.mlp.up_proj.weight" in one_line(e)
    (p / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert "missing weight file" in one_line(e)


def test_sharded_index_problems(tmp_path):
    p = make_checkpoint(tmp_path / "sh", "qwen3", sharded=True)
    shards = sorted(p.glob("model-*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(CheckpointError) as e:
        load_model(p)
    assert shards[-1].name in one_line(e)
    for text in ("{", '{"weight_map": ["a.safetensors"]}', '{"weight_map": 3}', "[]"):
        (p / "model.safetensors.index.json").write_text(text)
        with pytest.raises(CheckpointError) as e:
            load_model(p)
        assert "index.json" in one_line(e)


def test_missing_tokenizer(qwen3_dir, tmp_path):
    p = copy(qwen3_dir, tmp_path)
    (p / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError) as e:
        build_engine(p)
    assert "tokenizer.json" in one_line(e)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe binary", b"[1]"])
def test_damaged_tokenizer_config(qwen3_dir, tmp_path, content):
    p = copy(qwen3_dir, tmp_path)
    (p / "tokenizer_config.json").write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        build_engine(p)
    assert "tokenizer_config.json" in one_line(e)


def test_bad_dtype(qwen3_dir):
    with pytest.raises(CheckpointError) as e:
        build_engine(qwen3_dir, dtype="float8")
    assert "float8" in one_line(e)


def test_drafter_vocabulary_differs(qwen3_dir, tmp_path):
    other = make_checkpoint(tmp_path / "v", "qwen3", seed=1, vocab_size=320, hidden_size=32,
                            num_hidden_layers=1)
    with pytest.raises(CheckpointError) as e:
        build_engine(qwen3_dir, Knobs(drafter=f"draft:{other}", k=2))
    assert "vocabulary" in one_line(e)


def test_drafter_specs(qwen3_dir, tmp_path):
    with pytest.raises(CheckpointError) as e:
        build_engine(qwen3_dir, Knobs(drafter="draft:", k=2))
    assert "draft:DIR" in one_line(e)
    with pytest.raises(CheckpointError) as e:
        build_engine(qwen3_dir, Knobs(drafter=f"block:{tmp_path / 'none'}", k=2))
    assert "does not exist" in one_line(e)
    with pytest.raises(CheckpointError) as e:  # a plain model is not a block drafter
        build_engine(qwen3_dir, Knobs(drafter=f"block:{qwen3_dir}", k=2))
    assert "not a block drafter" in one_line(e)


def test_bad_requests(qwen3_dir):
    engine, _ = build_engine(qwen3_dir)
    ctx = engine.target.cfg.max_position_embeddings
    cases = [
        (([list(range(1, 10)) * (ctx // 9 + 1)], 8), "context"),
        (([[1, 2, 3]], ctx), "context"),
        (([[1, 2, 999]], 4), "token id 999"),
        (([[1, -2]], 4), "token id -2"),
        (([[]], 4), "empty"),
        (([[1, 2]], 0), "max_new_tokens"),
    ]
    for (prompts, n), needle in cases:
        with pytest.raises(RequestError) as e:
            engine.generate(prompts, n)
        assert needle in one_line(e), needle
    # the engine still works after refusing
    assert len(engine.generate([[1, 2, 3]], 3)[0].output_ids) <= 3


def test_cuda_asked_without_cuda(qwen3_dir):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SpecPilotError) as e:
        build_engine(qwen3_dir, device="cuda")
    assert "cuda" in one_line(e)
