"""The Slurm CLI backend: the backend protocol on a real Slurm cluster.

``observe`` costs at most three read commands in a steady cycle: one
``squeue`` (all jobs), one ``sinfo`` (the harvest partition's nodes) and,
every ``reservations_every`` cycles, one ``scontrol show reservation``.

``apply`` rescales jobs while keeping their ids (DESIGN.md, SLURM-NOTES.md):
``requeuehold`` every job that stops, grows or shrinks → wait until they have
left COMPLETING (one ``squeue -j`` per poll) → ``scontrol update NumNodes=k-k
ReqNodeList=… StartTime=now`` → ``scontrol release``.  A job that fails a
step is logged and left held; the next cycle decides again from what Slurm
says.  The per-job book (launching nodes, last change, pause) is written
ahead to the store before each step, so a daemon killed mid-cycle neither
loses nor duplicates anything.

Trust (SECURITY.md): the queue-wide read holds no user text; a job's tag
(its comment) is read alone when the job first appears in the harvest
partition, at most ``max_tag_reads`` per cycle, round-robin over owners so
one user's flood cannot delay the others.  Right before every write the job's
id, owner, partition and tag are read again and must match what the plan was
made from, or the write is refused, logged and counted.  Profiles are per
user (``<user>/<profile>``) unless the config declares them shared; node
counts are clamped to the partition, rescale pauses to the config's maximum.

Proactive vacate: a node that a pending primary job is planned on (or a
reservation starts on) within ``vacate_lead_s`` leaves the harvestable pool,
so the plan shrinks or stops the malleable job holding it before Slurm has
to preempt it.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from malletrain.core.backend import JobFacts, Observation, SizeChange
from malletrain.domain.config import DaemonConfig, SlurmConfig
from malletrain.domain.errors import BackendError, ConfigError
from malletrain.domain.model import (
    DEFAULT_NODE_TYPE,
    Action,
    ActionKind,
    Direction,
    JobSpec,
    JobState,
    Node,
    Snapshot,
)
from malletrain.domain.nodes import load_node_info
from malletrain.slurm import groups as grp
from malletrain.slurm.parse import (
    LIMITS_FORMAT,
    MAX_TAG_BYTES,
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    TAG_FORMAT,
    JobRecord,
    NodeRecord,
    Phase,
    Reservation,
    Tag,
    TagRecord,
    collect,
    is_held,
    parse_node_limits,
    parse_reservations,
    parse_sinfo,
    parse_squeue,
    parse_tag,
    parse_tag_record,
    parse_topology,
)
from malletrain.slurm.runner import Runner, SlurmCommandError
from malletrain.slurm.versions import Release, parse_release

log = logging.getLogger("malletrain.slurm")
MAX_ENDED_READ = 500      # ended jobs read per cycle (one squeue -j list)
MAX_GROUP_READ = 500      # arrays of the harvest partition read task by task per cycle (one squeue -r -j list)
TOPOLOGY_RETRY = 60       # cycles before a failed topology read is tried again
MAX_LIMIT_USERS = 200     # owners whose association node limits one sacctmgr read asks for


def _job_order(job: str) -> tuple[int, str]:
    return (int(job), "") if job.isdigit() else (1 << 62, job)


@dataclass(frozen=True)
class Book:
    """What the daemon remembers about one job between cycles (persisted)."""

    launching: tuple[str, ...] = ()   # released by us onto these nodes, not started yet
    launch_t: float = 0.0
    last_change_s: float | None = None
    paused_until_s: float = 0.0
    running: tuple[str, ...] = ()     # nodes it held when last seen running
    # its latest size change (to measure the pause it cost): 'up' or 'down', when it was told
    # to stop (a start: released), when it was released, onto how many nodes
    change_dir: str = ""
    change_hold_s: float = 0.0
    change_release_s: float = 0.0
    change_nodes: int = 0
    change_start: bool = False        # that change was a start (from no nodes)
    # an elastic group's members released by us or last seen running: "TASK@NODE" (issue #26)
    members: tuple[str, ...] = ()

    def placed(self) -> dict[int, str]:
        """An elastic group's members on nodes: task -> node."""
        out = {}
        for entry in self.members:
            task, _, node = entry.partition("@")
            if task.isdigit() and node:
                out[int(task)] = node
        return out

    @staticmethod
    def entries(placed: dict[int, str]) -> tuple[str, ...]:
        """:attr:`members` of ``placed`` (task -> node), the inverse of :meth:`placed`."""
        return tuple(f"{t}@{n}" for t, n in sorted(placed.items()))


@dataclass
class Events:
    """Counters the daemon exports (cumulative)."""

    preemptions: int = 0
    starts: int = 0
    stops: int = 0
    rescales: int = 0
    vacates: int = 0
    failed_actions: int = 0
    deferred_launches: int = 0  # launches not made: a node they needed was not freed (refused/failed)
    refused_writes: int = 0     # a job no longer matched its record right before a write
    recoveries: int = 0         # lost or hung jobs requeued by the safety net
    tag_reads: int = 0
    unparsed_lines: int = 0     # squeue lines not in the expected format (left out)


