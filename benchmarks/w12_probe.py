"""Where the W12 tensor-core path's time goes, on one GPU: the sliced kernel as shipped, and
the same kernel with one part replaced by a trivial stand-in.

    PYTHONPATH=. python3 benchmarks/w12_probe.py [--shapes qkv_32B,down_8B] [--batch 16]
        [--probes shipped,no-decode,one-x,both]

Probes (each in a fresh process: Triton builds a kernel's helpers once per process):
  shipped    the kernel as the engine runs it
  no-decode  the 8 decoded tiles replaced by one bitcast of (codes ^ A0 ^ A1): same loads,
             no byte permutes, no repacking into MMA operands
  one-x      every dot of a step takes the first x slice: 1 x load per step instead of 8
  both       no-decode and one-x
The stand-ins give wrong products on purpose: only time is measured here (the kernel as
shipped is checked by w12_bench.py and the GPU tests). Timing as in w12_bench.py: CUDA
graphs over weight copies rotated past the L2, medians; the Triton bf16 kernel of the
shipped table and cuBLAS are timed in the same process as the shipped probe.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import triton
import triton.language as tl

from specpilot.kernels import w12_triton as wt

PROBES = ("shipped", "no-decode", "one-x", "both")
K = wt.KernelConfig
CONFIGS = (K(bm=16, bn=32, bk=512, split_k=1, warps=4, stages=3, dot=True, variant=5),
           K(bm=16, bn=64, bk=256, split_k=2, warps=4, stages=3, dot=True, variant=5),
           K(bm=32, bn=64, bk=512, split_k=2, warps=4, stages=3, dot=True, variant=7))


def _patch(probe: str) -> None:
    if probe in ("no-decode", "both"):
        @triton.jit
        def raw(c, a0, a1, USE_ASM: tl.constexpr):
            v = (c ^ a0 ^ a1).to(tl.int16).to(tl.bfloat16, bitcast=True)
            return v, v, v, v, v, v, v, v

        wt._decode_bf16 = raw
    if probe in ("one-x", "both"):
        @triton.jit
        def one_x(acc, w0, w1, w2, w3, w4, w5, w6, w7, xp, xm2, colb, jx, K, GW: tl.constexpr,
                  EVEN: tl.constexpr, F32_DOT: tl.constexpr, SWAP: tl.constexpr):
            acc = wt._dot1(acc, w0, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            acc = wt._dot1(acc, w1, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            acc = wt._dot1(acc, w2, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            acc = wt._dot1(acc, w3, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            acc = wt._dot1(acc, w4, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            acc = wt._dot1(acc, w5, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            acc = wt._dot1(acc, w6, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            acc = wt._dot1(acc, w7, xp, xm2, colb, jx, K, EVEN, F32_DOT, SWAP)
            return acc

        wt._dot8 = one_x


def child(probe: str, shape: str, batch: int) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, "benchmarks")
    from w12_bench import SHAPES, bf16_copies, w12_copies

    _patch(probe)
    from specpilot.kernels.gemv_bf16 import bf16_matmul
    from specpilot.kernels.tuning import graph_timer, load_table

    n, k = SHAPES[shape]
    w, p, ws = w12_copies(shape)
    rot = len(ws)
    x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
    y = torch.empty(batch, n, device="cuda", dtype=torch.bfloat16)
    it = {"i": 0}

    def nxt(seq):
        it["i"] = (it["i"] + 1) % len(seq)
        return seq[it["i"]]

    out = {"probe": probe, "shape": shape, "batch": batch, "w12_bytes": p.nbytes}
    for cfg in CONFIGS:
        if (cfg.bm == 32) != (batch > 16):
            continue
        t = graph_timer(lambda c=cfg: wt.w12_matmul(x, nxt(ws), c, out=y), rot)
        out[cfg.label] = statistics.median(t)
    out["ptx"] = ptx_widths()
    if probe == "shipped":
        wb = bf16_copies(w, rot)
        out["cublas"] = statistics.median(graph_timer(lambda: F.linear(x, nxt(wb)), rot))
        hit = load_table(torch.cuda.get_device_name()).lookup("bf16", n, k, batch)
        if hit is not None:
            out["triton_bf16"] = statistics.median(
                graph_timer(lambda: bf16_matmul(x, nxt(wb), hit, out=y), rot))
    return out


def ptx_widths() -> list[dict]:
    """Per compiled W12 kernel of this process: its block sizes, shared memory, and how many
    async copies and global loads of each width its PTX issues (16-byte vectors wanted)."""
    import re
    from collections import Counter

    from w12_bench import compiled_w12_kernels

    rows = []
    for consts, kern in compiled_w12_kernels():
        ptx = kern.asm["ptx"]
        rows.append({
            "bn": consts.get("BN"), "gs": consts.get("GS"), "swap": consts.get("SWAP"),
            "shared": kern.metadata.shared, "regs": getattr(kern, "n_regs", None),
            "cp_async_bytes": dict(Counter(re.findall(
                r"cp\.async\.c[ag]\.shared\.global[^,]*, \[[^\]]*\], (0x\w+)", ptx))),
            "ld_global": dict(Counter(re.findall(r"ld\.global[\w:.]*", ptx)))})
    return rows


def run_child(script: str, args: list[str], what: str) -> dict | None:
    """One probe in a fresh process (`script` with `args`): its RESULT line as a dict, also
    printed; None, with the child's stderr printed, when it gave none."""
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          check=False)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not line:
        print(f"{what}: failed\n{proc.stderr[-2000:]}", flush=True)
        return None
    row = json.loads(line[0][7:])
    print(json.dumps(row), flush=True)
    return row


