"""W12: a lossless 12-bit storage format for bf16 weight matrices, and its torch reference.

A bf16 weight is sign (1 bit), exponent (8) and mantissa (7). W12 keeps, per weight:

- plane A (`a`, uint8 [N, Kp]): ``sign << 7 | mantissa``;
- plane B (`codes`, uint8 [N, Kp / 2]): a 4-bit exponent code per weight, two per byte:
  in each group of 128 columns, byte ``64g + j`` holds the code of column ``128g + j`` in
  its low nibble and of column ``128g + 64 + j`` in its high nibble. With this pairing a
  kernel tile of plane A, plane B and x has one shape and one register layout, so the
  decode needs no data exchange between threads.

Code 0 means exponent field 0 (so +-0 and subnormals decode exactly, with no table); code
``c`` in 1..15 means exponent ``base[row] + c``, where ``base`` (uint8 [N]) is chosen per
row to cover as many weights as possible. Weights outside the row's window, infinities
and NaNs are *escapes*: stored as code 0 with byte 0 (they decode to +0) and kept exactly
in a side table sorted by row (``esc_row``, ``esc_col``, ``esc_bits`` = raw bf16 bits,
``esc_rowptr`` = CSR offsets per row) that the kernels add back in their epilogue.

K is padded to a multiple of `K_ALIGN` (128) with zeros; `nbytes` counts every stored byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

K_ALIGN = 128  # K is padded to this (one code-pairing group; real shapes are multiples)
GROUP = 128
WINDOW = 15  # exponent codes 1..15


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
    def n_escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def escape_rate(self) -> float:
        return self.n_escapes / max(1, self.n * self.k)

    @property
    def device(self) -> torch.device:
        return self.a.device

    def tensors(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in TENSOR_FIELDS}

    @property
    def nbytes(self) -> int:
        """Every byte stored: both planes, row bases and the whole escape table."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / max(1, self.n * self.k)

    def to(self, device: torch.device | str) -> "W12Weight":
        return W12Weight(self.n, self.k, **{n: t.to(device) for n, t in self.tensors().items()})


TENSOR_FIELDS = ("a", "codes", "base", "esc_rowptr", "esc_row", "esc_col", "esc_bits")


def _fields(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(sign, exponent, mantissa) of a bf16 tensor as int32 tensors."""
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F


def best_base(exp: Tensor) -> Tensor:
    """Per row, the base b (0..239) whose window b+1..b+15 holds the most finite exponents."""
    n = exp.shape[0]
    hist = torch.zeros(n, 256, dtype=torch.int32, device=exp.device)
    hist.scatter_add_(1, exp.to(torch.int64), torch.ones_like(exp, dtype=torch.int32))
    hist[:, 0] = 0  # zeros/subnormals take code 0, inf/NaN always escape
    hist[:, 255] = 0
    cum = F.pad(hist.cumsum(1), (1, 0))  # cum[:, j] = count of exponents < j
    starts = torch.arange(0, 256 - WINDOW - 1, device=exp.device)  # b = 0..239
    covered = cum[:, starts + WINDOW + 1] - cum[:, starts + 1]
    return covered.argmax(1).to(torch.int32)


def pack(w: Tensor) -> W12Weight:
    """Store a bf16 matrix [N, K] in W12 form, on w's device; bit-exact for every value."""
    if w.dtype != torch.bfloat16 or w.dim() != 2:
        raise ValueError(f"pack expects a 2-D bfloat16 tensor, got {w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    kp = -(-k // K_ALIGN) * K_ALIGN
    if kp != k:
        w = F.pad(w, (0, kp - k))
    sign, exp, mant = _fields(w)
    base = best_base(exp)
    code = exp - base[:, None]
    in_window = (code >= 1) & (code <= WINDOW) & (exp != 255)
    escape = ~in_window & (exp != 0)
    code = torch.where(in_window, code, 0)
    a = torch.where(escape, 0, (sign << 7) | mant).to(torch.uint8)
    pairs = code.view(n, kp // GROUP, 2, GROUP // 2)
    words = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).to(torch.uint8).reshape(n, kp // 2)
    rows, cols = escape.nonzero(as_tuple=True)  # row-major order
    counts = torch.bincount(rows, minlength=n) if rows.numel() else torch.zeros(
        n, dtype=torch.int64, device=w.device)
    rowptr = F.pad(counts.cumsum(0), (1, 0)).to(torch.int32)
    esc_bits = w.view(torch.int16)[rows, cols]
    return W12Weight(n, k, a.contiguous(), words.contiguous(), base.to(torch.uint8), rowptr,
                     rows.to(torch.int32), cols.to(torch.int32), esc_bits.contiguous())


def decode_bits(a: Tensor, code: Tensor, base: Tensor) -> Tensor:
    """int32 bf16 bit patterns from plane-A bytes, 4-bit codes and row bases (broadcast)."""
    a = a.to(torch.int32)
    exp = torch.where(code == 0, 0, code + base.to(torch.int32))
    return ((a & 0x80) << 8) | (exp << 7) | (a & 0x7F)


def unpack_codes(w12: W12Weight) -> Tensor:
    """The 4-bit codes as int32 [N, Kp]."""
    b = w12.codes.to(torch.int32).view(w12.n, w12.kp // GROUP, 1, GROUP // 2)
    shifts = torch.tensor([0, 4], device=w12.device, dtype=torch.int32).view(1, 1, 2, 1)
    return ((b >> shifts) & 0xF).reshape(w12.n, w12.kp)


def unpack(w12: W12Weight) -> Tensor:
    """The exact bf16 matrix [N, K] back."""
    bits = decode_bits(w12.a, unpack_codes(w12), w12.base[:, None])
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
    w12 = pack(w.to(torch.bfloat16))
    _, exp, _ = _fields(w.to(torch.bfloat16))
    finite_nonzero = int(((exp != 0) & (exp != 255)).sum())
    finite_escapes = w12.n_escapes - int((exp == 255).sum())
    distinct = int(torch.unique(exp).numel())
    return {
        "shape": [w12.n, w12.k],
        "escapes": w12.n_escapes,
        "escape_rate": w12.escape_rate,
        "coverage": 1.0 - finite_escapes / max(1, finite_nonzero),
        "distinct_exponents": distinct,
        "bits_per_weight": w12.bits_per_weight,
        "nbytes": w12.nbytes,
    }
