"""Ctrl-C (SIGINT) for a training process: the run stops at the end of its current step, saved and resumable.

MindSpore 2.10 installs its own SIGINT handler around every graph run and answers Ctrl-C by sending the process
SIGTERM (exit 143, nothing flushed). So `catch()` blocks SIGINT before MindSpore starts a thread (every thread it
makes inherits the mask, so its handler never runs) and a thread of ours takes the signal with sigwait:
- while steps run (`steps()`), the first Ctrl-C only asks the loop to stop after the step it is in (`requested`);
- outside them (reading data, compiling), or at a second Ctrl-C, KeyboardInterrupt is raised in the main thread.
Forked children (data workers) get SIGINT unblocked again, so they end as they would without us.
"""
from __future__ import annotations

import _thread
import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a process ended by Ctrl-C

_state = {"caught": False, "in_steps": False, "count": 0}
_asked = threading.Event()


def _unblock() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _watch() -> None:
    while True:
        signal.sigwait({signal.SIGINT})
        _state["count"] += 1
        _asked.set()
        if not _state["in_steps"] or _state["count"] > 1:
            _thread.interrupt_main(signal.SIGINT)


def catch() -> None:
    """From now on this process answers Ctrl-C as the module docstring says (once per process; call it before
    MindSpore runs anything, in the main thread)."""
    if _state["caught"]:
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what interrupt_main raises: KeyboardInterrupt
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    os.register_at_fork(after_in_child=_unblock)
    threading.Thread(target=_watch, name="ctrl-c", daemon=True).start()
    _state["caught"] = True


def requested() -> bool:
    """Whether Ctrl-C came (the step loop ends the run after the current step)."""
    return _asked.is_set()


@contextmanager
def steps() -> Iterator[None]:
    """While inside, a first Ctrl-C only sets `requested` (the loop stops at the step's end); a second one, or one
    outside, raises KeyboardInterrupt at once."""
    _state["in_steps"] = True
    try:
        yield
    finally:
        _state["in_steps"] = False


def stop_child(pid: int, lines, on_line, wait_s: float = 60.0) -> None:
    """The caller of a training child was interrupted (Ctrl-C in a notebook kernel): pass it on as SIGINT, so the
    child saves its step and ends as above, and keep reading its stdout `lines` into `on_line` until it closes or
    `wait_s` seconds pass (then, or at another Ctrl-C, the child is killed)."""
    import select
    import time
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            if not select.select([lines], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            line = lines.readline()
            if not line:
                return
            on_line(line)
    except KeyboardInterrupt:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
