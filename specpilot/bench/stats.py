"""Paired bootstrap confidence intervals for throughput ratios.

Two bench results of the same workload give, per request i, the new tokens and the time
it cost (`time_s`, its share of the batch's wall time). Throughput is
sum(tokens) / sum(time). The ratio of two throughputs is bootstrapped by resampling
*requests* with replacement, the same indices for both results (paired), so the
per-request difficulty that both share cancels out of the interval.
"""

from __future__ import annotations

import numpy as np


def throughput(tokens, times) -> float:
    t = float(np.sum(times))
    return float(np.sum(tokens)) / t if t > 0 else 0.0


def paired_bootstrap_ratio(times_a, times_b, tokens_a=None, tokens_b=None, n: int = 10_000,
                           seed: int = 0, ci: float = 0.95) -> tuple[float, float, float]:
    """(ratio, lo, hi): throughput(a) / throughput(b) and its `ci` percentile interval.

    `times_*[i]` is request i's time in each result (use the median over repeats when a
    result has several), `tokens_*[i]` its new tokens (None: 1 per request, i.e. a ratio
    of total times b / a). Requests must be paired: index i is the same prompt in both.
    Resamples are drawn with numpy's PCG64 seeded by `seed`, so the interval is exactly
    reproducible."""
    ta, tb = np.asarray(times_a, dtype=float), np.asarray(times_b, dtype=float)
    m = len(ta)
    if m == 0 or len(tb) != m:
        raise ValueError(f"paired bootstrap needs two equal, non-empty samples ({m} vs {len(tb)})")
    ka = np.ones(m) if tokens_a is None else np.asarray(tokens_a, dtype=float)
    kb = np.ones(m) if tokens_b is None else np.asarray(tokens_b, dtype=float)
    if len(ka) != m or len(kb) != m:
        raise ValueError("tokens and times must have one entry per request")
    ratio = (ka.sum() / ta.sum()) / (kb.sum() / tb.sum())
    rng = np.random.default_rng(seed)
    boots = np.empty(n)
    step = max(1, 2_000_000 // m)  # bound the index matrix to ~16 MB
    for s in range(0, n, step):
        idx = rng.integers(0, m, size=(min(step, n - s), m))
        boots[s: s + len(idx)] = ((ka[idx].sum(1) / ta[idx].sum(1))
                                  / (kb[idx].sum(1) / tb[idx].sum(1)))
    alpha = (1.0 - ci) / 2
    lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
    return float(ratio), float(lo), float(hi)
