"""User commands: ``daemon``, ``config check``, ``submit``, ``status``, ``explain``, ``campaign``.

``submit`` runs as the calling user (see :mod:`malletrain.slurm.submit` for the
batch script and the idempotent sbatch).  ``status`` and ``explain`` read the ``status.json`` the
daemon rewrites every cycle.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
import sys
import time
import uuid

from malletrain.cli.args import say
from malletrain.daemon.status import DaemonStatus, read_status
from malletrain.domain.config import Config, SlurmConfig, load_config
from malletrain.domain.errors import InputError
from malletrain.domain.safefile import writable_by_others
from malletrain.domain.text import shown
from malletrain.slurm.submit import LAUNCHES

DEFAULT_CONFIG = "/etc/malletrain/config.yaml"


def _config(path: str | None) -> Config:
    path = path or os.environ.get("MALLETRAIN_CONFIG")
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    return load_config(path) if path else Config()


def _runner(cfg: Config):
    from malletrain.slurm.runner import Runner
    s: SlurmConfig = cfg.slurm
    return Runner(slurm_conf=s.slurm_conf or os.environ.get("SLURM_CONF"), bin_dir=s.bin_dir or None,
                  timeout_s=s.command_timeout_s, retries=s.retries, backoff_s=s.backoff_s)


def metrics_dir_path(given: str | None) -> str:
    return os.path.abspath(given or os.environ.get("MALLETRAIN_METRICS_DIR")
                           or os.path.expanduser("~/.malletrain/metrics"))


def make_dir(d: str, what: str = "metrics directory") -> str:
    """Create ``d`` (and its parents) 0755 whatever the umask (the daemon, another account,
    must reach the progress files below it; nobody else may write it); :class:`InputError`
    naming it when that is impossible, or when others than its owner may write it: the job's
    batch script, output and progress file go there under names a teammate could predict and
    redirect, and the daemon reads no progress file there."""
    existed = os.path.isdir(d)
    try:
        os.makedirs(d, mode=0o755, exist_ok=True)
        if not existed:
            os.chmod(d, 0o755)
        info = os.stat(d)
    except OSError as exc:
        raise InputError(f"cannot create the {what}: {exc.strerror or exc}", path=d) from None
    if writable_by_others(info):
        raise InputError(f"the {what} may be written by others than its owner (mode "
                         f"{stat.S_IMODE(info.st_mode):04o}): files written there under predictable "
                         "names could be redirected; use a directory only you can write "
                         "(chmod go-w)", path=d)
    if not os.access(d, os.W_OK | os.X_OK):
        raise InputError(f"the {what} is not writable", path=d)
    return d


def metrics_dir_of(given: str | None) -> str:
    return make_dir(metrics_dir_path(given))


def cmd_submit(args) -> int:
    cfg = _config(args.config)
    metrics_dir = metrics_dir_path(args.metrics_dir)
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    from malletrain.slurm.submit import build_submission, profile_name, submit_job
    token = uuid.uuid4().hex[:16]
    spec = dict(name=args.name, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
                gpus_per_node=args.gpus_per_node, profile=args.profile or profile_name(args.name),
                time_limit=args.time, rescale_up_s=args.rescale_up, rescale_down_s=args.rescale_down,
                grace_s=args.grace_s, launch=args.launch, elastic=args.elastic)
    # every check first: a bad flag writes nothing and runs no sbatch
    build_submission(command, metrics_dir=metrics_dir, partition=cfg.slurm.partition, token=token,
                     script_path=os.path.join(metrics_dir, f"job-{token}.sbatch"), **spec)
    make_dir(metrics_dir)
    job = submit_job(_runner(cfg), cfg.slurm.partition, command, token=token, metrics_dir=metrics_dir, **spec)
    print(job)
    what = (f"elastic job {job} ({args.max_nodes} held 1-node members, {job}_0..{job}_{args.max_nodes - 1})"
            if args.elastic else f"job {job}")
    print(f"malletrain: submitted {what} held in {cfg.slurm.partition}; the daemon starts it "
          f"on idle nodes. Progress: {metrics_dir}/{job}.jsonl", file=sys.stderr)
    return 0


def _status_path(args: argparse.Namespace) -> str:
    state_dir = args.state_dir or _config(args.config).daemon.state_dir
    return os.path.join(state_dir, "status.json")


# what a status.json of the right types may still make the rendering raise (guarded: all or nothing)
_MALFORMED = (AttributeError, KeyError, TypeError, ValueError, OverflowError, IndexError, RecursionError)


def _rendered(path: str, render) -> list[str]:
    """``render()``'s lines, all or none: a field of the wrong type is an error naming the file."""
    try:
        return list(render())
    except _MALFORMED as exc:
        raise InputError(f"not a malletrain status file: {str(exc)[:120]}", path=path) from None


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def cmd_status(args: argparse.Namespace) -> int:
    path = _status_path(args)
    st = read_status(path)
    if args.json:
        print(json.dumps(dataclasses.asdict(st), indent=1))
        return 0
    for line in _rendered(path, lambda: _status_lines(st)):
        say(line)
    return 0


