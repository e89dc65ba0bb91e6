"""The parametric scaling model.

Terms (time per sample ``tau(n) = 1 / throughput(n)`` at ``n`` nodes):

* ``a / n``      perfectly parallel compute, shared by the nodes;
* ``b``          serial part (data loading, optimizer step on one rank);
* ``c * log2 n`` communication of a tree/ring all-reduce, which grows with
                 the node count and makes *retrograde* scaling expressible
                 (throughput falls past ``n* = a ln2 / c``).

At a fixed global batch this is the step-time model ``T(n) = a/n + b + c log2 n``
divided by the batch.  Coefficients are non-negative; they are found by
weighted non-negative least squares on *relative* error (every row is divided
by its observation), solved exactly by enumerating the 7 active sets of the
3 coefficients.  With fewer distinct counts than 3 the model is reduced:
2 counts fit ``a/n + b`` (Amdahl), 1 count needs a shape from elsewhere.

The fit is the same to the last bit on every machine: each active set is solved
from its normal equations, whose sums are ``math.fsum`` (correctly rounded, so
independent of order), by a Cholesky factorisation of at most 3×3 in Python
floats.  No BLAS or LAPACK routine is called: ``numpy.linalg.lstsq``, used
before, gave results that differed in their last bits with the kernel OpenBLAS
picks for the CPU (``OPENBLAS_CORETYPE``), and a campaign replay, which fits
thousands of trials, then made other decisions (one Theta-week run reached its
target at 45.54 h with one kernel and 39.49 h with another).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from malletrain.domain.model import interpolate

TERMS = ("a/n", "b", "c*log2(n)")


def _basis(n: float) -> tuple[float, float, float]:
    return (1.0 / n, 1.0, math.log2(n))


@dataclass(frozen=True)
class ScalingFit:
    """A fitted model: ``tau(n) = scale * (a/n + b + c*log2 n)``."""

    a: float
    b: float
    c: float
    rel_rmse: float          # relative residual on the fitted points
    counts: tuple[int, ...]  # distinct node counts it was fitted on
    scale: float = 1.0

    def time_per_sample(self, n: float) -> float:
        a, b, c = _basis(n)
        return self.scale * (self.a * a + self.b * b + self.c * c)

    def throughput(self, n: float) -> float:
        if n <= 0:
            return 0.0
        tau = self.time_per_sample(n)
        return 1.0 / tau if tau > 0 else 0.0

    def rescaled(self, scale: float) -> ScalingFit:
        return ScalingFit(self.a, self.b, self.c, self.rel_rmse, self.counts,
                          self.scale * scale)


def fit_scaling(counts: Sequence[int], throughputs: Sequence[float],
                terms: int = 3) -> ScalingFit:
    """Fit the model to (node count, samples/s) points.

    ``terms`` caps the number of free coefficients (3: full model, 2: Amdahl,
    1: perfectly parallel).  Raises ``ValueError`` on empty or non-positive
    input; callers validate their samples first.
    """
    if len(counts) == 0 or len(counts) != len(throughputs):
        raise ValueError("need the same non-zero number of counts and throughputs")
    if any(n <= 0 for n in counts) or any(not (x > 0 and math.isfinite(x)) for x in throughputs):
        raise ValueError("counts and throughputs must be positive and finite")
    rows = [(b0 / tau, b1 / tau, b2 / tau)        # relative-error weighting (the target is 1)
            for (b0, b1, b2), tau in zip(map(_basis, counts), [1.0 / x for x in throughputs])]
    # Solved for sigma * (a, b, c) on rows * sigma, sigma a power of two (exact both ways) that
    # brings the largest entry to [0.5, 1): the squares neither overflow nor vanish, whatever the
    # throughputs' unit.
    sigma = math.ldexp(1.0, -math.frexp(max(max(r) for r in rows))[1])
    rows = [(r0 * sigma, r1 * sigma, r2 * sigma) for r0, r1, r2 in rows]
    usable = [0, 1, 2][:max(1, min(terms, 3))]
    gram = {(j, k): math.fsum(r[j] * r[k] for r in rows) for j in usable for k in usable if j <= k}
    rhs = {j: math.fsum(r[j] for r in rows) for j in usable}
    best: tuple[float, list[float]] | None = None
    for size in range(1, len(usable) + 1):
        for active in itertools.combinations(usable, size):
            if active == (2,):
                continue  # log term alone: infinite throughput at n = 1
            sol = _normal_solve(gram, rhs, active)
            if sol is None or min(sol) < 0:
                continue
            coef = [0.0, 0.0, 0.0]
            for j, v in zip(active, sol):
                coef[j] = v
            a, b, c = coef
            res = math.fsum((r[0] * a + r[1] * b + r[2] * c - 1.0) ** 2 for r in rows)
            # Prefer fewer terms unless more terms cut the residual clearly.
            if best is None or res < best[0] - 1e-12:
                best = (res, coef)
    if best is None:  # cannot happen: the 1-term 'a/n' fit is always feasible
        raise ValueError("no non-negative fit")
    res, coef = best
    return ScalingFit(coef[0] * sigma, coef[1] * sigma, coef[2] * sigma,
                      rel_rmse=math.sqrt(res / len(rows)),
                      counts=tuple(sorted(set(int(n) for n in counts))))


_DEPENDENT = 1e-12      # a pivot below this share of its column's square norm: the columns are dependent


def _normal_solve(gram: dict[tuple[int, int], float], rhs: dict[int, float],
                  active: tuple[int, ...]) -> list[float] | None:
    """The least-squares coefficients of the ``active`` columns from the normal equations
    ``G x = h`` (``gram[j, k]`` for ``j <= k``), by Cholesky ``G = L Lᵀ`` with its two triangular
    solves, in a fixed order of Python float operations; ``None`` where the active columns are
    (numerically) linearly dependent, so that no fit rests on a near-singular system."""
    k = len(active)
    low = [[0.0] * k for _ in range(k)]
    for i in range(k):
        for j in range(i + 1):
            g = gram[active[j], active[i]]
            acc = g - sum(low[i][m] * low[j][m] for m in range(j))
            if i == j:
                if not acc > _DEPENDENT * g:
                    return None
                low[i][i] = math.sqrt(acc)
            else:
                low[i][j] = acc / low[j][j]
    y = [0.0] * k
    for i in range(k):
        y[i] = (rhs[active[i]] - sum(low[i][m] * y[m] for m in range(i))) / low[i][i]
    x = [0.0] * k
    for i in reversed(range(k)):
        x[i] = (y[i] - sum(low[m][i] * x[m] for m in range(i + 1, k))) / low[i][i]
    return x


def band(fit: ScalingFit, n: int, measured: Sequence[int]) -> tuple[float, float, float]:
    """(mean, low, high) at ``n`` nodes: ``mean·(1 ± 2σ)`` with
    ``σ = max(rel_rmse, 2%) · (1 + d)`` and ``d`` the log2 distance from ``n``
    to the nearest measured count (extrapolation widens the band)."""
    mean = fit.throughput(n)
    d = min(abs(math.log2(n / m)) for m in measured) if measured else 3.0
    s = max(fit.rel_rmse, 0.02) * (1.0 + d)
    return mean, max(0.0, mean * (1 - 2 * s)), mean * (1 + 2 * s)


def anchored(fit: ScalingFit, points: dict[int, float]):
    """Predictor that honours measurements: the measured value at a measured
    count, linear interpolation between measured counts (real curves are not
    smooth), and outside the measured range the nearest measurement scaled by
    the model's ratio ``fit(n) / fit(m)``."""
    ks = sorted(points)

    def predict(n: int) -> float:
        if not ks:
            return fit.throughput(n)
        if n in points:
            return points[n]
        if ks[0] < n < ks[-1]:
            return interpolate(ks, [points[k] for k in ks], n)
        m = ks[0] if n < ks[0] else ks[-1]
        base = fit.throughput(m)
        return points[m] * fit.throughput(n) / base if base > 0 else fit.throughput(n)
    return predict
