"""A run's summary.json at its end (ok, nan, stopped or failed): its steady-window statistics, MFU against the peaks
measured at its start, the fixed cost of its start-up phases and what its hooks and start-up added."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from helpers.config import Config
from helpers.record import RecordWriter, memory_source
from helpers.run.build import Built
from helpers.run.metrics import summarize
from helpers.run.peaks import hardware_peak, matmul_shapes, peak_flops_info, peak_summary
from helpers.run.profile import window_steps
from helpers.run.startup import FixedCost, process_start


@dataclass(frozen=True)
class Peaks:
    """The FLOP/s the MFU figures divide by (measured at the run's start): the achievable matmul peak and the
    CPU's hardware peak (None where none is derived). remeasure: measures the matmul peak again now and returns
    (FLOP/s, the summary keys naming it); called when the run beat the cached peak (MFU above 100%)."""
    matmul: float
    hardware: float | None
    remeasure: Callable[[], tuple[float, dict]] | None = None


def measure_peaks(cfg: Config, vocab: int) -> tuple[Peaks, dict]:
    """Both peaks a run's MFU divides by, taken at its start: the model's own matmul shapes at the faster of its
    dtypes (under AMP some matmuls stay fp32: the fp32 cells, the loss), and the CPU's arithmetic; with the summary
    keys that name them (when, under what load)."""
    dtypes = ["fp32"] if cfg.amp_level == "O0" else [cfg.amp_dtype, "fp32"]
    shapes = matmul_shapes(cfg, vocab)
    infos = {d: peak_flops_info(cfg.device_target, d, cfg.threads, shapes) for d in dtypes}
    dtype = max(dtypes, key=lambda d: infos[d]["flops"])
    hardware = max((hardware_peak(d, cfg.device_target) for d in dtypes), key=lambda h: (h or {}).get("flops") or 0.0)

    def remeasure() -> tuple[float, dict]:
        info = peak_flops_info(cfg.device_target, dtype, cfg.threads, shapes, refresh=True)
        return info["flops"], peak_summary(info, hardware)
    return (Peaks(infos[dtype]["flops"], (hardware or {}).get("flops"), remeasure),
            peak_summary(infos[dtype], hardware))


def write_final_summary(cfg: Config, writer: RecordWriter, status: dict, start_step: int, built: Built | None,
                        peaks: Peaks | None, fixed_cost: FixedCost, extra: dict) -> None:
    """Flush the rows and write summary.json: `status` (status, status_reason, started_at, …), the statistics of the
    rows from `start_step` on (read back from metrics.csv, once), `extra` (kernels, peaks, AMP audit) and the hooks'
    keys. built: None when the run failed before its model was built (no hooks, FLOPs or parameter count then);
    peaks: None for a failed run (no MFU)."""
    rows = writer.columns()
    if built is not None:
        extra = {**extra, **built.hooks.finish(rows)}
    peak = peaks.matmul if peaks is not None else None

    def stats_over(peak: float | None) -> dict:
        return summarize(rows, start_step, cfg.steady_after,
                         built.flops_per_token if built is not None else 0.0, peak, window_steps(cfg),
                         memory_source(cfg.device_target), peaks.hardware if peak else None)
    stats = stats_over(peak)
    if (stats.get("mfu") or 0.0) > 1.0 and peaks.remeasure is not None:
        # the run did more matmul work a second than the cached peak: that peak was measured low (under load)
        again, keys, read = *peaks.remeasure(), stats["mfu"]
        if again > peak:
            stats, extra = stats_over(again), {**extra, **keys}
        extra = {**extra, "peak_flops_remeasured": f"MFU read {100 * read:.1f}% of the peak "
                                                   f"of {peak / 1e9:.1f} GFLOP/s, so it was measured again after "
                                                   f"the run: {again / 1e9:.1f} GFLOP/s"}
    if built is not None and built.device_memory is not None:  # the allocator's own totals, next to the peak
        stats.update(built.device_memory.stats())
    first = np.flatnonzero(rows["step"] == start_step)
    first_ms = float(rows["step_time_ms"][first[0]]) if first.size else None
    summary = {**status, **stats, **extra, "n_params": built.n_params if built is not None else None,
               "fixed_cost_s": fixed_cost.summary(first_ms, stats.get("step_time_ms")),
               "process_start": process_start(),
               "tokens_per_step": cfg.tokens_per_step,
               # one process: no collective in the step; data-parallel runs get it measured by rankmerge
               "comm_step_share": 0.0 if cfg.parallel.data_parallel == 1 else None,
               "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    summary.pop("pid", None)
    writer.write_summary(summary)