def _status_lines(st: DaemonStatus):
    from malletrain.slurm.parse import collect
    age = time.time() - st.t
    c = st.counters
    o = st.outcomes
    done = (f"; {o.completed} completed (completion p95 {o.jct_p95_s / 60:.0f} min, wait p95 "
            f"{o.wait_p95_s / 60:.0f} min), Jain {o.jain_users:.2f} over {o.users} user(s)") if o else ""
    yield (f"cycle {st.cycle} ({age:.0f}s ago), Slurm {'up' if st.slurm_up else 'DOWN'}, "
           f"{st.idle_nodes} idle node(s) in {st.partition}; {c.starts} starts, {c.rescales} rescales, "
           f"{c.preemptions} preemptions, {c.vacates} vacates{done}")
    head = f"{'JOB':>7} {'NAME':<14} {'STATE':<8} {'SIZE':>4} {'RANGE':>6} {'NODES':<12} " \
           f"{'MEASURED/s':>10} {'PREDICTED/s':>11}  LAST ACTION (REASON)"
    if not st.state_writable:
        yield f"WARNING: the daemon's state store takes no writes, nothing is applied: {st.state_error}"
    for err in st.errors:
        yield f"ERROR contained in the last cycle (the daemon's log has the traceback): {shown(err)}"
    for node, why in st.excluded_nodes.items():
        yield f"node {node} left out of harvesting {why}"
    yield head
    for j in st.jobs:
        meas = j.measured.samples_per_s if j.measured else None
        la = j.last_action
        last = f"{la.kind}: {la.reason}" if la else (j.reason or "-")
        yield (f"{j.job:>7} {shown(j.name)[:14]:<14} {j.state:<8} {j.size:>4} "
               f"{str(j.min_nodes) + '-' + str(j.max_nodes):>6} "
               f"{collect(j.nodes) if j.nodes else '-':<12} {_rate(meas):>10} "
               f"{_rate(j.predicted):>11}  {last}")
        if j.members:
            yield f"{'':>7} elastic group: {_members(j.members)}"


def _members(members) -> str:
    """An elastic group's members in one line: ``3 running (n1 n2 n4), 1 held``."""
    by: dict[str, list[str]] = {}
    for m in members:
        by.setdefault(m.state, []).append(shown(m.node) if m.node else f"{m.task}")
    return ", ".join(f"{len(v)} {state}" + (f" ({' '.join(v)})" if state == "running" else "")
                     for state, v in sorted(by.items(), key=lambda kv: kv[0] != "running"))


