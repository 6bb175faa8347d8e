"""Which memory a run's figures are, and the device-memory reader.

On CPU MindSpore's allocator counters are always 0 (documented for `ms.runtime.max_memory_allocated`), so a CPU
run's memory is process RSS (psutil; its peak the memory map's VmHWM, metrics.peak_rss_bytes). On GPU and Ascend
the figure that matters is the device allocator's peak: `DeviceMemory` reads `ms.runtime.max_memory_allocated()`
after every step and resets it, so each metrics row holds that step's own peak and the run's peak is their maximum.
Every summary names its source in `memory_source`, and tables label the column from it (both in helpers/record.py,
where a summary's readers reach them).
"""
from __future__ import annotations

DEVICE_LIMIT_FRACTION = 0.9  # the default memory gate: 90% of RAM (CPU) or of the device's memory (GPU/Ascend)


class DeviceMemory:
    """Per-step peak of MindSpore's device allocator (bytes), read through `ms.runtime`.

    `step_peak()` returns the largest allocation total since the previous call and resets the counter; `peak` is
    the largest over the run. On CPU MindSpore returns 0 for both (the API works, the counters are not kept).
    """

    def __init__(self, device_target: str):
        import mindspore as ms
        self.device_target = device_target
        self._runtime = ms.runtime
        self._runtime.reset_max_memory_allocated()
        self.peak = 0

    def step_peak(self) -> int:
        """Device bytes allocated at the step's high point (since the last call); resets the counter."""
        value = int(self._runtime.max_memory_allocated())
        self._runtime.reset_max_memory_allocated()
        self.peak = max(self.peak, value)
        return value

    def stats(self) -> dict:
        """The allocator totals of `ms.runtime.memory_stats()` (bytes) for summary.json: reserved and allocated,
        now and at their maximum since the process started; and the device's total memory (None where MindSpore
        reports none), which the memory-bound diagnosis divides the peak by."""
        stats = self._runtime.memory_stats()
        keys = ("total_reserved_memory", "total_allocated_memory", "max_reserved_memory", "max_allocated_memory")
        out = {f"device_{k}_bytes": int(stats[k]) for k in keys if k in stats}
        out["device_memory_total_bytes"] = device_total_bytes(self.device_target)
        return out


def device_total_bytes(device_target: str, device_id: int = 0) -> int | None:
    """Total memory of the device (bytes) from `ms.hal.get_device_properties`; None on CPU (MindSpore returns no
    properties there). Imports MindSpore: call it inside a training process, not in the notebook kernel."""
    if device_target == "CPU":
        return None
    import mindspore as ms
    props = ms.hal.get_device_properties(device_id, device_target)
    total = getattr(props, "total_memory", None)
    return int(total) if total else None


def default_memory_limit(device_target: str) -> int | None:
    """The memory gate's default (bytes): DEVICE_LIMIT_FRACTION of RAM on CPU, of the device's memory elsewhere.

    The device total is read in a child process so the caller (a notebook kernel) never binds the device; None
    when MindSpore cannot report it (then pass the limit yourself).
    """
    if device_target == "CPU":
        import psutil
        return int(DEVICE_LIMIT_FRACTION * psutil.virtual_memory().total)
    import subprocess
    import sys
    code = f"from helpers.run.memory import device_total_bytes; print(device_total_bytes({device_target!r}))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        total = int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return None
    return int(DEVICE_LIMIT_FRACTION * total)
