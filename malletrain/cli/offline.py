"""Offline commands: ``replay``, ``jpa predict``, ``bench``, ``selfcheck``.

Each handler turns the argparse namespace into typed arguments of a library
call; nothing below this package sees argparse.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys

from malletrain.cli.args import bounded, positive, say, time_arg
from malletrain.domain.config import ALLOCATORS, MAX_SECONDS, OBJECTIVES, POLICIES, CoreConfig, read_text
from malletrain.domain.errors import InputError
from malletrain.domain.model import MAX_NODES, MAX_PAUSE_S
from malletrain.domain.text import clipped

EPILOG_REPLAY = """\
trace formats (auto-detected):
  node events  CSV(.gz) with header time,node,state (state idle|busy)
  SWF          Standard Workload Format job log (use --procs-per-node)
  sacct        sacct --allusers --allocations --parsable2
               --format JobID,Start,End,NodeList,State
outputs in OUT: summary.json, timeline.csv, jobs.csv, nodes.png, progress.png

example:
  malletrain replay --trace examples/philly-1day.csv.gz \\
      --workload examples/workload-pollux.yaml --policy malletrain --out out/malletrain
"""


# the flags' ranges: beyond them a replay would not end or would allocate without bound
INTERVAL = bounded(float, 0.1, 1e7)          # seconds between decisions
NODES = positive(int, MAX_NODES)
JOBS = positive(int, 1_000_000)
NOISE = bounded(float, 0, 1)                 # relative: 1 = as large as the rate itself
TIME_LIMIT = positive(float, 1e6)            # a solver limit per decision
ELASTIC_HELP = ("every job rescales in place (issue #26's elastic jobs): a shrink or preemption pauses it "
                "SHRINK s, a grow pauses it GROW s while the new nodes start their processes for the "
                "workload's rescale_up_s; a start from no nodes is still a restart. Measured here: "
                "0.05,0.038 (README, 'Rescaling in place')")


def add_commands(sub: argparse._SubParsersAction) -> None:

    r = sub.add_parser("replay", help="replay a recorded schedule with a policy",
                       description="Replay a primary-workload trace and a malleable workload "
                                   "through the decision core; write summary, timeline and plots.",
                       epilog=EPILOG_REPLAY, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.set_defaults(run=cmd_replay)
    r.add_argument("--trace", required=True, help="node-event CSV(.gz), SWF log, or sacct export")
    r.add_argument("--format", default="auto", choices=("auto", "events", "swf", "sacct"),
                   help="trace format (default: detect)")
    r.add_argument("--workload", required=True, help="malleable workload YAML")
    r.add_argument("--policy", default="malletrain", choices=POLICIES,
                   help="malletrain: learns curves (JPA); oracle: true curves; bftrainer: "
                        "per-node MILP with true curves; greedy: marginal gain; static: fixed size FIFO")
    r.add_argument("--out", required=True, help="output directory (written atomically)")
    r.add_argument("--interval", type=INTERVAL, default=30.0, metavar="S",
                   help="decide at least every S seconds (default 30)")
    r.add_argument("--horizon", type=positive(float, MAX_SECONDS), default=600.0, metavar="S",
                   help="look-ahead H of the objective (default 600)")
    r.add_argument("--start", type=time_arg, help="replay from TIME (ISO-8601 or epoch)")
    r.add_argument("--end", type=time_arg, help="replay until TIME")
    r.add_argument("--nodes", type=NODES, metavar="N", help="first N distinct nodes in trace order")
    r.add_argument("--max-jobs", type=JOBS, metavar="K",
                   help="at most K admitted jobs at once (FIFO by submit time)")
    r.add_argument("--procs-per-node", type=positive(int, MAX_NODES), default=1, metavar="P",
                   help="SWF: processors per node (default 1)")
    r.add_argument("--harvest-partition", action="append", default=[], metavar="NAME", type=_partition,
                   help="sacct export (with a Partition column): the partition malletrain harvested in; "
                        "its jobs, elastic groups' members included, ran on idle nodes and are left out "
                        "of the busy time (repeatable)")
    r.add_argument("--seed", type=int, default=0, help="seed for sample noise (default 0)")
    r.add_argument("--noise", type=NOISE, default=0.0, metavar="F",
                   help="relative noise of reported throughput samples, e.g. 0.05")
    r.add_argument("--allocator", default="auto", choices=ALLOCATORS,
                   help="auto: exact knapsack DP for one node type, else CBC MILP")
    r.add_argument("--time-limit", type=TIME_LIMIT, default=5.0, metavar="S",
                   help="MILP time limit per decision (default 5)")
    r.add_argument("--min-dwell", type=bounded(float, 0, MAX_SECONDS), default=0.0, metavar="S",
                   help="keep a new size at least S seconds (hysteresis; default 0)")
    r.add_argument("--objective", default="samples", choices=OBJECTIVES,
                   help="samples: samples/s summed over jobs (default); speedup: each job in node-"
                        "equivalents of its smallest size; progress: share of each job's work per second")
    r.add_argument("--weight", action="append", default=[], metavar="USER=W", type=_weight,
                   help="a workload user's jobs count W times (repeatable; default 1)")
    r.add_argument("--starvation", type=bounded(float, 0, MAX_SECONDS), default=0.0, metavar="S",
                   help="an admitted job waiting S seconds gets min_nodes before others grow (0 = off)")
    r.add_argument("--rescale-guess", type=_guess, default=(30.0, 10.0), metavar="UP,DOWN",
                   help="the rescale pauses (s) the malletrain and bftrainer-guess policies are told "
                        "and learn from (default 30,10); 'truth': the workload's")
    r.add_argument("--elastic", type=_pauses, metavar="GROW,SHRINK", help=ELASTIC_HELP)
    r.add_argument("--no-learn-rescale", action="store_true",
                   help="charge the told pauses for ever (no measurements)")
    r.add_argument("--no-availability", action="store_true",
                   help="no predicted node stays (every node counts as staying)")
    r.add_argument("--node-info", metavar="FILE",
                   help="CSV node,group,slowdown: the nodes' topology groups and speeds (default: all alike)")
    r.add_argument("--no-variability", action="store_true",
                   help="place without learning which jobs suffer on slow nodes")
    r.add_argument("--window-oracle", action="store_true",
                   help="hand every idle node its true next busy time (a look-ahead no scheduler has)")
    r.add_argument("--planned-lead", type=bounded(float, 0, MAX_SECONDS), metavar="S",
                   help="hand every idle node its true next busy time S seconds before it comes, as "
                        "Slurm's planned start of a pending job would (what live planning buys)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    ad = sub.add_parser("advise", help="how many nodes to ask for: time, node-hours, deadline",
                        description="Predict samples/s (with the JPA's uncertainty band), the time to "
                                    "finish WORK samples and the node-hours at each node count, and "
                                    "recommend the count that meets a deadline and the one with the "
                                    "fewest node-hours within it (also for the pessimistic end of "
                                    "the band).",
                        epilog="example:\n  printf 'nodes,samples_per_s\\n1,95\\n2,181\\n4,333\\n' > s.csv\n"
                               "  malletrain advise --samples s.csv --work 5e7 --deadline 36h",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ad.set_defaults(run=cmd_advise)
    src = ad.add_mutually_exclusive_group(required=True)
    src.add_argument("--samples", help="CSV with header nodes,samples_per_s (measurements)")
    src.add_argument("--profile", help="a profile the daemon measured (read from --state-dir)")
    ad.add_argument("--state-dir", default="/var/lib/malletrain", help="the daemon's state_dir")
    ad.add_argument("--nodes", default="1,2,4,8,16,32,64", help="counts to consider (default 1,2,4,..,64)")
    ad.add_argument("--work", type=positive(float, 1e18), metavar="SAMPLES", help="samples to finish")
    ad.add_argument("--deadline", type=_duration, metavar="T", help="finish within T (s, or 90m, 36h, 2d)")
    ad.add_argument("--json", action="store_true", help="print JSON only")

    j = sub.add_parser("jpa", help="job profiling advisor tools")
    jsub = j.add_subparsers(dest="jpa_command", required=True, metavar="ACTION")
    jp = jsub.add_parser("predict", help="predict throughput at node counts from measurements",
                         description="Fit the scaling model to measured (nodes, samples_per_s) "
                                     "rows and print JSON {n: {mean, low, high}}.")
    jp.set_defaults(run=cmd_jpa_predict)
    jp.add_argument("--samples", required=True, help="CSV with header nodes,samples_per_s")
    jp.add_argument("--nodes", required=True, help="comma-separated counts, e.g. 1,2,4,8")

    b = sub.add_parser("bench", help="benchmarks (print their figures)")
    bsub = b.add_subparsers(dest="bench_command", required=True, metavar="WHICH")
    ba = bsub.add_parser("allocator", help="decision latency of the malletrain decide step")
    ba.set_defaults(run=cmd_bench_allocator)
    ba.add_argument("--nodes", type=positive(int, 1_000_000), default=4734)
    ba.add_argument("--jobs", type=positive(int, 100_000), default=100)
    ba.add_argument("--repeat", type=positive(int, 10_000), default=20)
    ba.add_argument("--no-forecasts", dest="forecasts", action="store_false",
                    help="decide without predicted node stays and learned pauses (the objective "
                         "before issue #12)")
    ba.add_argument("--no-idle-collect", dest="idle_collect", action="store_false",
                    help="no full garbage collection between decisions (the daemon runs one while it "
                         "waits, when one is due): decisions then also pay Python's own")
    ba.add_argument("--seed", type=int, default=0)
    ba.add_argument("--json", action="store_true", help="print JSON only")
    bc = bsub.add_parser("compare", help="BFTrainer per-node MILP (CBC) vs. count-based allocator")
    bc.set_defaults(run=cmd_bench_compare)
    bc.add_argument("--sizes", default="10x64,20x128", help="JOBSxNODES list (default 10x64,20x128)")
    bc.add_argument("--repeat", type=positive(int, 1000), default=3)
    bc.add_argument("--time-limit", type=TIME_LIMIT, default=60.0)
    bc.add_argument("--json", action="store_true")
    bq = bsub.add_parser("quality", help="all policies side by side on one trace and workload",
                         description="Replay one trace and workload under several policies (same seed and "
                                     "noise) and print useful samples, harvest, completions, samples lost "
                                     "to preemptions plus rescale pauses, and decide latency per policy, "
                                     "then malletrain's ratio to each.")
    bq.set_defaults(run=cmd_bench_quality)
    bq.add_argument("--trace", required=True, help="node-event CSV(.gz), SWF log, or sacct export")
    bq.add_argument("--workload", required=True, help="malleable workload YAML")
    bq.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated (default: all: {','.join(POLICIES)})")
    bq.add_argument("--nodes", type=NODES, help="first N distinct nodes in trace order")
    bq.add_argument("--start", type=time_arg, help="replay from TIME (ISO-8601 or epoch)")
    bq.add_argument("--end", type=time_arg, help="replay until TIME")
    bq.add_argument("--max-jobs", type=JOBS, help="at most K admitted jobs at once")
    bq.add_argument("--noise", type=NOISE, default=0.05, help="relative noise of reported samples (default 0.05)")
    bq.add_argument("--interval", type=INTERVAL, default=30.0, metavar="S",
                    help="decide at least every S seconds (default 30)")
    bq.add_argument("--bound", action="store_true",
                    help="add a 'bound' row: oracle with free rescales and the true idle windows "
                         "(the headroom any policy has on this trace)")
    bq.add_argument("--clairvoyant", action="store_true",
                    help="add a 'clairvoyant' row: oracle told the true idle windows and pauses, paying "
                         "the pauses (what knowing the future gives at the real cost of a change)")
    bq.add_argument("--plain", action="store_true",
                    help="add a 'malletrain-plain' row: malletrain without learned pauses, predicted "
                         "stays and variability, told the true pauses (as before issue #12)")
    bq.add_argument("--elastic", type=_pauses, metavar="GROW,SHRINK", help=ELASTIC_HELP)
    bq.add_argument("--planned-lead", type=bounded(float, 0, MAX_SECONDS), metavar="S",
                    help="the policies' rows know each idle node's next busy time S seconds ahead, as "
                         "Slurm's planned starts would (the plain, bound and clairvoyant rows do not change)")
    bq.add_argument("--seeds", type=positive(int, 100), default=1, metavar="K",
                    help="run every row with seeds 0..K-1 and print mean ± sd (default 1)")
    bq.add_argument("--json", action="store_true", help="print JSON only")

    bn = bsub.add_parser("campaign", help="a NAS-Bench-201 campaign on a trace's idle nodes: random search, "
                                          "ASHA, ASHA with promise-aware allocation",
                         description="Replay an Optuna campaign of NAS-Bench-201 cells (CIFAR-100, no training: "
                                     "the table and a stated, seeded learning-curve model) on the idle nodes of "
                                     "a trace, through the decision core, in three modes: random-full (random "
                                     "search, every trial to the end), asha (with Optuna's ASHA pruner) and "
                                     "asha-promise (ASHA, and each user's nodes re-split by how many rungs its "
                                     "trials survived, valued in node-equivalents, the trials at the user's "
                                     "highest rung grown by it).  asha-oracle, asked for by "
                                     "name, is a clairvoyant baseline: each trial's promise is exact and known "
                                     "from its start (the highest for a trial that will reach the target); it "
                                     "is no bound.  asha-first, likewise by name, is a clairvoyant allocation: "
                                     "while a trial that will reach the target is live, the other trials asked "
                                     "wait with no node.  Prints, per mode and seed, the time until "
                                     "a complete trial is within --target points of the table's best, and the "
                                     "node-hours spent on trials that were pruned.  Needs the nasbench and hpo extras.")
    bn.set_defaults(run=cmd_bench_campaign)
    bn.add_argument("--trace", required=True, help="node-event CSV(.gz), SWF log, or sacct export")
    bn.add_argument("--nodes", type=NODES, help="first N distinct nodes in trace order")
    bn.add_argument("--start", type=time_arg, help="replay from TIME (ISO-8601 or epoch)")
    bn.add_argument("--end", type=time_arg, help="replay until TIME")
    bn.add_argument("--modes", default="random-full,asha,asha-promise",
                    help="comma-separated, of random-full, asha, asha-promise, asha-oracle, asha-first "
                         "(default: the first three)")
    bn.add_argument("--seeds", type=positive(int, 100), default=3, metavar="K",
                    help="K seeds from --first-seed on (default 3: seeds 0..2)")
    bn.add_argument("--first-seed", type=bounded(int, 0, 10_000), default=0, metavar="N",
                    help="the first seed (default 0): --first-seed 5 --seeds 5 runs seeds 5..9, the same runs "
                         "as within --seeds 10")
    bn.add_argument("--objective", choices=OBJECTIVES, default="samples",
                    help="the core's objective for every mode (default samples, the daemon's default): "
                         "speedup values every job in node-equivalents, as asha-promise values one "
                         "user's trials among themselves")
    bn.add_argument("--sampler", choices=("random", "tpe"), default="random",
                    help="the study's sampler in every mode (default random: the search of today's "
                         "campaign, and the one --bound needs; tpe: what a campaign spec gets by default)")
    bn.add_argument("--max-concurrent", type=positive(int, 10_000), default=64,
                    help="trial jobs queued at once (default 64)")
    bn.add_argument("--max-nodes", type=positive(int, 16), default=4, help="each trial's max_nodes (default 4)")
    bn.add_argument("--min-resource", type=positive(int, 199), default=2, help="epochs to the first rung (default 2)")
    bn.add_argument("--reduction-factor", type=bounded(int, 2, 10), default=3, help="η (default 3)")
    bn.add_argument("--target", type=bounded(float, 0, 100), default=1.0,
                    help="found: a complete trial within this many points of the table's best (default 1)")
    bn.add_argument("--interval", type=INTERVAL, default=30.0, metavar="S",
                    help="decide at least every S seconds (default 30)")
    bn.add_argument("--plot", metavar="PNG",
                    help="also draw each run's best trial against the hours, with the target and the trace's "
                         "idle node-hours beneath (checked before the runs; written when they end)")
    bn.add_argument("--winners", action="store_true",
                    help="also list, per run, each trial whose cell reaches the target: when it was asked, and "
                         "whether the pruner stopped it (at which rung) or it completed, and the soonest it could have "
                         "completed alone on the idle nodes from its ask: where a run lost its time")
    bn.add_argument("--bound", action="store_true",
                    help="also print, per seed, a time before which no allocation of the ASHA modes can reach "
                         "the target on this trace (the idle node-hours, the order the study asks its cells "
                         "in, each trial's start pause, a trial on at most --max-nodes of the nodes idle at "
                         "each moment, restarted after every moment none is), and the most any allocation "
                         "could gain over each mode run")
    bn.add_argument("--json", action="store_true", help="print JSON only")

    bm = bsub.add_parser("campaign-merge", help="the summary of `bench campaign` runs made in parts "
                                                "(--first-seed), read back from their output",
                         description="Read the output of `bench campaign` runs (stderr with stdout, as "
                                     "benchmarks/campaign.sh keeps it) and print the summary one run of all of "
                                     "them prints: each mode's mean and median time to the target, the ratios "
                                     "between modes, seed for seed with a 95%% bootstrap interval over the seeds, "
                                     "and the bound where every seed has one.  Nothing is replayed.  The parts "
                                     "must name one trace, node count, span and objective; a mode and seed met "
                                     "twice must be the same run; modes that ran different seeds are compared on "
                                     "the seeds all of them ran.")
    bm.set_defaults(run=cmd_bench_campaign_merge)
    bm.add_argument("files", nargs="+", metavar="FILE", help="the output of one part")
    bm.add_argument("--modes", help="comma-separated: only these modes' runs (default: every mode the files hold; "
                                    "the seeds compared are those all the modes kept ran)")
    bm.add_argument("--json", action="store_true", help="print JSON only")

    bs = bsub.add_parser("slurm", help="Slurm commands per cycle and cycle latency on a live cluster",
                         description="Run N real daemon cycles against the cluster the config names "
                                     "(benchmarks/slurm.sh sets up the local one).")
    bs.set_defaults(run=cmd_bench_slurm)
    bs.add_argument("--config", required=True, help="daemon config YAML")
    bs.add_argument("--cycles", type=positive(int, 1_000_000), default=40)
    bs.add_argument("--interval", type=INTERVAL, default=2.0, metavar="S")
    bs.add_argument("--json", action="store_true")

    sc = sub.add_parser("selfcheck", help="check the training runtime on this machine")
    scsub = sc.add_subparsers(dest="selfcheck_command", required=True, metavar="WHAT")
    from malletrain.runtime.selfcheck import __doc__ as selfcheck_doc
    cc = scsub.add_parser("consistency", help="same parameters for every process count and rescale?",
                          description=selfcheck_doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="example:\n  malletrain selfcheck consistency --workers 4 "
                                 "--procs 1,2,3,4 --steps 24 --rescale 1,4,2,3 --kill9")
    cc.set_defaults(run=cmd_selfcheck)
    cc.add_argument("--workers", type=positive(int, 1024), default=4, help="logical workers L (default 4)")
    cc.add_argument("--procs", default="1,2,3,4", help="process counts to compare (default 1,2,3,4)")
    cc.add_argument("--steps", type=positive(int, 1_000_000), default=24, help="training steps (default 24)")
    cc.add_argument("--rescale", metavar="P,P,..", help="also run one job rescaled through these sizes")
    cc.add_argument("--kill9", action="store_true",
                    help="also SIGKILL one segment after a checkpoint and resume it")
    cc.add_argument("--mode", choices=("consistency", "tolerance"), default="consistency",
                    help="tolerance: native all-reduce (expected to differ)")
    cc.add_argument("--mapping", choices=("contiguous", "round_robin"), default="contiguous",
                    help="how logical workers map to processes")
    cc.add_argument("--micro-batch", type=positive(int, 1_000_000), default=8)
    cc.add_argument("--seed", type=int, default=0)
    cc.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    cc.add_argument("--keep", action="store_true", help="keep the runs' checkpoint directories")


def cmd_bench_allocator(args: argparse.Namespace) -> int:
    from malletrain.bench.allocator import bench_allocator
    bench_allocator(args.nodes, args.jobs, args.repeat, args.seed, forecasts=args.forecasts,
                    idle_collect=args.idle_collect).emit(args.json)
    return 0


def cmd_bench_compare(args: argparse.Namespace) -> int:
    from malletrain.bench.allocator import bench_compare
    bench_compare(args.sizes, args.repeat, args.time_limit).emit(args.json)
    return 0


def _listed(flag: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated flag's values, each one of ``allowed`` and at least one (InputError)."""
    got = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in got if x not in allowed]
    if bad or not got:
        raise InputError(f"{flag}: {clipped(', '.join(bad) or text)} is not a list of: {', '.join(allowed)}")
    return got