def cmd_explain(args: argparse.Namespace) -> int:
    path = _status_path(args)
    st = read_status(path)
    job = _rendered(path, lambda: [st.job(str(args.job))])[0]
    if job is None:
        known = _rendered(path, lambda: [", ".join(j.job for j in st.jobs)])[0]
        raise InputError(f"job {args.job} is not a malleable job the daemon knows "
                         f"(known: {known or 'none'})")
    for line in _rendered(path, lambda: _explain_lines(job)):
        say(line)
    return 0


def _explain_lines(job):
    yield (f"job {job.job} ({job.name}, profile {job.profile or '-'}): {job.state} "
           f"(Slurm {job.slurm_state}, {job.slurm_reason or 'no reason'}) on "
           f"{job.size} node(s), allowed {job.min_nodes}-{job.max_nodes}")
    yield f"why: {job.reason or 'no decision yet'}" + (f" [{job.reason_code}]" if job.reason_code else "")
    if job.members:
        yield f"elastic group of {len(job.members)} one-node member(s): {_members(job.members)}"
        for m in job.members:
            yield f"  member {m.task}: job {shown(m.job)}, {m.state}" + (f" on {shown(m.node)}" if m.node else "")
    if job.measured:
        m = job.measured
        yield f"measured: {m.samples_per_s:.4g} samples/s on {m.nodes} node(s)"
    if job.rescale:
        r = job.rescale

        def side(value: float, n: int, configured: float) -> str:
            return (f"{value:.3g}s learned from {n} measurement(s) (configured {configured:.3g}s)" if n
                    else f"{value:.3g}s" + (" configured" if value == configured else " (its profile's)"))
        if r.grow_s is None:
            yield (f"rescale pauses: up {side(r.up_s, r.up_n, r.configured_up_s)}; "
                   f"down {side(r.down_s, r.down_n, r.configured_down_s)}")
        else:      # an elastic group: each kind its own (a restart's up and down are its start and shrink)
            def kind(value: float | None, n: int, prior: str) -> str:
                return f"{value or 0.0:.3g}s " + (f"learned from {n} measurement(s)" if n else f"({prior})")
            yield (f"pauses in place: start {side(r.up_s, r.up_n, r.configured_up_s)}; "
                   f"grow {kind(r.grow_s, r.grow_n, 'its profile or the configured up')}; "
                   f"shrink {side(r.down_s, r.down_n, r.configured_down_s)}; "
                   f"preemption {kind(r.preemption_s, r.preemption_n, 'as the shrink')}; "
                   f"loss {kind(r.loss_s, r.loss_n, 'as a preemption')}, not charged")
    if job.curve:
        counts = job.probes or ((job.probe,) if job.probe else ())
        probe = (f", still to measure at {', '.join(map(str, counts))} node(s): "
                 "the largest its share of idle nodes reaches first" if counts else "")
        yield (f"predicted throughput ({job.curve_source}{probe}): " +
               ", ".join(f"{n}: {v:.4g}" for n, v in job.curve.items()))
    if job.history:
        yield "recent changes:"
        for h in job.history:
            when = time.strftime("%H:%M:%S", time.localtime(h.t))
            yield (f"  {when} cycle {h.cycle}: {h.kind} [{h.from_nodes or '-'}] -> "
                   f"[{h.to_nodes or '-'}]: {h.reason}" + (f" [{h.code}]" if h.code else ""))


