"""The daemon's full garbage collection between cycles (:func:`collect_if_due`), in a module of
its own so that a benchmark timing decisions as the daemon runs them needs none of the rest of the
daemon.  Imports the standard library only.
"""
from __future__ import annotations

import gc


def collect_if_due() -> bool:
    """Run Python's full garbage collection now when the collector is about to consider one
    itself: its count of young-generation passes since the last full one has reached its threshold
    less one, so the next young pass or the one after may start a full one.  Called while a daemon
    waits for its next cycle, so the full pass (a walk over every object the process holds: about
    10 ms in the allocator benchmark's process, more with a large queue in memory) comes between
    decisions, not inside one.  It may run more often than Python's own, which also waits until
    the objects that survived young passes since the last full one are a quarter of the older
    ones (in the allocator benchmark both ran once in 30 decisions).  Returns whether it ran
    (never with the collector disabled)."""
    if gc.isenabled() and gc.get_count()[2] >= gc.get_threshold()[2] - 1:
        gc.collect()
        return True
    return False
