"""Measured ceilings that ship with the project (`--ceilings reference`).

H200: `specpilot costmodel calibrate` on this project's lent H200 on 2026-11-29 (torch 2.11 +
CUDA 13, benchmarks/costmodel_validate.py): device copy 4.27 TB/s (read + write),
an 8192^3 bf16 GEMM at 713 TFLOP/s, cuBLAS bf16 `F.linear` weight
bandwidth at batch 1-32 back to back in a CUDA graph over rotating weights, launch
10.1 us/kernel, step round trip 17.9 us. Read-only streaming
is the Triton reduction's 4.57 TB/s (shared/measurements/h200-gemv.json, same day), which
beats torch's sum (4.26 TB/s).
"""

from __future__ import annotations

from .hardware import Ceilings

_BATCHES = (1, 2, 4, 8, 16, 32)
# weight bytes of the matrix -> TB/s of weight bytes at each batch in _BATCHES
_H200_SKINNY_TBPS = {
    33554432: (2.632, 2.503, 2.49, 2.5, 2.465, 2.393),  # o_proj 8B  [4096, 4096]
    50331648: (3.155, 3.022, 3.033, 3.096, 3.049, 2.996),  # qkv 8B     [6144, 4096]
    100663296: (3.321, 3.264, 3.242, 3.238, 3.432, 3.325),  # down 8B    [4096, 12288]
    201326592: (4.012, 4.014, 3.994, 3.586, 3.932, 3.897),  # gate_up 8B [24576, 4096]
    262144000: (3.558, 3.534, 3.519, 3.417, 3.82, 3.761),  # down 32B   [5120, 25600]
    524288000: (3.918, 3.907, 3.897, 3.885, 3.846, 3.799),  # gate_up 32B [51200, 5120]
    1244659712: (4.177, 4.17, 4.152, 4.13, 4.106, 4.058),  # lm_head    [151936, 4096]
}

REFERENCE: dict[str, Ceilings] = {
    "h200": Ceilings(
        device="h200", device_name="NVIDIA H200", measured_at="2026-11-29",
        copy_bw=4.267e12, read_bw=4.567e12, gemm_flops={"bf16": 713e12},
        skinny=[[float(size), float(b), tb * 1e12]
                for size, row in _H200_SKINNY_TBPS.items() for b, tb in zip(_BATCHES, row)],
        launch_s=10.1e-6, step_overhead_s=17.9e-6,
        source="specpilot costmodel calibrate on the lent H200 (benchmarks/costmodel_validate.py)"),
}