def cmd_bench_quality(args: argparse.Namespace) -> int:
    from malletrain.bench.quality import bench_quality
    policies = list(_listed("--policies", args.policies, POLICIES))
    bench_quality(args.trace, args.workload, policies, nodes=args.nodes, start=args.start,
                  end=args.end, max_jobs=args.max_jobs, noise=args.noise, interval_s=args.interval,
                  progress=not args.json, bound=args.bound, clairvoyant=args.clairvoyant,
                  plain=args.plain, seeds=args.seeds, planned_lead_s=args.planned_lead,
                  elastic=args.elastic).emit(args.json)
    return 0


def cmd_bench_campaign(args: argparse.Namespace) -> int:
    from malletrain.bench.campaign import MODES, CampaignSetup, bench_campaign
    modes = _listed("--modes", args.modes, MODES)
    if args.bound and args.sampler != "random":
        raise InputError(f"--bound needs --sampler random (the bound knows the cells a random study asks "
                         f"in order; {args.sampler} asks by what it has seen)")
    setup = CampaignSetup(max_concurrent=args.max_concurrent, max_nodes=args.max_nodes,
                          min_resource=args.min_resource, reduction_factor=args.reduction_factor,
                          target_points=args.target, sampler=args.sampler)
    report = bench_campaign(args.trace, modes=modes, seeds=args.seeds, nodes=args.nodes, start=args.start,
                            end=args.end, setup=setup, interval_s=args.interval, progress=not args.json,
                            first_seed=args.first_seed, objective=args.objective, bound=args.bound,
                            plot=args.plot, winners=args.winners)
    report.emit(args.json)
    if report.data.get("plot_error"):       # the figures are out; the plot is not
        print(f"malletrain: error: {report.data['plot_error']}", file=sys.stderr)
        return 2
    return 0


