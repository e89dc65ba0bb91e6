"""``StayMap``: predicted stays per node, with the nodes grouped by stay.

The availability model (:mod:`malletrain.core.availability`) gives every node one of a
few dozen distinct :class:`Stay` values (one per age interval and time scale).  A
``StayMap`` is the read-only mapping node → Stay that ``decide`` reads (equal to any
mapping with the same items), kept as per-node codes into a list of distinct stays.  The
plain ``dict`` is built only when something reads node by node (placement does; a plan
that stands, the objective and the cycle's memo do not): on a large pool most answers are
never read that way.  Two maps of the same names compare code by code (:meth:`StayMap.__eq__`),
without building either dict.  A map can also list its distinct stays, longest first,
each with the nodes that have it (:meth:`StayMap.groups`, built on first use).  The objective
ranks the free nodes through the groups (:class:`malletrain.core.objective.FreeOrder`) instead
of node by node; where the map was built for the very pool tuple ``decide`` reads
(:meth:`StayMap.covers`), it counts the stays of the free nodes as all the pool's counts less
those of the nodes jobs hold (:meth:`StayMap.count`, :meth:`StayMap.ranked`): a pass over the
held nodes, none over the pool.  A job's own nodes' stays, longest first, are summed in the
order of their ranks (:meth:`StayMap.prefix`): an integer sort instead of sorting the stays.

Anything that builds a ``StayMap`` must not change its inputs afterwards.  Pure; imports the
domain model, numpy and the standard library only.
"""
from __future__ import annotations

import math
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from itertools import accumulate

import numpy as np

from malletrain.domain.model import Stay


