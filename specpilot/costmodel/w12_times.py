"""W12 linears priced from the device's tuned kernel table instead of from their bytes alone.

The roofline prices a W12 linear as its 12-bit bytes streamed at the bf16 GEMMs' calibrated
efficiency: 1.33x faster than bf16 at every row count. The W12 kernels measured on the
H200 come close to that at 1-8 rows and lose to bf16 at 16-32 (docs/BENCHMARKS.md), and an
engine with `weights = w12` keeps a linear bf16 unless W12 gains 5% over the best bf16
kernel at every row count its steps put through it (`apply_w12`). With a tuned table
(`specpilot/kernels/tuned/<device>.json`, or the user's under the data folder, which the
kernel agent writes), a W12 linear is priced the way the engine builds it: where W12 wins
at every row count, at its bf16 time times W12's measured time over cuBLAS's; elsewhere at
its bf16 time. Standard library only, like the rest of the cost model.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from ..runtime.errors import SpecPilotError

# copies of the kernels' own (kernels/ imports torch): tests/test_costmodel_w12.py checks
# that they agree
MIN_GAIN = 1.05  # apply_w12's default
BUCKETS = (1, 2, 4, 8, 16, 32)  # the kernels' row buckets; above 32 rows W12 unpacks
SHIPPED = Path(__file__).resolve().parents[1] / "kernels" / "tuned"


def _bucket(m: int) -> int | None:
    return next((b for b in BUCKETS if m <= b), None)


class W12Times:
    """Median microseconds per (kernel, N, K, row bucket) of one device's tuned table."""

    def __init__(self, entries: dict[str, dict]):
        self.us: dict[tuple[str, int, int, int], float] = {}
        self.w12_shapes: dict[int, list[tuple[int, int]]] = {}  # bucket -> shapes W12 measured
        for key, v in entries.items():  # "kernel:NxK:bB" -> {"median_us": ..., ...}
            kernel, shape, b = key.split(":")
            n, k = map(int, shape.split("x"))
            bucket = int(b.removeprefix("b"))
            self.us[(kernel, n, k, bucket)] = float(v["median_us"])
            if kernel == "w12":
                self.w12_shapes.setdefault(bucket, []).append((n, k))

    @classmethod
    def load(cls, slug: str) -> W12Times | None:
        """The user's table for device `slug` (data folder), else the shipped one, else None."""
        from ..deployment import data_dir

        for path in (data_dir() / "kernels" / f"{slug}.json", SHIPPED / f"{slug}.json"):
            if path.is_file():
                return _read(str(path), path.stat().st_mtime_ns)
        return None

    def _shape(self, n: int, k: int, b: int) -> tuple[int, int] | None:
        """(N, K) measured for W12 at bucket b: (n, k) itself, else the nearest by
        |ln(n / N)| + |ln(k / K)| as its stand-in (the engine runs an untuned shape on the
        config of its nearest tuned shape of the same column-group width)."""
        shapes = self.w12_shapes.get(b, [])
        if (n, k) in shapes:
            return n, k
        return min(shapes, default=None,
                   key=lambda s: abs(math.log(n / s[0])) + abs(math.log(k / s[1])))

    def _ratios(self, n: int, k: int, m: int) -> tuple[float, float] | None:
        """(best bf16 time / W12 time, W12 time / cuBLAS time) at m rows."""
        b = _bucket(m)
        shape = self._shape(n, k, b) if b else None
        if shape is None:
            return None
        w12, cublas, bf16 = (self.us.get((kern, *shape, b)) for kern in ("w12", "cublas", "bf16"))
        if not (w12 and cublas):
            return None
        return min(t for t in (cublas, bf16) if t) / w12, w12 / cublas

    def factor(self, n: int, k: int, m: int, rows: tuple[int, ...]) -> float | None:
        """Time of an (n, k) W12 linear at m rows over its bf16 (cuBLAS) time, in an engine
        whose steps put `rows` through it: W12's measured ratio where it gains MIN_GAIN over
        the best bf16 kernel at every row count; 1.0 where the engine keeps it bf16 (or a
        row count is above the kernels' buckets); None when the table measured nothing
        for it."""
        if any(_bucket(r) is None for r in rows):
            return 1.0
        per_row = [self._ratios(n, k, r) for r in rows]
        here = self._ratios(n, k, m)
        if here is None or any(p is None for p in per_row):
            return None
        return here[1] if all(p[0] >= MIN_GAIN for p in per_row) else 1.0


@functools.cache
def _read(path: str, mtime_ns: int) -> W12Times:
    """The table at `path`, parsed once per version of the file (a speedup table prices
    dozens of steps)."""
    try:
        return W12Times(json.loads(Path(path).read_text()).get("entries", {}))
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
        raise SpecPilotError(f"{path}: not a readable tuned kernel table ({e}); "
                             "delete it or re-run the kernel tuning") from None
