"""Where the shipped W12 pick's compiled code issues its loads: the SASS instruction stream of
the kernel the tuned table picks for one (shape, batch), compressed into runs of load (L),
tensor-core MMA (M), integer decode (p: LOP3, SHF, PRMT), barrier (|), spill (S, R) and
branch (B) instructions, everything else left out.

    PYTHONPATH=. python3 benchmarks/w12_sass.py [--shape qkv_32B] [--batch 8]

Needs `cuobjdump` (the CUDA toolkit's, else Triton's bundled one). The kernel is compiled by
one call of the pick on random inputs into a fresh Triton cache directory, so the cubin read
is that call's, never one cached earlier.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import re
import shutil
import subprocess
import tempfile

import torch

from benchmarks.w12_bench import ALL_SHAPES
from specpilot.kernels import w12 as fmt
from specpilot.kernels.tuning import load_table
from specpilot.kernels.w12_triton import GLUON, w12_matmul

CLASSES = {"LDG": "L", "HMMA": "M", "LOP3": "p", "SHF": "p", "PRMT": "p", "BAR": "|",
           "STL": "S", "LDL": "R", "BRA": "B"}


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")


def runs(sass: str) -> str:
    """The instruction classes of a SASS listing as runs, e.g. 'M1 p12 M1 L20'."""
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)", sass)
    seq = "".join(CLASSES.get(op, "") for op in ops)
    return " ".join(f"{k}{len(list(g))}" for k, g in itertools.groupby(seq))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qkv_32B", choices=sorted(ALL_SHAPES))
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    n, k = ALL_SHAPES[a.shape]
    cfg = load_table(torch.cuda.get_device_name()).lookup("w12", n, k, a.batch)
    if cfg is None:
        raise SystemExit(f"the tuned table has no W12 entry for {a.shape} at batch {a.batch}")
    cache = tempfile.mkdtemp(prefix="w12_sass_")
    os.environ["TRITON_CACHE_DIR"] = cache  # read by Triton at each compile
    w = fmt.pack(torch.randn(n, k, device="cuda").to(torch.bfloat16))
    w12_matmul(torch.randn(a.batch, k, device="cuda").to(torch.bfloat16), w, cfg)
    torch.cuda.synchronize()
    name = "w12_gluon" if cfg.variant & GLUON else "w12_linear"
    cubins = glob.glob(f"{cache}/*/{name}*.cubin")
    if len(cubins) != 1:
        raise SystemExit(f"expected one {name} cubin under {cache}, found {len(cubins)}")
    sass = subprocess.run([cuobjdump(), "-sass", cubins[0]], capture_output=True, text=True,
                          check=True).stdout
    print(f"{a.shape} batch {a.batch}: {cfg.label} ({os.path.basename(cubins[0])})")
    print(runs(sass))


if __name__ == "__main__":
    main()
