"""Sizing advice: how many nodes a job should ask for, from what the JPA knows of its profile.

Input: a job's (or a profile's) measured median throughput per node count.  The
scaling model (:mod:`malletrain.jpa.scaling`, fitted on the measured counts and
anchored to them) predicts samples/s at every candidate count ``n`` with a band
``[low, high]`` that widens away from the measurements.  For ``W`` samples of
work that gives, per count:

* time to finish ``W / T(n)`` (its band from ``W / high`` to ``W / low``), and
* node-hours ``n · W / T(n) / 3600``.

Recommendations, each also given for the band's pessimistic end (``low``):

* ``fastest``: the count with the shortest time;
* ``deadline``: the smallest count that finishes by the deadline;
* ``cheapest``: among the counts that finish by the deadline (all counts without
  one), the one with the fewest node-hours.

Pure: no I/O; the CLI (``malletrain advise``) reads the measurements.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from malletrain.jpa.scaling import anchored, band, fit_scaling


@dataclass(frozen=True)
class SizeAdvice:
    nodes: int
    samples_per_s: float
    low: float                 # the band's pessimistic end
    high: float
    finish_s: float | None     # time to finish the work (None without work)
    finish_worst_s: float | None
    node_hours: float | None
    measured: bool


@dataclass(frozen=True)
class Advice:
    rows: tuple[SizeAdvice, ...]
    work: float | None
    deadline_s: float | None
    fastest: int
    deadline: int | None          # smallest count that meets the deadline (mean prediction)
    deadline_safe: int | None     # ... with the pessimistic end of the band
    cheapest: int | None          # fewest node-hours within the deadline (mean prediction)
    cheapest_safe: int | None


def advise(measured: Mapping[int, float], counts: Sequence[int], work: float | None = None,
           deadline_s: float | None = None) -> Advice:
    """Advice from ``measured`` {nodes: median samples/s} (at least one count) over ``counts``."""
    if not measured:
        raise ValueError("no measurements")
    pts = sorted(measured)
    fit = fit_scaling(pts, [measured[n] for n in pts], terms=min(3, len(pts)))
    predict = anchored(fit, dict(measured))
    rows = []
    for n in sorted(set(counts)):
        mean_fit, low, high = band(fit, n, pts)
        mean = predict(n)
        r = mean / mean_fit if mean_fit > 0 else 1.0
        low, high = low * r, high * r
        finish = work / mean if work and mean > 0 else None
        worst = work / low if work and low > 0 else None
        rows.append(SizeAdvice(n, mean, low, high, finish, worst,
                               n * finish / 3600.0 if finish is not None else None, n in measured))
    fastest = max(rows, key=lambda a: (a.samples_per_s, -a.nodes)).nodes

    def smallest(ok) -> int | None:
        return next((a.nodes for a in rows if ok(a)), None)

    def cheapest(finish_of) -> int | None:
        fit_rows = [a for a in rows if finish_of(a) is not None
                    and (deadline_s is None or finish_of(a) <= deadline_s)]
        return min(fit_rows, key=lambda a: (a.nodes * finish_of(a), a.nodes)).nodes if fit_rows else None
    dl = dl_safe = None
    if work and deadline_s is not None:
        dl = smallest(lambda a: a.finish_s is not None and a.finish_s <= deadline_s)
        dl_safe = smallest(lambda a: a.finish_worst_s is not None and a.finish_worst_s <= deadline_s)
    cheap = cheap_safe = None
    if work:
        cheap = cheapest(lambda a: a.finish_s)
        cheap_safe = cheapest(lambda a: a.finish_worst_s)
    return Advice(tuple(rows), work, deadline_s, fastest, dl, dl_safe, cheap, cheap_safe)
