"""Imported by the profiler's forkserver only (parser_processes.PRELOAD): each child it starts forks its own
children, as it has no other thread (a forkserver grandchild is sent the parsed timeline pickled: ~1.1 s a hook)."""
from __future__ import annotations

import multiprocessing
from multiprocessing import util


class _Token:
    """Kept alive here: multiprocessing's after-fork registry holds its objects weakly."""


def _fork_own_children(_token: _Token) -> None:
    multiprocessing.set_start_method("fork", force=True)


_TOKEN = _Token()
util.register_after_fork(_TOKEN, _fork_own_children)
