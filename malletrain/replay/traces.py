"""Primary-workload traces → node-level busy/idle event streams.

Three formats (DESIGN.md): the node-event CSV(.gz), SWF job logs, and Slurm
accounting exports (``sacct --parsable2 --format JobID,Start,End,NodeList,State``).
All become a :class:`NodeTrace`: node names in trace order, each node's state
at ``start_s``, and the later changes as NumPy arrays sorted by time.
Malformed input raises :class:`InputError` naming the file, line and field.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

import hostlist
import numpy as np

from malletrain.domain.errors import InputError
from malletrain.domain.model import MAX_NODES  # a trace (or one SWF job) needing more is refused
from malletrain.domain.text import clipped
from malletrain.domain.timeutil import parse_time

FORMATS = ("auto", "events", "swf", "sacct")
GZIP_MAGIC = b"\x1f\x8b"
MAX_SWF_SECONDS = 1e12       # SWF times and durations beyond this (~31,700 years) are typos


@dataclass
class NodeTrace:
    nodes: list[str]
    start_s: float
    end_s: float
    initial_busy: np.ndarray   # bool per node
    times: np.ndarray          # float64, non-decreasing
    node_idx: np.ndarray       # int32
    busy: np.ndarray           # bool: new state is busy
    skipped_jobs: int = 0      # SWF/sacct jobs without usable times or nodes
    path: str | None = None    # the file it came from (for error messages)
    # sacct: jobs of the harvest partition left out (their nodes were idle to the primary
    # scheduler); an elastic group's members (array tasks) count as their one job
    harvest_jobs: int = 0
    harvest_members: int = 0   # of their allocations, the array tasks that ran (group members)

    @property
    def n_events(self) -> int:
        return len(self.times)


def _open_text(path: str) -> io.TextIOBase:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # a FIFO or /dev/zero would never end
            raise InputError("cannot read trace: not a regular file", path=path)
        if _is_gzip(path):
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read trace: {exc.strerror}", path=path) from exc


@contextlib.contextmanager
def _reading(path: str) -> Iterator[io.TextIOBase]:
    """The trace opened as text; bytes that are not UTF-8 and corrupt or truncated gzip data
    met while reading raise :class:`InputError` naming the file (and the line)."""
    fh = _open_text(path)
    gz = isinstance(getattr(fh, "buffer", None), gzip.GzipFile)
    try:
        with fh:
            yield fh
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", path=path, line=_first_undecodable_line(path)) from None
    except (EOFError, OSError, zlib.error) as exc:   # BadGzipFile is an OSError
        what = "corrupt or truncated gzip data" if gz else "read error"
        raise InputError(f"{what} ({exc})", path=path) from None


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def _first_undecodable_line(path: str) -> int | None:
    try:
        with (gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")) as fh:
            for lineno, line in enumerate(fh, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    return lineno
    except (EOFError, OSError, zlib.error):
        pass
    return None


def detect_format(path: str) -> str:
    first = ""
    with _reading(path) as fh:
        for line in fh:
            if line.strip():
                first = line.strip()
                break
    if first.replace(" ", "").lower().startswith("time,node,state"):
        return "events"
    if first.startswith("JobID|"):
        return "sacct"
    if first.startswith(";") or len(first.split()) == 18:
        return "swf"
    raise InputError("unknown trace format: expected a 'time,node,state' header, an SWF log "
                     "or a sacct --parsable2 export (header starting 'JobID|')", path=path, line=1)


def load_trace(path: str, fmt: str = "auto", *, procs_per_node: int = 1,
               nodes: int | None = None, start: float | None = None,
               end: float | None = None, harvest_partitions: tuple[str, ...] = ()) -> NodeTrace:
    """``harvest_partitions`` (sacct exports only): the partitions malletrain harvested in; their
    jobs are left out (see :func:`_load_sacct`)."""
    if fmt not in FORMATS:
        raise InputError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if harvest_partitions and fmt != "sacct":
        raise InputError(f"a harvest partition can be left out of a sacct export only, not of a {fmt} trace",
                         path=path)
    if fmt == "events":
        trace = _load_events(path)
    elif fmt == "swf":
        trace = _load_swf(path, procs_per_node, nodes)
    else:
        trace = _load_sacct(path, frozenset(harvest_partitions))
    return replace(restrict(trace, nodes=nodes, start=start, end=end, path=path), path=path)


def restrict(trace: NodeTrace, *, nodes: int | None = None, start: float | None = None,
             end: float | None = None, path: str = "trace") -> NodeTrace:
    """Keep the first ``nodes`` nodes and the window [start, end)."""
    names, init = trace.nodes, trace.initial_busy.copy()
    t, idx, busy = trace.times, trace.node_idx, trace.busy
    if nodes is not None:
        if nodes <= 0:
            raise InputError(f"--nodes must be positive, got {nodes}")
        keep = idx < nodes
        names, init = names[:nodes], init[:nodes]
        t, idx, busy = t[keep], idx[keep], busy[keep]
    s0 = trace.start_s if start is None else start
    s1 = trace.end_s if end is None else end
    if s1 <= s0:
        raise InputError(f"empty time window: start {s0:.0f} >= end {s1:.0f}", path=path)
    if start is not None and start > trace.start_s:
        before = t < start
        for i, b in zip(idx[before], busy[before]):  # state at the window start
            init[i] = b
        t, idx, busy = t[~before], idx[~before], busy[~before]
    inside = t < s1
    return replace(trace, nodes=list(names), start_s=s0, end_s=s1, initial_busy=init, times=t[inside],
                   node_idx=idx[inside], busy=busy[inside])


# -- node-event CSV -------------------------------------------------------
def _load_events(path: str) -> NodeTrace:
    names: dict[str, int] = {}
    init: list[bool] = []
    times: list[float] = []
    idxs: list[int] = []
    states: list[bool] = []
    t0 = None
    last = -math.inf
    time_cache: dict[str, float] = {}
    with _reading(path) as fh:
        header = fh.readline().strip().replace(" ", "").lower()
        if header != "time,node,state":
            raise InputError(f"header must be 'time,node,state', got {header!r}", path=path, line=1)
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            parts = line.rstrip("\n\r").split(",")
            if len(parts) != 3:
                raise InputError(f"expected 3 comma-separated fields, got {len(parts)}",
                                 path=path, line=lineno)
            ts, node, state = parts[0].strip(), parts[1].strip(), parts[2].strip().lower()
            t = time_cache.get(ts)
            if t is None:
                try:
                    t = parse_time(ts)
                except ValueError:
                    raise InputError(f"unparseable time {clipped(ts)}", path=path, line=lineno,
                                     field="time") from None
                time_cache[ts] = t
            if t < last:
                raise InputError(f"rows are not sorted by time ({ts} comes after a later row)",
                                 path=path, line=lineno, field="time")
            last = t
            if not node:
                raise InputError("empty node name", path=path, line=lineno, field="node")
            if state not in ("idle", "busy"):
                raise InputError(f"state must be 'idle' or 'busy', got {state!r}",
                                 path=path, line=lineno, field="state")
            if t0 is None:
                t0 = t
            i = names.get(node)
            if t == t0:
                if i is None:
                    names[node] = len(init)
                    init.append(state == "busy")
                else:
                    init[i] = state == "busy"
                continue
            if i is None:
                raise InputError(f"node {node!r} first appears after the initial timestamp; the "
                                 "rows at the first timestamp must list every node",
                                 path=path, line=lineno, field="node")
            times.append(t)
            idxs.append(i)
            states.append(state == "busy")
            if len(time_cache) > 100_000:
                time_cache.clear()
    if t0 is None:
        raise InputError("no rows after the header", path=path)
    end = times[-1] + 1.0 if times else t0 + 1.0
    return NodeTrace(list(names), t0, end, np.array(init, dtype=bool), np.array(times, dtype=float),
                     np.array(idxs, dtype=np.int32), np.array(states, dtype=bool))


# -- SWF --------------------------------------------------------------------
def _load_swf(path: str, ppn: int, nodes_opt: int | None) -> NodeTrace:
    if ppn <= 0:
        raise InputError(f"--procs-per-node must be positive, got {ppn}")
    starts, ends, sizes = [], [], []
    header_nodes = None
    skipped = 0
    with _reading(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            s = line.strip()
            if not s:
                continue
            if s.startswith(";"):
                m = re.match(r";\s*Max(Nodes|Procs)\s*:\s*(\d+)", s)
                if m:
                    key, digits = f"Max{m.group(1)}", m.group(2)
                    n = int(digits) if len(digits) <= 15 else MAX_NODES * ppn + 1
                    need = n if key == "MaxNodes" else -(-n // ppn)
                    if need > MAX_NODES:
                        raise InputError(f"{clipped(digits)} is more than {MAX_NODES} nodes",
                                         path=path, line=lineno, field=key)
                    header_nodes = need if key == "MaxNodes" else header_nodes or need
                continue
            f = s.split()
            if len(f) != 18:
                raise InputError(f"SWF lines have 18 fields, this one has {len(f)}", path=path, line=lineno)
            try:
                submit, wait, run = float(f[1]), float(f[2]), float(f[3])
                procs = _swf_procs(f[4], path, lineno)
                if procs <= 0:                    # allocated unknown: the requested processors
                    procs = _swf_procs(f[7], path, lineno)
            except ValueError:
                raise InputError("non-numeric field", path=path, line=lineno) from None
            for key, v, text in (("submit time", submit, f[1]), ("wait time", wait, f[2]),
                                 ("run time", run, f[3])):
                if not abs(v) <= MAX_SWF_SECONDS:      # also NaN and ±inf
                    raise InputError(f"expected seconds within ±{MAX_SWF_SECONDS:g}, got {clipped(text)}",
                                     path=path, line=lineno, field=key)
            if submit < 0 or wait < 0 or run <= 0 or procs <= 0:
                skipped += 1
                continue
            size = -(-procs // ppn)
            if size > MAX_NODES:
                raise InputError(f"{procs} processors need {size} nodes, more than {MAX_NODES}",
                                 path=path, line=lineno, field="processors")
            starts.append(submit + wait)
            ends.append(submit + wait + run)
            sizes.append(size)
    if not starts:
        raise InputError("no usable jobs (need submit, wait, run time and processors)", path=path)
    return _assign_first_fit(np.array(starts), np.array(ends), np.array(sizes),
                             header_nodes, skipped, prefix="n", path=path)


def _swf_procs(text: str, path: str, lineno: int) -> int:
    """An SWF processor count (ValueError when not a number; InputError when not finite)."""
    v = float(text)
    if not math.isfinite(v):
        raise InputError(f"expected a processor count, got {clipped(text)}", path=path, line=lineno,
                         field="processors")
    return int(v)


def _assign_first_fit(starts, ends, sizes, cluster: int | None, skipped: int,
                      prefix: str, path: str = "trace") -> NodeTrace:
    """Give each job concrete nodes, lowest free index first, in time order."""
    order_ev = np.concatenate([ends, starts])
    kind = np.concatenate([np.zeros(len(ends), dtype=np.int8), np.ones(len(starts), dtype=np.int8)])
    job = np.concatenate([np.arange(len(ends)), np.arange(len(starts))])
    o = np.lexsort((kind, order_ev))          # by time, ends before starts
    deltas = np.where(kind[o] == 1, sizes[job[o]], -sizes[job[o]])
    peak = int(np.max(np.cumsum(deltas)))
    n = max(cluster or 0, peak)
    if n > MAX_NODES:
        raise InputError(f"the jobs hold {n} nodes at once, more than {MAX_NODES}", path=path)
    free = np.ones(n, dtype=bool)
    held: dict[int, np.ndarray] = {}
    t_out, i_out, b_out = [], [], []
    for k in o:
        j = job[k]
        if kind[k] == 0:
            got = held.pop(j, None)
            if got is None:
                continue
            free[got] = True
            t_out.append(np.full(len(got), ends[j]))
            i_out.append(got)
            b_out.append(np.zeros(len(got), dtype=bool))
        else:
            got = np.flatnonzero(free)[:sizes[j]].astype(np.int32)
            free[got] = False
            held[j] = got
            t_out.append(np.full(len(got), starts[j]))
            i_out.append(got)
            b_out.append(np.ones(len(got), dtype=bool))
    times = np.concatenate(t_out)
    width = len(str(n))
    names = [f"{prefix}{i:0{width}d}" for i in range(n)]
    return NodeTrace(names, float(times.min()), float(times.max()) + 1.0, np.zeros(n, dtype=bool),
                     times, np.concatenate(i_out).astype(np.int32), np.concatenate(b_out), skipped)


# -- sacct export ----------------------------------------------------------
SACCT_FIELDS = ("JobID", "Start", "End", "NodeList", "State")


# sacct's JobID of one array task, ARRAY_TASK, or of its pending tasks merged, ARRAY_[3-5]; a
# heterogeneous job's components, JOB+K, are one job too
_ARRAY_TASK = re.compile(r"(\d+)_(?:\d+|\[[0-9,\-%]*\])")
_HET_PART = re.compile(r"(\d+)\+\d+")


def _load_sacct(path: str, harvest: frozenset[str] = frozenset()) -> NodeTrace:
    """Busy intervals per node from the export's allocations (job steps are left out).

    ``harvest``: the partitions malletrain harvested in (needs a ``Partition`` column).  Their
    jobs ran on nodes the primary scheduler had left idle, so they are not busy time: they are
    left out and counted (:attr:`NodeTrace.harvest_jobs`).  An elastic group (issue #26) shows as
    one allocation per member, each an array task ``ARRAY_TASK`` on one node; its members count
    as the one job they are."""
    intervals: list[tuple[float, float, list[str]]] = []
    skipped = 0
    harvest_ids: set[str] = set()
    harvested: list[tuple[int, str]] = []     # (line, node list) of the harvest partition's jobs
    members = 0
    with _reading(path) as fh:
        header = fh.readline().strip().split("|")
        missing = [k for k in (*SACCT_FIELDS, *(("Partition",) if harvest else ())) if k not in header]
        if missing:
            raise InputError(f"sacct header lacks {', '.join(missing)} (need "
                             f"--format {','.join(SACCT_FIELDS)}{',Partition' if harvest else ''} --parsable2)",
                             path=path, line=1, field=missing[0])
        col = {k: header.index(k) for k in SACCT_FIELDS}
        part = header.index("Partition") if harvest else -1
        rows = []
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            f = line.rstrip("\n\r").split("|")
            if len(f) < len(header):
                raise InputError(f"expected {len(header)} '|'-separated fields, got {len(f)}",
                                 path=path, line=lineno)
            jid = f[col["JobID"]]
            if "." in jid:
                continue  # a job step; allocations only
            if part >= 0 and harvest.intersection(f[part].strip().split(",")):
                task = _ARRAY_TASK.fullmatch(jid.strip())
                members += task is not None and f[col["Start"]].strip() not in ("Unknown", "None", "")
                if len(harvest_ids) < MAX_NODES:
                    one = task or _HET_PART.fullmatch(jid.strip())
                    harvest_ids.add(one.group(1) if one else jid.strip())
                harvested.append((lineno, f[col["NodeList"]].strip()))
                continue  # malletrain's own: its nodes were idle to the primary scheduler
            rows.append((lineno, f))
    t_max = -math.inf
    for lineno, f in rows:
        for key in ("Start", "End"):
            v = f[col[key]].strip()
            if v not in ("Unknown", "None", ""):
                try:
                    t_max = max(t_max, parse_time(v))
                except ValueError:
                    raise InputError(f"unparseable time {clipped(v)}", path=path, line=lineno,
                                     field=key) from None
    for lineno, f in rows:
        s, e, nl = f[col["Start"]].strip(), f[col["End"]].strip(), f[col["NodeList"]].strip()
        if s in ("Unknown", "None", "") or nl in ("", "None", "None assigned", "(null)"):
            skipped += 1
            continue
        t0 = parse_time(s)
        t1 = t_max if e in ("Unknown", "None", "") else parse_time(e)  # still running
        if t1 <= t0:
            skipped += 1
            continue
        try:
            names = hostlist.expand_hostlist(nl)
        except hostlist.BadHostlist as exc:
            raise InputError(f"bad hostlist {nl!r}: {exc}", path=path, line=lineno,
                             field="NodeList") from None
        intervals.append((t0, t1, names))
    if not intervals:
        raise InputError("no job with a start time and a node list" +
                         (f" outside the harvest partition(s) {', '.join(sorted(harvest))}" if harvest else ""),
                         path=path)
    index: dict[str, int] = {}
    per_node: dict[int, list[tuple[float, float]]] = {}
    for t0, t1, names in sorted(intervals, key=lambda x: x[0]):
        for nm in names:
            i = index.setdefault(nm, len(index))
            per_node.setdefault(i, []).append((t0, t1))
    for lineno, nl in harvested:      # nodes only malletrain ran on: in the trace, idle throughout
        if nl in ("", "None", "None assigned", "(null)"):
            continue
        try:
            for nm in hostlist.expand_hostlist(nl):
                if len(index) >= MAX_NODES:
                    raise InputError(f"more than {MAX_NODES} nodes", path=path, line=lineno, field="NodeList")
                index.setdefault(nm, len(index))
        except hostlist.BadHostlist as exc:
            raise InputError(f"bad hostlist {clipped(nl)}: {exc}", path=path, line=lineno,
                             field="NodeList") from None
    start = min(iv[0] for iv in intervals)
    init = np.zeros(len(index), dtype=bool)
    t_out, i_out, b_out = [], [], []
    for i, ivs in per_node.items():
        merged: list[list[float]] = []
        for a, b in sorted(ivs):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        for a, b in merged:
            if a <= start:
                init[i] = True
            else:
                t_out.append(a)
                i_out.append(i)
                b_out.append(True)
            t_out.append(b)
            i_out.append(i)
            b_out.append(False)
    t = np.array(t_out)
    o = np.lexsort((np.array(b_out), t))   # idle before busy at one instant
    return NodeTrace(list(index), start, float(t.max()) + 1.0, init, t[o],
                     np.array(i_out, dtype=np.int32)[o], np.array(b_out, dtype=bool)[o], skipped,
                     harvest_jobs=len(harvest_ids), harvest_members=members)
