"""W12: a lossless 12-bit storage format for bf16 weight matrices, and its torch reference.

A bf16 weight is sign s (1 bit), exponent e (8) and mantissa m (7). Per row, W12 picks a
base b (1..239) so that the window e = b .. b + 15 holds as many weights as possible, and
stores each in-window weight as 12 bits: s, m and the 4-bit code c = e - b. The kernels
decode these 12 bits into the bf16 (or fp32) number

    w' = (-1)^s * 2^(E0 + c - 127) * (1 + m / 128),   E0 = 112 (exponent field 0111cccc),

which is the weight times the exact power of two 2^(E0 - b): the dot products of a row are
accumulated on w' and multiplied once by 2^(b - E0) at the end (exact scaling; only the
rounding order of the sum differs from a bf16 GEMM). Building w' is a handful of word-wide
integer ops (mask, or, byte permute) per 8 weights, with no per-weight select.

Layout (K padded with zeros to a multiple of `K_ALIGN` = 128; per row, groups of 8 * gw
columns, gw = 64 words when Kp is a multiple of 512, else 32 or 16):

- `codes` (uint8 [N, Kp / 2], gw 32-bit words per group): word g of a group describes the
  8 columns ``8 * gw * group + i * gw + g`` (i = 0..7). With H_i = s << 7 | c >> 1 (bits 7
  and 2..0 of the high byte of w'), the word is X1 | rotl(X2, 4), where byte j of X1 is H_j
  and byte j of X2 is H_{4+j}: ``word & 0x87878787`` gives H_0..H_3 and
  ``rotr(word, 4) & 0x87878787`` gives H_4..H_7.
- `a` (uint8 [N, Kp], 2 * gw words per group): words 0..gw-1 hold L_0..L_3 and words
  gw..2gw-1 hold L_4..L_7 of column word g, where L_i = (c & 1) << 7 | m is the low byte
  of w'. So bf16 w' = (H_i | 0x38) << 8 | L_i.

Everything else is an *escape*: ±0, subnormals (exponent 0), out-of-window exponents, inf
and NaN. Escapes are stored as H = L = 0 (they decode to the placeholder w' = 2^-15, i.e.
2^(b - 127) after scaling) and kept exactly in a side table sorted by row (``esc_row``,
``esc_col``, ``esc_bits`` = raw bf16 bits, ``esc_rowptr`` = CSR offsets per row); the
kernels add x * (value - placeholder) in their epilogue. Padding columns are not escapes:
their activations are zero. `nbytes` counts every stored byte.

Escape rate on LLM-like weights is ~1e-4 (12.01-12.02 bits per weight); matrices with many
exact zeros (zero-padded vocabulary rows, pruned weights) escape heavily, which `stats`
reports and the engine's per-layer decision (`w12_linear.predicted_gain`) charges for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

K_ALIGN = 128  # K is padded to this
WINDOW = 16  # exponent codes 0..15
E0 = 0x70  # exponent field of the decoded w' is E0 + code
H_MASK = 0x87  # bits of the high byte of w' that vary: sign (7) and code >> 1 (2..0)
H_CONST = 0x38  # the fixed bits of that byte: E0 >> 1


@dataclass
class W12Weight:
    """A bf16 matrix [N, K] stored in W12 form (all tensors on one device)."""

    n: int
    k: int
    a: Tensor  # uint8 [N, Kp]
    codes: Tensor  # uint8 [N, Kp // 2]
    base: Tensor  # uint8 [N]
    esc_rowptr: Tensor  # int32 [N + 1]
    esc_row: Tensor  # int32 [E]
    esc_col: Tensor  # int32 [E]
    esc_bits: Tensor  # int16 [E], raw bf16 bits

    @property
    def kp(self) -> int:
        return self.a.shape[1]

    @property
    def gw(self) -> int:
        """32-bit words per column group (a group is 8 * gw columns)."""
        return group_words(self.kp)

    @property
    def n_escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def escape_rate(self) -> float:
        return self.n_escapes / max(1, self.n * self.k)

    @property
    def device(self) -> torch.device:
        return self.a.device

    def row_strides(self) -> tuple[int, int]:
        """Row strides of the `a` and `codes` planes in 32-bit words, as the kernels take them
        (the planes may be row views of a larger buffer)."""
        return self.a.stride(0) // 4, self.codes.stride(0) // 4

    def tensors(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in TENSOR_FIELDS}

    @property
    def nbytes(self) -> int:
        """Every byte stored: both planes, row bases and the whole escape table."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / max(1, self.n * self.k)

    def to(self, device: torch.device | str) -> W12Weight:
        return W12Weight(self.n, self.k, **{n: t.to(device) for n, t in self.tensors().items()})


TENSOR_FIELDS = ("a", "codes", "base", "esc_rowptr", "esc_row", "esc_col", "esc_bits")


