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


def measure_peak_flops(dtype: str = "fp32", n: int = 1024, repeats: int = 8) -> float:
    """Matmul FLOP/s on the current MindSpore device: the best of `repeats` timed n×n×n matmuls (a peak:
    other load on a shared machine can only slow a repeat down, so the median would understate it)."""
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor, ops

    ms_dtype = {"fp32": ms.float32, "fp16": ms.float16}[dtype]
    a = Tensor(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)).astype(ms_dtype)
    b = Tensor(np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)).astype(ms_dtype)
    matmul = ops.MatMul()
    matmul(a, b).asnumpy()  # warm-up: kernel selection and allocation
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, b).asnumpy()
        rates.append(2.0 * n ** 3 / (time.perf_counter() - t0))
    return float(max(rates))


def peak_flops(device_target: str = "CPU", dtype: str = "fp32", threads: int = 0, refresh: bool = False) -> float:
    """Measured matmul peak (FLOP/s) for this machine/device/dtype/threads, cached in ~/.cache."""
    path, key = _cache_file(), _machine_key(device_target, dtype, threads)
    cache = {}
    if path.is_file():
        try:
            cache = json.loads(path.read_text())
        except ValueError:
            cache = {}
    if key in cache and not refresh:
        return float(cache[key]["flops"])
    flops = measure_peak_flops(dtype)
    cache[key] = {"flops": flops, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    from helpers.record import atomic_write_json
    atomic_write_json(path, cache)
    return flops
