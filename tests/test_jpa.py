import json
import math
import os
import random
import subprocess
import sys

import pytest

from malletrain.cli.main import main
from malletrain.domain.model import Sample
from malletrain.jpa import Advisor, fit_scaling, probe_counts


def amdahl_log(a, b, c):
    return lambda n: 1.0 / (a / n + b + c * math.log2(n))


def test_fit_recovers_exact_parameters():
    f = amdahl_log(2.0, 0.05, 0.02)
    counts = [1, 2, 4]
    fit = fit_scaling(counts, [f(n) for n in counts])
    assert fit.a == pytest.approx(2.0, rel=1e-9)
    assert fit.b == pytest.approx(0.05, rel=1e-6)
    assert fit.c == pytest.approx(0.02, rel=1e-6)
    for n in (8, 16, 64):
        assert fit.throughput(n) == pytest.approx(f(n), rel=1e-9)


def test_fit_expresses_retrograde_scaling():
    f = amdahl_log(1.0, 0.0, 0.05)   # peaks near n = ln2 / 0.05 ≈ 14
    fit = fit_scaling([2, 8, 32], [f(n) for n in (2, 8, 32)])
    assert fit.throughput(64) < fit.throughput(16)
    assert fit.throughput(64) == pytest.approx(f(64), rel=1e-6)


def test_fit_coefficients_never_negative():
    rng = random.Random(3)
    for _ in range(200):
        counts = sorted(rng.sample(range(1, 65), 3))
        xs = [rng.uniform(1, 1000) for _ in counts]
        fit = fit_scaling(counts, xs)
        assert min(fit.a, fit.b, fit.c) >= 0
        assert all(fit.throughput(n) > 0 for n in (1, 2, 100))


_FITS = """
import hashlib, random
from malletrain.jpa import fit_scaling
rng, h = random.Random(7), hashlib.sha256()
for _ in range(300):
    counts = [1, 2, 4] + [rng.choice([1, 2, 3, 4, 6, 8, 16, 32]) for _ in range(rng.randint(0, 37))]
    xs = [1000.0 * n ** rng.uniform(0.5, 1.0) * rng.uniform(0.9, 1.1) for n in counts]
    f = fit_scaling(counts, xs)
    h.update(repr((f.a, f.b, f.c, f.rel_rmse)).encode())
print(h.hexdigest())
"""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def test_fits_are_the_same_to_the_bit_whatever_blas_kernel_numpy_picks():
    """The decisions must not depend on the machine: numpy's bundled OpenBLAS picks a kernel per
    CPU (``OPENBLAS_CORETYPE`` forces one), and numpy.linalg.lstsq's last bits moved with it
    (Haswell against the SSE kernels on these inputs), which sent a campaign replay elsewhere."""
    flags = _cpu_flags()
    if not {"avx2", "fma"} <= flags:
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA, so that OpenBLAS can run its Haswell kernel")
    got = {}
    for kernel in ("Haswell", "Prescott"):
        env = {**os.environ, "OPENBLAS_CORETYPE": kernel}
        r = subprocess.run([sys.executable, "-c", _FITS], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got[kernel] = r.stdout.strip()
    assert got["Haswell"] == got["Prescott"], got


def test_the_fit_calls_no_blas_or_lapack(monkeypatch):
    import numpy as np

    def refuse(*args, **kwargs):
        raise AssertionError("a BLAS/LAPACK routine was called")
    monkeypatch.setattr(np.linalg, "lstsq", refuse)
    monkeypatch.setattr(np, "dot", refuse)
    monkeypatch.setattr(np, "matmul", refuse)
    f = amdahl_log(2.0, 0.05, 0.02)
    fit = fit_scaling([1, 2, 4, 8], [f(n) for n in (1, 2, 4, 8)])
    assert fit.a == pytest.approx(2.0, rel=1e-9) and fit.c == pytest.approx(0.02, rel=1e-6)


@pytest.mark.parametrize("unit", [1e-300, 1e-150, 1e-3, 1e5, 1e150, 1e300])
def test_the_fit_does_not_depend_on_the_throughputs_unit(unit):
    """Samples/s in any unit (the normal equations' squares would overflow or vanish at the
    extremes without the fit's power-of-two scaling)."""
    f = amdahl_log(2.0 / unit, 0.05 / unit, 0.02 / unit)
    fit = fit_scaling([1, 2, 4, 8], [f(n) for n in (1, 2, 4, 8)])
    assert (fit.a * unit, fit.b * unit, fit.c * unit) == pytest.approx((2.0, 0.05, 0.02), rel=1e-9)


def test_dependent_columns_are_never_fitted():
    """One node count, all three terms allowed: a/n, b and c·log2 n are then proportional, so no
    set of two or three of them is solved; the fit is the a/n term alone, by least squares
    (rows x_i/4 against 1: a = 4·Σx / Σx²)."""
    xs = [100.0, 110.0, 90.0]
    fit = fit_scaling([4, 4, 4], xs, terms=3)
    assert fit.b == 0.0 and fit.c == 0.0
    assert fit.a == pytest.approx(4 * sum(xs) / sum(x * x for x in xs), rel=1e-12)


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError):
        fit_scaling([], [])
    with pytest.raises(ValueError):
        fit_scaling([1, 2], [10.0, float("nan")])
    with pytest.raises(ValueError):
        fit_scaling([0], [1.0])


