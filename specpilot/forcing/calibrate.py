"""The tie margin per device and dtype, measured from the stock runtime's own numeric noise.

`calibrate()` teacher-forces random token sequences through the stock reference and
compares the logits with stock passes of other shapes (all sequences batched and
extended; token-by-token decoding through the KV cache, as the engine runs) and takes
margin = factor x the largest |logit difference| seen. A committed token whose logit
trails the reference's top-1 by no more than that could have been chosen by the same
model under another batch shape, so verify reports it as a tie, not a mismatch.
The result is stored as JSON in `data_dir()/calibration/<device>-<dtype>.json`.
fp32 on CPU needs no calibration: its margin is 0 by contract.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

from ..atomic import write_json_atomic
from ..deployment import data_dir
from ..runtime.errors import SpecPilotError

DEFAULT_FACTOR = 4.0  # 2x covers a top-1 minus committed gap of two noisy logits; 2x headroom


def calibration_path(device_name: str, dtype: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"
    return data_dir() / "calibration" / f"{slug}-{dtype}.json"


def tie_margin(reference) -> tuple[float, str]:
    """(margin, where it came from) for a reference's device and dtype."""
    if reference.kind == "server":
        return 0.0, "server reference default (give a margin for non-fp32 servers)"
    if reference.device == "cpu" and reference.dtype == "float32":
        return 0.0, "fp32 on CPU"
    if reference.device != "cpu":
        reference.start()  # the worker names the device (e.g. "NVIDIA H200")
    path = calibration_path(reference.device_name, reference.dtype)
    if path.is_file():
        try:
            return float(json.loads(path.read_text())["margin"]), str(path)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            raise SpecPilotError(f"calibration file {path} is unreadable or damaged: delete it "
                                 f"and run `specpilot verify --calibrate --model DIR --device "
                                 f"{reference.device} --dtype {reference.dtype}`") from None
    return 0.0, (f"uncalibrated for {reference.device_name}/{reference.dtype}: run "
                 f"`specpilot verify --calibrate --model DIR --device {reference.device} "
                 f"--dtype {reference.dtype}`")


def calibrate(model_dir: str, device: str = "cpu", dtype: str = "float32", n: int = 8,
              length: int = 96, factor: float = DEFAULT_FACTOR, seed: int = 0,
              save: bool = True) -> dict:
    """Measure the stock runtime's batch-shape noise and store the tie margin."""
    from .reference import LocalReference

    rng = random.Random(seed)
    with LocalReference(model_dir, device, dtype) as ref:
        seqs = [[rng.randrange(ref.vocab_size) for _ in range(length)] for _ in range(n)]
        extra = [rng.randrange(ref.vocab_size) for _ in range(7)]
        res = ref.start().calibrate(seqs, start=length // 4, extra=extra)
        rec = {
            "device": device, "device_name": ref.device_name, "dtype": dtype,
            "margin": factor * res["max_abs_diff"], "max_abs_diff": res["max_abs_diff"],
            "diffs": res["diffs"],
            "factor": factor, "positions": res["positions"], "sequences": n,
            "length": length, "model": str(model_dir), "seed": seed,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        path = calibration_path(ref.device_name, dtype)
    if save:
        write_json_atomic(path, rec)
        rec["path"] = str(path)
    return rec
