"""Which way a speed round measures, per variable: paired steps in one process, two processes taking turns
step by step, or whole runs in separate processes.

Paired (helpers/run/pair.py) is the default: both arms in one process, their steps woven ABBA. A variable that
is process-wide in MindSpore (the two arms could not differ inside one process) takes two long-lived processes
that step in turns (helpers/spawn/stepped.py). Whole runs in separate processes remain for what only a run of its
own shows: the compile cache (its effect is at start-up), msrun's data-parallel processes and the profiler.
"""
from __future__ import annotations

from helpers.config import Config, all_keys

PAIRED, PROCESSES, RUNS = "paired", "processes", "runs"

# key or section prefix → why it needs a process per arm (the two arms then step in turns)
PROCESS_GLOBAL = {
    "mode": "the execution mode is process-wide (ms.set_context)",
    "jit_level": "grouped with mode, which is process-wide",
    "threads": "op threads can be set once per process",
    "device_target": "the device is process-wide (ms.set_device)",
    "memory_optimize": "the device memory pool is process-wide (ms.runtime.set_memory)",
    "dataset_sink": "sink mode hands the device its own queue (process-wide on Ascend/GPU)",
    "data.": "the dataset engine's settings (prefetch, autotune, seed) are process-wide, and each arm's pipeline "
             "and worker threads are then its own",
}
# key or section prefix → why it needs whole runs, each in a process of its own
RUN_GLOBAL = {
    "compile_cache": "the compile cache is process-wide and measured by process start-up",
    "compile_cache_path": "the compile cache is process-wide",
    "parallel.": "data parallel runs are msrun processes",
    "monitor.profile_steps": "the profiler is process-wide",
    "monitor.profile_start": "the profiler is process-wide",
}


# Data-parallel keys that two arms can still differ in inside each rank of one msrun launch: MindSpore fixes the
# all-reduce fusion when each arm's step graph is built and compiled (helpers/spawn/dp_worker.set_fusion).
PER_GRAPH = {"parallel.comm_fusion", "parallel.fusion_size_mb", "parallel.fusion_indices"}


def _match(key: str, table: dict[str, str]) -> str:
    return next((why for k, why in table.items() if key == k or (k.endswith(".") and key.startswith(k))), "")


def _why(key: str) -> tuple[str, str]:
    """(path, why) of one key; ("", "") when two arms can differ in it inside one process."""
    if key in PER_GRAPH:
        return "", ""
    for path, table_ in ((RUNS, RUN_GLOBAL), (PROCESSES, PROCESS_GLOBAL)):
        why = _match(key, table_)
        if why:
            return path, why
    return "", ""


def path_of(key: str) -> str:
    """PAIRED, PROCESSES or RUNS for one config key (dotted, e.g. 'model.n_layer')."""
    return _why(key)[0] or PAIRED


def table() -> dict[str, str]:
    """Every config key → its path (what the README and the tests list)."""
    return {key: path_of(key) for key in all_keys()}


def speed_path(changes: dict, best: Config) -> tuple[str, str]:
    """(path, why) for a round changing `changes` (keys) on top of `best`.

    Whole runs (RUNS) when a changed key needs a run of its own (RUN_GLOBAL), when the best is data parallel
    and the change is not one of the all-reduce fusion keys (PER_GRAPH: those are paired inside each rank of one
    msrun launch), or when its runs are profiled (one profiler per process, one op table per run); else two
    processes stepping in turns (PROCESSES) when a changed key is process-wide (PROCESS_GLOBAL); else paired.
    A paired process compiles without the compile cache (helpers/run/pair.py).
    """
    whys = {k: _why(k) for k in changes}
    runs = [f"{k}: {why}" for k, (path, why) in whys.items() if path == RUNS]
    dp = best.parallel.data_parallel > 1
    if dp and not set(changes) <= PER_GRAPH:
        runs.append("the best config is data parallel (msrun processes)")
    if not dp and set(changes) & PER_GRAPH:
        runs.append("all-reduce fusion only exists in a data-parallel run (msrun processes)")
    if best.monitor.profile_steps:
        runs.append("every run of the best is profiled, and the profiler is process-wide")
    if runs:
        return RUNS, "; ".join(runs)
    processes = [f"{k}: {why}" for k, (path, why) in whys.items() if path == PROCESSES]
    if processes:
        return PROCESSES, "; ".join(processes) + " — two long-lived processes take turns, step by step"
    if dp:
        return PAIRED, (f"{', '.join(changes)} is fixed when each arm's step graph is compiled: both arms in each "
                        f"of the {best.parallel.data_parallel} ranks of one msrun launch")
    return PAIRED, f"{', '.join(changes)} can differ between two models of one process"
