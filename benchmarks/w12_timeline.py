"""When each program of a batch-1 kernel runs, on one GPU: its start and end (%globaltimer,
ns) and its SM, for three kernels on one shape, each launched as `w12_bench.py` times it
(CUDA graph over weight copies rotated past the L2):

  w12    the shipped table's W12 GEMV pick
  bf16   the shipped table's Triton bf16 GEMV pick (the best bf16 kernel at batch 1 here)
  read   a plain read of the W12 weight's bytes (`stream_read.py`'s kernel, its best config)

    PYTHONPATH=. python3 benchmarks/w12_timeline.py [--shapes o_32B,down_8B] [--replays 5]

Each kernel is a copy of its module with two stamps added (`_stamp`: at the top of the
kernel, after the program ids, and after its last store) and a stamp buffer per launch;
nothing else changes. Per launch (the first of each replay left out: it follows the last
launch of the replay before), from t0 = its first program's start: `span` (last end - t0),
`ramp` (last start - t0), `end50` (median end - t0), `tail` (span - end50), `prog` (median
program duration), `gap` (t0 - the launch before's last end) and `uneven` (the SMs holding
the most programs against those holding the fewest: their mean last end, us), `end sd` (the
programs' end times' standard deviation), `by SM` (the share of their variance between the
SMs' mean ends: 1 when a program's end is its SM's) and `by pid` (their correlation with
the program index, i.e. with the rows it reads), medians over the launches. Writes w12_timeline.json under $OUT (default: the current directory); the W12
and bf16 copies write a NaN-poisoned output, whose relative error against the fp32 reference
is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics

import torch

from benchmarks.stream_read import read_us
from benchmarks.w12_bench import ALL_SHAPES, bf16_copies, w12_copies
from benchmarks.w12_patch import module_from_source
from benchmarks.w12_probe import names_in
from specpilot.kernels.tuning import load_table

STAMP = '''

@triton.jit
def _stamp(tl_ptr, slot: tl.constexpr):
    """This program's start (slot 0, with its SM in slot 2) or end (slot 1), ns."""
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1)
                                                   + tl.num_programs(1) * tl.program_id(2))
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                  is_pure=False, pack=1)
    tl.store(tl_ptr + 3 * pid + slot, t)
    if slot == 0:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                       is_pure=False, pack=1)
        tl.store(tl_ptr + 3 * pid + 2, sm.to(tl.int64))