def cmd_campaign(args) -> int:
    from malletrain import campaign
    spec = campaign.load_spec(args.spec)
    if args.dir:
        spec = dataclasses.replace(spec, dir=os.path.abspath(args.dir))
    cfg = _config(args.config)
    metrics_dir = metrics_dir_path(args.metrics_dir or os.path.join(spec.dir, "metrics"))
    if spec.study:
        return _study_campaign(args, spec, cfg, metrics_dir)
    st = campaign.load_state(spec)      # a broken state file stops both actions before Slurm is asked
    if args.campaign_command == "submit":
        make_dir(spec.dir, "campaign directory")
        make_dir(metrics_dir)
        submit_one, find, list_queue = _trial_submitter(spec, cfg, metrics_dir)
        from malletrain.campaign.slots import locked
        # under the campaign's lock, and the queue listed inside it: a submit that ran beside
        # this one cannot have queued a job this one's listing misses (it would be judged gone
        # and its trial submitted twice)
        with locked(spec.dir):
            trials = campaign.submit_campaign(
                spec, submit_one, lambda i: uuid.uuid4().hex[:16], queued=list_queue,
                find_token=find, say=lambda msg: say(msg, file=sys.stderr))
        say(f"campaign {spec.name}: {len(trials)} trial(s) submitted held; the daemon starts them "
              f"on idle nodes. `malletrain campaign status {args.spec}` shows progress.", file=sys.stderr)
        return 0
    if not st["trials"]:
        raise InputError("nothing submitted yet: run `malletrain campaign submit` first",
                         path=campaign.state_path(spec))
    states = _job_states(cfg)
    rows = campaign.status_rows(spec, st["trials"], states, metrics_dir)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for line in campaign.format_status(spec, rows):
            say(line)
    return 0


def _job_states(cfg: Config) -> dict[str, tuple[str, int]]:
    """Job id -> (state, node count) of the caller's own jobs ({} when Slurm cannot be asked:
    a campaign's status still shows its files and study)."""
    states: dict[str, tuple[str, int]] = {}
    try:
        out = _runner(cfg).read(["squeue", "-h", "-a", "-u", str(os.getuid()), "-o", "%i|%T|%D"])
    except Exception as exc:   # noqa: BLE001 - status goes on without Slurm's states
        say(f"malletrain: warning: no job states from Slurm ({exc})", file=sys.stderr)
        return states
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 3:
            continue
        jid, state, nodes = job_of(parts[0]), parts[1].lower(), int(parts[2]) if parts[2].isdigit() else 0
        if jid == parts[0]:
            states[jid] = (state, nodes)
            continue
        # an elastic group (issue #26): one line per member or merged pending members; the group
        # runs on the nodes of its running members (one each), and is pending when none runs
        was, held = states.get(jid, ("", 0))
        if state == "running":
            states[jid] = ("running", held + nodes if was == "running" else nodes)
        elif was != "running":
            states[jid] = (was or state, 0)
    return states


def job_of(jid: str) -> str:
    """The job a queue line's id belongs to: an array task's (``7_2``, ``7_[3-5]``) is its array's."""
    base, sep, task = jid.partition("_")
    return base if sep and base.isdigit() and task else jid


def _trial_submitter(spec, cfg: Config, metrics_dir: str):
    """(submit_one, find_token, list_queue) for a campaign's trial jobs, as their owner:
    ``list_queue()`` is the ids of the caller's jobs Slurm has now (None: unknown)."""
    from malletrain.slurm.submit import find_token, profile_name, submit_job
    runner = _runner(cfg)
    job = spec.job

    def submit_one(name: str, command: list[str], token: str) -> str:
        jid = submit_job(
            runner, cfg.slurm.partition, command, token=token, metrics_dir=metrics_dir, name=name,
            min_nodes=job.get("min_nodes", 1), max_nodes=job.get("max_nodes", 4),
            gpus_per_node=job.get("gpus_per_node", 0), profile=job.get("profile", profile_name(spec.name)),
            time_limit=job.get("time"), rescale_up_s=job.get("rescale_up_s", 30.0),
            rescale_down_s=job.get("rescale_down_s", 20.0), grace_s=job.get("grace_s", 30.0),
            launch=job.get("launch", "srun"), elastic=bool(job.get("elastic", False)))
        say(f"{name}: job {jid}", file=sys.stderr)
        return jid

    def list_queue() -> set[str] | None:
        try:
            out = runner.read(["squeue", "-h", "-a", "-u", str(os.getuid()), "-o", "%i"])
        except Exception as exc:   # noqa: BLE001 - without the queue no job is judged gone
            say(f"malletrain: warning: cannot list the queue ({exc}); no trial job is judged gone",
                file=sys.stderr)
            return None
        return {job_of(jid) for jid in out.split()}      # an elastic group's tasks: its array's id
    return submit_one, (lambda token: find_token(runner, token, cfg.slurm.partition)), list_queue


