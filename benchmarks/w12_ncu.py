"""Hardware counters of chosen W12 / bf16 kernels under Nsight Compute (one launch each).

On a GPU machine with ncu (from the repo root):

    M=$(PYTHONPATH=. python3 benchmarks/w12_ncu.py --metrics)
    PYTHONPATH=. ncu --clock-control none --profile-from-start off --csv --metrics "$M" \
        python3 benchmarks/w12_ncu.py --batch 8 --shapes qkv_32B,gate_up_8B > ncu.csv
    PYTHONPATH=. python3 benchmarks/w12_ncu.py --report ncu.csv

The script compiles every config first (outside the profiled range), then launches each
once inside cudaProfilerStart/Stop; ncu flushes the caches before each profiled launch.
`--list` prints the profiled launches in order (with each one's error against fp32),
`--with-no-escapes` also profiles each W12 config on the same weights with an empty escape
table (`w12_escapes.no_escapes`: what the escape correction costs in each counter), and
`--report` prints one line per profiled kernel: time, DRAM throughput, occupancy,
registers, issue utilization, instructions, L1 traffic, grid and the top stall reasons.
"""

from __future__ import annotations

import argparse
import csv

import torch

from benchmarks.w12_bench import SHAPES
from benchmarks.w12_escapes import no_escapes
from specpilot.kernels import w12 as fmt
from specpilot.kernels.gemv_bf16 import bf16_matmul
from specpilot.kernels.tuning import load_table
from specpilot.kernels.w12_triton import GLUON, KernelConfig, w12_matmul

METRICS = ("gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,"
           "sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,"
           "smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,"
           "l1tex__t_bytes.sum,launch__grid_size,lts__t_bytes.sum,"
           "lts__throughput.avg.pct_of_peak_sustained_elapsed,"
           "l1tex__t_sector_hit_rate.pct,"
           r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
SHORT = {"gpu__time_duration.sum": "ns", "sm__inst_executed.sum": "inst",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
         "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy%",
         "launch__registers_per_thread": "regs", "l1tex__t_bytes.sum": "L1 bytes",
         "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
         "launch__grid_size": "grid", "lts__t_bytes.sum": "L2 bytes",
         "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2%",
         "l1tex__t_sector_hit_rate.pct": "L1 hit%"}
STALL = "smsp__average_warps_issue_stalled_"


def report(path: str) -> None:
    """One line per profiled kernel of an `ncu --csv` file."""
    kernels: dict = {}
    with open(path) as f:
        for row in csv.DictReader(line for line in f if line.startswith('"')):
            key = (int(row["ID"]), row["Kernel Name"][:40])
            kernels.setdefault(key, {})[row["Metric Name"]] = row["Metric Value"]
    for (i, name), m in kernels.items():
        vals = [f"{s}={m[k]}" for k, s in SHORT.items() if k in m]
        stalls = sorted(((k[len(STALL):].split("_per_issue")[0], float(v.replace(",", "")))
                         for k, v in m.items() if k.startswith(STALL)), key=lambda t: -t[1])
        print(f"{i:2d} {name}  " + "  ".join(vals) + "  stalls: " +
              " ".join(f"{k}={v:.2f}" for k, v in stalls[:4]))


def configs(batch: int, n: int, k: int) -> list[tuple[str, KernelConfig | None]]:
    """(label, config) pairs: None = cuBLAS bf16, a label starting "bf16" = SpecPilot's
    Triton bf16 kernel. The shipped H200 table's bf16 and W12 picks (at batch > 1 also three
    fixed W12 tensor-core configs, one of each form)."""
    K = KernelConfig
    table = load_table(torch.cuda.get_device_name())
    if batch == 1:
        return [("cublas", None),
                ("bf16 gemv", table.lookup("bf16", n, k, 1) or K(bn=4, bk=1024, warps=4)),
                ("w12 gemv", table.lookup("w12", n, k, 1) or K(bn=16, bk=512, warps=4))]
    bm = 8 if batch <= 8 else 16
    picks = [(f"{kind} pick", c) for kind in ("bf16", "w12")
             if (c := table.lookup(kind, n, k, batch)) is not None]
    return [("cublas", None), *picks,
            ("w12 dot5", K(bm=16, bn=32, bk=512, split_k=1, warps=4, stages=2, dot=True,
                           variant=5)),
            ("w12 gluon d1", K(bm=bm, bn=64, bk=256, split_k=2, warps=4, stages=1, dot=True,
                               variant=GLUON)),
            ("w12 gluon d2", K(bm=bm, bn=32, bk=256, split_k=1, warps=2, stages=2, dot=True,
                               variant=GLUON))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--shapes", default="qkv_32B,gate_up_8B")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--with-no-escapes", action="store_true",
                    help="each W12 config also on the same weights with an empty escape table")
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu")
    ap.add_argument("--report", metavar="CSV", help="summarize an ncu --csv file")
    a = ap.parse_args()
    if a.metrics:
        print(METRICS)
        return
    if a.report:
        report(a.report)
        return
    runs = []
    for s in a.shapes.split(","):
        n, k = SHAPES[s]
        g = torch.Generator(device="cuda").manual_seed(0)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        w12 = fmt.pack(w)
        x = torch.randn(a.batch, k, device="cuda", generator=g).to(torch.bfloat16)
        ref = x.float() @ w.float().T
        forms = [("", w12, ref)]
        if a.with_no_escapes:
            empty = no_escapes(w12)
            forms.append((" no-esc", empty, x.float() @ fmt.unpack(empty).float().T))
        for label, c in configs(a.batch, n, k):
            is_bf16 = label.startswith("bf16")
            for tag, packed, want in forms if label.startswith("w12") else forms[:1]:
                def f(c=c, w=w, w12=packed, x=x, bf=is_bf16):
                    if c is None:
                        return torch.mm(x, w.T)
                    return bf16_matmul(x, w, c) if bf else w12_matmul(x, w12, c)
                err = ((f().float() - want).norm() / want.norm()).item()  # compiles outside range
                runs.append((f"{s} b{a.batch} {label}{tag}", f, err))
    torch.cuda.synchronize()
    if a.list:
        for name, _, err in runs:
            print(f"{name}\trel_err={err:.2e}")
        return
    torch.cuda.cudart().cudaProfilerStart()
    for _, f, _ in runs:
        f()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