def padded(k: int) -> int:
    """K padded to a multiple of K_ALIGN (at least one block): the width W12 stores."""
    return -(-max(k, 1) // K_ALIGN) * K_ALIGN


def group_words(kp: int) -> int:
    """Words per column group for a padded width kp (a multiple of K_ALIGN)."""
    if kp % K_ALIGN:
        raise ValueError(f"padded K must be a multiple of {K_ALIGN}, got {kp}")
    return 64 if kp % 512 == 0 else 32 if kp % 256 == 0 else 16


def _fields(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(sign, exponent, mantissa) of a bf16 tensor as int32 tensors."""
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F


def best_base(exp: Tensor) -> Tensor:
    """Per row, the base b (1..239) whose window b..b+15 holds the most normal exponents."""
    n = exp.shape[0]
    hist = torch.zeros(n, 256, dtype=torch.int32, device=exp.device)
    hist.scatter_add_(1, exp.to(torch.int64), torch.ones_like(exp, dtype=torch.int32))
    hist[:, 0] = 0  # zeros/subnormals and inf/NaN always escape
    hist[:, 255] = 0
    cum = F.pad(hist.cumsum(1), (1, 0))  # cum[:, j] = count of exponents < j
    starts = torch.arange(1, 256 - WINDOW, device=exp.device)  # b = 1..239
    covered = cum[:, starts + WINDOW] - cum[:, starts]
    return (covered.argmax(1) + 1).to(torch.int32)


def _bytes_of_words(words: Tensor) -> Tensor:
    """uint8 [..., 4 * W] little-endian bytes of int64-held 32-bit words [..., W]."""
    shifts = torch.arange(0, 32, 8, device=words.device)
    return ((words[..., None] >> shifts) & 0xFF).to(torch.uint8).flatten(-2)


PACK_CHUNK = 1 << 26  # weights packed per step: bounds the int64 temporaries (~0.5 GB each)


def pack(w: Tensor) -> W12Weight:
    """Store a bf16 matrix [N, K] in W12 form, on w's device; bit-exact for every value.
    Rows are packed in chunks of about PACK_CHUNK weights (the format is row-local), so a
    large matrix (a 32B-class LM head) needs little memory beyond its own two forms."""
    if w.dtype != torch.bfloat16 or w.dim() != 2:
        raise ValueError(f"pack expects a 2-D bfloat16 tensor, got {w.dtype} {tuple(w.shape)}")
    step = max(1, PACK_CHUNK // max(w.shape[1], 1))
    if w.shape[0] <= step:
        return _pack_rows(w)
    return _concat_rows([_pack_rows(w[i:i + step]) for i in range(0, w.shape[0], step)])


def _concat_rows(parts: list[W12Weight]) -> W12Weight:
    """The W12 form of the row-wise concatenation of `parts` (same K)."""
    starts = [0]
    for p in parts[:-1]:
        starts.append(starts[-1] + p.n)
    counts = torch.cat([p.esc_rowptr.diff() for p in parts]).to(torch.int64)
    return W12Weight(
        sum(p.n for p in parts), parts[0].k,
        torch.cat([p.a for p in parts]), torch.cat([p.codes for p in parts]),
        torch.cat([p.base for p in parts]), F.pad(counts.cumsum(0), (1, 0)).to(torch.int32),
        torch.cat([p.esc_row + s for p, s in zip(parts, starts)]),
        torch.cat([p.esc_col for p in parts]), torch.cat([p.esc_bits for p in parts]))


def _pack_rows(w: Tensor) -> W12Weight:
    n, k = w.shape
    kp = padded(k)
    if kp != k:
        w = F.pad(w, (0, kp - k))
    sign, exp, mant = _fields(w)
    base = best_base(exp) if n else torch.zeros(0, dtype=torch.int32, device=w.device)
    code = exp - base[:, None]
    keep = (code >= 0) & (code < WINDOW) & (exp != 0) & (exp != 255)
    real = torch.arange(kp, device=w.device) < k
    escape = ~keep & real
    code = torch.where(keep, code, 0)
    hi = torch.where(keep, (sign << 7) | (code >> 1), 0).to(torch.int64)
    lo = torch.where(keep, ((code & 1) << 7) | mant, 0).to(torch.int64)
    gw = group_words(kp)
    ng = kp // (8 * gw)
    hi = hi.view(n, ng, 2, 4, gw)  # [row, group, set j, byte b, word g]: column i = 4j + b
    lo = lo.view(n, ng, 2, 4, gw)
    shifts = torch.arange(0, 32, 8, device=w.device).view(1, 1, 4, 1)
    x1 = (hi[:, :, 0] << shifts).sum(2)  # [n, ng, gw]
    x2 = (hi[:, :, 1] << shifts).sum(2)
    words = x1 | (((x2 << 4) | (x2 >> 28)) & 0xFFFFFFFF)
    codes = _bytes_of_words(words).reshape(n, kp // 2)
    a_words = (lo << shifts[None]).sum(3)  # [n, ng, 2, gw]
    a = _bytes_of_words(a_words).reshape(n, kp)
    rows, cols = escape.nonzero(as_tuple=True)  # row-major order
    counts = torch.bincount(rows, minlength=n) if rows.numel() else torch.zeros(
        n, dtype=torch.int64, device=w.device)
    rowptr = F.pad(counts.cumsum(0), (1, 0)).to(torch.int32)
    esc_bits = w.view(torch.int16)[rows, cols]
    return W12Weight(n, k, a.contiguous(), codes.contiguous(), base.to(torch.uint8), rowptr,
                     rows.to(torch.int32), cols.to(torch.int32), esc_bits.contiguous())


def _words_of_bytes(b: Tensor) -> Tensor:
    """int64 32-bit words [..., W] from little-endian uint8 bytes [..., 4 * W]."""
    b = b.to(torch.int64).unflatten(-1, (-1, 4))
    shifts = torch.arange(0, 32, 8, device=b.device)
    return (b << shifts).sum(-1)


def unpack_fields(w12: W12Weight) -> tuple[Tensor, Tensor]:
    """(H, L) int32 [N, Kp] in column order: the high byte's varying bits and the low byte
    of each decoded w' (0, 0 for escapes and padding)."""
    n, kp, gw = w12.n, w12.kp, w12.gw
    ng = kp // (8 * gw)
    words = _words_of_bytes(w12.codes.reshape(n, ng, 4 * gw))  # [n, ng, gw]
    rot = ((words >> 4) | (words << 28)) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 8, device=w12.device).view(1, 1, 4, 1)
    h = torch.stack([(words[:, :, None] >> shifts) & H_MASK,
                     (rot[:, :, None] >> shifts) & H_MASK], 2)  # [n, ng, 2, 4, gw]
    a_words = _words_of_bytes(w12.a.reshape(n, ng, 2, 4 * gw))  # [n, ng, 2, gw]
    lo = (a_words[:, :, :, None] >> shifts[None]) & 0xFF  # [n, ng, 2, 4, gw]
    return h.reshape(n, kp).to(torch.int32), lo.reshape(n, kp).to(torch.int32)


def unpack_codes(w12: W12Weight) -> Tensor:
    """The 4-bit exponent codes as int32 [N, Kp] (0 for escapes and padding)."""
    h, lo = unpack_fields(w12)
    return ((h & 7) << 1) | (lo >> 7)


def decoded_scaled(w12: W12Weight) -> Tensor:
    """The kernels' w' as fp32 [N, Kp] (escapes and padding: the placeholder 2^-15)."""
    h, lo = unpack_fields(w12)
    bits = ((h | H_CONST) << 24) | (lo << 16)
    return bits.view(torch.float32)


def row_scale(base: Tensor) -> Tensor:
    """2^(base - E0) per row as fp32: w = w' * row_scale."""
    return ((base.to(torch.int32) + 127 - E0) << 23).view(torch.float32)


def unpack(w12: W12Weight) -> Tensor:
    """The exact bf16 matrix [N, K] back."""
    h, lo = unpack_fields(w12)
    code = ((h & 7) << 1) | (lo >> 7)
    exp = code + w12.base.to(torch.int32)[:, None]
    bits = ((h >> 7) << 15) | (exp << 7) | (lo & 0x7F)
    bits = torch.where(bits >= 2**15, bits - 2**16, bits).to(torch.int16)
    if w12.n_escapes:
        bits[w12.esc_row.long(), w12.esc_col.long()] = w12.esc_bits
    return bits.view(torch.bfloat16)[:, : w12.k].contiguous()


def linear(x: Tensor, w12: W12Weight, bias: Tensor | None = None) -> Tensor:
    """y = x @ w.T (+ bias): the torch reference (and CPU path), fp32 accumulation."""
    w = unpack(w12)
    y = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def stats(w: Tensor) -> dict:
    """Exponent coverage, escape rate and bits per weight of a matrix stored as W12."""
    w = w.to(torch.bfloat16)
    w12 = pack(w)
    _, exp, _ = _fields(w)
    finite = int((exp != 255).sum())
    finite_escapes = w12.n_escapes - int((exp == 255).sum())
    distinct = int(torch.unique(exp).numel())
    return {
        "shape": [w12.n, w12.k],
        "escapes": w12.n_escapes,
        "escape_rate": w12.escape_rate,
        "coverage": 1.0 - finite_escapes / max(1, finite),
        "distinct_exponents": distinct,
        "bits_per_weight": w12.bits_per_weight,
        "nbytes": w12.nbytes,
    }
