"""Knobs: every runtime setting the search may turn, as one frozen dataclass.

A knob set is plain data (engine.toml stores it); `Knobs.from_dict` rejects unknown names
and bad values with a one-line error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from .errors import SpecPilotError


@dataclass(frozen=True)
class Knobs:
    drafter: str | None = None  # None (AR) | "ngram" | "draft:DIR" | "block:DIR" | "oracle[:ARGS]"
    k: int = 4  # drafted tokens per verify step
    k_per_batch: dict[int, int] = field(default_factory=dict)  # batch size -> k override
    ngram_max: int = 3
    ngram_min: int = 1
    threads: int = 0  # torch CPU threads; 0 = leave torch's default
    weights: str = "bf16"  # "bf16" | "w12": W12 where the tuned table says it wins (CUDA + bf16)
    gemv: str = "auto"  # "auto": Triton bf16 GEMV where the tuned table beats cuBLAS | "cublas"
    cuda_graphs: bool = True  # replay each decode/verify step from a CUDA graph (CUDA only)
    fused_proj: bool = True  # one qkv and one gate_up GEMM per layer (CUDA only; copies weights)
    fused_kernels: bool = True  # Triton norm/RoPE/cache-write/silu kernels (CUDA, fused_proj)
    kv_bucket: int = 256  # attend to the cache prefix rounded up to this (CUDA); 0 = all of it
    # decode/verify attention: "triton" (split-KV kernel; CUDA, fused_proj, head dim 64/128)
    # | "sdpa" | "auto" (triton on CUDA bf16, sdpa elsewhere)
    attention: str = "auto"
    pdl: bool = True  # programmatic dependent launch of the steps' Triton kernels (CUDA sm90+)

    def k_for(self, batch_size: int) -> int:
        if self.drafter is None:
            return 0
        return self.k_per_batch.get(batch_size, self.k)

    def effective(self) -> Knobs:
        """These knobs with every one that cannot change what the engine does set back to
        its default: the n-gram sizes unless the drafter is the n-gram one, k and its
        per-batch overrides without a drafter, a per-batch k equal to k. Two knob sets with
        the same effective knobs run the same engine (the engine hash is over these)."""
        default = Knobs()
        change = {}
        if self.drafter != "ngram":
            change |= {"ngram_min": default.ngram_min, "ngram_max": default.ngram_max}
        if self.drafter is None:
            change |= {"k": default.k, "k_per_batch": {}}
        else:
            change["k_per_batch"] = {b: k for b, k in self.k_per_batch.items() if k != self.k}
        return replace(self, **change)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["k_per_batch"] = {str(b): v for b, v in self.k_per_batch.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Knobs:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpecPilotError(f"unknown knob(s) {unknown}: known knobs are {sorted(names)}")
        d = dict(d)
        if "drafter" in d and d["drafter"] in ("", "none", "ar"):
            d["drafter"] = None
        if "k_per_batch" in d:
            kpb = d["k_per_batch"]
            try:
                d["k_per_batch"] = {int(b): int(v) for b, v in kpb.items()}
            except (AttributeError, TypeError, ValueError):
                raise SpecPilotError(f"k_per_batch must map batch sizes to integer k, "
                                     f"got {kpb!r}") from None
        knobs = cls(**d)
        knobs.validate()
        return knobs

    def with_(self, **changes) -> Knobs:
        return Knobs.from_dict({**self.to_dict(), **changes})

    def validate(self) -> None:
        for f in fields(self):  # types first: engine.toml and JSON carry any value
            v, want = getattr(self, f.name), _KINDS.get(f.name)
            if want and not (isinstance(v, want) and not (want is int and isinstance(v, bool))):
                raise SpecPilotError(f"knob {f.name} must be {_KIND_NAMES[want]}, got {v!r}")
        if self.drafter is not None and not isinstance(self.drafter, str):
            raise SpecPilotError(f"knob drafter must be a string or none, got {self.drafter!r}")
        named = {"k": self.k} | {f"k_per_batch[{b}]": k for b, k in self.k_per_batch.items()}
        for name, k in named.items():
            if type(k) is not int or not 1 <= k <= 32:
                raise SpecPilotError(f"knob {name} must be an integer in 1..32, got {k!r}")
        if not 1 <= self.ngram_min <= self.ngram_max <= 8:
            raise SpecPilotError("ngram knobs need 1 <= ngram_min <= ngram_max <= 8")
        if self.threads < 0:
            raise SpecPilotError("threads must be >= 0")
        if self.weights not in ("bf16", "w12"):
            raise SpecPilotError(f"weights must be bf16 or w12, got {self.weights!r}")
        if self.gemv not in ("cublas", "auto"):
            raise SpecPilotError(f"gemv must be cublas or auto, got {self.gemv!r}")
        if self.kv_bucket < 0 or self.kv_bucket % 16:
            raise SpecPilotError(f"kv_bucket must be 0 or a positive multiple of 16, "
                                 f"got {self.kv_bucket}")
        if self.attention not in ("auto", "sdpa", "triton"):
            raise SpecPilotError(f"attention must be auto, sdpa or triton, "
                                 f"got {self.attention!r}")
        if self.drafter is not None and not (
            self.drafter in ("ngram", "oracle")
            or self.drafter.split(":", 1)[0] in ("draft", "block", "oracle")
        ):
            raise SpecPilotError(
                f"bad drafter {self.drafter!r}: use ngram, draft:DIR, block:DIR or oracle[:ARGS]"
            )


_KINDS = {f: int for f in ("k", "ngram_max", "ngram_min", "threads", "kv_bucket")} | {
    f: str for f in ("weights", "gemv", "attention")} | {
    f: bool for f in ("cuda_graphs", "fused_proj", "fused_kernels", "pdl")}
_KIND_NAMES = {int: "an integer", str: "a string", bool: "true or false"}

__all__ = ["Knobs", "replace"]
