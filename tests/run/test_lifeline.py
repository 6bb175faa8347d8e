"""die_with_parent: a child whose parent is gone before the call exits at once; one whose parent lives goes on.
(Killed with its parent: tests/spawn/test_dp_worker.py, the scheduler's server.)"""
from __future__ import annotations

import os

from helpers.run.lifeline import die_with_parent


def _child_exit(call) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            call()
        finally:
            os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_child_exits_at_once_when_its_parent_is_gone_and_goes_on_when_it_lives():
    me = os.getpid()
    assert _child_exit(lambda: die_with_parent(me)) == 0
    assert _child_exit(lambda: die_with_parent()) == 0  # not adopted by init
    assert _child_exit(lambda: die_with_parent(me + 4_000_000)) == 1  # another parent than the one forked from
