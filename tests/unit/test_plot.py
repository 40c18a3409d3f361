"""The plot's title stays on the figure, however long the problem's arguments are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tunefleet.cli import plot


def test_a_long_title_is_wrapped_inside_the_figure(tmp_path: Path, monkeypatch: Any) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept: list[Any] = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure to measure it
    title = "run 7: feinsum " + " ".join(f"--size axis{i}={100 + i}" for i in range(20))
    title += " --arg einsum=" + "ifj,fe,fej->ei" * 8
    plot.render(tmp_path / "p.png", title=title, series=[], intervals=[])
    (fig,) = kept
    monkeypatch.undo()
    try:
        (text,) = [t for t in fig.texts if t.get_text() == fig.get_suptitle()]
        box = text.get_window_extent(fig.canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width
        assert "".join(text.get_text().split()) == "".join(title.split())  # nothing lost
    finally:
        plt.close(fig)
