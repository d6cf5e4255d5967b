"""Make small random-weight HF checkpoints (config.json, model.safetensors, tokenizer.json)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 300
TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n" * 4


def make_tokenizer(vocab_size: int = VOCAB):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    return tok


def make_checkpoint(path: Path, arch: str = "qwen3", seed: int = 0, dtype=torch.float32,
                    sharded: bool = False, **overrides) -> Path:
    """A random model of `arch` (qwen3 | llama) saved with `save_pretrained`."""
    import transformers

    tok = make_tokenizer()
    vocab = tok.get_vocab_size()
    common = {"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 24, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
              "eos_token_id": 0, "bos_token_id": 0, "tie_word_embeddings": False}
    if arch == "qwen3":
        common.update(rope_theta=10000.0)
        common.update(overrides)
        cfg = transformers.Qwen3Config(**common)
        cls = transformers.Qwen3ForCausalLM
    elif arch == "llama":
        common.update(rope_theta=500000.0, tie_word_embeddings=True,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 64})
        common.update(overrides)
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():  # larger-than-default weights so logits are far from ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model = model.to(dtype)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True,
                          max_shard_size="100KB" if sharded else "10GB")
    tok.save(str(path / "tokenizer.json"))
    return path


def perturb_checkpoint(src: Path, dst: Path, scale: float = 0.3, seed: int = 0) -> Path:
    """A copy of `src` with noise (relative `scale`) on its matrices: a drafter that agrees
    with `src` often but not always (ragged acceptance)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(seed)
    for f in sorted(dst.glob("*.safetensors")):
        state = load_file(str(f))
        for name, t in state.items():
            if t.dim() == 2:
                state[name] = t + torch.randn(t.shape, generator=g).to(t.dtype) * t.std() * scale
        save_file(state, str(f), metadata={"format": "pt"})
    return dst


def make_block_drafter(path: Path, target_dir: Path, block_size: int = 6, seed: int = 0,
                       std: float = 0.1, **kw) -> Path:
    """A random block drafter for the checkpoint at `target_dir`, saved at `path`."""
    from specpilot.runtime.config import ModelConfig
    from specpilot.runtime.drafters.block import init_block_drafter, save_block_drafter

    model = init_block_drafter(ModelConfig.from_file(target_dir), block_size=block_size,
                               seed=seed, std=std, **kw)
    return save_block_drafter(model, path)