def _campaign_tick(spec, study, submit: dict, say_fn=None):
    """Queue a study campaign's next trial jobs with the settings its first submit recorded."""
    from malletrain.campaign import slots
    cfg = _config(submit.get("config"))
    submit_one, find, list_queue = _trial_submitter(spec, cfg, submit["metrics_dir"])
    python = submit.get("python") or sys.executable
    return slots.tick(spec, study, submit_one=submit_one, new_token=lambda: uuid.uuid4().hex[:16],
                      slot_command=lambda slot: [python, "-m", "malletrain", "campaign", "trial", spec.dir, slot],
                      queued=list_queue, find_token=find, say=say_fn or (lambda m: say(m, file=sys.stderr)))


def _study_campaign(args, spec, cfg: Config, metrics_dir: str) -> int:
    """``campaign submit|status`` of a spec with a ``sampler`` (an Optuna study)."""
    from malletrain.campaign import slots
    from malletrain.campaign.status import format_study_status, study_rows
    from malletrain.campaign.study import open_study
    if args.campaign_command == "submit":
        make_dir(spec.dir, "campaign directory")
        make_dir(metrics_dir)
        slots.freeze(spec)
    elif not os.path.exists(slots.ledger_path(spec.dir)):
        raise InputError("nothing submitted yet: run `malletrain campaign submit` first",
                         path=slots.ledger_path(spec.dir))
    else:
        spec = slots.thawed(spec.dir)
    study = open_study(spec)
    with slots.locked(spec.dir):
        led = slots.load_ledger(spec.dir)
        if "submit" not in led:      # what the trial jobs submit their successors with
            led["submit"] = {"config": os.path.abspath(args.config) if args.config else
                             os.environ.get("MALLETRAIN_CONFIG"), "metrics_dir": metrics_dir,
                             "python": sys.executable}
            slots.save_ledger(spec.dir, led)
    ticked = _campaign_tick(spec, study, led["submit"])
    if args.campaign_command == "submit":
        say(f"campaign {spec.name}: {ticked.live} trial job(s) queued or running of {spec.trials} trials "
            f"({len(ticked.submitted)} submitted now, held: the daemon starts them on idle nodes). Each asks "
            f"the study for its parameters when it starts and queues the next when it ends. "
            f"`malletrain campaign status {args.spec}` shows progress.", file=sys.stderr)
        return 0
    if ticked.submitted:        # status reconciles as a trial's end does: say what it queued
        say(f"campaign {spec.name}: {len(ticked.submitted)} trial job(s) the campaign was missing queued now "
            "(held: the daemon starts them on idle nodes)", file=sys.stderr)
    states = _job_states(cfg)
    rows = study_rows(spec, slots.load_ledger(spec.dir)["slots"], study.trials(), states)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for line in format_study_status(spec, rows):
            say(line)
    return 0


# what a trial job's environment holds that a job it submits must not inherit
_JOB_ENV = ("MALLETRAIN_JOB", "MALLETRAIN_METRICS", "MALLETRAIN_RESTART", "MALLETRAIN_GRACE_S", "MALLETRAIN_ELASTIC",
            "MALLETRAIN_TRIAL", "MALLETRAIN_TRIAL_NUMBER", "MASTER_ADDR", "MASTER_PORT")


