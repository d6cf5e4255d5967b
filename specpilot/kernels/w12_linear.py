"""`W12Linear`, a drop-in for a bf16 `nn.Linear` with W12 weights, and `apply_w12` that
swaps the eligible linears of a model in place.

On CUDA with bf16 activations a call runs the fused Triton kernel for up to 32 rows
(config from the device's tuned table: the shape's own entry, else that of the nearest tuned
shape, `nearest_shape`, else a default) and unpack + cuBLAS above that; no
host sync and only the output allocated per call, so decode steps can be CUDA-graph captured;
elsewhere it runs the torch reference. Results match `F.linear` up to accumulation order:
the weights are bit-identical.

`apply_w12` skips a layer whose predicted gain is below `min_gain`: measured times from
the tuned table when it has both kernels for the shape (or for the nearest tuned shape),
else a byte model in which every escape costs `ESCAPE_PENALTY_BITS` (escapes are patched one
by one in the epilogue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import w12 as fmt
from .tuning import TunedTable, bucket

ESCAPE_PENALTY_BITS = 4096.0
HEAVY_ESCAPES = 1e-3  # escape rate above which measured gains are discounted


def nearest_shape(table: TunedTable, n: int, k: int, m: int) -> tuple[int, int] | None:
    """(N, K) of the table's W12-tuned shape nearest to (n, k) at m's batch bucket, by
    |ln(n / N)| + |ln(k / K)|, among shapes whose column groups are as wide as this one's
    (so its configs' K steps fit here); None if there is none. Its config stands in for an
    untuned shape's: on the H200, 1.21x faster than the default config (geomean over four
    shapes x six batches, each shape left out of the table in turn) and within 1.05x of the
    shape's own tuned entry (docs/BENCHMARKS.md, twelfth W12 run)."""
    b = bucket(m)
    if b is None:
        return None
    gw = fmt.group_words(fmt.padded(k))
    best = None
    for key in sorted(table.entries):
        kernel, shape, bb = key.split(":")
        if kernel != "w12" or bb != f"b{b}":
            continue
        n2, k2 = map(int, shape.split("x"))
        if fmt.group_words(fmt.padded(k2)) != gw:
            continue
        d = abs(math.log(n / n2)) + abs(math.log(k / k2))
        if best is None or d < best[0]:
            best = (d, n2, k2)
    return None if best is None else (best[1], best[2])


def _default_config(n: int, k: int, m: int):
    from .w12_triton import w12_default_config

    return w12_default_config(n, k, m)


class W12Linear(nn.Module):
    """y = x @ w.T (+ bias) with w stored in W12 form (buffers, so `.to()` moves them)."""

    def __init__(self, weight: fmt.W12Weight, bias: Tensor | None = None,
                 table: TunedTable | None = None):
        super().__init__()
        self.in_features, self.out_features = weight.k, weight.n
        for name, t in weight.tensors().items():
            self.register_buffer(name, t)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        # empty stand-in so code asking `module.weight.dtype/.device` keeps working
        self.register_buffer("weight", torch.empty(0, dtype=torch.bfloat16, device=weight.device),
                             persistent=False)
        self.table = table
        self._cfgs: dict = {}  # batch bucket -> KernelConfig

    @classmethod
    def from_linear(cls, linear: nn.Linear, table: TunedTable | None = None) -> W12Linear:
        w = linear.weight.detach()
        if w.dtype != torch.bfloat16:
            raise ValueError(f"W12 stores bf16 weights; this layer is {w.dtype}")
        return cls(fmt.pack(w), linear.bias, table)

    def _config(self, b: int):
        """The kernel config of batch bucket b (looked up once per bucket, then cached)."""
        if b not in self._cfgs:
            n, k = self.out_features, self.in_features
            cfg = self.table.lookup("w12", n, k, b) if self.table else None
            if cfg is None and self.table:
                near = nearest_shape(self.table, n, k, b)
                cfg = self.table.lookup("w12", *near, b) if near else None
            self._cfgs[b] = cfg or _default_config(n, k, b)
        return self._cfgs[b]

    @property
    def w12(self) -> fmt.W12Weight:
        return fmt.W12Weight(self.out_features, self.in_features,
                             **{n: getattr(self, n) for n in fmt.TENSOR_FIELDS})

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        m = x2.shape[0]
        w = self.w12
        if x.is_cuda and x.dtype == torch.bfloat16 and m > 0:
            b = bucket(m)
            if b is not None:
                from .w12_triton import w12_matmul

                y = w12_matmul(x2, w, self._config(b))
            else:
                from .w12_triton import w12_unpack

                y = F.linear(x2, w12_unpack(w))
        else:
            y = fmt.linear(x2, w)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        w = self.w12
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits_per_weight={w.bits_per_weight:.3f}, escapes={w.n_escapes}")


