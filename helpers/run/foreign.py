"""How much CPU other processes used while a round measured: the machine's busy time (/proc/stat) minus the
round's own processes' CPU time (/proc/<pid>/stat, threads included), over the wall time between two readings.

A round uses it to drop the pairs during which something else ran hardest (helpers/paired.py `kept_pairs`):
the choice then depends on what happened outside the arms, never on the arms' own step times, so an arm's own
stalls can never be trimmed away. On a machine without /proc the reading is None and nothing is dropped.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def machine_busy_s() -> float | None:
    """CPU seconds all cores have spent busy since boot (user, nice, system, irq, softirq, steal), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            values = [int(v) for v in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq + steal) * _TICK_S


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process `pid` has used; 0 for one that is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime: fields 14 and 15 of stat(5)


def own_tree(pids: Iterable[int]) -> list[int]:
    """`pids` and every live descendant of them (map workers in processes, msrun ranks)."""
    import psutil
    out = []
    for pid in pids:
        out.append(pid)
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pass
    return out


class ForeignLoad:
    """CPU used by processes other than `own()` between `start()` and `read()`, in cores (0.5 = half a core).

    own: the pids whose CPU is the round's own (default: this process); their descendants count as own too.
    """

    def __init__(self, own: Callable[[], Iterable[int]] | None = None):
        self._own = own or (lambda: [os.getpid()])
        self._start: tuple[float, float, float] | None = None

    def _sample(self) -> tuple[float, float, float] | None:
        busy = machine_busy_s()
        if busy is None:
            return None
        return time.monotonic(), busy, sum(process_cpu_s(p) for p in own_tree(self._own()))

    def start(self) -> None:
        self._start = self._sample()

    def read(self) -> float | None:
        """Cores' worth of other processes' CPU since start() (≥ 0), then start again; None without /proc."""
        end = self._sample()
        begin, self._start = self._start, end
        if begin is None or end is None or end[0] <= begin[0]:
            return None
        return max(0.0, ((end[1] - begin[1]) - (end[2] - begin[2])) / (end[0] - begin[0]))
