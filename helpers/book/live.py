"""Live curves of a round: loss and tokens/s against step for every run or arm, redrawn while the round trains.

The rows are the ones the runner already reads from its children (`helpers/spawn/live.py`). In the round panel the
frames go to an image widget; in a notebook cell (`with live_curves(): wb.run_round(...)`) they replace one display
output in place, so the executed notebook, and with it the HTML report, keeps the last frame as a static copy."""
from __future__ import annotations

import io
import math
import time
from array import array
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
from matplotlib.figure import Figure

from helpers.book.plots import bucketed, draw
from helpers.spawn.live import listen

ROLE_COLORS = {"reference": "#1f77b4", "candidate": "#d62728"}
OTHER_COLOR = "#2ca02c"
KEYS = ("loss", "tokens_per_s")  # what the panels draw against step


class LiveCurves:
    """Collects the points of each label's rows and hands a PNG frame to `show(png_bytes)` at most every
    `min_interval_s` seconds (drawing costs the parent ~0.1 s of CPU the children would otherwise have).
    series: label → key → (steps, values), 16 bytes a point; a long run is drawn `bucketed`."""

    def __init__(self, show: Callable[[bytes], None], title: str = "", min_interval_s: float = 2.0):
        self.show, self.title, self.min_interval_s = show, title, min_interval_s
        self.series: dict[str, dict[str, tuple[array, array]]] = {}
        self.frames = 0
        self._last = -math.inf

    def add(self, label: str, row: dict) -> None:
        """One step row (step, loss, tokens_per_s) of the run or arm `label`; draws when a frame is due."""
        points = self.series.setdefault(label, {key: (array("d"), array("d")) for key in KEYS})
        for key, (steps, values) in points.items():
            value = row.get(key)
            if value is not None and math.isfinite(value):
                steps.append(row["step"])
                values.append(value)
        if time.monotonic() - self._last >= self.min_interval_s:
            self.draw()

    def draw(self) -> None:
        """Render the current curves and show them (the last call leaves the final frame)."""
        self._last = time.monotonic()
        self.show(png(self.figure()))
        self.frames += 1

    def figure(self) -> Figure:
        """Two panels, loss and tokens/s against step; reference arms blue, candidate arms red."""
        fig = Figure(figsize=(10, 3.2), layout="constrained")
        loss_ax, speed_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        for label, points in self.series.items():
            role = next((r for r in ROLE_COLORS if r in label.split()), None)
            style = {"color": ROLE_COLORS.get(role, OTHER_COLOR), "lw": 1.2, "alpha": 0.8, "label": label}
            for ax, key in zip((loss_ax, speed_ax), KEYS):
                steps, values = points[key]
                if values:
                    draw(ax, bucketed(np.array(steps), np.array(values)), **style)
        loss_ax.set(xlabel="step", ylabel="training loss", title=self.title or "loss")
        speed_ax.set(xlabel="step", ylabel="tokens/s", title="throughput (per step, or per block when paired)")
        for ax in (loss_ax, speed_ax):
            ax.grid(alpha=0.3)
        if self.series:
            speed_ax.legend(fontsize=7, loc="lower right")
        else:
            loss_ax.text(0.5, 0.5, "waiting for the first step…", ha="center", transform=loss_ax.transAxes)
        return fig


def png(fig: Figure, dpi: int = 80) -> bytes:
    """A figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


@contextmanager
def live_curves(title: str = "", min_interval_s: float = 2.0) -> Iterator[LiveCurves]:
    """Show the block's rounds as live curves in the cell's output; the final frame stays there."""
    from IPython.display import Image, display
    handle = display(Image(data=png(LiveCurves(lambda _: None, title).figure()), format="png"), display_id=True)
    curves = LiveCurves(lambda data: handle.update(Image(data=data, format="png")), title, min_interval_s)
    with listen(curves.add):
        try:
            yield curves
        finally:
            curves.draw()
