"""The peer a user would otherwise pick: HF transformers `generate()` on the same random
8B-class Qwen3 config, greedy, plain and with `assistant_model` (a random 0.6B-class draft:
it measures the assisted loop's cost, its acceptance is near 0 on random weights).

    PYTHONPATH=. python3 benchmarks/hf_peer.py [--preset 8b] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def hf_random(preset: str, device: str, dtype: torch.dtype, seed: int):
    """transformers' Qwen3ForCausalLM with the preset's shapes and N(0, 0.02) weights."""
    import transformers

    from specpilot.runtime.random_model import preset_config

    c = preset_config(preset)
    cfg = transformers.Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings, eos_token_id=list(c.eos_token_ids),
        pad_token_id=0)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(cfg).to(dtype)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.02, generator=g)
            else:
                p.fill_(1.0)
        if cfg.tie_word_embeddings:
            model.tie_weights()
        for name, buf in model.named_buffers():  # rotary inv_freq, made on meta
            if "inv_freq" in name:
                dim = c.head_dim
                inv = 1.0 / (c.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
                buf.copy_(inv)
    return model.eval()


@torch.inference_mode()
def run_peer(preset: str = "8b", device: str = "cuda", dtype=torch.bfloat16, n_new: int = 64,
             prompt_len: int = 64, budget_s: float = 120.0) -> dict:
    t0 = time.perf_counter()
    target = hf_random(preset, device, dtype, 0)
    V = target.config.vocab_size
    ids = torch.randint(0, V, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    kw = {"max_new_tokens": n_new, "min_new_tokens": n_new, "do_sample": False}
    rows = {}

    def timed(name, **extra):
        target.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, **extra)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = target.generate(ids, **kw, **extra)
        if device == "cuda":
            torch.cuda.synchronize()
        s = time.perf_counter() - t
        n = out.shape[1] - prompt_len
        rows[name] = {"tok_s": n / s, "new_tokens": int(n), "seconds": s}
        print(f"HF generate {name:<22} {n / s:8.1f} tok/s ({n} tokens, {s:.2f} s)")

    print(f"\n[peer] transformers generate(), random {preset}, batch 1, {n_new} new tokens")
    timed("greedy")
    if time.perf_counter() - t0 < budget_s / 2:
        draft = hf_random("0.6b" if preset != "tiny" else "tiny", device, dtype, 1)
        timed("assistant_model 0.6b", assistant_model=draft)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="8b")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)  # before the run, not after it
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    rows = run_peer(a.preset, dev, dt, a.new_tokens)
    with open(os.path.join(a.out, "hf_peer.json"), "w") as f:
        json.dump({"preset": a.preset, "device": dev, "date": time.strftime("%Y-%m-%d"),
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