class StayMap(Mapping[str, Stay]):
    """Read-only mapping node → Stay, kept as per-node codes into a list of distinct stays."""

    __slots__ = ("_codes", "_values", "_names", "_groups", "_source", "_index", "_totals", "_ranked", "_by_rank",
                 "_code_list", "_dict")

    def __init__(self, names: Sequence[str], codes: np.ndarray, values: Sequence[Stay], *,
                 source: object = None, index: Mapping[str, int] | None = None) -> None:
        """Node ``names[i]`` has stay ``values[codes[i]]`` (names distinct).  ``source``: the
        pool sequence the names were read from, in order (see :meth:`covers`); ``index``: name →
        position in ``names``, when the caller keeps one (else built on first use)."""
        self._names = names
        self._codes = codes
        self._values = values
        self._code_list: list[int] | None = None
        self._dict: dict[str, Stay] | None = None
        self._groups: tuple[tuple[Stay, frozenset[str]], ...] | None = None
        self._source = source
        self._index = index
        self._totals: np.ndarray | None = None
        self._ranked: tuple[int, ...] | None = None
        self._by_rank: tuple[list[int], list[float], list[float]] | None = None

    def unbuilt(self, source: object = None) -> StayMap:
        """The same map with nothing built yet (no dict, groups, counts or ranks), for the pool
        object ``source`` (its names must be this map's, in order; see :meth:`covers`): what a
        reader of a new answer pays for, measured apart from the model that made it."""
        return StayMap(self._names, self._codes, self._values, source=source, index=self._index)

    # -- the mapping: a plain dict, built on the first read node by node ----------
    def plain(self) -> dict[str, Stay]:
        """The plain ``dict`` node → Stay (built once; do not modify it)."""
        d = self._dict
        if d is None:
            d = self._dict = dict(zip(self._names, map(self._values.__getitem__, self._codes_list())))
        return d

    def _codes_list(self) -> list[int]:
        if self._code_list is None:
            self._code_list = self._codes.tolist()
        return self._code_list

    def __getitem__(self, name: str) -> Stay:
        return self.plain()[name]

    def get(self, name: str, default=None):
        return self.plain().get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self.plain()

    def __iter__(self) -> Iterator[str]:
        return iter(self.plain())

    def __len__(self) -> int:
        return len(self._names)

    def keys(self) -> KeysView[str]:
        return self.plain().keys()

    def values(self) -> ValuesView[Stay]:
        return self.plain().values()

    def items(self) -> ItemsView[str, Stay]:
        return self.plain().items()

    def __eq__(self, other: object) -> bool:
        """Equal to any mapping with the same items.  Two maps of the same names compare code by
        code, without building either dict (:meth:`_same_stays`)."""
        if other is self:
            return True
        if isinstance(other, StayMap) and (other._names is self._names or other._names == self._names):
            return self._same_stays(other)
        if isinstance(other, Mapping):
            if len(other) != len(self):
                return False
            plain = (other.plain() if isinstance(other, StayMap)
                     else other if isinstance(other, dict) else dict(other.items()))
            return self.plain() == plain
        return NotImplemented

    def _same_stays(self, other: StayMap) -> bool:
        """Every node has equal stays in both maps (of the same names).  Where the maps differ it
        is mostly at once: the first node, then the nodes whose codes differ, are looked at first.
        With the same codes, the codes that occur must name equal stays; else every pair of codes
        that occurs."""
        a, b = self._codes, other._codes
        va, vb = self._values, other._values
        if not len(a):
            return True
        if not ((x := va[a[0]]) is (y := vb[b[0]]) or x == y):
            return False
        moved = np.flatnonzero(a != b)
        if not len(moved):
            return all(x is (y := vb[c]) or x == y for c, (x, n) in enumerate(zip(va, self.count())) if n)
        if not all(va[i] is vb[j] or va[i] == vb[j] for i, j in zip(a[moved].tolist(), b[moved].tolist())):
            return False
        width = int(b.max()) + 1
        return all((x := va[p // width]) is (y := vb[p % width]) or x == y
                   for p in np.unique(a * width + b).tolist())

    __hash__ = None     # type: ignore[assignment]  # a mapping: unhashable, as a dict

    def __repr__(self) -> str:
        return f"StayMap({self.plain()!r})"

    @property
    def by_code(self) -> Sequence[Stay]:
        """The stay of each code (a code may share its value with another)."""
        return self._values

    def covers(self, nodes: object) -> bool:
        """Built for exactly this pool object: its keys are the names of ``nodes``, no more."""
        return self._source is not None and self._source is nodes

    def ranked(self) -> tuple[int, ...]:
        """The codes, longest stay first, as :meth:`groups` orders them (equal stays in code
        order)."""
        if self._ranked is None:
            order = list(range(len(self._values)))
            order.sort(key=lambda c: self._values[c].leave_p)
            order.sort(key=lambda c: self._values[c].fraction, reverse=True)
            self._ranked = tuple(order)
        return self._ranked

    def prefix(self, names: Iterable[str]) -> list[tuple[float, float]] | None:
        """``objective._prefix`` of the stays of ``names`` longest first: ``[(Σ fraction, Σ log(1 −
        leave_p)) of the first k]`` for k = 0 … len, or None when a name is not in the map.  Each
        node's place in :meth:`ranked`'s order is looked up and the ranks sorted as integers, so
        the sums are the same additions of the same values in the same order (equal stays are
        interchangeable)."""
        if self._by_rank is None:
            order = self.ranked()
            rank = [0] * len(self._values)
            for r, c in enumerate(order):
                rank[c] = r
            leaves = [self._values[c].leave_p for c in order]
            logs = {p: math.log(max(1e-12, 1.0 - p)) for p in set(leaves)}
            self._by_rank = (rank, [self._values[c].fraction for c in order], list(map(logs.__getitem__, leaves)))
        if self._index is None:
            self._index = dict(zip(self._names, range(len(self._names))))
        rank_of, fractions, logs_of = self._by_rank
        at = list(map(self._index.get, names))
        if None in at:
            return None
        codes = map(self._codes_list().__getitem__, at)  # type: ignore[arg-type]  # no None: checked
        ranks = sorted(map(rank_of.__getitem__, codes))
        return list(zip(accumulate(map(fractions.__getitem__, ranks), initial=0.0),
                        accumulate(map(logs_of.__getitem__, ranks), initial=0.0)))

    def count(self, names: Iterable[str] | None = None) -> list[int]:
        """How many of ``names`` (None: of all) have each code; names it does not hold are not
        counted."""
        if names is None:
            if self._totals is None:
                self._totals = np.bincount(self._codes, minlength=len(self._values))
            return self._totals.tolist()
        if self._index is None:
            self._index = dict(zip(self._names, range(len(self._names))))
        try:
            idx = list(map(self._index.__getitem__, names))
        except KeyError:        # some are not in the map: count the others
            at = self._index.get
            idx = [i for i in map(at, names) if i is not None]
        return np.bincount(self._codes[idx], minlength=len(self._values)).tolist()

    def groups(self) -> tuple[tuple[Stay, frozenset[str]], ...]:
        """The distinct stays, longest first — by (fraction, −leave_p), as the objective ranks
        them — each with the nodes that have it."""
        if self._groups is None:
            order = np.argsort(self._codes, kind="stable")
            counts = self.count()
            names = list(map(self._names.__getitem__, order.tolist()))
            starts = [0, *accumulate(counts)]          # code c's names are names[starts[c]:starts[c + 1]]
            self._groups = tuple((self._values[c], frozenset(names[starts[c]:starts[c + 1]]))
                                 for c in self.ranked() if counts[c])
        return self._groups
