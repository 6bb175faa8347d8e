"""Where the processes that MindSpore's profiler parses its output in come from.

When a profiler window closes, MindSpore parses its output in a child Process beside a Manager, and each parser's
post-hooks in grandchildren, all started the default way (a fork, on Linux). A fork of a training process, whose
runtime and data-pipeline threads may hold a lock at that instant, can leave the child stuck before its first line
and the run waiting on it for ever (one CI run: killed after 300 s). So those children come from a forkserver
instead: a fresh interpreter, started while the run compiles, that imports MindSpore's parsers once
(forkserver_preload.py makes their own children forks again).
"""
from __future__ import annotations

import multiprocessing
from contextlib import contextmanager
from multiprocessing import forkserver

PRELOAD = ["mindspore.profiler.platform.cpu_profiler", "mindspore.profiler.analysis.task_manager",
           "helpers.run.forkserver_preload"]


def start() -> None:
    """Start this process's forkserver (~1.4 s of CPU importing PRELOAD, beside the caller, which goes on)."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()


@contextmanager
def unforked():
    """Processes that multiprocessing starts inside this block come from the forkserver, not a fork of this one."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(before, force=True)
