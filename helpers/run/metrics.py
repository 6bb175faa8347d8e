"""Per-step measurements and the run summary computed from them (steady window, medians, MFU)."""
from __future__ import annotations

import math
import resource
import sys

import numpy as np
import psutil

from helpers.record import DEVICE, RSS, MetricColumns, data_wait_share, steady_mask

_PROCESS = psutil.Process()


def rss_bytes() -> int:
    """Resident set size of this process now (bytes); MindSpore's memory stats are zeros on CPU."""
    return int(_PROCESS.memory_info().rss)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (bytes). On Linux the memory map's own high-water mark
    (VmHWM): ru_maxrss survives exec, so a run started from a large process (a test runner, a notebook kernel)
    read its parent's peak as its own."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class Ema:
    """Exponential moving average that starts at the first value (no zero bias), or goes on from `value`."""

    def __init__(self, alpha: float = 0.1, value: float | None = None):
        self.alpha, self.value = alpha, value

    def update(self, x: float) -> float:
        if not math.isfinite(x):
            return self.value if self.value is not None else x
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        return self.value


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def mfu_error(mfu: float | None, mfu_hardware: float | None) -> str | None:
    """One line when an MFU is above 100% of its peak (impossible: that peak was measured low, e.g. under load, or
    the hardware arithmetic is wrong), else None."""
    over = [f"{100 * value:.1f}% of the {name} peak" for name, value in (("achievable matmul", mfu),
                                                                         ("hardware", mfu_hardware))
            if value is not None and value > 1.0]
    return f"MFU above 100% ({', '.join(over)}): that peak is too low to divide by" if over else None


def summarize(rows: MetricColumns, start_step: int, warmup_steps: int, flops_per_token: float,
              peak_flops: float | None, profiled: tuple[int, int] | list[int] | None = None,
              memory_source: str = RSS, hardware_peak_flops: float | None = None) -> dict:
    """Speed, memory and loss figures over the steady window of the steps this process ran.

    rows: the record's rows as columns (a resume's kept rows, then this process's);
    start_step: first step this process ran (1, or the step after a resumed checkpoint);
    profiled: (first, last) step of the profiler window, left out of every speed figure (`steady_mask`).

    step_time_ms: median ms/step; tokens_per_s: tokens of the window / its summed step time;
    data_wait_share: blocked-on-data time / step time (`record.data_wait_share`: None in sink mode);
    mfu: flops_per_token·tokens_per_s / peak_flops (the achievable matmul peak, helpers/run/peaks.py);
    mfu_hardware: the same over hardware_peak_flops (the CPU's cores × clock × lanes × FMA);
    mfu_error: a line when either is above 1;
    speed_steps: how many steps those figures are over;
    peak_memory_bytes: the peak the memory gate judges, per `memory_source` (process RSS on CPU; on a device the
    largest per-step device_memory_bytes); peak_rss_bytes and peak_device_memory_bytes keep both.
    """
    step = rows["step"]
    steady = steady_mask(step, start_step + warmup_steps, profiled)
    times = _finite(rows["step_time_ms"][steady])
    tokens = float(rows["tokens"][steady].sum())
    total_ms = float(times.sum()) if times.size else 0.0
    tokens_per_s = tokens / (total_ms / 1000.0) if total_ms > 0 else None
    losses = np.flatnonzero(rows.filled["loss"])
    evals = np.flatnonzero(rows.filled["val_loss"])
    last_eval = evals[-1] if evals.size else None
    grad_norms = _finite(rows["grad_norm"])
    first_row = np.flatnonzero(step == start_step)
    rss_peak = peak_rss_bytes()
    device = _finite(rows["device_memory_bytes"])
    device_peak = int(device.max()) if device.size else None
    mfu, mfu_hw = (flops_per_token * tokens_per_s / peak if (tokens_per_s and peak) else None
                   for peak in (peak_flops, hardware_peak_flops))
    steady_steps = step[steady]
    return {
        "steps": int(step[-1]) if step.size else 0,
        "tokens_per_s": tokens_per_s,
        "step_time_ms": float(np.median(times)) if times.size else None,
        "step_time_ms_p10": float(np.percentile(times, 10)) if times.size else None,
        "step_time_ms_p90": float(np.percentile(times, 90)) if times.size else None,
        "warmup_steps": warmup_steps,
        "steady_window": [int(steady_steps[0]), int(steady_steps[-1])] if steady_steps.size else None,
        "speed_steps": int(steady_steps.size),
        "profiled_steps": list(profiled) if profiled else None,
        "compile_s": float(rows["step_time_ms"][first_row[0]]) / 1000.0 if first_row.size else None,
        "data_wait_share": data_wait_share(rows["step_time_ms"][steady], rows["data_wait_ms"][steady]),
        "peak_memory_bytes": device_peak if memory_source == DEVICE else rss_peak,
        "memory_source": memory_source,
        "peak_rss_bytes": rss_peak,
        "peak_device_memory_bytes": device_peak,
        "mfu": mfu,
        "peak_flops": peak_flops,
        "mfu_hardware": mfu_hw,
        "peak_flops_hardware": hardware_peak_flops,
        "mfu_error": mfu_error(mfu, mfu_hw),
        "flops_per_token": flops_per_token,
        "loss_first": float(rows["loss"][losses[0]]) if losses.size else None,
        "loss_last": float(rows["loss"][losses[-1]]) if losses.size else None,
        "val_loss": float(rows["val_loss"][last_eval]) if last_eval is not None else None,
        "val_ppl": (float(rows["val_ppl"][last_eval]) if last_eval is not None and rows.filled["val_ppl"][last_eval]
                    else None),
        "grad_norm_max": float(grad_norms.max()) if grad_norms.size else None,
    }
