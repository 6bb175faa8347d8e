"""What the train loop calls besides training: each step's learning rate, the stability monitors and the profiler
window."""
from __future__ import annotations

from pathlib import Path

from helpers.config import Config
from helpers.run.monitors import Monitors
from helpers.run.profile import ProfileWindow, analyse, summary_keys
from helpers.record import MetricColumns, RecordError
from helpers.run.schedule import LearningRates


class RunHooks:
    """Two calls per step (`before_step`, `after_row`) and one at the end (`finish`)."""

    def __init__(self, cfg: Config, run_dir: Path, optimizer):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.lrs = LearningRates(cfg, optimizer)
        self.monitors = Monitors(cfg, self.run_dir)
        self.window = ProfileWindow(cfg, self.run_dir)

    def before_step(self, step: int) -> None:
        """Before the step is timed: sets its learning rate (scaled by the monitors' lower_lr), opens the profiler
        window on its first step."""
        self.set_lr(step)
        self.window.before_step(step)

    def set_lr(self, step: int) -> None:
        """The optimizer's learning rate for 1-based `step` (a measurement-only step past `steps` too)."""
        self.lrs.set(step, self.monitors.lr_scale)

    def after_row(self, row: dict) -> str | None:
        """After the row is built (timing done): monitors, then the profiler's step. Returns a stop reason."""
        stop = self.monitors.on_row(row)
        self.window.after_step(row["step"])
        return stop

    def finish(self, rows: MetricColumns) -> dict:
        """Close the profiler, write its analysis from the record's `rows`, and return the keys to add to
        summary.json."""
        self.window.close()
        extra = self.monitors.summary(rows)
        if self.window.window and self.window.export_s is not None:
            try:
                extra.update(summary_keys(analyse(self.run_dir, rows, self.cfg, self.window)))
            except RecordError as exc:
                extra["profile_error"] = str(exc)
        return extra