def test_probe_counts():
    assert probe_counts(1, 64) == (1, 2, 4)
    assert probe_counts(4, 4) == (4,)
    assert probe_counts(2, 5) == (2, 3, 5)
    assert len(probe_counts(1, 2)) <= 3 and set(probe_counts(1, 2)) <= {1, 2}


def feed(adv, job, n, values, t0=0.0):
    for i, x in enumerate(values):
        adv.add(Sample(job, n, x, t0 + i))
    return t0 + len(values)


def test_warmup_and_outliers_are_dropped():
    adv = Advisor()
    feed(adv, "j", 2, [10.0, 100.0, 101.0, 99.0, 5000.0, 100.0])
    assert adv.measured("j") == {2: pytest.approx(100.0)}
    clean = adv.clean("j")[2]
    assert 10.0 not in clean and 5000.0 not in clean


def test_garbage_samples_are_rejected_and_counted():
    adv = Advisor()
    bad = [Sample("j", 2, float("nan"), 1), Sample("j", 0, 10, 2), Sample("j", 2, -1.0, 3),
           Sample("j", 2, float("inf"), 4), Sample("j", True, 10.0, 5), Sample("j", 2, "x", 6)]
    for s in bad:
        assert adv.add(s) is False
    assert adv.rejected == len(bad)
    adv.add(Sample("j", 2, 10.0, 10))
    assert adv.add(Sample("j", 2, 10.0, 9)) is False   # older than the newest


def test_probe_then_fit():
    adv = Advisor()
    c = adv.curve("j", 1, 16, [1, 2, 4, 8, 16])
    assert c.probe == 1 and not c.points
    f = amdahl_log(1.0, 0.02, 0.01)
    t = 0.0
    for n in (1, 2):
        t = feed(adv, "j", n, [f(n)] * 4, t)
        c = adv.curve("j", 1, 16, [1, 2, 4, 8, 16])
    assert c.probe == 4 and c.source == "partial-fit"
    feed(adv, "j", 4, [f(4)] * 4, t)
    c = adv.curve("j", 1, 16, [1, 2, 4, 8, 16])
    assert c.probe is None and c.source == "fit"
    assert c.points[16].mean == pytest.approx(f(16), rel=1e-6)
    # the band widens with extrapolation distance
    w = lambda n: (c.points[n].high - c.points[n].low) / c.points[n].mean
    assert w(16) > w(4)
    assert c.points[16].low < c.points[16].mean < c.points[16].high


