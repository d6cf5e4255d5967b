"""Triton kernels (W12 lossless 12-bit weights, bf16 skinny GEMM) with torch references."""

import os


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, the tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
