"""Slurm output → typed records; every version quirk stays in this module.

The daemon reads text formats (``squeue -o``/``sinfo -o`` with ``|``
separators and ``SLURM_TIME_FORMAT=%s`` epoch times): they are cheap, and
stable across releases.  **No user-controlled text is ever split into
records**: Slurm prints job names and comments raw, newlines and ``|``
included, so the queue-wide read (:data:`SQUEUE_FORMAT`) holds only fields
Slurm itself writes (ids, states, reasons, counts, node lists, times, the
owner) and every line must match them exactly.  A job's comment (its tag) is
read alone, with ``squeue -j JOB`` and the comment as the last field
(:data:`TAG_FORMAT`): everything after the third ``|`` of that one record
is the comment, whatever it contains (:func:`parse_tag_record`).  :func:`jobs_from_json` and :func:`nodes_from_json`
normalise ``--json`` output into the same records, for tools reading JSON;
its shapes differ by version:

===========  ===============================  ===================================
field        22.05 (openapi v0.0.38)          23.11+ (v0.0.40 and later)
===========  ===============================  ===================================
job state    ``"RUNNING"``                    ``["RUNNING"]`` (a list of flags)
node state   ``"idle"`` + ``state_flags``     ``["IDLE", "PLANNED"]``
numbers      ``1700000000`` / ``0`` unset     ``{"set", "infinite", "number"}``
release      ``meta.Slurm.release``           ``meta.slurm.release``
===========  ===============================  ===================================

Job-state table (what the daemon makes of each Slurm state, cf. Parsl):

====================================================  =========================
Slurm                                                 malletrain
====================================================  =========================
PENDING held (JobHeld*, requeued in held state)       ``held``: waits for nodes
PENDING otherwise                                     ``pending``: released by us
                                                      (starting), or requeued by
                                                      preemption (held again)
CONFIGURING, RUNNING                                  ``running`` on its nodes
COMPLETING, REQUEUED, REQUEUE_HOLD, REQUEUE_FED,      ``moving``: nodes not
RESIZING, SUSPENDED, STOPPED, SIGNALING, STAGE_OUT,   harvestable, job pinned
RESV_DEL_HOLD, any state word not named here
COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL,     ``finished``: Slurm's
OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, SPECIAL_EXIT,     terminal states (what the
REVOKED, PREEMPTED (PreemptMode=CANCEL; under         safety net makes of each:
REQUEUE a preempted job goes back to PENDING)         daemon/recovery.py)
====================================================  =========================
"""
from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import quote, unquote

import hostlist

from malletrain.domain.errors import BackendError
from malletrain.domain.model import DEFAULT_NODE_TYPE, MAX_JOB_NODES, MAX_PAUSE_S


class Phase(enum.Enum):
    HELD = "held"
    PENDING = "pending"
    RUNNING = "running"
    MOVING = "moving"
    FINISHED = "finished"


_RUNNING = {"RUNNING", "CONFIGURING"}
_FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
             "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED", "PREEMPTED"}


def is_held(reason: str) -> bool:
    """JobHeldUser/JobHeldAdmin (hold, --hold) or 'job requeued in held state' (requeuehold)."""
    return reason.startswith("JobHeld") or "held state" in reason


def phase_of(state: str, reason: str) -> Phase:
    state = state.upper()
    if state == "PENDING":
        return Phase.HELD if is_held(reason) else Phase.PENDING
    if state in _RUNNING:
        return Phase.RUNNING
    if state in _FINISHED:
        return Phase.FINISHED
    return Phase.MOVING


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    partition: str
    state: str
    reason: str
    node_count: int
    nodes: tuple[str, ...]
    start_s: float | None        # actual (running) or planned (pending) start
    sched_nodes: tuple[str, ...]  # nodes a pending job is planned on
    submit_s: float | None
    user: str
    uid: int | None = None       # the owner's uid (``%U``)
    name: str = ""               # user text: only from JSON or the job's tag, never split
    comment: str = ""
    restarts: int = 0
    plain: bool = True           # not an array or heterogeneous job (only plain jobs are adopted)
    run_id: str = ""             # this run's own id where Slurm gives one (26.05+: sluid; versions.py)
    array_id: str = ""           # an array task (``%i`` is ``ARRAY_TASK``) or an array's pending tasks: its array
    task: int = -1               # ... and its task id (-1: not one array task: ``squeue -r`` shows each)
    tasks: str = ""              # an array's pending tasks on one line (``%i`` ``A_[0-3,7]``): that list, as shown

    @property
    def spec(self) -> str:
        """The id Slurm's commands take for this record: ``ARRAY_TASK`` for an array task (an
        array's pending tasks share the array's own job id until one is started), else the id."""
        return f"{self.array_id}_{self.task}" if self.array_id else self.job_id

    @cached_property
    def phase(self) -> Phase:
        """Worked out once per record (a cycle asks it of every queued job several times)."""
        return phase_of(self.state, self.reason)