def test_profile_prior_shared_across_trials():
    adv = Advisor()
    f = amdahl_log(1.0, 0.02, 0.01)
    adv.register("a", "bert")
    t = 0.0
    for n in (1, 2, 4):
        t = feed(adv, "a", n, [f(n)] * 4, t)
    adv.register("b", "bert")
    # trial b is 3x faster per sample (other batch size) and measured at one count only
    feed(adv, "b", 2, [3 * f(2)] * 4)
    c = adv.curve("b", 1, 16, [1, 2, 4, 8, 16], "bert")
    assert c.source == "profile-prior"
    assert c.points[8].mean == pytest.approx(3 * f(8), rel=1e-6)
    # within the profile's measured range (1-4) the shape is trusted: no probe
    assert adv.curve("b", 1, 4, [1, 2, 4], "bert").probe is None
    # beyond it, one measurement replaces the extrapolation: twice the largest measured count
    assert c.probe == 8
    feed(adv, "b", 8, [3 * f(8) * 1.3] * 4, 100.0)          # the real curve has a bump at 8
    c = adv.curve("b", 1, 16, [1, 2, 4, 8, 16], "bert")
    assert c.points[8].mean == pytest.approx(3 * f(8) * 1.3, rel=1e-6)   # measured, not modelled
    assert c.probe == 16
    assert adv.curve("b", 1, 12, [8, 12], "bert").probe is None          # 16 is beyond its range
    # without the shared profile the same data would still need probes
    adv.register("c", "")
    feed(adv, "c", 2, [3 * f(2)] * 4)
    assert adv.curve("c", 1, 16, [1, 2, 4]).probe == 1


def run_cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_jpa_predict_cli(tmp_path, capsys):
    f = amdahl_log(1.0, 0.02, 0.01)
    p = tmp_path / "s.csv"
    p.write_text("nodes,samples_per_s\n" + "".join(f"{n},{f(n)}\n" for n in (1, 2, 4) for _ in range(2)))
    code, out, _ = run_cli(capsys, "jpa", "predict", "--samples", str(p), "--nodes", "1,2,4,8,16,32,64")
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"1", "2", "4", "8", "16", "32", "64"}
    assert data["32"]["mean"] == pytest.approx(f(32), rel=1e-4)
    assert data["32"]["low"] < data["32"]["mean"] < data["32"]["high"]


@pytest.mark.parametrize("content,needle", [
    ("", "empty file"),
    ("nodes,samples_per_s\n", "no measurements"),
    ("n,x\n1,2\n", "header must be"),
    ("nodes,samples_per_s\n1,abc\n", "line 2"),
    ("nodes,samples_per_s\n0,5\n", "must be positive"),
    ("nodes,samples_per_s\n2,-5\n", "positive finite"),
    ("nodes,samples_per_s\n2\n", "expected 2 fields"),
])
def test_jpa_predict_cli_bad_files(tmp_path, capsys, content, needle):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    code, out, err = run_cli(capsys, "jpa", "predict", "--samples", str(p), "--nodes", "1,2")
    assert code == 2 and needle in err and str(p) in err and out == ""


def test_jpa_predict_cli_missing_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "jpa", "predict", "--samples", str(tmp_path / "nope.csv"), "--nodes", "1")
    assert code == 2 and "cannot read" in err


def test_advisor_survives_any_bounded_input():
    """Whatever in-range samples a hostile job reports (rates 1e-9..1e15 samples/s, up to 10^6
    nodes, bursts at 1 ns spacing), every curve stays finite and nothing raises (seeded fuzz)."""
    import math
    import random

    from malletrain.core.decide import size_grid
    from malletrain.domain.model import Sample
    from malletrain.jpa.advisor import Advisor
    rng = random.Random(1)
    for _ in range(2000):
        a = Advisor()
        for j in range(3):
            a.register(f"j{j}", "p" if j < 2 else "q")
        t = 0.0
        for _ in range(rng.randint(1, 60)):
            t += rng.choice([1e-9, 1e-3, 1.0, 1e6])
            x = rng.choice([1e-9, 1e-6, 1.0, 1e3, 1e9, 1e15, 10 ** rng.uniform(-9, 15)])
            n = rng.choice([1, 2, 3, 4, 1000, 1_000_000, rng.randint(1, 64)])
            a.add(Sample(f"j{rng.randint(0, 2)}", n, x, t))
        for j in range(3):
            hi = rng.choice([4, 64, 1_000_000])
            curve = a.curve(f"j{j}", 1, hi, size_grid(1, hi, 32))
            assert all(math.isfinite(p.mean) and p.mean >= 0 for p in curve.points.values())
    bad = Advisor()
    for x, n in ((5e-324, 2), (float("nan"), 2), (1e300, 2), (10.0, 10**7), (10.0, 0), (10.0, True)):
        assert not bad.add(Sample("j", n, x, 1.0))
    assert bad.rejected == 6


