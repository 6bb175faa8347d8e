"""Data-parallel runs through MindSpore's own launcher, msrun: the port, the exact command, following rank 0.

`train_data_parallel` starts `msrun --worker_num=N ... helpers/spawn/dp_worker.py`, relays rank 0's progress lines
from its msrun log, waits, then merges the ranks' figures into the run record (`rankmerge`).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from helpers import config as config_mod
from helpers.config import Config, ConfigError
from helpers.paths import REPO_ROOT, absolute
from helpers.wire import decode_row

WORKER = "helpers/spawn/dp_worker.py"  # relative: msrun runs in the repository root
LOG_DIR = "msrun_logs"


def free_port() -> int:
    """A TCP port that is free on this host now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def check_port(port: int) -> None:
    """Raise a one-line ConfigError if `port` cannot serve as msrun's master port on this host."""
    if not 1024 <= port <= 65535:
        raise ConfigError(f"parallel.master_port={port} is outside msrun's range 1024-65535; "
                          f"use parallel.master_port=0 to pick a free port")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            raise ConfigError(f"parallel.master_port={port} is already in use on this host; choose another "
                              f"port or parallel.master_port=0 to pick a free one") from None


def msrun_executable() -> str:
    """The msrun next to this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("msrun")
    found = str(beside) if beside.is_file() else shutil.which("msrun")
    if not found:
        raise ConfigError("msrun was not found next to this Python or on PATH; install mindspore in this "
                          "environment (it ships msrun)")
    return found


def msrun_command(config_path: str | Path | None, run_dir: str | Path, workers_per_node: int, port: int,
                  nodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
                  msrun: str = "msrun", worker_args: list[str] | None = None) -> list[str]:
    """The msrun command line for one node of a data-parallel run (run it on every node, node_rank 0..nodes-1).
    worker_args: the worker's arguments instead of `--config config_path --out run_dir` (a paired round)."""
    args = worker_args if worker_args is not None else ["--config", str(config_path), "--out", str(run_dir)]
    return [msrun, f"--worker_num={workers_per_node * nodes}", f"--local_worker_num={workers_per_node}",
            f"--master_addr={master_addr}", f"--master_port={port}", f"--node_rank={node_rank}",
            f"--log_dir={Path(run_dir) / LOG_DIR}", "--join=True", str(WORKER), *args]


def _check_paths(cfg: Config, run_dir: Path) -> None:
    if cfg.parallel.comm_profile_steps and any(c in str(run_dir.resolve()) for c in "=,"):
        raise ConfigError(f"run directory {str(run_dir)!r} contains '=' or ',', which MindSpore's profiler "
                          f"rejects; choose another --out or parallel.comm_profile_steps=0")


# MindSpore's cluster retries (node registration, topology checks) wait a random 3-5 s between tries by default.
# On one host the scheduler is up within a second: measured here, a 2-worker msrun that only imports and init()s
# took 14-16 s by default and 9.2-9.6 s with these bounds (s). The caller's own values win.
LOCAL_RETRY_S = {"MS_RETRY_INTERVAL_LOWER": "0", "MS_RETRY_INTERVAL_UPPER": "1"}


def _msrun_env() -> dict:
    """msrun starts workers as `python script`, found on PATH: put this interpreter's folder first; short
    cluster retry intervals (LOCAL_RETRY_S) unless the caller set them."""
    from helpers.spawn.runner import child_env
    env = child_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for key, value in LOCAL_RETRY_S.items():
        env.setdefault(key, value)
    return env


class _LogFollower:
    """Reads whole new lines of a growing text file."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""

    def lines(self) -> list[str]:
        if not self.path.is_file():
            return []
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            fh.seek(self.offset)
            text = self.partial + fh.read()
            self.offset = fh.tell()
        *done, self.partial = text.split("\n")
        return done


def _relay(lines: list[str], progress, total: int) -> None:
    """Rank 0's step rows (`wire.StepRow`) among its log lines, to `progress(row dict, total)`."""
    for line in lines:
        row = decode_row(line)
        if progress and row is not None:
            progress(asdict(row), total)


def pick_port(cfg: Config) -> int:
    """cfg.parallel.master_port checked (pinned), or a free one (0); before anything starts."""
    port = cfg.parallel.master_port
    if port:
        check_port(port)
        return port
    return free_port()


def follow_msrun(cmd: list[str], run_dir: Path, on_lines: Callable[[list[str]], None]) -> int:
    """Run an msrun command in the repository (output to run_dir/msrun.log), handing rank 0's new log lines to
    `on_lines` every 0.5 s until it exits; returns msrun's exit code."""
    follower = _LogFollower(run_dir / LOG_DIR / "worker_0.log")
    with open(run_dir / "msrun.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_msrun_env(), cwd=REPO_ROOT)
        while proc.poll() is None:
            on_lines(follower.lines())
            time.sleep(0.5)
    on_lines(follower.lines())
    return proc.returncode


def train_data_parallel(cfg: Config, run_dir: str | Path,
                        progress: Callable[[dict, int], None] | None = None) -> int:
    """Train `cfg` on cfg.parallel.data_parallel local processes via msrun; returns msrun's exit code.

    The port is checked (pinned) or picked (0) before anything starts; the merged record is in run_dir.
    """
    from helpers.spawn.rankmerge import merge_ranks
    run_dir = absolute(run_dir)  # msrun runs in the repository: paths must mean what the caller meant
    cfg = config_mod.absolute_paths(cfg)
    _check_paths(cfg, run_dir)
    port = pick_port(cfg)
    ranks = run_dir / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    for stale in ranks.glob("rank_*.json"):
        stale.unlink()
    request = ranks / "request.yaml"
    request.write_text(config_mod.dump(cfg), encoding="utf-8")
    cmd = msrun_command(request, run_dir, cfg.parallel.data_parallel, port, msrun=msrun_executable())
    code = follow_msrun(cmd, run_dir, lambda lines: _relay(lines, progress, cfg.steps))
    merge_ranks(run_dir)
    return code
