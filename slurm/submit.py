"""Submitting malleable jobs: the batch script, the sbatch argv, idempotent sbatch.

The batch script is ``templates/malleable.sbatch`` (package data, read with
:mod:`importlib.resources`, so an installed copy finds it) with its
``{{fields}}`` filled in.  ``sbatch --parsable`` runs with the job held in the
harvest partition, ``--requeue``, a preemption signal, appended output and a
``--comment`` tag carrying the job's spec and a unique token; a retried
submission first looks the token up, so it never duplicates a job.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import time
from collections.abc import Sequence
from importlib import resources

from malletrain.domain.errors import InputError
from malletrain.domain.model import LAUNCHES, MAX_GPUS_PER_NODE, MAX_GRACE_S
from malletrain.domain.safefile import write_atomic
from malletrain.domain.text import clipped
from malletrain.domain.timeutil import is_slurm_time
from malletrain.slurm.groups import MAX_MEMBERS
from malletrain.slurm.parse import TAG_FORMAT, Tag, parse_tag, parse_tag_record, tag_problem
from malletrain.slurm.runner import Runner, SlurmCommandError

log = logging.getLogger("malletrain.slurm")

TEMPLATE = "malleable.sbatch"     # package data: malletrain/slurm/templates/


def render_script(command: list[str], *, metrics_dir: str, grace_s: float, launch: str,
                  tasks_per_node: int, template: str | None = None, elastic: bool = False) -> str:
    """The batch script: ``templates/malleable.sbatch`` with its {{fields}} filled in.

    ``launch=srun`` runs ``tasks_per_node`` copies of COMMAND per node (one per GPU,
    or one per CPU-only node) in one job step; ``batch`` runs COMMAND once in the
    batch shell (it launches its own processes, or is single-process); ``torchrun`` runs
    torchrun on every node, ``tasks_per_node`` workers each (:func:`torchrun_command`).
    """
    if launch not in LAUNCHES:
        raise InputError(f"unknown launch {launch!r}; valid: {', '.join(LAUNCHES)}")
    if template is None:
        template = read_template()
    cmd = shlex.join(command)
    if launch == "srun":
        # no --kill-on-bad-exit: one task exiting 3 ("stopped") must not turn its peers'
        # clean exits into "Terminated" (srun would then return 143, not 3)
        cmd = f"srun --ntasks-per-node={tasks_per_node} {cmd}"
    elif launch == "torchrun":
        cmd = f"srun --ntasks-per-node=1 {shlex.join(torchrun_command(command, tasks_per_node))}"
    fields = {"metrics_dir": shlex.quote(metrics_dir), "grace_s": shlex.quote(f"{grace_s:g}"), "launch": cmd,
              "elastic": "1" if elastic else "0"}
    # one pass: a value that itself contains {{...}} is never expanded again
    return _FIELD.sub(lambda m: fields[m.group(1)] if m.group(1) in fields else m.group(0), template)


_FIELD = re.compile(r"\{\{(\w+)\}\}")
_PYTHON = re.compile(r"^python[0-9.]*$")


def torchrun_command(command: list[str], nproc_per_node: int) -> list[str]:
    """``PYTHON SCRIPT ARGS`` or ``PYTHON -m MODULE ARGS`` as the torchrun launch runs it on each
    node: ``PYTHON -m malletrain.runtime.torchrun --nproc-per-node K -- SCRIPT ARGS`` (the
    rendezvous, signals and grace time come from the job: :mod:`malletrain.runtime.torchrun`).
    The workers run under the same interpreter, which must have malletrain and torch."""
    if not command or not _PYTHON.match(os.path.basename(command[0])):
        raise InputError("--launch torchrun runs a Python training script: COMMAND must be "
                         "'python SCRIPT.py ARGS...' or 'python -m MODULE ARGS...'")
    rest = command[1:]
    if not rest or (rest[0].startswith("-") and rest[0] not in ("-m",)) or (rest[0] == "-m" and len(rest) < 2):
        raise InputError("--launch torchrun: put interpreter options in the environment (PYTHONUNBUFFERED=1, "
                         "...); COMMAND must be 'python SCRIPT.py ARGS...' or 'python -m MODULE ARGS...'")
    return [command[0], "-m", "malletrain.runtime.torchrun", "--nproc-per-node", str(nproc_per_node), "--", *rest]


def profile_name(text: str) -> str:
    """A valid profile name made from free text (a job or campaign name)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", text)[:64]


