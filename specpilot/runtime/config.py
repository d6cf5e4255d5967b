"""Model configuration: the subset of an HF `config.json` the native runtime understands."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import CheckpointError

SUPPORTED = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a Qwen3 / Llama-3 decoder."""

    arch: str  # "qwen3" | "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    bos_token_id: int | None = None
    torch_dtype: str = "float32"

    @property
    def qk_norm(self) -> bool:
        return self.arch == "qwen3"

    @classmethod
    def from_hf(cls, d: dict) -> ModelConfig:
        archs = d.get("architectures") or []
        model_type = d.get("model_type", "")
        arch = next((SUPPORTED[a] for a in archs if a in SUPPORTED), None)
        if arch is None and model_type in ("qwen3", "llama"):
            arch = model_type
        if arch is None:
            raise CheckpointError(
                f"unsupported architecture {archs or model_type!r}: "
                f"SpecPilot's runtime supports {sorted(SUPPORTED)}"
            )
        try:
            heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            eos_ids = _eos_ids(d.get("eos_token_id"))
            scaling = d.get("rope_scaling") or None
            theta = d.get("rope_theta")
            params = d.get("rope_parameters") or {}
            if theta is None:
                theta = params.get("rope_theta", 10000.0)
            if scaling is None and params.get("rope_type") not in (None, "default"):
                scaling = params
            if scaling is not None and scaling.get("rope_type", scaling.get("type")) in (
                "default",
                None,
            ):
                scaling = None
            if scaling is not None and scaling.get("rope_type", scaling.get("type")) != "llama3":
                kind = scaling.get("rope_type", scaling.get("type"))
                raise CheckpointError(
                    f"unsupported rope scaling {kind!r}: SpecPilot's runtime supports llama3"
                )
            cfg = cls(
                arch=arch,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rope_scaling=scaling,
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                eos_token_ids=eos_ids,
                bos_token_id=d.get("bos_token_id"),
                torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            )
            if scaling is not None:
                for key in ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"):
                    float(scaling[key])
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
            raise CheckpointError(f"config.json is missing or has a bad field: {e!r}") from None
        if min(cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads,
               cfg.num_kv_heads, cfg.head_dim) < 1 or cfg.num_heads % cfg.num_kv_heads:
            raise CheckpointError(
                "config.json has impossible shapes (sizes must be positive and "
                "num_attention_heads a multiple of num_key_value_heads)"
            )
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        cfg = cls.from_hf(read_config_json(path, "point --model at an HF checkpoint"))
        # generate() stops on generation_config.json's EOS ids too (Qwen3 lists two there)
        extra = _eos_ids(_read_json(path.parent / "generation_config.json").get("eos_token_id"))
        if extra:
            merged = tuple(dict.fromkeys(cfg.eos_token_ids + extra))
            cfg = replace(cfg, eos_token_ids=merged)
        return cfg


def read_config_json(path: Path, hint: str) -> dict:
    """The JSON object in a checkpoint's config.json; a one-line error (ending in `hint`,
    what to point at instead) when it is missing, not JSON or not an object."""
    if not path.is_file():
        raise CheckpointError(f"no config.json at {path}: {hint}")
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return d


def _eos_ids(eos) -> tuple[int, ...]:
    if eos is None:
        return ()
    if isinstance(eos, list):
        return tuple(int(e) for e in eos)
    return (int(eos),)


def _read_json(path: Path) -> dict:
    """A JSON object from an optional file; {} when absent or unreadable."""
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return d if isinstance(d, dict) else {}
