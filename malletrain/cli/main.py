"""``malletrain`` command line.  Errors in user input exit with code 2."""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys

from malletrain import __version__
from malletrain.domain.config import ALLOCATORS, POLICIES, CoreConfig
from malletrain.domain.errors import InputError, MalletrainError

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


def _time(text: str) -> float:
    from malletrain.domain.timeutil import parse_time
    try:
        return parse_time(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ISO-8601 or epoch seconds: {text!r}") from None


def _positive(kind):
    def conv(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not v > 0 or (isinstance(v, float) and not math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return v
    return conv


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="malletrain",
        description="Harvest transiently idle Slurm nodes for malleable DNN training; "
                    "replay past schedules to see what a centre would gain.")
    p.add_argument("--version", action="version", version=f"malletrain {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("replay", help="replay a recorded schedule with a policy",
                       description="Replay a primary-workload trace and a malleable workload "
                                   "through the decision core; write summary, timeline and plots.",
                       epilog=EPILOG_REPLAY, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--trace", required=True, help="node-event CSV(.gz), SWF log, or sacct export")
    r.add_argument("--format", default="auto", choices=("auto", "events", "swf", "sacct"),
                   help="trace format (default: detect)")
    r.add_argument("--workload", required=True, help="malleable workload YAML")
    r.add_argument("--policy", default="malletrain", choices=POLICIES,
                   help="malletrain: learns curves (JPA); oracle: true curves; bftrainer: "
                        "per-node MILP with true curves; greedy: marginal gain; static: fixed size FIFO")
    r.add_argument("--out", required=True, help="output directory (written atomically)")
    r.add_argument("--interval", type=_positive(float), default=30.0, metavar="S",
                   help="decide at least every S seconds (default 30)")
    r.add_argument("--horizon", type=_positive(float), default=600.0, metavar="S",
                   help="look-ahead H of the objective (default 600)")
    r.add_argument("--start", type=_time, help="replay from TIME (ISO-8601 or epoch)")
    r.add_argument("--end", type=_time, help="replay until TIME")
    r.add_argument("--nodes", type=_positive(int), metavar="N", help="first N distinct nodes in trace order")
    r.add_argument("--max-jobs", type=_positive(int), metavar="K",
                   help="at most K admitted jobs at once (FIFO by submit time)")
    r.add_argument("--procs-per-node", type=_positive(int), default=1, metavar="P",
                   help="SWF: processors per node (default 1)")
    r.add_argument("--seed", type=int, default=0, help="seed for sample noise (default 0)")
    r.add_argument("--noise", type=_nonneg_float, default=0.0, metavar="F",
                   help="relative noise of reported throughput samples, e.g. 0.05")
    r.add_argument("--allocator", default="auto", choices=ALLOCATORS,
                   help="auto: exact knapsack DP for one node type, else CBC MILP")
    r.add_argument("--time-limit", type=_positive(float), default=5.0, metavar="S",
                   help="MILP time limit per decision (default 5)")
    r.add_argument("--min-dwell", type=_nonneg_float, default=0.0, metavar="S",
                   help="keep a new size at least S seconds (hysteresis; default 0)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    j = sub.add_parser("jpa", help="job profiling advisor tools")
    jsub = j.add_subparsers(dest="jpa_command", required=True, metavar="ACTION")
    jp = jsub.add_parser("predict", help="predict throughput at node counts from measurements",
                         description="Fit the scaling model to measured (nodes, samples_per_s) "
                                     "rows and print JSON {n: {mean, low, high}}.")
    jp.add_argument("--samples", required=True, help="CSV with header nodes,samples_per_s")
    jp.add_argument("--nodes", required=True, help="comma-separated counts, e.g. 1,2,4,8")

    b = sub.add_parser("bench", help="benchmarks (print their figures)")
    bsub = b.add_subparsers(dest="bench_command", required=True, metavar="WHICH")
    ba = bsub.add_parser("allocator", help="decision latency of the malletrain decide step")
    ba.add_argument("--nodes", type=_positive(int), default=4734)
    ba.add_argument("--jobs", type=_positive(int), default=100)
    ba.add_argument("--repeat", type=_positive(int), default=20)
    ba.add_argument("--seed", type=int, default=0)
    ba.add_argument("--json", action="store_true", help="print JSON only")
    bc = bsub.add_parser("compare", help="BFTrainer per-node MILP (CBC) vs. count-based allocator")
    bc.add_argument("--sizes", default="10x64,20x128", help="JOBSxNODES list (default 10x64,20x128)")
    bc.add_argument("--repeat", type=_positive(int), default=3)
    bc.add_argument("--time-limit", type=_positive(float), default=60.0)
    bc.add_argument("--json", action="store_true")
    bj = bsub.add_parser("jpa", help="JPA prediction error on the Pollux measurements")
    bj.add_argument("--data", help="shared data directory (default: ../shared/data)")
    bj.add_argument("--json", action="store_true")
    br = bsub.add_parser("replay", help="replay speed on a generated 15-day trace (or --trace)")
    br.add_argument("--nodes", type=_positive(int), default=4734)
    br.add_argument("--days", type=_positive(float), default=15.0)
    br.add_argument("--events", type=_positive(int), default=850_000)
    br.add_argument("--jobs", type=_positive(int), default=1000)
    br.add_argument("--trace", help="replay this trace instead of a generated one")
    br.add_argument("--policy", default="malletrain", choices=POLICIES)
    br.add_argument("--max-jobs", type=_positive(int), default=None)
    br.add_argument("--data", help="shared data directory (for the workload curves)")
    br.add_argument("--json", action="store_true")
    bq = bsub.add_parser("quality", help="all policies side by side on one trace and workload")
    bq.add_argument("--trace", required=True)
    bq.add_argument("--workload", required=True)
    bq.add_argument("--policies", default=",".join(POLICIES))
    bq.add_argument("--nodes", type=_positive(int))
    bq.add_argument("--start", type=_time)
    bq.add_argument("--end", type=_time)
    bq.add_argument("--max-jobs", type=_positive(int))
    bq.add_argument("--noise", type=_nonneg_float, default=0.05)
    bq.add_argument("--interval", type=_positive(float), default=30.0)
    bq.add_argument("--json", action="store_true")

    from malletrain.cli.user import add_commands
    add_commands(sub)

    bs = bsub.add_parser("slurm", help="Slurm commands per cycle and cycle latency on a live cluster",
                         description="Run N real daemon cycles against the cluster the config names "
                                     "(benchmarks/slurm.sh sets up the local one).")
    bs.add_argument("--config", required=True, help="daemon config YAML")
    bs.add_argument("--cycles", type=_positive(int), default=40)
    bs.add_argument("--interval", type=_positive(float), default=2.0, metavar="S")
    bs.add_argument("--json", action="store_true")

    sc = sub.add_parser("selfcheck", help="check the training runtime on this machine")
    scsub = sc.add_subparsers(dest="selfcheck_command", required=True, metavar="WHAT")
    from malletrain.runtime.selfcheck import __doc__ as selfcheck_doc
    cc = scsub.add_parser("consistency", help="same parameters for every process count and rescale?",
                          description=selfcheck_doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="example:\n  malletrain selfcheck consistency --workers 4 "
                                 "--procs 1,2,3,4 --steps 24 --rescale 1,4,2,3 --kill9")
    cc.add_argument("--workers", type=_positive(int), default=4, help="logical workers L (default 4)")
    cc.add_argument("--procs", default="1,2,3,4", help="process counts to compare (default 1,2,3,4)")
    cc.add_argument("--steps", type=_positive(int), default=24, help="training steps (default 24)")
    cc.add_argument("--rescale", metavar="P,P,..", help="also run one job rescaled through these sizes")
    cc.add_argument("--kill9", action="store_true",
                    help="also SIGKILL one segment after a checkpoint and resume it")
    cc.add_argument("--mode", choices=("consistency", "tolerance"), default="consistency",
                    help="tolerance: native all-reduce (expected to differ)")
    cc.add_argument("--mapping", choices=("contiguous", "round_robin"), default="contiguous",
                    help="how logical workers map to processes")
    cc.add_argument("--micro-batch", type=_positive(int), default=8)
    cc.add_argument("--seed", type=int, default=0)
    cc.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    cc.add_argument("--keep", action="store_true", help="keep the runs' checkpoint directories")

    from devtools.bench_runtime import __doc__ as runtime_doc
    bt = bsub.add_parser("runtime", help="training runtime: consistency overhead, checkpoint and "
                                         "resume times", description=runtime_doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    bt.add_argument("--procs", type=_positive(int), default=2, help="processes (default 2)")
    bt.add_argument("--steps", type=_positive(int), default=400, help="steps per timed run")
    bt.add_argument("--repeats", type=_positive(int), default=4, help="rounds per mode")
    bt.add_argument("--arch", choices=("cnn", "mlp"), default="cnn")
    bt.add_argument("--micro-batch", type=_positive(int), default=32,
                    help="samples per logical worker (the example's default, 32)")
    bt.add_argument("--json", metavar="FILE", help="also write the figures as JSON")

    e = sub.add_parser("example", help="(re)build the shipped example from shared/data")
    e.add_argument("--data", help="shared data directory (default: ../shared/data)")
    e.add_argument("--out", required=True, help="directory for the example files")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import logging
    logging.basicConfig(level=logging.WARNING, format="malletrain: %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "replay":
            return _cmd_replay(args)
        if args.command == "jpa":
            return _cmd_jpa_predict(args)
        if args.command == "bench":
            from malletrain.bench import suite as bench
            return bench.run(args)
        if args.command == "selfcheck":
            from malletrain.runtime.selfcheck import main as selfcheck_main
            return selfcheck_main(args)
        from malletrain.cli.user import dispatch
        rc = dispatch(args)
        if rc is not None:
            return rc
        if args.command == "example":
            from devtools.example import build_example
            build_example(args.data, args.out)
            return 0
    except MalletrainError as exc:
        print(f"malletrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("malletrain: interrupted", file=sys.stderr)
        return 130
    return 2


def _cmd_replay(args) -> int:
    from malletrain.replay.engine import ReplayOptions, run_replay, write_outputs
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload

    core = CoreConfig(policy=args.policy, horizon_s=args.horizon, allocator=args.allocator,
                      time_limit_s=args.time_limit, min_dwell_s=args.min_dwell).validate("command line")
    workload = load_workload(args.workload)
    trace = load_trace(args.trace, args.format, procs_per_node=args.procs_per_node,
                       nodes=args.nodes, start=args.start, end=args.end)
    opts = ReplayOptions(core=core, interval_s=args.interval, max_jobs=args.max_jobs,
                         seed=args.seed, noise=args.noise, quiet=args.quiet)
    result = run_replay(trace, workload, opts)
    write_outputs(result, args.out, plots=not args.no_plots)
    s = result.summary
    if not args.quiet:
        print(f"{s['policy']}: useful {s['useful_samples']:.4g} samples, harvested "
              f"{100 * s['harvested_fraction']:.1f}% of {s['idle_node_s'] / 3600:.0f} idle node-h, "
              f"{s['jobs_completed']}/{s['jobs']} jobs done, {s['preemptions']} preemptions, "
              f"{s['rescales']} rescales, decide p95 {s['decision_ms_p95']:.1f} ms, "
              f"wall {s['wall_s']:.1f} s -> {args.out}", file=sys.stderr)
    return 0


def _cmd_jpa_predict(args) -> int:
    import statistics

    from malletrain.jpa.scaling import band, fit_scaling
    try:
        counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--nodes must be comma-separated integers, got {args.nodes!r}") from None
    if not counts or any(n <= 0 for n in counts):
        raise InputError(f"--nodes must list positive integers, got {args.nodes!r}")
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


def _read_samples(path: str) -> list[tuple[int, float]]:
    try:
        fh = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise InputError(f"cannot read samples: {exc.strerror}", path=path) from exc
    rows = []
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise InputError("empty file (expected header nodes,samples_per_s)", path=path)
        if [h.strip() for h in header] != ["nodes", "samples_per_s"]:
            raise InputError(f"header must be nodes,samples_per_s, got {','.join(header)!r}",
                             path=path, line=1)
        for lineno, row in enumerate(reader, start=2):
            if not row or not "".join(row).strip():
                continue
            if len(row) != 2:
                raise InputError(f"expected 2 fields, got {len(row)}", path=path, line=lineno)
            try:
                n = int(row[0])
            except ValueError:
                raise InputError(f"not an integer: {row[0]!r}", path=path, line=lineno,
                                 field="nodes") from None
            try:
                x = float(row[1])
            except ValueError:
                raise InputError(f"not a number: {row[1]!r}", path=path, line=lineno,
                                 field="samples_per_s") from None
            if n <= 0:
                raise InputError(f"must be positive, got {n}", path=path, line=lineno, field="nodes")
            if not (x > 0 and math.isfinite(x)):
                raise InputError(f"must be a positive finite number, got {row[1]!r}", path=path,
                                 line=lineno, field="samples_per_s")
            rows.append((n, x))
    if not rows:
        raise InputError("no measurements after the header", path=path)
    return rows


if __name__ == "__main__":
    sys.exit(main())
