"""Bad input for every command that reads a user file or number.

Each case: exit code 2 (argparse's own exit for a bad flag included), one message naming
the file (and line/field where there is one) or the flag, no traceback, the output
(--out, the campaign directory, the metrics directory) left as it was, bounded time.
The cases run in-process through ``malletrain.cli.main.main``; an exception that escapes
it fails the test, as a traceback would.  A few also run as real processes.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

from malletrain.cli.main import main

pytestmark = pytest.mark.timeout(60)

BIG = "9" * 400            # an integer no float can hold
FLAG_BIG = "9" * 310
NON_UTF8 = b"\xff\xfe"

EVENTS = "time,node,state\n1600000000,n0,idle\n1600000000,n1,busy\n1600000060,n1,idle\n"
SWF_LINE = "1 0 0 100 8 -1 -1 8 -1 -1 1 -1 -1 -1 -1 -1 -1 -1"
SACCT = ("JobID|Start|End|NodeList|State\n"
         "1|2021-01-01T00:00:00|2021-01-01T01:00:00|n[1-2]|COMPLETED\n"
         "2|2021-01-01T00:30:00|2021-01-01T02:00:00|n3|COMPLETED\n")
WORKLOAD = {"name": "a", "submit": "0", "min_nodes": "1", "max_nodes": "4", "work": "1000.0",
            "rescale_up_s": "0", "rescale_down_s": "0", "profile": "p",
            "throughput": "{1: 10.0, 2: 20.0, 4: 40.0}"}
WORKLOAD_LINE = {k: i + 2 for i, k in enumerate(WORKLOAD)}       # line 1 is 'jobs:'
CONFIG = "core:\n  policy: malletrain\nslurm:\n  partition: scavenger\ndaemon:\n  interval_s: 10\n"


def workload_text(**over: str) -> str:
    lines = ["jobs:"]
    for i, (k, v) in enumerate({**WORKLOAD, **over}.items()):
        lines.append(f"  {'- ' if i == 0 else '  '}{k}: {v}")
    return "\n".join(lines) + "\n"


def gz(text: str | bytes) -> bytes:
    return gzip.compress(text.encode() if isinstance(text, str) else text, mtime=0)


def long_events(rows: int = 4000) -> str:
    return "time,node,state\n" + "".join(
        f"{1600000000 + 60 * i},n0,{'busy' if i % 2 else 'idle'}\n" for i in range(rows))


def invoke(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:         # argparse rejecting a flag
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def refused(code, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err            # one message (argparse adds its usage line above it)
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"


class Files:
    """A good trace, workload and config in tmp_path, and an --out holding a previous result."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.trace, self.workload, self.config = tmp_path / "t.csv", tmp_path / "w.yaml", tmp_path / "c.yaml"
        self.trace.write_text(EVENTS)
        self.workload.write_text(workload_text())
        self.config.write_text(CONFIG)
        self.out = tmp_path / "out"
        self.out.mkdir()
        (self.out / "summary.json").write_text("previous")

    def write(self, name: str, content: str | bytes):
        p = self.dir / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return p

    def replay(self, *extra, trace=None, workload=None, out=None):
        return ["replay", "--trace", trace or self.trace, "--workload", workload or self.workload,
                "--out", out or self.out, "--quiet", "--no-plots", *extra]

    def assert_out_untouched(self):
        assert os.listdir(self.out) == ["summary.json"]
        assert (self.out / "summary.json").read_text() == "previous"
        assert not [p for p in os.listdir(self.dir) if p.startswith(".replay-")]


@pytest.fixture
def files(tmp_path):
    return Files(tmp_path)