def build_submission(command: list[str], *, name: str, min_nodes: int, max_nodes: int,
                     gpus_per_node: int, profile: str, time_limit: str | None,
                     rescale_up_s: float, rescale_down_s: float, metrics_dir: str,
                     partition: str, token: str, script_path: str, signal_s: int = 60,
                     grace_s: float = 30.0, launch: str = "srun", elastic: bool = False,
                     extra: list[str] | None = None) -> tuple[list[str], str]:
    """The sbatch argv and the batch script (pure; golden-tested).

    ``elastic``: the job is an elastic group (issue #26): a held array of ``max_nodes`` members
    of one node each, every member one process of the training script (``RuntimeConfig(elastic=
    True)``, its member id ``SLURM_ARRAY_TASK_ID``); the daemon starts and stops members one node
    at a time and the running ones re-form in place."""
    if not command:
        raise InputError("no command given (put it after --)")
    if not 1 <= min_nodes <= max_nodes:
        raise InputError(f"need 1 <= --min-nodes <= --max-nodes, got {clipped(min_nodes)} and "
                         f"{clipped(max_nodes)}")
    if elastic and max_nodes > MAX_MEMBERS:
        raise InputError(f"--elastic: at most {MAX_MEMBERS} members (--max-nodes)")
    if elastic and launch == "torchrun":
        raise InputError("--elastic runs one process per node (each member re-forms the group itself): "
                         "use --launch srun or batch, not torchrun")
    tag = Tag(token, min_nodes, max_nodes, profile, rescale_up_s, rescale_down_s, metrics_dir,
              name=name if name.isprintable() else "", group=elastic)
    problem = tag_problem(tag)
    if problem:
        raise InputError(f"cannot make a malleable job of this: {problem}")
    check_job_values(gpus_per_node=gpus_per_node, grace_s=grace_s, time_limit=time_limit)
    # sbatch expands %x/%j in --output; a '%' of the directory itself is written %%
    out = f"{metrics_dir.replace('%', '%%')}/" + ("%x-%A_%a.out" if elastic else "%x-%j.out")
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--partition={partition}",
            f"--nodes={1 if elastic else min_nodes}", "--exclusive", "--requeue", "--hold",
            f"--signal=B:USR2@{signal_s}", "--open-mode=append", f"--output={out}", f"--comment={tag.encode()}"]
    if elastic:
        argv.insert(5, f"--array=0-{max_nodes - 1}")
    if gpus_per_node:
        argv.append(f"--gres=gpu:{gpus_per_node}")
    if time_limit:
        argv.append(f"--time={time_limit}")
    argv += list(extra or [])
    argv.append(script_path)
    script = render_script(command, metrics_dir=metrics_dir, grace_s=grace_s, launch=launch,
                           tasks_per_node=1 if elastic else gpus_per_node or 1, elastic=elastic)
    return argv, script


def check_job_values(*, gpus_per_node: int, grace_s: float, time_limit: str | None) -> None:
    """:class:`InputError` for the submission values the tag does not carry (checked before
    anything is written or run)."""
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) \
            or not 0 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise InputError(f"need 0 <= --gpus-per-node <= {MAX_GPUS_PER_NODE}, got {clipped(gpus_per_node)}")
    if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not 0 <= grace_s <= MAX_GRACE_S:
        raise InputError(f"--grace-s: need a finite number of seconds in [0, {MAX_GRACE_S:g}], "
                         f"got {clipped(grace_s)}")
    if time_limit not in (None, "") and not (isinstance(time_limit, str) and is_slurm_time(time_limit)):
        raise InputError("--time: need a Slurm time limit (minutes, [days-]hours:minutes:seconds, ...; "
                         f"e.g. 4:00:00), got {clipped(time_limit)}")