def cmd_campaign_trial(args) -> int:
    """A trial job's process: bind its trial, run it, close out, queue the next (campaign.trial)."""
    import logging

    from malletrain.campaign import slots
    from malletrain.campaign.study import open_study
    from malletrain.campaign.trial import run_trial
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    directory = os.path.abspath(args.dir)

    def ticker(spec, study) -> None:
        for key in [k for k in os.environ if (k.startswith("SLURM_") and k != "SLURM_CONF") or k in _JOB_ENV]:
            del os.environ[key]          # the trial's own job and rank: not the next job's
        submit = slots.load_ledger(spec.dir).get("submit")
        if isinstance(submit, dict) and isinstance(submit.get("metrics_dir"), str):
            _campaign_tick(spec, study, submit)
    return run_trial(directory, args.slot, open_study=open_study, ticker=ticker, peers=_running_members)


def _running_members(array: str) -> dict[int, str] | None:
    """An elastic trial's members Slurm shows running: task -> start time (None: Slurm not asked)."""
    from malletrain.domain.model import MAX_MEMBERS
    try:
        out = _runner(_config(None)).read(["squeue", "-h", "-r", "-j", array, "-t", "running", "-o", "%K|%S"])
    except Exception as exc:   # noqa: BLE001 - without Slurm's word no failure is counted
        say(f"malletrain: warning: cannot list the trial's members ({exc})", file=sys.stderr)
        return None
    members = {}
    for line in out.splitlines()[:MAX_MEMBERS]:
        task, _, start = line.partition("|")
        if task.isdigit() and len(task) < 8:
            members[int(task)] = start[:40]
    return members


def cmd_config_check(args) -> int:
    from malletrain.daemon.loop import check_config
    cfg = check_config(load_config(args.file), args.file)
    print(f"{args.file}: ok (interval {cfg.daemon.interval_s:g}s, partition {cfg.slurm.partition}, "
          f"policy {cfg.core.policy}, state in {cfg.daemon.state_dir})")
    return 0


def cmd_daemon(args) -> int:
    from malletrain.daemon.loop import Daemon
    from malletrain.daemon.service import setup_logging
    cfg = load_config(args.config)
    cf = setup_logging(cfg.daemon.log_format)
    d = Daemon(args.config, log_filter=cf)
    if args.cycles:
        for _ in range(args.cycles):
            d.cycle_once()
            time.sleep(d.config.daemon.interval_s)
        d.store.close()
        return 0
    return d.run()


