"""What ran the run: versions, host, CPU, device, threads, git commit (env.json); the peaks MFU divides by are in
helpers/run/peaks.py."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
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
