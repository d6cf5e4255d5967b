"""Qwen3 / Llama-3 decoder in plain torch, with a static per-sequence-position KV cache.

One forward signature serves prefill, AR decode and speculative verify:
`model(input_ids [B, T], positions [B, T])` writes K/V at `positions` and lets each query
attend to every cache slot at a position <= its own. Rows of a batch may sit at different
positions; slots past a row's length hold stale K/V that the mask hides and that later
writes simply overwrite (no rollback).

The cache only grows (`setup_cache` keeps a larger one), so a batch of B rows uses its first
B rows and CUDA graphs captured over it stay valid until `cache_version` changes.
`fuse_projections()` (for CUDA) concatenates q/k/v and gate/up into one `nn.Linear` each and
switches attention to a grouped layout (each KV head's query heads stacked as rows): fewer,
larger kernels per layer, the same function up to rounding. On CUDA, `set_fused_kernels(True)`
(or `fuse_projections(kernels=True)`) also routes the elementwise parts through the Triton
kernels of `specpilot.kernels.fused`: residual add + RMSNorm, q/k norm + RoPE + KV-cache
write, silu * up, each one launch with the torch path's rounding points (equal up to fp32
reduction order, so bf16 near-ties can resolve differently). CPU models never use them.
`set_attention_kernel(True)` (CUDA, fused layout) likewise sends decode/verify attention
through the split-KV Triton kernel of `specpilot.kernels.attention` (SDPA's function, fp32
softmax; its sums run in another order) and writes o_proj's input layout directly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMS norm in fp32, cast back, then scaled (HF's rounding order)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.kernels = False  # Triton kernel (set_fused_kernels)

    def forward(self, x: Tensor) -> Tensor:
        if self.kernels:
            return _fused().rms_norm(x, self.weight, self.eps)[1]
        return rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(x + residual, norm(x + residual)); one kernel when the Triton kernels are on."""
        if self.kernels:
            return _fused().rms_norm(x, self.weight, self.eps, residual=residual)
        x = x + residual
        return x, rms_norm(x, self.weight, self.eps)


def _fused():
    from ..kernels import fused

    return fused


def _attention():
    from ..kernels import attention

    return attention


