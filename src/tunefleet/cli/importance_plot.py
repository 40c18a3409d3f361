"""The importance PNG (``tunefleet importance RUN --plot`` and ``tunefleet plot --importance``).

Three views of one :func:`tunefleet.importance.report`: the parameters ranked by their
importance for speed and for validity (bars); the speed per value of the most important
parameters (box plots from the report's quartiles: best, quartiles and worst of the measured
configurations, with each value's count and failure rate under it); and the top N
configurations against the rest in parallel coordinates (one vertical axis per parameter in
the order of importance, its values in their order, and the speed last). matplotlib is
imported inside :func:`render` with the ``Agg`` backend.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunefleet.errors import UsageError

#: Parameters that get a box plot (the most important first).
MAX_BOXES = 6
TOP_COLOUR = "#d9480f"
REST_COLOUR = "#adb5bd"
SPEED_COLOUR = "#1c7ed6"
VALIDITY_COLOUR = "#862e9c"


def speed_key(report: Mapping[str, Any]) -> str:
    """``gflops`` when every measured value has GFLOP/s, else ``time_s``."""
    for p in report["parameters"]:
        for v in p["values"]:
            if v["measured"] and v["gflops"] is None:
                return "time_s"
    return "gflops"


def render(path: Path, *, title: str, report: Mapping[str, Any]) -> None:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "plotting needs matplotlib; pip install 'tunefleet[plot]' (or tunefleet[local])"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = list(report["parameters"])
    boxed = params[:MAX_BOXES]
    box_rows = max(1, math.ceil(len(boxed) / 3))
    fig = plt.figure(figsize=(13, 4.6 + 3.0 * box_rows), constrained_layout=True)
    grid = fig.add_gridspec(1 + box_rows, 3, height_ratios=[1.5] + [1.0] * box_rows)
    fig.suptitle(textwrap.fill(title, 110, break_on_hyphens=False))
    _bars(fig.add_subplot(grid[0, 0]), report)
    _parallel(fig.add_subplot(grid[0, 1:]), report)
    key = speed_key(report)
    for i, p in enumerate(boxed):
        _box(fig.add_subplot(grid[1 + i // 3, i % 3]), p, key)
    if not boxed:
        ax = fig.add_subplot(grid[1, :])
        ax.axis("off")
        ax.text(0.5, 0.5, "no parameters", ha="center")
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise UsageError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _bars(ax: Any, report: Mapping[str, Any]) -> None:
    params = report["parameters"]
    forest = bool(report["forest"]["fitted"])
    names = [p["name"] for p in params]
    speed = [(p["speed"]["forest"] if forest else p["speed"]["variance"]) or 0.0 for p in params]
    valid = [p["validity"]["variance"] or 0.0 for p in params]
    ys = range(len(names))
    h = 0.38
    ax.barh([y - h / 2 for y in ys], speed, height=h, color=SPEED_COLOUR, label="speed")
    ax.barh([y + h / 2 for y in ys], valid, height=h, color=VALIDITY_COLOUR, label="validity")
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of variance explained alone")
    how = (
        f"forest, out-of-bag R² {report['forest']['oob_r2']:.2f}"
        if forest
        else "variance between values"
    )
    ax.set_title(f"importance ({how})", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def _box(ax: Any, p: Mapping[str, Any], key: str) -> None:
    stats, labels = [], []
    for v in p["values"]:
        q = v[key]
        under = f"{v['label']}\nn={v['trials']}" + (
            f"\n{100 * v['fail_rate']:.0f}% fail" if v["fail_rate"] else ""
        )
        labels.append(under)
        if q is None:
            stats.append(
                {
                    "med": math.nan,
                    "q1": math.nan,
                    "q3": math.nan,
                    "whislo": math.nan,
                    "whishi": math.nan,
                    "fliers": [],
                }
            )
            continue
        scale = 1e3 if key == "time_s" else 1.0
        stats.append(
            {
                "med": q["median"] * scale,
                "q1": q["q1"] * scale,
                "q3": q["q3"] * scale,
                "whislo": q["min"] * scale,
                "whishi": q["max"] * scale,
                "fliers": [],
            }
        )
    ax.bxp(
        stats,
        showfliers=False,
        patch_artist=True,
        boxprops={"facecolor": "#d0ebff", "edgecolor": SPEED_COLOUR},
        medianprops={"color": TOP_COLOUR},
    )
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.set_ylabel("GFLOP/s" if key == "gflops" else "median time (ms)", fontsize=8)
    # Log scale: the analysis is on log time, and speeds of a space span decades.
    ax.set_yscale("log")
    share = p["speed"]["forest"] if p["speed"]["forest"] is not None else p["speed"]["variance"]
    ax.set_title(
        f"{p['name']}: speed per value"
        + (f" (importance {100 * share:.0f}%)" if share is not None else ""),
        fontsize=9,
    )
    ax.grid(True, axis="y", alpha=0.3)


def _parallel(ax: Any, report: Mapping[str, Any]) -> None:
    top = report["top"]
    names = list(top["order"])
    values = {p["name"]: p["values"] for p in report["parameters"]}
    if not top["lines"] or not names:
        ax.axis("off")
        ax.text(0.5, 0.5, "no measured configuration yet", ha="center", transform=ax.transAxes)
        return
    lines = top["rest"] + top["lines"]
    speeds = [ln["gflops"] if ln["gflops"] is not None else 1.0 / ln["median_s"] for ln in lines]
    lo, hi = min(speeds), max(speeds)
    span = hi - lo or 1.0

    def ys(ln: Mapping[str, Any], s: float) -> list[float]:
        out = []
        for n, c in zip(names, ln["codes"], strict=True):
            k = len(values[n])
            out.append(c / (k - 1) if k > 1 else 0.5)
        return [*out, (s - lo) / span]

    xs = list(range(len(names) + 1))
    for ln, s in zip(top["rest"], speeds, strict=False):
        ax.plot(xs, ys(ln, s), color=REST_COLOUR, alpha=0.35, linewidth=0.7)
    for ln, s in zip(top["lines"], speeds[len(top["rest"]) :], strict=True):
        ax.plot(xs, ys(ln, s), color=TOP_COLOUR, alpha=0.9, linewidth=1.4)
    for x, n in enumerate(names):
        ax.axvline(x, color="#495057", linewidth=0.6)
        k = len(values[n])
        for c, v in enumerate(values[n]):
            ax.text(
                x + 0.04,
                c / (k - 1) if k > 1 else 0.5,
                v["label"],
                fontsize=6,
                va="center",
                color="#343a40",
            )
    ax.axvline(len(names), color="#495057", linewidth=0.6)
    unit = "GFLOP/s" if top["lines"][0]["gflops"] is not None else "1/s"
    for frac in (0.0, 0.5, 1.0):
        ax.text(len(names) + 0.04, frac, f"{lo + frac * span:.3g}", fontsize=6, va="center")
    ax.set_xticks(xs, [*names, f"speed ({unit})"], fontsize=7, rotation=30, ha="right")
    ax.set_yticks([])
    ax.set_xlim(-0.2, len(names) + 0.5)
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(
        f"the {top['n']} fastest configurations (orange) against {len(top['rest'])} of the "
        f"other {top['rest_total']} measured (grey)",
        fontsize=9,
    )
