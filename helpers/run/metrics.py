"""Per-step measurements and the run summary computed from them (steady window, medians, MFU)."""
from __future__ import annotations

import math
import resource
import sys

import numpy as np
import psutil

from helpers.record import DEVICE, RSS

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
    """Exponential moving average that starts at the first value (no zero bias)."""

    def __init__(self, alpha: float = 0.1):
        self.alpha, self.value = alpha, None

    def update(self, x: float) -> float:
        if not math.isfinite(x):
            return self.value if self.value is not None else x
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        return self.value


def _finite(values) -> np.ndarray:
    arr = np.array([v for v in values if v is not None], dtype=np.float64)
    return arr[np.isfinite(arr)]


def steady_rows(rows: list[dict], start_step: int, warmup_steps: int,
                profiled: tuple[int, int] | list[int] | None = None) -> list[dict]:
    """Rows that measure speed: from `start_step + warmup_steps` on (the process's compile and warm-up steps
    left out), without the steps inside the profiler window `profiled` = (first, last) step, which carry the
    profiler's own cost."""
    first, last = profiled or (0, -1)
    return [r for r in rows if r["step"] >= start_step + warmup_steps and not first <= r["step"] <= last]


def mfu_error(mfu: float | None, mfu_hardware: float | None) -> str | None:
    """One line when an MFU is above 100% of its peak (impossible: that peak was measured low, e.g. under load, or
    the hardware arithmetic is wrong), else None."""
    over = [f"{100 * value:.1f}% of the {name} peak" for name, value in (("achievable matmul", mfu),
                                                                         ("hardware", mfu_hardware))
            if value is not None and value > 1.0]
    return f"MFU above 100% ({', '.join(over)}): that peak is too low to divide by" if over else None


def summarize(rows: list[dict], start_step: int, warmup_steps: int, flops_per_token: float,
              peak_flops: float | None, profiled: tuple[int, int] | list[int] | None = None,
              memory_source: str = RSS, hardware_peak_flops: float | None = None) -> dict:
    """Speed, memory and loss figures over the steady window of the steps this process ran.

    start_step: first step this process ran (1, or the step after a resumed checkpoint);
    profiled: (first, last) step of the profiler window, left out of every speed figure (`steady_rows`).

    step_time_ms: median ms/step; tokens_per_s: tokens of the window / its summed step time;
    data_wait_share: blocked-on-data time / step time; mfu: flops_per_token·tokens_per_s / peak_flops (the
    achievable matmul peak, helpers/run/peaks.py); mfu_hardware: the same over hardware_peak_flops (the CPU's
    cores × clock × lanes × FMA); mfu_error: a line when either is above 1;
    speed_steps: how many steps those figures are over;
    peak_memory_bytes: the peak the memory gate judges, per `memory_source` (process RSS on CPU; on a device the
    largest per-step device_memory_bytes); peak_rss_bytes and peak_device_memory_bytes keep both.
    """
    steady = steady_rows(rows, start_step, warmup_steps, profiled)
    times = _finite(r["step_time_ms"] for r in steady)
    waits = _finite(r["data_wait_ms"] for r in steady)
    tokens = sum(r["tokens"] for r in steady)
    total_ms = float(times.sum()) if times.size else 0.0
    tokens_per_s = tokens / (total_ms / 1000.0) if total_ms > 0 else None
    losses = [r["loss"] for r in rows if r.get("loss") is not None]
    evals = [r for r in rows if r.get("val_loss") is not None]
    grad_norms = _finite(r.get("grad_norm") for r in rows)
    first_row = next((r for r in rows if r["step"] == start_step), {})
    rss_peak = peak_rss_bytes()
    device = _finite(r.get("device_memory_bytes") for r in rows)
    device_peak = int(device.max()) if device.size else None
    mfu, mfu_hw = (flops_per_token * tokens_per_s / peak if (tokens_per_s and peak) else None
                   for peak in (peak_flops, hardware_peak_flops))
    return {
        "steps": rows[-1]["step"] if rows else 0,
        "tokens_per_s": tokens_per_s,
        "step_time_ms": float(np.median(times)) if times.size else None,
        "step_time_ms_p10": float(np.percentile(times, 10)) if times.size else None,
        "step_time_ms_p90": float(np.percentile(times, 90)) if times.size else None,
        "warmup_steps": warmup_steps,
        "steady_window": [steady[0]["step"], steady[-1]["step"]] if steady else None,
        "speed_steps": len(steady),
        "profiled_steps": list(profiled) if profiled else None,
        "compile_s": first_row["step_time_ms"] / 1000.0 if first_row else None,
        "data_wait_share": float(waits.sum()) / total_ms if total_ms > 0 else None,
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
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "val_loss": evals[-1]["val_loss"] if evals else None,
        "val_ppl": evals[-1]["val_ppl"] if evals else None,
        "grad_norm_max": float(grad_norms.max()) if grad_norms.size else None,
    }