@dataclass(frozen=True)
class NodeRecord:
    name: str
    states: frozenset[str]     # upper-case base state and flags, e.g. {"IDLE", "PLANNED"}
    gres: str = ""
    features: str = ""

    @property
    def harvestable(self) -> bool:
        """IDLE and none of PLANNED/RESERVED/DRAIN/DOWN/… and responding."""
        return self.states == {"IDLE"}

    @property
    def node_type(self) -> str:
        for part in self.gres.split(","):
            bits = part.split("(")[0].split(":")
            if bits[0] == "gpu" and len(bits) == 3:
                return bits[1]
        return DEFAULT_NODE_TYPE


@dataclass(frozen=True)
class Reservation:
    name: str
    start_s: float
    end_s: float
    nodes: tuple[str, ...]


def expand(nodelist: str) -> tuple[str, ...]:
    nodelist = nodelist.strip()
    if not nodelist or nodelist in ("(null)", "None", "N/A"):
        return ()
    try:
        return tuple(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist as exc:
        raise BackendError(f"bad Slurm node list {nodelist!r}: {exc}") from None


def collect(nodes: Iterable[str]) -> str:
    return hostlist.collect_hostlist(list(nodes))


def _epoch(text: str) -> float | None:
    text = text.strip()
    if not text or text in ("N/A", "(null)", "None", "Unknown", "0"):
        return None
    try:
        return float(text)
    except ValueError:
        raise BackendError(f"expected epoch seconds (SLURM_TIME_FORMAT=%s), got {text!r}") from None


def _null(text: str) -> str:
    text = text.strip()
    return "" if text == "(null)" else text


# ---------------------------------------------------------------- text formats

SQUEUE_FORMAT = "%A|%i|%P|%T|%r|%D|%N|%S|%Y|%V|%u|%U"   # Slurm-written fields only
TAG_FORMAT = "%i|%U|%P|%k"                        # one job; the comment last, read whole
SINFO_FORMAT = "%N|%T|%G|%f"

_NODE_SUFFIX = "*~#!%$@^-"

# What each Slurm-written field may look like; a line that does not match is
# not a record (no user can produce one: none of these fields holds user text).
# ``%A`` is the plain numeric job id; ``%i`` shows arrays and heterogeneous jobs (``12_3``,
# ``12+1``, and ``12_[1-2,5,8-20:4%2]``: an array's pending tasks on one line, the throttle
# after '%').  How much of that task list Slurm prints is SLURM_BITSTR_LEN, which the runner
# sets to TASKS_SHOWN_MAX with elastic groups on: a longer list is cut to that length - 1, ending
# in "..." as seen on 22.05, 24.11 and 26.05 (squeue's merge of several pending records cuts with
# no mark, and unset, %i is cut at 31 characters with no mark).  A list with "..." or as long as
# the cut is no list of tasks (:func:`array_tasks`): the line still tells an array from a plain job.
_ID = re.compile(r"\d{1,12}")
TASKS_SHOWN_MAX = 65536
_SHOWN_ID = re.compile(rf"[0-9_\[\]\-,:%+.]{{1,{TASKS_SHOWN_MAX + 40}}}")
_TASK = re.compile(r"(\d{1,12})_(\d{1,7})")       # one array task, as ``squeue -r`` shows each
_ARRAY = re.compile(r"(\d{1,12})_\[([0-9,:\-.]*)")  # an array's pending tasks, one line without ``-r``
_TASK_ITEM = re.compile(r"(\d{1,7})(?:-(\d{1,7})(?::(\d{1,7}))?)?")
_WORD = re.compile(r"[A-Z_]{1,40}")
_PARTS = re.compile(r"[A-Za-z0-9_.,\-]{1,400}")
_NODES = re.compile(r"[A-Za-z0-9_.,\-\[\]()]{0,100000}")
_REASON = re.compile(r"[ -{}~]{0,4096}")          # printable ASCII but '|' (reasons list down nodes)
_NUM = re.compile(r"\d{1,12}|N/A|\(null\)|None|Unknown|")
_USER = re.compile(r"[A-Za-z0-9_.@\-$]{1,64}|\(null\)|\d{1,10}")
_FIELDS = (_ID, _SHOWN_ID, _PARTS, _WORD, _REASON, re.compile(r"\d{1,9}"), _NODES, _NUM, _NODES, _NUM,
           _USER, re.compile(r"\d{1,10}"))
# one pattern for the whole line (no field can hold '|'): one match per job
_LINE = re.compile(r"\|".join(rf"[ \t]*({rx.pattern})[ \t]*" for rx in _FIELDS))


def parse_squeue(text: str, bad: list[str] | None = None) -> list[JobRecord]:
    """:data:`SQUEUE_FORMAT` lines → records.  A line that is not exactly one record is an
    error, or, when ``bad`` is given, left out and appended there (the daemon counts and logs
    it: one odd line must not stop the service for every job)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            if bad is None:
                raise BackendError(f"unexpected squeue line (want {len(_FIELDS)} Slurm fields): {line[:200]!r}")
            bad.append(line[:200])
            continue
        jid, shown, part, state, reason, count, nodes, start, sched, submit, user, uid = m.groups()
        task = _TASK.fullmatch(shown) or _ARRAY.match(shown)
        try:
            out.append(JobRecord(jid, part, state, _null(reason), int(count), expand(nodes), _epoch(start),
                                 expand(sched), _epoch(submit), _null(user), int(uid), plain=shown == jid,
                                 array_id=task.group(1) if task else "",
                                 task=int(task.group(2)) if task and task.re is _TASK else -1,
                                 tasks=task.group(2) if task and task.re is _ARRAY and shown.endswith("]") else ""))
        except BackendError:
            if bad is None:
                raise
            bad.append(line[:200])
    return out


def array_tasks(shown: str, limit: int) -> tuple[int, ...] | None:
    """The task ids of an array's task list as squeue prints it (``0-3,7,10-20:5``), in order;
    None when it holds more than ``limit`` tasks, is no such list, or was cut short ("..." or as
    long as SLURM_BITSTR_LEN lets Slurm print).  The count is known before any id is made:
    bounded time and memory whatever the list."""
    if not shown or len(shown) >= TASKS_SHOWN_MAX - 1:
        return None
    spans: list[range] = []
    total = 0
    for item in shown.split(","):
        m = _TASK_ITEM.fullmatch(item)
        if m is None:
            return None
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        step = int(m.group(3)) if m.group(3) else 1
        if last < first or step < 1:
            return None
        span = range(first, last + 1, step)
        total += len(span)
        if total > limit:
            return None
        spans.append(span)
    return tuple(sorted({t for span in spans for t in span}))


def all_held(reasons: str) -> bool:
    """Whether every reason of an array's one line of pending tasks (squeue joins theirs with
    ',') is a hold.  A reason that holds a comma itself (``ReqNodeNotAvail, UnavailableNodes:…``)
    splits into parts that are no hold: never taken for one."""
    return all(is_held(part.strip()) for part in reasons.split(","))


@dataclass(frozen=True)
class TagRecord:
    """One job's owner, partition and comment, read alone (:data:`TAG_FORMAT`)."""

    job_id: str
    uid: int
    partition: str
    comment: str


