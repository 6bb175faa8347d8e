"""A child process that must not outlive its parent: a frozen arm or a cluster's server left orphaned would wait
forever (or hold its port)."""
from __future__ import annotations

import os
import signal


def die_with_parent(parent: int | None = None) -> None:
    """This process gets SIGKILL when its parent exits (Linux PR_SET_PDEATHSIG; elsewhere nothing is set). If the
    parent is gone already, it exits now: its parent is no longer `parent` (the pid the forking process had), or,
    without one, init has adopted it."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if (os.getppid() != parent) if parent is not None else (os.getppid() == 1):
        os._exit(1)