@dataclass
class LayerDecision:
    name: str
    n: int
    k: int
    bits_per_weight: float
    escape_rate: float
    predicted_gain: float
    applied: bool


@dataclass
class W12Report:
    """What `apply_w12` did, per layer, and the weight bytes before/after."""

    layers: list[LayerDecision] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def applied(self) -> int:
        return sum(d.applied for d in self.layers)


def _measured_ratio(table: TunedTable, n: int, k: int, m: int) -> float | None:
    t_w12 = table.median_us("w12", n, k, m)
    t_bf16 = [t for t in (table.median_us("bf16", n, k, m), table.median_us("cublas", n, k, m))
              if t]
    return min(t_bf16) / t_w12 if t_w12 and t_bf16 else None


def _byte_model(w: fmt.W12Weight) -> float:
    return 16.0 / (w.bits_per_weight + w.escape_rate * ESCAPE_PENALTY_BITS)


def predicted_gain(w: fmt.W12Weight, table: TunedTable | None = None, m: int = 1) -> float:
    """bf16 time / W12 time for this layer at batch m: measured when the table has this
    shape; else measured on the nearest tuned shape (`nearest_shape`, whose config the layer
    then runs); else the median measured ratio of the table's other shapes at that batch
    bucket; else the byte model (escape penalty included). Measured ratios come from
    LLM-like weights (~1e-4 escapes): a layer escaping more than `HEAVY_ESCAPES` (zero
    rows, pruning) gets them scaled down by its byte model against a typical layer's.
    Above the skinny kernels' buckets `W12Linear` unpacks to bf16 and calls cuBLAS: that
    reads the 12-bit form, writes and reads 16 bits more per weight."""
    if bucket(m) is None:
        return 16.0 / (w.bits_per_weight + 32.0)
    if table is not None:
        ratio = _measured_ratio(table, w.n, w.k, m)
        near = nearest_shape(table, w.n, w.k, m) if ratio is None else None
        if near is not None:
            ratio = _measured_ratio(table, *near, m)
        if ratio is None:
            b = bucket(m)
            ratios = sorted(r for key in table.entries if key.startswith("w12:")
                            and key.endswith(f":b{b}")
                            for r in [_measured_ratio(table, *map(int, key.split(":")[1]
                                                                  .split("x")), m)]
                            if r is not None)
            ratio = ratios[len(ratios) // 2] if ratios else None
        if ratio is not None:
            if w.escape_rate > HEAVY_ESCAPES:
                ratio *= min(1.0, _byte_model(w) / (16.0 / (12.02 + 1e-4 * ESCAPE_PENALTY_BITS)))
            return ratio
    return _byte_model(w)


def _shared_weights(model: nn.Module) -> set[int]:
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {i for i, c in seen.items() if c > 1}


def _device_table(model: nn.Module) -> TunedTable | None:
    """The tuned table of the GPU the model sits on (None on CPU)."""
    p = next(model.parameters(), None)
    if p is None or not p.is_cuda:
        return None
    from .tuning import load_table

    return load_table(torch.cuda.get_device_name(p.device))


def apply_w12(model: nn.Module, min_gain: float = 1.05, table: TunedTable | None = None,
              skip: tuple[str, ...] = (), rows: tuple[int, ...] = (1,)) -> W12Report:
    """Replace every eligible bf16 `nn.Linear` of `model` by a `W12Linear`, in place.

    Skipped: non-bf16 layers, weights shared with another module (tied embeddings), names
    containing one of `skip`, and layers whose predicted gain is below `min_gain` at any
    of the row counts the engine's steps put through them (`rows`: batch for a decode
    step, batch x (k + 1) for a verify step; on a GPU the device's tuned table,
    `tuning.load_table`, supplies measured gains)."""
    report = W12Report()
    if table is None:
        table = _device_table(model)
    shared = _shared_weights(model)
    # names only: a bf16 layer is freed as soon as its W12 form replaces it (holding every
    # layer until the end needs the bf16 and the W12 model at once: 114 GB at 32B-class)
    targets = [name for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and mod.weight.dtype == torch.bfloat16
               and id(mod.weight) not in shared and not any(s in name for s in skip)]
    for name in targets:
        lin = model.get_submodule(name)
        packed = fmt.pack(lin.weight.detach())
        gain = min(predicted_gain(packed, table, m) for m in rows)
        ok = gain >= min_gain
        report.layers.append(LayerDecision(name, packed.n, packed.k, packed.bits_per_weight,
                                           packed.escape_rate, gain, ok))
        report.bytes_before += lin.weight.numel() * 2
        report.bytes_after += packed.nbytes if ok else lin.weight.numel() * 2
        if ok:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attr, W12Linear(packed, lin.bias, table))
    return report