def parse_tag_record(job_id: str, text: str) -> TagRecord | None:
    """``squeue -h -j JOB -o TAG_FORMAT`` output → the record, None when the job is gone.

    The output is one record whose last field is the comment: whatever follows
    the third ``|`` (newlines, ``|``, forged records) belongs to the comment.
    """
    if not text.strip():
        return None
    if text.endswith("\n"):
        text = text[:-1]
    parts = text.split("|", 3)
    if (len(parts) != 4 or parts[0] != job_id or not parts[1].isdigit()
            or not _PARTS.fullmatch(parts[2])):
        raise BackendError(f"unexpected squeue record for job {job_id}: {text[:200]!r}")
    return TagRecord(job_id, int(parts[1]), parts[2], _null(parts[3]))


def parse_sinfo(text: str) -> list[NodeRecord]:
    out: dict[str, NodeRecord] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 4:
            raise BackendError(f"unexpected sinfo line (want 4 fields): {line!r}")
        name, state, gres, feat = parts
        out[name] = NodeRecord(name, _text_states(state), _null(gres), _null(feat))
    return list(out.values())


def _text_states(state: str) -> frozenset[str]:
    state = state.strip().lower()
    flags = {"NOT_RESPONDING"} if "*" in state else set()
    if "~" in state:
        flags.add("POWERED_DOWN")
    if "$" in state:
        flags.add("MAINTENANCE")
    if "@" in state:
        flags.add("REBOOT_REQUESTED")
    base = state.rstrip(_NODE_SUFFIX)
    for word in base.split("+"):
        word = {"drained": "drain", "draining": "drain", "alloc": "allocated",
                "resv": "reserved", "comp": "completing", "plnd": "planned"}.get(word, word)
        flags.add(word.upper())
    return frozenset(flags)