def cmd_bench_campaign_merge(args: argparse.Namespace) -> int:
    from malletrain.bench.campaign import MODES
    from malletrain.bench.campaign_merge import merge_campaigns
    modes = None if args.modes is None else _listed("--modes", args.modes, MODES)
    merge_campaigns(args.files, modes=modes).emit(args.json)
    return 0


def cmd_bench_slurm(args: argparse.Namespace) -> int:
    from malletrain.bench.slurm import bench_slurm
    bench_slurm(args.config, args.cycles, args.interval).emit(args.json)
    return 0


def cmd_selfcheck(args: argparse.Namespace) -> int:
    from malletrain.runtime.selfcheck import consistency
    return consistency(procs=args.procs, rescale=args.rescale, workers=args.workers,
                       steps=args.steps, kill9=args.kill9, mode=args.mode, mapping=args.mapping,
                       micro_batch=args.micro_batch, seed=args.seed, json_path=args.json,
                       keep=args.keep)


def cmd_replay(args: argparse.Namespace) -> int:
    from malletrain.replay.engine import ReplayOptions, check_out_dir, run_replay, write_outputs
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload

    core = CoreConfig(policy=args.policy, horizon_s=args.horizon, allocator=args.allocator,
                      time_limit_s=args.time_limit, min_dwell_s=args.min_dwell, objective=args.objective,
                      user_weights=tuple(sorted(dict(args.weight).items())), starvation_s=args.starvation,
                      learn_rescale=not args.no_learn_rescale, availability=not args.no_availability,
                      variability=not args.no_variability).validate("command line")
    check_out_dir(args.out)       # before the replay, not after it
    workload = load_workload(args.workload)
    node_info = None
    if args.node_info:
        from malletrain.domain.nodes import load_node_info
        node_info = load_node_info(args.node_info)
    trace = load_trace(args.trace, args.format, procs_per_node=args.procs_per_node,
                       nodes=args.nodes, start=args.start, end=args.end,
                       harvest_partitions=tuple(args.harvest_partition))
    if args.harvest_partition and not args.quiet:
        print(f"left out {trace.harvest_jobs} job(s) of the harvest partition(s) "
              f"{', '.join(args.harvest_partition)} ({trace.harvest_members} of their allocations were "
              f"elastic group members, counted as their group's one job)", file=sys.stderr)
    opts = ReplayOptions(core=core, interval_s=args.interval, max_jobs=args.max_jobs,
                         seed=args.seed, noise=args.noise, quiet=args.quiet, rescale_guess=args.rescale_guess,
                         window_oracle=args.window_oracle, planned_lead_s=args.planned_lead,
                         node_info=node_info, elastic=args.elastic)
    result = run_replay(trace, workload, opts)
    write_outputs(result, args.out, plots=not args.no_plots)
    s = result.summary
    if not args.quiet:
        print(f"{s.policy}: useful {s.useful_samples:.4g} samples, harvested "
              f"{100 * s.harvested_fraction:.1f}% of {s.idle_node_s / 3600:.0f} idle node-h, "
              f"{s.jobs_completed}/{s.jobs} jobs done, {s.preemptions} preemptions, "
              f"{s.rescales} rescales, decide p95 {s.decision_ms_p95:.1f} ms, "
              f"wall {s.wall_s:.1f} s -> {args.out}", file=sys.stderr)
    return 0