class SlurmBackend:
    def __init__(self, runner: Runner, slurm: SlurmConfig, daemon: DaemonConfig, *,
                 clock: Callable[[], float] = time.time,
                 save_book: Callable[[str, Book | None], None] | None = None,
                 books: Mapping[str, Book] | None = None) -> None:
        self.runner, self.slurm, self.daemon = runner, slurm, daemon
        self.clock = clock
        self.books: dict[str, Book] = dict(books or {})
        self._save = save_book or (lambda job, book: None)
        self.events = Events()
        self.records: dict[str, JobRecord] = {}     # malleable jobs seen last cycle
        self.groups: dict[str, tuple[JobRecord, ...]] = {}   # array id -> its tasks (elastic groups' members)
        self.not_groups: set[str] = set()   # harvest-partition arrays found no group: not read task by task again
        self.refused_members: dict[str, set[int]] = {}     # group -> tasks that failed a check: not its
        self._member_checks = 0                             # member checks left this cycle (max_tag_reads)
        self.tags: dict[str, Tag] = {}
        self.tag_records: dict[str, TagRecord] = {}  # comment read alone, per job in the partition
        self.uids: dict[str, int] = {}
        self.idle_nodes = 0
        self.partition_nodes = 0
        self.vacating: set[str] = set()             # nodes due to primary jobs soon
        self._reservations: list[Reservation] = []
        self.windows: dict[str, float] = {}
        self._cycle = 0
        self.present: set[str] = set()             # every job id in the queue this cycle
        self.excluded: Mapping[str, object] = {}    # nodes left out of harvesting (the daemon's safety net)
        self.given_up: Mapping[str, str] = {}       # jobs held for good: never started again
        self._requeued_wall_s = 0.0                 # wall clock of the last requeuehold (_wait_held)
        self.node_limits: dict[str, int] = {}       # owner -> association GrpTRES node limit
        self.nodes_used: dict[str, int] = {}        # owner -> nodes their running jobs hold (all partitions)
        self.not_before: Mapping[str, float] = {}   # requeued after a failure: held until its back-off ends
        self.ended_watch: set[str] = set()          # ended tagged jobs still read (the safety net's)
        self._ended_backlog: set[str] = set()       # jobs that left the queue, not yet read (too many at once)
        # whether a job's work already ended 'done' (its progress file, read by the daemon): such a
        # job queued again (stopped or preempted as it finished) is never started again
        self.finished_work: Callable[[str], bool] = lambda job: False
        self.finished_queued: set[str] = set()      # such jobs seen this cycle: the daemon cancels them
        # an elastic group's members (task ids) as its progress file last named them (None: not known yet)
        self.joined: Callable[[str], tuple[int, ...] | None] = lambda job: None
        self.release: Release | None = None         # read once (versions.py: what differs per release)
        # the nodes' topology groups and speeds: the site file, topology.conf's leaf switches
        self.site: dict[str, tuple[str, float]] = load_node_info(slurm.node_info, ConfigError) \
            if slurm.node_info else {}
        self.switches: dict[str, str] | None = None if slurm.topology else {}
        self._topology_retry = 0
        self._limits_failed = False
        self._limits_due = False
        self._limits_asked: set[str] = set()

    def _learn_topology(self) -> None:
        """Leaf switches from topology.conf, read once (a cluster without the topology plugin, or
        a failing read, gives no groups; said once)."""
        if self._cycle < self._topology_retry:
            return
        try:
            self.switches = parse_topology(self.runner.read(["scontrol", "show", "topology"]))
        except BackendError as exc:      # tried again in TOPOLOGY_RETRY cycles (never every cycle)
            log.info("no topology read (%s); nodes are grouped by the site file only for now", exc)
            self._topology_retry = self._cycle + TOPOLOGY_RETRY
            return
        log.info("topology: %d node(s) under %d leaf switch(es)", len(self.switches),
                 len(set(self.switches.values())))

    def _node(self, name: str, node_type: str, window_end_s: float | None) -> Node:
        group, slowdown = self.site.get(name, ("", 1.0))
        if not group and self.switches:
            group = self.switches.get(name, "")
        return Node(name, node_type, group, window_end_s, slowdown)

    def _learn_release(self) -> None:
        try:
            self.release = parse_release(self.runner.read(["sinfo", "--version"]))
        except BackendError as exc:     # tried again next cycle; the reads below say if Slurm is down
            log.warning("cannot tell the Slurm release: %s", exc)
            return
        log.info("%s", self.release.notes(), extra={"slurm_release": self.release.text})

    # ------------------------------------------------------------ observe
    def observe(self) -> Observation:
        now = self.clock()
        if self.release is None:
            self._learn_release()
        if self.switches is None:
            self._learn_topology()
        jobs = self._fold(self._jobs())
        jobs += self._ended(jobs)
        self._member_checks = self.daemon.max_tag_reads
        nodes = self._nodes()
        every = self.slurm.reservations_every
        reservations_now = bool(every and self._cycle % every == 0)
        if reservations_now:
            self._reservations = parse_reservations(
                self.runner.read(["scontrol", "-o", "show", "reservation"]))
        self._read_tags(jobs)
        self._judge_arrays()
        self.nodes_used = {}
        for r in jobs:
            held = self._held_nodes(r)
            if held:
                self.nodes_used[r.user] = self.nodes_used.get(r.user, 0) + held
        if self.slurm.limits_every:
            owners = {r.user for r in jobs if r.user and r.job_id in self.tag_records}
            if self._cycle % self.slurm.limits_every == 0:
                self._limits_due = True
            # a new owner's limit is read before their first decision; the periodic re-read never
            # shares a cycle with the reservations read (a steady cycle stays at 3 reads)
            if owners - self._limits_asked or (self._limits_due and not reservations_now):
                self._limits_due = False
                self._read_node_limits(sorted(owners))
        self._cycle += 1

        malleable: list[tuple[JobRecord, Tag]] = []
        windows: dict[str, float] = {}
        for r in jobs:
            tag = self._tag_of(r)
            if tag is not None:
                malleable.append((r, tag))
            elif r.phase is Phase.PENDING and r.start_s and r.sched_nodes:
                for n in r.sched_nodes:     # a primary job's planned start
                    windows[n] = min(windows.get(n, r.start_s), r.start_s)
        for res in self._reservations:
            if res.end_s > now:
                for n in res.nodes:
                    windows[n] = min(windows.get(n, res.start_s), res.start_s)

        # Nodes a primary job is due on within one interval always go back
        # (reactive); vacate_lead_s > interval gives them back earlier (proactive).
        lead = max(self.daemon.vacate_lead_s, self.daemon.interval_s)
        soon = {n for n, t in windows.items() if t <= now + lead}
        self.windows = windows
        node_info = {n.name: n for n in nodes}
        self.idle_nodes = sum(1 for n in nodes if n.harvestable)
        self.partition_nodes = len(nodes)
        pool_names = {n.name for n in nodes if n.harvestable} - soon

        pool_names -= set(self.excluded)
        self.present = {r.job_id for r in jobs}
        states, facts, ended = [], {}, {}
        finished_queued: set[str] = set()
        live: dict[str, JobRecord] = {}
        for r, tag in malleable:
            tag = self._bounded(tag, len(nodes))
            capped = self._limited(r, tag)
            book = self.books.get(r.job_id, Book())
            change = (SizeChange(Direction(book.change_dir), book.change_hold_s, book.change_release_s,
                                 book.change_nodes, book.change_start) if book.change_dir in ("up", "down") else None)
            fact = JobFacts(self._profile(r, tag), r.user,
                            self._metrics_path(r.job_id, tag) if tag.metrics_dir else None,
                            uid=r.uid, max_nodes=tag.max_nodes, state=r.state,
                            nodes=r.nodes or book.running, change=change, elastic=r.job_id in self.groups,
                            held=r.phase is Phase.HELD)
            if r.phase is Phase.FINISHED:
                ended[r.job_id] = fact
                continue
            live[r.job_id] = r
            self.tags[r.job_id] = tag
            if r.uid is not None:
                self.uids[r.job_id] = r.uid
            facts[r.job_id] = fact
            if r.job_id in self.given_up:
                continue          # held for good: shown by status, never started
            if capped is None:
                continue          # its owner's node limit leaves it less than min_nodes: waits
            tag = capped
            if r.phase in (Phase.HELD, Phase.PENDING) and self.finished_work(r.job_id):
                finished_queued.add(r.job_id)
                continue          # its work is done: never started again
            st = (self._group_state(r, tag, now, pool_names, soon) if r.job_id in self.groups
                  else self._job_state(r, tag, now, pool_names, soon))
            if st is not None:
                states.append(st)
        finished = tuple(j for j in self.records if j not in live)
        for job in finished:
            self._forget(job)
        self.records = live
        self.vacating = soon
        self.finished_queued = finished_queued

        pool = tuple(self._node(n, node_info[n].node_type if n in node_info else DEFAULT_NODE_TYPE,
                                windows.get(n)) for n in sorted(pool_names))
        states.sort(key=lambda s: (s.spec.submit_s, int(s.job_id) if s.job_id.isdigit() else 0))
        snap = Snapshot(now, pool, tuple(states))
        gen = hash((pool, tuple((s.job_id, s.nodes, s.paused_until_s) for s in states)))
        return Observation(snap, finished, facts, gen, ended)

    def _read_node_limits(self, users: list[str]) -> None:
        """The association ``GrpTRES`` node limits of the owners of tagged jobs (at most
        MAX_LIMIT_USERS a read).  Slurm enforces them for the jobs users size themselves, but
        not for a job whose node count an operator set (measured on 22.05, 24.11 and 26.05:
        such a job starts beyond its owner's limit), so the daemon keeps them in its plans.  A
        cluster without accounting, or slurmdbd down, gives no new limits (the last ones stay)."""
        self._limits_asked = set(users)        # asked, answered or not: the next try is periodic
        if not users:
            self.node_limits = {}
            return
        users = users[:MAX_LIMIT_USERS]
        try:
            text = self.runner.read(["sacctmgr", "-nP", "show", "assoc", "where", f"users={','.join(users)}",
                                     f"format={LIMITS_FORMAT}"], retries=0)
        except BackendError as exc:
            if not self._limits_failed:
                log.warning("cannot read association node limits (%s); keeping the last ones known", exc)
            self._limits_failed = True
            return
        self._limits_failed = False
        self.node_limits = parse_node_limits(text, users)

    def _held_nodes(self, r: JobRecord) -> int:
        """Nodes ``r`` counts against its owner's limit: running, or released by the daemon onto
        nodes and not running yet."""
        if r.phase is Phase.RUNNING:
            return r.node_count
        book = self.books.get(r.job_id)
        return len(book.launching) if r.phase is Phase.PENDING and book is not None else 0

    def _limited(self, r: JobRecord, tag: Tag) -> Tag | None:
        """``tag`` with max_nodes within its owner's association node limit: the nodes the job
        holds plus what the owner's limit leaves (never below what it holds: no forced shrink);
        None when that is less than its min_nodes (it waits until its owner has room)."""
        limit = self.node_limits.get(r.user)
        if limit is None:
            return tag
        held = self._held_nodes(r)         # never below its nodes
        room = max(held, held + limit - self.nodes_used.get(r.user, 0))
        if room >= tag.max_nodes:
            return tag
        if room < tag.min_nodes:
            return None
        return replace(tag, max_nodes=room)

    def within_limits(self, actions: Sequence[Action]) -> list[Action]:
        """The plan without the starts and grows that would take an owner beyond their
        association node limit (Slurm would not stop them: an operator set their size)."""
        if not self.node_limits:
            return list(actions)
        owner = {a.job_id: self.records[a.job_id].user for a in actions if a.job_id in self.records}
        used = dict(self.nodes_used)
        for a in actions:              # what the plan frees first
            u = owner.get(a.job_id)
            if u in self.node_limits and a.kind in (ActionKind.STOP, ActionKind.SHRINK, ActionKind.GROW):
                used[u] = used.get(u, 0) - len(a.from_nodes)
        out = []
        for a in actions:
            u = owner.get(a.job_id)
            if u in self.node_limits and a.kind in (ActionKind.START, ActionKind.GROW, ActionKind.SHRINK):
                after = used.get(u, 0) + len(a.to_nodes)
                if a.kind is not ActionKind.SHRINK and after > self.node_limits[u]:
                    self.events.deferred_launches += 1
                    log.warning("job %s: %s to %d node(s) not made: its owner %s would hold %d node(s), beyond "
                                "their association's GrpTRES node=%d (Slurm lifts that limit for a job an "
                                "operator resizes, so the daemon keeps it)", a.job_id, a.kind.value,
                                len(a.to_nodes), u, after, self.node_limits[u],
                                extra={"job": a.job_id, "reason": "owner-node-limit"})
                    if a.kind is ActionKind.GROW:
                        used[u] = used.get(u, 0) + len(a.from_nodes)     # keeps what it holds
                    continue
                used[u] = after
            out.append(a)
        return out

    @staticmethod
    def _metrics_path(job: str, tag: Tag) -> str:
        return os.path.join(tag.metrics_dir, f"{job}.jsonl")

    def _forget(self, job: str) -> None:
        """Drop what was kept about a job that left the queue."""
        self.tags.pop(job, None)
        self.uids.pop(job, None)
        if self.books.pop(job, None) is not None:
            self._save(job, None)

    # ------------------------------------------------------------ tags (user text)
    def _candidate(self, r: JobRecord) -> bool:
        return r.partition == self.slurm.partition and r.plain and r.job_id.isdigit() and r.uid is not None

    def _read_tags(self, jobs: Sequence[JobRecord]) -> None:
        """Read the comment of jobs new in the harvest partition, alone and bounded per cycle."""
        present = {r.job_id for r in jobs}
        for job in [j for j in self.tag_records if j not in present]:
            del self.tag_records[job]
        todo: dict[int, list[JobRecord]] = {}
        for r in jobs:
            if not self._candidate(r):
                continue
            known = self.tag_records.get(r.job_id)
            if known is None or known.uid != r.uid or known.partition != r.partition:
                todo.setdefault(r.uid or 0, []).append(r)
        budget = self.daemon.max_tag_reads
        queues = [sorted(q, key=lambda r: int(r.job_id)) for _, q in sorted(todo.items())]
        for i in range(max((len(q) for q in queues), default=0)):   # round-robin over owners
            for q in queues:
                if i < len(q) and budget > 0:
                    budget -= 1
                    self._read_tag(q[i].job_id)
        left = sum(len(q) for q in queues) - (self.daemon.max_tag_reads - budget)
        if left > 0:
            log.info("%d new job(s) in %s wait for their tag to be read next cycle", left,
                     self.slurm.partition)

    def _read_tag(self, job: str) -> TagRecord | None:
        self.events.tag_reads += 1
        rec = self._fetch_tag(job)
        if rec is None:
            self.tag_records.pop(job, None)
        else:   # a comment longer than any tag is not one: keep no more of it than shows that
            self.tag_records[job] = replace(rec, comment=rec.comment[:MAX_TAG_BYTES + 1])
        return rec

    def _fetch_tag(self, job: str, member: JobRecord | None = None) -> TagRecord | None:
        """The job's owner, partition and comment, read alone (finished jobs too).  For an elastic
        group: one member's (``member``, or its first), read by its ``ARRAY_TASK`` id: Slurm
        answers for that task of that array only, so no other job's record can stand in for it."""
        if member is None and job in self.groups:
            member = self.groups[job][0]
        spec = member.spec if member is not None else job
        rec = parse_tag_record(spec, self.runner.read(["squeue", "-h", "-j", spec, "-t", "all", "-o", TAG_FORMAT],
                                                       unknown_job_ok=True))
        return replace(rec, job_id=job) if rec is not None else None

    def _judge_arrays(self) -> None:
        """An array whose tag was read and is no group tag is no group: its tasks are not read one
        by one again while it stays in the queue (a tag its owner changes later is not seen)."""
        for gid in self.groups:
            rec = self.tag_records.get(gid)
            if rec is not None:
                tag = parse_tag(rec.comment)
                if tag is None or not tag.group:
                    self.not_groups.add(gid)

    def _tag_of(self, r: JobRecord) -> Tag | None:
        rec = self.tag_records.get(r.job_id)
        if rec is None or not self._candidate(r) or rec.uid != r.uid or rec.partition != r.partition:
            return None
        tag = parse_tag(rec.comment)
        # an array is adopted only as an elastic group, and a group tag only on an array
        return tag if tag is not None and tag.group == (r.job_id in self.groups) else None

    def _bounded(self, tag: Tag, partition_nodes: int) -> Tag:
        cap = self.daemon.max_rescale_pause_s
        hi = max(1, min(tag.max_nodes, partition_nodes or tag.max_nodes))
        return replace(tag, min_nodes=min(tag.min_nodes, hi), max_nodes=hi,
                       rescale_up_s=min(tag.rescale_up_s, cap), rescale_down_s=min(tag.rescale_down_s, cap))

    def _profile(self, r: JobRecord, tag: Tag) -> str:
        if not tag.profile:
            return f"job-{r.job_id}"
        if tag.profile in self.daemon.shared_profiles:
            return tag.profile
        return f"{r.user or r.uid}/{tag.profile}"

    def _verify(self, job: str, member: JobRecord | None = None) -> bool:
        """Right before a write: the job still has the id, owner, partition and tag it was
        adopted with.  Anything else (or a failed read) refuses the write.  A write to an elastic
        group's ``member`` checks that member itself: a task of the same array, with the owner,
        partition and tag the group was adopted with."""
        known = self.tag_records.get(job)
        try:
            now = self._fetch_tag(job, member)
        except SlurmCommandError as exc:
            why = f"cannot re-read it: {exc}"
        else:
            why = ("it is gone" if now is None else
                   "it was never adopted" if known is None else
                   "its owner changed" if now.uid != known.uid else
                   "it left the partition" if now.partition != self.slurm.partition else
                   "its tag changed" if now.comment != known.comment else
                   "it carries no valid tag" if parse_tag(now.comment) is None else "")
            if not why:
                return True
            if member is None:
                self.tag_records.pop(job, None)      # read again next cycle; decide from what it says then
        self.events.refused_writes += 1
        what = f"job {job}" if member is None else f"job {job} (member {member.spec})"
        log.warning("%s: write refused, %s", what, why, extra={"job": job, "reason": "refused"})
        return False

    def _write(self, job: str, argv: list[str], member: JobRecord | None = None) -> bool:
        """A write to ``job`` (or to one of its members), after :meth:`_verify`; False when refused."""
        if not self._verify(job, member):
            return False
        self.runner.write(argv)
        return True

    def _jobs(self) -> list[JobRecord]:
        # no -r: squeue shows each array's pending tasks as one line (its running ones each on its
        # own), so a queue of large pending arrays costs a line per array
        return self._parse(self.runner.read(["squeue", "-h", "-a", "-o", SQUEUE_FORMAT]))

    def _fold(self, jobs: list[JobRecord]) -> list[JobRecord]:
        """The harvest partition's arrays as one record each (groups.py); their tasks kept.

        squeue without ``-r`` merges an array's pending tasks into one line, even those with
        records and reasons of their own (22.05, 24.11 and 26.05): a held spare and a member
        released onto a node look alike there.  When every reason on that line is a hold, its
        task list says it all (a steady group: no read more, groups.from_lines); the other arrays
        of the harvest partition are read once more, task by task (one ``squeue -r -j`` for all
        of them, adopted groups first, at most :data:`MAX_GROUP_READ`), except those found no
        group (:meth:`_judge_arrays`).  Pending tasks anywhere else cost a line per array.  With
        ``elastic_groups`` off nothing is read or folded: arrays stay records that are never
        adopted."""
        if not self.slurm.elastic_groups:
            return jobs
        part = self.slurm.partition
        lines: dict[str, list[JobRecord]] = {}
        for r in jobs:
            if r.array_id and r.partition == part:
                lines.setdefault(r.array_id, []).append(r)
        self.not_groups &= set(lines)
        known = {a: grp.from_lines(ls) for a, ls in lines.items() if a not in self.not_groups}
        unclear = sorted((a for a, ms in known.items() if ms is None),
                         key=lambda a: (a not in self.books, _job_order(a)))
        if len(unclear) > MAX_GROUP_READ:       # the rest next cycles, adopted groups first
            log.warning("%d arrays in %s to read task by task; %d of them this cycle", len(unclear), part,
                        MAX_GROUP_READ)
            unclear = unclear[:MAX_GROUP_READ]
        tasks: list[JobRecord] = [m for ms in known.values() if ms is not None for m in ms]
        if unclear:
            wide = set(unclear)
            tasks += [r for r in self._parse(self.runner.read(
                ["squeue", "-h", "-a", "-r", "-j", ",".join(unclear), "-o", SQUEUE_FORMAT], unknown_job_ok=True))
                      if r.array_id in wide and r.partition == part]
        chosen = {a for a, ms in known.items() if ms is not None} | set(unclear)
        jobs = [r for r in jobs if r.array_id not in chosen or r.partition != part] + tasks
        out, self.groups = grp.fold(jobs, part, chosen)
        self.not_groups |= chosen - set(self.groups)
        for gid in [g for g in self.refused_members if g not in self.groups]:
            del self.refused_members[gid]
        return out

    def _parse(self, text: str) -> list[JobRecord]:
        """The queue read's records; a line that is not Slurm's fields (a format this
        version prints differently) is left out, counted and logged: never a reason to stop."""
        bad: list[str] = []
        out = parse_squeue(text, bad)
        if bad:
            self.events.unparsed_lines += len(bad)
            log.warning("%d squeue line(s) not in the expected format were left out, e.g. %r",
                        len(bad), bad[0])
        return out

    def _ended(self, jobs: Sequence[JobRecord]) -> list[JobRecord]:
        """Tagged jobs that left the queue read (which lists pending, running and completing
        jobs only), read once more with ``-t all`` — one command for all of them — while
        slurmctld still holds them (MinJobAge): how they ended decides whether the safety net
        requeues them.  Jobs whose requeue waits out a back-off stay watched (``ended_watch``,
        kept by the daemon); a steady cycle with nothing ended reads nothing more."""
        listed = {r.job_id for r in jobs}
        gone = sorted((set(self.records) | self.ended_watch | self._ended_backlog | set(self.books)) - listed,
                      key=_job_order)
        self._ended_backlog = set()
        if not gone:
            self.ended_watch = set()
            return []
        if len(gone) > MAX_ENDED_READ:      # the rest next cycle: kept, never forgotten unread
            log.warning("%d tagged jobs left the queue at once; reading %d of them now, the rest next cycle",
                        len(gone), MAX_ENDED_READ)
            self._ended_backlog = set(gone[MAX_ENDED_READ:])
            gone = gone[:MAX_ENDED_READ]
        # -r: a gone elastic group's id lists its tasks one a line (a plain job's lists itself);
        # the ids that come back as array tasks are the groups (nothing kept in memory decides it)
        out = self._parse(self.runner.read(["squeue", "-h", "-a", "-t", "all", "-r", "-j", ",".join(gone),
                                            "-o", SQUEUE_FORMAT], unknown_job_ok=True))
        gone_ids = set(gone)
        groups = {r.array_id for r in out if r.array_id in gone_ids}
        queued = {r.array_id for r in out if r.array_id in groups and r.phase is not Phase.FINISHED}
        out = self._ended_groups(out, groups)
        ended = [r for r in out if r.phase is Phase.FINISHED and r.job_id in gone]
        self.ended_watch = {r.job_id for r in ended}
        for job in gone_ids - self.ended_watch - {r.job_id for r in out} - queued:
            if job in self.books:       # purged by Slurm (or never ours): nothing left to requeue
                self._forget(job)
        return ended

    def _ended_groups(self, out: list[JobRecord], gids: set[str]) -> list[JobRecord]:
        """Adopted groups that left the queue read, every member ended: one ended record each
        (groups.ended_record), their members kept for the safety net's requeue (the tasks of one
        owner, in the harvest partition, at most MAX_MEMBERS, as in :meth:`_fold`)."""
        if not gids:
            return out
        part = self.slurm.partition
        rest: list[JobRecord] = []
        tasks: dict[str, list[JobRecord]] = {}
        for r in out:
            if r.array_id in gids and r.partition == part and r.uid is not None and r.task >= 0:
                tasks.setdefault(r.array_id, []).append(r)
            else:
                rest.append(r)
        for gid, ms in tasks.items():
            members = tuple(sorted(ms, key=lambda m: m.task))
            rec = grp.ended_record(gid, members)
            if rec is None or len(members) > grp.MAX_MEMBERS or len({m.uid for m in members}) != 1:
                continue
            self.groups[gid] = members
            rest.append(rec)
        return rest

    def _nodes(self) -> list[NodeRecord]:
        return parse_sinfo(self.runner.read(
            ["sinfo", "-h", "-N", "-p", self.slurm.partition, "-o", SINFO_FORMAT]))

    def _spec(self, r: JobRecord, tag: Tag) -> JobSpec:
        return JobSpec(r.job_id, tag.min_nodes, tag.max_nodes, tag.rescale_up_s,
                       tag.rescale_down_s, self._profile(r, tag), r.submit_s or 0.0, tag.name or r.name,
                       owner=str(r.uid) if r.uid is not None else r.user)

    def _note_vacate(self, job: str, nodes: tuple[str, ...], soon: set[str], now: float) -> None:
        """Count and say that ``job`` gives nodes back to a primary job planned on them soon."""
        due_nodes = soon & set(nodes)
        if due_nodes:
            due = min(self.windows[n] for n in due_nodes)
            self.events.vacates += 1
            log.info("job %s: giving %s back to a primary job planned to start in %.0fs",
                     job, collect(sorted(due_nodes)), due - now,
                     extra={"job": job, "reason": "primary job planned"})

    def _job_state(self, r: JobRecord, tag: Tag, now: float, pool: set[str],
                   soon: set[str]) -> JobState | None:
        book = self.books.get(r.job_id, Book())
        spec = self._spec(r, tag)
        phase = r.phase
        nodes: tuple[str, ...] = ()
        if phase is Phase.RUNNING:
            nodes = r.nodes
            if book.launching or book.running != nodes:
                book = replace(book, launching=(), running=nodes)
                self._put(r.job_id, book)
            self._note_vacate(r.job_id, nodes, soon, now)
        elif phase is Phase.PENDING:
            taken = book.launching and now - book.launch_t > 5.0 and not set(book.launching) <= pool
            if book.launching and not taken and now - book.launch_t <= self.daemon.start_timeout_s:
                nodes = book.launching
            else:
                why = ("lost its nodes to another job before it started" if taken else
                       "did not start within start_timeout_s" if book.launching
                       else "was requeued by Slurm (preempted)")
                if not book.launching and book.running:
                    self.events.preemptions += 1
                log.warning("job %s %s; holding it until the daemon gives it nodes", r.job_id, why)
                self._put(r.job_id, replace(book, launching=(), running=(), last_change_s=now))
                self._hold(r.job_id)       # after its write-ahead record, like every write
                return None
        elif phase is Phase.HELD:
            if book.launching or book.running:
                self._put(r.job_id, replace(book, launching=(), running=()))
            if self.not_before.get(r.job_id, 0.0) > now:    # back-off after a failure: not yet
                return None
        else:   # moving or finished: not part of this decision
            return None
        pool.update(nodes)   # a job's own nodes are always part of the pool it is judged on
        pool.difference_update(soon)
        return JobState(spec, nodes, None, book.paused_until_s, book.last_change_s)

    def _group_state(self, r: JobRecord, tag: Tag, now: float, pool: set[str],
                     soon: set[str]) -> JobState | None:
        """An elastic group as the core sees it: the nodes of its running members and of those
        we released, not started yet.  A member Slurm requeued (preempted: only that member
        stopped) or that did not start in time is held again; the others keep running."""
        gid, members = r.job_id, self.groups[r.job_id]
        book = self.books.get(gid, Book())
        placed = book.placed()
        by_task = {m.task: m for m in members}
        running = {m.task: m.nodes[0] for m in members if m.phase is Phase.RUNNING and m.nodes}
        for task in self._hung_joins(gid, members, now):
            node = running.pop(task)
            placed.pop(task, None)
            book = replace(book, members=Book.entries(placed),
                           running=tuple(n for n in book.running if n != node))
            self._put(gid, book)         # write-ahead: its node is no longer the group's
            if self._requeue_member(gid, by_task[task]):
                self.events.recoveries += 1
        refused = self.refused_members.get(gid, set())
        for task in refused:                # failed a check: not the group's (its node is not harvestable)
            running.pop(task, None)
        launching: dict[int, str] = {}
        timed_out: set[int] = set()
        for task, node in placed.items():
            m = by_task.get(task)
            if m is None or task in running or m.phase is not Phase.PENDING or node not in book.launching:
                continue
            if book.launch_t and (now - book.launch_t > self.daemon.start_timeout_s
                                  or (now - book.launch_t > 5.0 and node not in pool)):
                log.warning("job %s: member %s did not start on %s (%s); holding it", gid, m.spec, node,
                            "its node was taken" if node not in pool else "start_timeout_s passed",
                            extra={"job": gid, "reason": "member did not start"})
                timed_out.add(task)
                self._hold_member(gid, m)
                continue
            launching[task] = node
        for m in members:       # pending, not released by us: Slurm requeued it (a preemption)
            if m.phase is Phase.PENDING and m.task not in launching and m.task not in timed_out \
                    and m.task not in refused:
                if m.task in placed:
                    self.events.preemptions += 1
                    log.warning("job %s: member %s on %s was requeued by Slurm (preempted); the other "
                                "members go on", gid, m.spec, placed[m.task],
                                extra={"job": gid, "reason": "member preempted"})
                self._hold_member(gid, m)
        size = max(1, min(tag.max_nodes, len(members) - len(refused)))
        # running members beyond its size (its owner released some): requeued held, those the
        # daemon did not place first, so a plan never meets a group larger than its max
        extra = sorted(running, key=lambda t: (t in placed, -t))[:max(0, len(running) + len(launching) - size)]
        for task in extra:
            m = by_task[task]
            log.warning("job %s: member %s runs beyond the group's %d node(s); requeued held", gid, m.spec, size,
                        extra={"job": gid, "reason": "member beyond max"})
            running.pop(task)
            placed.pop(task, None)
            self._requeue_member(gid, m)
        where = {**launching, **running}
        entries = Book.entries(where)
        if entries != book.members or book.running != tuple(sorted(running.values())):
            book = replace(book, members=entries, running=tuple(sorted(running.values())),
                           launching=tuple(sorted(launching.values())))
            self._put(gid, book)
        nodes = tuple(sorted(where.values()))
        self._note_vacate(gid, nodes, soon, now)
        if r.phase is Phase.MOVING or (r.phase is Phase.HELD and self.not_before.get(gid, 0.0) > now):
            return None
        spec = self._spec(r, replace(tag, min_nodes=min(tag.min_nodes, size), max_nodes=size))
        pool.update(nodes)
        pool.difference_update(soon)
        return JobState(spec, nodes, None, book.paused_until_s, book.last_change_s)

    def _hung_joins(self, gid: str, members: tuple[JobRecord, ...], now: float) -> list[int]:
        """Running members that its group does not name (its progress file's last re-forming
        record) after ``join_timeout_s`` of running: stuck before they joined.  The runtime's own
        ``join_wait_s`` ends a joiner that asked and was never admitted; this catches one that
        never got to ask.  Nothing is judged before the group named its members once."""
        joined = self.joined(gid)
        if joined is None:
            return []
        out = []
        for m in members:
            if (m.phase is Phase.RUNNING and m.nodes and m.task not in joined and m.start_s is not None
                    and now - m.start_s > self.daemon.join_timeout_s):
                log.warning("job %s: member %s has run %.0fs on %s without joining its group (members %s); "
                            "requeued held", gid, m.spec, now - m.start_s, m.nodes[0], list(joined)[:16],
                            extra={"job": gid, "action": "requeue", "reason": "hung join"})
                out.append(m.task)
        return out

    def _check_member(self, gid: str, m: JobRecord) -> bool:
        """:meth:`_verify` of one member; a member that fails it is no longer the group's
        (:attr:`refused_members`: its node is not counted, it is never started)."""
        if self._verify(gid, m):
            return True
        self.refused_members.setdefault(gid, set()).add(m.task)
        return False

    def _member_write(self, gid: str, m: JobRecord, argv: list[str]) -> bool:
        """A write to one member that the daemon makes on its own (not a plan's): within this
        cycle's member checks (``max_tag_reads``: one group's thousands of members cannot stall
        the cycle; the rest wait), after the member's check; a member that fails it is no longer
        the group's (:attr:`refused_members`)."""
        if self._member_checks <= 0:
            return False
        self._member_checks -= 1
        if not self._check_member(gid, m):
            return False
        try:
            self.runner.write(argv)
        except SlurmCommandError as exc:
            self.events.failed_actions += 1
            log.warning("job %s: %s of member %s failed: %s", gid, argv[1], m.spec, exc)
            return False
        return True

    def _hold_member(self, gid: str, m: JobRecord) -> bool:
        """Hold one member (pending: it stays queued, never started by Slurm on its own)."""
        return self._member_write(gid, m, ["scontrol", "uhold", m.spec])

    def _requeue_member(self, gid: str, m: JobRecord) -> bool:
        return self._member_write(gid, m, ["scontrol", "requeuehold", m.spec])

    def _put(self, job: str, book: Book) -> None:
        self.books[job] = book
        self._save(job, book)

    def requeue_held(self, job: str, why: str) -> bool:
        """The safety net: requeue ``job`` (ended without a result, or hung) held, same id;
        the daemon starts it again when it has nodes.  False when refused or failed."""
        book = self.books.get(job, Book())
        try:
            if job in self.groups:
                return self._requeue_group(job, why)
            if not self._verify(job):
                return False
            self._put(job, replace(book, launching=(), running=(), last_change_s=self.clock()))
            self.runner.write(["scontrol", "requeuehold", job])
        except SlurmCommandError as exc:
            self.events.failed_actions += 1
            log.error("job %s: requeue failed: %s", job, exc, extra={"job": job})
            return False
        self.events.recoveries += 1
        log.warning("job %s: %s", job, why, extra={"job": job, "action": "requeue", "reason": why})
        return True

    def _requeue_group(self, gid: str, why: str) -> bool:
        """The safety net on a group (hung, or every member ended without a result): its running
        members and those that ended are requeued held, the members the daemon placed first, each
        after its own check and within this cycle's member checks (:meth:`_member_write`; those
        left stay ended and the group goes on with the others).  A member someone cancelled is
        never requeued (groups.CHOSEN_ENDS).  The daemon starts them again when it has nodes."""
        book = self.books.get(gid, Book())
        placed = book.placed()
        todo = sorted((m for m in self.groups[gid] if m.phase is Phase.RUNNING
                       or (m.phase is Phase.FINISHED and m.state not in grp.CHOSEN_ENDS)),
                      key=lambda m: (m.task not in placed, m.task))
        self._put(gid, replace(book, members=(), launching=(), running=(), last_change_s=self.clock()))
        done = [m for m in todo if self._member_write(gid, m, ["scontrol", "requeuehold", m.spec])]
        if done:
            self.events.recoveries += 1
        log.warning("job %s: %s (%d of %d member(s) requeued held)", gid, why, len(done), len(todo),
                    extra={"job": gid, "action": "requeue", "reason": why})
        return bool(done) or not todo

    def cancel_finished(self, job: str, why: str) -> bool:
        """Cancel ``job``: queued again (stopped by us or preempted by Slurm just as it finished)
        although its work ended 'done'; running it again would finish it twice.  A group: its
        queued members, each by ``ARRAY_TASK`` after its own check (the rest next cycle)."""
        if job in self.groups:
            left = [m for m in self.groups[job] if m.phase in (Phase.HELD, Phase.PENDING)]
            done = [m for m in left if self._member_write(job, m, ["scancel", m.spec])]
            log.warning("job %s: %s (%d of %d queued member(s) cancelled)", job, why, len(done), len(left),
                        extra={"job": job, "action": "cancel", "reason": why})
            return len(done) == len(left)
        try:
            if not self._verify(job):
                return False
            self._forget(job)
            self.runner.write(["scancel", job])
        except SlurmCommandError as exc:
            self.events.failed_actions += 1
            log.error("job %s: cancel failed: %s", job, exc, extra={"job": job})
            return False
        log.warning("job %s: %s", job, why, extra={"job": job, "action": "cancel", "reason": why})
        return True

    def _hold(self, job: str) -> None:
        try:
            self._write(job, ["scontrol", "uhold", job])
        except SlurmCommandError as exc:
            log.warning("job %s: hold failed: %s", job, exc)

    # ------------------------------------------------------------ apply
    def apply(self, actions: Sequence[Action]) -> None:
        """Free nodes first (stop/shrink/grow: ``requeuehold``, or hold a job released but not yet
        started), then launch.  A launch onto a node whose freeing was refused (the job no longer
        matches its record) or failed is not made this cycle: no job is released onto nodes that a
        job refusing the daemon's writes still holds; it stays held (its launch is counted in
        ``deferred_launches``) and the next cycle plans from what Slurm really did."""
        now = self.clock()
        actions = self.within_limits(actions)
        requeued: list[Action] = []
        relaunch: list[Action] = []
        blocked: dict[str, str] = {}      # node -> the job still on it (or launching onto it)

        def not_freed(a: Action, book: Book) -> None:
            for n in (*a.from_nodes, *book.launching, *book.running):
                blocked.setdefault(n, a.job_id)

        for a in actions:
            if a.kind in (ActionKind.KEEP, ActionKind.WAIT):
                continue
            book = self.books.get(a.job_id, Book())
            log.info("job %s: %s %s -> %s: %s", a.job_id, a.kind.value,
                     collect(a.from_nodes) if a.from_nodes else "-",
                     collect(a.to_nodes) if a.to_nodes else "-", a.reason,
                     extra={"job": a.job_id, "action": a.kind.value, "reason": a.reason})
            if a.job_id in self.groups:     # an elastic group: only the members that leave stop
                self._free_members(a, now, blocked)
                if a.kind is not ActionKind.STOP:
                    relaunch.append(a)
                continue
            try:
                if a.kind is ActionKind.START:
                    relaunch.append(a)
                elif book.launching and self._hold_launching(a.job_id):
                    # released but not started: held again, no requeue needed
                    self._put(a.job_id, replace(book, launching=(), last_change_s=now))
                    if a.kind is ActionKind.STOP:
                        self.events.stops += 1
                    else:
                        relaunch.append(a)
                elif not self._verify(a.job_id):
                    not_freed(a, book)
                    continue
                else:
                    self._put(a.job_id, replace(book, running=(), last_change_s=now, change_hold_s=now))
                    self.runner.write(["scontrol", "requeuehold", a.job_id])
                    self._requeued_wall_s = time.time()
                    if a.kind is ActionKind.STOP:
                        self.events.stops += 1
                    else:
                        requeued.append(a)
            except SlurmCommandError as exc:
                self.events.failed_actions += 1
                not_freed(a, book)
                log.error("job %s: %s failed: %s", a.job_id, a.kind.value, exc)
        if requeued:
            ready = self._wait_held(requeued)
            for a in requeued:
                if a.job_id in ready:
                    relaunch.append(a)
                else:
                    log.warning("job %s still completing after %.0fs; it stays held for the next cycle",
                                a.job_id, self.daemon.rescale_wait_s)
        for a in relaunch:
            onto = sorted({n: blocked[n] for n in a.to_nodes if blocked.get(n, a.job_id) != a.job_id}.items())
            if onto and a.job_id in self.groups:
                self.events.deferred_launches += 1
                log.warning("job %s: members not started on %s: %s", a.job_id, collect(a.to_nodes),
                            "; ".join(f"{n} is still held by job {j}" for n, j in onto),
                            extra={"job": a.job_id, "action": a.kind.value, "reason": "nodes-not-freed"})
                continue
            if onto:
                self.events.deferred_launches += 1
                book = self.books.get(a.job_id, Book())
                self._put(a.job_id, replace(book, launching=(), running=()))
                log.warning("job %s: %s onto %s not made: %s; it stays held and the next cycle "
                            "decides again from what Slurm did", a.job_id, a.kind.value, collect(a.to_nodes),
                            "; ".join(f"{n} is still held by job {j}" for n, j in onto),
                            extra={"job": a.job_id, "action": a.kind.value, "reason": "nodes-not-freed"})
                continue
            self._launch(a)

    def _hold_launching(self, job: str) -> bool:
        """Hold a job we released; False when it started meanwhile (requeue it instead)."""
        if not self._verify(job):
            raise SlurmCommandError(["scontrol", "uhold", job], None, "refused: the job no longer matches")
        self.runner.write(["scontrol", "uhold", job])
        out = self.runner.read(["squeue", "-h", "-j", job, "-o", "%i|%T|%r"], unknown_job_ok=True)
        state = (out.strip().split("|") + ["", ""])[1]
        return state in ("PENDING", "")

    def _free_members(self, a: Action, now: float, blocked: dict[str, str]) -> None:
        """Stop the members of group ``a.job_id`` on the nodes the plan takes from it: a running
        one is requeued held (its process leaves the group at the next step, the others re-form
        and go on), a released one not started yet is held.  Write-ahead, like every write."""
        gid = a.job_id
        book = self.books.get(gid, Book())
        placed = book.placed()
        by_task = {m.task: m for m in self.groups[gid]}
        stay = set(a.to_nodes)
        tag = self.tags.get(gid)
        for task, node in sorted(placed.items()):
            m = by_task.get(task)
            if node in stay or m is None:
                continue
            if not self._check_member(gid, m):     # no longer the group's; its node is not freed this cycle
                blocked.setdefault(node, gid)
                continue
            del placed[task]
            book = replace(book, members=Book.entries(placed),
                           launching=tuple(n for n in book.launching if n != node),
                           running=tuple(n for n in book.running if n != node), last_change_s=now,
                           paused_until_s=now + (tag.rescale_down_s if tag else 0.0), change_dir="down",
                           change_hold_s=now, change_release_s=now, change_nodes=len(placed), change_start=False)
            self._put(gid, book)
            try:
                if m.phase is Phase.RUNNING:
                    self.runner.write(["scontrol", "requeuehold", m.spec])
                else:
                    self.runner.write(["scontrol", "uhold", m.spec])
            except SlurmCommandError as exc:
                self.events.failed_actions += 1
                blocked.setdefault(node, gid)
                log.error("job %s: stopping member %s on %s failed: %s", gid, m.spec, node, exc)
        if a.kind is ActionKind.STOP:
            self.events.stops += 1
        elif a.kind is ActionKind.SHRINK:
            self.events.rescales += 1

    def _launch_members(self, a: Action) -> None:
        """Start a held member of group ``a.job_id`` on each node the plan adds (update its
        ReqNodeList and StartTime, release it); the running members are not touched."""
        now, gid = self.clock(), a.job_id
        book = self.books.get(gid, Book())
        placed = book.placed()
        new = [n for n in a.to_nodes if n not in set(placed.values())]
        spare = [m for m in grp.spare(self.groups[gid], placed) if m.task not in self.refused_members.get(gid, ())]
        if len(spare) < len(new):
            log.warning("job %s: %d node(s) planned but only %d held member(s) left to start", gid,
                        len(new), len(spare), extra={"job": gid, "reason": "no spare member"})
        tag = self.tags.get(gid)
        started = 0
        for m in spare:
            if not new:
                break
            if not self._check_member(gid, m):     # refused: never tried again; the next spare one may be
                continue
            node = new.pop(0)
            placed[m.task] = node
            book = replace(book, members=Book.entries(placed),
                           launching=tuple(sorted({*book.launching, node})), launch_t=now, last_change_s=now,
                           paused_until_s=now + (tag.rescale_up_s if tag else 0.0), change_dir="up",
                           change_hold_s=now, change_release_s=now, change_nodes=len(a.to_nodes),
                           change_start=a.kind is ActionKind.START)
            self._put(gid, book)
            try:
                self.runner.write(["scontrol", "update", f"JobId={m.spec}", "NumNodes=1-1", f"ReqNodeList={node}",
                                   "StartTime=now"])
                self.runner.write(["scontrol", "release", m.spec])
            except SlurmCommandError as exc:
                self.events.failed_actions += 1
                del placed[m.task]
                book = replace(book, members=Book.entries(placed),
                               launching=tuple(n for n in book.launching if n != node))
                self._put(gid, book)
                log.error("job %s: starting member %s on %s failed, it stays held: %s", gid, m.spec, node, exc)
                continue
            started += 1
        if started and a.kind is ActionKind.START:
            self.events.starts += 1
        elif started:
            self.events.rescales += 1

    def _launch(self, a: Action) -> None:
        if a.job_id in self.groups:
            self._launch_members(a)
            return
        now = self.clock()
        book = self.books.get(a.job_id, Book())
        if a.kind is ActionKind.START and self.finished_work(a.job_id):
            log.warning("job %s: its last run ended 'done' as it was stopped; not starting it again",
                        a.job_id, extra={"job": a.job_id, "reason": "finished"})
            self.finished_queued.add(a.job_id)
            return
        k = len(a.to_nodes)
        tag = self.tags.get(a.job_id)
        pause = 0.0
        if tag is not None:
            pause = tag.rescale_up_s if a.kind in (ActionKind.START, ActionKind.GROW) else tag.rescale_down_s
        up = a.kind in (ActionKind.START, ActionKind.GROW)
        hold = book.change_hold_s if a.kind is not ActionKind.START and book.change_hold_s else now
        self._put(a.job_id, Book(launching=tuple(a.to_nodes), launch_t=now, last_change_s=now,
                                 paused_until_s=now + pause, running=(), change_dir="up" if up else "down",
                                 change_hold_s=hold, change_release_s=now, change_nodes=k,
                                 change_start=a.kind is ActionKind.START))
        try:
            ok = (self._write(a.job_id, ["scontrol", "update", f"jobid={a.job_id}", f"NumNodes={k}-{k}",
                                         f"ReqNodeList={collect(a.to_nodes)}", "StartTime=now"])
                  and self._write(a.job_id, ["scontrol", "release", a.job_id]))
            if not ok:
                raise SlurmCommandError(["scontrol", "release", a.job_id], None,
                                        "refused: the job no longer matches")
        except SlurmCommandError as exc:
            self.events.failed_actions += 1
            self._put(a.job_id, replace(book, launching=(), running=()))
            log.error("job %s: %s failed, it stays held: %s", a.job_id, a.kind.value, exc)
            return
        if a.kind is ActionKind.START:
            self.events.starts += 1
        else:
            self.events.rescales += 1

    def _wait_held(self, actions: list[Action]) -> set[str]:
        """Jobs that are back to PENDING held *and* whose old nodes finished completing,
        seen so on two polls in a row: a batch step that is still exiting when the job
        is released again would otherwise complete the new run (observed on 22.05).  And
        never within the wall-clock second of the requeue: slurmd refuses a launch whose
        credential was made in the second its job's credentials were revoked ("Killing
        non-startable batch job: Job credential revoked", seen on 22.05 after a grow released
        0.7 s after its requeuehold; the job then ends FAILED)."""
        jobs = [a.job_id for a in actions]
        old = {a.job_id: set(a.from_nodes) for a in actions}
        deadline = time.monotonic() + self.daemon.rescale_wait_s
        seen_once: set[str] = set()
        while True:
            held: set[str] = set()
            try:
                out = self.runner.read(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i|%T|%r"],
                                       unknown_job_ok=True)
                for line in out.splitlines():
                    jid, state, reason = (line.split("|") + ["", ""])[:3]
                    if state == "PENDING" and is_held(reason):
                        held.add(jid)
                if held:
                    busy = {n.name for n in self._nodes() if "COMPLETING" in n.states}
                    held = {j for j in held if not (old[j] & busy)}
            except SlurmCommandError as exc:
                log.warning("cannot poll requeued jobs: %s", exc)
            ready = held & seen_once
            seen_once = held
            settled = time.time() >= math.floor(self._requeued_wall_s) + 1.0
            if (ready >= set(jobs) and settled) or time.monotonic() > deadline:
                return ready if settled else set()
            time.sleep(0.5)