def parse_reservations(text: str) -> list[Reservation]:
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No reservations"):
            continue
        kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        try:
            out.append(Reservation(kv.get("ReservationName", "?"), float(kv["StartTime"]),
                                   float(kv["EndTime"]), expand(kv.get("Nodes", ""))))
        except (KeyError, ValueError):
            raise BackendError(f"unexpected reservation line: {line!r}") from None
    return out


# ---------------------------------------------------------------- JSON formats

def number(value: Any) -> float | None:
    """22.05 plain numbers and 23.11+ ``{set, infinite, number}`` → float or None."""
    if isinstance(value, Mapping):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _states(value: Any, flags: Any = ()) -> list[str]:
    if isinstance(value, str):
        value = [value]
    return [str(s).upper() for s in list(value or []) + list(flags or [])]


def release(data: Mapping) -> str:
    meta = data.get("meta", {})
    slurm = meta.get("Slurm") or meta.get("slurm") or {}
    return str(slurm.get("release", ""))


def jobs_from_json(data: Mapping) -> list[JobRecord]:
    out = []
    for j in data.get("jobs", []):
        states = _states(j.get("job_state"))
        state = states[0] if states else "UNKNOWN"
        start = number(j.get("start_time"))
        sched = j.get("scheduled_nodes") or ""
        out.append(JobRecord(
            str(j["job_id"]), j.get("partition", ""), state, j.get("state_reason", "") or "",
            int(number(j.get("node_count")) or 0), expand(j.get("nodes") or ""),
            start if start else None, expand(sched), number(j.get("submit_time")),
            j.get("user_name", ""), uid=_int_or_none(number(j.get("user_id"))), name=j.get("name", ""),
            comment=j.get("comment") or "", restarts=int(number(j.get("restart_cnt")) or 0),
            run_id=_sluid(j)))
    return out


def _sluid(job: Mapping) -> str:
    step = job.get("step_id")
    return str(step.get("sluid") or "") if isinstance(step, Mapping) else ""


