"""Which way a speed round measures, per variable: two arm processes taking turns step by step (the default),
both arms in each rank of one msrun launch (the all-reduce fusion of a data-parallel best), or whole runs.

Processes (helpers/spawn/stepped.py): each arm a process of its own, so the arms may differ in what MindSpore
sets once per process (op threads, the execution mode, the dataset engine) and no arm runs beside another model
(two arms built in one process ran differently by the order they were compiled in:
docs/explanation/speed-rule.md). Paired (helpers/spawn/paired.py): what differs per compiled graph in a
data-parallel run, both arms in every rank of one msrun launch (two launches cannot take turns step by step).
Whole runs remain for what only a run of its own shows: the compile cache (its effect is at start-up), msrun's
data-parallel processes and the profiler.
"""
from __future__ import annotations

from helpers.config import Config, all_keys
from helpers.levers import LEVERS, PAIRED, PER_GRAPH, PROCESSES, RUNS, keys_where

# Data-parallel keys that two arms can still differ in inside each rank of one msrun launch: MindSpore fixes the
# all-reduce fusion when each arm's step graph is built and compiled (helpers/spawn/dp_worker.set_fusion).
PER_GRAPH_KEYS = frozenset(keys_where(measured=PER_GRAPH))


def _why(key: str) -> tuple[str, str]:
    """(path, why) of one key on a one-process best, as `helpers.levers` declares it: RUNS with why, else
    PROCESSES with why ("" for a model, batch or optimizer key); a key fused per graph needs a data-parallel run."""
    lever = LEVERS[key]
    return (RUNS if lever.measured == PER_GRAPH else lever.measured), lever.why


def path_of(key: str) -> str:
    """PROCESSES or RUNS for one config key (dotted, e.g. 'model.n_layer') on a one-process best."""
    return _why(key)[0]


def table() -> dict[str, str]:
    """Every config key → its path on a one-process best (what docs/how-to/rounds.md and the tests list)."""
    return {key: path_of(key) for key in all_keys()}


def speed_path(changes: dict, best: Config) -> tuple[str, str]:
    """(path, why) for a round changing `changes` (keys) on top of `best`.

    Whole runs (RUNS) when a changed key needs a run of its own (`helpers.levers`), when the best is data parallel
    and the change is not one of the all-reduce fusion keys (PER_GRAPH_KEYS: those are paired inside each rank of one
    msrun launch), or when its runs are profiled (one profiler per process, one op table per run); else two
    processes stepping in turns (PROCESSES).
    """
    dp = best.parallel.data_parallel > 1
    whys = {k: _why(k) for k in changes if not (dp and k in PER_GRAPH_KEYS)}
    runs = [f"{k}: {why}" for k, (path, why) in whys.items() if path == RUNS]
    if dp and not set(changes) <= PER_GRAPH_KEYS:
        runs.append("the best config is data parallel (msrun processes)")
    if best.monitor.profile_steps:
        runs.append("every run of the best is profiled, and the profiler is process-wide")
    if runs:
        return RUNS, "; ".join(runs)
    ranks = f"both arms in each of the {best.parallel.data_parallel} ranks of one msrun launch"
    if dp:
        return PAIRED, (f"{', '.join(changes)} is fixed when each arm's step graph is compiled: {ranks}" if changes
                        else f"an A/A check: {ranks}")
    wide = [f"{k}: {why}" for k, (_, why) in whys.items() if why]
    return PROCESSES, ("; ".join(wide) + "; " if wide else "") + ("each arm a process of its own, the two taking "
                                                                   "turns step by step")
