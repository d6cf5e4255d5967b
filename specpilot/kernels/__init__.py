"""Triton kernels (W12 lossless 12-bit weights, bf16 skinny GEMM) with torch references."""
