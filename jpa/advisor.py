"""The advisor: samples in, predicted curves (with probes) out.

It keeps per-job throughput samples, cleans them, fits :mod:`malletrain.jpa.scaling` and
answers :meth:`Advisor.curve`.  Pure: no I/O, no clock (sample times come in).

Cleaning rules
  * non-finite, non-positive or absurd samples are rejected at ``add`` and
    counted in ``rejected``;
  * warm-up: the first ``warmup_samples`` samples of every contiguous run at
    one node count are dropped (the first steps after a (re)start are slow);
    samples older than the job's newest are rejected;
  * outliers: per count, samples further than ``outlier_mad`` scaled median
    absolute deviations from the median are dropped.

Prior sharing: jobs with the same ``profile`` key (HPO trials of one model)
share a *shape*.  A job with fewer than 3 measured counts whose profile has a
fitted shape uses that shape — as it is before the job has data, scaled to its
own measurements after — and is probed only where its range reaches beyond
what was measured (:func:`beyond_probe`: at twice the largest measured count).
A job with no profile shape is probed at up to 3 counts.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from malletrain.domain.model import MAX_NODES, Curve, CurvePoint, Sample
from malletrain.jpa.scaling import ScalingFit, anchored, band, fit_scaling


def probe_counts(min_nodes: int, max_nodes: int, k: int = 3) -> tuple[int, ...]:
    """The node counts worth probing before a job has data (at most ``k``).

    Geometric: min, 2·min, 4·min, clipped to ``max_nodes``; a short range
    is covered by its ends and middle instead.
    """
    lo, hi = max(1, min_nodes), max(1, max_nodes)
    if hi <= lo:
        return (lo,)
    counts = [lo * (2 ** i) for i in range(k) if lo * (2 ** i) <= hi]
    if len(counts) < min(k, hi - lo + 1):
        counts = sorted({lo, round(math.sqrt(lo * hi)), hi})
    return tuple(counts[:k])


def probe_ladder(min_nodes: int, max_nodes: int, k: int = 3) -> tuple[int, ...]:
    """Every count a job without data may probe at: :func:`probe_counts` (up from
    ``min_nodes``, where nodes are scarce) and ``max_nodes``, ``max_nodes // 2``, …
    (``k`` counts down from the top, where nodes are plentiful), ascending.  Any three
    of them make a fit; :func:`malletrain.core.decide.decide` picks by the nodes there are."""
    lo, hi = max(1, min_nodes), max(1, max_nodes)
    top = {hi // (2 ** i) for i in range(k)}
    return tuple(sorted(set(probe_counts(lo, hi, k)) | {n for n in top if lo <= n <= hi}))


def beyond_probe(min_nodes: int, max_nodes: int, known: Iterable[int]) -> int | None:
    """The count a job that borrows its profile's shape probes first: twice the largest count
    measured so far (by the profile or by the job), when the job may run there.  The shape
    says nothing reliable beyond what was measured (real curves have bumps the model smooths
    out), so one measurement there replaces an extrapolation; none when the job's range is
    covered (``2 · top > max_nodes``)."""
    top = max((n for n in known if n > 0), default=0)
    if top <= 0:
        return None
    n = 2 * top
    return n if max(1, min_nodes) <= n <= max_nodes else None


def profile_owner(profile: str) -> str:
    """Whose profile this is: the user of a per-user ``<user>/<profile>`` key; "" for the
    profiles an operator shares (and a job's private ``job-<id>``)."""
    return profile.split("/", 1)[0] if "/" in profile else ""


MIN_RATE = 1e-9      # samples/s: slower is no measurement (and keeps 1/rate finite)
MAX_RATE = 1e15


class Advisor:
    """Online throughput profiler for all malleable jobs.

    Samples must arrive in time order per job (older ones are rejected);
    the newest ``keep_per_count`` clean candidates per count are kept, so
    memory and refit cost stay bounded however long a job runs.
    """

    def __init__(self, *, warmup_samples: int = 1, min_samples: int = 2,
                 outlier_mad: float = 4.0, max_probes: int = 3,
                 keep_per_count: int = 64) -> None:
        self.warmup_samples = warmup_samples
        self.min_samples = min_samples
        self.outlier_mad = outlier_mad
        self.max_probes = max_probes
        self.keep_per_count = keep_per_count
        self._values: dict[str, dict[int, list[float]]] = defaultdict(dict)
        self._run: dict[str, tuple[int, int, float]] = {}   # job -> (nodes, run length, last t)
        self._profile: dict[str, str] = {}
        self._epoch: dict[str, int] = defaultdict(int)     # refit-worthy changes
        self._since_epoch: dict[str, int] = defaultdict(int)
        self._kept: dict[str, int] = defaultdict(int)
        self._measured: dict[str, tuple[int, dict[int, float]]] = {}
        self._fits: dict[str, tuple[int, ScalingFit | None]] = {}
        self._shapes: dict[str, tuple[tuple, ScalingFit | None]] = {}
        self._pooled: dict[str, dict[int, float]] = {}   # profile -> normalised medians
        self._members: dict[str, list[str]] = defaultdict(list)
        self._profile_epoch: dict[str, int] = defaultdict(int)  # bumps with full members
        # what a finished job leaves behind: its measured medians, if they shape its profile
        self._retired: dict[str, dict[str, dict[int, float]]] = {}
        self._retired_by_owner: dict[str, dict[str, None]] = {}   # owner -> their retired profiles, oldest first
        self.rejected = 0

    # -- input -----------------------------------------------------------
    def register(self, job_id: str, profile: str) -> None:
        old = self._profile.get(job_id)
        if old == profile:
            return
        if old is not None:
            self._members[old].remove(job_id)
            self._profile_epoch[old] += 1
        self._profile[job_id] = profile
        self._members[profile].append(job_id)
        self._profile_epoch[profile] += 1

    def version(self, job_id: str) -> tuple:
        """Changes when the job's curve should be refitted.

        A job's *epoch* advances when a count first has ``min_samples`` clean
        samples, or once it added a quarter more samples (at least 4) since the
        last epoch; a settled curve is not refitted for every new sample.  A job
        that still borrows its profile's shape (< 3 measured counts) also
        depends on the epochs of the profile's fully measured members.
        """
        if len(self.measured(job_id)) >= 3:
            return (self._epoch[job_id], None)
        return (self._epoch[job_id], self._shape_key(self._profile.get(job_id, "")))

    def _shape_key(self, profile: str) -> tuple:
        return (profile, self._profile_epoch[profile]) if profile else ()

    def _full_members(self, profile: str) -> list[str]:
        return sorted(j for j in self._members.get(profile, ()) if len(self.measured(j)) >= 3)

    # -- forgetting ------------------------------------------------------
    MAX_RETIRED_PER_PROFILE = 32
    MAX_RETIRED_PROFILES = 4096
    MAX_RETIRED_PROFILES_PER_OWNER = 64

    def forget(self, job_id: str) -> None:
        """Drop everything about a finished job.  What the advisor still needs of it — its
        measured medians, when it has the 3 counts that shape its profile — is kept as a
        retired member of the profile (the newest ``MAX_RETIRED_PER_PROFILE`` per profile),
        so the profile's prior is the same as before.  The store of retired profiles is shared
        by every user, so it is kept per owner (:func:`profile_owner`): at most
        ``MAX_RETIRED_PROFILES_PER_OWNER`` profiles each (an owner's oldest go first), and when
        ``MAX_RETIRED_PROFILES`` are kept in all, the owner keeping the most loses their oldest:
        one user's thousands of profiles cannot push another user's out.  A job's private
        profile (``job-<id>``, no profile in its tag) is never kept: no other job can use it."""
        prof = self._profile.get(job_id, "")
        measured = self.measured(job_id) if job_id in self._values else {}
        if prof and prof != f"job-{job_id}" and len(measured) >= 3:
            self._retire(prof, job_id, dict(measured))
        if prof and job_id in self._members.get(prof, []):
            self._members[prof].remove(job_id)
            if not self._members[prof]:
                del self._members[prof]
                if prof not in self._retired:       # nothing left of the profile
                    self._shapes.pop(prof, None)
                    self._pooled.pop(prof, None)
                    self._profile_epoch.pop(prof, None)
        per_job: tuple[dict[str, Any], ...] = (self._values, self._run, self._profile, self._epoch,
                                                self._since_epoch, self._kept, self._measured, self._fits)
        for table in per_job:
            table.pop(job_id, None)

    def _retire(self, prof: str, job_id: str, measured: dict[int, float]) -> None:
        kept = self._retired.pop(prof, {})
        kept.pop(job_id, None)
        kept[job_id] = measured
        while len(kept) > self.MAX_RETIRED_PER_PROFILE:
            del kept[next(iter(kept))]
            self._profile_epoch[prof] += 1
        self._retired[prof] = kept
        owner = profile_owner(prof)
        mine = self._retired_by_owner.setdefault(owner, {})
        mine.pop(prof, None)                    # re-inserted: an owner's newest profile last
        mine[prof] = None
        while len(mine) > self.MAX_RETIRED_PROFILES_PER_OWNER:
            self._drop_retired(next(iter(mine)))
        while len(self._retired) > self.MAX_RETIRED_PROFILES:
            top = max(self._retired_by_owner, key=lambda o: (len(self._retired_by_owner[o]), o))
            self._drop_retired(next(iter(self._retired_by_owner[top])))   # the oldest of who keeps most

    def _drop_retired(self, prof: str) -> None:
        del self._retired[prof]
        owner = profile_owner(prof)
        mine = self._retired_by_owner[owner]
        del mine[prof]
        if not mine:
            del self._retired_by_owner[owner]
        self._profile_epoch[prof] += 1
        if not self._members.get(prof):              # nothing left of the profile
            self._shapes.pop(prof, None)
            self._pooled.pop(prof, None)

    def retired(self) -> dict[str, dict[str, dict[int, float]]]:
        """The retired members per profile (for the daemon to persist)."""
        return {p: {j: dict(m) for j, m in js.items()} for p, js in self._retired.items()}

    def load_retired(self, data: dict) -> None:
        """Retired members as :meth:`retired` gave them (a store of an older version too: every
        bound is applied again, private ``job-<id>`` profiles are dropped)."""
        for prof, jobs in data.items():
            for job, m in list(jobs.items())[-self.MAX_RETIRED_PER_PROFILE:]:
                if str(prof) != f"job-{job}":
                    self._retire(str(prof), str(job), {int(n): float(x) for n, x in m.items()})
            self._profile_epoch[str(prof)] += 1

    def add(self, sample: Sample) -> bool:
        """Record one sample; returns False (and counts it) when rejected."""
        x, n = sample.samples_per_s, sample.nodes
        if (isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_NODES
                or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                or not MIN_RATE <= x <= MAX_RATE or not math.isfinite(sample.t_s)):
            self.rejected += 1
            return False
        prev_n, run, last_t = self._run.get(sample.job_id, (0, 0, -math.inf))
        if sample.t_s < last_t:
            self.rejected += 1
            return False
        run = run + 1 if n == prev_n else 1
        self._run[sample.job_id] = (n, run, sample.t_s)
        if run <= self.warmup_samples:
            return True  # accepted, but a warm-up sample is not used for fitting
        job = sample.job_id
        vals = self._values[job].setdefault(n, [])
        vals.append(float(x))
        if len(vals) > self.keep_per_count:
            del vals[0]
        else:
            self._kept[job] += 1
        self._since_epoch[job] += 1
        if (len(vals) == self.min_samples
                or self._since_epoch[job] >= max(4, self._kept[job] // 4)):
            self._epoch[job] += 1
            self._since_epoch[job] = 0
            prof = self._profile.get(job, "")
            if prof and len(self.measured(job)) >= 3:
                self._profile_epoch[prof] += 1   # the profile's shape may change
        return True

    def add_many(self, samples: Iterable[Sample]) -> int:
        return sum(1 for s in samples if self.add(s))

    # -- cleaning and fitting -------------------------------------------
    def clean(self, job_id: str) -> dict[int, list[float]]:
        """Per node count, the post-warm-up samples that are not outliers."""
        out: dict[int, list[float]] = {}
        for n, xs in self._values.get(job_id, {}).items():
            med = statistics.median(xs)
            mad = statistics.median(abs(x - med) for x in xs) * 1.4826
            keep = [x for x in xs if mad == 0 or abs(x - med) <= self.outlier_mad * mad]
            if len(keep) >= self.min_samples:
                out[n] = keep
        return out

    def measured(self, job_id: str) -> dict[int, float]:
        """Per measured node count, the median clean throughput."""
        v = self._epoch[job_id]
        hit = self._measured.get(job_id)
        if hit is None or hit[0] != v:
            hit = (v, {n: statistics.median(xs) for n, xs in sorted(self.clean(job_id).items())})
            self._measured[job_id] = hit
        return hit[1]

    def own_fit(self, job_id: str) -> ScalingFit | None:
        v = self._epoch[job_id]
        hit = self._fits.get(job_id)
        if hit is None or hit[0] != v:
            m = self.measured(job_id)
            hit = (v, fit_scaling(list(m), list(m.values()), terms=len(m)) if m else None)
            self._fits[job_id] = hit
        return hit[1]

    def shape(self, profile: str) -> ScalingFit | None:
        """The profile's shared shape: pooled over its jobs with ≥3 counts."""
        if not profile:
            return None
        key = self._shape_key(profile)
        hit = self._shapes.get(profile)
        if hit is not None and hit[0] == key:
            return hit[1]
        full = sorted([(j, self.measured(j)) for j in self._full_members(profile)]
                      + list(self._retired.get(profile, {}).items()))
        shape, pooled = None, {}
        if full:
            ref = max(full, key=lambda jm: (len(jm[1]), jm[0]))
            ref_fit = fit_scaling(list(ref[1]), list(ref[1].values()))
            counts, xs = [], []
            for _, m in full:   # normalise each job onto the reference scale
                k = statistics.median(ref_fit.time_per_sample(n) * x for n, x in m.items())
                counts += list(m)
                xs += [x / k for x in m.values()]
            shape = fit_scaling(counts, xs)
            by_count: dict[int, list[float]] = defaultdict(list)
            for n, x in zip(counts, xs):
                by_count[n].append(x)
            pooled = {n: statistics.median(v) for n, v in by_count.items()}
        self._shapes[profile] = (key, shape)
        self._pooled[profile] = pooled
        return shape
    # -- output ----------------------------------------------------------
    def curve(self, job_id: str, min_nodes: int, max_nodes: int,
              counts: Sequence[int], profile: str = "") -> Curve:
        """Predicted throughput at ``counts`` (band: :func:`jpa.model.band`)
        plus the next count to probe, if any."""
        self.register(job_id, profile or self._profile.get(job_id, ""))
        prof = self._profile.get(job_id, "")
        measured = self.measured(job_id)
        probe = None
        probes: tuple[int, ...] = ()
        fit = None
        source = "fit"
        anchors: dict[int, float] = dict(measured)
        shape = self.shape(prof)
        if len(measured) >= 3:
            fit = self.own_fit(job_id)
        elif shape is not None:
            # scale factor of this trial relative to the profile's reference
            k = (statistics.median(x * shape.time_per_sample(n) for n, x in measured.items())
                 if measured else 1.0)
            fit, source = (shape.rescaled(1.0 / k) if k > 0 else shape), "profile-prior"
            anchors = {n: k * x for n, x in self._pooled.get(prof, {}).items()}
            anchors.update(measured)
            probe = beyond_probe(min_nodes, max_nodes, anchors)
        else:
            wanted = [n for n in probe_counts(min_nodes, max_nodes, self.max_probes)
                      if n not in measured]
            probe = wanted[0] if wanted else None
            if probe is not None:
                probes = tuple(n for n in probe_ladder(min_nodes, max_nodes, self.max_probes)
                               if n not in measured)
            if measured:
                fit, source = self.own_fit(job_id), "partial-fit"
        if fit is None:
            return Curve(points={}, probe=probe, source="no-data", probes=probes)
        predict = anchored(fit, anchors)
        near = list(measured) or list(anchors) or list(fit.counts)
        points = {}
        for n in counts:
            if n <= 0:
                continue
            mean_fit, low, high = band(fit, n, near)
            mean = predict(n)
            r = mean / mean_fit if mean_fit > 0 else 1.0
            points[n] = CurvePoint(mean, low * r, high * r)
        return Curve(points=points, probe=probe, source=source, probes=probes,
                     measured=tuple(sorted(measured)))
