"""Qwen3 / Llama-3 decoder in plain torch, with a static per-sequence-position KV cache.

One forward signature serves prefill, AR decode and speculative verify:
`model(input_ids [B, T], positions [B, T])` writes K/V at `positions` and lets each query
attend to every cache slot at a position <= its own. Rows of a batch may sit at different
positions; slots past a row's length hold stale K/V that the mask hides and that later
writes simply overwrite (no rollback).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """Inverse RoPE frequencies, with the `llama3` scaling when the config asks for it."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    sc = cfg.rope_scaling
    if sc is None:
        return inv
    kind = sc.get("rope_type", sc.get("type"))
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: llama3)")
    factor = float(sc["factor"])
    low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old_len = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class KVCache(nn.Module):
    """Static cache [B, n_kv, S, head_dim]; `update` writes at per-row positions."""

    def __init__(self, batch: int, n_kv: int, max_len: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, n_kv, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        self.k[rows, :, positions] = k.transpose(1, 2)
        self.v[rows, :, positions] = v.transpose(1, 2)
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.q_proj = nn.Linear(cfg.hidden_size, nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, mask: Tensor,
                kv_len: int | None) -> Tensor:
        B, T, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_proj(x).view(B, T, -1, hd)
        k = self.k_proj(x).view(B, T, -1, hd)
        v = self.v_proj(x).view(B, T, -1, hd)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(positions, k, v)
            if kv_len is not None:
                k, v = k[:, :, :kv_len], v[:, :, :kv_len]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, positions, mask, kv_len):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, mask, kv_len)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Parameter names follow HF (`model.layers.N...`, `lm_head`) so checkpoints load as is."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.max_seq_len = 0
        self.batch_size = 0

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def setup_cache(self, batch_size: int, max_seq_len: int) -> None:
        """(Re)allocate the static KV cache when the batch or length grows."""
        if batch_size == self.batch_size and max_seq_len <= self.max_seq_len:
            return
        c = self.cfg
        for layer in self.model.layers:
            layer.self_attn.kv_cache = KVCache(
                batch_size, c.num_kv_heads, max_seq_len, c.head_dim, self.dtype, self.device
            )
        self.batch_size, self.max_seq_len = batch_size, max_seq_len

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_tokens(input_ids)

    def head(self, h: Tensor) -> Tensor:
        """Final norm + LM head, logits in fp32."""
        return self.lm_head(self.model.norm(h)).float()

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        *,
        hidden_layers: tuple[int, ...] = (),
        last_only: bool = False,
        kv_len: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Logits [B, T, V] (or [B, 1, V] with last_only) and, when asked, the outputs of
        decoder layers `hidden_layers` concatenated on the last dim [B, T, n * hidden].

        With use_cache=False the cache is neither read nor written (plain causal pass over
        `input_ids`, used for teacher forcing). `kv_len` bounds the cache slots attended
        (every row's positions must be < kv_len)."""
        x = self.embed(input_ids)
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, T, hd]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        if use_cache:
            if self.batch_size == 0:
                raise RuntimeError("call setup_cache() before a cached forward")
            S = kv_len if kv_len is not None else self.max_seq_len
            if not 0 < S <= self.max_seq_len:
                raise ValueError(f"kv_len={S} outside the cache of {self.max_seq_len} slots")
            slots = torch.arange(S, device=positions.device)
            mask = (slots[None, None, :] <= positions[:, :, None])[:, None]  # [B,1,T,S]
        else:
            mask = (positions[:, None, :] <= positions[:, :, None])[:, None]
        saved = []
        want = set(hidden_layers)
        for i, layer in enumerate(self.model.layers):
            if not use_cache:
                attn = layer.self_attn
                cache, attn.kv_cache = attn.kv_cache, None
                x = layer(x, cos, sin, positions, mask, None)
                attn.kv_cache = cache
            else:
                x = layer(x, cos, sin, positions, mask, kv_len)
            if i in want:
                saved.append(x)
        hidden = None
        if hidden_layers:
            by_layer = dict(zip(sorted(want), saved))
            hidden = torch.cat([by_layer[i] for i in hidden_layers], dim=-1)
        if last_only:
            x = x[:, -1:]
        return self.head(x), hidden