# the Triton attention takes steps of up to this many query positions (decode, verify with
# k <= 32); longer passes (prefill, teacher forcing) stay on SDPA
ATTN_KERNEL_MAX_T = 33


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
    """Static cache [B, n_kv, S, head_dim]; writes go to per-row positions of the first rows."""

    def __init__(self, batch: int, n_kv: int, max_len: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, n_kv, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("rows", torch.arange(batch, device=device)[:, None],
                             persistent=False)

    def write(self, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v [B, T, n_kv, hd] at positions [B, T]; returns the first B rows of the cache."""
        B = positions.shape[0]
        rows = self.rows[:B]
        self.k[rows, :, positions] = k
        self.v[rows, :, positions] = v
        return self.k[:B], self.v[:B]

    def update(self, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v [B, n_kv, T, hd] (head-major layout)."""
        return self.write(positions, k.transpose(1, 2), v.transpose(1, 2))


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
        self.fused = False
        self.kernels = False  # Triton q/k norm + RoPE + cache write (fused layout only)
        self.attn_kernel = False  # Triton decode/verify attention (set_attention_kernel)

    def fuse(self) -> None:
        """One qkv_proj (and one [nh + nkv, hd] q/k norm weight) instead of three."""
        c = self.cfg
        self.qkv_proj = _concat_linears([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj
        if c.qk_norm:
            w = torch.cat([self.q_norm.weight.expand(c.num_heads, -1),
                           self.k_norm.weight.expand(c.num_kv_heads, -1)])
            self.register_buffer("qk_norm_weight", w.contiguous(), persistent=False)
        self.fused = True

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, mask: Tensor,
                kv_len: int | None) -> Tensor:
        if self.fused:
            return self._forward_fused(x, cos, sin, positions, mask, kv_len)
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

    def _forward_fused(self, x, cos, sin, positions, mask, kv_len):
        """cos/sin [B, T, 1, hd]; mask additive [B, 1, T * G, S] over grouped query rows."""
        c = self.cfg
        B, T, _ = x.shape
        hd, nh, nkv = c.head_dim, c.num_heads, c.num_kv_heads
        G = nh // nkv
        qkv = self.qkv_proj(x).view(B, T, nh + 2 * nkv, hd)
        if self.kernels:
            return self._attend_grouped(*self._qkv_kernel(qkv, cos, sin, positions, kv_len),
                                        mask)
        qk, v = qkv[:, :, : nh + nkv], qkv[:, :, nh + nkv:]
        if c.qk_norm:
            qk = rms_norm(qk, self.qk_norm_weight, c.rms_norm_eps)
        qk = qk * cos + rotate_half(qk) * sin
        q, k = qk[:, :, :nh], qk[:, :, nh:]
        if self.kv_cache is not None:
            k, v = self.kv_cache.write(positions, k, v)
            if kv_len is not None:
                k, v = k[:, :, :kv_len], v[:, :, :kv_len]
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        # query head h = j * G + g reads KV head j: rows (t, g) of KV head j
        q = q.reshape(B, T, nkv, G, hd).transpose(1, 2).reshape(B, nkv, T * G, hd)
        return self._attend_grouped(q, k, v, mask)

    def _attend_grouped(self, q, k, v, mask):
        """q [B, nkv, T * G, hd] (grouped rows), k/v [B, nkv, S, hd] -> o_proj output."""
        c = self.cfg
        B, nkv, TG, hd = q.shape
        G = c.num_heads // nkv
        if self.attn_kernel and TG <= ATTN_KERNEL_MAX_T * G:
            return self.o_proj(_attention().attend_merged(q, k, v, mask, G))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.view(B, nkv, TG // G, G, hd).transpose(1, 2).reshape(B, TG // G, c.num_heads * hd)
        return self.o_proj(y)

    def _qkv_kernel(self, qkv, cos, sin, positions, kv_len):
        """The Triton path: q (grouped), and k/v written to the cache (or fresh)."""
        c = self.cfg
        w = self.qk_norm_weight if c.qk_norm else None
        cache = self.kv_cache
        if cache is None:
            return _fused().qkv_rope(qkv, cos, sin, w, c.rms_norm_eps, c.num_heads,
                                     c.num_kv_heads)
        q, k, v = _fused().qkv_rope(qkv, cos, sin, w, c.rms_norm_eps, c.num_heads,
                                    c.num_kv_heads, positions, cache.k, cache.v)
        if kv_len is not None:
            k, v = k[:, :, :kv_len], v[:, :, :kv_len]
        return q, k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)
        self.fused = False
        self.kernels = False  # Triton silu * up (fused layout only)

    def fuse(self) -> None:
        self.gate_up_proj = _concat_linears([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj
        self.fused = True

    def forward(self, x: Tensor) -> Tensor:
        if self.kernels:
            return self.down_proj(_fused().silu_mul(self.gate_up_proj(x)))
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _concat_linears(parts: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the concatenation of `parts`' outputs (weights copied
    once)."""
    w = torch.cat([p.weight.detach() for p in parts])
    bias = parts[0].bias is not None
    out = nn.Linear(w.shape[1], w.shape[0], bias=bias, device="meta")
    out.weight = nn.Parameter(w, requires_grad=False)
    if bias:
        out.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    return out


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

    def forward_pending(self, x, pending, cos, sin, positions, mask, kv_len):
        """`forward` of x + pending (None: x), returning (x', pending') with the layer's
        output x' + pending': each residual add is done inside the next norm's kernel."""
        if pending is None:
            h = self.input_layernorm(x)
        else:
            x, h = self.input_layernorm.add_forward(x, pending)
        a = self.self_attn(h, cos, sin, positions, mask, kv_len)
        x, h = self.post_attention_layernorm.add_forward(x, a)
        return x, self.mlp(h)


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
        self.cache_version = 0  # bumped on every (re)allocation of the cache
        self.fused = False
        self.kernels = False  # Triton elementwise kernels (set_fused_kernels)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def fuse_projections(self, kernels: bool | None = None) -> None:
        """Concatenate q/k/v and gate/up weights (copies them once; meant for CUDA), then
        `set_fused_kernels(kernels)` unless `kernels` is None (the Triton kernels stay as
        they are: off on a fresh model)."""
        if not self.fused:
            for layer in self.model.layers:
                layer.self_attn.fuse()
                layer.mlp.fuse()
            self.fused = True
        if kernels is not None:
            self.set_fused_kernels(kernels)

    def set_fused_kernels(self, on: bool) -> bool:
        """Use the Triton elementwise kernels (`specpilot.kernels.fused`) where they apply:
        a fused model on CUDA in bf16/fp16/fp32 with Triton installed; anywhere else they
        stay off. Returns whether they are on. Drop captured CUDA graphs after a change."""
        on = bool(on) and self.fused and self.device.type == "cuda" and self.dtype in (
            torch.bfloat16, torch.float16, torch.float32)
        if on:
            try:
                _fused()
            except ImportError:
                on = False
        self._flag_kernels(on)
        return on

    def set_attention_kernel(self, on: bool) -> bool:
        """Run decode/verify attention (steps of <= ATTN_KERNEL_MAX_T positions) through
        the Triton split-KV kernel (`specpilot.kernels.attention`) instead of SDPA: a fused
        model on CUDA in bf16/fp16/fp32, head dim 64 or 128, Triton installed; anywhere
        else it stays off. Returns whether it is on. Drop captured CUDA graphs after a
        change."""
        on = bool(on) and self.fused and self.device.type == "cuda" and self.dtype in (
            torch.bfloat16, torch.float16, torch.float32)
        if on:
            try:
                on = self.cfg.head_dim in _attention().HEAD_DIMS
            except ImportError:
                on = False
        self._flag_attention(on)
        return on

    def _flag_attention(self, on: bool) -> None:
        """Route attention to the kernel (tests call it directly to run it on a CPU under
        TRITON_INTERPRET=1)."""
        for layer in self.model.layers:
            layer.self_attn.attn_kernel = on

    def _flag_kernels(self, on: bool) -> None:
        """Route the modules to the kernels (tests call it directly to run them on a CPU under
        TRITON_INTERPRET=1)."""
        norms = [self.model.norm]
        hd = self.cfg.head_dim
        rope_ok = hd & (hd - 1) == 0  # the q/k norm + RoPE kernel takes power-of-two heads
        for layer in self.model.layers:
            norms += [layer.input_layernorm, layer.post_attention_layernorm]
            layer.mlp.kernels = on
            layer.self_attn.kernels = on and rope_ok
        for n in norms:
            n.kernels = on
        self.kernels = on

    def setup_cache(self, batch_size: int, max_seq_len: int) -> None:
        """Allocate the static KV cache when the batch or the length outgrows it (it never
        shrinks: a smaller batch uses the first rows)."""
        if batch_size <= self.batch_size and max_seq_len <= self.max_seq_len:
            return
        batch_size = max(batch_size, self.batch_size)
        max_seq_len = max(max_seq_len, self.max_seq_len)
        c = self.cfg
        for layer in self.model.layers:
            layer.self_attn.kv_cache = None  # free the old one first
        for layer in self.model.layers:
            layer.self_attn.kv_cache = KVCache(
                batch_size, c.num_kv_heads, max_seq_len, c.head_dim, self.dtype, self.device
            )
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self.cache_version += 1

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
        x, hidden = self.body(input_ids, positions, hidden_layers=hidden_layers,
                              kv_len=kv_len, use_cache=use_cache)
        if last_only:
            x = x[:, -1:]
        return self.head(x), hidden

    def step(self, input_ids: Tensor, positions: Tensor, *, hidden_layers: tuple[int, ...] = (),
             last_only: bool = False, kv_len: int | None = None) -> tuple[Tensor, Tensor | None]:
        """A cached pass that returns the greedy tokens [B, T] (argmax of the logits, without
        materialising them in fp32) and the hidden states as `forward` does."""
        x, hidden = self.body(input_ids, positions, hidden_layers=hidden_layers, kv_len=kv_len)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.model.norm(x)).argmax(-1), hidden

    def body(self, input_ids: Tensor, positions: Tensor, *, hidden_layers: tuple[int, ...] = (),
             kv_len: int | None = None, use_cache: bool = True) -> tuple[Tensor, Tensor | None]:
        """The decoder stack: final-layer states [B, T, H] (before the final norm) and the
        requested layers' outputs."""
        x = self.embed(input_ids)
        B, T = positions.shape
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, hd]
        emb = emb[:, :, None] if self.fused else emb[:, None]  # [B,T,1,hd] | [B,1,T,hd]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        if use_cache:
            if self.batch_size == 0:
                raise RuntimeError("call setup_cache() before a cached forward")
            if B > self.batch_size:
                raise ValueError(f"batch of {B} rows but the cache holds {self.batch_size}")
            S = kv_len if kv_len is not None else self.max_seq_len
            if not 0 < S <= self.max_seq_len:
                raise ValueError(f"kv_len={S} outside the cache of {self.max_seq_len} slots")
            slots = torch.arange(S, device=positions.device)
            allowed = slots[None, None, :] <= positions[:, :, None]  # [B, T, S]
        else:
            allowed = positions[:, None, :] <= positions[:, :, None]
        if self.fused:
            G = self.cfg.num_heads // self.cfg.num_kv_heads
            add = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
            add.masked_fill_(~allowed, float("-inf"))
            n = allowed.shape[-1]
            mask = add[:, None, :, None, :].expand(B, 1, T, G, n).reshape(B, 1, T * G, n)
        else:
            mask = allowed[:, None]  # [B, 1, T, S]
        saved = []
        want = set(hidden_layers)
        pending = None  # with the kernels on: the last layer output's MLP term, not yet added
        args = (cos, sin, positions, mask, kv_len if use_cache else None)
        for i, layer in enumerate(self.model.layers):
            if not use_cache:  # the layer runs without its cache, which is kept as it is
                attn = layer.self_attn
                cache, attn.kv_cache = attn.kv_cache, None
            if self.kernels:
                x, pending = layer.forward_pending(x, pending, *args)
            else:
                x = layer(x, *args)
            if not use_cache:
                attn.kv_cache = cache
            if i in want:
                saved.append(x if pending is None else x + pending)
        if pending is not None:
            x = x + pending
        hidden = None
        if hidden_layers:
            by_layer = dict(zip(sorted(want), saved))
            hidden = torch.cat([by_layer[i] for i in hidden_layers], dim=-1)
        return x, hidden
