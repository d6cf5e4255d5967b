"""Train the zoo's byte-level BPE tokenizer (vocabulary ~4096; `<|endoftext|>` = 0, `<|mask|>` = 1)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .corpus import EOT, MASK


def train_tokenizer(texts: list[str], vocab_size: int = 4096) -> Tokenizer:
    """A byte-level BPE over `texts`; every byte is in the alphabet, so any text round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def save_tokenizer(tok: Tokenizer, path: str | Path) -> None:
    """`tokenizer.json` plus a minimal `tokenizer_config.json` (eos token) into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOT,
        "bos_token": None,
        "pad_token": EOT,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
