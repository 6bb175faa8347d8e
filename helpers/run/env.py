"""What ran the run: versions, CPU, device, threads; and the measured matmul peak (FLOP/s), cached per machine."""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path

from helpers.paths import REPO_ROOT

PACKAGES = ["mindspore", "numpy", "tokenizers", "jupyterlab", "ipywidgets", "papermill", "matplotlib"]


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (or platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device_target: str = "CPU", threads: int = 0) -> dict:
    """Versions, host and device facts for env.json."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import psutil
    return {
        "python": platform.python_version(),
        "packages": versions,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "device_target": device_target,
        "threads": threads or "default",
        "git_commit": _git_commit(),
        "memory_source": "process RSS (MindSpore reports zeros on CPU)" if device_target == "CPU"
        else "device memory from MindSpore",
    }


def _cache_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "mindspore-workbook" / "peak_flops.json"


def _machine_key(device_target: str, dtype: str, threads: int) -> str:
    try:
        ms_version = metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        ms_version = "?"
    return "|".join([socket.gethostname(), cpu_model(), str(os.cpu_count()), device_target, dtype,
                     str(threads or "default"), ms_version])


PEAK_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # config name → MindSpore dtype name


def peak_dtype(dtype: str):
    """The MindSpore dtype a peak for `dtype` (fp32 or any amp_dtype: fp16, bf16) is measured in."""
    import mindspore as ms
    if dtype not in PEAK_DTYPES:
        raise ValueError(f"no matmul peak for dtype {dtype!r}; choose one of {', '.join(PEAK_DTYPES)}")
    return getattr(ms, PEAK_DTYPES[dtype])


def measure_peak_flops(dtype: str = "fp32", n: int = 1024, repeats: int = 8) -> float:
    """Matmul FLOP/s on the current MindSpore device: the best of `repeats` timed n×n×n matmuls (a peak:
    other load on a shared machine can only slow a repeat down, so the median would understate it)."""
    import numpy as np
    from mindspore import Tensor, ops

    ms_dtype = peak_dtype(dtype)
    a = Tensor(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)).astype(ms_dtype)
    b = Tensor(np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)).astype(ms_dtype)
    matmul = ops.MatMul()
    try:
        matmul(a, b).asnumpy()  # warm-up: kernel selection and allocation
    except TypeError as exc:  # the device has no MatMul kernel for this dtype (bf16 on CPU)
        raise RuntimeError(f"no {dtype} matmul on this device, so no {dtype} peak to measure "
                           f"({str(exc).splitlines()[0]}); measure it on a device that runs {dtype}") from None
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, b).asnumpy()
        rates.append(2.0 * n ** 3 / (time.perf_counter() - t0))
    return float(max(rates))


# When a cached peak is measured again (the peak is what every MFU is divided by, so a low one inflates MFU):
PEAK_STALE_S = 24 * 3600.0  # older than a day: co-tenants, governor and background load change over hours
PEAK_LOADED_PER_CORE = 0.75  # 1-min load average per core above which a measurement counts as "under load"
#                              (a quiet one here read 1.0–1.4 on 2 cores, the measuring process included)


def load_average() -> float:
    """The 1-minute load average (runnable processes, averaged; compare with os.cpu_count())."""
    return os.getloadavg()[0]


def _loaded(load: float, cores: int) -> bool:
    return load > PEAK_LOADED_PER_CORE * cores


def _age_s(measured_at: str) -> float:
    try:
        return time.time() - time.mktime(time.strptime(measured_at, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError):
        return float("inf")  # unreadable: as good as stale


def _why_remeasure(entry: dict | None, cores: int) -> str:
    """Why a cached peak cannot be used ("" when it can)."""
    if entry is None:
        return "no peak cached for this machine, device, dtype and threads"
    if "load_avg_1m" not in entry:
        return f"the cached peak of {entry.get('measured_at')} has no load average recorded"
    if _age_s(entry.get("measured_at")) > PEAK_STALE_S:
        return f"the cached peak of {entry.get('measured_at')} is older than {PEAK_STALE_S / 3600:.0f} h"
    if _loaded(entry["load_avg_1m"], cores):
        return (f"the cached peak of {entry['measured_at']} was measured at load {entry['load_avg_1m']:.2f}, above "
                f"{PEAK_LOADED_PER_CORE * cores:.2f} for {cores} cores")
    return ""


def peak_flops_info(device_target: str = "CPU", dtype: str = "fp32", threads: int = 0,
                    refresh: bool = False) -> dict:
    """The measured matmul peak behind MFU and where it came from, cached in ~/.cache per machine/device/dtype/threads.

    Returns {flops (FLOP/s), measured_at (local time, ISO), load_avg_1m (the higher 1-minute load average of
    before and after the measurement), cores, loaded (load_avg_1m > PEAK_LOADED_PER_CORE × cores), source (one line:
    cached, or measured now and why)}. A cached peak is measured again when it is stale (older than PEAK_STALE_S),
    was measured under load, or `refresh`. A new measurement under load replaces a cached one measured under load
    only if it is higher: load can only slow a matmul down, so the higher one is nearer the peak.
    """
    path, key = _cache_file(), _machine_key(device_target, dtype, threads)
    cores = os.cpu_count() or 1
    cache = {}
    if path.is_file():
        try:
            cache = json.loads(path.read_text())
        except ValueError:
            cache = {}
    old = cache.get(key)
    why = "refresh requested" if refresh else _why_remeasure(old, cores)
    if not why:
        return {**old, "cores": old.get("cores", cores), "loaded": False,
                "source": f"cached: measured {old['measured_at']} at load {old['load_avg_1m']:.2f} on {cores} cores"}
    before = load_average()
    flops = measure_peak_flops(dtype)
    load = round(max(before, load_average()), 2)
    new = {"flops": flops, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_avg_1m": load, "cores": cores,
           "loaded": _loaded(load, cores)}
    note = f"measured now at load {load:.2f} on {cores} cores ({why})"
    old_loaded = bool(old) and "load_avg_1m" in old and _loaded(old["load_avg_1m"], cores)
    if new["loaded"] and old_loaded and not refresh and _age_s(old["measured_at"]) <= PEAK_STALE_S \
            and old["flops"] > flops:
        new = {**old, "cores": cores, "loaded": True}
        note = (f"cached: measured {old['measured_at']} at load {old['load_avg_1m']:.2f} on {cores} cores; measured "
                f"again now at load {load:.2f}, it read lower ({flops / 1e9:.1f} GFLOP/s), so the higher one stays")
    else:
        cache[key] = new
        path.parent.mkdir(parents=True, exist_ok=True)
        from helpers.record import atomic_write_json
        atomic_write_json(path, cache)
    return {**new, "source": note}


def peak_flops(device_target: str = "CPU", dtype: str = "fp32", threads: int = 0, refresh: bool = False) -> float:
    """Measured matmul peak (FLOP/s) for this machine/device/dtype/threads (see `peak_flops_info`)."""
    return float(peak_flops_info(device_target, dtype, threads, refresh)["flops"])


def peak_summary(info: dict) -> dict:
    """The summary.json keys saying which peak a run's MFU was divided by."""
    return {"peak_flops_measured_at": info.get("measured_at"), "peak_flops_load_avg": info.get("load_avg_1m"),
            "peak_flops_loaded": info.get("loaded"), "peak_flops_source": info.get("source")}
