"""PNG plots of a replay: idle vs. allocated nodes, and job progress."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _hours(ts, t0):
    return [(t - t0) / 3600.0 for t in ts]


def plot_nodes(result, path: str) -> None:
    tl = result.timeline
    fig, ax = plt.subplots(figsize=(10, 4))
    if tl:
        t0 = tl[0][0]
        x = _hours([r[0] for r in tl], t0)
        ax.step(x, [r[1] for r in tl], where="post", label="idle nodes (harvestable)", color="#999999")
        ax.step(x, [r[2] for r in tl], where="post", label="allocated to malleable jobs", color="#d62728")
    s = result.summary
    ax.set_title(f"{s.policy}: harvested {100 * s.harvested_fraction:.1f}% of idle node-seconds")
    ax.set_xlabel("hours since trace start")
    ax.set_ylabel("nodes")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_progress(result, path: str) -> None:
    fig, ax = plt.subplots(figsize=(10, 4))
    t0 = result.timeline[0][0] if result.timeline else 0.0
    for _jid, series in sorted(result.progress.items())[:60]:
        if series:
            ax.plot(_hours([p[0] for p in series], t0), [100 * p[1] for p in series], lw=0.8)
    s = result.summary
    ax.set_title(f"{s.policy}: job progress ({s.jobs_completed}/{s.jobs} completed"
                 + (", first 60 shown" if len(result.progress) > 60 else "") + ")")
    ax.set_xlabel("hours since trace start")
    ax.set_ylabel("% of work done")
    ax.set_ylim(0, 101)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
