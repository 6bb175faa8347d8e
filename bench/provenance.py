"""Where a bench result comes from: the commit (and whether the tree was dirty), the date, the command line, the
machine, and the 1-minute load average before and during the run. One helper for every item (bench.py wraps each
item's run in `Provenance`); LoadSampler is also what items use to record load per phase or per trial."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import threading
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "bench" / "records"  # committed result files (docs/benchmarks.md's table is generated from them)


class LoadSampler:
    """The 1-minute load average every `every_s` seconds in a thread, between start and stop (a context manager)."""

    def __init__(self, every_s: float = 2.0):
        self.every_s, self.values = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.values.append(os.getloadavg()[0])
            self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """min, max, mean and number of the samples (the load now when none was taken)."""
        v = self.values or [os.getloadavg()[0]]
        return {"min": min(v), "max": max(v), "mean": sum(v) / len(v), "samples": len(v)}


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


def git_state() -> dict:
    """The commit measured and whether the tree differed from it: changed or untracked files outside the records
    folder (a record written by an earlier item is not a change to what is measured). dirty_paths: up to 20."""
    try:
        commit = _git("rev-parse", "HEAD").strip()
        changed = [line[3:] for line in _git("status", "--porcelain", "--", ".",
                                             f":(exclude){RECORDS.relative_to(REPO)}").splitlines()]
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return {"commit": None, "commit_short": None, "dirty": None, "dirty_paths": [], "git_error": str(exc)}
    return {"commit": commit, "commit_short": commit[:7], "dirty": bool(changed), "dirty_paths": changed[:20]}


def machine() -> dict:
    """CPU model, logical and physical cores, RAM (bytes), platform and the versions that ran the bench."""
    import psutil
    from helpers.run.env import cpu_model
    from helpers.run.peaks import hardware_peak
    try:
        mindspore = metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        mindspore = None
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "physical_cores": (hardware_peak() or {}).get("cores"),
            "ram_bytes": psutil.virtual_memory().total, "platform": platform.platform(),
            "python": platform.python_version(), "mindspore": mindspore}


class Provenance:
    """Around one item's run: git state, date, command line and machine before it; the load average before and
    sampled every 2 s during it; the wall seconds. `to_dict()` is the record's "provenance"."""

    def __init__(self, argv: list[str], script: str = "bench/bench.py"):
        self.argv, self.script = argv, script

    def __enter__(self):
        self.info = {**git_state(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "command": shlex.join(["python", self.script, *self.argv]), "machine": machine(),
                     "load_1min_before": os.getloadavg()[0]}
        self._t0 = time.perf_counter()
        self._sampler = LoadSampler().__enter__()
        return self

    def __exit__(self, *exc):
        self._sampler.__exit__(*exc)
        self.info.update({"load_1min_during": {**self._sampler.summary(), "values": self._sampler.values},
                          "wall_s": time.perf_counter() - self._t0})

    def to_dict(self) -> dict:
        return dict(self.info)

