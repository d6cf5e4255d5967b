"""Build an Engine from a checkpoint directory and knobs (the one place drafters are chosen)."""

from __future__ import annotations

from pathlib import Path

import torch

from .drafter import Drafter
from .errors import CheckpointError, SpecPilotError, check_cuda
from .generate import Engine
from .knobs import Knobs
from .loader import load_model, parse_dtype
from .model import Transformer
from .tokenizer import Tokenizer


def load_drafter(spec: str, target: Transformer, knobs: Knobs, device, dtype) -> Drafter:
    """`ngram`, `draft:DIR` or `block:DIR`; the drafter's vocabulary must be the target's."""
    if spec == "ngram":
        from .drafters.ngram import NgramDrafter

        return NgramDrafter(knobs.ngram_max, knobs.ngram_min)
    if spec == "oracle" or spec.startswith("oracle:"):
        from .drafters.oracle import load_oracle

        oracle = load_oracle(spec, target, knobs, device, dtype)
        if oracle.draft_model is not None:  # it models drafting cost: run it as a draft runs
            prepare_draft(oracle.draft_model, knobs)
        return oracle
    kind, _, path = spec.partition(":")
    if not path:
        raise CheckpointError(f"drafter {spec!r} needs a directory: {kind}:DIR")
    if kind == "draft":
        from .drafters.draft_model import DraftModelDrafter

        model = load_model(path, device, dtype)
        prepare_draft(model, knobs)
        if model.cfg.vocab_size != target.cfg.vocab_size:
            raise CheckpointError(
                f"drafter {path} has vocabulary size {model.cfg.vocab_size}, the target "
                f"{target.cfg.vocab_size}: a draft model must share the target's vocabulary"
            )
        return DraftModelDrafter(model)
    if kind == "block":
        from .drafters.block import load_block_drafter

        return load_block_drafter(path, target, device, dtype)
    raise CheckpointError(f"unknown drafter kind {kind!r}: use ngram, draft:DIR or block:DIR")


def prepare_draft(model: Transformer, knobs: Knobs) -> None:
    """A draft model's kernels, as the target's: on CUDA fused projections, the fused
    kernels and the attention knob; the linear backends everywhere (no-ops on a CPU)."""
    if model.device.type == "cuda" and knobs.fused_proj:
        model.fuse_projections(kernels=knobs.fused_kernels)
        apply_attention_knob(model, knobs)
    apply_linear_knobs(model, knobs)


def apply_attention_knob(model: Transformer, knobs: Knobs) -> bool:
    """`attention`: the Triton split-KV kernel for decode/verify steps ("triton"; "auto"
    on a CUDA bf16 model) or SDPA. It applies only to a fused CUDA model with head dim 64
    or 128 (`Transformer.set_attention_kernel`); returns whether it is on."""
    on = knobs.attention == "triton" or (knobs.attention == "auto"
                                         and model.dtype == torch.bfloat16)
    return model.set_attention_kernel(on)


def check_linear_knobs(knobs: Knobs, device: str, dtype: str | torch.dtype) -> None:
    """`weights = "w12"` stores bf16 weights losslessly and runs Triton kernels: anything but
    a CUDA bf16 model is a one-line error (before any weights are loaded)."""
    if knobs.weights == "w12" and (not str(device).startswith("cuda")
                                   or parse_dtype(dtype) != torch.bfloat16):
        raise SpecPilotError(
            f"weights = w12 needs --device cuda --dtype bfloat16 (W12 is lossless 12-bit bf16 "
            f"on the GPU), got {device}/{parse_dtype(dtype)}: use weights = bf16 here")


def step_rows(knobs: Knobs, batch_sizes: int | tuple[int, ...]) -> tuple[int, ...]:
    """Rows a target's linears see per step at each batch size the engine serves: the
    batch (decode) and batch x (k + 1) (verify, with that batch's k)."""
    bs = (batch_sizes,) if isinstance(batch_sizes, int) else batch_sizes
    return tuple(sorted({r for b in bs for r in (b, b * (knobs.k_for(b) + 1))}))


def apply_linear_knobs(model: Transformer, knobs: Knobs, skip: tuple[str, ...] = (),
                       rows: tuple[int, ...] = (1,)) -> None:
    """The linear backends of one model, in place, after `fuse_projections`: W12 layers
    (`weights`, only where W12 wins at every row count in `rows`), then the Triton bf16
    GEMV (`gemv`) on the linears left. What was done is kept on the model (`w12_report`,
    `gemv_report`). A no-op for bf16 + cublas, and `gemv` is a no-op on a CPU or non-bf16
    model."""
    cuda_bf16 = model.device.type == "cuda" and model.dtype == torch.bfloat16
    if knobs.weights == "w12":
        check_linear_knobs(knobs, model.device.type, model.dtype)
        from ..kernels.w12_linear import apply_w12

        model.w12_report = apply_w12(model, skip=skip, rows=rows)
    if knobs.gemv == "auto" and cuda_bf16:
        from ..kernels.gemv_bf16 import apply_gemv

        model.gemv_report = apply_gemv(model)


def build_engine(model_dir: str | Path, knobs: Knobs | None = None, device: str = "cpu",
                 dtype: str = "float32", batch_size: int | tuple[int, ...] = 1
                 ) -> tuple[Engine, Tokenizer]:
    """The engine of `knobs` for `model_dir`; `batch_size`: the batch size (or sizes) it
    will run, which decides where W12 layers pay off (`step_rows`)."""
    knobs = knobs or Knobs()
    sizes = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
    check_cuda(device)
    check_linear_knobs(knobs, device, dtype)
    if knobs.threads and device == "cpu":
        torch.set_num_threads(knobs.threads)
    if str(model_dir).startswith("random:"):  # perf-only: random weights, no tokenizer
        from .random_model import random_transformer

        target, tokenizer = random_transformer(str(model_dir), device, dtype), None
    else:
        target = load_model(model_dir, device, dtype)
        tokenizer = Tokenizer(model_dir)
    if device == "cuda" and knobs.fused_proj:
        target.fuse_projections(kernels=knobs.fused_kernels)
        apply_attention_knob(target, knobs)
    # the block drafter reads the target's lm_head.weight: keep that layer dense for it
    block = (knobs.drafter or "").startswith("block:")
    apply_linear_knobs(target, knobs, skip=("lm_head",) if block else (),
                       rows=step_rows(knobs, sizes))
    if tokenizer is not None and tokenizer.vocab_size > target.cfg.vocab_size:
        raise CheckpointError(
            f"{model_dir}: tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{target.cfg.vocab_size}"
        )
    drafter = None
    if knobs.drafter is not None:
        drafter = load_drafter(knobs.drafter, target, knobs, device, target.dtype)
    engine = Engine(target, drafter, k=knobs.k_for(sizes[0]), cuda_graphs=knobs.cuda_graphs,
                    kv_bucket=knobs.kv_bucket, pdl=knobs.pdl)
    return engine, tokenizer