def _weight(text: str) -> tuple[str, float]:
    user, sep, w = text.partition("=")
    if not sep or not user.strip():
        raise argparse.ArgumentTypeError(f"expected USER=WEIGHT, got {clipped(text)}")
    return user.strip(), bounded(float, 0, 1e6, above=True)(w)


def _pause_pair(text: str, expected: str) -> tuple[float, float]:
    """Two pauses in seconds, ``A,B``, each within [0, MAX_PAUSE_S]."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {clipped(text)}")
    conv = bounded(float, 0, MAX_PAUSE_S)
    return conv(parts[0]), conv(parts[1])


def _partition(text: str) -> str:
    """A Slurm partition name as sacct prints it (printable, no '|' or ',', at most 64 characters)."""
    if not text or len(text) > 64 or not text.isprintable() or any(c in text for c in "|, "):
        raise argparse.ArgumentTypeError(f"not a partition name: {text[:64]!r}")
    return text


def _pauses(text: str) -> tuple[float, float]:
    return _pause_pair(text, "GROW,SHRINK seconds")


def _guess(text: str) -> tuple[float, float] | None:
    if text.strip() == "truth":
        return None
    return _pause_pair(text, "UP,DOWN seconds or 'truth'")


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(text: str) -> float:
    t = text.strip()
    unit = DURATION_UNITS.get(t[-1:], None) if t else None
    return bounded(float, 0, MAX_SECONDS, above=True)(t[:-1] if unit else t) * (unit or 1.0)


def cmd_advise(args: argparse.Namespace) -> int:
    import statistics

    from malletrain.jpa.advise import advise
    counts = _counts(args.nodes)
    if args.samples:
        by: dict[int, list[float]] = {}
        for n, x in _read_samples(args.samples):
            by.setdefault(n, []).append(x)
        measured = {n: statistics.median(v) for n, v in sorted(by.items())}
        what = args.samples
    else:
        measured = _profile_medians(args.state_dir, args.profile)
        what = f"profile {args.profile}"
    adv = advise(measured, counts, args.work, args.deadline)
    if args.json:
        from dataclasses import asdict
        print(json.dumps(asdict(adv), indent=1))
        return 0
    say(f"{what}: measured at {', '.join(map(str, sorted(measured)))} node(s); band = the JPA's "
        "uncertainty (low is pessimistic)")
    head = f"{'nodes':>5}  {'samples/s':>10}  {'band':>21}"
    if args.work:
        head += f"  {'finish':>9}  {'worst':>9}  {'node-h':>8}"
    print(head)
    for a in adv.rows:
        line = f"{a.nodes:>5}  {a.samples_per_s:>10.4g}  [{a.low:>9.4g}, {a.high:>9.4g}]"
        if args.work:
            line += f"  {_hms(a.finish_s):>9}  {_hms(a.finish_worst_s):>9}  {a.node_hours or 0:>8.3g}"
        print(line + ("  measured" if a.measured else ""))
    print(f"fastest: {adv.fastest} nodes")
    if args.work and args.deadline is not None:
        print(f"meets the {_hms(args.deadline)} deadline: {adv.deadline or 'none'} nodes "
              f"(pessimistic: {adv.deadline_safe or 'none'})")
    if args.work:
        within = f" within {_hms(args.deadline)}" if args.deadline is not None else ""
        print(f"fewest node-hours{within}: {adv.cheapest or 'none'} nodes (pessimistic: {adv.cheapest_safe or 'none'})")
    return 0


def _hms(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 86400:.1f}d" if s >= 86400 else f"{s / 3600:.1f}h" if s >= 3600 else f"{s / 60:.1f}m"


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:       # also an integer of more than 4300 digits
        raise InputError(f"--nodes must be comma-separated integers, got {clipped(text)}") from None
    if not counts or len(counts) > 10_000 or any(not 0 < n <= MAX_NODES for n in counts):
        raise InputError(f"--nodes must list 1 to 10000 integers from 1 to {MAX_NODES}, got {clipped(text)}")
    return counts


def _profile_medians(state_dir: str, profile: str) -> dict[int, float]:
    """The profile's measured medians per count, from the daemon's store (read only): each
    finished job that measured 3 counts, scaled onto the first one (jobs differ by batch size)."""
    import statistics

    from malletrain.daemon.store import peek
    path = os.path.join(state_dir, "state.db")
    retired = peek(path, "retired", {}) or {}
    jobs = retired.get(profile) if isinstance(retired, dict) else None
    if not jobs:
        known = ", ".join(sorted(map(str, retired))[:20]) if isinstance(retired, dict) else ""
        raise InputError(f"no finished job of profile {clipped(profile)} measured 3 node counts"
                         f"{'; profiles with data: ' + known if known else ''}", path=path)
    ref = next(iter(jobs.values()))
    by: dict[int, list[float]] = {}
    for m in jobs.values():
        common = [n for n in m if n in ref]
        k = statistics.median(float(ref[n]) / float(m[n]) for n in common) if common else 1.0
        for n, x in m.items():
            by.setdefault(int(n), []).append(float(x) * k)
    return {n: statistics.median(v) for n, v in sorted(by.items())}


def cmd_jpa_predict(args: argparse.Namespace) -> int:
    import statistics

    from malletrain.jpa.scaling import band, fit_scaling
    try:
        counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:       # also an integer of more than 4300 digits
        raise InputError(f"--nodes must be comma-separated integers, got {clipped(args.nodes)}") from None
    if not counts or any(not 0 < n <= MAX_NODES for n in counts):
        raise InputError(f"--nodes must list integers from 1 to {MAX_NODES}, got {clipped(args.nodes)}")
    rows = _read_samples(args.samples)
    by: dict[int, list[float]] = {}
    for n, x in rows:
        by.setdefault(n, []).append(x)
    med = {n: statistics.median(v) for n, v in sorted(by.items())}
    fit = fit_scaling(list(med), list(med.values()), terms=len(med))
    out = {}
    for n in counts:
        mean, low, high = band(fit, n, list(med))
        out[str(n)] = {"mean": round(mean, 6), "low": round(low, 6), "high": round(high, 6)}
    print(json.dumps(out))
    return 0


MAX_SAMPLES_BYTES = 16 << 20
SAMPLES_RANGE = (1e-9, 1e15)   # samples/s: outside, the fit under- or overflows


def _read_samples(path: str) -> list[tuple[int, float]]:
    # a pipe works too (regular=False); /dev/zero stops at the size limit
    text = read_text(path, max_bytes=MAX_SAMPLES_BYTES, what="samples", regular=False)
    rows = []
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise InputError("empty file (expected header nodes,samples_per_s)", path=path)
        if [h.strip() for h in header] != ["nodes", "samples_per_s"]:
            raise InputError(f"header must be nodes,samples_per_s, got {clipped(','.join(header))}",
                             path=path, line=1)
        for row in reader:
            lineno = reader.line_num
            if not row or not "".join(row).strip():
                continue
            if len(row) != 2:
                raise InputError(f"expected 2 fields, got {len(row)}", path=path, line=lineno)
            try:
                n = int(row[0])
            except ValueError:
                raise InputError(f"not an integer: {clipped(row[0])}", path=path, line=lineno,
                                 field="nodes") from None
            try:
                x = float(row[1])
            except ValueError:
                raise InputError(f"not a number: {clipped(row[1])}", path=path, line=lineno,
                                 field="samples_per_s") from None
            if not 0 < n <= MAX_NODES:
                raise InputError(f"must be positive and at most {MAX_NODES}, got {clipped(n)}", path=path,
                                 line=lineno, field="nodes")
            lo, hi = SAMPLES_RANGE
            if not lo <= x <= hi:
                raise InputError(f"must be a positive finite number from {lo:g} to {hi:g}, got {clipped(row[1])}",
                                 path=path, line=lineno, field="samples_per_s")
            rows.append((n, x))
    except csv.Error as exc:
        raise InputError(f"not CSV: {exc}", path=path, line=reader.line_num) from None
    if not rows:
        raise InputError("no measurements after the header", path=path)
    return rows
