"""Load an HF checkpoint directory (config.json, safetensors, tokenizer.json) into the runtime.

Tensors are read through safetensors' memory map and handed to the module as they are
(`assign=True`), so a checkpoint already in the requested dtype on CPU is never copied.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import ModelConfig
from .errors import CheckpointError, check_dir
from .model import Transformer, rope_inv_freq

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise CheckpointError(f"unknown dtype {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError,
                AttributeError) as e:
            raise CheckpointError(f"{index} is corrupt ({e})") from None
        files = [path / n for n in names]
    else:
        files = [path / "model.safetensors"]
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"missing weight file {f}: is the checkpoint complete?")
    return files


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    tensors[name] = st.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{f} is not a readable safetensors file ({e})") from None
    return tensors


def load_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
               device: str | torch.device, where: Path) -> None:
    """Assign checkpoint tensors to `model` (built on the meta device); exact name match."""
    expected = {n for n, _ in model.named_parameters()}
    tied = getattr(getattr(model, "cfg", None), "tie_word_embeddings", False)
    if tied:
        expected.discard("lm_head.weight")
        tensors.pop("lm_head.weight", None)
    missing = sorted(expected - tensors.keys())
    if missing:
        raise CheckpointError(f"{where}: weights missing from the checkpoint: {missing[:3]}...")
    state = {}
    for name in expected:
        t = tensors[name]
        if not t.is_floating_point():
            raise CheckpointError(f"{where}: tensor {name} has dtype {t.dtype}, expected float")
        state[name] = t.to(device=device, dtype=dtype)
    try:
        model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:
        msg = str(e).splitlines()[-1].strip() if str(e) else "shape mismatch"
        raise CheckpointError(f"{where}: weights do not match config.json ({msg})") from None
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight


def load_model(path: str | Path, device: str | torch.device = "cpu",
               dtype: str | torch.dtype = "float32") -> Transformer:
    """Build the runtime model from a checkpoint directory."""
    path = check_dir(path, "checkpoint directory", error=CheckpointError)
    cfg = ModelConfig.from_file(path)
    dtype = parse_dtype(dtype)
    with torch.device("meta"):
        model = Transformer(cfg)
    load_state(model, read_tensors(path), dtype, device, path)
    model.inv_freq = rope_inv_freq(cfg).to(device)  # the meta-device buffer, made real
    return model.eval().requires_grad_(False)
