"""Summary statistics shared by replay, the daemon's benchmarks and reports."""
from __future__ import annotations

from collections.abc import Sequence


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1, numpy's ``inverted_cdf``); 0 for no data."""
    if not xs:
        return 0.0
    import numpy as np
    return float(np.percentile(xs, 100.0 * q, method="inverted_cdf"))


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all are equal, 1/n when one has all;
    1 for no data or all zero."""
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if xs and sq > 0 else 1.0