def add_commands(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("daemon", help="run the harvesting service (systemd runs this)",
                       description="Poll Slurm every interval, re-allocate idle nodes among malleable "
                                   "jobs, apply the plan. SIGHUP reloads the config, SIGTERM stops "
                                   "(jobs keep running).")
    d.set_defaults(run=cmd_daemon)
    d.add_argument("--config", required=True, help="YAML config (see `malletrain config check`)")
    d.add_argument("--cycles", type=int, default=0, help="run N cycles and exit (debugging)")

    c = sub.add_parser("config", help="configuration tools")
    csub = c.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    cc = csub.add_parser("check", help="validate a config file (exit 2 with the reason if bad)")
    cc.set_defaults(run=cmd_config_check)
    cc.add_argument("file")

    s = sub.add_parser("submit", help="submit a malleable job as yourself",
                       description="Submit COMMAND as a malleable job: held in the scavenger "
                                   "partition until the daemon gives it idle nodes; requeued on "
                                   "preemption. COMMAND must checkpoint on SIGTERM/SIGUSR2.",
                       epilog="example: malletrain submit --name lr-0.1 --min-nodes 1 --max-nodes 4 "
                              "-- python train.py --lr 0.1")
    s.set_defaults(run=cmd_submit)
    s.add_argument("--name", default="malleable", help="job name")
    s.add_argument("--min-nodes", type=int, default=1)
    s.add_argument("--max-nodes", type=int, default=4)
    s.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node to request (0: none)")
    s.add_argument("--profile", help="jobs of one model share scaling priors (default: --name)")
    s.add_argument("--time", help="Slurm time limit, e.g. 4:00:00")
    s.add_argument("--rescale-up", type=float, default=30.0, metavar="S",
                   help="seconds a start or grow costs (restart + restore), default 30")
    s.add_argument("--rescale-down", type=float, default=20.0, metavar="S",
                   help="seconds a shrink costs, default 20")
    s.add_argument("--grace-s", type=float, default=30.0, metavar="S",
                   help="the partition's GraceTime: the job must checkpoint and exit within it "
                        "(exported as MALLETRAIN_GRACE_S), default 30")
    s.add_argument("--launch", choices=LAUNCHES, default="srun",
                   help="srun: one process per GPU (or per CPU-only node) via srun (default); "
                        "batch: run COMMAND once in the batch shell; torchrun: torchrun on every node "
                        "(as many workers as srun would start), rendezvous and port from the job, "
                        "the stop signal and grace time passed to the workers (COMMAND: python "
                        "SCRIPT.py ARGS or python -m MODULE ARGS)")
    s.add_argument("--elastic", action="store_true",
                   help="rescale in place (issue #26): submit a held array of --max-nodes members of one "
                        "node each, one process per member; the daemon starts and stops members one node "
                        "at a time and a Slurm preemption stops only the members on the nodes it takes, "
                        "while the running members re-form without a restart. The script must use "
                        "RuntimeConfig(elastic=True) (README: 'Rescaling in place')")
    s.add_argument("--metrics-dir", help="shared directory for progress files and output "
                                         "(default $MALLETRAIN_METRICS_DIR or ~/.malletrain/metrics)")
    s.add_argument("--config", help=f"daemon config (default $MALLETRAIN_CONFIG or {DEFAULT_CONFIG})")
    s.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND...")

    from malletrain.campaign.spec import __doc__ as campaign_doc
    cp = sub.add_parser("campaign", help="NAS/HPO campaigns of malleable trials",
                        description=campaign_doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    cpsub = cp.add_subparsers(dest="campaign_command", required=True, metavar="ACTION")
    tr = cpsub.add_parser("trial", help="what a trial job runs (sbatch'ed by campaign submit)",
                          description="Run trial job SLOT of the study campaign in DIR: ask the study "
                                      "for the trial's parameters at its first start (the same trial at "
                                      "every later start), run the spec's command, close the trial out "
                                      "and queue the campaign's next trial jobs.")
    tr.set_defaults(run=cmd_campaign_trial)
    tr.add_argument("dir", help="the campaign directory")
    tr.add_argument("slot", help="the trial job's id in campaign.json (s000, ...)")
    for action, helptext in (("submit", "submit the trials not yet submitted (idempotent)"),
                             ("status", "trials, progress and the best result so far (it also queues the trial jobs "
                                        "the campaign is missing, as a trial's end does, and says so)")):
        a = cpsub.add_parser(action, help=helptext)
        a.set_defaults(run=cmd_campaign)
        a.add_argument("spec", help="campaign spec YAML (examples/train/*.yaml)")
        a.add_argument("--dir", help="campaign directory (overrides the spec's dir)")
        a.add_argument("--metrics-dir", help="progress files and job output (default <dir>/metrics)")
        a.add_argument("--config", help=f"daemon config (default $MALLETRAIN_CONFIG or {DEFAULT_CONFIG})")
        if action == "status":
            a.add_argument("--json", action="store_true", help="print the rows as JSON")

    for name, helptext in (("status", "table of malleable jobs, sizes, throughput and reasons"),
                           ("explain", "why a job has its current size")):
        p = sub.add_parser(name, help=helptext)
        p.set_defaults(run=cmd_explain if name == "explain" else cmd_status)
        if name == "explain":
            p.add_argument("job", help="Slurm job id")
        else:
            p.add_argument("--json", action="store_true", help="print the raw status JSON")
        p.add_argument("--state-dir", help="the daemon's state_dir (default: from --config)")
        p.add_argument("--config", help=f"daemon config (default $MALLETRAIN_CONFIG or {DEFAULT_CONFIG})")