def parse_or_run_child(ap: argparse.ArgumentParser, probes, child) -> argparse.Namespace | None:
    """Add --probes (default: every one of `probes`) and --child PROBE SHAPE to `ap` and
    parse; with --child, run `child(probe, shape)` here, print its RESULT line and return
    None (the parent, `run_child`, reads it)."""
    ap.add_argument("--probes", default=",".join(probes))
    ap.add_argument("--child", nargs=2, metavar=("PROBE", "SHAPE"))
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(*a.child)), flush=True)
        return None
    return a


def names_in(names: str, known, what: str) -> list[str]:
    """A comma-separated list of names, each checked against `known` (a one-line exit
    naming the first unknown one)."""
    out = names.split(",")
    bad = [n for n in out if n not in known]
    if bad:
        raise SystemExit(f"unknown {what} {bad[0]!r}: pick from {', '.join(known)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qkv_32B,down_8B")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--probes", default=",".join(PROBES))
    ap.add_argument("--child", nargs=2, metavar=("PROBE", "SHAPE"))
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child[0], a.child[1], a.batch)), flush=True)
        return
    probes = names_in(a.probes, PROBES, "probe")
    rows = []
    for shape in a.shapes.split(","):
        for probe in probes:
            row = run_child(__file__, ["--batch", str(a.batch), "--child", probe, shape],
                            f"{shape} {probe}")
            if row:
                rows.append(row)
    labels = [c.label for c in CONFIGS]
    print(f"\n{'shape':10} {'batch':>5} {'probe':10} " + " ".join(f"{c:>24}" for c in labels))
    for r in rows:
        cells = []
        for c in labels:
            us = r.get(c)
            cells.append(f"{us:8.1f} us {r['w12_bytes'] / us / 1e6:5.2f} TB/s" if us else
                         f"{'-':>24}")
        extra = "".join(f"  {kk} {r[kk]:.1f} us" for kk in ("cublas", "triton_bf16") if kk in r)
        print(f"{r['shape']:10} {r['batch']:5} {r['probe']:10} " + " ".join(cells) + extra)


if __name__ == "__main__":
    main()