def _int_or_none(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None


def nodes_from_json(data: Mapping) -> list[NodeRecord]:
    """``sinfo --json``: a ``nodes`` list (22.05, also ``scontrol show nodes --json``) or, from
    23.02, ``sinfo`` groups of nodes sharing a partition and state (versions.py).  One record
    per node, in first-seen order."""
    if "sinfo" in data:
        return _nodes_from_groups(data["sinfo"])
    out = []
    for n in data.get("nodes", []):
        feats = n.get("features", "")
        if isinstance(feats, list):
            feats = ",".join(feats)
        out.append(NodeRecord(n["name"], frozenset(_states(n.get("state"), n.get("state_flags"))),
                              n.get("gres", "") or "", feats or ""))
    return out


def _nodes_from_groups(groups: Any) -> list[NodeRecord]:
    seen: dict[str, NodeRecord] = {}
    for g in groups or []:
        gres = g.get("gres", {})
        feats = g.get("features", {})
        for name in (g.get("nodes") or {}).get("nodes") or []:
            if name not in seen:
                seen[name] = NodeRecord(
                    name, frozenset(_states((g.get("node") or {}).get("state"))),
                    (gres.get("total") if isinstance(gres, Mapping) else gres) or "",
                    (feats.get("active") if isinstance(feats, Mapping) else feats) or "")
    return list(seen.values())


# ---------------------------------------------------------------- the job tag

TAG = "malletrain:v1"
MAX_TAG_BYTES = 4096         # a longer comment is not a tag
MAX_TAG_NODES = MAX_JOB_NODES    # min/max beyond this are not a tag (the daemon clamps to its pool)
MAX_TAG_PAUSE_S = MAX_PAUSE_S    # rescale pauses beyond this are not a tag (the config clamps lower)
_TOKEN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_PROFILE = re.compile(r"[A-Za-z0-9_.\-]{0,64}")


@dataclass(frozen=True)
class Tag:
    """What ``malletrain submit`` writes into ``--comment``: the job's spec.

    The daemon re-adopts jobs from Slurm alone, so the spec travels with the
    job.  ``token`` makes submissions idempotent.  Everything in it comes from
    the job's owner: :func:`parse_tag` accepts only bounded, finite values, a
    plain profile name and an absolute, normalised metrics directory.
    """

    token: str
    min_nodes: int
    max_nodes: int
    profile: str = ""
    rescale_up_s: float = 0.0
    rescale_down_s: float = 0.0
    metrics_dir: str = ""
    name: str = ""
    group: bool = False     # an elastic group: a held array of 1-node members (issue #26)

    def encode(self) -> str:
        fields = [("token", self.token), ("min", self.min_nodes), ("max", self.max_nodes),
                  ("profile", self.profile), ("up", self.rescale_up_s),
                  ("down", self.rescale_down_s), ("metrics", self.metrics_dir)]
        if self.name:
            fields.append(("name", self.name))
        if self.group:
            fields.append(("group", 1))
        return TAG + " " + " ".join(f"{k}={quote(str(v), safe='/.-_')}" for k, v in fields)


def tag_problem(tag: Tag) -> str | None:
    """Why ``tag`` is not acceptable, or None (shared by ``submit`` and the daemon)."""
    if not _TOKEN.fullmatch(tag.token):
        return "token: 1-64 characters of A-Z a-z 0-9 _ . -"
    if not (1 <= tag.min_nodes <= tag.max_nodes <= MAX_TAG_NODES):
        return f"need 1 <= min nodes <= max nodes <= {MAX_TAG_NODES}"
    for what, v in (("rescale-up", tag.rescale_up_s), ("rescale-down", tag.rescale_down_s)):
        if not (math.isfinite(v) and 0 <= v <= MAX_TAG_PAUSE_S):
            return f"{what}: need a finite number of seconds in [0, {MAX_TAG_PAUSE_S:g}]"
    if not _PROFILE.fullmatch(tag.profile):
        return "profile: at most 64 characters of A-Z a-z 0-9 _ . -"
    d = tag.metrics_dir
    if d and not (d.startswith("/") and len(d) <= 1024 and d.isprintable()
                  and all(c not in ("", ".", "..") for c in d.split("/")[1:]) or d == "/"):
        return "metrics dir: an absolute, normalised path of printable characters (<= 1024)"
    if len(tag.name) > 256 or not tag.name.isprintable():
        return "name: at most 256 printable characters"
    return None


def parse_tag(comment: str) -> Tag | None:
    """The tag in a job's comment, or None when the job is not (validly) malleable."""
    if not comment.startswith(TAG + " ") or len(comment) > MAX_TAG_BYTES or not comment.isprintable():
        return None
    try:
        kv = dict(tok.split("=", 1) for tok in comment[len(TAG) + 1:].split(" ") if tok)
        kv = {k: unquote(v, errors="strict") for k, v in kv.items()}
        ints = [kv["min"], kv["max"]]
        if not all(x.isdigit() and len(x) <= 7 for x in ints):
            return None
        if kv.get("group", "0") not in ("0", "1"):
            return None
        tag = Tag(kv["token"], int(ints[0]), int(ints[1]), kv.get("profile", ""),
                  float(kv.get("up", 0)), float(kv.get("down", 0)), kv.get("metrics", ""),
                  kv.get("name", ""), group=kv.get("group") == "1")
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    return None if tag_problem(tag) else tag


def parse_topology(text: str) -> dict[str, str]:
    """``scontrol show topology`` → node -> its leaf switch (``SwitchName=s1 Level=0 ... Nodes=n[1-2]``
    lines; upper levels list ``Switches=`` and are left out).  Text without switches (no topology
    plugin) gives {}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        name, nodes = fields.get("SwitchName"), fields.get("Nodes")
        if not name or not nodes or fields.get("Level", "0") != "0":
            continue
        try:
            for n in expand(nodes):
                out.setdefault(n, name)
        except BackendError:
            continue
    return out


LIMITS_FORMAT = "User,GrpTRES"      # sacctmgr -nP show assoc ... format=LIMITS_FORMAT
_NODE_TRES = re.compile(r"(?:^|,)node=(\d{1,9})(?:,|$)")


def parse_node_limits(text: str, users: Iterable[str]) -> dict[str, int]:
    """Each user's association ``GrpTRES`` node limit (the smallest where a user has several
    associations) from ``sacctmgr -nP show assoc where users=… format=User,GrpTRES``.  Only
    the users asked about count; a line of another shape is skipped (the limit stays unknown
    for nobody: the smallest seen wins)."""
    wanted = set(users)
    out: dict[str, int] = {}
    for line in text.splitlines():
        user, sep, tres = line.partition("|")
        if not sep or user not in wanted:
            continue
        m = _NODE_TRES.search(tres.strip())
        if m:
            out[user] = min(out.get(user, 1 << 30), int(m.group(1)))
    return out

