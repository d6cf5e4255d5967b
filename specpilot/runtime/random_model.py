"""Random-weight Qwen3 models built directly on a device (perf-only deployments, `random:NAME`).

Shapes come from the cost model's presets (`specpilot.costmodel.spec.PRESETS`: 8b, 32b)
plus small draft-model classes here (0.6b, 1.7b, and the EAGLE-class heads eagle-8b and
eagle-32b). Weights are N(0, std) (the LM head may get
a larger std: peakier logits, so near-ties between the top two tokens are rarer and greedy
outputs are stable across kernels), norms 1, built in the target dtype without a CPU copy.
"""

from __future__ import annotations

import torch

from .config import ModelConfig
from .errors import SpecPilotError
from .loader import parse_dtype
from .model import Transformer, rope_inv_freq

# draft-model classes (Qwen3-0.6B / 1.7B shapes); the large ones come from the cost model
DRAFT_PRESETS: dict[str, dict] = {
    "0.6b": {"vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "intermediate_size": 3072, "tie_word_embeddings": True},
    "1.7b": {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "intermediate_size": 6144, "tie_word_embeddings": True},
    # The per-step cost of an EAGLE-3-class draft head for the 8B/32B targets: one decoder
    # layer of the target's width and a 32k-token draft vocabulary. Its feature-fusion fc
    # (3 * hidden -> hidden, ~3 hidden^2 weights) is counted by widening the MLP by
    # `hidden` (the MLP holds 3 * hidden weights per intermediate unit), so the bytes read
    # per step match. A cost model of drafting only: the oracle drafter discards its output.
    "eagle-8b": {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 1,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "intermediate_size": 12288 + 4096},
    "eagle-32b": {"vocab_size": 32000, "hidden_size": 5120, "num_hidden_layers": 1,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                  "intermediate_size": 25600 + 5120},
    # for tests and CPU smoke runs
    "tiny": {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "intermediate_size": 128},
}
QWEN3_COMMON = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                "rope_theta": 1_000_000.0, "max_position_embeddings": 40960,
                "rms_norm_eps": 1e-6, "eos_token_id": 151645}


def preset_config(name: str) -> ModelConfig:
    """The ModelConfig of a preset name (`random:` prefix allowed)."""
    from ..costmodel.spec import PRESETS

    key = name.removeprefix("random:").lower()
    d = DRAFT_PRESETS.get(key) or PRESETS.get(key)
    if d is None or "num_experts" in d:
        known = sorted(set(DRAFT_PRESETS) | {k for k, v in PRESETS.items()
                                               if "num_experts" not in v})
        raise SpecPilotError(f"no dense random-model preset {name!r}: use one of {known}")
    d = {**QWEN3_COMMON, **d}
    if d["vocab_size"] <= d["eos_token_id"]:
        d["eos_token_id"] = d["vocab_size"] - 1
    return ModelConfig.from_hf(d)


def random_transformer(cfg: ModelConfig | str, device: str | torch.device = "cpu",
                       dtype: str | torch.dtype = "bfloat16", seed: int = 0, std: float = 0.02,
                       head_std: float | None = 0.25, fused: bool = False) -> Transformer:
    """A Transformer with N(0, std) matrices (N(0, head_std) for an untied LM head), unit
    norms, allocated once on `device` in `dtype`; `fused` concatenates the projections."""
    if isinstance(cfg, str):
        cfg = preset_config(cfg)
    dtype = parse_dtype(dtype)
    with torch.device("meta"):
        m = Transformer(cfg).to(dtype)
    m = m.to_empty(device=device)
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                sd = head_std if (head_std is not None and name == "lm_head.weight") else std
                p.normal_(0.0, sd, generator=g)
            else:
                p.fill_(1.0)
    if cfg.tie_word_embeddings:
        m.lm_head.weight = m.model.embed_tokens.weight
    m.inv_freq = rope_inv_freq(cfg).to(dev)
    m = m.eval().requires_grad_(False)
    if fused:
        m.fuse_projections()
    return m
