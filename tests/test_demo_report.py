"""The live demo's report says in one line whether harvesting happened (issue #22): a run in which
the daemon never started must not read like a result."""
from devtools.demo_live import harvested, report, verdict


def _result(harvest_per_s: int) -> dict:
    samples = [dict(t=float(t), harvest=harvest_per_s, primary=1, total=4) for t in range(10)]
    return dict(samples=samples, waits=[])


def test_nothing_harvested_is_said_plainly():
    text = report(_result(0), None, None)
    assert "verdict: NOTHING HARVESTED" in text and "30 idle node-seconds" in text
    assert harvested(_result(0)) == (0, 30)


def test_harvesting_verdict_gives_the_share_of_idle_node_seconds():
    assert harvested(_result(2)) == (20, 30)
    assert verdict(20, 30) == "verdict: harvesting worked: malleable jobs used 67% of the idle node-seconds"
    assert "verdict: harvesting worked" in report(_result(2), None, None)