# ------------------------------------------------------------------ traces
def truncated_gz() -> bytes:
    data = gz(long_events())
    return data[:len(data) // 2]


def corrupt_deflate() -> bytes:
    data = bytearray(gz(long_events()))
    data[10:40] = b"\xff" * 30                  # the deflate stream right after the header
    return bytes(data)


def bad_crc() -> bytes:
    data = bytearray(gz(EVENTS))
    data[-8] ^= 0xFF
    return bytes(data)


def swf(*fields: tuple[int, str], header: str = "") -> str:
    f = SWF_LINE.split()
    for i, v in fields:
        f[i] = v
    return header + SWF_LINE + "\n" + " ".join(f) + "\n"


# (id, file name, content, extra flags, needles)
TRACES = [
    ("gz-not-gzip", "t.csv.gz", b"\x1f\x8bnot gzip at all\n", (), ["gzip"]),
    ("gz-corrupt-deflate", "t.csv.gz", corrupt_deflate(), (), ["gzip"]),
    ("gz-truncated", "t.csv.gz", truncated_gz(), (), ["truncated gzip"]),
    ("gz-truncated-format-events", "t.csv.gz", truncated_gz(), ("--format", "events"), ["truncated gzip"]),
    ("gz-corrupt-format-swf", "t.csv.gz", corrupt_deflate(), ("--format", "swf"), ["gzip"]),
    ("gz-bad-crc", "t.csv.gz", bad_crc(), (), ["gzip"]),
    ("gz-empty-member", "t.csv.gz", b"\x1f\x8b", (), ["gzip"]),
    ("gz-non-utf8", "t.csv.gz", gz(EVENTS.encode() + b"1600000120,n\xff0,busy\n"), (), ["line 5", "UTF-8"]),
    ("csv-non-utf8-row", "t.csv", EVENTS.encode() + b"1600000120,n\xff0,busy\n", (), ["line 5", "UTF-8"]),
    ("csv-non-utf8-header", "t.csv", b"time,node,st\xe9te\n" + EVENTS.encode()[16:], (), ["line 1", "UTF-8"]),
    ("csv-non-utf8-late", "t.csv", long_events(3000).encode() + b"\xff\n", (), ["line 3002", "UTF-8"]),
    ("swf-non-utf8", "t.swf", b"; UnixStartTime: 0\n; Note: \xff\n" + SWF_LINE.encode() + b"\n", (),
     ["line 2", "UTF-8"]),
    ("sacct-non-utf8", "t.sacct", SACCT.encode() + b"3|2021-01-01T00:00:00|x|n\xff|COMPLETED\n", (),
     ["line 4", "UTF-8"]),
    ("csv-time-400-digits", "t.csv", f"time,node,state\n{BIG},n0,idle\n", (), ["line 2", "field 'time'"]),
    ("csv-time-400-digits-later", "t.csv", EVENTS + f"{BIG},n0,busy\n", (), ["line 5", "field 'time'"]),
    ("csv-time-1e999", "t.csv", "time,node,state\n1e999,n0,idle\n", (), ["line 2", "field 'time'"]),
    ("csv-time-inf", "t.csv", "time,node,state\ninf,n0,idle\n", (), ["line 2", "field 'time'"]),
    ("csv-time-minus-inf", "t.csv", EVENTS + "-inf,n0,busy\n", (), ["line 5", "field 'time'"]),
    ("csv-time-nan", "t.csv", EVENTS + "nan,n0,busy\n", (), ["line 5", "field 'time'"]),
    ("csv-time-year-3e12", "t.csv", "time,node,state\n99999999999999999999,n0,idle\n", (),
     ["line 2", "field 'time'"]),
    ("csv-span-absurd", "t.csv", "time,node,state\n0,n0,idle\n250000000000,n0,busy\n", (),
     ["--interval", "decisions"]),
    ("swf-submit-1e999", "t.swf", swf((1, "1e999")), (), ["line 2", "field 'submit time'"]),
    ("swf-submit-400-digits", "t.swf", swf((1, BIG)), (), ["line 2", "field 'submit time'"]),
    ("swf-wait-minus-inf", "t.swf", swf((2, "-inf")), (), ["line 2", "field 'wait time'"]),
    ("swf-run-nan", "t.swf", swf((3, "nan")), (), ["line 2", "field 'run time'"]),
    ("swf-run-1e300", "t.swf", swf((3, "1e300")), (), ["line 2", "field 'run time'"]),
    ("swf-procs-400-digits", "t.swf", swf((4, BIG)), (), ["line 2", "field 'processors'"]),
    ("swf-procs-inf", "t.swf", swf((4, "inf")), (), ["line 2", "field 'processors'"]),
    ("swf-procs-nan", "t.swf", swf((4, "nan")), (), ["line 2", "field 'processors'"]),
    ("swf-procs-1e15", "t.swf", swf((4, "1e15")), (), ["line 2", "field 'processors'"]),
    ("swf-requested-procs-inf", "t.swf", swf((4, "-1"), (7, "inf")), (), ["line 2", "field 'processors'"]),
    ("swf-maxnodes-400-digits", "t.swf", swf(header=f"; MaxNodes: {BIG}\n"), (), ["line 1", "field 'MaxNodes'"]),
    ("swf-maxprocs-1e12", "t.swf", swf(header="; MaxProcs: 1000000000000\n"), (),
     ["line 1", "field 'MaxProcs'"]),
    ("swf-too-many-at-once", "t.swf", "".join(f"{i} 0 0 100 900000 -1 -1 8 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n"
                                              for i in range(3)), (), ["nodes at once"]),
    ("sacct-start-400-digits", "t.sacct", SACCT + f"3|{BIG}|2021-01-01T01:00:00|n1|COMPLETED\n", (),
     ["line 4", "field 'Start'"]),
    ("sacct-end-inf", "t.sacct", SACCT + "3|2021-01-01T00:00:00|inf|n1|COMPLETED\n", (), ["line 4", "field 'End'"]),
    ("sacct-end-nan", "t.sacct", SACCT + "3|2021-01-01T00:00:00|nan|n1|COMPLETED\n", (), ["line 4", "field 'End'"]),
    ("sacct-end-1e999", "t.sacct", SACCT + "3|2021-01-01T00:00:00|1e999|n1|COMPLETED\n", (),
     ["line 4", "field 'End'"]),
    ("sacct-hostlist-huge", "t.sacct", SACCT + "3|2021-01-01T00:00:00|2021-01-01T01:00:00|n[1-999999999999]|X\n",
     (), ["line 4", "field 'NodeList'"]),
    ("sacct-harvest-without-partition", "t.sacct", SACCT, ("--harvest-partition", "scavenger"),
     ["line 1", "field 'Partition'", "--format"]),
    ("swf-harvest-partition", "t.swf", swf(), ("--harvest-partition", "scavenger"), ["sacct export only"]),
    ("sacct-harvest-hostlist-huge", "t.sacct",
     "JobID|Start|End|NodeList|State|Partition\n1|2021-01-01T00:00:00|2021-01-01T01:00:00|n1|COMPLETED|batch\n"
     "2_0|2021-01-01T00:00:00|2021-01-01T01:00:00|n[1-999999999999]|X|scavenger\n",
     ("--harvest-partition", "scavenger"), ["line 3", "field 'NodeList'"]),
]


@pytest.mark.parametrize("name,content,extra,needles", [c[1:] for c in TRACES], ids=[c[0] for c in TRACES])
def test_replay_bad_trace(files, capsys, name, content, extra, needles):
    trace = files.write(name, content)
    code, out, err = invoke(capsys, *files.replay(*extra, trace=trace))
    refused(code, err, name, *needles)
    files.assert_out_untouched()


def test_trace_that_is_not_a_regular_file(files, capsys):
    code, _, err = invoke(capsys, *files.replay(trace="/dev/zero"))
    refused(code, err, "/dev/zero", "not a regular file")
    files.assert_out_untouched()


# ------------------------------------------------------------------ workloads
WORKLOADS = [
    ("work-400-digits", {"work": BIG}, "work"),
    ("work-1e999", {"work": "1.0e+999"}, "work"),
    ("work-1e999-plain", {"work": "1e999"}, "work"),       # YAML 1.1 reads this as a string
    ("work-nan", {"work": ".nan"}, "work"),
    ("work-inf", {"work": ".inf"}, "work"),
    ("work-minus-inf", {"work": "-.inf"}, "work"),
    ("work-1e300", {"work": "1.0e+300"}, "work"),
    ("work-5000-digits", {"work": "9" * 5000}, None),         # PyYAML cannot even build it
    ("min-nodes-400-digits", {"min_nodes": BIG}, "min_nodes"),
    ("min-nodes-nan", {"min_nodes": ".nan"}, "min_nodes"),
    ("min-nodes-inf", {"min_nodes": ".inf"}, "min_nodes"),
    ("max-nodes-400-digits", {"max_nodes": BIG}, "max_nodes"),
    ("max-nodes-1e999", {"max_nodes": "1.0e+999"}, "max_nodes"),
    ("max-nodes-10-to-12", {"max_nodes": "1000000000000"}, "max_nodes"),
    ("throughput-key-400-digits", {"throughput": f"{{{BIG}: 10.0}}"}, "throughput"),
    ("throughput-key-inf", {"throughput": "{.inf: 10.0}"}, "throughput"),
    ("throughput-key-nan", {"throughput": "{.nan: 10.0}"}, "throughput"),
    ("throughput-value-400-digits", {"throughput": f"{{1: {BIG}}}"}, "throughput"),
    ("throughput-value-inf", {"throughput": "{1: .inf}"}, "throughput"),
    ("throughput-value-nan", {"throughput": "{1: 10.0, 2: .nan}"}, "throughput"),
    ("throughput-value-1e999", {"throughput": "{1: 1.0e+999}"}, "throughput"),
    ("submit-400-digits", {"submit": BIG}, "submit"),
    ("submit-400-digit-string", {"submit": f"'{BIG}'"}, "submit"),
    ("submit-inf", {"submit": ".inf"}, "submit"),
    ("submit-minus-inf", {"submit": "-.inf"}, "submit"),
    ("submit-nan", {"submit": ".nan"}, "submit"),
    ("submit-nan-string", {"submit": "nan"}, "submit"),
    ("submit-1e999-string", {"submit": "1e999"}, "submit"),
    ("submit-bad-date", {"submit": "2021-13-45"}, None),       # a YAML timestamp PyYAML cannot build
    ("rescale-up-inf", {"rescale_up_s": ".inf"}, "rescale_up_s"),
    ("rescale-up-400-digits", {"rescale_up_s": BIG}, "rescale_up_s"),
    ("rescale-down-nan", {"rescale_down_s": ".nan"}, "rescale_down_s"),
    ("rescale-down-minus-inf", {"rescale_down_s": "-.inf"}, "rescale_down_s"),
]


@pytest.mark.parametrize("over,field", [c[1:] for c in WORKLOADS], ids=[c[0] for c in WORKLOADS])
def test_replay_bad_workload_numbers(files, capsys, over, field):
    files.workload.write_text(workload_text(**over))
    code, _, err = invoke(capsys, *files.replay())
    needles = [f"line {WORKLOAD_LINE[field]}", f"field '{field}'"] if field else ["not valid YAML"]
    refused(code, err, "w.yaml", *needles)
    assert len(err) < 600, err                    # a 400-digit number is not echoed in full
    files.assert_out_untouched()


@pytest.mark.parametrize("content,needles", [
    (workload_text().encode().replace(b"profile: p", b"profile: p\xff"), ["line 9", "UTF-8"]),
    (gz(workload_text()), ["line 1", "UTF-8"]),
    (b"\x00\x01\x02" * 100, ["w.yaml"]),
], ids=["non-utf8", "gzip-bytes", "binary"])
def test_replay_bad_workload_bytes(files, capsys, content, needles):
    files.workload.write_bytes(content)
    code, _, err = invoke(capsys, *files.replay())
    refused(code, err, "w.yaml", *needles)
    files.assert_out_untouched()


# ------------------------------------------------------------------ replay flags
REPLAY_FLAGS = [
    ("--interval", "1e-300"), ("--interval", "0"), ("--interval", "-0"), ("--interval", "nan"),
    ("--interval", "inf"), ("--interval", "-inf"), ("--interval", "1e999"), ("--interval", FLAG_BIG),
    ("--interval", "1e300"),
    ("--horizon", "1e300"), ("--horizon", "nan"), ("--horizon", "inf"), ("--horizon", "0"),
    ("--horizon", FLAG_BIG),
    ("--time-limit", "nan"), ("--time-limit", "inf"), ("--time-limit", "-inf"), ("--time-limit", "1e300"),
    ("--time-limit", "0"),
    ("--min-dwell", "nan"), ("--min-dwell", "inf"), ("--min-dwell", "1e300"), ("--min-dwell", "-1"),
    ("--noise", "nan"), ("--noise", "inf"), ("--noise", "1e300"),
    ("--planned-lead", "nan"), ("--planned-lead", "-1"), ("--planned-lead", "1e300"), ("--planned-lead", "x"),
    ("--nodes", FLAG_BIG), ("--nodes", "0"), ("--nodes", "nan"), ("--nodes", "1e999"), ("--nodes", "9" * 5000),
    ("--max-jobs", FLAG_BIG), ("--max-jobs", "inf"),
    ("--procs-per-node", FLAG_BIG), ("--procs-per-node", "nan"),
    ("--start", BIG), ("--start", "nan"), ("--start", "inf"), ("--start", "1e999"),
    ("--end", BIG), ("--end", "-inf"), ("--end", "99999999999999999999"),
]


def _flag_id(c):
    return f"{c[0][2:]}={c[1] if len(c[1]) < 12 else str(len(c[1])) + '-digits'}"


@pytest.mark.parametrize("flag,value", REPLAY_FLAGS, ids=[_flag_id(c) for c in REPLAY_FLAGS])
def test_replay_bad_flag(files, capsys, flag, value):
    code, _, err = invoke(capsys, *files.replay(f"{flag}={value}"))
    refused(code, err, flag)
    message = err[err.index("error:"):]       # after argparse's usage lines (which grow with the flags)
    assert len(message) < 300, err            # a 400-digit value is clipped
    files.assert_out_untouched()


# ------------------------------------------------------------------ unwritable --out
def _out_cases(tmp_path):
    plain = tmp_path / "plain-file"
    plain.write_text("keep")
    return {"under-a-file": plain / "out", "deep-under-a-file": plain / "a" / "b" / "out",
            "is-a-file": plain, "under-proc": "/proc/malletrain-no-such/out", "proc-itself": "/proc/self/out"}


@pytest.mark.parametrize("case", ["under-a-file", "deep-under-a-file", "is-a-file", "under-proc", "proc-itself"])
def test_replay_unwritable_out(files, capsys, case):
    out = _out_cases(files.dir)[case]
    code, _, err = invoke(capsys, *files.replay(out=out))
    refused(code, err, str(out), "cannot write outputs")
    assert (files.dir / "plain-file").read_text() == "keep"
    files.assert_out_untouched()


# ------------------------------------------------------------------ jpa predict
SAMPLES = "nodes,samples_per_s\n1,95\n2,181\n4,333\n"
JPA_FILES = [
    ("non-utf8-row", SAMPLES.encode() + b"8,6\xff00\n", ["line 5", "UTF-8"]),
    ("non-utf8-header", b"nodes,samples_per_\xe9\n1,95\n", ["line 1", "UTF-8"]),
    ("gzip-bytes", gz(SAMPLES), ["line 1", "UTF-8"]),
    ("nodes-400-digits", SAMPLES + f"{BIG},5\n", ["line 5", "field 'nodes'"]),
    ("nodes-5000-digits", SAMPLES + "9" * 5000 + ",5\n", ["line 5", "field 'nodes'"]),
    ("nodes-10-to-12", SAMPLES + "1000000000000,5\n", ["line 5", "field 'nodes'"]),
    ("nodes-nan", SAMPLES + "nan,5\n", ["line 5", "field 'nodes'"]),
    ("rate-1e999", SAMPLES + "8,1e999\n", ["line 5", "field 'samples_per_s'"]),
    ("rate-400-digits", SAMPLES + f"8,{BIG}\n", ["line 5", "field 'samples_per_s'"]),
    ("rate-inf", SAMPLES + "8,inf\n", ["line 5", "field 'samples_per_s'"]),
    ("rate-minus-inf", SAMPLES + "8,-inf\n", ["line 5", "field 'samples_per_s'"]),
    ("rate-nan", SAMPLES + "8,nan\n", ["line 5", "field 'samples_per_s'"]),
    ("rate-denormal", SAMPLES + "8,1e-320\n", ["line 5", "field 'samples_per_s'"]),
    ("rate-1e300", SAMPLES + "8,1e300\n", ["line 5", "field 'samples_per_s'"]),
]


@pytest.mark.parametrize("content,needles", [c[1:] for c in JPA_FILES], ids=[c[0] for c in JPA_FILES])
def test_jpa_predict_bad_samples(files, capsys, content, needles):
    p = files.write("s.csv", content)
    code, out, err = invoke(capsys, "jpa", "predict", "--samples", p, "--nodes", "1,2,4")
    refused(code, err, "s.csv", *needles)
    assert out == ""


@pytest.mark.parametrize("nodes", ["1," + BIG, "1,nan", "1,inf", "1,1e999", "1," + "9" * 5000, "0",
                                   "1,1000000000000", "-1"],
                         ids=["400-digits", "nan", "inf", "1e999", "5000-digits", "zero", "10-to-12", "negative"])
def test_jpa_predict_bad_nodes(files, capsys, nodes):
    p = files.write("s.csv", SAMPLES)
    code, out, err = invoke(capsys, "jpa", "predict", "--samples", p, f"--nodes={nodes}")
    refused(code, err, "--nodes")
    assert out == "" and len(err) < 600


@pytest.mark.parametrize("path,needle", [("/dev/zero", "larger than 16 MiB"), ("/", "cannot read samples")],
                         ids=["dev-zero", "a-directory"])
def test_jpa_predict_samples_endless_or_not_a_file(capsys, path, needle):
    code, _, err = invoke(capsys, "jpa", "predict", "--samples", path, "--nodes", "1")
    refused(code, err, path, needle)


# ------------------------------------------------------------------ config check (and other --config readers)
def config_with(section: str, key: str, value: str) -> str:
    return f"{section}:\n  {key}: {value}\n"


CONFIGS = [
    ("interval-400-digits", config_with("daemon", "interval_s", BIG), "daemon.interval_s"),
    ("interval-1e999", config_with("daemon", "interval_s", "1.0e+999"), "daemon.interval_s"),
    ("interval-1e999-string", config_with("daemon", "interval_s", "1e999"), "daemon.interval_s"),
    ("interval-nan", config_with("daemon", "interval_s", ".nan"), "daemon.interval_s"),
    ("interval-1e-300", config_with("daemon", "interval_s", "1.0e-300"), "daemon.interval_s"),
    ("interval-1e12", config_with("daemon", "interval_s", "1.0e+12"), "daemon.interval_s"),
    ("horizon-inf", config_with("core", "horizon_s", ".inf"), "core.horizon_s"),
    ("horizon-minus-inf", config_with("core", "horizon_s", "-.inf"), "core.horizon_s"),
    ("horizon-1e300", config_with("core", "horizon_s", "1.0e+300"), "core.horizon_s"),
    ("horizon-1e12", config_with("core", "horizon_s", "1.0e+12"), "core.horizon_s"),
    ("time-limit-nan", config_with("core", "time_limit_s", ".nan"), "core.time_limit_s"),
    ("min-dwell-nan", config_with("core", "min_dwell_s", ".nan"), "core.min_dwell_s"),
    ("max-candidates-1e999", config_with("core", "max_candidates", "1.0e+999"), "core.max_candidates"),
    ("retries-400-digits", config_with("slurm", "retries", BIG), "slurm.retries"),
    ("timeout-inf", config_with("slurm", "command_timeout_s", ".inf"), "slurm.command_timeout_s"),
    ("timeout-1e12", config_with("slurm", "command_timeout_s", "1.0e+12"), "slurm.command_timeout_s"),
    ("backoff-minus-inf", config_with("slurm", "backoff_s", "-.inf"), "slurm.backoff_s"),
    ("port-nan", config_with("daemon", "metrics_port", ".nan"), "daemon.metrics_port"),
    ("port-400-digits", config_with("daemon", "metrics_port", BIG), "daemon.metrics_port"),
    ("max-rate-inf", config_with("daemon", "max_samples_per_s", ".inf"), "daemon.max_samples_per_s"),
    ("cooldown-1e12", config_with("daemon", "node_cooldown_s", "1.0e+12"), "daemon.node_cooldown_s"),
]


@pytest.mark.parametrize("text,field", [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_config_check_bad_numbers(files, capsys, text, field):
    p = files.write("bad.yaml", text)
    code, out, err = invoke(capsys, "config", "check", p)
    refused(code, err, "bad.yaml", f"field '{field}'")
    assert out == "" and len(err) < 600


@pytest.mark.parametrize("content,needles", [
    (CONFIG.encode().replace(b"scavenger", b"scav\xffenger"), ["line 4", "UTF-8"]),
    (gz(CONFIG), ["line 1", "UTF-8"]),
    (config_with("daemon", "interval_s", "9" * 5000).encode(), ["not valid YAML"]),
    (config_with("daemon", "interval_s", "!!int 1.5").encode(), ["not valid YAML"]),
], ids=["non-utf8", "gzip-bytes", "5000-digits", "bad-tagged-int"])
@pytest.mark.parametrize("command", [("config", "check"), ("daemon", "--config"), ("bench", "slurm", "--config"),
                                     ("submit", "--config")], ids=lambda c: "-".join(c))
def test_commands_reading_a_bad_config(files, capsys, monkeypatch, content, needles, command):
    from malletrain.slurm import submit
    monkeypatch.setattr(submit, "submit", _no_sbatch)
    p = files.write("bad.yaml", content)
    extra = ("--", "true") if command[0] == "submit" else ()
    code, out, err = invoke(capsys, *command, p, *extra)
    refused(code, err, "bad.yaml", *needles)
    assert out == ""


# ------------------------------------------------------------------ submit
def _no_sbatch(*args, **kwargs):
    raise AssertionError("sbatch must not run for bad input")


SUBMIT_FLAGS = [
    ("--max-nodes", FLAG_BIG), ("--min-nodes", FLAG_BIG), ("--min-nodes", "0"), ("--max-nodes", "-1"),
    ("--max-nodes", "1000000"), ("--max-nodes", "nan"), ("--min-nodes", "1e999"),
    ("--rescale-up", "1e12"), ("--rescale-up", "nan"), ("--rescale-up", "inf"), ("--rescale-up", "-inf"),
    ("--rescale-up", "1e999"), ("--rescale-up", FLAG_BIG), ("--rescale-up", "-1"),
    ("--rescale-down", "nan"), ("--rescale-down", "1e12"),
    ("--grace-s", "nan"), ("--grace-s", "inf"), ("--grace-s", "-1"), ("--grace-s", "1e12"),
    ("--gpus-per-node", "-1"), ("--gpus-per-node", FLAG_BIG), ("--gpus-per-node", "nan"),
    ("--time", "nan"), ("--time", "1e999"), ("--time", "-1"), ("--time", "4:00:00; rm -rf /"),
]


@pytest.mark.parametrize("flag,value", SUBMIT_FLAGS, ids=[_flag_id(c) for c in SUBMIT_FLAGS])
def test_submit_bad_flag_fails_before_sbatch(files, capsys, monkeypatch, flag, value):
    from malletrain.slurm import submit
    monkeypatch.setattr(submit, "submit", _no_sbatch)
    metrics = files.dir / "metrics"
    code, _, err = invoke(capsys, "submit", "--config", files.config, "--metrics-dir", metrics,
                          f"{flag}={value}", "--", "python", "train.py")
    refused(code, err, flag.lstrip("-").replace("-nodes", ""))
    assert len(err) < 1200, err
    assert not metrics.exists(), "nothing is written for a refused submission"


def test_submit_unwritable_metrics_dir(files, capsys, monkeypatch):
    from malletrain.slurm import submit
    monkeypatch.setattr(submit, "submit", _no_sbatch)
    plain = files.write("plain-file", "keep")
    code, _, err = invoke(capsys, "submit", "--config", files.config, "--metrics-dir", plain / "m",
                          "--", "python", "train.py")
    refused(code, err, str(plain / "m"), "metrics directory")
    assert plain.read_text() == "keep"


# ------------------------------------------------------------------ bench
BENCH = [
    ("allocator", ("--nodes", FLAG_BIG)), ("allocator", ("--nodes", "0")), ("allocator", ("--nodes", "nan")),
    ("allocator", ("--nodes", "1e999")), ("allocator", ("--nodes", "10000000")),
    ("allocator", ("--jobs", FLAG_BIG)), ("allocator", ("--jobs", "inf")),
    ("allocator", ("--repeat", FLAG_BIG)), ("allocator", ("--repeat", "nan")), ("allocator", ("--seed", "nan")),
    ("compare", ("--sizes", "10x" + BIG)), ("compare", ("--sizes", "nanx64")), ("compare", ("--sizes", "0x64")),
    ("compare", ("--sizes", "10x64x3")), ("compare", ("--repeat", FLAG_BIG)), ("compare", ("--time-limit", "nan")),
    ("compare", ("--time-limit", "1e300")),
    ("slurm", ("--cycles", FLAG_BIG)), ("slurm", ("--interval", "1e-300")), ("slurm", ("--interval", "nan")),
]


@pytest.mark.parametrize("which,flags", BENCH, ids=[f"{w}-{_flag_id(f)}" for w, f in BENCH])
def test_bench_bad_flag(files, capsys, which, flags):
    extra = ("--config", files.config) if which == "slurm" else ()
    code, out, err = invoke(capsys, "bench", which, "=".join(flags), *extra)
    refused(code, err, flags[0].lstrip("-"))
    assert out == "" and len(err) < 1200


QUALITY = [
    ("trace-gz-truncated", {"t.csv.gz": truncated_gz()}, (), ["t.csv.gz", "truncated gzip"]),
    ("trace-gz-corrupt", {"t.csv.gz": corrupt_deflate()}, (), ["t.csv.gz", "gzip"]),
    ("trace-non-utf8", {"t.csv": EVENTS.encode() + b"\xff\n"}, (), ["t.csv", "line 5", "UTF-8"]),
    ("trace-time-400-digits", {"t.csv": EVENTS + f"{BIG},n0,busy\n"}, (), ["t.csv", "line 5"]),
    ("workload-non-utf8", {"w.yaml": b"jobs:\n  - name: \xff\n"}, (), ["w.yaml", "line 2", "UTF-8"]),
    ("workload-work-400-digits", {"w.yaml": workload_text(work=BIG)}, (), ["w.yaml", "field 'work'"]),
    ("workload-submit-nan", {"w.yaml": workload_text(submit=".nan")}, (), ["w.yaml", "field 'submit'"]),
    ("interval-1e-300", {}, ("--interval", "1e-300"), ["--interval"]),
    ("interval-0", {}, ("--interval", "0"), ["--interval"]),
    ("interval-nan", {}, ("--interval", "nan"), ["--interval"]),
    ("noise-nan", {}, ("--noise", "nan"), ["--noise"]),
    ("noise-inf", {}, ("--noise", "inf"), ["--noise"]),
    ("nodes-310-digits", {}, ("--nodes", FLAG_BIG), ["--nodes"]),
    ("max-jobs-310-digits", {}, ("--max-jobs", FLAG_BIG), ["--max-jobs"]),
    ("start-400-digits", {}, ("--start", BIG), ["--start"]),
    ("policies-unknown", {}, ("--policies", "magic"), ["policies", "magic"]),
    ("policies-empty", {}, ("--policies", ","), ["policies"]),
]


@pytest.mark.parametrize("written,extra,needles", [c[1:] for c in QUALITY], ids=[c[0] for c in QUALITY])
def test_bench_quality_bad_input(files, capsys, written, extra, needles):
    trace, workload = files.trace, files.workload
    for name, content in written.items():
        p = files.write(name, content)
        if name.startswith("t."):
            trace = p
        else:
            workload = p
    flags = ["=".join(extra)] if extra else []
    code, out, err = invoke(capsys, "bench", "quality", "--trace", trace, "--workload", workload, "--json", *flags)
    refused(code, err, *needles)
    assert out == ""


# ------------------------------------------------------------------ campaigns
SPEC = """name: t
command: [python3, train.py]
dir: out
search: random
trials: 3
seed: 0
space:
  lr: {log_uniform: [0.001, 0.1]}
  width: [16, 32]
fixed: {steps: 10}
job: {min_nodes: 1, max_nodes: 2}
"""


def grid_spec(keys: int, values: int, trials: str = "") -> str:
    space = "".join(f"  k{i}: [{', '.join(str(v) for v in range(values))}]\n" for i in range(keys))
    return f"name: g\ncommand: [x]\nsearch: grid\n{trials}space:\n{space}"


SPECS = [
    ("non-utf8", SPEC.encode().replace(b"name: t", b"name: t\xff"), ["line 1", "UTF-8"]),
    ("gzip-bytes", gz(SPEC), ["line 1", "UTF-8"]),
    ("trials-10-to-9", SPEC.replace("trials: 3", "trials: 1000000000"), ["field 'trials'", "at most"]),
    ("trials-400-digits", SPEC.replace("trials: 3", f"trials: {BIG}"), ["field 'trials'"]),
    ("trials-5000-digits", SPEC.replace("trials: 3", "trials: " + "9" * 5000), ["not valid YAML"]),
    ("trials-inf", SPEC.replace("trials: 3", "trials: .inf"), ["field 'trials'"]),
    ("trials-nan", SPEC.replace("trials: 3", "trials: .nan"), ["field 'trials'"]),
    ("trials-bool", SPEC.replace("trials: 3", "trials: true"), ["field 'trials'"]),
    ("grid-10-to-12", grid_spec(4, 1000), ["field 'space'", "1,000,000,000,000 combinations"]),
    ("grid-10-to-12-trials-10-to-9", grid_spec(4, 1000, "trials: 1000000000\n"), ["field 'trials'"]),
    ("grid-10-to-400", grid_spec(200, 100), ["field 'space'", "about 1e400"]),
    ("grid-trials-nan", grid_spec(2, 3, "trials: .nan\n"), ["field 'trials'"]),
    ("seed-nan", SPEC.replace("seed: 0", "seed: .nan"), ["field 'seed'"]),
    ("seed-inf", SPEC.replace("seed: 0", "seed: .inf"), ["field 'seed'"]),
    ("seed-400-digits", SPEC.replace("seed: 0", f"seed: {BIG}"), ["field 'seed'"]),
    ("seed-text", SPEC.replace("seed: 0", "seed: abc"), ["field 'seed'"]),
    ("uniform-hi-inf", SPEC.replace("{log_uniform: [0.001, 0.1]}", "{uniform: [0, .inf]}"), ["field 'space.lr'"]),
    ("uniform-lo-nan", SPEC.replace("{log_uniform: [0.001, 0.1]}", "{uniform: [.nan, 1]}"), ["field 'space.lr'"]),
    ("uniform-lo-minus-inf", SPEC.replace("{log_uniform: [0.001, 0.1]}", "{uniform: [-.inf, 1]}"),
     ["field 'space.lr'"]),
    ("log-uniform-hi-400-digits", SPEC.replace("[0.001, 0.1]", f"[1, {BIG}]"), ["field 'space.lr'"]),
    ("int-uniform-hi-1e999", SPEC.replace("{log_uniform: [0.001, 0.1]}", "{int_uniform: [0, 1.0e+999]}"),
     ["field 'space.lr'"]),
    ("choice-nan", SPEC.replace("[16, 32]", "[16, .nan]"), ["field 'space.width'"]),
    ("fixed-inf", SPEC.replace("{steps: 10}", "{steps: .inf}"), ["field 'fixed.steps'"]),
    ("job-min-nodes-400-digits", SPEC.replace("min_nodes: 1", f"min_nodes: {BIG}"), ["field 'job.min_nodes'"]),
    ("job-max-nodes-inf", SPEC.replace("max_nodes: 2", "max_nodes: .inf"), ["field 'job.max_nodes'"]),
    ("job-max-nodes-10-to-6", SPEC.replace("max_nodes: 2", "max_nodes: 1000000"), ["field 'job.max_nodes'"]),
    ("job-gpus-negative", SPEC.replace("max_nodes: 2}", "max_nodes: 2, gpus_per_node: -1}"),
     ["field 'job.gpus_per_node'"]),
    ("job-gpus-400-digits", SPEC.replace("max_nodes: 2}", f"max_nodes: 2, gpus_per_node: {BIG}}}"),
     ["field 'job.gpus_per_node'"]),
    ("job-grace-nan", SPEC.replace("max_nodes: 2}", "max_nodes: 2, grace_s: .nan}"), ["field 'job.grace_s'"]),
    ("job-rescale-up-1e12", SPEC.replace("max_nodes: 2}", "max_nodes: 2, rescale_up_s: 1.0e+12}"),
     ["field 'job.rescale_up_s'"]),
    ("job-rescale-down-minus-inf", SPEC.replace("max_nodes: 2}", "max_nodes: 2, rescale_down_s: -.inf}"),
     ["field 'job.rescale_down_s'"]),
    ("job-launch-unknown", SPEC.replace("max_nodes: 2}", "max_nodes: 2, launch: magic}"), ["field 'job.launch'"]),
    ("job-time-sexagesimal", SPEC.replace("max_nodes: 2}", "max_nodes: 2, time: 4:00:00}"),
     ["field 'job.time'", "quote it"]),
    ("job-time-nan", SPEC.replace("max_nodes: 2}", "max_nodes: 2, time: nan}"), ["field 'job.time'"]),
]


@pytest.fixture
def no_slurm(monkeypatch):
    from malletrain.cli import user
    from malletrain.slurm import submit

    def runner(cfg):
        raise AssertionError("Slurm must not be asked for bad input")
    monkeypatch.setattr(user, "_runner", runner)
    monkeypatch.setattr(submit, "submit", _no_sbatch)


@pytest.mark.parametrize("action", ["submit", "status"])
@pytest.mark.parametrize("content,needles", [c[1:] for c in SPECS], ids=[c[0] for c in SPECS])
def test_campaign_bad_spec(files, capsys, no_slurm, action, content, needles):
    spec = files.write("spec.yaml", content)
    code, out, err = invoke(capsys, "campaign", action, spec, "--config", files.config)
    refused(code, err, "spec.yaml", *needles)
    assert len(err) < 1200, err
    assert sorted(os.listdir(files.dir)) == ["c.yaml", "out", "spec.yaml", "t.csv", "w.yaml"]
    files.assert_out_untouched()


STATES = [
    ("non-utf8", b'{"trials": ["\xff"]}', "cannot read campaign state"),
    ("truncated", b'{"name": "t", "trials": [{"id": "t000", ', "cannot read campaign state"),
    ("empty", b"", "cannot read campaign state"),
    ("deeply-nested", b"[" * 100_000 + b"]" * 100_000, "campaign state"),
    ("5000-digits", b'{"trials": ' + b"9" * 5000 + b"}", "cannot read campaign state"),
    ("a-list", b"[]", "not a campaign state file"),
    ("trials-a-number", b'{"trials": 5}', "not a campaign state file"),
    ("trial-a-number", b'{"trials": [5]}', "not a campaign state file"),
    ("trial-without-params", b'{"trials": [{"id": "t000", "token": "k", "job": null}]}',
     "not a campaign state file"),
]


@pytest.mark.parametrize("action", ["submit", "status"])
@pytest.mark.parametrize("content,needle", [c[1:] for c in STATES], ids=[c[0] for c in STATES])
def test_campaign_bad_state_file(files, capsys, no_slurm, action, content, needle):
    spec = files.write("spec.yaml", SPEC.replace("dir: out", "dir: camp"))
    (files.dir / "camp").mkdir()
    state = files.write("camp/campaign.json", content)
    code, _, err = invoke(capsys, "campaign", action, spec, "--config", files.config)
    refused(code, err, "campaign.json", needle)
    assert state.read_bytes() == content and os.listdir(files.dir / "camp") == ["campaign.json"]


@pytest.mark.parametrize("action", ["submit", "status"])
@pytest.mark.parametrize("where", ["--dir", "--metrics-dir"])
def test_campaign_dir_under_a_regular_file(files, capsys, no_slurm, action, where):
    spec = files.write("spec.yaml", SPEC)
    plain = files.write("plain-file", "keep")
    code, out, err = invoke(capsys, "campaign", action, spec, "--config", files.config, where, plain / "d")
    if action == "status" and where == "--metrics-dir":
        refused(code, err, "nothing submitted yet")         # status only reads: nothing to create
    else:
        refused(code, err, str(plain / "d"))
    assert plain.read_text() == "keep"


def test_campaign_grid_capped_by_trials_is_quick(tmp_path):
    """A 10^12 grid with trials: 5 is fine: the first five combinations, never enumerated."""
    from malletrain import campaign
    p = tmp_path / "spec.yaml"
    p.write_text(grid_spec(4, 1000, "trials: 5\n"))
    got = campaign.sample(campaign.load_spec(str(p)))
    assert [t["k3"] for t in got] == [0, 1, 2, 3, 4] and all(t["k0"] == 0 for t in got)


# ------------------------------------------------------------------ status / explain
def good_status() -> dict:
    from malletrain.daemon.status import Change, Counters, CycleStats, DaemonStatus, JobStatus, Measured
    change = Change(1.0, 3, "grow", "n1", "n1,n2", "grow 1->2", "gain")
    job = JobStatus("17", "lr", "alice", "running", "RUNNING", "None", ("n1", "n2"), 2, 1, 4, "resnet",
                    Measured(2, 180.5, 1.5), 181.0, "fit", {"1": 95.0, "2": 181.0}, None,
                    "grow 1->2", "gain", change, (change,))
    return asdict(DaemonStatus(2.0, 3, True, 10.0, "scavenger", 0, ("n3",), Counters(starts=1),
                               CycleStats(2, 3, 0.5, 1.2, False), (job,)))


def _mutated(path: tuple, value) -> bytes:
    doc = good_status()
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return json.dumps(doc).encode()


def _raw(text: str) -> bytes:
    return text.encode()


STATUSES = [
    ("empty", b""),
    ("truncated", json.dumps(good_status()).encode()[:100]),
    ("non-utf8", json.dumps(good_status()).encode().replace(b"alice", b"al\xffice")),
    ("gzip-bytes", gz(json.dumps(good_status()))),
    ("a-list", b"[]"),
    ("null", b"null"),
    ("a-string", b'"status"'),
    ("no-schema", b"{}"),
    ("schema-only", b'{"schema_version": 1}'),
    ("deeply-nested", b"[" * 100_000 + b"]" * 100_000),
    ("5000-digit-cycle", json.dumps(good_status()).encode().replace(b'"cycle": 3', b'"cycle": ' + b"9" * 5000)),
    ("t-a-string", _mutated(("t",), "yesterday")),
    ("t-400-digits", json.dumps(good_status()).encode().replace(b'"t": 2.0', b'"t": ' + BIG.encode())),
    ("t-nan", json.dumps(good_status()).encode().replace(b'"t": 2.0', b'"t": NaN')),
    ("t-1e999", json.dumps(good_status()).encode().replace(b'"t": 2.0', b'"t": 1e999')),
    ("cycle-a-float", _mutated(("cycle",), 1.5)),
    ("counters-a-list", _mutated(("counters",), [])),
    ("jobs-a-dict", _mutated(("jobs",), {"17": {}})),
    ("job-a-number", _mutated(("jobs",), [5])),
    ("job-missing-keys", _mutated(("jobs",), [{"job": "17"}])),
    ("job-size-a-list", _mutated(("jobs", 0, "size"), [1])),
    ("measured-a-string", _mutated(("jobs", 0, "measured"), "fast")),
    ("measured-rate-a-string", _mutated(("jobs", 0, "measured", "samples_per_s"), "fast")),
    ("curve-a-list", _mutated(("jobs", 0, "curve"), [1, 2])),
    ("history-t-1e999", json.dumps(good_status()).encode().replace(b'"t": 1.0', b'"t": 1e999')),
    ("history-t-400-digits", json.dumps(good_status()).encode().replace(b'"t": 1.0', b'"t": ' + BIG.encode())),
    ("nodes-a-number", _mutated(("jobs", 0, "nodes"), 5)),
    ("excluded-a-list", _mutated(("excluded_nodes",), ["n1"])),
]


@pytest.mark.parametrize("command", [("status",), ("explain", "17")], ids=["status", "explain"])
@pytest.mark.parametrize("content", [c[1] for c in STATUSES], ids=[c[0] for c in STATUSES])
def test_status_and_explain_with_a_corrupt_status_file(tmp_path, capsys, command, content):
    (tmp_path / "status.json").write_bytes(content)
    code, out, err = invoke(capsys, *command, "--state-dir", tmp_path)
    refused(code, err, "status.json")
    assert out == "", "nothing is printed from a file that turns out broken"
    assert len(err) < 600, err


def test_good_status_file_still_works(tmp_path, capsys):
    (tmp_path / "status.json").write_text(json.dumps(good_status()))
    for command in (("status",), ("explain", "17"), ("status", "--json")):
        code, out, _ = invoke(capsys, *command, "--state-dir", tmp_path)
        assert code == 0 and "17" in out


# ------------------------------------------------------------------ the same, as real processes
def _real(tmp_path, *argv):
    r = subprocess.run([sys.executable, "-m", "malletrain", *map(str, argv)], capture_output=True, text=True,
                       timeout=60, cwd=str(tmp_path))
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("case", ["replay-gz-truncated", "replay-interval-tiny", "replay-out-under-file",
                                  "jpa-non-utf8", "config-400-digits", "campaign-huge-grid",
                                  "submit-max-nodes-310-digits", "status-corrupt", "bench-nodes-310-digits"])
def test_real_process_exits_2_without_traceback(files, case):
    plain = files.write("plain-file", "keep")
    argv = {
        "replay-gz-truncated": files.replay(trace=files.write("t.csv.gz", truncated_gz())),
        "replay-interval-tiny": files.replay("--interval", "1e-300"),
        "replay-out-under-file": files.replay(out=plain / "out"),
        "jpa-non-utf8": ["jpa", "predict", "--samples", files.write("s.csv", SAMPLES.encode() + b"\xff\n"),
                         "--nodes", "1"],
        "config-400-digits": ["config", "check", files.write("bad.yaml", config_with("daemon", "interval_s", BIG))],
        "campaign-huge-grid": ["campaign", "submit", files.write("spec.yaml", grid_spec(4, 1000)),
                               "--config", files.config],
        "submit-max-nodes-310-digits": ["submit", "--config", files.config, "--metrics-dir", files.dir / "m",
                                        "--max-nodes", FLAG_BIG, "--", "true"],
        "status-corrupt": ["status", "--state-dir", files.dir],
        "bench-nodes-310-digits": ["bench", "allocator", "--nodes", FLAG_BIG],
    }[case]
    if case == "status-corrupt":
        files.write("status.json", b'{"schema_version": 1, "t": ')
    code, out, err = _real(files.dir, *argv)
    refused(code, err)
    assert out == ""
    files.assert_out_untouched()
    assert plain.read_text() == "keep" and not (files.dir / "m").exists()
