"""Model spec for the cost model: the shapes of a decoder read from an HF `config.json`.

Covers dense and mixture-of-experts decoders (Qwen3, Qwen3-MoE, Llama and their kin) with
grouped-query attention, tied embeddings and a weight storage format (bf16, fp16, fp32, fp8,
or W12: 12 bits a weight plus a small per-matrix side table).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..runtime.errors import SpecPilotError


@dataclass(frozen=True)
class WeightFormat:
    """Bytes a stored weight matrix [N, K] takes: N*K*per_weight + N*per_row + per_matrix."""

    name: str
    per_weight: float
    per_row: float = 0.0  # e.g. one fp32 scale per output channel (fp8)
    per_matrix: float = 0.0  # e.g. the W12 side table
    compute: str = "bf16"  # the matrix-unit dtype the GEMM runs in

    def matrix_bytes(self, n: int, k: int) -> float:
        return n * k * self.per_weight + n * self.per_row + self.per_matrix


FORMATS: dict[str, WeightFormat] = {
    "bf16": WeightFormat("bf16", 2.0),
    "fp16": WeightFormat("fp16", 2.0, compute="fp16"),
    "fp32": WeightFormat("fp32", 4.0, compute="fp32"),
    "fp8": WeightFormat("fp8", 1.0, per_row=4.0, compute="fp8"),
    # W12 (specpilot/kernels/w12.py): 12 bits a weight (plane A 8 + plane B 4), a row base
    # byte and a CSR row pointer (int32) per row, plus an allowance for the escape table
    "w12": WeightFormat("w12", 1.5, per_row=5.0, per_matrix=512.0, compute="bf16"),
}

_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
           "half": "fp16", "float32": "fp32", "fp32": "fp32", "float": "fp32"}


@dataclass(frozen=True)
class ModelSpec:
    """What the roofline needs of a decoder. `num_experts == 0` means dense."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool = False
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    weights: str = "bf16"
    target_layers: int = 0  # block drafters: how many target layers' hidden states they read

    @property
    def fmt(self) -> WeightFormat:
        return FORMATS[self.weights]

    @property
    def act_bytes(self) -> int:
        """Bytes of one activation / KV-cache element (fp32 models keep fp32, else 16-bit)."""
        return 4 if self.weights == "fp32" else 2

    def is_moe_layer(self, i: int) -> bool:
        return (self.num_experts > 0 and i not in self.mlp_only_layers
                and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def params(self) -> int:
        """Parameters stored (tied embeddings counted once; norms left out)."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * h
        dense = 3 * h * self.intermediate_size
        moe = (self.num_experts * 3 * h * self.moe_intermediate_size + self.num_experts * h
               + 3 * h * self.shared_expert_intermediate_size)
        n_moe = self.moe_layers
        body = self.num_layers * attn + n_moe * moe + (self.num_layers - n_moe) * dense
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return body + emb

    def with_weights(self, weights: str) -> ModelSpec:
        if weights not in FORMATS:
            raise SpecPilotError(f"unknown weight format {weights!r}: use one of "
                                 f"{', '.join(FORMATS)}")
        return ModelSpec(**{**asdict(self), "weights": weights})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        return cls(**{**d, "mlp_only_layers": tuple(d.get("mlp_only_layers", ()))})

    @classmethod
    def from_hf(cls, d: dict, name: str = "", weights: str | None = None) -> ModelSpec:
        """From an HF config dict; `weights` overrides the format read from the config."""
        if not isinstance(d, dict):
            raise SpecPilotError("a model config must be a JSON object (an HF config.json)")
        if "text_config" in d and "hidden_size" not in d:
            d = d["text_config"]
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            experts = int(d.get("num_experts") or d.get("num_local_experts") or 0)
            if weights is None:
                q = d.get("quantization_config") or {}
                if "fp8" in str(q.get("quant_method", "")) or "fp8" in str(q.get("fmt", "")):
                    weights = "fp8"
                else:
                    weights = _DTYPES.get(str(d.get("torch_dtype") or d.get("dtype")), "bf16")
            spec = cls(
                name=name or str(d.get("model_type", "model")),
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                intermediate_size=int(d.get("intermediate_size") or 0),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                num_experts=experts,
                experts_per_tok=int(d.get("num_experts_per_tok") or 0) if experts else 0,
                moe_intermediate_size=int(d.get("moe_intermediate_size")
                                          or d.get("intermediate_size") or 0) if experts else 0,
                shared_expert_intermediate_size=int(
                    d.get("shared_expert_intermediate_size") or 0) if experts else 0,
                decoder_sparse_step=int(d.get("decoder_sparse_step") or 1),
                mlp_only_layers=tuple(int(i) for i in d.get("mlp_only_layers") or ()),
                weights=weights,
                target_layers=len(d.get("target_layers") or ()),
            )
        except KeyError as e:
            raise SpecPilotError(f"model config is missing {e.args[0]!r}: point the cost "
                                 "model at an HF decoder config.json") from None
        except (TypeError, ValueError) as e:
            raise SpecPilotError(f"model config has a bad field ({e})") from None
        if spec.weights not in FORMATS:
            raise SpecPilotError(f"unknown weight format {spec.weights!r}: use one of "
                                 f"{', '.join(FORMATS)}")
        if experts and not spec.experts_per_tok:
            raise SpecPilotError("MoE config has num_experts but no num_experts_per_tok")
        if not experts and not spec.intermediate_size:
            raise SpecPilotError("model config has no intermediate_size")
        return spec


# Class-of-model presets (shapes of public model families; no weights): "random:NAME"
PRESETS: dict[str, dict] = {
    "8b": {"vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
               "torch_dtype": "bfloat16"},
    "32b": {"vocab_size": 151936, "hidden_size": 5120, "num_hidden_layers": 64,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                "intermediate_size": 25600, "torch_dtype": "bfloat16"},
    "30b-a3b": {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48,
                    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                    "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8,
                    "moe_intermediate_size": 768, "torch_dtype": "bfloat16"},
}
for _k in list(PRESETS):
    PRESETS[f"qwen3-{_k}"] = PRESETS[_k]


def load_spec(source: str | Path | dict, weights: str | None = None) -> ModelSpec:
    """A spec from a config dict, a config.json path, a checkpoint directory, or
    `random:NAME` / a preset name (8b, 32b, 30b-a3b)."""
    if isinstance(source, dict):
        return ModelSpec.from_hf(source, weights=weights)
    s = str(source)
    preset = s.removeprefix("random:").lower()
    if preset in PRESETS and not Path(s).exists():
        return ModelSpec.from_hf(PRESETS[preset], name=preset, weights=weights)
    p = Path(s)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise SpecPilotError(f"no model config at {s}: give a checkpoint directory, a "
                             f"config.json, or a preset ({', '.join(sorted(PRESETS))})")
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise SpecPilotError(f"cannot read {p} ({e.strerror}): check its permissions") from None
    except ValueError as e:  # not UTF-8, or not JSON
        raise SpecPilotError(f"{p} is a file but not a model config.json ({e}): give a "
                             "checkpoint directory, its config.json, or a preset "
                             f"({', '.join(sorted(PRESETS))})") from None
    name = p.parent.name if p.name == "config.json" else p.stem
    return ModelSpec.from_hf(d, name=name, weights=weights)
