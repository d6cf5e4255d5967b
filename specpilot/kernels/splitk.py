"""Split-K in one launch: partial sums go to a workspace, the last program of a tile reduces.

Each program of a split-K tile stores its fp32 partial tile to `ws`, then bumps the tile's
counter in `cnt` with an acq_rel atomic; the program that sees SPLIT_K - 1 sums the
partials, finishes the tile (epilogue, store) and resets the counter to 0, so the counters
are zero again after every call and no memset launch is needed (CUDA-graph friendly).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_WORKSPACES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
# Outgrown workspaces are kept alive, never freed: a CUDA graph captured earlier holds their
# addresses, and memory handed back to the allocator could be reused under a replay.
_RETIRED: list[torch.Tensor] = []


def workspace(device: torch.device, n_partial: int,
              n_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partials of at least n_partial elements, int32 zeroed counters >= n_tiles)."""
    ws, cnt = _WORKSPACES.get(device, (None, None))
    if ws is None or ws.numel() < n_partial:
        if ws is not None:
            _RETIRED.append(ws)
        ws = torch.empty(max(n_partial, 1 << 16), dtype=torch.float32, device=device)
    if cnt is None or cnt.numel() < n_tiles:
        if cnt is not None:
            _RETIRED.append(cnt)
        cnt = torch.zeros(max(n_tiles, 1 << 12), dtype=torch.int32, device=device)
    _WORKSPACES[device] = (ws, cnt)
    return ws, cnt


@triton.jit
def store_partial_and_count(acc, ws_ptr, cnt_ptr, tile, pid_k, BM: tl.constexpr,
                            BN: tl.constexpr):
    """Store this split's partial tile; return True in the program that must finish the tile."""
    loc = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(ws_ptr + (tile * tl.num_programs(1) + pid_k) * BM * BN + loc, acc)
    tl.debug_barrier()
    done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
    return done == tl.num_programs(1) - 1


@triton.jit
def reduce_partials(ws_ptr, cnt_ptr, tile, BM: tl.constexpr, BN: tl.constexpr):
    """Sum the SPLIT_K partial tiles of `tile` and reset its counter."""
    loc = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for s in range(tl.num_programs(1)):
        acc += tl.load(ws_ptr + (tile * tl.num_programs(1) + s) * BM * BN + loc,
                       cache_modifier=".cg")
    tl.atomic_xchg(cnt_ptr + tile, 0)
    return acc


def k_per_split(kp: int, bk: int, split_k: int) -> int:
    """Columns each split handles (a multiple of bk)."""
    return triton.cdiv(triton.cdiv(kp, bk), split_k) * bk
