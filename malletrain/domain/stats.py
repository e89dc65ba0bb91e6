"""Summary statistics shared by replay, the daemon's benchmarks and reports."""
from __future__ import annotations

from collections.abc import Sequence


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1, numpy's ``inverted_cdf``); 0 for no data."""
    if not xs:
        return 0.0
    import numpy as np
    return float(np.percentile(xs, 100.0 * q, method="inverted_cdf"))
