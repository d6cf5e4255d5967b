"""`block:DIR`: a DFlash-style block drafter that predicts a whole block in one forward.

The drafter owns a few Qwen3-style layers and no embedding or LM head: it borrows the
target's. The target's outputs of the layers named in `target_layers` are concatenated,
projected (`fc`) and normalised (`hidden_norm`) into *context features*; in every draft
layer these features supply extra keys and values (through that layer's own k/v
projections), next to the block's own. The block is `[pending, MASK x (B-1)]` at
positions P..P+B-1; it attends to the context at positions < P and, without a causal
mask, to itself. The outputs at the B-1 mask positions, through the drafter's final norm
and the target's LM head, are the B-1 drafts.

At inference the per-layer context K/V live in a static cache written at their positions
(rejected positions are overwritten later, as in the target's cache). For training,
`block_training_loss` computes the same function for many blocks of a batch at once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig, read_config_json
from ..drafter import Drafter
from ..errors import CheckpointError, check_dir
from ..loader import load_state, parse_dtype, read_tensors
from ..model import MLP, RMSNorm, Transformer, rotate_half

ARCH = "SpecPilotBlockDrafter"
MODEL_TYPE = "specpilot_block"


@dataclass(frozen=True)
class BlockConfig:
    """Shapes of a block drafter; `hidden_size` and `vocab_size` are the target's."""

    target_layers: tuple[int, ...]
    block_size: int
    mask_token_id: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    # the names the shared model parts (MLP) read
    @property
    def mlp_bias(self) -> bool:
        return False

    def to_hf(self) -> dict:
        d = asdict(self)
        d["target_layers"] = list(self.target_layers)
        return {"architectures": [ARCH], "model_type": MODEL_TYPE, **d}

    @classmethod
    def from_hf(cls, d: dict, where: str = "config.json") -> BlockConfig:
        if ARCH not in (d.get("architectures") or []) and d.get("model_type") != MODEL_TYPE:
            raise CheckpointError(
                f"{where} is not a block drafter (architectures {d.get('architectures')!r}): "
                f"expected {ARCH!r}"
            )
        try:
            cfg = cls(
                target_layers=tuple(int(i) for i in d["target_layers"]),
                block_size=int(d["block_size"]),
                mask_token_id=int(d["mask_token_id"]),
                hidden_size=int(d["hidden_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=int(d["num_attention_heads"]),
                num_key_value_heads=int(d.get("num_key_value_heads")
                                        or d["num_attention_heads"]),
                head_dim=int(d["head_dim"]),
                intermediate_size=int(d["intermediate_size"]),
                vocab_size=int(d["vocab_size"]),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(d.get("rope_theta", 10000.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where} is missing or has a bad field: {e}") from None
        if not cfg.target_layers or cfg.block_size < 2 or cfg.num_hidden_layers < 1:
            raise CheckpointError(
                f"{where}: a block drafter needs target_layers, block_size >= 2 and a layer"
            )
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise CheckpointError(f"{where}: num_attention_heads must be a multiple of "
                                  f"num_key_value_heads")
        return cfg


class BlockAttention(nn.Module):
    """Qwen3-style attention whose keys/values are [context features, block]."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        hd, nh, nkv, h = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, \
            cfg.hidden_size
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def context_kv(self, ctx: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (normed, rotated) and values of context features [B, T, H] -> [B, nkv, T, hd]."""
        B, T, _ = ctx.shape
        k = self.k_norm(self.k_proj(ctx).view(B, T, -1, self.cfg.head_dim)).transpose(1, 2)
        v = self.v_proj(ctx).view(B, T, -1, self.cfg.head_dim).transpose(1, 2)
        return k * cos + rotate_half(k) * sin, v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor,
                mask: Tensor) -> Tensor:
        """x [B, Q, H] at rotary (cos, sin); keys = cat(ctx_k, own keys); mask [B,1,Q,C+Q]."""
        B, Q, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_norm(self.q_proj(x).view(B, Q, -1, hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, Q, -1, hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, Q, -1, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, Q, -1))


class BlockLayer(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.self_attn = BlockAttention(cfg)
        self.mlp = MLP(cfg)  # reads hidden_size, intermediate_size, mlp_bias
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockDrafterModel(nn.Module):
    """fc + hidden_norm over the target's layer outputs, `num_hidden_layers` layers, norm."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layers) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        hd = cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rotary(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [B, 1, T, hd] for positions [B, T]."""
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def features(self, target_hidden: Tensor) -> Tensor:
        """Context features from the target's concatenated layer outputs [B, T, n*H]."""
        return self.hidden_norm(self.fc(target_hidden))

    def forward(self, x: Tensor, positions: Tensor, ctx_kv: list[tuple[Tensor, Tensor]],
                mask: Tensor) -> Tensor:
        """Block embeddings x [B, Q, H] at positions [B, Q]; per-layer context (k, v);
        mask [B, 1, Q, C + Q]. Returns the final-normed hidden states [B, Q, H]."""
        cos, sin = self.rotary(positions, x.dtype)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ck, cv, mask)
        return self.norm(x)


def default_target_layers(num_layers: int, n: int = 3) -> tuple[int, ...]:
    """`n` target layers spread evenly from the first to the second-to-last (or last)."""
    last = max(num_layers - 2, 0)
    n = max(1, min(n, last + 1))
    if n == 1:
        return (last,)
    return tuple(sorted({round(i * last / (n - 1)) for i in range(n)}))


def init_block_drafter(target_cfg: ModelConfig, target_layers: tuple[int, ...] | None = None,
                       block_size: int = 8, num_hidden_layers: int = 1,
                       mask_token_id: int | None = None, num_attention_heads: int | None = None,
                       num_key_value_heads: int | None = None, head_dim: int | None = None,
                       intermediate_size: int | None = None, seed: int = 0,
                       std: float = 0.02) -> BlockDrafterModel:
    """A randomly initialised block drafter for `target_cfg` (fp32, CPU)."""
    t = target_cfg
    cfg = BlockConfig(
        target_layers=tuple(target_layers or default_target_layers(t.num_layers)),
        block_size=block_size,
        mask_token_id=t.vocab_size - 1 if mask_token_id is None else mask_token_id,
        hidden_size=t.hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads or t.num_heads,
        num_key_value_heads=num_key_value_heads or t.num_kv_heads,
        head_dim=head_dim or t.head_dim,
        intermediate_size=intermediate_size or t.intermediate_size,
        vocab_size=t.vocab_size,
        rms_norm_eps=t.rms_norm_eps,
        rope_theta=t.rope_theta,
    )
    check_compatible(cfg, t, "init_block_drafter")
    g = torch.Generator().manual_seed(seed)
    model = BlockDrafterModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def check_compatible(cfg: BlockConfig, target: ModelConfig, where: str) -> None:
    if cfg.hidden_size != target.hidden_size:
        raise CheckpointError(f"{where}: block drafter hidden_size {cfg.hidden_size} != the "
                              f"target's {target.hidden_size}: it must be trained for this target")
    if cfg.vocab_size != target.vocab_size:
        raise CheckpointError(f"{where}: block drafter vocab_size {cfg.vocab_size} != the "
                              f"target's {target.vocab_size}: it must share its vocabulary")
    bad = [i for i in cfg.target_layers if not 0 <= i < target.num_layers]
    if bad:
        raise CheckpointError(f"{where}: target layer {bad[0]} is out of range: the target has "
                              f"{target.num_layers} layers (0..{target.num_layers - 1})")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise CheckpointError(f"{where}: mask_token_id {cfg.mask_token_id} is outside the "
                              f"target's vocabulary [0, {target.vocab_size})")


def save_block_drafter(model: BlockDrafterModel, path: str | Path) -> Path:
    """Write config.json + model.safetensors (an HF-layout directory)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.cfg.to_hf(), indent=2) + "\n")
    state = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def load_block_model(path: str | Path, device: str | torch.device = "cpu",
                     dtype: str | torch.dtype = "float32",
                     target_cfg: ModelConfig | None = None) -> BlockDrafterModel:
    """The drafter's own weights from `path`, its config checked against `target_cfg` (when
    given) before any weight is read."""
    path = check_dir(path, "block drafter directory", error=CheckpointError)
    f = path / "config.json"
    cfg = BlockConfig.from_hf(read_config_json(f, "point block:DIR at a block drafter"), str(f))
    if target_cfg is not None:
        check_compatible(cfg, target_cfg, str(path))
    with torch.device("meta"):
        model = BlockDrafterModel(cfg)
    load_state(model, read_tensors(path), parse_dtype(dtype), device, path)
    hd = cfg.head_dim
    model.inv_freq = 1.0 / (cfg.rope_theta ** (
        torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
    return model.eval().requires_grad_(False)


def load_block_drafter(path: str | Path, target: Transformer,
                       device: str | torch.device = "cpu",
                       dtype: str | torch.dtype | None = None) -> BlockDrafter:
    """`block:DIR` for the engine: the drafter checked against `target`."""
    model = load_block_model(path, device, dtype or target.dtype, target.cfg)
    return BlockDrafter(model, target)


class BlockDrafter(Drafter):
    name = "block"

    def __init__(self, model: BlockDrafterModel, target: Transformer):
        check_compatible(model.cfg, target.cfg, "block drafter")
        self.model, self.target = model, target
        self.hidden_layers = tuple(model.cfg.target_layers)
        self.max_k = model.cfg.block_size - 1
        self.cache: list[tuple[Tensor, Tensor]] = []
        self.shape: tuple[int, int] = (0, 0)

    def setup(self, batch_size: int, max_seq_len: int) -> None:
        if self.shape[0] == batch_size and self.shape[1] >= max_seq_len:
            return
        c, p = self.model.cfg, self.model.fc.weight
        shape = (batch_size, c.num_key_value_heads, max_seq_len, c.head_dim)
        self.cache = [(torch.zeros(shape, dtype=p.dtype, device=p.device),
                       torch.zeros(shape, dtype=p.dtype, device=p.device))
                      for _ in self.model.layers]
        self.shape = (batch_size, max_seq_len)

    def _write(self, rows: Tensor, positions: Tensor, hidden: Tensor) -> None:
        """Context K/V of target hidden [R, T, n*H] at positions [R, T] of batch rows [R]."""
        ctx = self.model.features(hidden.to(self.model.fc.weight.dtype))
        cos, sin = self.model.rotary(positions, ctx.dtype)
        r = rows[:, None]
        for layer, (ck, cv) in zip(self.model.layers, self.cache):
            k, v = layer.self_attn.context_kv(ctx, cos, sin)
            ck[r, :, positions] = k.transpose(1, 2)
            cv[r, :, positions] = v.transpose(1, 2)

    def prefill(self, prompts: list[list[int]], hidden: list[Tensor] | None) -> None:
        if hidden is None:
            raise RuntimeError("the block drafter needs the target's hidden states")
        dev = self.model.fc.weight.device
        for b, h in enumerate(hidden):
            pos = torch.arange(h.shape[0], device=dev)[None]
            self._write(torch.tensor([b], device=dev), pos, h[None])

    def propose(self, tokens: Tensor, lengths: Tensor, k: int) -> Tensor:
        if k > self.max_k:
            raise ValueError(f"k={k} exceeds the block drafter's {self.max_k} drafts per step")
        return self.logits(tokens, lengths, k).argmax(-1)

    def logits(self, tokens: Tensor, lengths: Tensor, k: int | None = None) -> Tensor:
        """Logits [B, k, V] of the first k (default block_size - 1) drafts after the pending
        token of each row, from the cached context (positions < lengths - 1)."""
        k = self.max_k if k is None else k
        dev = tokens.device
        B, Bk = tokens.shape[0], self.model.cfg.block_size
        P = lengths.to(dev) - 1  # position of the pending token
        ids = torch.full((B, Bk), self.model.cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = tokens.gather(1, P[:, None])[:, 0]
        pos = P[:, None] + torch.arange(Bk, device=dev)
        S = self.cache[0][0].shape[2]
        ctx_ok = torch.arange(S, device=dev)[None, :] < P[:, None]  # [B, S]
        mask = torch.cat([ctx_ok, torch.ones(B, Bk, dtype=torch.bool, device=dev)], dim=1)
        mask = mask[:, None, None, :].expand(B, 1, Bk, S + Bk)
        x = self.target.embed(ids).to(self.model.fc.weight.dtype)
        h = self.model(x, pos, self.cache, mask)
        return F.linear(h[:, 1:k + 1], self.target.lm_head.weight.to(h.dtype))

    def accept(self, start: Tensor, n_accepted: Tensor, hidden: Tensor | None) -> None:
        # Write all verified positions; those past the accepted prefix are rejected drafts,
        # hidden by the `< P` mask until later steps overwrite them.
        B, T = hidden.shape[:2]
        dev = hidden.device
        pos = start[:, None].to(dev) + torch.arange(T, device=dev)
        self._write(torch.arange(B, device=dev), pos, hidden)


def block_logits(block: BlockDrafterModel, target: Transformer, ids: Tensor, anchors: Tensor,
                 target_hidden: Tensor) -> Tensor:
    """Logits [N, nb, B-1, V] of the blocks anchored at `anchors` [N, nb] (pending token
    ids[n, a] at position a) of the sequences `ids` [N, T], given the target's layer
    outputs `target_hidden` [N, T, n*H] (no grad needed). Differentiable w.r.t. `block`."""
    cfg = block.cfg
    N, T = ids.shape
    nb, Bk = anchors.shape[1], cfg.block_size
    dev = ids.device
    dtype = block.fc.weight.dtype
    offs = torch.arange(Bk, device=dev)
    # Block queries of all nb blocks of a row, flattened to Q = nb * Bk.
    qids = torch.full((N, nb, Bk), cfg.mask_token_id, dtype=torch.long, device=dev)
    qids[:, :, 0] = ids.gather(1, anchors)
    qpos = (anchors[:, :, None] + offs).reshape(N, nb * Bk)
    with torch.no_grad():
        x = target.embed(qids.reshape(N, nb * Bk)).to(dtype)
    ctx = block.features(target_hidden.to(dtype))
    ctx_pos = torch.arange(T, device=dev)[None].expand(N, T)
    cos_c, sin_c = block.rotary(ctx_pos, dtype)
    # mask [N, 1, Q, T + Q]: context strictly before the anchor; own block only.
    a = anchors[:, :, None].expand(N, nb, Bk).reshape(N, nb * Bk)
    ctx_ok = torch.arange(T, device=dev)[None, None, :] < a[:, :, None]
    blk = torch.arange(nb, device=dev).repeat_interleave(Bk)
    own = (blk[:, None] == blk[None, :])[None].expand(N, -1, -1)
    mask = torch.cat([ctx_ok, own], dim=2)[:, None]
    cos, sin = block.rotary(qpos, dtype)
    h = x
    for layer in block.layers:
        ck, cv = layer.self_attn.context_kv(ctx, cos_c, sin_c)
        h = layer(h, cos, sin, ck, cv, mask)
    h = block.norm(h).view(N, nb, Bk, -1)[:, :, 1:]
    return F.linear(h, target.lm_head.weight.detach().to(dtype)).float()


def block_training_loss(block: BlockDrafterModel, target: Transformer, ids: Tensor,
                        labels: Tensor | None = None, n_blocks: int = 8,
                        generator: torch.Generator | None = None) -> Tensor:
    """Mean cross-entropy of the drafts of `n_blocks` random blocks per row of `ids` [N, T]
    against the target's greedy next tokens `labels` [N, T] (labels[:, p] = argmax after
    ids[:, :p+1]; computed from the target when None). Gradients reach `block` only."""
    cfg = block.cfg
    N, T = ids.shape
    Bk = cfg.block_size
    if T < Bk + 1:
        raise ValueError(f"sequences of {T} tokens are too short for blocks of {Bk}")
    with torch.no_grad():
        logits, hidden = target(ids, torch.arange(T, device=ids.device)[None].expand(N, T),
                                hidden_layers=tuple(cfg.target_layers), use_cache=False)
        if labels is None:
            labels = logits.argmax(-1)
        del logits
    # anchor a in [1, T - Bk + 1]: context non-empty, labels of a .. a+Bk-2 exist
    hi = T - Bk + 1
    gdev = generator.device if generator is not None else "cpu"
    anchors = torch.randint(1, hi + 1, (N, n_blocks), generator=generator,
                            device=gdev).to(ids.device)
    out = block_logits(block, target, ids, anchors, hidden)  # [N, nb, Bk-1, V]
    # draft j (1..Bk-1) sits at position a+j and should be labels[:, a+j-1]
    lab_pos = anchors[:, :, None] + torch.arange(Bk - 1, device=ids.device)
    lab = labels.gather(1, lab_pos.reshape(N, -1)).view(N, n_blocks, Bk - 1)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), lab.reshape(-1))


__all__ = [
    "BlockConfig",
    "BlockDrafter",
    "BlockDrafterModel",
    "block_logits",
    "block_training_loss",
    "default_target_layers",
    "init_block_drafter",
    "load_block_drafter",
    "load_block_model",
    "save_block_drafter",
]