STAMPS = [None]  # the stamp buffer the next launch writes
'''

# (module, [(old, new) replacements]): each `old` must be in the module's source once
PATCHES = {
    "w12": ("specpilot.kernels.w12_triton", [
        ("    cnt_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, K_PER,\n",
         "    cnt_ptr, tl_ptr, M, N, K, KW, stride_a, stride_c, stride_xm, stride_ym, K_PER,\n"),
        ("    pid_m = tl.program_id(2)\n    n0 = pid_n * BN\n",
         "    pid_m = tl.program_id(2)\n    _stamp(tl_ptr, 0)\n    n0 = pid_n * BN\n"),
        ("                    erow_ptr, ecol_ptr, ebits_ptr, y_ptr, stride_ym, ECH)\n",
         ("                    erow_ptr, ecol_ptr, ebits_ptr, y_ptr, stride_ym, ECH)\n"
          "    _stamp(tl_ptr, 1)\n")),
        ("y, ws, cnt, m, w.n, k, kw, *w.row_strides(),",
         "y, ws, cnt, STAMPS[0], m, w.n, k, kw, *w.row_strides(),"),
    ]),
    "bf16": ("specpilot.kernels.gemv_bf16", [
        ("    x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,",
         "    x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, tl_ptr, M, N, K,"),
        ("    pid_m = tl.program_id(2)\n    offs_n = pid_n * BN",
         "    pid_m = tl.program_id(2)\n    _stamp(tl_ptr, 0)\n    offs_n = pid_n * BN"),
        ("                 mask=m_mask[:, None] & (offs_n < N)[None, :])\n\n",
         ("                 mask=m_mask[:, None] & (offs_n < N)[None, :])\n"
          "    _stamp(tl_ptr, 1)\n\n")),
        ("x, w, y, ws, cnt, m, n, k, w.stride(0),",
         "x, w, y, ws, cnt, STAMPS[0], m, n, k, w.stride(0),"),
    ]),
    "read": ("benchmarks.stream_read", [
        ("def _read_kernel(src, out, n,", "def _read_kernel(src, out, tl_ptr, n,"),
        ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    _stamp(tl_ptr, 0)\n"),
        ("    tl.store(out + pid, tl.xor_sum(acc, axis=0))\n",
         "    tl.store(out + pid, tl.xor_sum(acc, axis=0))\n    _stamp(tl_ptr, 1)\n"),
    ]),
}


def stamped(kind: str):
    """The module of `kind` with its kernel stamping (see the docstring)."""
    import importlib

    name, reps = PATCHES[kind]
    mod = importlib.import_module(name)
    with open(mod.__file__) as f:
        src = f.read()
    for old, new in reps:
        if src.count(old) != 1:
            raise SystemExit(f"{name} no longer has {old.strip()!r} once: update w12_timeline.py")
        src = src.replace(old, new)
    return module_from_source(src + STAMP, name.rsplit(".", 1)[1] + "_stamped")


def summary(replays: list[torch.Tensor]) -> dict:
    """Each replay's stamps [launches, programs, 3] (start, end, SM) -> the docstring's
    medians over the launches after each replay's first, us."""
    rows = []
    for stamps, i in ((st, i) for st in replays for i in range(1, st.shape[0])):
        s, e, sm = (stamps[i, :, j].double() for j in range(3))
        t0 = s.min()
        counts = torch.bincount(sm.long())
        last = torch.zeros_like(counts, dtype=torch.float64).scatter_reduce(
            0, sm.long(), e - t0, "amax")
        used = counts > 0
        most, fewest = counts[used].max(), counts[used].min()
        # what the end times' spread goes with: their SM (share of their variance between
        # the SMs' means) and the program's index (its rows: correlation)
        sm_mean = torch.zeros_like(last).scatter_add(0, sm.long(), e - t0) / counts.clamp_min(1)
        var = float((e - t0).var(unbiased=False))
        by_sm = float(((sm_mean[sm.long()] - (e - t0).mean()) ** 2).mean()) / max(var, 1e-9)
        pid = torch.arange(e.numel(), dtype=torch.float64)
        by_pid = float(torch.corrcoef(torch.stack([pid, e]))[0, 1]) if var > 0 else 0.0
        rows.append({
            "span": float(e.max() - t0), "ramp": float(s.max() - t0),
            "end50": float(e.median() - t0), "tail": float(e.max() - e.median()),
            "prog": float((e - s).median()), "gap": float(t0 - stamps[i - 1, :, 1].double().max()),
            "uneven": float(last[counts == most].mean() - last[used & (counts == fewest)].mean()),
            "programs": int(s.numel()), "per_sm": [int(fewest), int(most)],
            "sms": int(used.sum()), "by_sm": by_sm, "by_pid": by_pid,
            "end_sd": var ** 0.5})
    out = {k: statistics.median(r[k] for r in rows) / 1e3
           for k in ("span", "ramp", "end50", "tail", "prog", "gap", "uneven", "end_sd")}
    out.update({k: statistics.median(r[k] for r in rows) for k in ("by_sm", "by_pid")})
    out.update({k: rows[0][k] for k in ("programs", "per_sm", "sms")})
    return out


def record(call, mod, launches: int, programs: int, replays: int) -> tuple[list, float]:
    """`call(i)` x launches captured in a CUDA graph, launch i stamping (the stamped module
    `mod`) into its own buffer; (the stamps of each replay [launches, programs, 3], median
    us per call)."""
    bufs = torch.zeros(launches, programs, 3, dtype=torch.int64, device="cuda")
    for i in range(launches):  # warm-up (and compile) outside the capture
        mod.STAMPS[0] = bufs[i]
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            mod.STAMPS[0] = bufs[i]
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    got, times = [], []
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        t0.record()
        graph.replay()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) * 1e3 / launches)
        got.append(bufs.cpu())
    return got, statistics.median(times)


def run_shape(name: str, table, replays: int, mods: dict) -> dict:
    """The three kernels on shape `name`, each from its stamped module in `mods`."""
    from specpilot.kernels.w12_triton import launch_grid

    n, k = ALL_SHAPES[name]
    w, packed, copies = w12_copies(name)
    wb = bf16_copies(w, len(copies))
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    ref = x.float() @ w.float().T
    y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    res = {"shape": name}
    for kind, weights, run in (
            ("w12", copies, lambda c, i: mods["w12"].w12_matmul(x, copies[i], c, out=y)),
            ("bf16", wb, lambda c, i: mods["bf16"].bf16_matmul(x, wb[i], c, out=y))):
        cfg = table.lookup(kind, n, k, 1)
        if cfg is None:
            raise SystemExit(f"the shipped table has no {kind} entry for {name} at batch 1: "
                             "pick shapes it has (w12_bench.py tunes them)")
        g = launch_grid(1, n, cfg)
        y.fill_(float("nan"))
        got, us = record(lambda i, c=cfg, run=run: run(c, i), mods[kind], len(weights),
                         g[0] * g[1] * g[2], replays)
        err = float((y.float() - ref).norm() / ref.norm())
        res[kind] = {"config": cfg.label, "us": us, "rel_error": err, **summary(got)}
    # the plain read of the W12 bytes, with stream_read's best config for them
    rd = mods["read"]
    nbytes = packed.nbytes
    _, label = read_us(nbytes)  # the unstamped kernel's best config
    block, steps, warps = map(int, re.fullmatch(r"block(\d+)x(\d+) w(\d+)", label).groups())
    words = nbytes // 4
    progs = -(-words // (block * steps))
    bufs = [torch.ones(words, dtype=torch.int32, device="cuda") for _ in range(len(copies))]
    out = torch.empty(progs, dtype=torch.int32, device="cuda")

    def read(i):
        rd._read_kernel[(progs,)](bufs[i], out, rd.STAMPS[0], words, BLOCK=block, STEPS=steps,
                                  num_warps=warps)

    got, us = record(read, rd, len(bufs), progs, replays)
    res["read"] = {"config": label, "us": us, "bytes": nbytes, **summary(got)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qkv_32B,o_32B,down_32B,down_8B")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shapes = names_in(args.shapes, ALL_SHAPES, "shape")
    mods = {kind: stamped(kind) for kind in PATCHES}
    table = load_table(torch.cuda.get_device_name())
    res = []
    print(f"{'shape':12s} {'kernel':6s} {'config':26s} {'us':>6s} {'span':>6s} {'ramp':>5s} "
          f"{'end50':>6s} {'tail':>5s} {'prog':>6s} {'gap':>5s} {'uneven':>6s} {'end sd':>6s} "
          f"{'by SM':>5s} {'by pid':>6s}  programs, per SM")
    for name in shapes:
        r = run_shape(name, table, args.replays, mods)
        res.append(r)
        torch.cuda.empty_cache()
        for kind in ("w12", "bf16", "read"):
            v = r[kind]
            print(f"{name:12s} {kind:6s} {v['config']:26s} {v['us']:6.2f} {v['span']:6.2f} "
                  f"{v['ramp']:5.2f} {v['end50']:6.2f} {v['tail']:5.2f} {v['prog']:6.2f} "
                  f"{v['gap']:5.2f} {v['uneven']:6.2f} {v['end_sd']:6.2f} {v['by_sm']:5.2f} "
                  f"{v['by_pid']:6.2f}  {v['programs']}, {v['per_sm']}"
                  + (f"  err {v['rel_error']:.1e}" if "rel_error" in v else ""), flush=True)
    path = os.path.join(args.out, "w12_timeline.json")
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