def read_template() -> str:
    """The shipped batch-script template."""
    try:
        return resources.files("malletrain.slurm").joinpath("templates", TEMPLATE).read_text("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read the sbatch template: {exc.strerror}",
                         path=f"malletrain/slurm/templates/{TEMPLATE}") from None


def find_token(runner: Runner, token: str, partition: str, uid: int | None = None) -> str | None:
    """The id of the caller's live job in ``partition`` whose tag carries ``token``, if any.

    Only the caller's own jobs are listed, and each one's comment is read alone
    (another user's comment cannot forge a match).
    """
    uid = os.getuid() if uid is None else uid
    ids = runner.read(["squeue", "-h", "-a", "-r", "-u", str(uid), "-p", partition, "-o", "%i"]).split()
    seen: set[str] = set()
    for jid in ids:       # a plain job's id, or an elastic group's member ARRAY_TASK (one read per array)
        m = _JOB_OR_TASK.fullmatch(jid)
        if m is None or m.group(1) in seen:
            continue
        seen.add(m.group(1))
        rec = parse_tag_record(jid, runner.read(["squeue", "-h", "-j", jid, "-o", TAG_FORMAT]))
        tag = parse_tag(rec.comment) if rec is not None and rec.uid == uid else None
        if tag is not None and tag.token == token and tag.group == bool(m.group(2)):
            return m.group(1)
    return None


_JOB_OR_TASK = re.compile(r"(\d{1,12})(_\d{1,7})?")


def user_env(runner: Runner) -> dict[str, str]:
    """sbatch's environment: the user's own, untouched (SBATCH_ACCOUNT, SBATCH_QOS, LANG …
    keep working; the job inherits it), plus the configured SLURM_CONF."""
    env = dict(os.environ)
    if runner.env.get("SLURM_CONF"):
        env["SLURM_CONF"] = runner.env["SLURM_CONF"]
    return env


def submit(runner: Runner, argv: Sequence[str], token: str, partition: str, *, attempts: int = 3) -> str:
    """``sbatch --parsable`` made idempotent: before every retry, look the token up."""
    last: SlurmCommandError | None = None
    for attempt in range(attempts):
        if attempt:
            found = find_token(runner, token, partition)
            if found:
                log.info("sbatch attempt %d had succeeded: job %s carries token %s", attempt, found, token)
                return found
            time.sleep(0.5 * attempt)
        try:
            out = runner.write(list(argv), env=user_env(runner))
            return out.strip().split(";")[0]
        except SlurmCommandError as exc:
            last = exc
            log.warning("sbatch failed (attempt %d): %s", attempt + 1, exc)
    found = find_token(runner, token, partition)
    if found:
        return found
    assert last is not None
    raise last


def submit_job(runner: Runner, partition: str, command: list[str], *, token: str, metrics_dir: str,
               **spec) -> str:
    """Write the batch script and sbatch it (idempotent per token); the job id."""
    script_path = os.path.join(metrics_dir, f"job-{token}.sbatch")
    argv, script = build_submission(command, metrics_dir=metrics_dir, partition=partition,
                                    token=token, script_path=script_path, **spec)
    # private (0700: only its owner reads it; sbatch sends Slurm a copy), written to a new file
    # of random name (O_EXCL|O_NOFOLLOW) renamed over the name: never through a planted symlink
    try:
        write_atomic(script_path, script.encode("utf-8"), 0o700)
    except OSError as exc:
        raise InputError(f"cannot write the batch script: {exc.strerror or exc}", path=script_path) from None
    return submit(runner, argv, token, partition)
