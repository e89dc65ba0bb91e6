"""``python -m devtools``: the repository's development commands (see the package doc)."""
from __future__ import annotations

import argparse
import sys

from malletrain.domain.config import POLICIES
from malletrain.domain.errors import MalletrainError


def positive(kind):
    def conv(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return v
    return conv


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m devtools", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    b = sub.add_parser("bench", help="benchmarks that read ../shared/data or the examples")
    bsub = b.add_subparsers(dest="bench_command", required=True, metavar="WHICH")
    bv = bsub.add_parser("advise", help="sizing advice error on held-out Pollux counts")
    bv.add_argument("--data", help="shared data directory (default ../shared/data)")
    bv.add_argument("--json", action="store_true")
    bv.set_defaults(run=_bench_advise)
    bf = bsub.add_parser("fairness", help="raw samples/s vs. the unit-free objectives on a mixed workload")
    bf.add_argument("--data", help="shared data directory (default ../shared/data)")
    bf.add_argument("--trace", help="node-event trace (default: examples/philly-1day.csv.gz)")
    bf.add_argument("--jobs", type=int, default=80)
    bf.add_argument("--seed", type=int, default=21)
    bf.add_argument("--json", action="store_true")
    bf.set_defaults(run=_bench_fairness)
    bw = bsub.add_parser("variability", help="variability-aware placement vs. blind on PAL's node speeds")
    bw.add_argument("--json", action="store_true")
    bw.set_defaults(run=_bench_variability)
    bj = bsub.add_parser("jpa", help="JPA prediction error on the Pollux measurements")
    bj.add_argument("--data", help="shared data directory (default: ../shared/data)")
    bj.add_argument("--json", action="store_true")
    bj.set_defaults(run=_bench_jpa)
    br = bsub.add_parser("replay", help="replay speed on a generated 15-day trace (or --trace)")
    br.add_argument("--nodes", type=positive(int), default=4734)
    br.add_argument("--days", type=positive(float), default=15.0)
    br.add_argument("--events", type=positive(int), default=850_000)
    br.add_argument("--jobs", type=positive(int), default=1000)
    br.add_argument("--trace", help="replay this trace instead of a generated one")
    br.add_argument("--policy", default="malletrain", choices=POLICIES)
    br.add_argument("--max-jobs", type=positive(int), default=None)
    br.add_argument("--data", help="shared data directory (for the workload curves)")
    br.add_argument("--json", action="store_true")
    br.set_defaults(run=_bench_replay)
    from devtools.bench_forecasts import TRACES
    from devtools.bench_forecasts import __doc__ as forecasts_doc
    bc = bsub.add_parser("forecasts", help="replay and decision time with the forecasts on and off, in one run",
                         description=forecasts_doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    bc.add_argument("--data", help="shared data directory (default ../shared/data)")
    bc.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, of {','.join(TRACES)}")
    bc.add_argument("--jobs", type=positive(int), default=1000, help="jobs of the generated workloads")
    bc.add_argument("--max-jobs", type=positive(int), default=10, help="admitted at once (default 10)")
    bc.add_argument("--alloc-repeat", type=positive(int), default=30, help="allocator decisions per mode")
    bc.add_argument("--repeat", type=positive(int), default=1,
                    help="replays per trace and mode, alternating; the median pair's ratio is held to "
                         "the target (default 1)")
    bc.add_argument("--guard", action="store_true", help="exit 1 when a target is missed")
    bc.add_argument("--digest", action="store_true",
                    help="print a digest of every plan per replay, to compare commits (slower: not for timing)")
    bc.add_argument("--split", action="store_true",
                    help="per replay, the cycles of each kind (reused, stood, fresh) and their time")
    bc.add_argument("--floor", action="store_true",
                    help="per trace, also replay with the availability model's answers played back (its cost "
                         "removed): the on/off ratio's floor for any model giving the same answers")
    bc.add_argument("--json", action="store_true")
    bc.set_defaults(run=_bench_forecasts)
    from devtools.bench_runtime import __doc__ as runtime_doc
    bt = bsub.add_parser("runtime", help="training runtime: consistency overhead, checkpoint and "
                                         "resume times", description=runtime_doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    bt.add_argument("--procs", type=positive(int), default=2, help="processes (default 2)")
    bt.add_argument("--steps", type=positive(int), default=400, help="steps per timed run")
    bt.add_argument("--repeats", type=positive(int), default=4, help="rounds per mode")
    bt.add_argument("--arch", choices=("cnn", "mlp"), default="cnn")
    bt.add_argument("--micro-batch", type=positive(int), default=32,
                    help="samples per logical worker (the example's default, 32)")
    bt.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    bt.set_defaults(run=_bench_runtime)
    from devtools.bench_adapters import __doc__ as adapters_doc
    ba = bsub.add_parser("adapters", help="what the framework adapters cost: step overhead, signal -> exit, "
                                          "launch -> first step, checkpoint", description=adapters_doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    ba.add_argument("--procs", type=positive(int), default=2, help="workers (default 2)")
    ba.add_argument("--epochs", type=positive(int), default=None,
                    help="epochs per timed run (default: 300; 30 for hf)")
    ba.add_argument("--repeat", type=positive(int), default=3, help="timed runs of each script (default 3)")
    ba.add_argument("--frameworks", default=None, help="which adapters, comma-separated (default: all)")
    ba.add_argument("--json", help="also write the figures to this file")
    ba.set_defaults(run=_bench_adapters)
    from devtools.bench_queue import __doc__ as queue_doc
    bq = bsub.add_parser("queue", help="cost of the unforgeable queue read at thousands of queued jobs "
                                       "(starts its own local Slurm; root)", description=queue_doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    bq.add_argument("--jobs", default="3000,30000", help="queue sizes, comma-separated (default 3000,30000)")
    bq.add_argument("--repeat", type=positive(int), default=5, help="timed reads per figure (median)")
    bq.add_argument("--dir", default=None, help="cluster directory (default: .local-slurm-bench in the checkout)")
    bq.add_argument("--port", type=positive(int), default=7917, help="slurmctld port (default 7917)")
    bq.add_argument("--keep", action="store_true", help="leave the cluster and its queue up")
    bq.add_argument("--json", action="store_true")
    bq.set_defaults(run=_bench_queue)
    cf = sub.add_parser("capture-fixtures", help="capture the Slurm parser fixtures from a real slurmctld "
                                                 "of one release (starts its own local Slurm; root)")
    cf.add_argument("--slurm", required=True, choices=("host", "22.05", "24.11", "26.05"),
                    help="the release (scripts/local-slurm.sh --slurm)")
    cf.add_argument("--out", required=True, help="directory for the fixture files (tests/fixtures/slurm)")
    cf.set_defaults(run=_capture_fixtures)
    from devtools.bench_scale import __doc__ as scale_doc
    bs = bsub.add_parser("scale", help="the daemon's steady cycle at a centre-sized queue: >= 1,000 nodes, "
                                       "20,000 jobs (starts its own local Slurm; root)", description=scale_doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    bs.add_argument("--jobs", default="1000,5000,20000", help="queue sizes, comma-separated (default 1000,5000,20000)")
    bs.add_argument("--cloud-nodes", type=positive(int), default=996,
                    help="powered-down CLOUD nodes besides the 4 with slurmd (default 996: 1,000 in all)")
    bs.add_argument("--slurm", default="host", choices=("host", "22.05", "24.11", "26.05"))
    bs.add_argument("--cycles", type=positive(int), default=20, help="steady cycles measured per size")
    bs.add_argument("--interval", type=positive(float), default=2.0, help="the daemon's interval_s")
    bs.add_argument("--dir", default=None, help="cluster directory (default: .local-slurm-bench in the checkout)")
    bs.add_argument("--port", type=positive(int), default=7917, help="slurmctld port (default 7917)")
    bs.add_argument("--rest", action="store_true",
                    help="also run slurmrestd (JWT) and time its GET jobs against the daemon's queue read")
    bs.add_argument("--elastic-groups", action="store_true",
                    help="slurm.elastic_groups on, and one submission in 100 an elastic group (a held array "
                         "of 4 members; jobs then counts every member)")
    bs.add_argument("--keep", action="store_true", help="leave the cluster and its queue up")
    bs.add_argument("--json", action="store_true")
    bs.set_defaults(run=_bench_scale)
    e = sub.add_parser("example", help="(re)build the shipped example from shared/data")
    e.add_argument("--data", help="shared data directory (default: ../shared/data)")
    e.add_argument("--out", required=True, help="directory for the example files")
    e.set_defaults(run=_example)
    return p


def _emit(report, as_json: bool) -> int:
    report.emit(as_json)
    return 0


def _bench_advise(a: argparse.Namespace) -> int:
    from devtools.bench_data import bench_advise
    return _emit(bench_advise(a.data), a.json)


def _bench_fairness(a: argparse.Namespace) -> int:
    from devtools.bench_data import bench_fairness
    return _emit(bench_fairness(a.data, a.trace, a.jobs, a.seed, progress=not a.json), a.json)


def _bench_variability(a: argparse.Namespace) -> int:
    from devtools.bench_data import bench_variability
    return _emit(bench_variability(progress=not a.json), a.json)


def _bench_jpa(a: argparse.Namespace) -> int:
    from devtools.bench_data import bench_jpa
    return _emit(bench_jpa(a.data), a.json)


def _queue_sizes(text: str) -> list[int]:
    """``--jobs 1000,5000,20000`` of the benchmarks that fill a queue."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise MalletrainError(f"--jobs: comma-separated integers, got {text!r}") from None
    if not sizes or not all(0 < n <= 200_000 for n in sizes):
        raise MalletrainError("--jobs: queue sizes between 1 and 200,000")
    return sizes


def _bench_queue(a: argparse.Namespace) -> int:
    import os

    from devtools.bench_queue import run
    from devtools.local_slurm import ROOT
    sizes = _queue_sizes(a.jobs)
    return _emit(run(sizes, directory=a.dir or os.path.join(ROOT, ".local-slurm-bench"), port=a.port,
                     repeat=a.repeat, keep=a.keep), a.json)


def _capture_fixtures(a: argparse.Namespace) -> int:
    from devtools.capture_fixtures import capture
    for path in capture(a.slurm, a.out):
        print(path)
    return 0


def _bench_scale(a: argparse.Namespace) -> int:
    import os

    from devtools.bench_scale import run
    from devtools.local_slurm import ROOT
    sizes = _queue_sizes(a.jobs)
    if a.cloud_nodes > 100_000:
        raise MalletrainError("--cloud-nodes: at most 100,000")
    return _emit(run(sizes, slurm=a.slurm, cloud_nodes=a.cloud_nodes,
                     directory=a.dir or os.path.join(ROOT, ".local-slurm-bench"), port=a.port,
                     cycles=a.cycles, interval_s=a.interval, keep=a.keep, rest=a.rest,
                     groups=a.elastic_groups), a.json)


def _bench_adapters(a: argparse.Namespace) -> int:
    from devtools.bench_adapters import main
    argv = ["--procs", str(a.procs), "--repeat", str(a.repeat)] + (["--epochs", str(a.epochs)] if a.epochs else [])
    argv += ["--frameworks", a.frameworks] if a.frameworks else []
    return main(argv + (["--json", a.json] if a.json else []))


def _bench_runtime(a: argparse.Namespace) -> int:
    from devtools.bench_runtime import run
    return run(a)


def _bench_replay(a: argparse.Namespace) -> int:
    from devtools.bench_data import bench_replay
    return _emit(bench_replay(a.nodes, a.days, a.events, a.jobs, a.trace, a.policy, a.max_jobs,
                              a.data, quiet=a.json), a.json)


def _bench_forecasts(a: argparse.Namespace) -> int:
    from devtools.bench_forecasts import TRACES, bench_forecasts
    traces = tuple(t.strip() for t in a.traces.split(",") if t.strip())
    bad = [t for t in traces if t not in TRACES]
    if bad or not traces:
        raise MalletrainError(f"--traces: one or more of {','.join(TRACES)}, got {a.traces!r}")
    report = bench_forecasts(a.data, traces, a.jobs, a.max_jobs, a.alloc_repeat,
                             out=sys.stderr if a.json else sys.stdout, digest=a.digest, split=a.split,
                             floor=a.floor, repeat=a.repeat)
    if a.json:
        report.emit(True)
    return 1 if a.guard and report.data["missed"] else 0


def _example(a: argparse.Namespace) -> int:
    from devtools.example import build_example
    build_example(a.data, a.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except MalletrainError as exc:
        print(f"devtools: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
