"""Which way a speed round measures, per variable: paired blocks in one process, or runs in separate processes.

Paired (helpers/run/pair.py) is the default: both arms in one process, ABBA blocks of steps. A variable takes
separate processes when it is process-wide in MindSpore (the two arms could not differ inside one process), or
when the paired process would measure something else than a run of its own would.
"""
from __future__ import annotations

from helpers.config import Config, all_keys

PAIRED, PROCESSES = "paired", "processes"

# key or section prefix → why it needs separate processes
PROCESS_GLOBAL = {
    "mode": "the execution mode is process-wide (ms.set_context)",
    "jit_level": "grouped with mode, which is process-wide",
    "threads": "op threads can be set once per process",
    "compile_cache": "the compile cache is process-wide and measured by process start-up",
    "compile_cache_path": "the compile cache is process-wide",
    "device_target": "the device is process-wide (ms.set_device)",
    "memory_optimize": "the device memory pool is process-wide (ms.runtime.set_memory)",
    "dataset_sink": "sink mode hands the device its own queue (process-wide on Ascend/GPU)",
    "parallel.": "data parallel runs are msrun processes",
    "data.": "a paused arm's pipeline keeps prefetching while the other arm steps, which would hide its data waits",
    "monitor.profile_steps": "the profiler is process-wide",
    "monitor.profile_start": "the profiler is process-wide",
}


# Data-parallel keys that two arms can still differ in inside each rank of one msrun launch: MindSpore fixes the
# all-reduce fusion when each arm's step graph is built and compiled (helpers/spawn/dp_worker.set_fusion).
PER_GRAPH = {"parallel.comm_fusion", "parallel.fusion_size_mb", "parallel.fusion_indices"}


def _why(key: str) -> str:
    if key in PER_GRAPH:
        return ""
    return next((why for k, why in PROCESS_GLOBAL.items() if key == k or (k.endswith(".") and key.startswith(k))),
                "")


def path_of(key: str) -> str:
    """PAIRED or PROCESSES for one config key (dotted, e.g. 'model.n_layer')."""
    return PROCESSES if _why(key) else PAIRED


def table() -> dict[str, str]:
    """Every config key → its path (what the README and the tests list)."""
    return {key: path_of(key) for key in all_keys()}


def speed_path(changes: dict, best: Config) -> tuple[str, str]:
    """(path, why) for a round changing `changes` (keys) on top of `best`.

    Separate processes when any changed key is process-wide (see PROCESS_GLOBAL), when the best is data
    parallel and the change is not one of the all-reduce fusion keys (PER_GRAPH: those are paired inside each
    rank of one msrun launch), or when its runs are profiled (one profiler per process, one op table per run).
    A paired process compiles without the compile cache (helpers/run/pair.py).
    """
    hits = [f"{k}: {_why(k)}" for k in changes if _why(k)]
    dp = best.parallel.data_parallel > 1
    if dp and not set(changes) <= PER_GRAPH:
        hits.append("the best config is data parallel (msrun processes)")
    if not dp and set(changes) & PER_GRAPH:
        hits.append("all-reduce fusion only exists in a data-parallel run (msrun processes)")
    if best.monitor.profile_steps:
        hits.append("every run of the best is profiled, and the profiler is process-wide")
    if hits:
        return PROCESSES, "; ".join(hits)
    if dp:
        return PAIRED, (f"{', '.join(changes)} is fixed when each arm's step graph is compiled: both arms in each "
                        f"of the {best.parallel.data_parallel} ranks of one msrun launch")
    return PAIRED, f"{', '.join(changes)} can differ between two models of one process"
