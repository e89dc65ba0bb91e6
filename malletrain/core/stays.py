"""``StayMap``: predicted stays per node, with the nodes grouped by stay.

The availability model (:mod:`malletrain.core.availability`) gives every node one of a
few dozen distinct :class:`Stay` values (one per age interval and time scale).  A
``StayMap`` is the plain ``dict`` node → Stay that ``decide`` reads (equal to any
mapping with the same items), and it can also list its distinct stays, longest first,
each with the nodes that have it (:meth:`StayMap.groups`, built on first use from the
per-node codes the model computed anyway).  The objective ranks the free nodes through
the groups (:class:`malletrain.core.objective.FreeOrder`) instead of node by node.

Anything that builds a ``StayMap`` must not change it afterwards.  Pure; imports the
domain model and numpy only.
"""
from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import numpy as np

from malletrain.domain.model import Stay

_FIRST, _SECOND = itemgetter(0), itemgetter(1)


class StayMap(dict[str, Stay]):
    """``dict`` node → Stay, built from per-node codes into a list of distinct stays."""

    __slots__ = ("_codes", "_values", "_names", "_groups")

    def __init__(self, names: Sequence[str], codes: np.ndarray, values: Sequence[Stay]) -> None:
        """Node ``names[i]`` has stay ``values[codes[i]]`` (names distinct)."""
        super().__init__(zip(names, map(values.__getitem__, codes.tolist())))
        self._names = names
        self._codes = codes
        self._values = values
        self._groups: tuple[tuple[Stay, frozenset[str]], ...] | None = None

    def groups(self) -> tuple[tuple[Stay, frozenset[str]], ...]:
        """The distinct stays, longest first — by (fraction, −leave_p), as the objective ranks
        them — each with the nodes that have it."""
        if self._groups is None:
            order = np.argsort(self._codes, kind="stable")
            counts = np.bincount(self._codes, minlength=len(self._values)).tolist()
            names = list(map(self._names.__getitem__, order.tolist()))
            groups, at = [], 0
            for code, count in enumerate(counts):
                if count:
                    groups.append((self._values[code], frozenset(names[at:at + count])))
                    at += count
            groups.sort(key=lambda g: g[0].leave_p)
            groups.sort(key=lambda g: g[0].fraction, reverse=True)
            self._groups = tuple(groups)
        return self._groups
