"""What the train loop calls besides training: the stability monitors and the profiler window."""
from __future__ import annotations

from pathlib import Path

from helpers.config import Config
from helpers.run.monitors import Monitors, lr_parameter
from helpers.run.profile import ProfileWindow, analyse, summary_keys
from helpers.record import RecordError


class RunHooks:
    """Two calls per step (`before_step`, `after_row`) and one at the end (`finish`)."""

    def __init__(self, cfg: Config, run_dir: Path, optimizer):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        lr = lr_parameter(optimizer) if cfg.monitor.grad_norm_action == "lower_lr" else None
        self.monitors = Monitors(cfg, self.run_dir, lr)
        self.window = ProfileWindow(cfg, self.run_dir)

    def before_step(self, step: int) -> None:
        """Before the step is timed: opens the profiler window on its first step."""
        self.window.before_step(step)

    def after_row(self, row: dict) -> str | None:
        """After the row is built (timing done): monitors, then the profiler's step. Returns a stop reason."""
        stop = self.monitors.on_row(row)
        self.window.after_step(row["step"])
        return stop

    def finish(self, rows: list[dict]) -> dict:
        """Close the profiler, write its analysis, and return the keys to add to summary.json."""
        self.window.close()
        extra = self.monitors.summary(rows)
        if self.window.window and self.window.export_s is not None:
            try:
                extra.update(summary_keys(analyse(self.run_dir, rows, self.cfg, self.window)))
            except RecordError as exc:
                extra["profile_error"] = str(exc)
        return extra
