"""Tokenizer of a checkpoint: `tokenizer.json` via `tokenizers`, chat template via jinja2."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from .errors import CheckpointError


class Tokenizer:
    def __init__(self, path: str | Path):
        path = Path(path)
        f = path / "tokenizer.json"
        if not f.is_file():
            raise CheckpointError(f"no tokenizer.json in {path}")
        try:
            self.tok = HFTokenizer.from_file(str(f))
        except Exception as e:  # noqa: BLE001 (tokenizers raises a bare Exception)
            raise CheckpointError(f"{f} is not a valid tokenizer ({e})") from None
        cfg_file = path / "tokenizer_config.json"
        try:
            cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{cfg_file} is unreadable or not valid JSON "
                                  f"({type(e).__name__}): restore it from the checkpoint") from None
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{cfg_file} must hold a JSON object: restore it from the "
                                  "checkpoint")
        self.chat_template: str | None = cfg.get("chat_template")
        tmpl = path / "chat_template.jinja"
        if self.chat_template is None and tmpl.is_file():
            self.chat_template = tmpl.read_text()
        self.eos_token: str | None = _token_str(cfg.get("eos_token"))
        self.bos_token: str | None = _token_str(cfg.get("bos_token"))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.tok.id_to_token(i)

    def apply_chat_template(self, messages: list[dict]) -> str:
        """Render messages with the checkpoint's template, or a plain fallback without one."""
        if not self.chat_template:
            body = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return body + "assistant:"
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=True,
            eos_token=self.eos_token or "", bos_token=self.bos_token or "",
        )


def _token_str(v) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v
