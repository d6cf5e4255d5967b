"""Validate the cost model on a GPU: predicted vs measured weights-only decode steps.

Measures, in CUDA graphs with cuBLAS and random bf16 weights, the weights-only decode step
(every linear layer of every layer + lm_head) of an 8B-class and a 32B-class config at batch
1, 8 and 32, and each projection kind alone over all layers. Calibrates the device with
`specpilot.costmodel.calibrate` and prints measured ms against three predictions: the
datasheet floor, the shipped reference ceilings and this run's calibration.

    PYTHONPATH=. python3 benchmarks/costmodel_validate.py     # JSON under $OUT (or .)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import torch

os.environ.setdefault("SPECPILOT_DATA", "/tmp/specpilot-data")
from specpilot.costmodel.calibrate import _graph, calibrate, cuda_time
from specpilot.costmodel.hardware import calibration_path, get_hardware
from specpilot.costmodel.roofline import ar_step
from specpilot.costmodel.spec import load_spec

OUT = os.environ.get("OUT", ".")
BATCHES = (1, 8, 32)
OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


def _time_batch(s, layers: list, lm: torch.Tensor, b: int) -> dict:
    F = torch.nn.functional
    h, inter, hd = s.hidden_size, s.intermediate_size, s.head_dim
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(b, h, device=dev, dtype=dt) * 0.01
    xo = torch.randn(b, s.num_heads * hd, device=dev, dtype=dt) * 0.01
    xi = torch.randn(b, inter, device=dev, dtype=dt) * 0.01

    def step() -> torch.Tensor:
        y = x
        for wq, wo, wgu, wd in layers:
            q = F.linear(y, wq)
            y = y + F.linear(q[:, : s.num_heads * hd], wo)
            gu = F.linear(y, wgu)
            y = y + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], wd)
        return F.linear(y, lm)

    parts = {
        "qkv_proj": lambda: [F.linear(x, w[0]) for w in layers],
        "o_proj": lambda: [F.linear(xo, w[1]) for w in layers],
        "gate_up_proj": lambda: [F.linear(x, w[2]) for w in layers],
        "down_proj": lambda: [F.linear(xi, w[3]) for w in layers],
        "lm_head": lambda: [F.linear(x, lm) for _ in range(8)],  # 1.2 GB each: past the L2
    }
    fn, g = _graph(step)
    row = {"step": cuda_time(fn, 20) * 1e3}
    for name, f in parts.items():
        fn2, g2 = _graph(f)
        t = cuda_time(fn2, 20) * 1e3
        row[name] = t / 8 if name == "lm_head" else t
        del g2
    del g
    return row


def measure(preset: str) -> dict:
    """Measured ms of the whole weights-only step and of each projection kind, per batch."""
    s = load_spec(preset)
    h, inter, hd = s.hidden_size, s.intermediate_size, s.head_dim
    qkv = (s.num_heads + 2 * s.num_kv_heads) * hd
    dev, dt = "cuda", torch.bfloat16
    layers = [(torch.randn(qkv, h, device=dev, dtype=dt),
               torch.randn(h, s.num_heads * hd, device=dev, dtype=dt),
               torch.randn(2 * inter, h, device=dev, dtype=dt),
               torch.randn(h, inter, device=dev, dtype=dt)) for _ in range(s.num_layers)]
    lm = torch.randn(s.vocab_size, h, device=dev, dtype=dt)
    out = {b: _time_batch(s, layers, lm, b) for b in BATCHES}
    for b, row in out.items():
        print(preset, "B", b, {k: round(v, 3) for k, v in row.items()}, flush=True)
    del layers, lm
    torch.cuda.empty_cache()
    return out


def predict(preset: str, hw_kind: str) -> dict:
    s = load_spec(preset)
    hw = get_hardware("h200", hw_kind)
    res = {}
    for b in BATCHES:
        st = ar_step(s, hw, b, 0)
        ops = {o.name: o for o in st.ops}
        row = {n: (ops[n].bound_ms if hw_kind == "datasheet" else ops[n].expected_ms)
               for n in OPS}
        row["step"] = sum(row[n] for n in OPS)
        row["GB"] = sum(ops[n].weight_bytes for n in OPS) / 1e9
        res[b] = row
    return res


def main() -> None:
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    info = {"device": props.name, "sm": props.multi_processor_count, "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}
    print(info, flush=True)
    cal = calibrate("cuda", log=lambda m: print("calibrate:", m, flush=True))
    shutil.copy(calibration_path(cal.device), os.path.join(OUT, f"calibration_{cal.device}.json"))
    if cal.device != "h200":
        print(f"warning: device {cal.device!r} is not an h200; the table compares with h200",
              file=sys.stderr)
    print(f"calibrated in {time.time() - t0:.0f} s", flush=True)
    res = {"info": info, "calibration": cal.to_dict(), "measured": {}, "predicted": {}}
    for preset in ("8b", "32b"):
        res["measured"][preset] = measure(preset)
        res["predicted"][preset] = {k: predict(preset, k)
                                    for k in ("datasheet", "reference", "calibrated")}
    with open(os.path.join(OUT, "costmodel_validate.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("\nwhole weights-only step, ms (ratio = predicted / measured)")
    print(f"{'model':5} {'B':>3} {'GB':>6} {'measured':>9} {'datasheet':>15} {'reference':>15} "
          f"{'calibrated':>15}")
    for preset in ("8b", "32b"):
        for b in BATCHES:
            m = res["measured"][preset][b]["step"]
            cells = []
            for k in ("datasheet", "reference", "calibrated"):
                p = res["predicted"][preset][k][b]["step"]
                cells.append(f"{p:7.3f} ({p / m:4.2f})")
            gb = res["predicted"][preset]["datasheet"][b]["GB"]
            print(f"{preset:5} {b:>3} {gb:6.2f} {m:9.3f} " + " ".join(f"{c:>15}" for c in cells))
    print("\nper projection kind (all layers), calibrated prediction / measured")
    print(f"{'model':5} {'B':>3} " + " ".join(f"{n:>13}" for n in OPS))
    for preset in ("8b", "32b"):
        for b in BATCHES:
            m = res["measured"][preset][b]
            p = res["predicted"][preset]["calibrated"][b]
            print(f"{preset:5} {b:>3} " + " ".join(
                f"{m[n]:6.3f}/{p[n] / m[n]:4.2f}x" for n in OPS))
    print(f"DONE in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
