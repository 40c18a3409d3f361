"""``tunefleet plot``: one PNG with the run's best-so-far curves and a per-worker timeline.

Three panels: best GFLOP/s so far against wall time and against the number of evaluations
(each measured trial as a dot), and a timeline with one lane per worker showing the interval
of every trial it evaluated, coloured by outcome, with its busy share (:mod:`tunefleet.busy`).
matplotlib is imported inside :func:`render` with the ``Agg`` backend, so no display is
needed and the import costs nothing elsewhere.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tunefleet.busy import busy_shares, busy_text
from tunefleet.errors import UsageError
from tunefleet.vocabulary import BestStatus, TrialState

_STATE_COLOURS = {
    "done": "#2b8a3e",
    "invalid": "#e8590c",
    "failed": "#c92a2a",
    "timed_out": "#862e9c",
}


def lane_labels(intervals: Sequence[Mapping[str, Any]]) -> list[str]:
    """The timeline's lane labels, one per worker in lane order: host, pid and its busy share
    (:mod:`tunefleet.busy`, the definition every report uses)."""
    shares = busy_shares(intervals)
    labels: dict[str, str] = {}
    for iv in intervals:
        wid = str(iv["worker_id"])
        if wid not in labels:
            pid = f" pid {iv['worker_pid']}" if iv.get("worker_pid") is not None else ""
            labels[wid] = f"{iv['worker_host']}{pid} ({busy_text(shares[wid])})"
    return list(labels.values())


#: Characters per line of the figure's title (9 inches at the default title size).
TITLE_CHARS = 80


def render(
    path: Path,
    *,
    title: str,
    series: Sequence[Mapping[str, Any]],
    intervals: Sequence[Mapping[str, Any]],
    run_best: Mapping[str, Any] | None = None,
) -> None:
    """Write the PNG. ``series`` rows come from ``report.progress_series``, ``intervals`` from
    ``report.worker_intervals``; ``run_best`` (a ``report.run_progress`` row) marks the run's best
    as every report quotes it (its confirmed figure once re-measured) at the end of the
    curves."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "plotting needs matplotlib; pip install 'tunefleet[plot]' (or tunefleet[local])"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 10), constrained_layout=True)
    # Long problem arguments (a feinsum einsum, many sizes) would run off the figure's edge.
    fig.suptitle(textwrap.fill(title, TITLE_CHARS, break_on_hyphens=False))
    ax_time, ax_trials, ax_lanes = axes

    measured = [r for r in series if r["gflops"] is not None]
    best = [r for r in series if r["best_gflops"] is not None]
    for ax, key, label in (
        (ax_time, "elapsed_s", "seconds since the run started"),
        (ax_trials, "n", "evaluations"),
    ):
        if measured:
            ax.scatter(
                [r[key] for r in measured],
                [r["gflops"] for r in measured],
                s=12,
                color="#adb5bd",
                label="trial",
                zorder=2,
            )
        if best:
            ax.step(
                [r[key] for r in best],
                [r["best_gflops"] for r in best],
                where="post",
                color="#1c7ed6",
                linewidth=2,
                label="best so far",
                zorder=3,
            )
        if run_best is not None and run_best.get("best_gflops") is not None and series:
            status = run_best.get("best_status") or BestStatus.UNCONFIRMED
            ax.scatter(
                [max(r[key] for r in series)],
                [run_best["best_gflops"]],
                marker="*",
                s=160,
                color="#2b8a3e" if status == BestStatus.CONFIRMED else "#c92a2a",
                label=f"the run's best ({status})",
                zorder=4,
            )
        failed = [r for r in series if r["state"] != TrialState.DONE]
        if failed:
            ax.scatter(
                [r[key] for r in failed],
                [0.0] * len(failed),
                marker="x",
                s=18,
                color=_STATE_COLOURS["failed"],
                label="invalid / failed / timed out",
                zorder=2,
            )
        ax.set_xlabel(label)
        ax.set_ylabel("GFLOP/s")
        ax.grid(True, alpha=0.3)
        if measured or failed:
            ax.legend(loc="best", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no finished trials yet", ha="center", transform=ax.transAxes)

    lanes: dict[str, int] = {}
    labels = lane_labels(intervals)
    util = busy_shares(intervals)
    for iv in intervals:
        wid = str(iv["worker_id"])
        lanes.setdefault(wid, len(lanes))
        ax_lanes.barh(
            lanes[wid],
            max(iv["end_s"] - iv["start_s"], 1e-3),
            left=iv["start_s"],
            height=0.6,
            color=_STATE_COLOURS.get(iv["state"], "#868e96"),
            edgecolor="white",
            linewidth=0.3,
        )
    ax_lanes.set_yticks(range(len(labels)), labels, fontsize=8)
    ax_lanes.invert_yaxis()
    ax_lanes.set_xlabel("seconds since the run started")
    fleet = f", fleet {busy_text(sum(util.values()) / len(util))}" if util else ""
    ax_lanes.set_title(
        f"worker timeline (one bar per evaluation, coloured by outcome{fleet})", fontsize=9
    )
    ax_lanes.grid(True, axis="x", alpha=0.3)
    if not intervals:
        ax_lanes.text(0.5, 0.5, "no evaluations yet", ha="center", transform=ax_lanes.transAxes)
    else:
        from matplotlib.patches import Patch

        seen = sorted({iv["state"] for iv in intervals})
        ax_lanes.legend(
            handles=[Patch(color=_STATE_COLOURS.get(s, "#868e96"), label=s) for s in seen],
            loc="best",
            fontsize=8,
        )
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise UsageError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
