"""``malletrain bench campaign --plot PNG``: what a campaign replay found, against the hours.

Top: the best complete trial's accuracy since the campaign's start, one line per run (colour: the
mode; one line per seed; a dot where it reached the target), the target as a dashed line; the axis
shows the last ``ZOOM_POINTS`` below the target, where the runs differ.  Bottom, on the same hours:
the trace's idle node-hours since the start (what any allocation could have spent), so a reader
sees when the capacity came and how the times to the target follow it.  With ``--bound``, a line
per seed where the bound lies.

Written to a temporary file beside ``path`` and renamed (nothing half-written); matplotlib is
imported here only.
"""
from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from malletrain.domain.errors import InputError
from malletrain.domain.safefile import write_atomic

if TYPE_CHECKING:
    from malletrain.bench.campaign import CampaignOutcome, IdleCapacity

ZOOM_POINTS = 10.0      # the accuracy axis starts this far below the target
COLOURS = {"random-full": "#7f7f7f", "asha": "#1f77b4", "asha-promise": "#d62728", "asha-oracle": "#2ca02c",
           "asha-first": "#9467bd"}


def check_plot_path(path: str) -> None:
    """:class:`InputError` when ``path`` obviously cannot be written (checked before the runs: a
    directory there, or a parent that is missing, not a directory or not writable)."""
    if not os.path.basename(path):      # empty, or ends in a separator: no file name
        raise InputError("cannot write the plot: not a file name", path=path or "''")
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    if os.path.isdir(full):
        raise InputError("cannot write the plot: is a directory", path=path)
    if not os.path.isdir(parent):
        raise InputError(f"cannot write the plot: {parent} is not a directory", path=path)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write the plot: {parent} is not writable", path=path)


def plot_campaign(outcomes: Mapping[str, Sequence[CampaignOutcome]], capacity: IdleCapacity,
                  target: float, table_best: float, path: str, title: str,
                  bounds: Sequence[float | None] = ()) -> None:
    """The PNG at ``path`` (module docstring).  ``target``: the accuracy (%) a complete trial must
    reach; ``bounds``: the bound per seed, in seconds from the start (None: beyond the trace)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [o for got in outcomes.values() for o in got]
    span_h = max((o.span_s for o in runs), default=0.0) / 3600.0
    # the last new best of all runs (a run's reaching the target is its last new best)
    last_h = max((t for o in runs for t, _ in o.best_series), default=span_h)
    end_h = min(span_h, max(last_h * 1.1, 1.0)) if span_h else max(last_h, 1.0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, height_ratios=(2.2, 1.0))
    for mode, got in outcomes.items():
        colour = COLOURS.get(mode)
        labelled = False
        for o in got:
            if not o.best_series:       # nothing completed in this run: no line
                continue
            xs = [t for t, _ in o.best_series]
            ys = [v for _, v in o.best_series]
            stop_h = o.reached_s / 3600.0 if o.reached_s is not None else end_h
            top.step(xs + [stop_h], ys + [ys[-1]], where="post", color=colour, lw=1.0, alpha=0.8,
                     label=None if labelled else mode)
            labelled = True
            if o.reached_s is not None:
                top.plot([stop_h], [ys[-1]], "o", color=colour, ms=3)
    top.axhline(target, color="black", ls="--", lw=0.8, label=f"target: within {table_best - target:g} point "
                                                                f"of the table's best ({table_best:.2f}%)")
    for i, b in enumerate(x for x in bounds if x is not None):
        top.axvline(b / 3600.0, color="#9467bd", lw=0.6, alpha=0.5,
                    label=None if i else "bound on any ASHA allocation, per seed")
    top.set_ylim(target - ZOOM_POINTS, table_best + 0.5)     # the search's end game; worse trials leave the frame
    top.set_ylabel("best complete trial (%)")
    top.set_title(title)
    top.legend(loc="lower right", fontsize=8)
    hours = capacity.times / 3600.0 - capacity.times[0] / 3600.0
    bottom.plot(hours, capacity.cum / 3600.0, color="#555555", lw=1.0)
    bottom.set_ylabel("idle node-hours\nsince the start")
    bottom.set_xlabel("hours since the campaign's start")
    bottom.set_xlim(0.0, end_h)
    at = int(min(len(hours) - 1, max(0, hours.searchsorted(end_h))))
    bottom.set_ylim(0.0, max(1.0, float(capacity.cum[at]) / 3600.0 * 1.05))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    try:
        write_atomic(path, buf.getvalue(), mode=0o644)
    except OSError as exc:
        raise InputError(f"cannot write the plot: {exc.strerror or exc}", path=path) from None