def test_a_finished_job_is_forgotten_but_its_profile_prior_stays():
    from malletrain.domain.model import Sample
    a = Advisor(warmup_samples=0)
    for t, n in enumerate([1, 1, 2, 2, 4, 4]):
        a.register("done", "alice/resnet")
        a.add(Sample("done", n, 100.0 * n ** 0.8, float(t)))
    before = a.curve("new", 1, 8, [1, 2, 4, 8], "alice/resnet")
    assert before.source == "profile-prior"
    a.forget("done")
    assert "done" not in a._values and "done" not in a._profile
    after = a.curve("new2", 1, 8, [1, 2, 4, 8], "alice/resnet")
    assert after.source == "profile-prior"
    assert {n: p.mean for n, p in after.points.items()} == {n: p.mean for n, p in before.points.items()}
    b = Advisor()
    b.load_retired(a.retired())                        # the daemon's restart
    again = b.curve("new3", 1, 8, [1, 2, 4, 8], "alice/resnet")
    assert {n: p.mean for n, p in again.points.items()} == {n: p.mean for n, p in before.points.items()}
    for i in range(Advisor.MAX_RETIRED_PER_PROFILE + 5):   # bounded
        for t, n in enumerate([1, 1, 2, 2, 4, 4]):
            a.register(f"j{i}", "alice/resnet")
            a.add(Sample(f"j{i}", n, 100.0 * n ** 0.8, float(t)))
        a.forget(f"j{i}")
    assert len(a.retired()["alice/resnet"]) == Advisor.MAX_RETIRED_PER_PROFILE


def test_beyond_probe_doubles_the_largest_measured_count_within_the_range():
    from malletrain.jpa.advisor import beyond_probe
    assert beyond_probe(1, 16, [1, 2, 4]) == 8
    assert beyond_probe(2, 12, {2: 1.0, 3: 1.0, 4: 1.0, 12: 1.0}) is None   # 24 > 12
    assert beyond_probe(2, 8, [2, 3, 4]) == 8
    assert beyond_probe(2, 7, [2, 3, 4]) is None                           # 8 > max_nodes
    assert beyond_probe(16, 64, [1, 2]) is None                            # 4 < min_nodes
    assert beyond_probe(1, 16, []) is None


def test_probe_ladder_adds_the_top_counts_to_the_bottom_ones():
    from malletrain.jpa.advisor import probe_ladder
    assert probe_ladder(2, 16) == (2, 4, 8, 16)
    assert probe_ladder(1, 16) == (1, 2, 4, 8, 16)
    assert probe_ladder(1, 64) == (1, 2, 4, 16, 32, 64)
    assert probe_ladder(4, 4) == (4,)
    assert probe_ladder(2, 4) == (2, 3, 4)
    assert probe_ladder(5, 12) == (5, 6, 8, 12)      # 5, 8, 12 up; 12, 6 down (3 < min_nodes)


def test_a_curve_without_a_fit_lists_every_count_it_would_probe_and_what_is_measured():
    adv = Advisor()
    c = adv.curve("j", 2, 16, [2, 4, 8, 16])
    assert c.probe == 2 and c.probes == (2, 4, 8, 16) and c.measured == ()
    feed(adv, "j", 16, [800.0] * 4)
    c = adv.curve("j", 2, 16, [2, 4, 8, 16])
    assert c.probe == 2 and c.probes == (2, 4, 8) and c.measured == (16,)
    assert c.source == "partial-fit" and c.points[16].mean == pytest.approx(800.0)
    t = feed(adv, "j", 8, [500.0] * 4, 10.0)
    feed(adv, "j", 4, [300.0] * 4, t)
    c = adv.curve("j", 2, 16, [2, 4, 8, 16])
    assert c.probe is None and c.probes == () and c.measured == (4, 8, 16)
